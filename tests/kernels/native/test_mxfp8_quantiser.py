"""The native MXFP8 online quantiser's vector versions (AVX-512, AVX2) against its scalar reference
bit for bit — every output (q-dq values, E4M3 codes and values, E8M0 bytes, int16 planes, plane
scales, lo flags), in place or not — and the codes and scales against
kernelslot.formats.quantize_mx, over all 2^16 bf16 bit patterns as fp32, random fp32 bit
patterns, E4M3 round-half-even ties (and their fp32 neighbours) at every reachable block scale,
E4M3 subnormals, scale boundaries (amax at and just below every power of two, denormal and huge
amax, saturation above 448), and NaN / inf / zero / denormal blocks; also under flush-to-zero.
On the expert path, ``KERNELSLOT_NATIVE_MXFP8_SCALAR=1`` (the scalar reference) gives the same bits."""
from __future__ import annotations

import pytest
import torch

from kernelslot.formats import quantize_mx
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.kernels.native import build, expert_mlp_native, native_status, prepare_native_experts
from kernelslot.kernels.native.ops import mxfp8_quantizer_outputs

AVAILABLE, BEST_ISA, REASON = native_status()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"native path unavailable: {REASON}")
VECTOR_IMPLS = ("avx2", "avx512")
_NEEDS = {"avx2": "AVX2 + FMA + F16C", "avx512": "AVX-512 F/BW/VL/DQ"}


def _impl_param(impl: str):
    return pytest.param(impl, marks=pytest.mark.skipif(not (AVAILABLE and build.isa_supported(impl)),
                                                       reason=f"needs {_NEEDS[impl]} (this CPU lacks it)"))


