"""The oracle self-test: every profile of every slot must be able to fail.

For a profile's seeded case the reference is computed once; a battery of trivially wrong answers
is then written as the candidate's outputs (in the outputs' dtypes) and judged exactly as the
referee judges a candidate: each output by the slot's comparator against the admissible
reference nearest it, then the slot's hard audit. Every wrong answer must fail; a profile that
accepts one is a defect of the catalog. No candidate runs: only references.

The battery, per output:

- ``zeros``; ``constant`` (the reference's mean over its finite cells, the best constant answer
  in the least-squares sense); ``copy of NAME`` for each input of the output's shape (or whose
  leading part along the last dimension has it, e.g. silu_and_mul's gate half);
- ``row dropped``: the reference with its smallest-magnitude non-zero row (last dimension; a
  token, or one head of a token) zeroed (for an index output: set to -1), and ``slice dropped``:
  the same along the first dimension for outputs of three or more dimensions;
- ``lower precision``: the reference rounded below the output dtype's contract, without
  exponent-range limits: float32 outputs to bfloat16; float16 to 4 significant bits (the E4M3
  significand); bfloat16 to 3 (the E5M2 significand). A 16-bit tolerance (1e-2 float16, 2e-2
  bfloat16) is an accumulation allowance that admits any rounding whose relative step is below
  it — bfloat16's 2^-8 under float16's 1e-2, and on small outputs E4M3's 3-6% under bfloat16's
  2e-2 — so the meaningful lower precision is the 8-bit format whose step clearly exceeds the
  tolerance. Where the comparator also judges precision in output ulps (an ``AllClose`` with
  ``ulps``: fp32 math with one final cast), a float16 output is also rounded through bfloat16,
  which that judgement must reject. Outputs judged by a low-bit profile's own comparator (profile
  tag ``low_bit``: E2M1 weights or activations on the path, whose noise that comparator must
  admit) are rounded to 1 significant bit, below E2M1's 2, and to every count up to the slot's
  ``low_bit_resolution`` (2 bits for ``moe.fused_experts``' NVFP4 profiles and ``moe.block_tkg``'s MX
  profiles);
- the slot's named near-misses (:class:`kernelslot.slots.base.NearMiss`), all outputs at once.

An answer that is not wrong is skipped with the reason: one equal to the reference in every cell
up to one unit in the last place of the output dtype (the same answer after rounding: e.g.
renormalising routing weights that already sum to 1 within rounding), a near-miss the case does
not exercise, and, for an output judged by its selection only
(``topk_overlap`` over score sheets), an answer whose every row selects what the reference does.

Margin: the largest :attr:`Verdict.margin` over the outputs (worst statistic / allowed bound;
``inf`` when the comparator or the audit rejects it outright). A wrong answer is caught iff its
margin is > 1; the larger, the further it lands from the threshold.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch

from kernelslot.abi.comparators import AllClose, AllOf, TopKOverlap, canonical_expected, resolve_expected
from kernelslot.slots.base import LOW_BIT, Case, Profile, SlotDef
from kernelslot.verify.single.pipeline import clone_case

__all__ = ["WrongAnswer", "ProfileOracle", "oracle_profile", "oracle_slot", "render_oracle", "render_summary", "oracle_json"]

E4M3_SIGNIFICAND_BITS = 4
E5M2_SIGNIFICAND_BITS = 3


@dataclass(frozen=True)
class WrongAnswer:
    """One wrong answer's verdict: ``margin`` > 1 means caught; ``by`` names what caught it."""

    kind: str
    output: str
    margin: float
    by: str  # "compare", "audit" or "" (accepted: a catalog defect)
    detail: str = ""

    @property
    def caught(self) -> bool:
        return self.margin > 1


@dataclass
class ProfileOracle:
    slot: str
    profile: str
    answers: list[WrongAnswer] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, output, why)

    @property
    def accepted(self) -> list[WrongAnswer]:
        return [a for a in self.answers if not a.caught]

    @property
    def min_margin(self) -> float:
        return min((a.margin for a in self.answers), default=float("inf"))


# --------------------------------------------------------------------------- wrong answers

def _row_magnitude(ref: torch.Tensor, dims: int) -> torch.Tensor:
    """RMS over the trailing ``dims`` dimensions (finite cells; index outputs: valid entries)."""
    if not ref.dtype.is_floating_point:
        return (ref != -1).double().flatten(-dims).sum(-1) if ref.dim() else (ref != -1).double()
    r = ref.double().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return r.square().flatten(-dims).mean(-1).sqrt()


