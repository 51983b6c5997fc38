"""moe.fused_experts: the local expert computation behind a prepare/forward split.

``prepare(w13, w2) -> prepared`` once at load (or ``prepare("nvfp4_layer", view)`` on the NVFP4
profile, ``view`` a :class:`~kernelslot.formats.Nvfp4MoeLayer`); ``w13 (E, 2I, H)`` holds per expert
the gate rows then the up rows, ``w2 (E, H, I)``, both in the profile's dtype.
``entry(x, topk_ids, topk_weights, prepared, out)``: ``x (M, H)``, ``topk_ids`` int32 ``(M, K)``
(expert ids, -1 = a remote expert), ``topk_weights`` float32 ``(M, K)``, ``out (M, H)``:
``out[m] = Σ_k w[m,k]·W2[e]·act(W13[e]·x[m])`` with ``e = topk_ids[m,k]``; ids of -1 contribute
nothing; ``topk_weights`` are raw positive multipliers (rows need not sum to 1; a K=1 weight
need not be 1). ``act`` is the model's (SiLU for generic, swigluoai for MiniMax-M3).

Routing structure (``dims["routing"]``, a tuple of kinds; docs/referee.md "Structural inputs"):
``hot`` sends every token to one expert (its first id), the other ids from a few experts only, so
most experts get no tokens; ``repeat`` repeats a token's first id in another of its K slots (the
sum over k counts it twice); ``dominant`` puts all but a 1e-4 share of a row's weight on one of its
K ids. A kernel that assumes balanced routing (a per-expert capacity) fails the hot profiles.

Comparators: matched_ratio ≥ 0.97 for dense weights. The NVFP4 profile's reference dequantises
the view independently and computes in fp32, so an honest candidate differs only by its
activation rounding and summation order: it must reach cosine ≥ 0.999 with the relative norm
error within 1%, and matched_ratio ≥ 0.90 at the dtype's tolerance. A candidate that drops the
block scales or the outer scale fails the cosine or the norm guard.
"""
from __future__ import annotations

import torch

from kernelslot.abi import (AllOf, Arg, CallDescriptor, CapabilityDomain, Cosine, MatchedRatio, OutputSpec, PermuteTokens, Role,
                           ScaleLinear, Slot, SlotKind)
from kernelslot.formats import dequantize_moe_layer_nvfp4, quantize_moe_layer_nvfp4
from kernelslot.kernels import moe as builtin
from kernelslot.kernels.experts_spec import ExpertActivation
from kernelslot.slots.base import (LOW_BIT, Candidate, Case, Kernel, NearMiss, Pick, Profile, SlotDef, Traffic,
                                   multiple_of, nbytes, output_traffic, randn)
from kernelslot.slots.models import model_profile
from kernelslot.slots.triton_variants import superseded_by, triton_variant

_F32_BF16 = (torch.float32, torch.bfloat16)

FUSED_EXPERTS = Slot(
    "moe.fused_experts",
    SlotKind.BLOCK,
    (Arg("x", Role.INPUT), Arg("topk_ids", Role.INPUT, doc="expert ids; -1 = not on this rank, contributes nothing"),
     Arg("topk_weights", Role.INPUT, doc="raw positive multipliers (rows need not sum to 1)"),
     Arg("prepared", Role.PREPARED), Arg("out", Role.OUTPUT)),
    prepare_args=("w13", "w2"),
    summary="out[m] = sum_k w[m,k] * W2[e] act(W13[e] x[m]); -1 ids contribute nothing; raw weights",
)

# The reference dequantises the same NVFP4 weights and computes in fp32, so an honest kernel differs by the
# I/O dtype's rounding and accumulation order only; an output rounded to 2 significant bits (E2M1's
# precision) lands at oracle margin 5.7-7.6 (bf16/fp16) and above 2000 (fp32): low_bit_resolution 2.
NVFP4_COMPARATOR = AllOf((Cosine(0.999, 0.01), MatchedRatio(0.90)))