def _f(bits: torch.Tensor) -> torch.Tensor:
    """int64 / int32 bit patterns -> fp32."""
    return (bits.to(torch.int64) & 0xFFFFFFFF).to(torch.int32).view(torch.float32)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def _grid() -> torch.Tensor:
    """The 127 finite non-negative E4M3 values, ascending (0 .. 448)."""
    return torch.arange(127, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()


def _adversarial(gen: torch.Generator) -> torch.Tensor:
    """1-D fp32, a multiple of 32 long: every case of the module docstring."""
    parts = []
    bf16 = _f(torch.arange(1 << 16, dtype=torch.int64) << 16)       # every bf16 pattern as fp32
    parts += [bf16, bf16[torch.randperm(1 << 16, generator=gen)]]   # in order (like magnitudes) and mixed
    parts.append(_f(torch.randint(0, 1 << 32, (32 * 2048,), generator=gen)))  # any fp32 bits (some NaN/inf)
    # fp32 bits with exponents confined near a random level per block: like-sized elements, any mantissa
    lvl = torch.randint(0, 254, (2048, 1), generator=gen)
    e = (lvl - torch.randint(0, 12, (2048, 32), generator=gen)).clamp(min=0)
    m = torch.randint(0, 1 << 23, (2048, 32), generator=gen)
    s = torch.randint(0, 2, (2048, 32), generator=gen) << 31
    parts.append(_f(s | e << 23 | m).reshape(-1))
    g = _grid()
    ties = (g[:-1] + g[1:]) / 2                                     # 126 exact midpoints (round half even)
    tie_rows = []
    for sb in range(0, 247):                                        # every scale a finite amax reaches
        k = sb - 127
        for t in (ties, torch.nextafter(ties, torch.tensor(0.0)), torch.nextafter(ties, torch.tensor(1e9)), g[1:]):
            v = t * 2.0 ** k                                       # exact (>= 2^-137)
            v = torch.cat([v, torch.zeros((-v.numel()) % 31)])
            blocks = v.reshape(-1, 31)
            lead = torch.full((blocks.shape[0], 1), 448.0 * 2.0 ** k)  # pins the block scale at sb
            blk = torch.cat([lead, blocks], 1)
            sign = torch.where(torch.rand(blk.shape, generator=gen) < 0.5, -1.0, 1.0)
            tie_rows.append((blk * sign).reshape(-1))
    parts += tie_rows
    # scale boundaries: amax exactly 2^e and just below it, for every fp32 exponent (denormals too)
    for ex in range(-149, 128):
        top = torch.tensor(2.0 ** ex, dtype=torch.float32)
        for amax in (top, torch.nextafter(top, torch.tensor(0.0))):
            if amax == 0:
                continue
            frac = torch.rand(31, generator=gen) * torch.logspace(0, -12, 31)
            blk = torch.cat([amax.view(1), amax * frac * torch.where(torch.rand(31, generator=gen) < 0.5, -1.0, 1.0)])
            parts.append(blk[torch.randperm(32, generator=gen)])
    # saturation: elements that scale to (448, 512), exact 448, and 480 (above the grid's top)
    for k in (-120, -60, -1, 0, 1, 60, 110):
        base = torch.tensor([448.0, 449.0, 464.0, 479.999, 480.0, 480.001, 500.0, 511.99]) * 2.0 ** k
        parts.append(torch.cat([base, -base, base / 2, -base / 3]))
    # E4M3 subnormals of the block (|v| < 2^-6 after scaling): every multiple of 2^-10 there, signs
    sub = torch.arange(0, 16, dtype=torch.float32) * 2.0 ** -10
    parts.append(torch.cat([torch.tensor([448.0]), sub[1:], -sub]))
    parts.append(torch.cat([torch.tensor([-448.0 * 2.0 ** -100]), sub[1:] * 2.0 ** -100, -sub * 2.0 ** -100]))
    # specials: a NaN / inf in each position, negative and signalling NaNs, zeros, denormal blocks
    for special in (float("nan"), float("inf"), float("-inf")):
        blk = torch.randn(32, 32, generator=gen)
        blk[torch.arange(32), torch.arange(32)] = special
        parts.append(blk.reshape(-1))
    parts.append(_f(torch.tensor([0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF] * 8)))
    parts.append(_f(torch.tensor([0x7F800001] + [0x3F800000] * 31)))
    parts += [torch.zeros(32), -torch.zeros(32), torch.tensor([0.0, -0.0] * 16)]
    parts.append(_f(torch.randint(1, 1 << 23, (32 * 16,), generator=gen) | torch.randint(0, 2, (32 * 16,), generator=gen) << 31))
    den = _f(torch.randint(1, 1 << 23, (32 * 16,), generator=gen)).reshape(16, 32)
    den[:, 0] = torch.logspace(-37, -30, 16)                        # tiny normal amax over denormals
    parts.append(den.reshape(-1))
    parts.append(torch.tensor([3.4028235e38, -3.4028235e38, 1e38, -1e30] * 8))  # huge amax (sb 246)
    x = torch.cat([p.reshape(-1).float() for p in parts])
    assert x.numel() % 32 == 0, x.numel()
    return x


_CASES = {}


def _cases() -> torch.Tensor:
    if "x" not in _CASES:
        _CASES["x"] = _adversarial(torch.Generator().manual_seed(28))
    return _CASES["x"]


def _assert_same(a: dict, b: dict, what: str) -> None:
    for key in a:
        u, v = a[key], b[key]
        if u.dtype == torch.float32:
            u, v = _bits(u), _bits(v)
        if not torch.equal(u, v):
            bad = (u != v).nonzero()[:5].flatten().tolist()
            raise AssertionError(f"{what}: {key} differs at {bad}")


def test_scalar_reference_matches_quantize_mx():
    x = _cases()
    ref_codes, ref_scales = quantize_mx(x.view(1, -1), "fp8_e4m3")
    out = mxfp8_quantizer_outputs(x, "portable")
    assert torch.equal(out["scales"], ref_scales[0])
    assert torch.equal(out["codes"], ref_codes[0]), (out["codes"] != ref_codes[0]).nonzero()[:5]
    # the E4M3 values are the codes' values (0 in NaN blocks); the planes rebuild them exactly
    finite = (ref_scales[0] != 0xFF).repeat_interleave(32)
    ev = ref_codes[0].view(torch.float8_e4m3fn).float()
    assert torch.equal(_bits(out["ev"][finite]), _bits(ev[finite])) and (out["ev"][~finite] == 0).all()
    pos = torch.tensor([(i & 16) | (i & 1) << 3 | (i & 15) >> 1 for i in range(32)])
    a = (8 * out["hi"].int() + out["lo"].int()).view(-1, 32)[:, pos].reshape(-1)
    assert torch.equal(a.double(), out["ev"].double() * 512)


@pytest.mark.parametrize("impl", [_impl_param(i) for i in VECTOR_IMPLS])
@pytest.mark.parametrize("w_log2", (0, 8))
def test_vector_quantiser_is_bit_identical_to_scalar(impl, w_log2):
    x = _cases()
    ref = mxfp8_quantizer_outputs(x, "portable", w_log2)
    _assert_same(ref, mxfp8_quantizer_outputs(x, impl, w_log2), impl)
    _assert_same(ref, mxfp8_quantizer_outputs(x, impl, w_log2, in_place=True), f"{impl} in place")
    ref_codes, ref_scales = quantize_mx(x.view(1, -1), "fp8_e4m3")
    out = mxfp8_quantizer_outputs(x, impl, w_log2)
    assert torch.equal(out["codes"], ref_codes[0]) and torch.equal(out["scales"], ref_scales[0])


@pytest.mark.parametrize("impl", [_impl_param(i) for i in VECTOR_IMPLS])
def test_vector_quantiser_under_flush_to_zero(impl):
    """With FTZ/DAZ on (torch.set_flush_denormal, this thread's MXCSR) the vector versions still
    give the scalar reference's bits (both treat denormals alike)."""
    x = _cases()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        ref = mxfp8_quantizer_outputs(x, "portable")
        out = mxfp8_quantizer_outputs(x, impl)
    finally:
        torch.set_flush_denormal(False)
    _assert_same(ref, out, f"{impl} FTZ")


def test_random_gaussian_rows():
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 2880, generator=gen) * torch.logspace(-20, 20, 64).unsqueeze(1)).reshape(-1)
    ref = mxfp8_quantizer_outputs(x, "portable")
    for impl in VECTOR_IMPLS:
        if build.isa_supported(impl):
            _assert_same(ref, mxfp8_quantizer_outputs(x, impl), impl)
    _assert_same(ref, mxfp8_quantizer_outputs(x), "default")  # the kernels' own choice


