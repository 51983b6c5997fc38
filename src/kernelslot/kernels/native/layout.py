"""Repacking :class:`~kernelslot.kernels.experts_spec.ExpertWeights` once into the tile
layout the native kernels stream, and the declared capability domain.

Layout (ks_native.h is the C side of this contract): contraction blocks of 32 elements;
row tiles of 4 rows; each tile is ``[block][row][data bytes]`` then ``[block][row][scale
bytes]``, padded to 64 bytes. Gate/up tile ``t`` holds the rows ``gate 2t, up 2t, gate 2t+1,
up 2t+1`` (contraction over H); down tile ``t`` holds output rows ``4t..4t+3`` (contraction
over I). FP4 (MXFP4, NVFP4) blocks store byte ``j = code[j] | code[j+16] << 4``, bf16 blocks dword
``p = e[p] | e[p+16] << 16`` (a shift of a load gives elements ``p`` in order, a mask of it
elements ``p+16``); data bytes per
row-block: fp32 128, bf16/fp16 64, FP8 32, FP4 16; scale bytes: MX 1 (E8M0), NVFP4 2 (E4M3,
one per 16 elements). Per-row fp32 scales (fp8_row), per-expert outer scales (nvfp4) and the
biases stay in logical order as fp32 arrays. Weights are never modified. Tile tensors from 8 MiB on
live on memory advised for transparent huge pages (:func:`~kernelslot.kernels.native.memory.streamed_zeros`).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Optional

import torch

from kernelslot.kernels.experts_spec import ACTIVATIONS, ExpertActivation, ExpertWeights

from . import build
from .memory import streamed_zeros

TILE_ROWS = 4
KBLOCK = 32
MAX_TOKENS = 64  # decode-time domain; larger batches belong to GEMM paths
# MXFP8 weights are decoded through `bits * 2^(b-7)`; bytes above 134 (scales > 2^7) overflow.
_MXFP8_MAX_SCALE_BYTE = 134

FORMAT_CODES = {"f32": 0, "bf16": 1, "f16": 2, "fp8_row": 3, "mxfp8": 4, "mxfp4": 5, "nvfp4": 6}
_DENSE_CODES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_DATA_BYTES = {"f32": 128, "bf16": 64, "f16": 64, "fp8_row": 32, "mxfp8": 32, "mxfp4": 16, "nvfp4": 16}
_SCALE_BYTES = {"mxfp8": 1, "mxfp4": 1, "nvfp4": 2}


class KsExperts(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int32), ("num_experts", ctypes.c_int32),
                ("hidden", ctypes.c_int32), ("inter", ctypes.c_int32),
                ("gate_up", ctypes.c_void_p), ("down", ctypes.c_void_p),
                ("gu_tile_stride", ctypes.c_int64), ("dn_tile_stride", ctypes.c_int64),
                ("gu_row_scale", ctypes.c_void_p), ("dn_row_scale", ctypes.c_void_p),
                ("gu_outer", ctypes.c_void_p), ("dn_outer", ctypes.c_void_p),
                ("gu_bias", ctypes.c_void_p), ("dn_bias", ctypes.c_void_p),
                ("bf16_scales_ok", ctypes.c_int32)]


@dataclass(frozen=True, eq=False)
class NativeExperts:
    """Experts repacked for the native kernels (build with :func:`prepare_native_experts`).

    ``kind`` is the native format (``f32``/``bf16``/``f16``/``fp8_row``/``mxfp8``/``mxfp4``/
    ``nvfp4``); the tensors are owned here and must stay alive while ``struct`` is used.
    """

    kind: str
    num_experts: int
    hidden_size: int
    intermediate_size: int
    gate_up_tiles: torch.Tensor
    down_tiles: torch.Tensor
    extras: dict[str, Optional[torch.Tensor]] = field(repr=False)
    struct: KsExperts = field(repr=False, compare=False)

    @property
    def weight_bytes_per_expert(self) -> int:
        """Bytes the kernels stream per routed expert (data and block scales, with padding)."""
        return (self.gate_up_tiles[0].numel() + self.down_tiles[0].numel())


def _native_kind(w: ExpertWeights) -> Optional[str]:
    if w.format == "dense":
        return _DENSE_CODES.get(w.gate_up.dtype)
    return w.format


def _shape_problem(w: ExpertWeights) -> Optional[str]:
    """Why ``w`` is outside the native domain, or None."""
    kind = _native_kind(w)
    if kind is None:
        return f"dense dtype {w.gate_up.dtype} (supported: fp32, bf16, fp16)"
    if w.gate_up.device.type != "cpu" or w.down.device.type != "cpu":
        return f"weights on {w.gate_up.device} (native path is CPU only)"
    H, I = w.hidden_size, w.intermediate_size
    if H % KBLOCK or I % KBLOCK or H == 0 or I == 0:
        return f"H={H}, I={I} must be positive multiples of {KBLOCK}"
    if H >= 2**31 // 4 or I >= 2**31 // 4:
        return "dimensions too large"
    if kind == "mxfp8" and w.gate_up_scale is not None and w.down_scale is not None:
        top = max(int(w.gate_up_scale.view(torch.uint8).max()), int(w.down_scale.view(torch.uint8).max()))
        if top > _MXFP8_MAX_SCALE_BYTE:
            return f"MXFP8 weight scale byte {top} > {_MXFP8_MAX_SCALE_BYTE} (scale > 2^7)"
    return None


def _tile_stride(kind: str, K: int) -> int:
    nkb = K // KBLOCK
    raw = nkb * TILE_ROWS * (_DATA_BYTES[kind] + _SCALE_BYTES.get(kind, 0))
    return raw + (-raw) % 64


def _repack(kind: str, data: torch.Tensor, scale: Optional[torch.Tensor], order: torch.Tensor,
            dst: torch.Tensor) -> None:
    """One expert's matrix (rows, K...) -> ``dst`` (rows/4, tile stride) in the tile layout."""
    rows = data.shape[0]
    src = data.contiguous().view(torch.uint8).reshape(rows, -1)
    sc = None
    if kind in _SCALE_BYTES:
        sc = scale.contiguous().view(torch.uint8).reshape(rows, -1)
    K = src.shape[1] * 2 if kind in ("mxfp4", "nvfp4") else src.shape[1] * KBLOCK // _DATA_BYTES[kind]
    rc = build.loaded().lib.ks_repack_matrix(
        FORMAT_CODES[kind], src.data_ptr(), src.shape[1], None if sc is None else sc.data_ptr(),
        0 if sc is None else sc.shape[1], rows, K, order.data_ptr(), dst.data_ptr(), dst.shape[1])
    if rc != 0:
        raise ValueError(f"prepare_native_experts: repack failed for a {kind} matrix of shape {tuple(data.shape)}")


