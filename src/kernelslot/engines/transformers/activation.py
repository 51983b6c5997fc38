"""The ``activation.silu_and_mul`` install point: the gated-activation call sites whose semantics
are ``silu(gate)·up`` serve it through the slot.

Two kinds of site:

- **Gated MLP modules** (``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn`` probed to be SiLU:
  DeepSeek-V3's shared expert, dense MLP layers) are replaced by :class:`GatedMLPSite`:
  ``down_proj(silu_and_mul([gate_proj(x) | up_proj(x)]))``.
- **Experts modules** whose probed activation is SiLU over concatenated gate/up rows without
  biases (Qwen3-MoE, Mixtral, DeepSeek-V3) get an instance ``_apply_gate`` that calls the slot on
  the ``(S, 2I)`` projection. transformers calls ``_apply_gate`` from its ``batched_mm`` and
  ``grouped_mm`` experts paths (its ``eager`` loop inlines ``act_fn(gate)·up``), so a model on
  ``eager`` experts is switched to ``batched_mm`` while installed (restored by ``uninstall``).
  Not a site when ``moe.fused_experts`` is installed too: the experts call never reaches the gate.

swigluoai (GPT-OSS experts, MiniMax-M3's experts and shared expert) is not this slot's semantics.
"""
from __future__ import annotations

import types
from typing import Optional

import torch

from kernelslot.abi import CallDescriptor
from kernelslot.kernels.experts_spec import ExpertActivation
from kernelslot.slots.base import dtype_name

SLOT = "activation.silu_and_mul"


def _is_silu(fn) -> bool:
    x = torch.linspace(-12, 12, 97, dtype=torch.float64)
    try:
        with torch.no_grad():
            return bool(torch.allclose(fn(x).double(), torch.nn.functional.silu(x), rtol=1e-6, atol=1e-6))
    except Exception:  # noqa: BLE001
        return False


def _descriptor(state, x2: torch.Tensor) -> CallDescriptor:
    # silu_and_mul's semantics do not depend on the model: its calls are the generic profile's
    return CallDescriptor(model="generic", phase=state.context.phase, dtype=dtype_name(x2.dtype), num_tokens=x2.shape[0],
                          hidden_size=x2.shape[-1] // 2, arch=x2.device.type, last_dim=x2.shape[-1])


def silu_and_mul_call(state, gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(g)·u`` of a ``(..., 2I)`` gate-then-up tensor through the slot."""
    x2 = gate_up.reshape(-1, gate_up.shape[-1]).contiguous()
    out = torch.empty(x2.shape[0], x2.shape[1] // 2, dtype=x2.dtype, device=x2.device)
    state.call(_descriptor(state, x2), x2, out)
    return out.reshape(*gate_up.shape[:-1], x2.shape[1] // 2)


class GatedMLPSite(torch.nn.Module):
    """Stands in for one gated MLP; the original is kept (``original``) for uninstall."""

    def __init__(self, original: torch.nn.Module, state):
        super().__init__()
        self.original = original
        self._state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.original
        return m.down_proj(silu_and_mul_call(self._state, torch.cat([m.gate_proj(x), m.up_proj(x)], -1)))


def _experts_gate(state):
    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_and_mul_call(state, gate_up)
    return _apply_gate


def bind_experts_gate(module: torch.nn.Module, state) -> None:
    module._apply_gate = types.MethodType(_experts_gate(state), module)


def unbind_experts_gate(module: torch.nn.Module) -> None:
    module.__dict__.pop("_apply_gate", None)


def find_sites(model: torch.nn.Module, claimed: set[str], experts_served: bool
               ) -> list[tuple[str, torch.nn.Module, str]] | str:
    """``(name, module, "mlp" | "experts")`` of every silu_and_mul site, or why there is none."""
    from kernelslot.engines.transformers.layout import describe_module, probe_activation

    sites, seen = [], []
    for name, m in model.named_modules():
        if any(name == c or name.startswith(c + ".") for c in claimed):
            continue
        if all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            if _is_silu(m.act_fn):
                sites.append((name, m, "mlp"))
            else:
                seen.append(f"{type(m).__name__} (act_fn {type(m.act_fn).__name__})")
        elif hasattr(m, "gate_up_proj") and hasattr(m, "has_gate") and hasattr(type(m).forward, "__wrapped__"):
            act, flags = probe_activation(m), describe_module(m)
            if act == ExpertActivation("silu") and flags["is_concatenated"] and not flags["has_bias"]:
                if not experts_served:
                    sites.append((name, m, "experts"))
            else:
                seen.append(f"{type(m).__name__} ({_act_name(act)}{', interleaved' if not flags['is_concatenated'] else ''})")
        elif isinstance(getattr(m, "gate_up_proj", None), torch.nn.Linear):
            what = "swigluoai" if hasattr(m, "swiglu_limit") else "its own activation"
            seen.append(f"{type(m).__name__} ({what})")
    if sites:
        return sites
    if experts_served and not seen:
        return "its SiLU gates are inside the experts, which moe.fused_experts serves in this installation"
    return ("no gated activation computes silu(gate)·up" + (f"; gated sites found: {', '.join(sorted(set(seen)))}"
                                                           if seen else ""))


def _act_name(act: Optional[ExpertActivation]) -> str:
    if act is None:
        return "activation not identified"
    if act.kind == "swigluoai":
        return f"swigluoai(α {act.alpha:g}, limit {act.gate_clamp[1]:g})"
    return act.kind
