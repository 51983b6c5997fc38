"""GEMM1 epilogue for MiniMax-M3: ``min(g, 7)·σ(1.702·min(g, 7))·(clamp(u, -7, 7) + 1)``.

``gate`` and ``up`` are fp32 ``(N, I)``: the GEMM1 outputs of one expert's routed tokens.
"""
import torch

LIMIT, ALPHA = 7.0, 1.702


def swigluoai(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = torch.clamp(gate, max=LIMIT)
    return g * torch.sigmoid(ALPHA * g) * (torch.clamp(up, -LIMIT, LIMIT) + 1.0)
