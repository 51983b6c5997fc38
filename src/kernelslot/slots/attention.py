"""attention.* dense and sparse-decode slots: ``attention.sdpa`` and ``attention.decode``.

- ``attention.sdpa``: ``entry(q, k, v, out, sm_scale, causal)``; q ``(T, Hq, D)``, k/v
  ``(S, Hkv, D)``, out ``(T, Hq, D)``; query head ``h`` uses kv head ``h // (Hq/Hkv)``; with
  ``causal`` query ``i`` sees keys ``j <= i + (S - T)`` (bottom-right aligned).
- ``attention.decode``: ``entry(q, k_cache, v_cache, req_to_token, seq_lens, req_pool_indices,
  topk_idx, out, sm_scale, block_size)``; paged caches ``(max_slots, Hkv, D)``; request ``b``'s
  token ``t`` lives in slot ``req_to_token[req_pool_indices[b], t]`` (req_to_token int32
  ``(pool, kv_len)``, seq_lens int32 ``(B,)``, req_pool_indices int64 ``(B,)``); ``topk_idx``
  int32 ``(Hkv, B, Kb)``: the attended tokens are the union of the valid ids' blocks restricted to
  ``t < seq_lens[b]``; -1 is excluded, a repeated id counts once, an empty set gives ``out = 0``.
- Comparator: matched_ratio >= 0.99 at the default tolerances of the output dtype; a profile whose
  q and k are ``scale`` times unit scale raises the float32 one to ``1e-5·scale²`` (its logits, and
  a float32 kernel's rounding, grow as ``scale²``).

The references are independent of :mod:`kernelslot.kernels.attention`: fp64, explicit GQA
expansion, and (decode) a Python loop over requests and kv heads building each token set.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from kernelslot.abi.comparators import default_tol
from kernelslot.abi import Arg, CallDescriptor, MatchedRatio, OutputSpec, Role, Slot, SlotKind
from kernelslot.kernels import attention as builtin
from kernelslot.slots.base import (Candidate, Case, Kernel, NearMiss, Pick, Profile, SlotDef, Traffic, cycled,
                                   multiple_of, nbytes, output_traffic, randn)
from kernelslot.slots.triton_variants import superseded_by, triton_variant

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ADVERSARIAL = frozenset({"adversarial"})

SDPA = Slot(
    "attention.sdpa",
    SlotKind.BLOCK,
    (Arg("q", Role.INPUT), Arg("k", Role.INPUT), Arg("v", Role.INPUT), Arg("out", Role.OUTPUT),
     Arg("sm_scale", Role.SCALAR), Arg("causal", Role.SCALAR)),
    summary="softmax(sm_scale·q·kᵀ [bottom-right causal])·v with GQA; q (T,Hq,D), k/v (S,Hkv,D)",
)

DECODE = Slot(
    "attention.decode",
    SlotKind.BLOCK,
    (Arg("q", Role.INPUT, shape="(B, Hq, D)"),
     Arg("k_cache", Role.INPUT, shape="(max_slots, Hkv, D)", doc="paged: token t of request b in slot req_to_token[req_pool_indices[b], t]"),
     Arg("v_cache", Role.INPUT, shape="(max_slots, Hkv, D)"),
     Arg("req_to_token", Role.INPUT, shape="(pool, kv_len)"), Arg("seq_lens", Role.INPUT, shape="(B,)"),
     Arg("req_pool_indices", Role.INPUT, shape="(B,)"),
     Arg("topk_idx", Role.INPUT, shape="(Hkv, B, Kb)", doc="selected block ids; -1 = none, a repeat counts once"),
     Arg("out", Role.OUTPUT, shape="(B, Hq, D)"), Arg("sm_scale", Role.SCALAR), Arg("block_size", Role.SCALAR)),
    summary="paged block-sparse decode attention over validator-selected blocks (topk_idx (Hkv,B,Kb), -1 = none)",
)

# --------------------------------------------------------------------------- attention.sdpa

# name: (T, S, Hq, Hkv, D, causal, input scale, model)
_SDPA_SHAPES = {
    "single_token_mqa": (1, 17, 4, 1, 32, True, 1.0, "generic"),
    "ragged_gqa_causal_nonpow2": (13, 29, 6, 2, 48, True, 1.0, "generic"),
    "square_causal_mha": (32, 32, 8, 8, 64, True, 1.0, "generic"),
    "cross_noncausal_gqa": (7, 50, 4, 2, 40, False, 1.0, "generic"),
    "saturating_logits": (9, 21, 4, 4, 16, True, 4.0, "generic"),  # near one-hot softmax rows
    "minimax_m3_prefill": (16, 48, 64, 4, 128, True, 1.0, "MiniMax-M3"),  # real head geometry
}

# sm_scale is a validator-owned scalar: these profiles pass one other than 1/sqrt(D), so a kernel
# that hard-codes the usual scale fails.
_SM_SCALE = {"ragged_gqa_causal_nonpow2": 1 / 48, "cross_noncausal_gqa": 0.25, "ragged_gqa_padded_ids": 0.1}


def _sdpa_case(profile: Profile, gen: torch.Generator) -> Case:
    t, s, hq, hkv, d, causal, scale = (profile.dims[k] for k in ("T", "S", "Hq", "Hkv", "D", "causal", "scale"))
    return Case(
        inputs={
            "q": randn((t, hq, d), gen, profile.dtype, scale),
            "k": randn((s, hkv, d), gen, profile.dtype, scale),
            "v": randn((s, hkv, d), gen, profile.dtype),
            "sm_scale": _SM_SCALE.get(profile.name, d ** -0.5),
            "causal": causal,
        },
        outputs={"out": OutputSpec((t, hq, d), profile.dtype)},
    )


def _sdpa_reference(case: Case, offset: int | None = None, scale: float | None = None, causal: bool | None = None,
                    kv_head: Callable[[int, int, int], int] | None = None) -> dict[str, torch.Tensor]:
    """fp64 with explicit GQA expansion; the keywords substitute parts (near-misses only): the
    causal ``offset`` (query i sees keys j <= i + offset; None: the contract's S - T), the scale,
    whether the mask applies, and the kv head of query head h (``kv_head(h, Hq, Hkv)``)."""
    q, k, v = (case.inputs[n].double() for n in ("q", "k", "v"))
    t, hq, _ = q.shape
    s, hkv, _ = k.shape
    heads = [h // (hq // hkv) if kv_head is None else kv_head(h, hq, hkv) for h in range(hq)]
    k, v = k[:, heads], v[:, heads]
    logits = torch.einsum("thd,shd->hts", q, k) * (case.inputs["sm_scale"] if scale is None else scale)
    if case.inputs["causal"] if causal is None else causal:
        visible = torch.arange(s).view(1, s) <= torch.arange(t).view(t, 1) + (s - t if offset is None else offset)
        logits = logits.masked_fill(~visible, float("-inf"))
    return {"out": torch.einsum("hts,shd->thd", logits.softmax(-1), v).float()}


def _top_left_causal(case: Case) -> dict[str, torch.Tensor] | None:
    q, k = case.inputs["q"], case.inputs["k"]
    return _sdpa_reference(case, offset=0) if case.inputs["causal"] and k.shape[0] != q.shape[0] else None


def _causal_ignored(case: Case) -> dict[str, torch.Tensor] | None:
    return _sdpa_reference(case, causal=False) if case.inputs["causal"] and case.inputs["q"].shape[0] > 1 else None


def _default_scale(case: Case) -> dict[str, torch.Tensor] | None:
    d = case.inputs["q"].shape[-1]
    return None if case.inputs["sm_scale"] == d ** -0.5 else _sdpa_reference(case, scale=d ** -0.5)


def _heads_interleaved(case: Case) -> dict[str, torch.Tensor] | None:
    hq, hkv = case.inputs["q"].shape[1], case.inputs["k"].shape[1]
    return _sdpa_reference(case, kv_head=lambda h, _hq, n: h % n) if 1 < hkv < hq else None


SDPA_NEAR_MISSES = (
    NearMiss("top-left causal alignment (j <= i instead of j <= i + S - T)", _top_left_causal),
    NearMiss("causal mask ignored", _causal_ignored),
    NearMiss("sm_scale ignored (1/sqrt(D) used)", _default_scale),
    NearMiss("GQA heads interleaved (kv head h % Hkv instead of h // (Hq/Hkv))", _heads_interleaved),
)


def _sdpa_draw(base: Profile, pick: Pick) -> dict:
    """Lengths, heads (GQA groups), head dim and causality around ``base`` (same dtype, model and
    value scale; MiniMax-M3 keeps its head geometry). Causal draws keep S >= T."""
    t = pick.integer(1, 32)
    causal = pick.flag()
    dims = {"T": t, "S": pick.integer(t, t + 48) if causal else pick.integer(1, 64), "causal": causal}
    if base.model != "MiniMax-M3":
        hkv = pick.integer(1, 4)
        dims.update(Hkv=hkv, Hq=hkv * pick.integer(1, 4), D=pick.choice((8, 16, 24, 32, 48, 64)))
    return dims


def _sdpa_describe(case: Case) -> CallDescriptor:
    q, k = case.inputs["q"], case.inputs["k"]
    return CallDescriptor(
        phase="decode" if q.shape[0] == 1 else "prefill", num_tokens=q.shape[0], batch_size=1, kv_len=k.shape[0],
        num_q_heads=q.shape[1], num_kv_heads=k.shape[1], head_dim=q.shape[2], layout="thd", quant="dense",
    )


def _sdpa_traffic(case: Case) -> Traffic:
    """q, k and v read whole (the last query sees every key), out written; 4·D flops per visible
    (query head, key) pair."""
    q, k = case.inputs["q"], case.inputs["k"]
    (t, hq, d), s = q.shape, k.shape[0]
    pairs = sum(min(s, max(0, i + s - t + 1)) for i in range(t)) if case.inputs["causal"] else t * s
    return Traffic(nbytes(q, k, case.inputs["v"]) + output_traffic(case).bytes, 4 * d * hq * pairs)


# --------------------------------------------------------------------------- attention.decode

# name: dict of dims. seq_lens per request; kv_len = page-table width (a multiple of block_size);
# topk = Kb; holes/repeat/beyond: per row, punch a -1 hole / repeat an id / pick a block past
# seq_len; empty: requests whose every row is all -1; local: always select the request's last block.
_DECODE_SHAPES = {
    "single_request_single_token": dict(Hq=2, Hkv=1, D=16, bs=4, seq_lens=(1,), kv_len=8, topk=3,
                                        holes=False, repeat=True, beyond=True, empty=(), local=True, scale=1.0),
    "ragged_gqa_padded_ids": dict(Hq=8, Hkv=2, D=32, bs=16, seq_lens=(100, 17, 64, 3), kv_len=128, topk=5,
                                  holes=True, repeat=True, beyond=True, empty=(), local=False, scale=1.0),
    "empty_request_nonpow2": dict(Hq=6, Hkv=3, D=24, bs=12, seq_lens=(50, 31, 77), kv_len=96, topk=4,
                                  holes=True, repeat=False, beyond=True, empty=(1,), local=False, scale=1.0),
    "mqa_saturating_logits": dict(Hq=5, Hkv=1, D=40, bs=8, seq_lens=(45, 9), kv_len=48, topk=6,
                                  holes=False, repeat=True, beyond=False, empty=(), local=True, scale=3.0),
    "minimax_m3_decode": dict(Hq=64, Hkv=4, D=128, bs=128, seq_lens=(2200, 900), kv_len=2304, topk=16,
                              holes=False, repeat=False, beyond=False, empty=(), local=True, scale=1.0),
}


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    """A seeded integer in ``[lo, hi)``."""
    return int(torch.randint(lo, hi, (1,), generator=gen))


def _block_ids(gen: torch.Generator, dims: dict) -> torch.Tensor:
    """``topk_idx (Hkv, B, Kb)`` int32 with the profile's adversarial patterns."""
    bs, kb, n_table = dims["bs"], dims["topk"], dims["kv_len"] // dims["bs"]
    rows = []
    for _g in range(dims["Hkv"]):
        per_req = []
        for b, seq_len in enumerate(dims["seq_lens"]):
            n_valid = math.ceil(seq_len / bs)
            order = torch.randperm(n_valid, generator=gen).tolist()
            if dims["local"]:
                order.remove(n_valid - 1)
                order.insert(0, n_valid - 1)
            row = (order + [-1] * kb)[:kb]
            if dims["holes"] and kb >= 3:
                row[_randint(gen, 1, kb)] = -1
            if dims["repeat"] and kb >= 2 and row[0] >= 0:
                row[_randint(gen, 1, kb)] = row[0]
            if dims["beyond"] and n_table > n_valid:
                row[_randint(gen, 0, kb)] = _randint(gen, n_valid, n_table)
            if b in dims["empty"]:
                row = [-1] * kb
            per_req.append(row)
        rows.append(per_req)
    return torch.tensor(rows, dtype=torch.int32)


def _decode_case(profile: Profile, gen: torch.Generator) -> Case:
    dims = dict(profile.dims)
    seq_lens = dims["seq_lens"]
    bsz, hq, hkv, d, width = len(seq_lens), dims["Hq"], dims["Hkv"], dims["D"], dims["kv_len"]
    pool = bsz + 2
    max_slots = sum(seq_lens) + 7
    # Live tokens get distinct scattered slots; cells past seq_len hold stale (valid) slot numbers.
    table = torch.randint(0, max_slots, (pool, width), generator=gen, dtype=torch.int32)
    pool_rows = torch.randperm(pool, generator=gen)[:bsz]
    fresh = torch.randperm(max_slots, generator=gen).to(torch.int32)
    start = 0
    for b, seq_len in enumerate(seq_lens):
        table[pool_rows[b], :seq_len] = fresh[start:start + seq_len]
        start += seq_len
    return Case(
        inputs={
            "q": randn((bsz, hq, d), gen, profile.dtype, dims["scale"]),
            "k_cache": randn((max_slots, hkv, d), gen, profile.dtype, dims["scale"]),
            "v_cache": randn((max_slots, hkv, d), gen, profile.dtype),
            "req_to_token": table,
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
            "req_pool_indices": pool_rows.to(torch.int64),
            "topk_idx": _block_ids(gen, dims),
            "sm_scale": _SM_SCALE.get(profile.name, d ** -0.5),
            "block_size": dims["bs"],
        },
        outputs={"out": OutputSpec((bsz, hq, d), profile.dtype)},
    )


def _decode_reference(case: Case, ids: torch.Tensor | None = None, whole_blocks: bool = False,
                      repeats_count: bool = False) -> dict[str, torch.Tensor]:
    """fp64, a loop over requests and kv heads; the keywords substitute parts (near-misses only):
    other block ids, whole blocks attended past ``seq_lens``, a repeated id attended twice."""
    inp = case.inputs
    q = inp["q"].double()
    bsz, hq, d = q.shape
    hkv = inp["k_cache"].shape[1]
    group = hq // hkv
    bs = inp["block_size"]
    out = torch.zeros(bsz, hq, d, dtype=torch.float64)
    ids = (inp["topk_idx"] if ids is None else ids).tolist()
    seq_lens, pool_rows = inp["seq_lens"].tolist(), inp["req_pool_indices"].tolist()
    offsets = torch.arange(bs)
    for b in range(bsz):
        end = inp["req_to_token"].shape[1] if whole_blocks else seq_lens[b]
        page_row = inp["req_to_token"][pool_rows[b]]
        for g in range(hkv):
            blocks = sorted(j for j in (ids[g][b] if repeats_count else set(ids[g][b])) if j >= 0)
            tokens = (torch.tensor(blocks, dtype=torch.long).view(-1, 1) * bs + offsets).flatten()
            tokens = tokens[tokens < end]  # each block's tokens in order, cut at the request's end
            if not tokens.numel():
                continue  # nothing to attend: the output stays 0
            slots = page_row[tokens].long()
            keys = inp["k_cache"][slots, g].double()  # (n, D)
            values = inp["v_cache"][slots, g].double()
            heads = slice(g * group, (g + 1) * group)
            probs = (q[b, heads] @ keys.T * inp["sm_scale"]).softmax(-1)
            out[b, heads] = probs @ values
    return {"out": out.float()}


def _minus_one_as_block0(case: Case) -> dict[str, torch.Tensor] | None:
    ids = case.inputs["topk_idx"]
    return _decode_reference(case, ids=ids.clamp(min=0)) if bool((ids < 0).any()) else None


def _seq_lens_ignored(case: Case) -> dict[str, torch.Tensor] | None:
    """Exercised where a selected block reaches past its request's seq_len."""
    inp, bs = case.inputs, case.inputs["block_size"]
    ends = (inp["topk_idx"].long() + 1) * bs  # (Hkv, B, Kb)
    past = (inp["topk_idx"] >= 0) & (ends > inp["seq_lens"].long().view(1, -1, 1))
    return _decode_reference(case, whole_blocks=True) if bool(past.any()) else None


def _repeats_counted(case: Case) -> dict[str, torch.Tensor] | None:
    ids = case.inputs["topk_idx"]
    valid = ids >= 0
    repeated = (ids.unsqueeze(-1) == ids.unsqueeze(-2)) & valid.unsqueeze(-1) & ~torch.eye(ids.shape[-1], dtype=torch.bool)
    return _decode_reference(case, repeats_count=True) if bool(repeated.any()) else None


DECODE_NEAR_MISSES = (
    NearMiss("-1 read as block 0 (ids clamped, not masked)", _minus_one_as_block0),
    NearMiss("seq_lens ignored inside the selected blocks", _seq_lens_ignored),
    NearMiss("a repeated block id attended twice", _repeats_counted),
)


def _decode_draw(base: Profile, pick: Pick) -> dict:
    """Ragged requests, page-table width, Kb, block ids with holes, repeats, blocks past seq_len,
    empty requests and the local block, around ``base`` (same dtype, model and value scale;
    MiniMax-M3 keeps its head geometry and block size)."""
    minimax = base.model == "MiniMax-M3"
    bs = base.dims["bs"] if minimax else pick.choice((4, 8, 12, 16))
    seq_lens = pick.integers(1, 2048 if minimax else 160, 1, 4)
    dims = {"bs": bs, "seq_lens": seq_lens, "kv_len": bs * (-(-max(seq_lens) // bs) + pick.integer(0, 2)),
            "topk": pick.integer(1, 8), "holes": pick.flag(), "repeat": pick.flag(), "beyond": pick.flag(),
            "empty": pick.subset(range(len(seq_lens))), "local": pick.flag()}
    if not minimax:
        hkv = pick.integer(1, 3)
        dims.update(Hkv=hkv, Hq=hkv * pick.integer(1, 4), D=pick.choice((8, 16, 24, 32, 40)))
    return dims


def _decode_describe(case: Case) -> CallDescriptor:
    q, kc, ids = case.inputs["q"], case.inputs["k_cache"], case.inputs["topk_idx"]
    return CallDescriptor(
        phase="decode", batch_size=q.shape[0], num_tokens=q.shape[0], kv_len=case.inputs["req_to_token"].shape[1],
        top_k=ids.shape[2], block_size=case.inputs["block_size"], num_q_heads=q.shape[1], num_kv_heads=kc.shape[1],
        head_dim=q.shape[2], layout="paged", quant="dense",
    )


def _decode_traffic(case: Case) -> Traffic:
    """q and the id tensors read, out written, and the k/v rows of every attended token (each
    request × kv head's token set, as the reference builds it); 4·D flops per (query head, token)."""
    inp = case.inputs
    q, kc, bs = inp["q"], inp["k_cache"], inp["block_size"]
    group = q.shape[1] // kc.shape[1]
    row = kc[0].numel() // kc.shape[1] * kc.element_size()  # one token of one kv head, k or v
    tokens = 0
    for g, per_req in enumerate(inp["topk_idx"].tolist()):
        for b, ids in enumerate(per_req):
            n = int(inp["seq_lens"][b])
            tokens += sum(max(0, min((j + 1) * bs, n) - j * bs) for j in {j for j in ids if j >= 0})
    fixed = nbytes(q, inp["topk_idx"], inp["seq_lens"], inp["req_pool_indices"]) + output_traffic(case).bytes
    return Traffic(fixed + 2 * tokens * row, 4 * q.shape[2] * group * tokens)


# Envelope sizes (verify/envelope.py): query heads stay a multiple of kv heads (the GQA group is
# kept when kv heads change); causal sdpa keeps T <= S; decode's page table stays a multiple of the
# block size, with the requests' lengths scaled along with it.
_HEADS = (("num_q_heads", "Hq", lambda d, n: {**d, "Hq": multiple_of(n, d["Hkv"])}),
          ("num_kv_heads", "Hkv", lambda d, n: {**d, "Hkv": n, "Hq": n * (d["Hq"] // d["Hkv"])}),
          ("head_dim", "D"))
_SDPA_SIZES = (("num_tokens", "T", lambda d, n: {**d, "T": n, "S": max(d["S"], n) if d["causal"] else d["S"]}),
               ("kv_len", "S", lambda d, n: {**d, "S": n, "T": min(d["T"], n) if d["causal"] else d["T"]}), *_HEADS)


def _decode_kv_len(d: dict, n: int) -> dict:
    width = multiple_of(n, d["bs"])
    return {**d, "kv_len": width, "seq_lens": tuple(max(1, s * width // d["kv_len"]) for s in d["seq_lens"])}


_DECODE_SIZES = (("batch_size", "seq_lens", lambda d, n: {**d, "seq_lens": cycled(d["seq_lens"], n)}),
                 ("kv_len", "kv_len", _decode_kv_len), ("top_k", "topk"),
                 ("block_size", "bs", lambda d, n: {**d, "bs": n, "kv_len": multiple_of(max(d["kv_len"], n), n)}),
                 *_HEADS)


def _profiles(shapes: dict, model_of: Callable[[str, dict], str], adversarial: set[str]) -> tuple[Profile, ...]:
    return tuple(
        Profile(name, dims, dt, model=model_of(name, dims), tags=ADVERSARIAL if name in adversarial else frozenset(),
                comparator=_scaled_comparator(dims["scale"]))
        for name, dims in shapes.items()
        for dt in DTYPES
    )


def _scaled_comparator(scale: float) -> MatchedRatio | None:
    """The comparator of a profile whose q and k are ``scale`` times unit scale (None: the slot's).

    Logits grow as ``scale²``, and a float32 kernel's rounding of the output with them: measured
    ``<= 12·2^-24·max|logit|·rms(row)`` for torch's fused SDPA and a plain float32 softmax alike, which
    spends a fifth of the float32 tolerance at unit scale and 2.8x it at scale 4 (2000 drawn shapes
    each). So the float32 tolerance grows as ``scale²``; 16-bit outputs keep theirs, far above it.
    """
    return None if scale == 1.0 else MatchedRatio(0.99, min_tol=default_tol(torch.float32) * scale ** 2)


_SDPA_DIMS = {
    name: dict(T=t, S=s, Hq=hq, Hkv=hkv, D=d, causal=causal, scale=scale, model=model)
    for name, (t, s, hq, hkv, d, causal, scale, model) in _SDPA_SHAPES.items()
}

SDPA_INCUMBENT = Kernel(builtin.sdpa, name="builtin.sdpa")
DECODE_INCUMBENT = Kernel(builtin.decode, name="builtin.decode")
DECODE_TRITON = triton_variant("attention", "decode", name="triton.decode", graph_safe=True)

SLOTS = (
    SlotDef(
        slot=SDPA,
        make_case=_sdpa_case,
        reference=_sdpa_reference,
        comparator=MatchedRatio(0.99),
        profiles=_profiles(_SDPA_DIMS, lambda n, d: d["model"],
                           {"single_token_mqa", "ragged_gqa_causal_nonpow2", "saturating_logits"}),
        incumbent=SDPA_INCUMBENT,
        describe=_sdpa_describe,
        traffic=_sdpa_traffic,
        sizes=_SDPA_SIZES,
        draw=_sdpa_draw,
        builtins=(Candidate(SDPA_INCUMBENT, graph_safe=True),),
        near_misses=SDPA_NEAR_MISSES,
    ),
    SlotDef(
        slot=DECODE,
        make_case=_decode_case,
        reference=_decode_reference,
        comparator=MatchedRatio(0.99),
        profiles=_profiles(_DECODE_SHAPES, lambda n, d: "MiniMax-M3" if n.startswith("minimax") else "generic",
                           {"single_request_single_token", "ragged_gqa_padded_ids", "empty_request_nonpow2",
                            "mqa_saturating_logits"}),
        incumbent=DECODE_INCUMBENT,
        describe=_decode_describe,
        traffic=_decode_traffic,
        sizes=_DECODE_SIZES,
        draw=_decode_draw,
        builtins=(DECODE_TRITON, Candidate(DECODE_INCUMBENT, graph_safe=True, needs=superseded_by(DECODE_TRITON))),
        near_misses=DECODE_NEAR_MISSES,
        notes="graph-safe incumbent: masks instead of data-dependent shapes; no host synchronisation",
    ),
)