def test_unsupported_impl_is_refused():
    missing = [i for i in VECTOR_IMPLS if not build.isa_supported(i)]
    if not missing:
        pytest.skip("this CPU runs every version")
    with pytest.raises(ValueError):
        mxfp8_quantizer_outputs(torch.zeros(32), missing[0])


@pytest.mark.parametrize("bf16_mx,vnni_mx", (("0", "1"), ("1", "1"), ("0", "0")))
def test_expert_mx_path_same_bits_with_scalar_quantiser(monkeypatch, bf16_mx, vnni_mx):
    """MXFP4 on the MX path (the hidden and the intermediate quantised: planes on the integer MX
    paths, q-dq on the others), every ISA: the vector quantiser and the scalar one
    (KERNELSLOT_NATIVE_MXFP8_SCALAR=1, read per call) give the same output bits."""
    monkeypatch.setenv("KERNELSLOT_NATIVE_BF16_MX", bf16_mx)
    monkeypatch.setenv("KERNELSLOT_NATIVE_VNNI_MX", vnni_mx)
    gen = torch.Generator().manual_seed(11)
    E, H, I, K, T = 4, 96, 64, 2, 9
    gd, gs = quantize_mx(torch.randn(E, 2 * I, H, generator=gen) * 0.2, "fp4")
    dd, ds = quantize_mx(torch.randn(E, H, I, generator=gen) * 0.2, "fp4")
    prep = prepare_native_experts(ExpertWeights("mxfp4", gd, dd, gs, ds))
    x = torch.randn(T, H, generator=gen)
    x[:, 5] = 1e-4  # lo-plane elements
    x[2, 40] = float("nan")  # a NaN block in one token
    ids, wts = torch.randint(0, E, (T, K), generator=gen), torch.rand(T, K, generator=gen)
    act = ExpertActivation.swigluoai(1.702, 7.0)
    for isa in (i for i in build.ISA_NAMES if build.isa_supported(i)):
        outs = []
        for scalar in ("1", "0"):
            monkeypatch.setenv("KERNELSLOT_NATIVE_MXFP8_SCALAR", scalar)
            out = torch.zeros(T, H)
            expert_mlp_native(x, ids, wts, prep, act, True, True, out, isa=isa, num_threads=2)
            outs.append(out)
        assert torch.equal(_bits(outs[0]), _bits(outs[1])), isa
