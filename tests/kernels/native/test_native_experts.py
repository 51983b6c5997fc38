"""The native CPU expert-MLP path against an independent plain-torch reference, per format ×
activation × T, on every instruction set this CPU supports; plus the MXFP8 quantiser bit for
bit against kernelslot.formats.quantize_mx."""
from __future__ import annotations

import pytest
import torch

from kernelslot.formats import (
    dequantize_mx,
    fp4_packed_to_float,
    quantize_mx,
    quantize_nvfp4_blocks,
)
from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.kernels.native import (
    expert_mlp_native,
    mxfp8_quantize_native,
    native_status,
    native_supports,
    prepare_native_experts,
    warm_thread_pool,
)
from kernelslot.kernels.native import build

AVAILABLE, BEST_ISA, REASON = native_status()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"native path unavailable: {REASON}")
ISAS = [isa for isa in build.ISA_NAMES if AVAILABLE and build.isa_supported(isa)]
FORMATS = ("f32", "bf16", "f16", "fp8_row", "mxfp8", "mxfp4", "nvfp4")
ACTS = {
    "silu": ExpertActivation("silu"),
    "swigluoai": ExpertActivation.swigluoai(1.702, 7.0),
    "swish_clamped": ExpertActivation("swish", 1.3, 0.5, (-2.0, 3.0), (-1.5, 1.0)),
    "gelu": ExpertActivation("gelu"),
    "gelu_tanh": ExpertActivation("gelu_tanh"),
}
E, H, I, K = 5, 96, 64, 3


def _make_experts(fmt: str, gen: torch.Generator, bias: bool, H: int = H,
                  I: int = I) -> tuple[ExpertWeights, torch.Tensor, torch.Tensor]:
    """(weights in ``fmt``, dense gate_up (E,2I,H), dense down (E,H,I)) — the dense tensors
    are an independent dequantisation used by the reference."""
    gu = torch.randn(E, 2 * I, H, generator=gen) * 0.2
    dn = torch.randn(E, H, I, generator=gen) * 0.2
    extra = {}
    if bias:
        extra = dict(gate_up_bias=torch.randn(E, 2 * I, generator=gen) * 0.1,
                     down_bias=torch.randn(E, H, generator=gen) * 0.1)
    if fmt in ("f32", "bf16", "f16"):
        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[fmt]
        w = ExpertWeights("dense", gu.to(dt), dn.to(dt), **extra)
        return w, gu.to(dt).float(), dn.to(dt).float()
    if fmt == "fp8_row":
        def q(x):
            s = x.abs().amax(-1) / 448.0
            return (x / s.unsqueeze(-1)).to(torch.float8_e4m3fn), s
        gq, gs = q(gu)
        dq, ds = q(dn)
        w = ExpertWeights("fp8_row", gq, dq, gs, ds, **extra)
        return w, gq.float() * gs.unsqueeze(-1), dq.float() * ds.unsqueeze(-1)
    if fmt in ("mxfp4", "mxfp8"):
        elem = "fp4" if fmt == "mxfp4" else "fp8_e4m3"
        gd, gs = quantize_mx(gu, elem)
        dd, ds = quantize_mx(dn, elem)
        w = ExpertWeights(fmt, gd, dd, gs, ds, **extra)
        return w, dequantize_mx(gd, gs, elem), dequantize_mx(dd, ds, elem)
    # nvfp4: one outer scale per expert and matrix
    go = gu.abs().amax(dim=(1, 2)) / 2688.0
    do = dn.abs().amax(dim=(1, 2)) / 2688.0
    gd, gs = quantize_nvfp4_blocks(gu, go.view(E, 1, 1))
    dd, ds = quantize_nvfp4_blocks(dn, do.view(E, 1, 1))
    w = ExpertWeights("nvfp4", gd, dd, gs, ds, go, do, **extra)

    def deq(d, s, o):
        v = fp4_packed_to_float(d).reshape(*s.shape, 16) * s.float().unsqueeze(-1)
        return v.reshape(d.shape[0], d.shape[1], -1) * o.view(-1, 1, 1)
    return w, deq(gd, gs, go), deq(dd, ds, do)


def _qdq(x: torch.Tensor) -> torch.Tensor:
    d, s = quantize_mx(x, "fp8_e4m3")
    return dequantize_mx(d, s, "fp8_e4m3")


