"""Numeric formats: E8M0 scales, E2M1/E4M3/E5M2 elements, MXFP4/MXFP8, NVFP4, the 128x4
scale swizzle and the NVFP4 MoE layer view. Conventions: docs/formats.md.
This package imports nothing else from kernelslot."""
from .e8m0 import SCALE_MODES, ScaleMode, e8m0_from_amax, e8m0_reciprocal_float32, e8m0_to_float32
from .elements import (
    E2M1,
    E2M1_VALUES,
    E4M3,
    E5M2,
    ElementFormat,
    e2m1_to_float,
    float_to_e2m1,
    fp4_packed_to_float,
    pack_fp4,
    to_e4m3,
    to_e5m2,
    unpack_fp4,
)
from .moe_layer import (
    MOE_LAYOUT_MODELOPT_GATE_UP,
    Nvfp4MoeLayer,
    dequantize_moe_layer_nvfp4,
    quantize_moe_layer_nvfp4,
)
from .mx import MX_BLOCK_SIZE, MX_ELEMENTS, MxElement, dequantize_mx, quantize_mx
from .nvfp4 import (
    NVFP4_BLOCK_SIZE,
    dequantize_nvfp4,
    nvfp4_per_tensor_scale,
    quantize_nvfp4,
    quantize_nvfp4_blocks,
)
from .swizzle import swizzle_scales_128x4, swizzled_shape, unswizzle_scales_128x4

__all__ = [
    "E2M1", "E2M1_VALUES", "E4M3", "E5M2", "ElementFormat",
    "MOE_LAYOUT_MODELOPT_GATE_UP", "MX_BLOCK_SIZE", "MX_ELEMENTS", "MxElement",
    "NVFP4_BLOCK_SIZE", "Nvfp4MoeLayer", "SCALE_MODES", "ScaleMode",
    "dequantize_moe_layer_nvfp4", "dequantize_mx", "dequantize_nvfp4",
    "e2m1_to_float", "e8m0_from_amax", "e8m0_reciprocal_float32", "e8m0_to_float32",
    "float_to_e2m1", "fp4_packed_to_float", "nvfp4_per_tensor_scale", "pack_fp4",
    "quantize_moe_layer_nvfp4", "quantize_mx", "quantize_nvfp4", "quantize_nvfp4_blocks",
    "swizzle_scales_128x4", "swizzled_shape", "to_e4m3", "to_e5m2",
    "unpack_fp4", "unswizzle_scales_128x4",
]
