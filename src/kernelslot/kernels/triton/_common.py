"""Shared ``@triton.jit`` helpers and launcher conventions of kernelslot's Triton kernels.

Numeric conventions, the same compiled and under the interpreter (``TRITON_INTERPRET=1``):

- **Stores** round fp32 to the output dtype to nearest, ties to even (:func:`to_output`). The
  bf16 value is built from the fp32 bits in integer arithmetic, because triton 3.9's interpreter
  truncates fp32 -> bf16 casts (and flushes subnormals) where the compiler rounds.
- **Dots** take fp32 operands (:func:`dot_precision` picks ``input_precision``): IEEE fp32 where
  the I/O dtype is float32, TF32 where it is bfloat16/float16. Every bf16, fp16, E2M1·E4M3 and
  E4M3/E2M1·E8M0 value is exact in TF32, so those products are exact, as in a half-precision MMA
  with fp32 accumulation; an fp32 intermediate (the expert MLP's activation, attention
  probabilities) is rounded to TF32's 10-bit mantissa on the GPU. (Triton 3.9's interpreter
  multiplies bf16 dot operands as their raw bits, so bf16 never reaches ``tl.dot``; it ignores
  ``input_precision`` and computes fp32 dots exactly.)
- **Element codecs** (docs/formats.md) are bit-exact integer decodes: E2M1 codes, E4M3 and E8M0
  bytes to fp32; :func:`mxfp8_roundtrip_rows` is ``formats.mx`` MXFP8 E4M3 quantise-dequantise
  (floor E8M0 scale, saturating RNE elements) of 32-element blocks.

Launchers index every tensor through its own strides (element units) and never copy an output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["dot_precision", "pow2", "lead_dims", "to_output", "e2m1_to_f32", "e4m3_to_f32", "e8m0_to_f32",
           "mxfp8_roundtrip_rows"]


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of the fp32 dots for I/O in ``dtype`` (module docstring)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def pow2(n: int, least: int = 1) -> int:
    """The smallest power of two >= max(n, least) (Triton block sizes)."""
    return max(triton.next_power_of_2(max(int(n), 1)), least)


def lead_dims(t: torch.Tensor) -> tuple[int, int, int, int]:
    """``(L0, L1, stride0, stride1)``: the at most two leading dims of ``t (..., n)`` as a row grid.

    Row ``r`` of the ``L0·L1`` rows sits at ``(r // L1)·stride0 + (r % L1)·stride1``; a missing
    leading dim has size 1 and stride 0. Callers split tensors of more than three dims first.
    """
    if t.dim() > 3:
        raise ValueError(f"lead_dims: at most two leading dims, got shape {tuple(t.shape)}")
    sizes = (1,) * (3 - t.dim()) + tuple(t.shape[:-1])
    strides = (0,) * (3 - t.dim()) + tuple(t.stride()[:-1])
    return sizes[0], sizes[1], strides[0], strides[1]


@triton.jit
def to_output(x, dtype: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype`` to nearest, ties to even (NaN kept)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = tl.where(x != x, 0x7FC00000, bits + 0x7FFF + ((bits >> 16) & 1))
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)


@triton.jit
def e2m1_to_f32(code):
    """E2M1 codes (int32, 0..15; bit 3 the sign) -> fp32 ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}."""
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, m * 0.5, (2.0 + m) * (1 << e).to(tl.float32) * 0.25)
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def e4m3_to_f32(byte):
    """``float8_e4m3fn`` bytes (int32, 0..255) -> fp32 (bias 7, subnormal step 2^-9, 0x7F/0xFF NaN)."""
    e = (byte >> 3) & 15
    m = byte & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
    return tl.where((byte & 128) != 0, -mag, mag)


@triton.jit
def e8m0_to_f32(byte):
    """E8M0 bytes (int32, 0..255) -> fp32 ``2^(b-127)``; byte 0 is ``2^-127``, 0xFF NaN."""
    bits = tl.where(byte == 0, 0x00400000, byte << 23)
    bits = tl.where(byte == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def mxfp8_roundtrip_rows(x):
    """Each row of fp32 ``x (R, 32)`` (one MX block) quantised to MXFP8 E4M3 and back, as
    ``formats.quantize_mx(·, "fp8_e4m3")`` then ``dequantize_mx``: scale ``2^(floor(log2 amax) - 8)``
    (byte clamped to [0, 254]; a block holding NaN or inf gives NaN), elements ``x/scale``
    saturated to ±448 and rounded to 3 mantissa bits (subnormal step 2^-9), ties to even."""
    amax = tl.max(tl.abs(x), axis=1)
    bad = tl.sum(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), axis=1) > 0
    biased = tl.minimum(tl.maximum(((amax.to(tl.int32, bitcast=True) & 0x7FFFFFFF) >> 23) - 8, 0), 254)
    scale = e8m0_to_f32(biased)
    recip = tl.where(biased == 254, 0x00400000, (254 - biased) << 23).to(tl.float32, bitcast=True)
    v = tl.minimum(tl.maximum(x * recip[:, None], -448.0), 448.0)
    exp = tl.maximum(((v.to(tl.int32, bitcast=True) >> 23) & 255) - 127, -6)  # E4M3 exponent of v, at least -6
    step = ((exp + 124) << 23).to(tl.float32, bitcast=True)  # 2^(exp-3): the E4M3 spacing at v
    inv_step = ((130 - exp) << 23).to(tl.float32, bitcast=True)
    q = ((v * inv_step + 12582912.0) - 12582912.0) * step  # 1.5·2^23: fp32 rounds |y| < 2^22 to an even integer
    return tl.where(bad[:, None], float("nan"), q * scale[:, None])
