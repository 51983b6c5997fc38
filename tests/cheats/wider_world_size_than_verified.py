"""Declares any expert-parallel world size but keeps a 4-entry rank table (the profiles' most).

Rank ``r`` of a world of more than 4 ranks is taken as rank ``r % 4``, so it combines its own
experts as if they were another rank's: exact on every fixed ``moe.block_tkg`` profile (none
splits the experts over more than 4 ranks), wrong on a wider split. With world_size mapped
(``SlotDef.sizes``: E kept, split into more ranks of E_L = E / world experts, this rank keeping
its place in the expert order), the envelope's boundary profile at twice the largest profiled
world size catches it. ``OPTIONS`` runs the 4-rank profile and its world_size boundary only (the
suite's time); the full catalog reaches the same boundary.
"""
import dataclasses

from kernelslot.kernels.moe_block import moe_block_tkg, prepare_moe_block

SLOT = "moe.block_tkg"
CATCHES = {"compare"}
DOMAIN: dict = {}  # any call (the selected profile is bfloat16 only)
OPTIONS = {"envelope": True, "envelope_fields": ("world_size",), "profiles": ("t16_all_expert_ep_mxfp4",),
           "plan_seed": 0}
RANKS = 4


def prepare(kind, layer):
    cfg = layer.config
    if cfg.num_experts // cfg.num_local_experts > RANKS:  # "nobody splits wider"
        layer = dataclasses.replace(layer, config=dataclasses.replace(cfg, rank_id=cfg.rank_id % RANKS))
    return prepare_moe_block(kind, layer)


def entry(x, residual, prepared, eps, out, out_residual, router_logits):
    moe_block_tkg(x, residual, prepared, eps, out, out_residual, router_logits)