def _bf16_scales_ok(w: ExpertWeights) -> bool:
    """MXFP4 scales usable as bf16 exponent offsets (the avx512bf16 MX path): bytes in [2, 252]."""
    scales = (w.gate_up_scale.view(torch.uint8), w.down_scale.view(torch.uint8))
    return all(int(s.min()) >= 2 and int(s.max()) <= 252 for s in scales)


def _f32(t: Optional[torch.Tensor], shape: tuple[int, ...]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().to(torch.float32).reshape(shape).contiguous()


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def prepare_native_experts(weights: ExpertWeights) -> NativeExperts:
    """Repack ``weights`` once into the native tile layout (copies; ``weights`` unchanged).

    Raises ValueError when the weights are outside the native domain (see
    :func:`native_supports`) or miss a scale their format needs.
    """
    problem = _shape_problem(weights)
    if problem:
        raise ValueError(f"prepare_native_experts: unsupported experts: {problem}")
    kind = _native_kind(weights)
    E, H, I = weights.num_experts, weights.hidden_size, weights.intermediate_size
    if kind in _SCALE_BYTES or kind == "fp8_row":
        if weights.gate_up_scale is None or weights.down_scale is None:
            raise ValueError(f"prepare_native_experts: format {kind!r} needs gate_up_scale and down_scale")
    if kind == "nvfp4" and (weights.gate_up_outer is None or weights.down_outer is None):
        raise ValueError("prepare_native_experts: nvfp4 needs gate_up_outer and down_outer (E,)")
    if build.loaded().lib is None:
        raise RuntimeError(f"prepare_native_experts: native path unavailable: {build.loaded().reason}")
    t = torch.arange(I // 2)
    gu_order = torch.stack((2 * t, I + 2 * t, 2 * t + 1, I + 2 * t + 1), dim=1).reshape(-1).contiguous()
    dn_order = torch.arange(H)
    gate_up_tiles = streamed_zeros(E, I // 2, _tile_stride(kind, H))
    down_tiles = streamed_zeros(E, H // TILE_ROWS, _tile_stride(kind, I))
    with torch.no_grad():
        for e in range(E):
            gs = weights.gate_up_scale[e] if kind in _SCALE_BYTES else None
            ds = weights.down_scale[e] if kind in _SCALE_BYTES else None
            _repack(kind, weights.gate_up[e], gs, gu_order, gate_up_tiles[e])
            _repack(kind, weights.down[e], ds, dn_order, down_tiles[e])
        extras = {
            "gu_row_scale": _f32(weights.gate_up_scale, (E, 2 * I)) if kind == "fp8_row" else None,
            "dn_row_scale": _f32(weights.down_scale, (E, H)) if kind == "fp8_row" else None,
            "gu_outer": _f32(weights.gate_up_outer, (E,)) if kind == "nvfp4" else None,
            "dn_outer": _f32(weights.down_outer, (E,)) if kind == "nvfp4" else None,
            "gu_bias": _f32(weights.gate_up_bias, (E, 2 * I)),
            "dn_bias": _f32(weights.down_bias, (E, H)),
        }
    st = KsExperts(FORMAT_CODES[kind], E, H, I, gate_up_tiles.data_ptr(), down_tiles.data_ptr(),
                   gate_up_tiles.shape[2], down_tiles.shape[2],
                   *(_ptr(extras[k]) for k in ("gu_row_scale", "dn_row_scale", "gu_outer", "dn_outer",
                                               "gu_bias", "dn_bias")),
                   _bf16_scales_ok(weights) if kind == "mxfp4" else 0)
    return NativeExperts(kind, E, H, I, gate_up_tiles, down_tiles, extras, st)


def native_supports(weights: ExpertWeights | NativeExperts, act: ExpertActivation, T: int) -> bool:
    """The declared domain of :func:`expert_mlp_native`: the library loaded; CPU weights in
    fp32/bf16/fp16 dense, fp8_row, mxfp8, mxfp4 or nvfp4 with H and I multiples of 32 (MXFP8
    weight scales at most 2^7); every activation kind of :class:`ExpertActivation`; and
    ``1 <= T <= 64`` tokens."""
    if build.loaded().lib is None or not 1 <= int(T) <= MAX_TOKENS:
        return False
    if act.kind not in ACTIVATIONS:
        return False
    if isinstance(weights, NativeExperts):
        return True
    return _shape_problem(weights) is None
