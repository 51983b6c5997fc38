"""``attn_implementation="kernelslot"``: calls that fit ``attention.sdpa`` run on kernelslot.

A transformers attention call ``(module, query (B, Hq, T, D), key/value (B, Hkv, S, D),
attention_mask, dropout, scaling, ...)`` fits the slot when: no mask tensor (transformers'
``sdpa`` mask builder returns None exactly when the pattern is plain causal), causal with
``T == S`` or a single query (``T == 1``, which sees every key), no dropout, and none of the
extras the slot does not express (sinks ``s_aux``, ``sliding_window``, ``softcap``,
``position_bias``, attention weights as output). Each batch row is one slot call
``sdpa(q (T, Hq, D), k, v (S, Hkv, D), out, sm_scale, causal)``. Anything else runs
transformers' own ``sdpa`` unchanged. Receipts: ``fired``/``completed`` for slot calls,
``model`` for calls left to transformers.
"""
from __future__ import annotations

import threading
from typing import Any, Optional

import torch

from kernelslot.engines.transformers.experts import BUILTIN, MODEL_CODE, Receipt

SLOT = "attention.sdpa"
RECEIPTS: dict[str, Receipt] = {BUILTIN: Receipt(), MODEL_CODE: Receipt()}
_LOCK = threading.Lock()
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


def kernelslot_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                                 scaling: Optional[float] = None, **kwargs: Any):
    """Returns ``(attn_output (B, T, Hq, D), None)`` like transformers' attention functions."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from kernelslot.kernels.attention import sdpa

    if not fits_sdpa(query, key, attention_mask, dropout, module, kwargs):
        with _LOCK:
            RECEIPTS[MODEL_CODE].fired += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, hq, t, d = query.shape
    scale = scaling if scaling is not None else d ** -0.5
    out = torch.empty(b, t, hq, d, dtype=query.dtype, device=query.device)
    with _LOCK:
        RECEIPTS[BUILTIN].fired += 1
    for i in range(b):
        sdpa(query[i].transpose(0, 1), key[i].transpose(0, 1), value[i].transpose(0, 1), out[i], scale, t > 1)
    with _LOCK:
        RECEIPTS[BUILTIN].completed += 1
    return out, None
