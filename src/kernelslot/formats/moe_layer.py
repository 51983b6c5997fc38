"""The NVFP4 MoE layer view, as SGLang keeps a ModelOpt NVFP4 fused-MoE layer.

This is what ``moe.fused_experts``'s NVFP4 profile hands to ``prepare("nvfp4_layer", view)``
(docs/formats.md). Conventions:

- ``w13_weight`` ``uint8`` (E, 2I, H/2): per expert the gate rows then the up rows
  (``layout = "modelopt_gate_up"``), NVFP4 packed along H, even index in the low nibble.
- ``w13_weight_scale`` ``float8_e4m3fn``: one scale per 16 weights along H, logical shape
  (E, 2I, H/16), stored **swizzled** 128x4 per expert (:mod:`.swizzle`), i.e. shape
  (E, pad128(2I), pad4(H/16)); equal to (E, 2I, H/16) when 2I % 128 == 0 and H % 64 == 0.
- ``w2_weight`` ``uint8`` (E, H, I/2) and ``w2_weight_scale`` swizzled (E, pad128(H), pad4(I/16)).
- ``g1_alphas``, ``g2_alphas`` fp32 (E,) = ``input_scale * weight_scale_2``;
  ``a1_inv``, ``a2_inv`` fp32 (E,) = ``1 / input_scale`` (SGLang's ``w13_input_scale_quant`` /
  ``w2_input_scale_quant``), one input scale per expert and projection.
- ``weight_scale_2`` (the NVFP4 per-tensor scale of one expert's matrix) is not stored: the
  outer scale of a weight is ``g_alpha * a_inv`` (one fp32 product). The builder picks every
  input scale as a power of two, so that product equals ``weight_scale_2`` bit for bit.
- Dequantised weight = ``fp32(e2m1 * block_scale) * outer``, computed in fp32.

The view is read-only by contract: its tensors are fresh (never views of the dense weights
passed to the builder) and consumers must not mutate them in place — the referee compares
them bit-exactly (:meth:`Nvfp4MoeLayer.digest`) after every call. A consumer that needs a
different layout builds its own copy in ``prepare``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from .nvfp4 import NVFP4_BLOCK_SIZE, nvfp4_per_tensor_scale, quantize_nvfp4_blocks
from .swizzle import swizzle_scales_128x4, swizzled_shape, unswizzle_scales_128x4

MOE_LAYOUT_MODELOPT_GATE_UP = "modelopt_gate_up"
# Input scales are 2^k with k drawn uniformly from this inclusive range: activation amax of
# roughly 2.6 .. 84 over 448*6, the span seen in real ModelOpt NVFP4 checkpoints.
_INPUT_SCALE_LOG2_RANGE = (-10, -5)


@dataclass(frozen=True)
class Nvfp4MoeLayer:
    """A ModelOpt-NVFP4 MoE layer in SGLang's tensor names (see module docstring)."""

    w13_weight: torch.Tensor
    w13_weight_scale: torch.Tensor
    w2_weight: torch.Tensor
    w2_weight_scale: torch.Tensor
    g1_alphas: torch.Tensor
    g2_alphas: torch.Tensor
    a1_inv: torch.Tensor
    a2_inv: torch.Tensor
    intermediate_size: int
    group_size: int = NVFP4_BLOCK_SIZE
    layout: str = MOE_LAYOUT_MODELOPT_GATE_UP

    def __post_init__(self) -> None:
        if self.layout != MOE_LAYOUT_MODELOPT_GATE_UP:
            raise ValueError(
                f"Nvfp4MoeLayer.layout={self.layout!r}; only {MOE_LAYOUT_MODELOPT_GATE_UP!r} exists"
            )
        if self.group_size != NVFP4_BLOCK_SIZE:
            raise ValueError(f"Nvfp4MoeLayer.group_size={self.group_size}; NVFP4 uses 16")
        e, two_i, half_h = _shape_of(self.w13_weight, "w13_weight", torch.uint8, 3)
        i, h = self.intermediate_size, half_h * 2
        if two_i != 2 * i or i % NVFP4_BLOCK_SIZE or h % NVFP4_BLOCK_SIZE:
            raise ValueError(
                f"Nvfp4MoeLayer: w13_weight {tuple(self.w13_weight.shape)} must be "
                f"(E, 2I, H/2) with I={i}; I and H must be multiples of {NVFP4_BLOCK_SIZE}"
            )
        expect = {
            "w2_weight": ((e, h, i // 2), torch.uint8),
            "w13_weight_scale": ((e, *swizzled_shape(2 * i, h // 16)), torch.float8_e4m3fn),
            "w2_weight_scale": ((e, *swizzled_shape(h, i // 16)), torch.float8_e4m3fn),
            "g1_alphas": ((e,), torch.float32),
            "g2_alphas": ((e,), torch.float32),
            "a1_inv": ((e,), torch.float32),
            "a2_inv": ((e,), torch.float32),
        }
        for name, (shape, dtype) in expect.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(
                    f"Nvfp4MoeLayer.{name}: expected {dtype} {shape} (E={e}, H={h}, I={i}), "
                    f"got {_describe(t)}"
                )
        for name, t in self.tensors().items():
            if not t.is_contiguous() or t.device != self.w13_weight.device:
                raise ValueError(
                    f"Nvfp4MoeLayer.{name}: every tensor must be contiguous and on "
                    f"{self.w13_weight.device}; got device {t.device}, strides {t.stride()}"
                )

    @property
    def num_experts(self) -> int:
        return self.w13_weight.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.w13_weight.shape[2] * 2

    def tensors(self) -> dict[str, torch.Tensor]:
        """The eight tensors by field name, in declaration order."""
        names = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale",
                 "g1_alphas", "g2_alphas", "a1_inv", "a2_inv")
        return {name: getattr(self, name) for name in names}

    def clone(self) -> Nvfp4MoeLayer:
        """A deep copy (fresh storages), e.g. to hand a candidate its own view."""
        copies = {name: t.clone() for name, t in self.tensors().items()}
        return Nvfp4MoeLayer(**copies, intermediate_size=self.intermediate_size,
                             group_size=self.group_size, layout=self.layout)

    def digest(self) -> str:
        """SHA-256 over every tensor's bytes, shapes, dtypes and the scalar fields."""
        h = hashlib.sha256()
        h.update(f"{self.intermediate_size}|{self.group_size}|{self.layout}".encode())
        for name, t in self.tensors().items():
            h.update(f"|{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
        return h.hexdigest()


def _describe(t: object) -> str:
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _shape_of(t: torch.Tensor, name: str, dtype: torch.dtype, dim: int) -> tuple[int, ...]:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != dim:
        raise ValueError(
            f"Nvfp4MoeLayer.{name}: expected a {dim}-D {dtype} tensor, got {_describe(t)}"
        )
    return tuple(t.shape)


def _quantize_expert_stack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E, rows, cols) dense -> packed data, swizzled E4M3 scales, weight_scale_2 (E,)."""
    weight_scale_2 = nvfp4_per_tensor_scale(w, dim=(1, 2))
    data, block_scales = quantize_nvfp4_blocks(w, weight_scale_2.view(-1, 1, 1))
    return data, swizzle_scales_128x4(block_scales), weight_scale_2


def _power_of_two_input_scales(e: int, generator: torch.Generator) -> torch.Tensor:
    lo, hi = _INPUT_SCALE_LOG2_RANGE
    k = torch.randint(lo, hi + 1, (e,), generator=generator)
    return torch.pow(2.0, k.to(torch.float32))


def quantize_moe_layer_nvfp4(
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    seed: int = 0,
    generator: torch.Generator | None = None,
) -> Nvfp4MoeLayer:
    """Dense MoE weights -> :class:`Nvfp4MoeLayer`.

    ``w13`` (E, 2I, H) gate rows then up rows; ``w2`` (E, H, I); H and I multiples of 16.
    Per expert and projection: ``weight_scale_2 = amax/(448*6)`` of that expert's matrix,
    NVFP4 block quantisation against it, block scales swizzled 128x4. Input scales are
    powers of two drawn from ``generator`` (or a CPU generator seeded with ``seed``), so
    ``g_alpha * a_inv == weight_scale_2`` exactly. Deterministic for a given seed/generator.
    """
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"quantize_moe_layer_nvfp4: w13 must be (E, 2I, H) and w2 (E, H, I), "
            f"got {tuple(w13.shape)} and {tuple(w2.shape)}"
        )
    e, two_i, h = w13.shape
    i = two_i // 2
    if two_i % 2 or tuple(w2.shape) != (e, h, i):
        raise ValueError(
            f"quantize_moe_layer_nvfp4: w13 {tuple(w13.shape)} = (E, 2I, H) implies "
            f"w2 of shape {(e, h, i)} (E, H, I), got {tuple(w2.shape)}"
        )
    if generator is None:
        generator = torch.Generator().manual_seed(seed)
    w13_data, w13_scale, ws2_13 = _quantize_expert_stack(w13)
    w2_data, w2_scale, ws2_2 = _quantize_expert_stack(w2)
    input_scale_1 = _power_of_two_input_scales(e, generator).to(w13.device)
    input_scale_2 = _power_of_two_input_scales(e, generator).to(w13.device)
    g1, g2 = input_scale_1 * ws2_13, input_scale_2 * ws2_2
    a1_inv, a2_inv = 1.0 / input_scale_1, 1.0 / input_scale_2
    for name, g, a_inv, ws2 in (("w13", g1, a1_inv, ws2_13), ("w2", g2, a2_inv, ws2_2)):
        if not torch.equal(g * a_inv, ws2):
            raise ValueError(
                f"quantize_moe_layer_nvfp4: {name} weight_scale_2 {ws2.tolist()} is too small "
                "to survive the power-of-two input scale exactly (fp32 underflow); rescale "
                "the weights"
            )
    return Nvfp4MoeLayer(
        w13_weight=w13_data, w13_weight_scale=w13_scale,
        w2_weight=w2_data, w2_weight_scale=w2_scale,
        g1_alphas=g1, g2_alphas=g2, a1_inv=a1_inv, a2_inv=a2_inv,
        intermediate_size=i,
    )


def _decode_e2m1_bits(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes -> fp32 from the bit fields (sign, 2-bit exponent bias 1, 1-bit mantissa),
    deliberately not the lookup table the codec uses, so the reference stays independent."""
    c = codes.to(torch.int32)
    sign = 1.0 - 2.0 * ((c >> 3) & 1).float()
    exponent = ((c >> 1) & 3).float()
    mantissa = (c & 1).float()
    magnitude = torch.where(
        exponent == 0, 0.5 * mantissa, torch.pow(2.0, exponent - 1.0) * (1.0 + 0.5 * mantissa)
    )
    return sign * magnitude


def _dequantize_projection(
    packed: torch.Tensor, swizzled: torch.Tensor, g_alpha: torch.Tensor, a_inv: torch.Tensor
) -> torch.Tensor:
    e, rows, half = packed.shape
    cols = half * 2
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(e, rows, cols)
    elements = _decode_e2m1_bits(codes).reshape(e, rows, cols // NVFP4_BLOCK_SIZE, NVFP4_BLOCK_SIZE)
    block_scales = unswizzle_scales_128x4(swizzled, rows, cols // NVFP4_BLOCK_SIZE).float()
    outer = (g_alpha * a_inv).view(e, 1, 1, 1)
    return ((elements * block_scales.unsqueeze(-1)) * outer).reshape(e, rows, cols)


def dequantize_moe_layer_nvfp4(layer: Nvfp4MoeLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference dequantisation of a view -> ``(w13 fp32 (E, 2I, H), w2 fp32 (E, H, I))``:
    unswizzle the block scales, ``fp32(e2m1 * block_scale) * (g_alpha * a_inv)``."""
    w13 = _dequantize_projection(layer.w13_weight, layer.w13_weight_scale,
                                 layer.g1_alphas, layer.a1_inv)
    w2 = _dequantize_projection(layer.w2_weight, layer.w2_weight_scale,
                                layer.g2_alphas, layer.a2_inv)
    return w13, w2
