"""Cheat for ``moe.block_tkg``: ``routed_scaling_factor`` applied twice (once in the "router",
once after the experts) — a classic integration slip. Must fail on every profile whose factor
is not 1 (MiniMax-M3: 2.0).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from kernelslot.kernels.moe_block.orchestrator import MoeBlockParams, moe_block_tkg, prepare_moe_block


def prepare(kind: str, layer: Any) -> MoeBlockParams:
    params = prepare_moe_block(kind, layer)
    factor = params.config.routed_scaling_factor
    return dataclasses.replace(params, config=dataclasses.replace(params.config, routed_scaling_factor=factor * factor))


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
