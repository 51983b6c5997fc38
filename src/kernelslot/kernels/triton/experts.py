"""The grouped expert MLP in Triton, shared by ``moe.fused_experts`` and ``moe.block_tkg``'s leaves.

:func:`expert_mlp` writes ``out[m] = Σ_k coef[m,k]·W2[e]·act(W13[e]·x[m])`` with ``e = ids[m,k]``
(ids outside ``[0, E)``, i.e. -1, contribute nothing; ``coef`` None means 1), fp32 accumulation,
into ``out`` through its strides, rounded to ``out.dtype`` to nearest even.

Weights are a :class:`~kernelslot.kernels.experts_spec.ExpertWeights` in any of its formats
(``W13 (E, 2I, H)`` gate rows then up rows, ``W2 (E, H, I)``; module docs there): ``dense``
(fp32/bf16/fp16), ``fp8_row`` (E4M3 bytes, fp32 scale per output row, applied after the dot),
``mxfp4`` / ``mxfp8`` (E2M1 codes packed two per byte, even index low / E4M3 bytes, one E8M0 scale
per 32 along the contraction dim), ``nvfp4`` (E2M1 × unswizzled E4M3 scale per 16; the per-expert
fp32 outer scale applied after the dot); optional biases ``(E, 2I)`` and ``(E, H)``. Every tile is
decoded in registers from the stored bytes: nothing is dequantised ahead of the call.
``mx_act_quant`` (the block's MX path) rounds ``x`` and the intermediate to MXFP8 E4M3 before
each projection (:func:`._common.mxfp8_roundtrip_rows`; H and I multiples of 32).

Torch index bookkeeping and three launches, with no host synchronisation and no shape that depends
on values (graph-safe):

1. routing bookkeeping in torch index ops (:func:`sort_pairs`): the ``N = M·K`` (token, slot)
   pairs sorted by expert, each expert's run padded to ``BLOCK_M`` rows, and the expert of every
   row block (-1 for blocks past the used ones; the grid is sized for the worst case);
2. ``_gate_up_kernel``: per row block and ``BLOCK_N`` intermediate columns, ``x·W13ᵀ`` for the
   gate and up rows (``tl.dot``), biases, the gated activation, into an fp32 ``(P, I)`` scratch;
3. ``_down_kernel``: per row block and ``BLOCK_N`` hidden columns, ``act·W2ᵀ`` (+ bias) times the
   pair's coefficient, into an fp32 ``(N, H)`` scratch row per pair;
4. ``_combine_kernel``: per token, the sum over its K slots in slot order (deterministic: no
   atomics), stored into ``out``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelslot.kernels.experts_spec import ExpertActivation, ExpertWeights
from kernelslot.kernels.triton._common import (dot_precision, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32,
                                               mxfp8_roundtrip_rows, pow2, to_output)

__all__ = ["expert_mlp", "sort_pairs", "FORMATS", "ACTIVATIONS"]

BLOCK_M = 16  # (token, slot) pairs per row block: the least tl.dot row count
FORMATS = {"dense": 0, "fp8_row": 1, "mxfp4": 2, "mxfp8": 3, "nvfp4": 4}
ACTIVATIONS = {"silu": 0, "swish": 1, "swigluoai": 1, "gelu": 2, "gelu_tanh": 3}
_MX = (FORMATS["mxfp4"], FORMATS["mxfp8"])


def sort_pairs(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted_pairs (P,), block_expert (P // block_m,))`` int32 for ``ids (M, K)``, on ``ids``' device.

    Pair ``p = m·K + k``. ``sorted_pairs`` lists the valid pairs grouped by expert (ascending, each
    run in pair order, padded to a multiple of ``block_m`` with ``N = M·K``); ``block_expert[b]`` is
    the expert of rows ``[b·block_m, (b+1)·block_m)``, or -1 past the last used block. ``P`` is the
    worst case ``N + min(E, N)·(block_m - 1)`` rounded up to ``block_m``: it depends on shapes only.
    """
    n, dev = ids.numel(), ids.device
    flat = ids.reshape(-1).long()
    key = torch.where((flat >= 0) & (flat < num_experts), flat, torch.full_like(flat, num_experts))
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    run_start = torch.cumsum(counts, 0) - counts  # each expert's first position among the sorted pairs
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    rank = torch.arange(n, device=dev) - run_start[sorted_key]
    total = -(-(n + min(num_experts, n) * (block_m - 1)) // block_m) * block_m
    expert = sorted_key.clamp(max=num_experts - 1)
    slot = padded_end[expert] - padded[expert] + rank  # the pair's row in its expert's padded run
    dest = torch.where(sorted_key < num_experts, slot, torch.full_like(rank, total))
    pairs = torch.full((total + 1,), n, dtype=torch.long, device=dev).scatter_(0, dest, order)[:total]
    starts = torch.arange(0, total, block_m, device=dev)
    block = torch.searchsorted(padded_end, starts, right=True)
    block_expert = torch.where(block < num_experts, block, torch.full_like(block, -1))
    return pairs.to(torch.int32), block_expert.to(torch.int32)


@triton.jit
def _weight_tile(w_ptr, s_ptr, e, rows, ks, nrows, ncols, w_se, w_sr, w_sc, s_se, s_sr, s_sc, FORMAT: tl.constexpr):
    """fp32 ``(len(ks), len(rows))`` tile ``W[e, rows, ks]ᵀ`` decoded from ``FORMAT`` (0 outside the matrix);
    per-row (fp8_row) and per-expert (nvfp4) scales are left to the caller."""
    keep = (ks[:, None] < ncols) & (rows[None, :] < nrows)
    base = w_ptr + e * w_se + rows[None, :] * w_sr
    if FORMAT == 0:
        w = tl.load(base + ks[:, None] * w_sc, mask=keep, other=0.0).to(tl.float32)
    elif FORMAT == 1:
        w = e4m3_to_f32(tl.load(base + ks[:, None] * w_sc, mask=keep, other=0).to(tl.int32))
    elif FORMAT == 3:
        w = e4m3_to_f32(tl.load(base + ks[:, None] * w_sc, mask=keep, other=0).to(tl.int32))
        sb = tl.load(s_ptr + e * s_se + rows[None, :] * s_sr + (ks[:, None] // 32) * s_sc, mask=keep, other=127)
        w = w * e8m0_to_f32(sb.to(tl.int32))
    else:  # E2M1, two codes per byte, even index in the low nibble
        byte = tl.load(base + (ks[:, None] // 2) * w_sc, mask=keep, other=0).to(tl.int32)
        w = e2m1_to_f32((byte >> ((ks[:, None] % 2) * 4)) & 15)
        if FORMAT == 2:
            sb = tl.load(s_ptr + e * s_se + rows[None, :] * s_sr + (ks[:, None] // 32) * s_sc, mask=keep, other=127)
            w = w * e8m0_to_f32(sb.to(tl.int32))
        else:
            sb = tl.load(s_ptr + e * s_se + rows[None, :] * s_sr + (ks[:, None] // 16) * s_sc, mask=keep, other=0)
            w = w * e4m3_to_f32(sb.to(tl.int32))
    return w


@triton.jit
def _post_scale(acc, rs_ptr, outer_ptr, e, rows, nrows, rs_se, FORMAT: tl.constexpr):
    """``acc (BM, BN)`` times the fp8_row scale of each output row, or the nvfp4 outer scale of expert ``e``."""
    if FORMAT == 1:
        acc = acc * tl.load(rs_ptr + e * rs_se + rows, mask=rows < nrows, other=0.0)[None, :]
    elif FORMAT == 4:
        acc = acc * tl.load(outer_ptr + e)
    return acc


@triton.jit
def _mx_tile(t, R: tl.constexpr, C: tl.constexpr):
    """fp32 ``t (R, C)`` with each row's 32-column blocks rounded to MXFP8 (C a multiple of 32)."""
    return tl.reshape(mxfp8_roundtrip_rows(tl.reshape(t, (R * C // 32, 32))), (R, C))


@triton.jit
def _gated(g, u, alpha, up_bias, g_lo, g_hi, u_lo, u_hi, ACT: tl.constexpr, G_LO: tl.constexpr, G_HI: tl.constexpr,
           U_LO: tl.constexpr, U_HI: tl.constexpr):
    """``act(clamp(g))·(clamp(u) + up_bias)``; ACT 0 silu, 1 g·σ(α·g), 2 erf GELU, 3 tanh GELU."""
    if G_LO:
        g = tl.maximum(g, g_lo)
    if G_HI:
        g = tl.minimum(g, g_hi)
    if U_LO:
        u = tl.maximum(u, u_lo)
    if U_HI:
        u = tl.minimum(u, u_hi)
    if ACT == 0:
        a = g * tl.sigmoid(g)
    elif ACT == 1:
        a = g * tl.sigmoid(alpha * g)
    elif ACT == 2:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    else:  # 0.5·g·(1 + tanh(z)) = g·σ(2z), z = sqrt(2/π)·(g + 0.044715·g³)
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = g * tl.sigmoid(2.0 * z)
    return a * (u + up_bias)


@triton.jit
def _gate_up_kernel(x_ptr, x_s0, x_s1, pairs_ptr, block_expert_ptr, n_pairs, top_k,
                    w_ptr, w_se, w_sr, w_sc, s_ptr, s_se, s_sr, s_sc, rs_ptr, rs_se, outer_ptr, b_ptr, b_se,
                    inter_ptr, hidden, inter,
                    alpha, up_bias, g_lo, g_hi, u_lo, u_hi,
                    FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr, MX_ACT: tl.constexpr, ACT: tl.constexpr,
                    G_LO: tl.constexpr, G_HI: tl.constexpr, U_LO: tl.constexpr, U_HI: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)  # int64: e times an expert stride may pass 2^31
    if e >= 0:
        slots = pid_m * BM + tl.arange(0, BM)
        pair = tl.load(pairs_ptr + slots)
        live = pair < n_pairs
        token = (pair // top_k).to(tl.int64)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)  # intermediate columns: gate rows cols, up rows I + cols
        acc_g = tl.zeros((BM, BN), tl.float32)
        acc_u = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, hidden, BK):
            ks = k0 + tl.arange(0, BK)
            xt = tl.load(x_ptr + token[:, None] * x_s0 + ks[None, :] * x_s1,
                         mask=live[:, None] & (ks[None, :] < hidden), other=0.0).to(tl.float32)
            if MX_ACT:
                xt = _mx_tile(xt, BM, BK)
            wg = _weight_tile(w_ptr, s_ptr, e, cols, ks, inter, hidden, w_se, w_sr, w_sc, s_se, s_sr, s_sc, FORMAT)
            wu = _weight_tile(w_ptr, s_ptr, e, inter + cols, ks, 2 * inter, hidden, w_se, w_sr, w_sc, s_se, s_sr, s_sc,
                              FORMAT)
            acc_g = tl.dot(xt, wg, acc_g, input_precision=PREC)
            acc_u = tl.dot(xt, wu, acc_u, input_precision=PREC)
        acc_g = _post_scale(acc_g, rs_ptr, outer_ptr, e, cols, inter, rs_se, FORMAT)
        acc_u = _post_scale(acc_u, rs_ptr, outer_ptr, e, inter + cols, 2 * inter, rs_se, FORMAT)
        if HAS_BIAS:
            acc_g += tl.load(b_ptr + e * b_se + cols, mask=cols < inter, other=0.0).to(tl.float32)[None, :]
            acc_u += tl.load(b_ptr + e * b_se + inter + cols, mask=cols < inter, other=0.0).to(tl.float32)[None, :]
        a = _gated(acc_g, acc_u, alpha, up_bias, g_lo, g_hi, u_lo, u_hi, ACT, G_LO, G_HI, U_LO, U_HI)
        if MX_ACT:
            a = _mx_tile(a, BM, BN)
        tl.store(inter_ptr + slots.to(tl.int64)[:, None] * inter + cols[None, :], a, mask=cols[None, :] < inter)


@triton.jit
def _down_kernel(inter_ptr, pairs_ptr, block_expert_ptr, n_pairs, top_k, coef_ptr, c_s0, c_s1,
                 w_ptr, w_se, w_sr, w_sc, s_ptr, s_se, s_sr, s_sc, rs_ptr, rs_se, outer_ptr, b_ptr, b_se,
                 y_ptr, hidden, inter,
                 FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_COEF: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)  # int64: e times an expert stride may pass 2^31
    if e >= 0:
        slots = pid_m * BM + tl.arange(0, BM)
        pair = tl.load(pairs_ptr + slots)
        live = pair < n_pairs
        cols = tl.program_id(1) * BN + tl.arange(0, BN)  # hidden columns
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, inter, BK):
            ks = k0 + tl.arange(0, BK)
            at = tl.load(inter_ptr + slots.to(tl.int64)[:, None] * inter + ks[None, :],
                         mask=live[:, None] & (ks[None, :] < inter), other=0.0)
            wt = _weight_tile(w_ptr, s_ptr, e, cols, ks, hidden, inter, w_se, w_sr, w_sc, s_se, s_sr, s_sc, FORMAT)
            acc = tl.dot(at, wt, acc, input_precision=PREC)
        acc = _post_scale(acc, rs_ptr, outer_ptr, e, cols, hidden, rs_se, FORMAT)
        if HAS_BIAS:
            acc += tl.load(b_ptr + e * b_se + cols, mask=cols < hidden, other=0.0).to(tl.float32)[None, :]
        if HAS_COEF:
            acc *= tl.load(coef_ptr + (pair // top_k) * c_s0 + (pair % top_k) * c_s1, mask=live, other=0.0)[:, None]
        tl.store(y_ptr + pair.to(tl.int64)[:, None] * hidden + cols[None, :], acc,
                 mask=live[:, None] & (cols[None, :] < hidden))


@triton.jit
def _combine_kernel(y_ptr, ids_ptr, i_s0, i_s1, out_ptr, o_s0, o_s1, top_k, hidden, num_experts, BN: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    keep = cols < hidden
    acc = tl.zeros((BN,), tl.float32)
    for k in range(0, top_k):
        e = tl.load(ids_ptr + m * i_s0 + k * i_s1)
        if (e >= 0) & (e < num_experts):  # the pair's scratch row was written
            acc += tl.load(y_ptr + (m * top_k + k) * hidden + cols, mask=keep, other=0.0)
    tl.store(out_ptr + m * o_s0 + cols * o_s1, to_output(acc, out_ptr.dtype.element_ty), mask=keep)


def _matrix(weights: ExpertWeights, which: str) -> tuple:
    """Kernel arguments of one matrix: data, block scales (+ strides), row scales (+ expert stride), outer, bias."""
    data = getattr(weights, which)
    scale, outer = getattr(weights, f"{which}_scale"), getattr(weights, f"{which}_outer")
    bias = getattr(weights, f"{which}_bias")
    if data.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        data = data.view(torch.uint8)
    block = row = None
    if weights.format == "fp8_row":
        row = scale.float().reshape(scale.shape[0], -1)  # (E, rows): gate/up scales may come as (E, 2, I)
    elif scale is not None:
        block = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    block_args = (block, *block.stride()) if block is not None else (data, 0, 0, 0)
    row_args = (row, row.stride(0)) if row is not None else (data, 0)
    outer = outer.float() if outer is not None else data
    bias_args = (bias, bias.stride(0)) if bias is not None else (data, 0)
    return (data, *data.stride()), block_args, row_args, outer, bias_args


def _activation(act: ExpertActivation) -> tuple[tuple, dict]:
    (g_lo, g_hi), (u_lo, u_hi) = act.gate_clamp, act.up_clamp
    scalars = (float(act.alpha), float(act.up_bias), float(g_lo or 0.0), float(g_hi or 0.0), float(u_lo or 0.0),
               float(u_hi or 0.0))
    flags = dict(ACT=ACTIVATIONS[act.kind], G_LO=g_lo is not None, G_HI=g_hi is not None, U_LO=u_lo is not None,
                 U_HI=u_hi is not None)
    return scalars, flags


def expert_mlp(weights: ExpertWeights, x: torch.Tensor, ids: torch.Tensor, coef: torch.Tensor | None,
               act: ExpertActivation, out: torch.Tensor, mx_act_quant: bool = False) -> None:
    """Write ``Σ_k coef[m,k]·expert_{ids[m,k]}(x[m])`` into ``out (M, H)`` (module docstring); returns None.

    ``x (M, H)`` any float dtype and strides; ``ids (M, K)`` int; ``coef (M, K)`` fp32 or None (1);
    ``out`` any float dtype and strides. Dots run at :func:`._common.dot_precision` of ``out.dtype``.
    """
    m, hidden = x.shape
    top_k, inter, num_experts = ids.shape[1], weights.intermediate_size, weights.num_experts
    if tuple(ids.shape) != (m, top_k) or tuple(out.shape) != (m, weights.hidden_size) or hidden != weights.hidden_size:
        raise ValueError(f"expert_mlp: x (M, H={weights.hidden_size}), ids (M, K) and out (M, H) expected, got "
                         f"{tuple(x.shape)}, {tuple(ids.shape)} and {tuple(out.shape)}")
    if coef is not None and tuple(coef.shape) != (m, top_k):
        raise ValueError(f"expert_mlp: coef must be (M, K)={(m, top_k)}, got {tuple(coef.shape)}")
    fmt = FORMATS[weights.format]
    if mx_act_quant and (hidden % 32 or inter % 32):
        raise ValueError(f"expert_mlp: MXFP8 activations need H and I multiples of 32, got H={hidden}, I={inter}")
    if m == 0:
        return
    pairs, block_expert = sort_pairs(ids, num_experts)
    n_pairs = m * top_k
    inter_buf = torch.empty(pairs.numel(), inter, dtype=torch.float32, device=x.device)
    y = torch.empty(n_pairs, hidden, dtype=torch.float32, device=x.device)
    prec = dot_precision(out.dtype)
    scalars, flags = _activation(act)
    blocks = block_expert.numel()
    if blocks:
        (w, *w_s), (s, *s_s), (rs, rs_se), outer, (b, b_se) = _matrix(weights, "gate_up")
        bn, bk = min(pow2(inter, 32), 64), min(pow2(hidden, 32), 64)
        _gate_up_kernel[(blocks, triton.cdiv(inter, bn))](
            x, *x.stride(), pairs, block_expert, n_pairs, top_k, w, *w_s, s, *s_s, rs, rs_se, outer, b, b_se,
            inter_buf, hidden, inter, *scalars, FORMAT=fmt, HAS_BIAS=weights.gate_up_bias is not None,
            MX_ACT=mx_act_quant, **flags, BM=BLOCK_M, BN=bn, BK=bk, PREC=prec)
        (w, *w_s), (s, *s_s), (rs, rs_se), outer, (b, b_se) = _matrix(weights, "down")
        bn, bk = min(pow2(hidden, 32), 64), min(pow2(inter, 32), 64)
        c, c_s = (coef, coef.stride()) if coef is not None else (y, (0, 0))
        _down_kernel[(blocks, triton.cdiv(hidden, bn))](
            inter_buf, pairs, block_expert, n_pairs, top_k, c, *c_s, w, *w_s, s, *s_s, rs, rs_se, outer, b, b_se,
            y, hidden, inter, FORMAT=fmt, HAS_BIAS=weights.down_bias is not None, HAS_COEF=coef is not None,
            BM=BLOCK_M, BN=bn, BK=bk, PREC=prec)
    bn = min(pow2(hidden, 32), 256)
    _combine_kernel[(m, triton.cdiv(hidden, bn))](y, ids, *ids.stride(), out, *out.stride(), top_k, hidden, num_experts,
                                                 BN=bn)
