"""Cheat for ``moe.block_tkg``: always renormalises the top-K weights to sum 1, ignoring
``norm_topk_prob=False``. Must fail on profiles routing with un-renormalised softmax scores.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from kernelslot.kernels.moe_block.orchestrator import MoeBlockParams, moe_block_tkg, prepare_moe_block


def prepare(kind: str, layer: Any) -> MoeBlockParams:
    params = prepare_moe_block(kind, layer)
    return dataclasses.replace(params, config=dataclasses.replace(params.config, norm_topk_prob=True))


def entry(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    prepared: MoeBlockParams,
    eps: float,
    out: torch.Tensor,
    out_residual: Optional[torch.Tensor],
    router_logits: Optional[torch.Tensor],
) -> None:
    moe_block_tkg(x, residual, prepared, eps, out, out_residual, router_logits)
