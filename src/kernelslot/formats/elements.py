"""Element formats of the block-scaled codecs: E2M1 (FP4), E4M3 and E5M2 (FP8).

Convention (docs/formats.md):

- Every conversion from fp32 **saturates** to the format's largest finite magnitude
  (E2M1 6, E4M3 448, E5M2 57344; ``inf`` saturates too) and rounds to nearest,
  **ties to even** (even = mantissa LSB 0). The sign of zero is kept: a negative value
  that rounds to zero encodes as negative zero (E2M1 code 0x8).
- ``NaN`` input: E4M3/E5M2 give the format's NaN; E2M1 has no NaN, so callers must not
  pass one (the MX codec never does: a block holding NaN gets a NaN scale and zero
  element codes).
- E2M1 codes are unpacked ``uint8`` values 0..15 in the low nibble:
  bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa.
- FP4 packing: two codes per byte along the last dimension, the **even-index element in
  the low nibble** (PyTorch ``float4_e2m1fn_x2``, torchao, GPT-OSS checkpoints). No other
  nibble order (nkilib, ggml) is produced or accepted here.
- FP8 results are PyTorch ``float8_e4m3fn`` / ``float8_e5m2`` tensors; callers that need the
  raw bytes take ``.view(torch.uint8)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ElementFormat:
    """A block-scaled element type: ``emax`` = exponent of its largest power of two,
    ``mbits`` = explicit mantissa bits, ``max_value`` = largest finite magnitude."""

    name: str
    emax: int
    mbits: int
    max_value: float


E2M1 = ElementFormat("fp4_e2m1", emax=2, mbits=1, max_value=6.0)
E4M3 = ElementFormat("fp8_e4m3", emax=8, mbits=3, max_value=448.0)
E5M2 = ElementFormat("fp8_e5m2", emax=15, mbits=2, max_value=57344.0)

# E2M1 code -> value, index = code (0..15).
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)


def _check_float(x: torch.Tensor, what: str) -> None:
    if not x.is_floating_point():
        raise TypeError(f"{what}: expected a floating-point tensor, got dtype {x.dtype}")


# (threshold, inclusive): a magnitude passing k of these maps to E2M1 code k. A midpoint
# that is an exact tie counts (>=) only when the upper neighbour has the even code.
_E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                    (2.5, False), (3.5, True), (5.0, False))


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """fp32 values -> unpacked E2M1 codes (``uint8``, same shape), saturating at ±6, RNE.

    Round-to-nearest-even on the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6}: a magnitude ``a``
    maps to the number of grid midpoints it lies above, where a midpoint that is an exact
    tie counts only if the upper neighbour has the even code (0.75, 1.75, 3.5) and not if
    the lower one does (0.25, 1.25, 2.5, 5.0). Magnitudes above 6 (and inf) give code 7.
    """
    _check_float(x, "float_to_e2m1")
    a = x.float().abs()
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    passed = torch.empty(a.shape, dtype=torch.bool, device=a.device)
    passed_as_int = passed.view(torch.uint8)  # one reused buffer: no page faults per step
    for threshold, inclusive in _E2M1_THRESHOLDS:
        (torch.ge if inclusive else torch.gt)(a, threshold, out=passed)
        code.add_(passed_as_int)
    torch.signbit(x, out=passed)
    code.add_(passed_as_int.mul_(8))
    return code


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Unpacked E2M1 codes (``uint8`` 0..15) -> fp32 values (same shape)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"e2m1_to_float: expected uint8 codes, got {codes.dtype}")
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[(codes & 0xF).long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes two per byte along the last dim: byte j = code[2j] | code[2j+1] << 4.

    ``codes`` is ``uint8`` of shape (..., n) with n even; the result is ``uint8`` (..., n/2).
    """
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_fp4: expected uint8 codes, got {codes.dtype}")
    if codes.dim() == 0 or codes.shape[-1] % 2 != 0:
        raise ValueError(
            f"pack_fp4: last dim of shape {tuple(codes.shape)} must be even "
            "(two FP4 codes per byte)"
        )
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`: ``uint8`` (..., m) -> codes ``uint8`` (..., 2m),
    element 2j from the low nibble of byte j, element 2j+1 from its high nibble."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_fp4: expected uint8 packed data, got {packed.dtype}")
    if packed.dim() == 0:
        raise ValueError("unpack_fp4: expected at least one dimension")
    pairs = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return pairs.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def fp4_packed_to_float(packed: torch.Tensor) -> torch.Tensor:
    """Packed FP4 bytes (..., m) -> fp32 values (..., 2m) in one table lookup per byte."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"fp4_packed_to_float: expected uint8, got {packed.dtype}")
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    byte = torch.arange(256, device=packed.device)
    pair_table = torch.stack((values[byte & 0xF], values[byte >> 4]), dim=-1)  # (256, 2)
    out = pair_table[packed.long()]
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp values -> ``float8_e4m3fn``, saturating to ±448 (inf included), RNE; NaN stays NaN."""
    _check_float(x, "to_e4m3")
    return x.float().clamp(-E4M3.max_value, E4M3.max_value).to(torch.float8_e4m3fn)


def to_e5m2(x: torch.Tensor) -> torch.Tensor:
    """fp values -> ``float8_e5m2``, saturating to ±57344 (inf included), RNE; NaN stays NaN."""
    _check_float(x, "to_e5m2")
    return x.float().clamp(-E5M2.max_value, E5M2.max_value).to(torch.float8_e5m2)
