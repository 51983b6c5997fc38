"""Broken moe.block_tkg: kernelslot's own block with top-K reduced by one, so each token's
lowest-ranked routed expert is dropped (and the rest renormalised without it)."""
import dataclasses

from kernelslot.kernels.moe_block import moe_block_tkg, prepare_moe_block


def prepare(kind, layer):
    k = max(1, layer.config.top_k - 1)
    return prepare_moe_block(kind, dataclasses.replace(layer, config=dataclasses.replace(layer.config, top_k=k)))


def block_tkg(x, residual, prepared, eps, out, out_residual, router_logits):
    moe_block_tkg(x, residual, prepared, eps, out, out_residual, router_logits)
