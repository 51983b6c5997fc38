"""The Triton grouped expert MLP and its helpers, interpreted: bit-exact codecs, pair sorting, every format."""
from __future__ import annotations

import pytest
import torch

from kernelslot.formats.e8m0 import e8m0_to_float32
from kernelslot.formats.elements import e2m1_to_float
from kernelslot.formats.mx import dequantize_mx, quantize_mx
from kernelslot.kernels.experts_spec import ExpertActivation, ScalingMode
from kernelslot.kernels.moe_block.leaves import experts_reference
from kernelslot.slots.moe_block import make_expert_weights
from tests.kernels.triton.support import NUMPY_WARNINGS, require_interpreter

require_interpreter()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernelslot.kernels.triton._common import (e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, mxfp8_roundtrip_rows,  # noqa: E402
                                               to_output)
from kernelslot.kernels.triton.experts import expert_mlp, sort_pairs  # noqa: E402

pytestmark = list(NUMPY_WARNINGS)


@triton.jit
def _decode_bytes(src, dst, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    byte = tl.load(src + offs, mask=offs < n, other=0).to(tl.int32)
    if KIND == 0:
        value = e2m1_to_f32(byte & 15)
    elif KIND == 1:
        value = e4m3_to_f32(byte)
    else:
        value = e8m0_to_f32(byte)
    tl.store(dst + offs, value, mask=offs < n)


@triton.jit
def _round_store(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, to_output(tl.load(src + offs, mask=offs < n), dst.dtype.element_ty), mask=offs < n)


@triton.jit
def _mx_rows(src, dst, ROWS: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * 32 + tl.arange(0, 32)[None, :]
    tl.store(dst + offs, mxfp8_roundtrip_rows(tl.load(src + offs)))


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal where not NaN, NaN in the same places."""
    nan = a.isnan()
    return bool(torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32)))


@pytest.mark.parametrize("kind", ["e2m1", "e4m3", "e8m0"])
def test_element_decodes_are_bit_exact_for_every_byte(kind: str) -> None:
    n = 16 if kind == "e2m1" else 256
    codes = torch.arange(n, dtype=torch.int32).to(torch.uint8)
    got = torch.empty(n)
    _decode_bytes[(1,)](codes, got, n, KIND=["e2m1", "e4m3", "e8m0"].index(kind), BLOCK=256)
    want = {"e2m1": lambda: e2m1_to_float(codes), "e4m3": lambda: codes.view(torch.float8_e4m3fn).float(),
            "e8m0": lambda: e8m0_to_float32(codes)}[kind]()
    assert same_values(got, want.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stores_round_to_nearest_even(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * 100
    ties = (torch.randint(0, 1 << 15, (1024,), generator=gen, dtype=torch.int32) << 16 | 0x8000).view(torch.float32)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.4e38, -0.0, 1e-40, 65520.0, 65519.0])
    x = torch.cat([x, ties, special])  # ties: the low 16 bits are exactly half a bf16 step
    got = torch.empty(x.shape, dtype=dtype)
    _round_store[(triton.cdiv(x.numel(), 1024),)](x, got, x.numel(), BLOCK=1024)
    want = x.to(dtype)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_mxfp8_roundtrip_matches_the_codec_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(1)
    scales = torch.tensor([1e-3, 1.0, 7.0, 300.0, 1e-30])[torch.randint(0, 5, (64, 1), generator=gen)]
    x = torch.randn(64, 32, generator=gen) * scales
    x[0] = 0.0  # amax 0
    x[1] = torch.randint(-64, 64, (32,), generator=gen) * 2.0 ** -10  # many exact E4M3 ties
    x[2, 5] = float("nan")
    x[3, 0] = float("inf")
    got = torch.empty_like(x)
    _mx_rows[(1,)](x, got, ROWS=64)
    data, block_scales = quantize_mx(x, "fp8_e4m3")
    assert same_values(got, dequantize_mx(data, block_scales, "fp8_e4m3"))


def test_sort_pairs_groups_every_valid_pair_once_in_padded_expert_runs() -> None:
    ids = torch.tensor([[2, -1, 0], [2, 2, 5], [-1, -1, -1], [0, 1, 2]], dtype=torch.int32)  # 5 is out of range for E=4
    pairs, block_expert = sort_pairs(ids, 4, block_m=4)
    n = ids.numel()
    assert pairs.numel() == 4 * block_expert.numel() == 24  # N + min(E, N)·(block_m - 1), rounded up
    flat = ids.flatten().tolist()
    runs = pairs.view(-1, 4).tolist()
    for rows, e in zip(runs, block_expert.tolist()):
        assert all(p == n for p in rows) if e < 0 else all(p == n or flat[p] == e for p in rows)
    listed = sorted(p for p in pairs.tolist() if p < n)
    assert listed == [p for p, e in enumerate(flat) if 0 <= e < 4]
    assert block_expert.tolist() == [0, 1, 2, -1, -1, -1]  # 2, 1 and 4 pairs: one block each; 3 unused worst-case blocks


ACTS = {"silu": ExpertActivation("silu"), "swigluoai": ExpertActivation.swigluoai(1.702, 7.0),
        "gelu": ExpertActivation("gelu", gate_clamp=(-3.0, None)), "gelu_tanh": ExpertActivation("gelu_tanh")}


@pytest.mark.parametrize(("fmt", "act", "dtype"), [
    ("dense", "silu", torch.float32), ("dense", "gelu", torch.bfloat16), ("fp8_row", "gelu_tanh", torch.float32),
    ("mxfp4", "swigluoai", torch.bfloat16), ("mxfp8", "silu", torch.bfloat16), ("nvfp4", "swigluoai", torch.float32)])
def test_expert_mlp_matches_the_torch_twin(fmt: str, act: str, dtype: torch.dtype) -> None:
    """Every weight format (biases on), activation and clamp, the MX path with MXFP8 activations."""
    gen = torch.Generator().manual_seed(2)
    weights = make_expert_weights(fmt, 5, 64, 32, gen, dtype, biases=True, gate_scale=3.0)
    h = torch.randn(7, 64, generator=gen)
    ids = torch.randint(-1, 5, (7, 3), generator=gen)
    coef = torch.rand(7, 3, generator=gen)
    mx = fmt in ("mxfp4", "mxfp8")
    out = torch.full((7, 96), float("nan"))[:, :64]
    expert_mlp(weights, h, ids, coef, ACTS[act], out, mx)
    want = experts_reference(weights, h, ids, coef, ACTS[act], ScalingMode.POST_SCALE, mx)
    torch.testing.assert_close(out, want, atol=1e-4 * float(want.abs().max()), rtol=1e-3)
