"""attention.* MSA index slots: ``attention.msa_block_score`` and ``attention.msa_prefill_block_score``.

- ``attention.msa_block_score``: ``entry(q, index_k, seq_lens, block_size, out)``; q ``(B, Hi, D)``,
  index_k ``(B, S, D)``, seq_lens int32 ``(B,)``, out float32 ``(B, Hi, ceil(S/block_size))``:
  ``out[b,h,j] = max_{t in block j, t < seq_lens[b]} q[b,h]·index_k[b,t]``, ``-inf`` for an empty
  block. Judged by ``topk_overlap(k=8, scores) >= 0.875`` over rows and ``>= 0.75`` in every row
  (ties in the expected scores honoured).
- ``attention.msa_prefill_block_score``: the 19-argument ragged V2 call. Tensors:
  q ``(total_q, Hi, D)``, index_k_cache ``(slots, 1, D)``, req_to_token int32 ``(pool, width)``,
  slot_ids int64 ``(B,)``, cu_seqlens / cu_seqblocks_q int32 ``(B+1,)``, seq_lens / prefix_lens
  int32 ``(B,)``; out_topk contiguous int32 ``(Hi, all_seqblock_q, topk)``. Query row ``m`` of request
  ``b`` sees key ``n`` iff ``n <= prefix_lens[b] + m``. Judged by per-row
  ``topk_overlap(k=topk, indices) >= 0.90`` plus hard audits (no tolerance): every index is -1 or a
  key block visible to its query block; no duplicates in a row; -1 only after the valid entries.

The references are fp64, loop over requests (and, for the selection, over rows) in Python and
share no code with :mod:`kernelslot.kernels.msa`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kernelslot.abi import AllOf, Arg, CallDescriptor, OutputSpec, Role, Slot, SlotKind, TopKOverlap
from kernelslot.abi.comparators import canonical_expected, tie_partition, unit_roundoff
from kernelslot.kernels import msa as builtin
from kernelslot.slots.base import (Case, Kernel, NearMiss, Pick, Profile, SlotDef, Traffic, cycled, nbytes,
                                   output_traffic, randn)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ADVERSARIAL = frozenset({"adversarial"})
SCORE_TOPK = 8  # the validator's selection size on msa_block_score's score sheet

BLOCK_SCORE = Slot(
    "attention.msa_block_score",
    SlotKind.BLOCK,
    (Arg("q", Role.INPUT, shape="(B, Hi, D)"), Arg("index_k", Role.INPUT, shape="(B, S, D)"),
     Arg("seq_lens", Role.INPUT, shape="(B,)"), Arg("block_size", Role.SCALAR),
     Arg("out", Role.OUTPUT, shape="(B, Hi, ceil(S/block_size))", doc="-inf for an empty block")),
    summary="per-request block-max index scores; out (B,Hi,ceil(S/block_size)) float32, -inf = empty block",
)

_PREFILL_SCALARS = ("max_seqlen_q", "max_seqlen_k", "block_size_q", "block_size_k", "topk", "init_blocks",
                    "local_blocks", "scale")
PREFILL = Slot(
    "attention.msa_prefill_block_score",
    SlotKind.BLOCK,
    tuple(Arg(n, Role.INPUT, shape=shape) for n, shape in (
        ("q", "(total_q, Hi, D)"), ("index_k_cache", "(slots, 1, D)"), ("req_to_token", "(pool, width)"),
        ("slot_ids", "(B,)"), ("cu_seqlens", "(B+1,)"), ("seq_lens", "(B,)"), ("prefix_lens", "(B,)")))
    + tuple(Arg(n, Role.SCALAR) for n in _PREFILL_SCALARS)
    + (Arg("cu_seqblocks_q", Role.INPUT, shape="(B+1,)"), Arg("max_seqblock_q", Role.SCALAR),
       Arg("all_seqblock_q", Role.SCALAR),
       Arg("out_topk", Role.OUTPUT, shape="(Hi, all_seqblock_q, topk)", doc="-1 only after the valid entries")),
    summary="ragged causal MSA prefill: block scores + top-k key-block selection; out_topk (Hi,rows,topk) int32",
)


def _values(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, integer: bool) -> torch.Tensor:
    """Normal draws, or small integers (exact in every dtype: dot products tie exactly)."""
    if integer:
        return torch.randint(-2, 3, shape, generator=gen).to(dtype)
    return randn(shape, gen, dtype)


# Clustered maxima (``dims["cluster"] = (first, levels)``, integer profiles): every query gets
# q[0] = CLUSTER_Q; key blocks first .. first+levels-1 get k[0] = (levels - i)·CLUSTER_STEP, so
# for every head and query block they are the best blocks in that order (adjacent levels differ by
# 128 against at most ±56 from the other coordinates, exactly in every dtype), and block
# first+levels is an exact copy of the lowest one: an exact tie at the selection boundary, which
# straddles a tile boundary when first+levels is a multiple of 8. The contract breaks it by the
# lower index; a tiled or two-stage top-k that keeps a few blocks per tile loses the cluster's tail.
CLUSTER_Q, CLUSTER_STEP = 4, 32


def _plant_cluster(keys: torch.Tensor, first: int, levels: int, block_size: int) -> torch.Tensor:
    """``keys (L, D)`` of one request with the cluster planted (a copy); unchanged if L is too short."""
    if keys.shape[0] < (first + levels + 1) * block_size:
        return keys
    keys = keys.clone()
    for i in range(levels):
        keys[(first + i) * block_size:(first + i + 1) * block_size, 0] = (levels - i) * CLUSTER_STEP
    low = (first + levels - 1) * block_size
    keys[low + block_size:low + 2 * block_size] = keys[low:low + block_size]
    return keys


# --------------------------------------------------------------------------- msa_block_score

# name: (seq_lens, Hi, D, S, block_size, integer values, duplicated key blocks, model[, cluster])
_SCORE_SHAPES = {
    "single_token_single_block": ((1,), 1, 16, 1, 4, False, False, "generic"),
    "ragged_seq_lens": ((200, 37, 1), 4, 32, 200, 16, False, False, "generic"),
    "ties_integer_duplicated_blocks": ((96, 61), 2, 8, 96, 8, True, True, "generic"),
    "nonpow2_partial_blocks": ((77, 50), 3, 40, 77, 12, False, False, "generic"),
    "minimax_m3_index": ((4096, 1700), 4, 128, 4096, 128, False, False, "MiniMax-M3"),
    "clustered_maxima_boundary_ties": ((200, 150), 2, 8, 200, 8, True, False, "generic", (8, 8)),
}


def _score_case(profile: Profile, gen: torch.Generator) -> Case:
    seq_lens, hi, d, s, bs, integer, dup = (profile.dims[k] for k in ("seq_lens", "Hi", "D", "S", "bs", "integer", "dup"))
    bsz = len(seq_lens)
    index_k = _values((bsz, s, d), gen, profile.dtype, integer)
    if dup:  # every third block repeats block 0 exactly: tied block maxima
        for j in range(3, math.ceil(s / bs), 3):
            width = min(bs, s - j * bs)
            index_k[:, j * bs:j * bs + width] = index_k[:, :width]
    q = _values((bsz, hi, d), gen, profile.dtype, integer)
    if profile.dims.get("cluster"):
        q[..., 0] = CLUSTER_Q
        for b, n in enumerate(seq_lens):
            index_k[b, :n] = _plant_cluster(index_k[b, :n], *profile.dims["cluster"], bs)
    for b, n in enumerate(seq_lens):  # keys past seq_len score far above any real key, per head in turn:
        for i, t in enumerate(range(n, s)):  # a kernel that reads them selects the wrong blocks
            index_k[b, t] = 16 * q[b, i % hi]
    return Case(
        inputs={
            "q": q,
            "index_k": index_k,
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
            "block_size": bs,
        },
        outputs={"out": OutputSpec((bsz, hi, math.ceil(s / bs)), torch.float32)},
    )


def _score_draw(base: Profile, pick: Pick) -> dict:
    """Ragged lengths, geometry, integer ties, duplicated blocks and clustered maxima around
    ``base`` (same dtype and model; MiniMax-M3 keeps its index geometry: 4 heads x 128, blocks of 128)."""
    minimax = base.model == "MiniMax-M3"
    bs = base.dims["bs"] if minimax else pick.choice((4, 8, 12, 16))
    s = pick.integer(1, 2048 if minimax else 256)
    dims = {"S": s, "seq_lens": pick.integers(1, s, 1, 3), "bs": bs}
    if not minimax:
        dims.update(Hi=pick.integer(1, 4), D=pick.choice((8, 16, 32)), integer=pick.flag(), dup=pick.flag(),
                    cluster=None)
        if dims["integer"] and pick.flag():
            dims["cluster"] = (pick.integer(0, 4), pick.integer(2, 8))
    return dims


def _score_reference(case: Case, whole_rows: bool = False) -> dict[str, torch.Tensor]:
    """fp64 block maxima; ``whole_rows`` scores every stored key, ignoring seq_lens (a near-miss)."""
    q, index_k, bs = case.inputs["q"].double(), case.inputs["index_k"].double(), case.inputs["block_size"]
    bsz, hi, _ = q.shape
    n_blocks = math.ceil(index_k.shape[1] / bs)
    out = torch.full((bsz, hi, n_blocks), float("-inf"), dtype=torch.float64)
    for b in range(bsz):
        seq_len = index_k.shape[1] if whole_rows else int(case.inputs["seq_lens"][b])
        for j in range(n_blocks):
            keys = index_k[b, j * bs:min((j + 1) * bs, seq_len)]
            if keys.shape[0]:
                out[b, :, j] = (q[b] @ keys.T).amax(-1)
    return {"out": out.float()}


def _score_seq_lens_ignored(case: Case) -> dict[str, torch.Tensor] | None:
    short = bool((case.inputs["seq_lens"] < case.inputs["index_k"].shape[1]).any())
    return _score_reference(case, whole_rows=True) if short else None


SCORE_NEAR_MISSES = (NearMiss("seq_lens ignored (keys past a request's end scored)", _score_seq_lens_ignored),)


def _score_describe(case: Case) -> CallDescriptor:
    q, index_k = case.inputs["q"], case.inputs["index_k"]
    # top_k stays unset: selection belongs to the validator, the call itself takes no k.
    return CallDescriptor(
        phase="decode", batch_size=q.shape[0], num_tokens=q.shape[0], kv_len=index_k.shape[1],
        block_size=case.inputs["block_size"], num_q_heads=q.shape[1], num_kv_heads=1, head_dim=q.shape[2],
        layout="bsd", quant="dense",
    )


def _score_traffic(case: Case) -> Traffic:
    """q and seq_lens read, every request's keys before its seq_len read, out written; 2·D flops per
    (head, key)."""
    q, index_k = case.inputs["q"], case.inputs["index_k"]
    keys = int(case.inputs["seq_lens"].clamp(max=index_k.shape[1]).sum())
    row = index_k.shape[2] * index_k.element_size()
    return Traffic(nbytes(q, case.inputs["seq_lens"]) + keys * row + output_traffic(case).bytes,
                   2 * q.shape[1] * q.shape[2] * keys)


# --------------------------------------------------------------------------- msa_prefill_block_score

# name: dims (q_lens and prefix_lens per request; bq/bk query/key block sizes)
_PREFILL_SHAPES = {
    "single_token_single_request": dict(q_lens=(1,), prefix=(0,), Hi=1, D=16, bq=4, bk=4, topk=2, init=1, local=1,
                                        integer=False),
    "ragged_prefix_lens": dict(q_lens=(37, 5, 64), prefix=(0, 90, 20), Hi=2, D=32, bq=8, bk=8, topk=6, init=1,
                               local=2, integer=False),
    "ties_integer_scores": dict(q_lens=(40, 24), prefix=(16, 0), Hi=2, D=8, bq=8, bk=8, topk=5, init=1, local=1,
                                integer=True),
    "nonpow2_blocks": dict(q_lens=(33, 19), prefix=(7, 41), Hi=3, D=40, bq=6, bk=5, topk=7, init=2, local=1,
                           integer=False),
    "minimax_m3_index": dict(q_lens=(192, 70), prefix=(3800, 0), Hi=4, D=128, bq=64, bk=128, topk=16, init=0,
                             local=1, integer=False),
    # the 8 free picks fill key blocks 8..15 (one tile) and block 16 ties block 15 exactly (_plant_cluster)
    "clustered_maxima_boundary_ties": dict(q_lens=(24, 40), prefix=(192, 160), Hi=2, D=8, bq=8, bk=8, topk=9, init=0,
                                           local=1, integer=True, cluster=(8, 8)),
}


def _prefill_case(profile: Profile, gen: torch.Generator) -> Case:
    dims = profile.dims
    q_lens, prefix = dims["q_lens"], dims["prefix"]
    bsz, bq, bk = len(q_lens), dims["bq"], dims["bk"]
    seq_lens = [p + n for p, n in zip(prefix, q_lens)]
    q_blocks = [math.ceil(n / bq) for n in q_lens]
    max_k = max(seq_lens)
    width = math.ceil(max_k / bk) * bk + bk  # page-table rows are wider than any sequence
    pool, n_slots = bsz + 1, sum(seq_lens) + 5
    table = torch.randint(0, n_slots, (pool, width), generator=gen, dtype=torch.int32)  # stale past seq_len
    slot_ids = torch.randperm(pool, generator=gen)[:bsz]
    fresh = torch.randperm(n_slots, generator=gen).to(torch.int32)
    start = 0
    for b, seq_len in enumerate(seq_lens):
        table[slot_ids[b], :seq_len] = fresh[start:start + seq_len]
        start += seq_len
    cumsum = [0]
    for n in q_lens:
        cumsum.append(cumsum[-1] + n)
    cu_blocks = [0]
    for n in q_blocks:
        cu_blocks.append(cu_blocks[-1] + n)
    scale = 0.5 if dims["integer"] else dims["D"] ** -0.5
    rows = cu_blocks[-1]
    q = _values((cumsum[-1], dims["Hi"], dims["D"]), gen, profile.dtype, dims["integer"])
    cache = _values((n_slots, 1, dims["D"]), gen, profile.dtype, dims["integer"])
    if dims.get("cluster"):
        q[..., 0] = CLUSTER_Q
        for b, seq_len in enumerate(seq_lens):
            slots = table[slot_ids[b], :seq_len].long()
            cache[slots, 0] = _plant_cluster(cache[slots, 0], *dims["cluster"], bk)
    return Case(
        inputs={
            "q": q,
            "index_k_cache": cache,
            "req_to_token": table,
            "slot_ids": slot_ids.to(torch.int64),
            "cu_seqlens": torch.tensor(cumsum, dtype=torch.int32),
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
            "prefix_lens": torch.tensor(prefix, dtype=torch.int32),
            "max_seqlen_q": max(q_lens),
            "max_seqlen_k": max_k,
            "block_size_q": bq,
            "block_size_k": bk,
            "topk": dims["topk"],
            "init_blocks": dims["init"],
            "local_blocks": dims["local"],
            "scale": scale,
            "cu_seqblocks_q": torch.tensor(cu_blocks, dtype=torch.int32),
            "max_seqblock_q": max(q_blocks),
            "all_seqblock_q": rows,
        },
        outputs={"out_topk": OutputSpec((dims["Hi"], rows, dims["topk"]), torch.int32, policy="contiguous")},
    )


def _prefill_draw(base: Profile, pick: Pick) -> dict:
    """Ragged requests, block sizes, forced blocks, top-k, integer ties and clustered maxima around
    ``base`` (same dtype and model; MiniMax-M3 keeps its index geometry and selection sizes)."""
    b = pick.integer(1, 3)
    minimax = base.model == "MiniMax-M3"
    dims = {"q_lens": pick.integers(1, 160 if minimax else 48, b, b),
            "prefix": pick.integers(0, 2048 if minimax else 96, b, b)}
    if not minimax:
        init, local = pick.integer(0, 2), pick.integer(0, 2)
        dims.update(Hi=pick.integer(1, 3), D=pick.choice((8, 16, 32)), bq=pick.integer(4, 16), bk=pick.integer(4, 16),
                    init=init, local=local, topk=pick.integer(max(1, init + local), init + local + 8),
                    integer=pick.flag(), cluster=None)
        if dims["integer"] and pick.flag():
            dims["cluster"] = (pick.integer(init, 4), pick.integer(2, 8))
    return dims


def _query_blocks(inputs: dict) -> list[tuple[int, int, int, int]]:
    """Per output row: (request, first query row, end query row (exclusive), last visible key block)."""
    blocks = []
    bq, bk = inputs["block_size_q"], inputs["block_size_k"]
    cu, prefix = inputs["cu_seqlens"].tolist(), inputs["prefix_lens"].tolist()
    for b in range(len(prefix)):
        q_len = cu[b + 1] - cu[b]
        for qb in range(math.ceil(q_len / bq)):
            first, end = qb * bq, min((qb + 1) * bq, q_len)
            blocks.append((b, first, end, (prefix[b] + end - 1) // bk))
    return blocks


def _prefill_reference(case: Case) -> dict[str, Any]:
    """The selection by the contract's rule, as an admissible set where the boundary is a tie.

    Exact ties follow the contract (lower block index first). Where block scores closer than the
    input dtype path's rounding error straddle a row's selection boundary, every block strictly
    above the tie must be selected and the rest may come from the tied blocks (:class:`TopkSets`).
    """
    inp = case.inputs
    bk, topk, init, local = inp["block_size_k"], inp["topk"], inp["init_blocks"], inp["local_blocks"]
    hi = inp["q"].shape[1]
    cu, prefix, seq_lens = inp["cu_seqlens"].tolist(), inp["prefix_lens"].tolist(), inp["seq_lens"].tolist()
    out = torch.full((hi, inp["all_seqblock_q"], topk), -1, dtype=torch.float64)
    u, u32, depth = unit_roundoff(inp["q"].dtype), unit_roundoff(torch.float32), inp["q"].shape[-1]
    ties: dict[tuple[int, int], tuple[list[int], list[int], int]] = {}
    for row, (b, first, end, last_block) in enumerate(_query_blocks(inp)):
        slots = inp["req_to_token"][int(inp["slot_ids"][b]), :seq_lens[b]].long()
        keys = inp["index_k_cache"][slots, 0].double()  # (L, D)
        q = inp["q"][cu[b] + first:cu[b] + end].double()  # (rows, Hi, D)
        scores = torch.einsum("mhd,nd->hmn", q, keys) * inp["scale"]
        seen = torch.arange(seq_lens[b]).view(1, -1) <= (prefix[b] + torch.arange(first, end)).view(-1, 1)
        scores = scores.masked_fill(~seen, float("-inf")).amax(1)  # (Hi, L): max over the block's rows
        n_blocks = last_block + 1  # visible key blocks 0..last_block
        block_max = torch.stack([scores[:, j * bk:(j + 1) * bk].amax(-1) for j in range(n_blocks)], -1)
        # an honest kernel rounds each score to the input dtype at most once after an fp32 dot product
        mag = q.norm(dim=-1).amax(0) * keys.norm(dim=-1).max() * abs(inp["scale"])  # (Hi,) bound on sum |q_d k_d|
        forced = sorted({j for j in range(min(init, n_blocks))} | {j for j in range(last_block - local + 1, n_blocks) if j >= 0})
        for h in range(hi):
            rest = sorted((j for j in range(n_blocks) if j not in forced), key=lambda j: (-float(block_max[h, j]), j))
            chosen = (forced + rest)[:topk]
            out[h, row, :len(chosen)] = torch.tensor(chosen, dtype=torch.float64)
            n_free = topk - len(forced)
            if 0 < n_free < len(rest):
                free = sorted(rest)  # block index order, so exact ties keep the lower index first
                vals = block_max[h, free]
                sure, tied = tie_partition(vals, 2 * (u * vals.abs() + depth * u32 * mag[h]), n_free)
                if tied.any():
                    ties[(h, row)] = (forced + [free[i] for i in sure.nonzero().flatten().tolist()],
                                      [free[i] for i in tied.nonzero().flatten().tolist()], n_free - int(sure.sum()))
    return {"out_topk": TopkSets(out, ties) if ties else out}


@dataclass(frozen=True)
class TopkSets:
    """``out_topk`` with admissible rows: ``ties[(h, row)] = (required, tied, need)``.

    A tied row is admissible when it holds every ``required`` block and ``need`` blocks of
    ``tied``; :meth:`resolve` builds, per tied row, the admissible selection nearest the
    candidate's (its own picks among the tied blocks, topped up in index order).
    """

    base: torch.Tensor
    ties: dict

    @property
    def canonical(self) -> torch.Tensor:
        return self.base

    def resolve(self, actual: torch.Tensor) -> torch.Tensor:
        out = self.base.clone()
        for (h, row), (required, tied, need) in self.ties.items():
            mine = {int(v) for v in actual[h, row].tolist()}
            picks = [t for t in tied if t in mine][:need]
            picks += [t for t in tied if t not in picks][:need - len(picks)]
            chosen = required + picks
            out[h, row] = -1
            out[h, row, :len(chosen)] = torch.tensor(chosen, dtype=out.dtype)
        return out


def _prefill_audit(case: Case, outputs: dict[str, torch.Tensor]) -> list[str]:
    """Hard validity of out_topk: visible indices only, no duplicates, -1 only after valid entries."""
    sel = outputs["out_topk"]
    problems = []
    for row, (b, first, end, last_block) in enumerate(_query_blocks(case.inputs)):
        for h in range(sel.shape[0]):
            cells = sel[h, row].tolist()
            where = f"out_topk[{h}, {row}] (request {b}, query rows {first}..{end - 1})"
            valid = [v for v in cells if v != -1]
            if any(v < 0 or v > last_block for v in valid):
                bad = next(v for v in valid if v < 0 or v > last_block)
                problems.append(f"{where}: block {bad} is not visible (visible blocks 0..{last_block})")
            if len(set(valid)) != len(valid):
                problems.append(f"{where}: duplicate block indices {cells}")
            if -1 in cells and any(v != -1 for v in cells[cells.index(-1):]):
                problems.append(f"{where}: -1 before a valid entry {cells}")
    return problems


def _prefix_ignored(case: Case) -> dict[str, Any] | None:
    """Query row m sees keys n <= m: the causal alignment without the request's prefix."""
    if not bool((case.inputs["prefix_lens"] > 0).any()):
        return None
    shifted = Case({**case.inputs, "prefix_lens": torch.zeros_like(case.inputs["prefix_lens"])}, case.outputs)
    return {n: canonical_expected(v) for n, v in _prefill_reference(shifted).items()}


