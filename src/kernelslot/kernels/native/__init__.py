"""Native CPU fast path for decode-time MoE expert MLPs (C, AVX-512 / AVX2 / portable, loaded
with ctypes; built from the bundled sources on first use — see docs/native.md).

Public API:

- :func:`native_status` -> ``(available, isa, reason)``
- :func:`prepare_native_experts` (repack :class:`ExpertWeights` once) -> :class:`NativeExperts`
- :func:`native_supports` (the declared domain: formats, activations, T range)
- :func:`expert_mlp_native` (accumulate the routed experts into an fp32 (T, H) ``out``)
"""
from __future__ import annotations

from . import build
from .layout import MAX_TOKENS, NativeExperts, native_supports, prepare_native_experts
from .ops import (default_threads, expert_mlp_native, mxfp8_quantize_native, read_bandwidth_probe,
                  warm_thread_pool)


def native_status() -> tuple[bool, str, str]:
    """``(available, isa, reason)``: whether the native library is loaded, the instruction set
    it runs (``avx512``/``avx2``/``portable``, ``none`` if unavailable) and why."""
    st = build.loaded()
    return st.lib is not None, st.isa, st.reason


__all__ = [
    "MAX_TOKENS", "NativeExperts", "default_threads", "expert_mlp_native", "mxfp8_quantize_native",
    "native_status", "native_supports", "prepare_native_experts", "read_bandwidth_probe",
    "warm_thread_pool",
]
