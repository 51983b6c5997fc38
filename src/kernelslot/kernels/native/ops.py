"""Calling the native kernels: the decode expert MLP, the MXFP8 quantiser (test hook) and
the read-bandwidth probe.

``expert_mlp_native`` contract: ``out[t] += Σ_k c(t,k) · (down_e · act(gate_up_e · x_t + b_gu)
+ b_dn)`` over the routed pairs with ``e = topk_ids[t,k] >= 0`` (-1 entries skipped), where
``c = topk_weights[t,k]`` under POST_SCALE and 1 under NO_SCALE. ``act`` is
``act(clamp(g)) · (clamp(u) + up_bias)``; with ``quantize_activations`` the hidden (before
gate/up) and the intermediate (before down) are MXFP8-quantised (E4M3, floor E8M0, blocks
of 32 — bit-exact with ``kernelslot.formats.quantize_mx``) and dequantised. Everything is fp32.
Tokens are grouped by expert, so each routed expert's weights are streamed once per call.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

import torch

from kernelslot.kernels.experts_spec import ExpertActivation

from . import build
from .layout import NativeExperts

_ACT_KINDS = {"silu": 0, "swish": 0, "swigluoai": 0, "gelu": 1, "gelu_tanh": 2}
_ERRORS = {-1: "bad argument", -2: "an expert id is out of range [-1, E)",
           -3: "out of memory or threads", -4: "instruction set not supported on this CPU"}


class KsAct(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("alpha", ctypes.c_float), ("up_bias", ctypes.c_float),
                ("has_gate_lo", ctypes.c_int32), ("has_gate_hi", ctypes.c_int32),
                ("has_up_lo", ctypes.c_int32), ("has_up_hi", ctypes.c_int32),
                ("gate_lo", ctypes.c_float), ("gate_hi", ctypes.c_float),
                ("up_lo", ctypes.c_float), ("up_hi", ctypes.c_float)]


def act_struct(act: ExpertActivation) -> KsAct:
    (glo, ghi), (ulo, uhi) = act.gate_clamp, act.up_clamp
    alpha = 1.0 if act.kind == "silu" else act.alpha
    return KsAct(_ACT_KINDS[act.kind], alpha, act.up_bias,
                 glo is not None, ghi is not None, ulo is not None, uhi is not None,
                 glo or 0.0, ghi or 0.0, ulo or 0.0, uhi or 0.0)


def default_threads() -> int:
    """CPUs this process may run on (the native kernels' default thread count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _lib_and_isa(isa: Optional[str]) -> tuple[ctypes.CDLL, int]:
    st = build.loaded()
    if st.lib is None:
        raise RuntimeError(f"native CPU path unavailable: {st.reason}")
    name = st.isa if isa is None else isa
    if name not in build.ISA_NAMES or not st.lib.ks_isa_supported(build.ISA_NAMES.index(name)):
        raise ValueError(f"isa={name!r} is not supported here; choose from "
                         f"{[n for n in build.ISA_NAMES if build.isa_supported(n)]}")
    return st.lib, build.ISA_NAMES.index(name)


def _check(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if t.device.type != "cpu" or t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
        raise ValueError(f"expert_mlp_native: {name} must be a contiguous CPU {dtype} tensor of "
                         f"shape {shape}; got {t.dtype} {tuple(t.shape)} on {t.device}"
                         f"{'' if t.is_contiguous() else ' (non-contiguous)'}")


def expert_mlp_native(h: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                      experts: NativeExperts, act: ExpertActivation, post_scale: bool,
                      quantize_activations: bool, out: torch.Tensor, *,
                      num_threads: Optional[int] = None, isa: Optional[str] = None) -> None:
    """Accumulate the routed experts' MLP outputs into ``out`` (see the module doc).

    ``h``: fp32 (T, H) contiguous; ``topk_ids``: (T, K) int32/int64; ``topk_weights``: (T, K)
    fp32 (ignored under NO_SCALE); ``out``: fp32 (T, H) contiguous, added to (zero it for a
    plain result). ``num_threads`` defaults to the CPUs available; ``isa`` forces
    ``"portable"``/``"avx2"``/``"avx512"`` (default: the best supported, or
    ``$KERNELSLOT_NATIVE_ISA``). Returns None.
    """
    lib, isa_code = _lib_and_isa(isa)
    if h.dim() != 2:
        raise ValueError(f"expert_mlp_native: h must be (T, H), got shape {tuple(h.shape)}")
    T, H = h.shape
    if H != experts.hidden_size:
        raise ValueError(f"expert_mlp_native: h has H={H}, experts have H={experts.hidden_size}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T:
        raise ValueError(f"expert_mlp_native: topk_ids must be (T={T}, K), got {tuple(topk_ids.shape)}")
    K = topk_ids.shape[1]
    _check(h, "h", (T, H), torch.float32)
    _check(out, "out", (T, H), torch.float32)
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"expert_mlp_native: topk_ids must be int32 or int64, got {topk_ids.dtype}")
    ids = topk_ids.to(device="cpu", dtype=torch.int32).contiguous()
    wts = topk_weights.to(device="cpu", dtype=torch.float32).contiguous()
    if tuple(wts.shape) != (T, K):
        raise ValueError(f"expert_mlp_native: topk_weights must be (T={T}, K={K}), got {tuple(wts.shape)}")
    if T == 0 or K == 0:
        return None
    nth = default_threads() if num_threads is None else int(num_threads)
    if nth < 1:
        raise ValueError(f"expert_mlp_native: num_threads must be >= 1, got {nth}")
    a = act_struct(act)
    rc = lib.ks_moe_experts(ctypes.addressof(experts.struct), ctypes.addressof(a), h.data_ptr(), T,
                            ids.data_ptr(), wts.data_ptr(), K, int(bool(post_scale)),
                            int(bool(quantize_activations)), out.data_ptr(), nth, isa_code)
    if rc != 0:
        raise ValueError(f"expert_mlp_native failed: {_ERRORS.get(rc, rc)} "
                         f"(ids range [{int(ids.min())}, {int(ids.max())}], E={experts.num_experts})")
    return None


def mxfp8_quantize_native(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' MXFP8 quantiser on a 2-D fp32 tensor -> (E4M3 bytes uint8 (R, C), E8M0
    bytes uint8 (R, C/32)); same convention as ``quantize_mx(x, "fp8_e4m3")``."""
    lib, _ = _lib_and_isa(None)
    if x.dim() != 2 or x.shape[1] % 32:
        raise ValueError(f"mxfp8_quantize_native: x must be (R, C) with C % 32 == 0, got {tuple(x.shape)}")
    x = x.to(torch.float32).contiguous()
    codes = torch.empty(x.shape, dtype=torch.uint8)
    scales = torch.empty((x.shape[0], x.shape[1] // 32), dtype=torch.uint8)
    lib.ks_mxfp8_quantize(x.data_ptr(), x.shape[0], x.shape[1], codes.data_ptr(), scales.data_ptr())
    return codes, scales


MXFP8_IMPLS = ("portable", "avx2", "avx512")  # the quantiser's versions: scalar reference, AVX2, AVX-512


def mxfp8_quantizer_outputs(x: torch.Tensor, impl: Optional[str] = None, w_log2: int = 0,
                            in_place: bool = False) -> dict[str, torch.Tensor]:
    """Test hook: every output of one version of the kernels' MXFP8 quantiser on a 1-D fp32 tensor
    (length % 32 == 0). ``impl``: one of :data:`MXFP8_IMPLS` this CPU runs (``portable``: the
    scalar reference), or None for the one the kernels pick. Returns ``y`` (q-dq, fp32; computed in
    place over a copy of ``x`` when ``in_place``), ``codes`` (E4M3 bytes), ``ev`` (E4M3 values,
    fp32), ``scales`` (E8M0 bytes), and the planes ``hi``/``lo`` (int16, planes order),
    ``pscale`` (fp32, 2 per block, for ``w_log2``) and ``has_lo`` (uint8 per block)."""
    lib, _ = _lib_and_isa(None)
    if x.dim() != 1 or x.shape[0] % 32:
        raise ValueError(f"mxfp8_quantizer_outputs: x must be 1-D with length % 32 == 0, got {tuple(x.shape)}")
    x = x.to(torch.float32).contiguous().clone()
    n = x.shape[0]
    out = {"y": x if in_place else torch.empty(n), "codes": torch.empty(n, dtype=torch.uint8),
           "ev": torch.empty(n), "scales": torch.empty(n // 32, dtype=torch.uint8),
           "hi": torch.empty(n, dtype=torch.int16), "lo": torch.empty(n, dtype=torch.int16),
           "pscale": torch.empty(n // 16), "has_lo": torch.empty(n // 32, dtype=torch.uint8)}
    code = -1 if impl is None else MXFP8_IMPLS.index(impl)
    rc = lib.ks_mxfp8_rows_hook(code, x.data_ptr(), n, *(out[k].data_ptr() for k in
                                ("y", "codes", "ev", "scales", "hi", "lo", "pscale", "has_lo")), int(w_log2))
    if rc != 0:
        raise ValueError(f"mxfp8_quantizer_outputs: impl={impl!r}: {_ERRORS.get(rc, rc)}")
    return out


def warm_thread_pool(num_threads: Optional[int] = None) -> None:
    """Wake the native thread pool for a ``num_threads`` call (default: :func:`default_threads`)
    and return once its workers run: they spin ~200 µs before sleeping, as after the previous
    layer's call in a decode loop, so a call made now pays no thread wake-up. benchmarks/moe_decode.py
    calls it untimed before each of our timed calls, as its peer harness resumes ggml's pool."""
    lib, _ = _lib_and_isa(None)
    lib.ks_pool_warm(default_threads() if num_threads is None else int(num_threads))  # C clamps to 1..64


def read_bandwidth_probe(buf: torch.Tensor, num_threads: Optional[int] = None,
                         isa: Optional[str] = None) -> float:
    """Stream all of ``buf`` (contiguous CPU, bytes divisible by 256·threads) through the
    native read kernel; returns a checksum (time the call to get bytes/s)."""
    lib, isa_code = _lib_and_isa(isa)
    nth = default_threads() if num_threads is None else int(num_threads)
    n = buf.numel() * buf.element_size()
    if not buf.is_contiguous() or buf.device.type != "cpu" or n % (256 * nth):
        raise ValueError(f"read_bandwidth_probe: need a contiguous CPU buffer of a multiple of "
                         f"{256 * nth} bytes, got {n} bytes")
    return float(lib.ks_read_bandwidth_probe(buf.data_ptr(), n, nth, isa_code))
