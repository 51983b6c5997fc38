"""Collective slots: ``collective.all_reduce``, ``collective.ar_residual_rmsnorm``,
``collective.moe_finalize_ar_rmsnorm`` and ``moe.fused_experts_reduce``.

Every entry ends with a ``group`` argument (:attr:`Role.GROUP`): the process group to reduce
over. The referee (:mod:`kernelslot.verify.collective`) hands each rank a group made with
``dist.new_group`` — never the default world group.

Rank-varying inputs. A collective case describes *every* rank's call: ``make_case`` returns a
:class:`Case` whose ``meta["per_rank"]`` is a list of :class:`RankShare` (one per rank of the
group, in group-rank order: that rank's inputs and prepare arguments) and ``meta["world"]`` the
group size. ``Case.inputs`` / ``Case.prepare_args`` are rank 0's share (so ``describe`` and
generic tooling see an ordinary case). Shapes depend only on the profile; values on the seed.
Replicated inputs (residual, weight, routing) hold equal values on every rank. The group size is
a profile dimension (``dims["world"]``); profile names end in ``.w2`` / ``.w4``.

References run in the referee's process from all ranks' shares, in fp64, and return fp32 (every
rank's outputs are compared with the same expected tensors). The RMSNorm of the fused slots reads
the residual as rounded to the output dtype: ``out_norm = rmsnorm(round(Σ x + residual))``.
Comparators: ``matched_ratio >= 0.99`` (``>= 0.97`` for ``moe.fused_experts_reduce``) with the
default tolerances of the output dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from kernelslot.abi import Arg, CallDescriptor, MatchedRatio, OutputSpec, Role, Slot, SlotKind
from kernelslot.kernels import collective as builtin
from kernelslot.slots.base import Case, Kernel, NearMiss, Pick, Profile, SlotDef, randn
from kernelslot.slots.moe import route_ids

__all__ = ["RankShare", "rank_shares", "world_of", "SLOTS", "WORLD_SIZES"]

DTYPES = (torch.float32, torch.bfloat16)
WORLD_SIZES = (2, 4)


@dataclass(frozen=True)
class RankShare:
    """One rank's part of a collective case: its entry inputs by name and its prepare arguments."""

    inputs: dict[str, Any]
    prepare_args: tuple = ()


def rank_shares(case: Case) -> list[RankShare]:
    """The per-rank shares of a collective case (group-rank order)."""
    try:
        return case.meta["per_rank"]
    except KeyError:
        raise ValueError("not a collective case: Case.meta has no 'per_rank' list (see kernelslot.slots.collective)") from None


def world_of(profile: Profile) -> int:
    return int(profile.dims["world"])


def _collective_case(shares: list[RankShare], outputs: dict[str, OutputSpec], **meta: Any) -> Case:
    return Case(inputs=shares[0].inputs, outputs=outputs, prepare_args=shares[0].prepare_args,
                meta={"world": len(shares), "per_rank": shares, **meta})


