"""Declares any expert count but its router scores only the first 16 experts (the profiles' most).

A fixed 16-lane router mask: exact on every fixed ``moe.block_tkg`` profile (none has more than
16 experts), wrong on any larger model, whose experts 16.. it never routes to. With num_experts
mapped (``SlotDef.sizes``: E grows with the expert-parallel world size kept, each rank's slice
along), the envelope's boundary profiles run twice the largest profiled count and one between,
and the mask fails there. ``OPTIONS`` runs one expert-parallel profile and its num_experts
boundaries only (the suite's time); the full catalog reaches the same boundaries.
"""
import dataclasses

import torch

from kernelslot.kernels.moe_block import moe_block_tkg, prepare_moe_block

SLOT = "moe.block_tkg"
CATCHES = {"compare"}
DOMAIN = {"dtype": {"exact": "float32"}}
OPTIONS = {"envelope": True, "envelope_fields": ("num_experts",), "profiles": ("t7_all_expert_ep_rank1",),
           "plan_seed": 0}
LANES = 16


def prepare(kind, layer):
    experts = layer.router_weight.shape[0]
    if experts > LANES:  # "no model has more": experts past the mask never win a top-K slot
        bias = torch.zeros(experts) if layer.router_bias is None else layer.router_bias.float()
        bias[LANES:] = -1e4
        layer = dataclasses.replace(layer, router_bias=bias.to(layer.router_weight.dtype))
    return prepare_moe_block(kind, layer)


def entry(x, residual, prepared, eps, out, out_residual, router_logits):
    moe_block_tkg(x, residual, prepared, eps, out, out_residual, router_logits)