# name: (M, E, K, H, I, minus_one_fraction, weight range, x scale, model, quant[, routing, dtypes])
_PROFILES = {
    "decode_t1_k1_raw_weight": (1, 4, 1, 64, 32, 0.0, (0.2, 0.6), 1.0, "generic", "dense"),
    "ragged_batch_nonpow2": (13, 6, 2, 96, 80, 0.0, (0.1, 3.0), 1.0, "generic", "dense"),
    "ep_shard_minus_one": (9, 8, 4, 64, 48, 0.35, (0.1, 1.0), 1.0, "generic", "dense"),
    "decode_t1_ep_minus_one": (1, 8, 4, 64, 32, 0.5, (0.1, 1.0), 1.0, "generic", "dense"),
    "large_batch_ep": (96, 16, 4, 128, 64, 0.2, (0.1, 2.0), 1.0, "generic", "dense"),
    "all_ids_minus_one_rows": (6, 4, 2, 64, 32, 1.0, (0.1, 1.0), 1.0, "generic", "dense"),
    "minimax_swigluoai_clamped": (7, 8, 4, 128, 64, 0.0, (0.05, 0.5), 4.0, "MiniMax-M3", "dense"),
    "minimax_nvfp4": (5, 6, 4, 128, 64, 0.0, (0.05, 0.5), 1.0, "MiniMax-M3", "nvfp4"),
    # structural routing: a hot expert takes every token (16x a balanced share), most experts idle
    "skew_hot_expert_empty_experts": (64, 16, 4, 64, 32, 0.0, (0.1, 1.0), 1.0, "generic", "dense", ("hot",), _F32_BF16),
    "skew_all_tokens_one_expert_k1": (40, 8, 1, 64, 32, 0.0, (0.2, 0.6), 1.0, "generic", "dense", ("hot",), _F32_BF16),
    "repeated_ids_dominant_weight": (12, 8, 4, 64, 32, 0.2, (0.1, 2.0), 1.0, "generic", "dense",
                                     ("repeat", "dominant"), _F32_BF16),
    "minimax_skew_hot_expert": (48, 8, 4, 128, 64, 0.0, (0.05, 0.5), 4.0, "MiniMax-M3", "dense",
                                ("hot", "dominant"), (torch.bfloat16,)),
}
ROUTINGS = ("hot", "repeat", "dominant")  # the routing structures make_case knows (module docstring)


def route_ids(m: int, e: int, k: int, routing: tuple[str, ...], gen: torch.Generator) -> torch.Tensor:
    """``topk_ids (M, K)`` int32 with the profile's routing structure (distinct ids per row unless ``repeat``)."""
    if "hot" not in routing:
        ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(m)])
    else:  # every token's first id is one hot expert; the rest come from k of the other experts
        perm = torch.randperm(e, generator=gen)
        hot, few = perm[0], perm[1:1 + max(k, 1)]
        rest = [few[torch.randperm(len(few), generator=gen)[:k - 1]] for _ in range(m)]
        ids = torch.stack([torch.cat([hot.view(1), r]) for r in rest])
        ids = ids.gather(1, torch.stack([torch.randperm(k, generator=gen) for _ in range(m)]))  # hot at any k
    if "repeat" in routing and k >= 2:
        col = torch.randint(1, k, (m,), generator=gen)
        ids[torch.arange(m), col] = ids[:, 0].clone()  # the source must not alias the destination
    return ids.to(torch.int32)


def _make_case(profile: Profile, gen: torch.Generator) -> Case:
    m, e, k, h, i, drop, (wlo, whi), xscale, _, quant = (profile.dims[n] for n in (
        "M", "E", "K", "H", "I", "drop", "wrange", "xscale", "model", "quant"))
    routing = tuple(profile.dims.get("routing", ()))
    dt = profile.dtype
    x = randn((m, h), gen, dt, xscale)
    ids = route_ids(m, e, k, routing, gen)
    if drop >= 1.0:
        ids[::2] = -1  # every other row routes nowhere (fully remote tokens)
    elif drop > 0:
        ids[torch.rand(m, k, generator=gen) < drop] = -1
        ids[0, -1] = -1  # at least one remote expert, whatever the draw
    weights = (torch.rand(m, k, generator=gen) * (whi - wlo) + wlo).float()
    if "dominant" in routing and k >= 2:  # one of K carries the weight; the others a 1e-4 share
        top = torch.randint(0, k, (m,), generator=gen)
        weights = torch.where(torch.arange(k).view(1, k) == top.view(m, 1), weights, weights * 1e-4)
    w13 = randn((e, 2 * i, h), gen, torch.float32, h ** -0.5)
    w2 = randn((e, h, i), gen, torch.float32, i ** -0.5)
    meta = {"activation": model_profile(profile.model).activation}
    if quant == "nvfp4":
        view = quantize_moe_layer_nvfp4(w13, w2, generator=gen)
        prepare_args = ("nvfp4_layer", view)
    else:
        prepare_args = (w13.to(dt), w2.to(dt))
    return Case(
        inputs={"x": x, "topk_ids": ids, "topk_weights": weights},
        outputs={"out": OutputSpec((m, h), dt)},
        prepare_args=prepare_args,
        live=("x", "topk_ids", "topk_weights"),
        meta=meta,
    )


