"""``attn_implementation="kernelslot"``: calls that fit ``attention.sdpa`` run on kernelslot.

A transformers attention call ``(module, query (B, Hq, T, D), key/value (B, Hkv, S, D),
attention_mask, dropout, scaling, ...)`` fits the slot when: no mask tensor (transformers'
``sdpa`` mask builder returns None exactly when the pattern is plain causal), causal with
``T == S`` or a single query (``T == 1``, which sees every key), no dropout, and none of the
extras the slot does not express (sinks ``s_aux``, ``sliding_window``, ``softcap``,
``position_bias``, attention weights as output). Each batch row is one slot call
``entry(q (T, Hq, D), k, v (S, Hkv, D), out, sm_scale, causal)`` with its
:class:`CallDescriptor`; installed candidates serve the calls inside their domain (through the
:class:`SlotRouter`, the built-in as incumbent), the built-in the rest. Calls that do not fit
run transformers' own ``sdpa`` unchanged (counter variant ``model``).
"""
from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import torch

from kernelslot.abi import CallDescriptor
from kernelslot.engines.transformers.experts import BUILTIN, MODEL_CODE, CallContext, CallCounters
from kernelslot.slots.base import Candidate, dtype_name

SLOT = "attention.sdpa"
_UNSUPPORTED = ("s_aux", "sliding_window", "softcap", "position_bias")


def fits_sdpa(query: torch.Tensor, key: torch.Tensor, attention_mask: Optional[torch.Tensor], dropout: float,
              module: torch.nn.Module, kwargs: dict[str, Any]) -> bool:
    if attention_mask is not None or dropout or kwargs.get("output_attentions"):
        return False
    if any(kwargs.get(k) is not None for k in _UNSUPPORTED) or getattr(module, "sliding_window", None):
        return False
    t, s = query.shape[2], key.shape[2]
    if query.shape[1] % key.shape[1]:
        return False
    return t == 1 or (t == s and getattr(module, "is_causal", True))


class AttentionState:
    """The router (built-in incumbent, optional candidates) and call counters of one installation."""

    def __init__(self, candidates: Sequence[Candidate] = (), context: Optional[CallContext] = None,
                 verified: Optional[dict] = None, serving: Optional[dict] = None):
        from kernelslot.dispatch import SlotRouter
        from kernelslot.slots import get_slot

        self.router = SlotRouter(get_slot(SLOT), list(candidates), verified=verified, **(serving or {}))
        self.context = context or CallContext()
        self.counters: dict[str, CallCounters] = {BUILTIN: CallCounters(), MODEL_CODE: CallCounters()}
        self._lock = threading.Lock()

    def count(self, variant: str, decode: bool) -> None:
        with self._lock:
            r = self.counters.setdefault(variant, CallCounters())
            r.fired += 1
            r.fired_decode += int(decode)

    def counter_table(self) -> dict[str, CallCounters]:
        table = {k: CallCounters(**{**v.__dict__, "errors": list(v.errors)}) for k, v in self.counters.items()}
        for name, r in self.router.counters.items():
            if name == "incumbent":
                table[BUILTIN].completed = r.fallback - sum(x.fallback for n, x in self.router.counters.items()
                                                            if n != "incumbent")
            elif name in table:
                table[name].completed, table[name].fallback, table[name].errors = r.completed, r.fallback, list(r.errors)
        return table


_DEFAULT = None  # serves models that selected the name without install()


def _default_state() -> AttentionState:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = AttentionState()
    return _DEFAULT


def kernelslot_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                                 scaling: Optional[float] = None, **kwargs: Any):
    """Returns ``(attn_output (B, T, Hq, D), None)`` like transformers' attention functions."""
    state = getattr(module, "_kernelslot_attention", None) or _default_state()
    decode = state.context.phase == "decode"
    if not fits_sdpa(query, key, attention_mask, dropout, module, kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        state.count(MODEL_CODE, decode)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, hq, t, d = query.shape
    scale = scaling if scaling is not None else d ** -0.5
    out = torch.empty(b, t, hq, d, dtype=query.dtype, device=query.device)
    # sdpa's semantics do not depend on the model: its calls are the generic profile's
    desc = CallDescriptor(model="generic", phase=state.context.phase, dtype=dtype_name(query.dtype), num_tokens=t,
                          batch_size=1, kv_len=key.shape[2], num_q_heads=hq, num_kv_heads=key.shape[1], head_dim=d,
                          layout="thd", quant="dense", arch=query.device.type, last_dim=d)
    name = state.router.route(desc)
    for i in range(b):
        state.count(BUILTIN if name == "incumbent" else name, decode)
        state.router(desc, query[i].transpose(0, 1), key[i].transpose(0, 1), value[i].transpose(0, 1), out[i],
                     scale, t > 1)
    return out, None