def _act_ref(act: ExpertActivation, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    (glo, ghi), (ulo, uhi) = act.gate_clamp, act.up_clamp
    g = g.clamp(min=glo, max=ghi) if (glo is not None or ghi is not None) else g
    u = u.clamp(min=ulo, max=uhi) if (ulo is not None or uhi is not None) else u
    if act.kind == "gelu":
        a = torch.nn.functional.gelu(g)
    elif act.kind == "gelu_tanh":
        a = torch.nn.functional.gelu(g, approximate="tanh")
    else:
        alpha = 1.0 if act.kind == "silu" else act.alpha
        a = g * torch.sigmoid(alpha * g)
    return a * (u + act.up_bias)


def _reference(x, ids, wts, w: ExpertWeights, gu, dn, act, post_scale, quant):
    I = gu.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    xin = _qdq(x) if quant else x
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e < 0:
                continue
            y = gu[e] @ xin[t]
            if w.gate_up_bias is not None:
                y = y + w.gate_up_bias[e]
            a = _act_ref(act, y[:I], y[I:])
            if quant:
                a = _qdq(a.unsqueeze(0))[0]
            z = dn[e] @ a
            if w.down_bias is not None:
                z = z + w.down_bias[e]
            out[t] += (float(wts[t, k]) if post_scale else 1.0) * z.double()
    return out


def _routing(T: int, gen: torch.Generator, drop: bool = False):
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    if drop:
        ids[torch.rand(T, K, generator=gen) < 0.3] = -1
    wts = torch.rand(T, K, generator=gen) + 0.1
    return ids, wts


def _run_and_compare(fmt, act_name, T, isa, *, bias=True, post_scale=True, quant=False, drop=False,
                     threads=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w, gu, dn = _make_experts(fmt, gen, bias)
    act = ACTS[act_name]
    assert native_supports(w, act, T)
    prep = prepare_native_experts(w)
    x = torch.randn(T, H, generator=gen)
    ids, wts = _routing(T, gen, drop)
    base = torch.randn(T, H, generator=gen)
    out = base.clone()
    expert_mlp_native(x, ids, wts, prep, act, post_scale, quant, out, num_threads=threads, isa=isa)
    ref = _reference(x, ids, wts, w, gu, dn, act, post_scale, quant) + base.double()
    err = (out.double() - ref).abs()
    scale = ref.abs().max().item()
    if quant:  # one E4M3 rounding flip in the intermediate moves a few outputs slightly
        rel = (err.norm() / ref.norm()).item()
        assert rel < 2e-3, f"{fmt}/{act_name}/T={T}/{isa}: relative norm error {rel:.2e}"
    else:
        bad = err > 2e-5 * scale + 1e-5 * ref.abs()
        assert not bad.any(), f"{fmt}/{act_name}/T={T}/{isa}: max err {err.max():.3e} (scale {scale:.3e})"
    return out


@pytest.mark.parametrize("T", [1, 3, 8])
@pytest.mark.parametrize("act_name", list(ACTS))
@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_activations_default_isa(fmt, act_name, T):
    _run_and_compare(fmt, act_name, T, BEST_ISA)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_isa(fmt, isa):
    for T in (1, 8):
        _run_and_compare(fmt, "swigluoai", T, isa, seed=T)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", ("bf16", "mxfp4", "nvfp4", "mxfp8"))
def test_mxfp8_activation_quantisation(fmt, isa):
    for T in (1, 3, 8):
        _run_and_compare(fmt, "swigluoai", T, isa, quant=True, seed=T)


@pytest.mark.parametrize("fmt", ("mxfp4", "bf16"))
def test_no_scale_dropped_ids_no_bias(fmt):
    _run_and_compare(fmt, "silu", 8, BEST_ISA, bias=False, post_scale=False, drop=True)


def test_threads_give_identical_bits_and_many_tokens_per_expert():
    """All 20 tokens on the same two experts exercises token chunking; thread splits only
    partition rows, so every thread count gives the same bits."""
    gen = torch.Generator().manual_seed(3)
    w, *_ = _make_experts("nvfp4", gen, True)
    prep = prepare_native_experts(w)
    x = torch.randn(20, H, generator=gen)
    ids = torch.tensor([[1, 3, -1]] * 20)
    wts = torch.rand(20, K, generator=gen)
    outs = []
    for nth in (1, 2, 3):
        out = torch.zeros(20, H)
        expert_mlp_native(x, ids, wts, prep, ACTS["swigluoai"], True, True, out, num_threads=nth)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    _run_and_compare("nvfp4", "swigluoai", 20, BEST_ISA, quant=True, seed=3)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_bits_identical_for_any_thread_count(fmt, isa):
    """Every kernel path (fused decode for few tokens, decode-once-and-reuse for many, token
    chunks) gives the same bits whatever the thread count: threads only partition rows."""
    gen = torch.Generator().manual_seed(11)
    w, *_ = _make_experts(fmt, gen, True)
    prep = prepare_native_experts(w)
    T = 24
    x = torch.randn(T, H, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    ids[:9, 0] = 2                      # expert 2 gets >= 9 tokens: the reuse path
    ids[:9, 1] = torch.where(ids[:9, 1] == 2, 0, ids[:9, 1])
    ids[:9, 2] = torch.where(ids[:9, 2] == 2, 1, ids[:9, 2])
    ids[9:, :] = torch.where(ids[9:, :] == 2, -1, ids[9:, :])
    wts = torch.rand(T, K, generator=gen)
    for quant in (False, True):
        outs = []
        for nth in (1, 2, 3, 5):
            out = torch.zeros(T, H)
            expert_mlp_native(x, ids, wts, prep, ACTS["swigluoai"], True, quant, out, num_threads=nth, isa=isa)
            outs.append(out)
        assert all(torch.equal(outs[0], o) for o in outs[1:]), (fmt, isa, quant)


def test_a_warmed_pool_gives_the_same_bits():
    """warm_thread_pool runs an empty phase on the pool (benchmarks call it untimed): calls after
    it, with more, fewer or the same threads, give the bits of a call on a cold pool."""
    gen = torch.Generator().manual_seed(13)
    w, *_ = _make_experts("mxfp4", gen, True)
    prep = prepare_native_experts(w)
    x = torch.randn(3, H, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(3)])
    wts = torch.rand(3, K, generator=gen)
    ref = torch.zeros(3, H)
    expert_mlp_native(x, ids, wts, prep, ACTS["silu"], True, True, ref, num_threads=1)
    for warm, nth in ((4, 2), (2, 4), (3, 3), (1, 2)):
        warm_thread_pool(warm)
        out = torch.zeros(3, H)
        expert_mlp_native(x, ids, wts, prep, ACTS["silu"], True, True, out, num_threads=nth)
        assert torch.equal(out, ref), (warm, nth)


def test_repeated_ids_beyond_one_group():
    """An id repeated within rows can give one expert more pairs than one kernel group holds."""
    gen = torch.Generator().manual_seed(12)
    w, gu, dn = _make_experts("mxfp4", gen, True)
    prep = prepare_native_experts(w)
    T = 40
    x = torch.randn(T, H, generator=gen)
    ids = torch.full((T, K), 3)
    wts = torch.rand(T, K, generator=gen)
    out = torch.zeros(T, H)
    expert_mlp_native(x, ids, wts, prep, ACTS["silu"], True, False, out)
    ref = _reference(x, ids, wts, w, gu, dn, ACTS["silu"], True, False)
    assert ((out.double() - ref).abs() <= 2e-5 * ref.abs().max() + 1e-5 * ref.abs()).all()


def test_concurrent_callers_share_the_pool_safely():
    import threading
    gen = torch.Generator().manual_seed(13)
    w, *_ = _make_experts("nvfp4", gen, True)
    prep = prepare_native_experts(w)
    x = torch.randn(6, H, generator=gen)
    ids, wts = _routing(6, gen)
    want = torch.zeros(6, H)
    expert_mlp_native(x, ids, wts, prep, ACTS["silu"], True, False, want, num_threads=2)
    bad = []

    def worker():
        for _ in range(20):
            out = torch.zeros(6, H)
            expert_mlp_native(x, ids, wts, prep, ACTS["silu"], True, False, out, num_threads=2)
            if not torch.equal(out, want):
                bad.append(1)
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_all_ids_dropped_leaves_out_unchanged():
    gen = torch.Generator().manual_seed(4)
    w, *_ = _make_experts("bf16", gen, True)
    prep = prepare_native_experts(w)
    out = torch.randn(2, H, generator=gen)
    before = out.clone()
    expert_mlp_native(torch.randn(2, H), torch.full((2, K), -1), torch.ones(2, K), prep,
                      ACTS["silu"], True, False, out)
    assert torch.equal(out, before)


def test_bad_input_is_rejected_clearly():
    gen = torch.Generator().manual_seed(5)
    w, *_ = _make_experts("mxfp4", gen, False)
    prep = prepare_native_experts(w)
    x, out = torch.randn(2, H), torch.zeros(2, H)
    with pytest.raises(ValueError, match="out of range"):
        expert_mlp_native(x, torch.tensor([[0, E, 1], [0, 1, 2]]), torch.ones(2, K), prep,
                          ACTS["silu"], True, False, out)
    with pytest.raises(ValueError, match="contiguous"):
        expert_mlp_native(x, torch.zeros(2, K, dtype=torch.long), torch.ones(2, K), prep,
                          ACTS["silu"], True, False, torch.zeros(H, 2).t())
    with pytest.raises(ValueError, match="isa"):
        expert_mlp_native(x, torch.zeros(2, K, dtype=torch.long), torch.ones(2, K), prep,
                          ACTS["silu"], True, False, out, isa="sse9")


def test_supports_domain():
    gen = torch.Generator().manual_seed(6)
    w, *_ = _make_experts("mxfp4", gen, False)
    act = ACTS["silu"]
    assert native_supports(w, act, 1) and native_supports(w, act, 64)
    assert not native_supports(w, act, 0) and not native_supports(w, act, 65)
    odd = ExpertWeights("dense", torch.zeros(2, 2 * 48, 40), torch.zeros(2, 40, 48))
    assert not native_supports(odd, act, 1)
    with pytest.raises(ValueError, match="multiples of 32"):
        prepare_native_experts(odd)
    f64 = ExpertWeights("dense", torch.zeros(2, 64, 32, dtype=torch.float64), torch.zeros(2, 32, 32, dtype=torch.float64))
    assert not native_supports(f64, act, 1)


def test_prepare_leaves_weights_unchanged():
    gen = torch.Generator().manual_seed(7)
    w, *_ = _make_experts("nvfp4", gen, True)
    snap = [t.clone() for t in (w.gate_up, w.down, w.gate_up_scale.view(torch.uint8), w.down_scale.view(torch.uint8))]
    prepare_native_experts(w)
    now = (w.gate_up, w.down, w.gate_up_scale.view(torch.uint8), w.down_scale.view(torch.uint8))
    assert all(torch.equal(a, b) for a, b in zip(snap, now))


def test_mxfp8_quantiser_is_bit_exact():
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(64, 256, generator=gen) * torch.logspace(-30, 30, 64).unsqueeze(1)
    x[0, :32] = 0.0                       # amax 0 -> scale byte 0
    x[1, :32] = -0.0
    x[2, :32] = 1e-40                     # subnormal amax
    x[3, :] = torch.randn(256, generator=gen) * 1e-3
    x[3, 5] = 448.0 * 2 ** 10             # saturation neighbourhood
    x[4, :32] = torch.arange(32) * 0.0625 + 0.03125  # E4M3 ties
    x[5, :32] = torch.tensor([1e38, -3e38] + [1.0] * 30)
    e4m3_grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    pos = e4m3_grid[:127].sort().values            # 0 .. 448, finite, positive
    x[6, :127] = pos * 1.0001
    x[6, 128:255] = -pos
    ties = (pos[:-1] + pos[1:]) / 2                  # exact midpoints: round-half-even cases
    for b in range(4):                               # blocks holding 448 keep scale 2^0
        x[7, 32 * b] = 448.0
        x[7, 32 * b + 1: 32 * b + 32] = ties[31 * b: 31 * b + 31]
    codes, scales = mxfp8_quantize_native(x)
    ref_codes, ref_scales = quantize_mx(x, "fp8_e4m3")
    assert torch.equal(scales, ref_scales)
    assert torch.equal(codes, ref_codes), (codes != ref_codes).nonzero()[:5]


@pytest.mark.skipif("avx512bf16" not in ISAS or "avx512" not in ISAS, reason="needs AVX512-BF16 (this CPU lacks it)")
@pytest.mark.parametrize("forced", ("1", "0"))
def test_bf16_mx_path_matches_fp32_path(monkeypatch, forced):
    """On the MX path (MXFP4 weights, MXFP8 activations) the bf16 MX path of avx512bf16
    (KERNELSLOT_NATIVE_BF16_MX=1; the default on AMD) multiplies exactly in bf16: only the fp32
    summation order differs from the avx512 fp32 kernels, and its bits do not depend on the
    thread count; with it off (the default on Intel) avx512bf16 runs the fp32 kernels: same bits."""
    monkeypatch.setenv("KERNELSLOT_NATIVE_BF16_MX", forced)
    gen = torch.Generator().manual_seed(9)
    w, *_ = _make_experts("mxfp4", gen, True)
    prep = prepare_native_experts(w)
    x = torch.randn(7, H, generator=gen)
    ids, wts = _routing(7, gen, drop=True)
    outs = {}
    for isa, threads in (("avx512", 2), ("avx512bf16", 2), ("avx512bf16", 3)):
        outs[isa, threads] = torch.zeros(7, H)
        expert_mlp_native(x, ids, wts, prep, ACTS["swigluoai"], True, True, outs[isa, threads], isa=isa,
                          num_threads=threads)
    fp32, bf16 = outs["avx512", 2], outs["avx512bf16", 2]
    assert torch.equal(bf16, outs["avx512bf16", 3])
    if forced == "0":
        assert torch.equal(bf16, fp32)
    else:  # (sums of these few-bit products are often exact in fp32: the bits may agree too)
        assert ((fp32 - bf16).norm() / fp32.norm()).item() < 1e-4


def _isa_outputs(w: ExpertWeights, x, ids, wts, quant: bool) -> dict[str, torch.Tensor]:
    prep = prepare_native_experts(w)
    outs = {}
    for isa in ISAS:
        outs[isa] = torch.zeros(x.shape)
        expert_mlp_native(x, ids, wts, prep, ACTS["swigluoai"], True, quant, outs[isa], isa=isa)
    return outs


def _random_code_experts(fmt: str, gen: torch.Generator, subnormals: bool,
                         H: int = H) -> tuple[ExpertWeights, torch.Tensor, torch.Tensor]:
    """FP8 experts from uniformly random finite E4M3 codes (zeros, both signs; subnormal codes
    only if ``subnormals``), with their exact dequantisation (gate_up, down) for the reference."""
    def codes(*shape):
        u = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)
        u = torch.where((u & 0x7F) == 0x7F, u ^ 0x01, u)             # no NaN
        if not subnormals:                                            # exponent 0, mantissa != 0 -> exponent 1
            u = torch.where(((u & 0x78) == 0) & ((u & 0x07) != 0), u | 0x08, u)
        return u.view(torch.float8_e4m3fn)
    gq, dq = codes(E, 2 * I, H), codes(E, H, I)
    if fmt == "fp8_row":
        gs, ds = torch.rand(E, 2 * I, generator=gen) * 1e-3, torch.rand(E, H, generator=gen) * 1e-3
        w = ExpertWeights("fp8_row", gq, dq, gs, ds)
        return w, gq.float() * gs.unsqueeze(-1), dq.float() * ds.unsqueeze(-1)
    gs = torch.randint(112, 122, (E, 2 * I, H // 32), generator=gen, dtype=torch.int32).to(torch.uint8)
    ds = torch.randint(112, 122, (E, H, I // 32), generator=gen, dtype=torch.int32).to(torch.uint8)
    w = ExpertWeights("mxfp8", gq, dq, gs, ds)
    return w, dequantize_mx(gq, gs, "fp8_e4m3"), dequantize_mx(dq, ds, "fp8_e4m3")


@pytest.mark.skipif("avx2" not in ISAS, reason="needs AVX2")
@pytest.mark.parametrize("subnormals", (True, False))
@pytest.mark.parametrize("fmt", ("mxfp8", "fp8_row"))
def test_avx2_fp8_decode_is_exact_for_every_code_and_activation_scale(fmt, subnormals):
    """AVX2 decodes E4M3 to value·2^-120 (subnormal codes to fp32 denormals) and scales each
    activation row by a power of two chosen from its largest element: every code, and rows from
    2^-40 to 2^40, give the portable kernel's (and the float64 reference's) numbers up to fp32
    summation order, on the fused (T <= 2) and the decode-once (T > 2) paths."""
    gen = torch.Generator().manual_seed(5)
    w, gu, dn = _random_code_experts(fmt, gen, subnormals)
    prep = prepare_native_experts(w)
    act = ExpertActivation("gelu")
    row_scale = torch.tensor([2.0 ** -40, 1.0, 2.0 ** 40, 2.0 ** -20, 3.0, 2.0 ** 20])
    for quant in ((False, True) if fmt == "mxfp8" else (False,)):
        for T in (1, 2, 6):
            x = torch.randn(T, H, generator=gen) * row_scale[:T].unsqueeze(1)
            x[0, 7] *= 2.0 ** -30                      # an element far below its row's largest
            ids, wts = torch.tensor([[0, 2, 4]] * T), torch.ones(T, K)
            outs = {}
            for isa in ("portable", "avx2"):
                outs[isa] = torch.zeros(T, H)
                expert_mlp_native(x, ids, wts, prep, act, True, quant, outs[isa], isa=isa)
            ref = _reference(x, ids, wts, w, gu, dn, act, True, quant)
            for t in range(T):  # per row: the rows differ by up to 2^80 in magnitude
                a, p, r = outs["avx2"][t].double(), outs["portable"][t].double(), ref[t]
                assert r.norm() > 0 and torch.isfinite(a).all()
                assert ((a - p).norm() / p.norm()).item() < 1e-5, (fmt, quant, T, t)
                assert ((a - r).norm() / r.norm()).item() < (2e-3 if quant else 1e-5), (fmt, quant, T, t)


@pytest.mark.skipif("avx2" not in ISAS, reason="needs AVX2")
@pytest.mark.parametrize("fmt", ("mxfp8", "fp8_row"))
def test_avx2_fp8_fused_token_bits_do_not_depend_on_its_partner(fmt):
    """The fused AVX2 FP8 kernel (<= 2 tokens per expert) sums each token in the same order
    alone or beside another token, and each token's activation scale is its own: same bits."""
    gen = torch.Generator().manual_seed(6)
    w, *_ = _make_experts(fmt, gen, True)
    prep = prepare_native_experts(w)
    x = torch.randn(2, H, generator=gen)
    x[1] *= 2.0 ** 30
    ids, wts = torch.tensor([[1, 3, 4]] * 2), torch.rand(2, K, generator=gen)
    both = torch.zeros(2, H)
    expert_mlp_native(x, ids, wts, prep, ACTS["swigluoai"], True, True, both, isa="avx2")
    for t in range(2):
        alone = torch.zeros(1, H)
        expert_mlp_native(x[t:t + 1], ids[t:t + 1], wts[t:t + 1], prep, ACTS["swigluoai"], True, True, alone, isa="avx2")
        assert torch.equal(alone[0], both[t])


@pytest.mark.parametrize("fmt", ("fp8_row", "mxfp8", "nvfp4", "bf16", "f16"))
def test_decode_once_over_several_chunks(fmt):
    """Decode-once runs over chunks of 8 contraction blocks: H = 320 and I = 288 (10 and 9
    blocks) give a full chunk and a partial one; 7 tokens on two experts, every ISA (the
    FP8, FP4 and generic chunk decoders; MX path for MXFP8; AVX2 bf16 runs fused passes
    instead, f16 keeps the generic decoder covered there)."""
    h, i = 320, 288
    gen = torch.Generator().manual_seed(21)
    w, gu, dn = _make_experts(fmt, gen, True, h, i)
    prep = prepare_native_experts(w)
    x = torch.randn(7, h, generator=gen)
    ids, wts = torch.tensor([[1, 3, -1]] * 7), torch.rand(7, K, generator=gen)
    for isa in ISAS:
        for quant in ((False, True) if fmt == "mxfp8" else (False,)):
            out = torch.zeros(7, h)
            expert_mlp_native(x, ids, wts, prep, ACTS["silu"], True, quant, out, isa=isa)
            ref = _reference(x, ids, wts, w, gu, dn, ACTS["silu"], True, quant)
            rel = ((out.double() - ref).norm() / ref.norm()).item()
            assert rel < (2e-3 if quant else 1e-5), (fmt, isa, quant, rel)


@pytest.mark.skipif("avx2" not in ISAS, reason="needs AVX2")
def test_avx2_bf16_token_bits_do_not_depend_on_the_batch():
    """AVX2 bf16 sums each (row, token) in one order whether the token runs alone or in a
    fused pass of 2 (and, were a group sent to decode-once, in its chunked dot): a token gives
    the same bits alone, beside one other, or in a group of 9 on the same experts."""
    gen = torch.Generator().manual_seed(8)
    w, *_ = _make_experts("bf16", gen, True)
    prep = prepare_native_experts(w)
    x = torch.randn(9, H, generator=gen)
    ids, wts = torch.tensor([[1, 3, 4]] * 9), torch.rand(9, K, generator=gen)
    group = torch.zeros(9, H)
    expert_mlp_native(x, ids, wts, prep, ACTS["swigluoai"], True, False, group, isa="avx2")
    for lo, hi in ((0, 1), (4, 5), (8, 9), (2, 4)):
        part = torch.zeros(hi - lo, H)
        expert_mlp_native(x[lo:hi], ids[lo:hi], wts[lo:hi], prep, ACTS["swigluoai"], True, False, part, isa="avx2")
        assert torch.equal(part, group[lo:hi]), (lo, hi)


@pytest.mark.skipif("avx512" not in ISAS, reason="needs AVX-512 F/BW/VL/DQ (this CPU lacks it)")
@pytest.mark.parametrize("fmt", ("f32", "bf16", "f16", "mxfp4", "nvfp4"))
def test_avx512_token_bits_do_not_depend_on_the_batch(fmt):
    """On AVX-512 every format but FP8 runs fused passes of up to 5 tokens for any group size, each
    (row, token) summed in one order: a token gives the same bits alone, beside one other, or in a
    group of 12 on the same experts (fp32 activations; the MX path of MXFP4 has its own tests; the
    avx512 and avx512bf16 variants share these kernels, so the best one runs)."""
    isa = "avx512bf16" if "avx512bf16" in ISAS else "avx512"
    gen = torch.Generator().manual_seed(8)
    w, *_ = _make_experts(fmt, gen, True)
    prep = prepare_native_experts(w)
    x = torch.randn(12, H, generator=gen)
    ids, wts = torch.tensor([[1, 3, 4]] * 12), torch.rand(12, K, generator=gen)
    group = torch.zeros(12, H)
    expert_mlp_native(x, ids, wts, prep, ACTS["swigluoai"], True, False, group, isa=isa)
    for lo, hi in ((0, 1), (5, 6), (11, 12), (2, 4), (3, 9)):
        part = torch.zeros(hi - lo, H)
        expert_mlp_native(x[lo:hi], ids[lo:hi], wts[lo:hi], prep, ACTS["swigluoai"], True, False, part, isa=isa)
        assert torch.equal(part, group[lo:hi]), (fmt, isa, lo, hi)


@pytest.mark.skipif("avx2" not in ISAS, reason="needs AVX2")
def test_avx2_integer_mx_path_is_exact_and_independent_of_batch():
    """MXFP4 on the MX path (AVX2): exact int16 activation planes x E2M1 integers, including
    activations whose E4M3 value needs the lo plane (|r| < 2^-3 of its block scale); the same
    token gives the same bits alone, fused with one other token, or in a decode-once batch."""
    gen = torch.Generator().manual_seed(9)
    w, *_ = _make_experts("mxfp4", gen, True)
    x = torch.randn(9, H, generator=gen)
    x[:, 5] = 1e-4  # a tiny element in a block: its E4M3 value has bits below 2^-6
    ids = torch.tensor([[1, 3, 4]] * 9)
    wts = torch.rand(9, K, generator=gen)
    outs = _isa_outputs(w, x, ids, wts, quant=True)
    ref = outs["portable"]
    assert ((outs["avx2"] - ref).norm() / ref.norm()).item() < 1e-6
    prep = prepare_native_experts(w)
    for T in (1, 2):
        alone = torch.zeros(T, H)
        expert_mlp_native(x[:T], ids[:T], wts[:T], prep, ACTS["swigluoai"], True, True, alone, isa="avx2")
        assert torch.equal(alone, outs["avx2"][:T])


AVX512_ISAS = [isa for isa in ("avx512", "avx512bf16") if isa in ISAS]
VNNI_ISAS = AVX512_ISAS if AVAILABLE and build.vnni_supported() else []


@pytest.mark.skipif(not VNNI_ISAS, reason="needs AVX-512 F/BW/VL/DQ with AVX512_VNNI (this CPU lacks it)")
@pytest.mark.parametrize("h,i", ((96, 64), (1088, 160)))
def test_avx512_vnni_mx_path_is_exact_and_independent_of_batch(monkeypatch, h, i):
    """MXFP4 on the MX path with AVX512_VNNI (16 rows per kernel, lane = row): exact int16
    planes x E2M1 integers, including lo-plane blocks (tiny activations, and the SwiGLU
    intermediate's); the portable kernel's numbers up to fp32 summation order; a token gives the
    same bits alone, with one other (fused), or in decode-once groups of 3, 5, 9 and 17, with 1
    and 2 threads; both AVX-512 variants the same bits.  H = 96: a down item of 8 tiles (two
    16-row groups); H = 1088: 34 blocks, two full chunks of 16 and a partial one."""
    monkeypatch.setenv("KERNELSLOT_NATIVE_BF16_MX", "0")  # avx512bf16 on AMD would take the bf16 MX path
    monkeypatch.setenv("KERNELSLOT_NATIVE_VNNI_MX", "1")
    gen = torch.Generator().manual_seed(9)
    w, gu, dn = _make_experts("mxfp4", gen, True, h, i)
    prep = prepare_native_experts(w)
    x = torch.randn(17, h, generator=gen)
    x[:, 5] = 1e-4  # a tiny element in a block: its E4M3 value has bits below 2^-6 (the lo plane)
    ids, wts = torch.tensor([[1, 3, 4]] * 17), torch.rand(17, K, generator=gen)

    def run(isa, T, threads, vnni="1"):
        monkeypatch.setenv("KERNELSLOT_NATIVE_VNNI_MX", vnni)
        out = torch.zeros(T, h)
        expert_mlp_native(x[:T], ids[:T], wts[:T], prep, ACTS["swigluoai"], True, True, out, isa=isa,
                          num_threads=threads)
        return out
    ref = run("portable", 17, 2).double()
    full = {isa: run(isa, 17, 2) for isa in VNNI_ISAS}
    for isa in VNNI_ISAS:
        assert ((full[isa].double() - ref).norm() / ref.norm()).item() < 1e-6, isa
        fp32 = run(isa, 17, 2, vnni="0").double()  # the fp32 kernels: another summation order only
        assert ((fp32 - ref).norm() / ref.norm()).item() < 1e-6, isa
        for T in (1, 2, 3, 5, 9):
            for threads in (1, 2):
                assert torch.equal(run(isa, T, threads), full[isa][:T]), (isa, T, threads)
    assert all(torch.equal(full[VNNI_ISAS[0]], o) for o in full.values())


@pytest.mark.skipif("avx512bf16" not in ISAS or not build.vbmi_supported(),
                    reason="needs AVX512-BF16 and AVX512_VBMI (this CPU lacks them)")
@pytest.mark.parametrize("h", (96, 1088))
def test_bf16_mx_path_mxfp8_is_exact_and_independent_of_batch(monkeypatch, h):
    """MXFP8 weights on the MX path through the bf16 MX path (KERNELSLOT_NATIVE_BF16_MX=1, the
    default on AMD): every E4M3 code (subnormals included) and every MXFP8 activation multiply
    exactly in vdpbf16ps, so the numbers are the portable kernel's up to fp32 summation order, and
    a token gets the same bits alone or in groups of 2, 3, 5, 6 (two passes) and 11, with 1, 2 and
    3 threads; off, avx512bf16 gives avx512's bits (the switch is seen to act)."""
    monkeypatch.setenv("KERNELSLOT_NATIVE_BF16_MX", "1")
    gen = torch.Generator().manual_seed(19)
    w, gu, dn = _random_code_experts("mxfp8", gen, True, h)
    prep = prepare_native_experts(w)
    x = torch.randn(11, h, generator=gen)
    x[:, 5] = 1e-4  # a small activation in a block
    ids, wts = torch.tensor([[0, 2, 4]] * 11), torch.rand(11, K, generator=gen)

    def run(isa, T, threads=2):
        out = torch.zeros(T, h)
        expert_mlp_native(x[:T], ids[:T], wts[:T], prep, ACTS["swigluoai"], True, True, out, isa=isa,
                          num_threads=threads)
        return out
    full = run("avx512bf16", 11)
    p = run("portable", 11).double()
    assert ((full.double() - p).norm() / p.norm()).item() < 1e-5
    for T in (1, 2, 3, 5, 6, 11):
        for threads in (1, 2, 3):
            assert torch.equal(run("avx512bf16", T, threads), full[:T]), (T, threads)
    monkeypatch.setenv("KERNELSLOT_NATIVE_BF16_MX", "0")
    assert not torch.equal(run("avx512bf16", 11), full)
    assert torch.equal(run("avx512bf16", 11), run("avx512", 11))


@pytest.mark.skipif(not AVX512_ISAS, reason="needs AVX-512 F/BW/VL/DQ (this CPU lacks it)")
@pytest.mark.parametrize("rebias", ("0", "1"))
@pytest.mark.parametrize("subnormals", (True, False))
@pytest.mark.parametrize("fmt", ("mxfp8", "fp8_row"))
def test_avx512_fp8_decode_is_exact_for_every_code(monkeypatch, fmt, subnormals, rebias):
    """AVX-512 decodes E4M3 through fp16 (value·2^-8; subnormal codes become fp16 subnormals,
    which vcvtph2ps makes normal fp32), or, with KERNELSLOT_NATIVE_FP8_REBIAS=1 (the default on
    AMD), runs groups of <= 2 tokens through the AVX2 fused kernel's exponent rebias: every code,
    fused (T <= 5) and decode-once (T > 5), gives the portable kernel's numbers up to fp32
    summation order and the float64 reference's."""
    monkeypatch.setenv("KERNELSLOT_NATIVE_FP8_REBIAS", rebias)
    gen = torch.Generator().manual_seed(15)
    w, gu, dn = _random_code_experts(fmt, gen, subnormals)
    prep = prepare_native_experts(w)
    act = ExpertActivation("gelu")
    for quant in ((False, True) if fmt == "mxfp8" else (False,)):
        for T in (1, 2, 7):
            x = torch.randn(T, H, generator=gen)
            ids, wts = torch.tensor([[0, 2, 4]] * T), torch.ones(T, K)
            outs = {}
            for isa in ("portable", *AVX512_ISAS):
                outs[isa] = torch.zeros(T, H)
                expert_mlp_native(x, ids, wts, prep, act, True, quant, outs[isa], isa=isa)
            ref = _reference(x, ids, wts, w, gu, dn, act, True, quant)
            p = outs["portable"].double()
            for isa in AVX512_ISAS:
                a = outs[isa].double()
                assert torch.isfinite(a).all()
                assert ((a - p).norm() / p.norm()).item() < 1e-5, (fmt, isa, quant, T)
                assert ((a - ref).norm() / ref.norm()).item() < (2e-3 if quant else 1e-5), (fmt, isa, quant, T)


@pytest.mark.skipif(not AVX512_ISAS or "avx2" not in ISAS, reason="needs AVX-512 F/BW/VL/DQ and AVX2 (this CPU lacks them)")
@pytest.mark.parametrize("fmt", ("mxfp8", "fp8_row"))
def test_avx512_fp8_rebias_runs_the_avx2_fused_kernel_for_two_tokens_or_fewer(monkeypatch, fmt):
    """With KERNELSLOT_NATIVE_FP8_REBIAS=1 an AVX-512 call on <= 2 tokens per expert gives the
    AVX2 call's bits (the same kernel on the same activation layout); with 0 it does not (its own
    fp16 decode, another summation order), so the switch is seen to act."""
    gen = torch.Generator().manual_seed(17)
    w, *_ = _make_experts(fmt, gen, True)
    prep = prepare_native_experts(w)
    x = torch.randn(2, H, generator=gen)
    ids, wts = _routing(2, gen)  # each expert gets one or two tokens

    def run(isa):
        out = torch.zeros(2, H)
        expert_mlp_native(x, ids, wts, prep, ACTS["swigluoai"], True, fmt == "mxfp8", out, isa=isa)
        return out

    monkeypatch.setenv("KERNELSLOT_NATIVE_BF16_MX", "0")  # avx512bf16 on AMD would run MXFP8 on the bf16 MX path
    monkeypatch.setenv("KERNELSLOT_NATIVE_FP8_REBIAS", "1")
    avx2 = run("avx2")
    assert all(torch.equal(run(isa), avx2) for isa in AVX512_ISAS)
    monkeypatch.setenv("KERNELSLOT_NATIVE_FP8_REBIAS", "0")
    assert not any(torch.equal(run(isa), avx2) for isa in AVX512_ISAS)


@pytest.mark.slow
@pytest.mark.skipif(not AVX512_ISAS, reason="needs AVX-512 F/BW/VL/DQ (this CPU lacks it)")
def test_avx512_fp8_subnormal_codes_cost_no_assist():
    """Random E4M3 codes (1/16 subnormal) cost about what codes without subnormals do on
    AVX-512: the fp32 bit trick made them fp32 denormals, 20x slower on Intel (microcode
    assists; docs/native.md).  Thread CPU time, minimum of 15 calls, one hot expert."""
    import time
    n = 1024
    gen = torch.Generator().manual_seed(16)
    times = {}
    for subnormals in (True, False):
        u = torch.randint(0, 256, (1, 2 * n, n), generator=gen, dtype=torch.int32).to(torch.uint8)
        d = torch.randint(0, 256, (1, n, n), generator=gen, dtype=torch.int32).to(torch.uint8)
        if not subnormals:
            u = torch.where((u & 0x78) == 0, u | 0x08, u)
            d = torch.where((d & 0x78) == 0, d | 0x08, d)
        w = ExpertWeights("mxfp8", u, d, torch.full((1, 2 * n, n // 32), 118, dtype=torch.uint8),
                          torch.full((1, n, n // 32), 118, dtype=torch.uint8))
        prep = prepare_native_experts(w)
        x, out = torch.randn(1, n, generator=gen), torch.zeros(1, n)
        ids, wts = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 1)
        ts = []
        for _ in range(15):
            t = time.thread_time()
            expert_mlp_native(x, ids, wts, prep, ACTS["silu"], True, True, out, num_threads=1, isa=AVX512_ISAS[-1])
            ts.append(time.thread_time() - t)
        times[subnormals] = min(ts)
    assert times[True] < 3 * times[False], times