PREFILL_NEAR_MISSES = (NearMiss("causal alignment without the prefix (row m sees keys n <= m)", _prefix_ignored),)


def _prefill_describe(case: Case) -> CallDescriptor:
    q = case.inputs["q"]
    return CallDescriptor(
        phase="prefill", batch_size=case.inputs["slot_ids"].shape[0], num_tokens=q.shape[0],
        kv_len=case.inputs["max_seqlen_k"], top_k=case.inputs["topk"], block_size=case.inputs["block_size_k"],
        num_q_heads=q.shape[1], num_kv_heads=1, head_dim=q.shape[2], layout="paged_ragged", quant="dense",
    )


def _prefill_traffic(case: Case) -> Traffic:
    """q read, each request's keys before its seq_len read, out_topk written; 2·D flops per
    (head, visible query/key pair)."""
    inp = case.inputs
    q, cache = inp["q"], inp["index_k_cache"]
    seq, prefix = inp["seq_lens"].tolist(), inp["prefix_lens"].tolist()
    pairs = sum((n - p) * p + (n - p) * (n - p + 1) // 2 for n, p in zip(seq, prefix))
    row = cache.shape[-1] * cache.element_size()
    return Traffic(nbytes(q) + sum(seq) * row + output_traffic(case).bytes, 2 * q.shape[1] * q.shape[2] * pairs)


_SCORE_DIMS = {
    name: dict(seq_lens=sl, Hi=hi, D=d, S=s, bs=bs, integer=integer, dup=dup, model=model, cluster=(cluster or [None])[0])
    for name, (sl, hi, d, s, bs, integer, dup, model, *cluster) in _SCORE_SHAPES.items()
}


def _prefill_kv_len(d: dict, n: int) -> dict:
    """Sequences scaled so the longest is ``n`` keys; each query length at most its sequence."""
    seq = [p + q for p, q in zip(d["prefix"], d["q_lens"])]
    new = [max(1, s * n // max(seq)) for s in seq]
    q_lens = tuple(min(q, s) for q, s in zip(d["q_lens"], new))
    return {**d, "q_lens": q_lens, "prefix": tuple(s - q for s, q in zip(new, q_lens))}


def _prefill_tokens(d: dict, n: int) -> dict:
    """Query lengths scaled to ``n`` tokens in all (each at least 1), prefixes kept."""
    total = sum(d["q_lens"])
    q_lens = [max(1, q * n // total) for q in d["q_lens"]]
    q_lens[-1] = max(1, q_lens[-1] + n - sum(q_lens))
    return {**d, "q_lens": tuple(q_lens)}


# Envelope sizes (verify/envelope.py): per-request tuples cycle to a new batch size; key lengths
# scale the requests' sequences along (keys past seq_len stay the far-away decoys).
_SCORE_SIZES = (
    ("batch_size", "seq_lens", lambda d, n: {**d, "seq_lens": cycled(d["seq_lens"], n)}),
    ("kv_len", "S", lambda d, n: {**d, "S": n, "seq_lens": tuple(max(1, s * n // d["S"]) for s in d["seq_lens"])}),
    ("block_size", "bs"), ("num_q_heads", "Hi"), ("head_dim", "D"),
)
_PREFILL_SIZES = (
    ("batch_size", "q_lens", lambda d, n: {**d, "q_lens": cycled(d["q_lens"], n), "prefix": cycled(d["prefix"], n)}),
    ("num_tokens", "q_lens", _prefill_tokens), ("kv_len", "prefix", _prefill_kv_len),
    ("top_k", "topk", lambda d, n: {**d, "topk": max(n, d["init"] + d["local"])}),
    ("block_size", "bk"), ("num_q_heads", "Hi"), ("head_dim", "D"),
)


def _profiles(shapes: dict, adversarial: set[str]) -> tuple[Profile, ...]:
    return tuple(
        Profile(name, dims, dt, model="MiniMax-M3" if name.startswith("minimax") else "generic",
                tags=ADVERSARIAL if name in adversarial else frozenset())
        for name, dims in shapes.items()
        for dt in DTYPES
    )


SLOTS = (
    SlotDef(
        slot=BLOCK_SCORE,
        make_case=_score_case,
        reference=_score_reference,
        # the mean over rows, and every row on its own (a mean alone lets one row's selection be garbage)
        comparator=AllOf((TopKOverlap(k=SCORE_TOPK, min_overlap=0.875, mode="scores"),
                          TopKOverlap(k=SCORE_TOPK, min_overlap=0.75, mode="scores", per_row=True))),
        profiles=_profiles(_SCORE_DIMS, {"single_token_single_block", "ragged_seq_lens",
                                         "ties_integer_duplicated_blocks", "nonpow2_partial_blocks",
                                         "clustered_maxima_boundary_ties"}),
        incumbent=Kernel(builtin.msa_block_score, name="builtin.msa_block_score"),
        describe=_score_describe,
        traffic=_score_traffic,
        near_misses=SCORE_NEAR_MISSES,
        sizes=_SCORE_SIZES,
        draw=_score_draw,
    ),
    SlotDef(
        slot=PREFILL,
        make_case=_prefill_case,
        reference=_prefill_reference,
        # indices mode compares each row's whole selected set; k records the largest topk profiled
        comparator=TopKOverlap(k=max(d["topk"] for d in _PREFILL_SHAPES.values()), min_overlap=0.90,
                               mode="indices", per_row=True),
        profiles=_profiles(_PREFILL_SHAPES, {"single_token_single_request", "ragged_prefix_lens",
                                             "ties_integer_scores", "nonpow2_blocks",
                                             "clustered_maxima_boundary_ties"}),
        incumbent=Kernel(builtin.msa_prefill_block_score, name="builtin.msa_prefill_block_score"),
        describe=_prefill_describe,
        traffic=_prefill_traffic,
        sizes=_PREFILL_SIZES,
        audit=_prefill_audit,
        near_misses=PREFILL_NEAR_MISSES,
        draw=_prefill_draw,
    ),
)