def _rmsnorm64(y: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return y * torch.rsqrt(y.square().mean(-1, keepdim=True) + eps) * weight.double()


def _profiles(shapes: dict[str, dict[str, Any]], adversarial: tuple[str, ...]) -> tuple[Profile, ...]:
    return tuple(
        Profile(f"{name}.w{world}", {**dims, "world": world}, dt,
                tags=frozenset({"adversarial"}) if name.startswith(adversarial) else frozenset())
        for world in WORLD_SIZES
        for name, dims in shapes.items()
        for dt in DTYPES
    )


# ---------------------------------------------------------------- collective.all_reduce

ALL_REDUCE = Slot(
    "collective.all_reduce", SlotKind.COLLECTIVE,
    (Arg("x", Role.INPUT), Arg("out", Role.OUTPUT), Arg("group", Role.GROUP)),
    summary="out = sum over the ranks of group of x",
)

# rank r draws x ~ scale·N(0,1) + offset·(r+1): large, rank-varying magnitudes make a reduction
# in a narrower dtype than the data drift visibly.
_AR_SHAPES = {
    "single_token": {"rows": 1, "hidden": 64, "scale": 1.0, "offset": 0.0},
    "ragged_rows_nonpow2": {"rows": 13, "hidden": 200, "scale": 1.0, "offset": 0.0},
    "decode_batch": {"rows": 8, "hidden": 512, "scale": 1.0, "offset": 0.0},
    "large_rank_varying_magnitude": {"rows": 6, "hidden": 256, "scale": 300.0, "offset": 1000.0},
}


def _ar_case(profile: Profile, gen: torch.Generator) -> Case:
    d = profile.dims
    shares = [RankShare({"x": (randn((d["rows"], d["hidden"]), gen, torch.float32, d["scale"]) + d["offset"] * (r + 1))
                         .to(profile.dtype)}) for r in range(world_of(profile))]
    return _collective_case(shares, {"out": OutputSpec((d["rows"], d["hidden"]), profile.dtype)})


def _ar_reference(case: Case) -> dict[str, torch.Tensor]:
    return {"out": sum(s.inputs["x"].double() for s in rank_shares(case)).float()}


def _ar_describe(case: Case) -> CallDescriptor:
    x = case.inputs["x"]
    return CallDescriptor(num_tokens=x.shape[0], hidden_size=x.shape[-1], world_size=case.meta["world"])


# ---------------------------------------------------------------- collective.ar_residual_rmsnorm

AR_RESIDUAL_RMSNORM = Slot(
    "collective.ar_residual_rmsnorm", SlotKind.COLLECTIVE,
    (Arg("x", Role.INPUT), Arg("residual", Role.INPUT), Arg("weight", Role.INPUT), Arg("eps", Role.SCALAR),
     Arg("out_norm", Role.OUTPUT), Arg("out_residual", Role.OUTPUT), Arg("group", Role.GROUP)),
    summary="out_residual = sum_group(x) + residual; out_norm = rmsnorm(out_residual, weight, eps)",
)

_ARN_SHAPES = {
    "single_token": {"rows": 1, "hidden": 128, "eps": 1e-6},
    "ragged_rows_nonpow2": {"rows": 11, "hidden": 320, "eps": 1e-5},
    "decode_batch": {"rows": 8, "hidden": 512, "eps": 1e-6},
}


def _replicated_norm_inputs(rows: int, hidden: int, gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    residual = randn((rows, hidden), gen, dtype)
    weight = ((randn((hidden,), gen, torch.float32, 0.1) + 1.0) * 0.5).to(dtype)
    return residual, weight


def _arn_case(profile: Profile, gen: torch.Generator) -> Case:
    d = profile.dims
    rows, hidden = d["rows"], d["hidden"]
    residual, weight = _replicated_norm_inputs(rows, hidden, gen, profile.dtype)
    shares = [RankShare({"x": randn((rows, hidden), gen, profile.dtype), "residual": residual.clone(),
                         "weight": weight.clone(), "eps": d["eps"]}) for _ in range(world_of(profile))]
    spec = OutputSpec((rows, hidden), profile.dtype)
    return _collective_case(shares, {"out_norm": spec, "out_residual": spec})


def _residual_norm_reference(summed: torch.Tensor, share: RankShare, out_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out_residual = (summed + share.inputs["residual"].double()).to(out_dtype)
    norm = _rmsnorm64(out_residual.double(), share.inputs["weight"], share.inputs["eps"])
    return {"out_norm": norm.float(), "out_residual": out_residual.float()}


def _arn_reference(case: Case) -> dict[str, torch.Tensor]:
    shares = rank_shares(case)
    summed = sum(s.inputs["x"].double() for s in shares)
    return _residual_norm_reference(summed, shares[0], case.outputs["out_residual"].dtype)


def _norm_describe(case: Case) -> CallDescriptor:
    r = case.inputs["residual"]
    return CallDescriptor(num_tokens=r.shape[0], hidden_size=r.shape[-1], world_size=case.meta["world"])


# ---------------------------------------------------------------- collective.moe_finalize_ar_rmsnorm

MOE_FINALIZE_AR_RMSNORM = Slot(
    "collective.moe_finalize_ar_rmsnorm", SlotKind.COLLECTIVE,
    (Arg("gemm_out", Role.INPUT), Arg("row_map", Role.INPUT), Arg("scales", Role.INPUT), Arg("residual", Role.INPUT),
     Arg("weight", Role.INPUT), Arg("eps", Role.SCALAR), Arg("out_norm", Role.OUTPUT), Arg("out_residual", Role.OUTPUT),
     Arg("group", Role.GROUP)),
    summary="partial[t] = sum_k scales[t,k]·gemm_out[row_map[k·T_exp+t]]; all-reduce; + residual[:T]; rmsnorm",
)

# T live tokens of T_exp expanded ones (head-trimmed when T < T_exp); each rank has its own
# GEMM row layout (a random permutation) and its own scales (zero for experts it does not own).
_MF_SHAPES = {
    "single_token": {"t": 1, "t_exp": 1, "k": 2, "hidden": 64, "eps": 1e-6},
    "decode_full": {"t": 8, "t_exp": 8, "k": 4, "hidden": 256, "eps": 1e-6},
    "head_trimmed_nonpow2": {"t": 5, "t_exp": 9, "k": 3, "hidden": 200, "eps": 1e-5},
}


def _mf_case(profile: Profile, gen: torch.Generator) -> Case:
    d = profile.dims
    t, t_exp, k, hidden = d["t"], d["t_exp"], d["k"], d["hidden"]
    residual, weight = _replicated_norm_inputs(t, hidden, gen, profile.dtype)
    shares = []
    for _ in range(world_of(profile)):
        scales = torch.rand((t_exp, k), generator=gen) * 1.5 + 0.05
        scales = scales * (torch.rand((t_exp, k), generator=gen) > 0.3)  # this rank does not own some experts
        shares.append(RankShare({
            "gemm_out": randn((t_exp * k, hidden), gen, profile.dtype),
            "row_map": torch.randperm(t_exp * k, generator=gen).to(torch.int32),
            "scales": scales,
            "residual": residual.clone(), "weight": weight.clone(), "eps": d["eps"],
        }))
    spec = OutputSpec((t, hidden), profile.dtype)
    return _collective_case(shares, {"out_norm": spec, "out_residual": spec})


def _mf_partials(case: Case, scaled: bool = True, token_major: bool = False) -> torch.Tensor:
    shares = rank_shares(case)
    t = shares[0].inputs["residual"].shape[0]
    summed = torch.zeros(t, shares[0].inputs["gemm_out"].shape[1], dtype=torch.float64)
    for s in shares:
        gemm, row_map, scales = s.inputs["gemm_out"].double(), s.inputs["row_map"].long(), s.inputs["scales"].double()
        t_exp, k = scales.shape
        for tok in range(t):
            for j in range(k):
                row = row_map[tok * k + j] if token_major else row_map[j * t_exp + tok]
                summed[tok] += (scales[tok, j] if scaled else float(scales[tok, j] != 0)) * gemm[row]
    return summed


def _mf_reference(case: Case) -> dict[str, torch.Tensor]:
    return _residual_norm_reference(_mf_partials(case), rank_shares(case)[0], case.outputs["out_residual"].dtype)


# ---------------------------------------------------------------- moe.fused_experts_reduce

FUSED_EXPERTS_REDUCE = Slot(
    "moe.fused_experts_reduce", SlotKind.COLLECTIVE,
    (Arg("x", Role.INPUT), Arg("topk_ids", Role.INPUT), Arg("topk_weights", Role.INPUT), Arg("prepared", Role.PREPARED),
     Arg("out", Role.OUTPUT), Arg("group", Role.GROUP)),
    prepare_args=("w13", "w2"),
    summary="out = sum over the group of each rank's local moe.fused_experts result (silu experts)",
)

# shard: "tp" = every rank holds an I-slice of every expert; "ep" = rank r holds experts
# [r·E/W, (r+1)·E/W) and sees local ids, -1 for the others. ``pad`` -1 entries per row end.
_FE_SHAPES = {
    "tp_decode": {"shard": "tp", "m": 6, "hidden": 64, "inter": 64, "experts": 8, "k": 2, "pad": 0},
    "tp_single_token": {"shard": "tp", "m": 1, "hidden": 48, "inter": 32, "experts": 4, "k": 2, "pad": 0},
    "ep_decode": {"shard": "ep", "m": 7, "hidden": 64, "inter": 32, "experts": 8, "k": 3, "pad": 0},
    "ep_padded_ids": {"shard": "ep", "m": 5, "hidden": 48, "inter": 32, "experts": 8, "k": 3, "pad": 1},
    # structural routing (slots/moe.py route_ids): every token to one hot expert, most experts idle
    "ep_skew_hot_expert": {"shard": "ep", "m": 32, "hidden": 48, "inter": 32, "experts": 8, "k": 2, "pad": 0,
                           "routing": ("hot",)},
}


def _fe_case(profile: Profile, gen: torch.Generator) -> Case:
    d = profile.dims
    world, m, hidden, inter, experts, k = world_of(profile), d["m"], d["hidden"], d["inter"], d["experts"], d["k"]
    x = randn((m, hidden), gen, profile.dtype)
    ids = route_ids(m, experts, k, tuple(d.get("routing", ())), gen)
    if d["pad"]:
        ids[:, k - d["pad"]:] = -1
    weights = torch.rand((m, k), generator=gen) * 1.5 + 0.1
    w13 = randn((experts, 2 * inter, hidden), gen, profile.dtype, hidden ** -0.5)
    w2 = randn((experts, hidden, inter), gen, profile.dtype, inter ** -0.5)
    shares = []
    for r in range(world):
        if d["shard"] == "tp":
            sl = slice(r * inter // world, (r + 1) * inter // world)
            w13_r = torch.cat([w13[:, :inter][:, sl], w13[:, inter:][:, sl]], dim=1).contiguous()
            prep, local_ids = (w13_r, w2[:, :, sl].contiguous()), ids.clone()
        else:
            e_l = experts // world
            mine = (ids >= r * e_l) & (ids < (r + 1) * e_l)
            local_ids = torch.where(mine, ids - r * e_l, torch.full_like(ids, -1))
            prep = (w13[r * e_l:(r + 1) * e_l].clone(), w2[r * e_l:(r + 1) * e_l].clone())
        shares.append(RankShare({"x": x.clone(), "topk_ids": local_ids, "topk_weights": weights.clone()}, prep))
    return _collective_case(shares, {"out": OutputSpec((m, hidden), profile.dtype)}, layout=d["shard"])


def _local_experts64(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One rank's ``Σ_k w·W2[e]·(silu(g)·u)`` in fp64, token by token (ids -1 skipped)."""
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for m in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[m, j])
            if e < 0:
                continue
            gu = w13[e].double() @ x[m].double()
            out[m] += float(weights[m, j]) * (w2[e].double() @ (F.silu(gu[:inter]) * gu[inter:]))
    return out


def _fe_reference(case: Case) -> dict[str, torch.Tensor]:
    total = sum(_local_experts64(s.inputs["x"], s.inputs["topk_ids"], s.inputs["topk_weights"], *s.prepare_args)
                for s in rank_shares(case))
    return {"out": total.float()}


def _fe_wrapped_ids_reference(case: Case) -> dict[str, torch.Tensor] | None:
    """The near-miss that reads id -1 as the last local expert (negative indexing); None without -1 ids."""
    shares = rank_shares(case)
    if not any(bool((s.inputs["topk_ids"] < 0).any()) for s in shares):
        return None
    total = 0
    for s in shares:
        ids = s.inputs["topk_ids"]
        wrapped = torch.where(ids < 0, ids + s.prepare_args[0].shape[0], ids)
        total = total + _local_experts64(s.inputs["x"], wrapped, s.inputs["topk_weights"], *s.prepare_args)
    return {"out": total.float()}


def _fe_unreduced(case: Case) -> dict[str, torch.Tensor]:
    """The near-miss that skips the reduction: rank 0's local result only."""
    s = rank_shares(case)[0]
    return {"out": _local_experts64(s.inputs["x"], s.inputs["topk_ids"], s.inputs["topk_weights"], *s.prepare_args).float()}


def _ar_rank_missing(case: Case) -> dict[str, torch.Tensor]:
    return {"out": sum(s.inputs["x"].double() for s in rank_shares(case)[:-1]).float()}


def _arn_rank_missing(case: Case) -> dict[str, torch.Tensor]:
    shares = rank_shares(case)
    summed = sum(s.inputs["x"].double() for s in shares[:-1])
    return _residual_norm_reference(summed, shares[0], case.outputs["out_residual"].dtype)


def _arn_residual_missing(case: Case) -> dict[str, torch.Tensor]:
    shares = rank_shares(case)
    summed = sum(s.inputs["x"].double() for s in shares)
    no_residual = RankShare({**shares[0].inputs, "residual": torch.zeros_like(shares[0].inputs["residual"])})
    return _residual_norm_reference(summed, no_residual, case.outputs["out_residual"].dtype)


def _mf_scales_ignored(case: Case) -> dict[str, torch.Tensor]:
    """Every owned expert's row summed with weight 1 (the scales read as a mask)."""
    return _residual_norm_reference(_mf_partials(case, scaled=False), rank_shares(case)[0], case.outputs["out_residual"].dtype)


def _mf_token_major(case: Case) -> dict[str, torch.Tensor] | None:
    shares = rank_shares(case)
    if shares[0].inputs["scales"].shape[1] == 1:
        return None
    return _residual_norm_reference(_mf_partials(case, token_major=True), shares[0], case.outputs["out_residual"].dtype)


# Named near-misses: what a candidate making the mistake writes. On a failed comparison the
# collective referee says which one the output matches, so the author learns the cause; the
# oracle self-test requires each to fail the comparator.
_MINUS_ONE = NearMiss("id -1 read as the last local expert (negative indexing); -1 marks an empty slot (engines pad "
                      "with it, and expert-parallel ranks see it for experts they do not hold): it must contribute nothing",
                      _fe_wrapped_ids_reference)
_ONE_RANK_MISSING = "the last rank's contribution missing from the reduction"
NEAR_MISSES: dict[str, tuple[NearMiss, ...]] = {
    "collective.all_reduce": (NearMiss(_ONE_RANK_MISSING, _ar_rank_missing),),
    "collective.ar_residual_rmsnorm": (NearMiss(_ONE_RANK_MISSING, _arn_rank_missing),
                                       NearMiss("residual not added", _arn_residual_missing)),
    "collective.moe_finalize_ar_rmsnorm": (NearMiss("scales ignored (owned experts summed with weight 1)", _mf_scales_ignored),
                                           NearMiss("row_map read token-major (t·K + k, not k·T_exp + t)", _mf_token_major)),
    "moe.fused_experts_reduce": (_MINUS_ONE, NearMiss("no reduction (the local result only)", _fe_unreduced)),
}


def _fe_describe(case: Case) -> CallDescriptor:
    x, ids = case.inputs["x"], case.inputs["topk_ids"]
    w13 = case.prepare_args[0]  # rank 0's shard: local experts and local intermediate size
    return CallDescriptor(num_tokens=x.shape[0], hidden_size=x.shape[1], top_k=ids.shape[1], num_experts=w13.shape[0],
                          intermediate_size=w13.shape[1] // 2, quant="dense", world_size=case.meta["world"],
                          layout=case.meta["layout"])


# Drawn profiles (slots/draw.py): sizes and structure around a base profile; the group size, the
# dtype and the value regime (scale, offset, eps) stay the base's.
def _rows_draw(base: Profile, pick: Pick) -> dict:
    return {"rows": pick.integer(1, 16), "hidden": pick.integer(1, 512)}


def _mf_draw(base: Profile, pick: Pick) -> dict:
    t_exp = pick.integer(1, 12)
    return {"t": pick.integer(1, t_exp), "t_exp": t_exp, "k": pick.integer(1, 4), "hidden": pick.integer(1, 256)}


def _fe_draw(base: Profile, pick: Pick) -> dict:
    world = world_of(base)
    experts = world * pick.integer(1, 4)  # expert-parallel ranks hold E/world experts each
    k = pick.integer(1, min(4, experts))
    return {"shard": pick.choice(("tp", "ep")), "m": pick.integer(1, 32), "hidden": 16 * pick.integer(1, 4),
            "inter": world * 8 * pick.integer(1, 4), "experts": experts, "k": k, "pad": pick.integer(0, k - 1),
            "routing": pick.subset(("hot",))}


def _slot(slot: Slot, make_case: Callable, reference: Callable, ratio: float, shapes: dict, kernel: Kernel,
          describe: Callable, draw: Callable) -> SlotDef:
    return SlotDef(slot=slot, make_case=make_case, reference=reference, comparator=MatchedRatio(ratio),
                   profiles=_profiles(shapes, ("single", "ragged", "large", "head_trimmed", "ep_padded", "ep_skew")),
                   incumbent=kernel, describe=describe, near_misses=NEAR_MISSES[slot.name], draw=draw)


SLOTS = (
    _slot(ALL_REDUCE, _ar_case, _ar_reference, 0.99, _AR_SHAPES,
          Kernel(builtin.all_reduce, name="builtin.all_reduce"), _ar_describe, _rows_draw),
    _slot(AR_RESIDUAL_RMSNORM, _arn_case, _arn_reference, 0.99, _ARN_SHAPES,
          Kernel(builtin.ar_residual_rmsnorm, name="builtin.ar_residual_rmsnorm"), _norm_describe, _rows_draw),
    _slot(MOE_FINALIZE_AR_RMSNORM, _mf_case, _mf_reference, 0.99, _MF_SHAPES,
          Kernel(builtin.moe_finalize_ar_rmsnorm, name="builtin.moe_finalize_ar_rmsnorm"), _norm_describe, _mf_draw),
    _slot(FUSED_EXPERTS_REDUCE, _fe_case, _fe_reference, 0.97, _FE_SHAPES,
          Kernel(builtin.fused_experts_reduce, builtin.prepare_fused_experts_reduce, name="builtin.fused_experts_reduce"),
          _fe_describe, _fe_draw),
)