def _draw(base: Profile, pick: Pick) -> dict:
    """Batch, experts, K, sizes, -1 share and routing structure around ``base`` (same dtype, model,
    quant; NVFP4 keeps its 16-aligned H and I)."""
    e = pick.integer(2, 16)
    dims = {"M": pick.integer(1, 96), "E": e, "K": pick.integer(1, min(4, e)),
            "drop": pick.choice((0.0, 0.0, 0.25, 0.5, 1.0)), "routing": pick.subset(ROUTINGS)}
    if base.dims["quant"] == "dense":
        dims.update(H=16 * pick.integer(1, 12), I=16 * pick.integer(1, 8))
    return dims


def _act_reference(g: torch.Tensor, u: torch.Tensor, act) -> torch.Tensor:
    if act.kind == "swigluoai":
        limit = act.gate_clamp[1]
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
        return g * torch.sigmoid(act.alpha * g) * (u + 1.0)
    if act.kind == "silu":
        return torch.nn.functional.silu(g) * u
    raise ValueError(f"no reference for activation {act.kind}")


def _reference(case: Case, activation=None, ids: torch.Tensor | None = None,
               weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """fp64 loop over tokens and routed slots; the keywords substitute parts (near-misses only)."""
    a, b = case.prepare_args
    w13, w2 = dequantize_moe_layer_nvfp4(b) if isinstance(a, str) else (a, b)
    w13, w2 = w13.double(), w2.double()
    x = case.inputs["x"].double()
    ids = case.inputs["topk_ids"] if ids is None else ids
    weights = (case.inputs["topk_weights"] if weights is None else weights).double()
    act = case.meta["activation"] if activation is None else activation
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for m in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[m, j])
            if e < 0:
                continue
            gu = w13[e] @ x[m]
            out[m] += weights[m, j] * (w2[e] @ _act_reference(gu[:inter], gu[inter:], act))
    return {"out": out.float()}


def _minus_one_as_last_expert(case: Case) -> dict[str, torch.Tensor] | None:
    ids = case.inputs["topk_ids"]
    if not bool((ids < 0).any()):
        return None
    return _reference(case, ids=torch.where(ids < 0, ids + _num_experts(case), ids))


def _renormalised(case: Case) -> dict[str, torch.Tensor]:
    w = case.inputs["topk_weights"].double() * (case.inputs["topk_ids"] >= 0)
    return _reference(case, weights=w / w.sum(-1, keepdim=True).clamp_min(1e-30))


def _silu_for_swigluoai(case: Case) -> dict[str, torch.Tensor] | None:
    if case.meta["activation"].kind != "swigluoai":
        return None
    return _reference(case, activation=ExpertActivation("silu"))


def _last_slot_skipped(case: Case) -> dict[str, torch.Tensor]:
    """The routed-slot loop one short: every token's last (k = K-1) contribution missing."""
    ids = case.inputs["topk_ids"].clone()
    ids[:, -1] = -1
    return _reference(case, ids=ids)


def _num_experts(case: Case) -> int:
    a, b = case.prepare_args
    return b.num_experts if isinstance(a, str) else a.shape[0]


NEAR_MISSES = (
    NearMiss("-1 read as the last expert (negative indexing)", _minus_one_as_last_expert),
    NearMiss("routing weights renormalised to sum 1 (the slot passes raw weights)", _renormalised),
    NearMiss("SiLU for swigluoai", _silu_for_swigluoai),
    NearMiss("the last routed slot skipped (loop over k one short)", _last_slot_skipped),
)


def _describe(case: Case) -> CallDescriptor:
    a, b = case.prepare_args
    x, ids = case.inputs["x"], case.inputs["topk_ids"]
    quant = "nvfp4" if isinstance(a, str) else "dense"
    e = b.num_experts if quant == "nvfp4" else a.shape[0]
    inter = b.intermediate_size if quant == "nvfp4" else b.shape[2]
    return CallDescriptor(phase="decode", num_tokens=x.shape[0], batch_size=x.shape[0], top_k=ids.shape[1],
                          hidden_size=x.shape[1], intermediate_size=inter, num_experts=e, quant=quant)


