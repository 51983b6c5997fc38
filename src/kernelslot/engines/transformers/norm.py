"""The ``norm.rmsnorm`` install point: every RMSNorm module whose semantics are the slot's is
replaced by :class:`RMSNormSite`, which serves its calls through the slot.

A module is an RMSNorm site when it has a ``weight (H,)`` and an epsilon (``variance_epsilon`` or
``eps``) and its own forward, probed in fp64, equals ``x·rsqrt(mean(x²) + eps)·w`` (plain:
Qwen3-MoE, GPT-OSS; descriptor model ``generic``) or ``…·(1 + w)`` (Gemma style: MiniMax-M3;
the slot gets ``1 + w``, descriptor model ``MiniMax-M3``, as SLOTS.md says). The call is
``entry(x (rows, H), weight (H,) in x's dtype, out (rows, H), eps)`` with rows = every leading
dimension flattened (the q/k norms of Qwen3 attention are RMSNorms over the head dim).
"""
from __future__ import annotations

from typing import Optional

import torch

from kernelslot.abi import CallDescriptor
from kernelslot.slots.base import dtype_name

SLOT = "norm.rmsnorm"
_PROBE_RTOL = 1e-5


def _eps(module: torch.nn.Module) -> Optional[float]:
    for name in ("variance_epsilon", "eps"):
        v = getattr(module, name, None)
        if isinstance(v, (int, float)):
            return float(v)
    return None


def probe_rmsnorm(module: torch.nn.Module) -> Optional[str]:
    """``"plain"`` or ``"gemma"`` when the module computes that RMSNorm; None otherwise."""
    w, eps = getattr(module, "weight", None), _eps(module)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or eps is None or "norm" not in type(module).__name__.lower():
        return None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, w.shape[0], generator=gen, dtype=torch.float64) * 3
    try:
        with torch.no_grad():
            got = module(x).double()
    except Exception:  # noqa: BLE001 - a module that cannot run on a probe is not a site
        return None
    base = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    wd = w.detach().double()
    for kind, want in (("plain", base * wd), ("gemma", base * (1 + wd))):
        if got.shape == want.shape and torch.allclose(got, want, rtol=_PROBE_RTOL, atol=_PROBE_RTOL):
            return kind
    return None


class RMSNormSite(torch.nn.Module):
    """Stands in for one RMSNorm module; the original is kept (``original``) for uninstall."""

    def __init__(self, original: torch.nn.Module, kind: str, state):
        super().__init__()
        self.original = original
        self.kind, self.eps = kind, _eps(original)
        self._state = state

    @property
    def weight(self) -> torch.Tensor:  # what code reading ``norm.weight`` expects
        return self.original.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1]
        x2 = x.reshape(-1, h)
        w = self.original.weight.detach()
        w = (1.0 + w.float()).to(x.dtype) if self.kind == "gemma" else w.to(x.dtype)
        out = torch.empty_like(x2)
        desc = CallDescriptor(model="MiniMax-M3" if self.kind == "gemma" else "generic", phase=self._state.context.phase,
                              dtype=dtype_name(x.dtype), num_tokens=x2.shape[0], hidden_size=h, arch=x.device.type,
                              last_dim=h)
        self._state.call(desc, x2, w, out, self.eps)
        return out.reshape(x.shape)


def find_sites(model: torch.nn.Module, claimed: set[str]) -> list[tuple[str, torch.nn.Module, str]] | str:
    """``(name, module, kind)`` of every RMSNorm site, or why there is none."""
    sites, other = [], set()
    for name, m in model.named_modules():
        if any(name == c or name.startswith(c + ".") for c in claimed) or "norm" not in type(m).__name__.lower():
            continue
        kind = probe_rmsnorm(m)
        if kind is None:
            if hasattr(m, "weight") and _eps(m) is not None:
                other.add(type(m).__name__)
            continue
        sites.append((name, m, kind))
    if sites:
        return sites
    return (f"no module computes RMSNorm as the slot defines it (x·rsqrt(mean(x²)+eps)·w or ·(1+w))"
            + (f"; norms found: {', '.join(sorted(other))}" if other else ""))
