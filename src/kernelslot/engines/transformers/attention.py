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

With ``attention.decode`` installed, a fitting single-query call (a decode step, every row of the
batch at the same cache length) is instead one ``attention.decode`` call for the whole batch: the
dense cache laid out as a paged one (request b's token t in slot ``b·S + t``, page block
:data:`DECODE_BLOCK`) with every block selected, which is dense attention over the cache.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from kernelslot.abi import CallDescriptor
from kernelslot.engines.transformers.experts import MODEL_CODE, CallContext
from kernelslot.engines.transformers.sites import SlotState
from kernelslot.slots.base import dtype_name

SLOT = "attention.sdpa"
DECODE_SLOT = "attention.decode"
DECODE_BLOCK = 8  # the page block of the dense-as-paged decode call (a block size attention.decode verifies)
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
    """The attention slots of one installation: ``sdpa`` and/or ``decode`` (:class:`SlotState`)."""

    def __init__(self, sdpa: Optional[SlotState] = None, decode: Optional[SlotState] = None,
                 context: Optional[CallContext] = None):
        self.sdpa, self.decode = sdpa, decode
        first = sdpa or decode
        self.context = first.context if first is not None else (context or CallContext())

    def states(self) -> dict[str, SlotState]:
        return {s.slot: s for s in (self.sdpa, self.decode) if s is not None}


_DEFAULT = None  # serves models that selected the name without install()


def _default_state() -> AttentionState:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = AttentionState(SlotState(SLOT))
    return _DEFAULT


def _model_sdpa(state: SlotState, module, query, key, value, attention_mask, dropout, scaling, kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    state.count(MODEL_CODE)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _decode_call(state: SlotState, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float):
    """One ``attention.decode`` call for a whole single-query batch: the dense cache as a paged one
    (request b's token t in slot ``b·S + t``) with every block selected, which is exactly dense attention."""
    b, hq, _, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    kb = -(-s // DECODE_BLOCK)
    q = query[:, :, 0].contiguous()
    k_cache = key.transpose(1, 2).reshape(b * s, hkv, d).contiguous()
    v_cache = value.transpose(1, 2).reshape(b * s, hkv, d).contiguous()
    table = torch.zeros(b, kb * DECODE_BLOCK, dtype=torch.int32)
    table[:, :s] = (torch.arange(b, dtype=torch.int32)[:, None] * s + torch.arange(s, dtype=torch.int32))
    seq_lens = torch.full((b,), s, dtype=torch.int32)
    pool = torch.arange(b, dtype=torch.int64)
    topk = torch.arange(kb, dtype=torch.int32).expand(hkv, b, kb).contiguous()
    out = torch.empty(b, hq, d, dtype=query.dtype, device=query.device)
    desc = CallDescriptor(model="generic", phase="decode", dtype=dtype_name(query.dtype), num_tokens=b, batch_size=b,
                          kv_len=kb * DECODE_BLOCK, top_k=kb, block_size=DECODE_BLOCK, num_q_heads=hq,
                          num_kv_heads=hkv, head_dim=d, layout="paged", quant="dense", arch=query.device.type,
                          last_dim=d)
    state.call(desc, q, k_cache, v_cache, table, seq_lens, pool, topk, out, scale, DECODE_BLOCK)
    return out[:, None], None


def kernelslot_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                                 scaling: Optional[float] = None, **kwargs: Any):
    """Returns ``(attn_output (B, T, Hq, D), None)`` like transformers' attention functions."""
    att = getattr(module, "_kernelslot_attention", None) or _default_state()
    fits = fits_sdpa(query, key, attention_mask, dropout, module, kwargs) and value.shape[-1] == query.shape[-1]
    b, hq, t, d = query.shape
    scale = scaling if scaling is not None else d ** -0.5
    if fits and t == 1 and att.decode is not None:
        return _decode_call(att.decode, query, key, value, scale)
    state = att.sdpa
    if not fits or state is None:
        return _model_sdpa(state or att.decode, module, query, key, value, attention_mask, dropout, scaling, kwargs)
    out = torch.empty(b, t, hq, d, dtype=query.dtype, device=query.device)
    # sdpa's semantics do not depend on the model: its calls are the generic profile's
    desc = CallDescriptor(model="generic", phase=state.context.phase, dtype=dtype_name(query.dtype), num_tokens=t,
                          batch_size=1, kv_len=key.shape[2], num_q_heads=hq, num_kv_heads=key.shape[1], head_dim=d,
                          layout="thd", quant="dense", arch=query.device.type, last_dim=d)
    for i in range(b):
        state.call(desc, query[i].transpose(0, 1), key[i].transpose(0, 1), value[i].transpose(0, 1), out[i],
                   scale, t > 1)
    return out, None


def find_sites(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]] | str:
    """The attention modules that dispatch through transformers' AttentionInterface, or why none fits."""
    mods = [(n, m) for n, m in model.named_modules() if hasattr(m, "is_causal") and hasattr(m, "scaling")]
    if not mods:
        return "no attention module dispatches through transformers' AttentionInterface"
    sinks = [n for n, m in mods if isinstance(getattr(m, "sinks", None), torch.Tensor)]
    if len(sinks) == len(mods):
        return f"its attention has sinks ({type(mods[0][1]).__name__}.sinks), which the slot does not express"
    mla = [m for _, m in mods if getattr(m, "v_head_dim", None) not in (None, getattr(m, "qk_head_dim", None))]
    if len(mla) == len(mods):
        m = mla[0]
        return (f"its attention's query/key head dim {m.qk_head_dim} differs from the value head dim {m.v_head_dim} "
                "(MLA), which the slot does not express")
    windows = [n for n, m in mods if getattr(m, "sliding_window", None)]
    if len(windows) == len(mods):
        return "every attention layer uses a sliding window, which the slot does not express"
    return mods