def _drop_smallest(ref: torch.Tensor, dims: int) -> tuple[torch.Tensor, str] | None:
    """``ref`` with its smallest non-zero slice over the trailing ``dims`` dimensions dropped."""
    mag = _row_magnitude(ref, dims)
    live = mag > 0
    if not live.any():
        return None
    flat = torch.where(live, mag, torch.full_like(mag, float("inf"))).flatten()
    idx = list(torch.unravel_index(flat.argmin(), mag.shape)) if mag.dim() else []
    out = ref.clone()
    out[tuple(int(i) for i in idx)] = -1 if not ref.dtype.is_floating_point else 0
    return out, f"at {[int(i) for i in idx]}"


def round_significand(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` rounded to ``bits`` significant bits (round half to even), no exponent limits."""
    m, e = torch.frexp(x.double())
    scale = float(2 ** bits)
    rounded = torch.ldexp(torch.round(m * scale) / scale, e)
    return torch.where(torch.isfinite(x), rounded.to(x.dtype), x)


def lower_precision(ref: torch.Tensor, dtype: torch.dtype, low_bit: int = 0,
                    ulps: bool = False) -> Iterator[tuple[torch.Tensor, str]]:
    """The reference rounded below ``dtype``'s contract (see the module docstring): ``low_bit``
    (> 0: the output is judged at a 4-bit path's precision) is the most significant bits its
    comparator must resolve; ``ulps``: the comparator judges precision in output ulps."""
    if low_bit:
        for bits in range(1, low_bit + 1):
            yield round_significand(ref, bits), f"rounded to {bits} significant bit{'s' * (bits > 1)}" + (
                " (below E2M1)" if bits == 1 else " (E2M1's precision)" if bits == 2 else "")
        return
    if dtype in (torch.float32, torch.float64):
        yield ref.to(torch.bfloat16).to(ref.dtype), "rounded to bfloat16"
    elif dtype == torch.bfloat16:
        yield round_significand(ref, E5M2_SIGNIFICAND_BITS), f"rounded to {E5M2_SIGNIFICAND_BITS} significant bits (E5M2)"
    else:
        yield round_significand(ref, E4M3_SIGNIFICAND_BITS), f"rounded to {E4M3_SIGNIFICAND_BITS} significant bits (E4M3)"
        if ulps and dtype == torch.float16:
            yield ref.to(torch.bfloat16).to(ref.dtype), "rounded through bfloat16"


def _input_copies(case: Case, shape: tuple[int, ...], floating: bool) -> Iterator[tuple[str, torch.Tensor]]:
    for name, v in case.inputs.items():
        if not isinstance(v, torch.Tensor) or v.dtype.is_floating_point != floating or v.dim() != len(shape):
            continue
        if tuple(v.shape) == shape:
            yield f"copy of {name}", v
        elif shape and tuple(v.shape[:-1]) == shape[:-1] and v.shape[-1] > shape[-1]:
            yield f"copy of {name}[..., :{shape[-1]}]", v[..., :shape[-1]]


def battery(case: Case, ref: torch.Tensor, dtype: torch.dtype, selection: bool = False,
            low_bit: int = 0, ulps: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """The generic wrong answers for one output (kind, tensor); the caller casts them to ``dtype``.

    ``selection``: the output is a score sheet judged by its selection (adds "every cell -inf",
    nothing selectable); ``low_bit`` and ``ulps``: as for :func:`lower_precision`.
    """
    floating = dtype.is_floating_point
    ref = ref if floating else ref.to(dtype)
    yield "zeros", torch.zeros_like(ref)
    finite = ref[torch.isfinite(ref.double())] if floating else ref[ref != -1]
    if finite.numel():
        c = finite.double().mean()
        yield "constant", torch.full_like(ref, float(c) if floating else int(c.round()))
    if selection:
        yield "every cell -inf", torch.full_like(ref, float("-inf"))
    yield from _input_copies(case, tuple(ref.shape), floating)
    for kind, dims in (("row dropped", 1), ("slice dropped", ref.dim() - 1)):
        if ref.dim() >= (2 if kind == "row dropped" else 3):
            dropped = _drop_smallest(ref, dims)
            if dropped is not None:
                yield f"{kind} {dropped[1]}", dropped[0]
    if floating:
        for wrong, kind in lower_precision(ref, dtype, low_bit, ulps):
            yield kind, wrong


# --------------------------------------------------------------------------- judging

def _selection_only(comparator: Any) -> int | None:
    """The k of a comparator that judges score sheets by their selection only, else None."""
    parts = comparator.parts if isinstance(comparator, AllOf) else (comparator,)
    if all(isinstance(p, TopKOverlap) and p.mode == "scores" for p in parts):
        return max(p.k for p in parts)
    return None


def _low_bit(defn: SlotDef, profile: Profile, output: str) -> int:
    """The significant bits of output rounding ``output``'s comparator must reject where it is a
    low-bit profile's own (:data:`LOW_BIT`; ``SlotDef.low_bit_resolution``), else 0."""
    own = profile.comparator
    judged = LOW_BIT in profile.tags and own is not None and (not isinstance(own, Mapping) or output in own)
    return defn.low_bit_resolution if judged else 0


def _judges_ulps(comparator: Any) -> bool:
    """Whether ``comparator`` (or a part of it) judges precision in output ulps (an ``AllClose`` with ``ulps``)."""
    parts = comparator.parts if isinstance(comparator, AllOf) else (comparator,)
    return any(isinstance(p, AllClose) and p.ulps is not None for p in parts)


def _judge(defn: SlotDef, profile: Profile, case: Case, expected: dict, outputs: dict[str, torch.Tensor]) -> tuple[float, str, str]:
    """(margin, what caught it, description) of ``outputs`` judged as the referee judges a candidate."""
    worst, by, text = 0.0, "", ""
    for name, actual in outputs.items():
        verdict = defn.comparator_for(name, profile).compare(actual, resolve_expected(expected[name], actual))
        if (verdict.margin > 1) == verdict.passed:
            raise RuntimeError(f"{defn.name} {profile.label} {name}: margin {verdict.margin} disagrees with the "
                               f"verdict ({verdict.describe()}): a comparator's margin is inconsistent")
        if verdict.margin >= worst:
            worst, by, text = verdict.margin, ("compare" if not verdict.passed else ""), f"{name}: {verdict.describe()}"
    problems = defn.audit(case, outputs) if defn.audit is not None else []
    if problems:
        return float("inf"), "audit", problems[0]
    return worst, by, text


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan()) if a.dtype.is_floating_point else (a == b)).all())


def _within_an_ulp(a: torch.Tensor, ref: torch.Tensor) -> bool:
    """Every cell equals the reference or its neighbour in the dtype: the same answer after rounding."""
    if not a.dtype.is_floating_point:
        return _same(a, ref)
    close = (a.double() - ref.double()).abs() <= torch.finfo(a.dtype).eps * ref.double().abs()
    return a.shape == ref.shape and bool((close | (a == ref) | (a.isnan() & ref.isnan())).all())


def oracle_profile(defn: SlotDef, profile: Profile, seed: int = 0) -> ProfileOracle:
    """Run the battery on one profile (seeded case ``seed``)."""
    case = defn.make_case(profile, torch.Generator().manual_seed(seed))
    expected = defn.reference(clone_case(case))
    specs = {n: s for n, s in case.outputs.items() if s is not None}
    canon = {n: canonical_expected(expected[n]).to(specs[n].dtype) for n in specs}
    result = ProfileOracle(defn.name, profile.label)

    def judge(kind: str, output: str, outputs: dict[str, torch.Tensor]) -> None:
        if all(_within_an_ulp(outputs[n], canon[n]) for n in specs):
            result.skipped.append((kind, output, "equals the reference (within one ulp of the output dtype)"))
            return
        for n in specs:
            k = _selection_only(defn.comparator_for(n, profile))
            if k is not None and not _same(outputs[n], canon[n]):
                want = resolve_expected(expected[n], outputs[n])
                if TopKOverlap(k, 1.0, per_row=True).compare(outputs[n], want).passed:
                    result.skipped.append((kind, output, "selects what the reference selects (judged by selection)"))
                    return
        margin, by, detail = _judge(defn, profile, case, expected, outputs)
        result.answers.append(WrongAnswer(kind, output, margin, by, detail))

    for name, spec in specs.items():
        ref = canonical_expected(expected[name])
        selection = _selection_only(defn.comparator_for(name, profile)) is not None
        ulps = _judges_ulps(defn.comparator_for(name, profile))
        for kind, wrong in battery(case, ref, spec.dtype, selection, _low_bit(defn, profile, name), ulps):
            judge(kind, name, {**canon, name: wrong.to(spec.dtype)})
    for near in defn.near_misses:
        outs = near.outputs(clone_case(case))
        if outs is None:
            result.skipped.append((f"near-miss: {near.name}", "*", "not exercised by this profile"))
            continue
        judge(f"near-miss: {near.name}", "*", {n: outs[n].to(specs[n].dtype) for n in specs})
    return result


def oracle_slot(defn: SlotDef, seed: int = 0, profiles: tuple[Profile, ...] | None = None) -> list[ProfileOracle]:
    return [oracle_profile(defn, p, seed) for p in (defn.profiles if profiles is None else profiles)]


# --------------------------------------------------------------------------- reports

def _fmt(margin: float) -> str:
    return "inf" if math.isinf(margin) else f"{margin:.3g}"


def render_oracle(defn: SlotDef, results: list[ProfileOracle], verbose: bool = False) -> str:
    """A table: per profile, its smallest margin and the answer that sets it; every answer with ``verbose``."""
    lines = [f"{defn.name}: oracle self-test (margin = worst statistic / allowed bound; > 1 = caught)",
             f"  {'profile':44s} {'answers':>7s} {'min margin':>10s}  closest wrong answer"]
    for r in results:
        closest = min(r.answers, key=lambda a: a.margin, default=None)
        flag = "" if not r.accepted else f"  ACCEPTED {len(r.accepted)}: " + "; ".join(
            f"{a.kind} ({a.output})" for a in r.accepted)
        lines.append(f"  {r.profile:44s} {len(r.answers):7d} {_fmt(r.min_margin):>10s}  "
                     + (f"{closest.kind} [{closest.output}] by {closest.by or 'nothing'}" if closest else "-") + flag)
        if verbose:
            for a in sorted(r.answers, key=lambda a: a.margin):
                lines.append(f"      {_fmt(a.margin):>8s}  {a.kind} [{a.output}] {a.by or 'ACCEPTED'}: {a.detail}")
            for kind, output, why in r.skipped:
                lines.append(f"      {'skip':>8s}  {kind} [{output}]: {why}")
    accepted = sum(len(r.accepted) for r in results)
    smallest = min((r.min_margin for r in results), default=float("inf"))
    lines.append(f"  => {'FAIL' if accepted else 'PASS'}: {sum(len(r.answers) for r in results)} wrong answers, "
                 f"{accepted} accepted; smallest margin {_fmt(smallest)}")
    return "\n".join(lines)


def render_summary(runs: list[tuple[SlotDef, list[ProfileOracle]]]) -> str:
    """A Markdown table: per slot, its smallest margin and the wrong answer and profile that set it."""
    lines = ["| slot | profiles | wrong answers | accepted | smallest margin | closest wrong answer (profile) |",
             "|---|---|---|---|---|---|"]
    for defn, results in runs:
        closest = min(((a, r) for r in results for a in r.answers), key=lambda ar: ar[0].margin, default=None)
        where = f"{closest[0].kind} [{closest[0].output}] ({closest[1].profile})" if closest else "-"
        lines.append(f"| `{defn.name}` | {len(results)} | {sum(len(r.answers) for r in results)} | "
                     f"{sum(len(r.accepted) for r in results)} | "
                     f"{_fmt(closest[0].margin) if closest else '-'} | {where} |")
    return "\n".join(lines)


def oracle_json(defn: SlotDef, results: list[ProfileOracle]) -> dict[str, Any]:
    num = lambda m: None if math.isinf(m) else m  # JSON has no infinity: null = rejected outright
    return {
        "slot": defn.name,
        "passed": not any(r.accepted for r in results),
        "min_margin": num(min((r.min_margin for r in results), default=float("inf"))),
        "profiles": [{
            "profile": r.profile, "min_margin": num(r.min_margin),
            "answers": [{"kind": a.kind, "output": a.output, "margin": num(a.margin), "caught": a.caught,
                         "by": a.by, "detail": a.detail} for a in r.answers],
            "skipped": [{"kind": k, "output": o, "why": w} for k, o, w in r.skipped],
        } for r in results],
    }