def _traffic(case: Case) -> Traffic:
    """x, ids and weights read, out written, and (dense weights) every routed expert's w13 and w2
    (a prepared weight counts: each call reads the experts its tokens route to); 6·H·I flops per
    routed (token, expert) pair."""
    a, b = case.prepare_args
    x, ids = case.inputs["x"], case.inputs["topk_ids"]
    used = {e for e in ids.flatten().tolist() if e >= 0}
    h, inter = x.shape[1], (b.intermediate_size if isinstance(a, str) else b.shape[2])
    experts = 0 if isinstance(a, str) else len(used) * (a[0].numel() * a.element_size() + b[0].numel() * b.element_size())
    fixed = nbytes(x, ids, case.inputs["topk_weights"]) + output_traffic(case).bytes
    return Traffic(fixed + experts, 6 * h * inter * int((ids >= 0).sum()))


def _width(key: str):
    """A fit for H or I: NVFP4 weights quantise in blocks of 16 (kept a multiple of 32)."""
    return lambda d, n: {**d, key: multiple_of(n, 32) if d["quant"] == "nvfp4" else n}


# Envelope sizes (verify/envelope.py); top_k stays at most num_experts.
_SIZES = (("num_tokens", "M"), ("top_k", "K", lambda d, n: {**d, "K": n, "E": max(d["E"], n)}),
          ("num_experts", "E", lambda d, n: {**d, "E": n, "K": min(d["K"], n)}),
          ("hidden_size", "H", _width("H")), ("intermediate_size", "I", _width("I")))


def _profiles() -> tuple[Profile, ...]:
    out = []
    for name, (m, e, k, h, i, drop, wr, xs, model, quant, *more) in _PROFILES.items():
        routing, dtypes = more if more else ((), (torch.float32, torch.bfloat16, torch.float16))
        for dt in dtypes:
            out.append(Profile(
                name, {"M": m, "E": e, "K": k, "H": h, "I": i, "drop": drop, "wrange": wr, "xscale": xs,
                       "model": model, "quant": quant, "routing": routing},
                dt, model=model, tags=(frozenset({"adversarial"}) if drop or m == 1 or m % 2 or routing else frozenset())
                | (frozenset({LOW_BIT}) if quant == "nvfp4" else frozenset()),
                comparator=NVFP4_COMPARATOR if quant == "nvfp4" else None,
            ))
    return tuple(out)


SILU_KERNEL = Kernel(builtin.fused_experts_silu, builtin.prepare, name="builtin.fused_experts[silu]")
SWIGLUOAI_KERNEL = Kernel(builtin.fused_experts_swigluoai, builtin.prepare, name="builtin.fused_experts[swigluoai]")
SILU_MODELS = CapabilityDomain.from_mapping({"model": {"one_of": ["generic", "qwen3-moe"]}})
SWIGLUOAI_MODELS = CapabilityDomain.from_mapping({"model": {"one_of": ["MiniMax-M3", "gpt-oss"]}})
TRITON_SILU = triton_variant("moe", "fused_experts_silu", "prepare", name="triton.fused_experts[silu]", domain=SILU_MODELS,
                             graph_safe=True)
TRITON_SWIGLUOAI = triton_variant("moe", "fused_experts_swigluoai", "prepare", name="triton.fused_experts[swigluoai]",
                                  domain=SWIGLUOAI_MODELS, graph_safe=True)

SLOTS = (
    SlotDef(
        slot=FUSED_EXPERTS,
        make_case=_make_case,
        reference=_reference,
        comparator=MatchedRatio(0.97),
        profiles=_profiles(),
        incumbent=SILU_KERNEL,
        describe=_describe,
        traffic=_traffic,
        near_misses=NEAR_MISSES,
        sizes=_SIZES,
        relations=(PermuteTokens(("x", "topk_ids", "topk_weights"), ("out",)), ScaleLinear("topk_weights", ("out",))),
        draw=_draw,
        low_bit_resolution=2,
        builtins=(
            TRITON_SILU,
            TRITON_SWIGLUOAI,
            Candidate(SILU_KERNEL, SILU_MODELS, needs=superseded_by(TRITON_SILU)),
            Candidate(SWIGLUOAI_KERNEL, SWIGLUOAI_MODELS, needs=superseded_by(TRITON_SWIGLUOAI)),
        ),
    ),
)
