"""Target-owned comparators: how a candidate's output is judged against the trusted reference.

Thresholds belong to the slot, never to the bundle. Default elementwise tolerances by the
*output* dtype: float32 1e-5, float16 1e-2, bfloat16 2e-2 (atol = rtol).
A cell matches when ``|a - e| <= atol·s + rtol·|e|``, where ``s = min(1, rms(expected row))``
(the row is the last dimension): the absolute term shrinks with a row of small magnitude, so
zeros (or any wrong answer) on a tiny-magnitude row never hide under a fixed atol, and it is
never larger than the fixed atol. Every tolerance also holds one step of the output dtype's
subnormal grid (``smallest_normal·eps``: bfloat16 9.2e-41, float16 6.0e-8, float32 1.4e-45), so a
reference below what the output dtype can represent (say a float32 reference of 8e-42 for a
bfloat16 output that holds 0) never fails a correctly rounded cell. NaN never matches; matching
infinities of the same sign do, and an infinity matches nothing else.

**Precision in output ulps** (:class:`UlpShare`): where a slot's contract is fp32 math with one
final cast, a 16-bit output must also hold its dtype's precision: few cells may be more than one
unit in the last place from the correctly rounded reference (an error a 1e-2 / 2e-2 tolerance,
an accumulation allowance, would admit: bfloat16 rounding of a float16 output).

**Margin.** Every :class:`Verdict` carries ``margin``: the comparator's worst statistic divided
by the bound it must stay within, so ``margin > 1`` fails and ``margin <= 1`` passes (exactly
``not passed``). Per comparator: allclose, the largest ``|a - e| / tol`` over cells;
matched_ratio, the larger of ``unmatched fraction / (1 - min_ratio)`` and the largest error over
its gross-error bound; cosine, the larger of ``(1 - cos) / (1 - min_cos)`` and
``rel norm err / max_rel_norm_err``; ulp share, ``share of cells off / max_share``; topk_overlap, ``(1 - overlap) / (1 - min_overlap)``; all-of,
the largest of its parts'. NaN/inf where a comparator rejects outright count as ``inf``. The
oracle self-test (``kernelslot.verify.oracle``) reports it for trivially wrong answers. There are no don't-care cells: where the contract leaves a
result open (a routing or selection tie within the dtype path's rounding), the slot's reference
returns an :class:`Admissible` set, and the candidate is judged against the admissible answer
nearest to its own (:func:`resolve_expected`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import torch

DEFAULT_TOL = {torch.float32: 1e-5, torch.float64: 1e-7, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def default_tol(dtype: torch.dtype) -> float:
    return DEFAULT_TOL.get(dtype, 2e-2 if dtype.is_floating_point else 0.0)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    metric: str  # e.g. "matched_ratio"
    value: float
    threshold: float
    detail: str = ""
    margin: float = float("nan")  # worst statistic / its allowed bound: > 1 fails (module docstring)

    def describe(self) -> str:
        op = ">=" if self.passed else "<"
        text = f"{self.metric}={self.value:.6g} ({op} {self.threshold:g})"
        return f"{text}; {self.detail}" if self.detail else text


class Admissible(Protocol):
    """A reference that admits several answers (ties); ``resolve`` picks the one nearest ``actual``."""

    def resolve(self, actual: torch.Tensor) -> torch.Tensor: ...


def resolve_expected(expected: Any, actual: torch.Tensor) -> torch.Tensor:
    """The tensor to judge ``actual`` against: ``expected`` itself, or its admissible answer nearest ``actual``."""
    return expected.resolve(actual) if hasattr(expected, "resolve") else expected


def canonical_expected(expected: Any) -> torch.Tensor:
    """The answer by the contract's own tie rule: ``expected`` itself, or an admissible set's ``canonical``."""
    return expected.canonical if hasattr(expected, "resolve") else expected


@dataclass(frozen=True)
class AnyOfRows:
    """Each row (last dimension) must match the same row of one of ``choices`` (``(A, *shape)``).

    The row nearest to the candidate's (smallest max-abs error, NaN counted as infinite) is chosen;
    the slot's comparator then judges the assembled reference as usual.
    """

    choices: torch.Tensor

    @property
    def canonical(self) -> torch.Tensor:
        return self.choices[0]  # the contract's tie rule comes first

    def resolve(self, actual: torch.Tensor) -> torch.Tensor:
        err = (actual.double().unsqueeze(0) - self.choices.double()).abs().nan_to_num(nan=float("inf"))
        best = err.amax(-1).argmin(0)  # (*rows)
        return self.choices.gather(0, best.unsqueeze(0).unsqueeze(-1).expand(1, *self.choices.shape[1:]))[0]


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of ``dtype``: the relative error of one rounding to it."""
    return torch.finfo(dtype).eps / 2 if dtype.is_floating_point else 0.0


def tie_partition(values: torch.Tensor, band: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which cells of each row (last dimension) of ``values`` an honest top-``k`` selection may pick.

    ``band`` is each value's rounding error. Exact ties keep the contract's order (lower index
    first); unequal values whose intervals ``[v - band, v + band]`` overlap may come out in either
    order. Returns boolean masks ``(sure, tied)``: every admissible selection of a row is its
    ``sure`` cells plus ``k - sure.sum()`` of its ``tied`` cells.
    """
    v, b = values.double(), band.double()
    vj, vi, bj, bi = v.unsqueeze(-1), v.unsqueeze(-2), b.unsqueeze(-1), b.unsqueeze(-2)  # [..., j, i]
    n = v.shape[-1]
    idx = torch.arange(n)
    same = (vj == vi) & (idx.view(-1, 1) < idx.view(1, -1))  # j precedes i in an exact tie
    can_beat = same | ((vj != vi) & (vj + bj > vi - bi))
    surely_beats = same | ((vj != vi) & (vj - bj > vi + bi))
    can_lose = can_beat.sum(-2) >= k
    can_win = surely_beats.sum(-2) < k
    return can_win & ~can_lose, can_win & can_lose


class Comparator(Protocol):
    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict: ...

    def describe(self) -> str: ...


def row_rms(expected: torch.Tensor) -> torch.Tensor:
    """RMS of each row (last dimension) of the reference, inf cells ignored."""
    e = expected.double().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return e.square().mean(-1, keepdim=True).sqrt() if e.dim() else e.abs()


def output_scale(expected: torch.Tensor) -> torch.Tensor:
    """The scale each cell is judged against: its row's rms or the whole output's, whichever is larger.

    A short row (an activation with d = 1, say) holds too few cells to estimate a scale: its rms is
    the cell itself, so an error that is tiny at the output's scale would count at the cell's own."""
    whole = expected.double().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).square().mean().sqrt()
    return row_rms(expected).clamp_min(float(whole))


def row_atol(atol: float, expected: torch.Tensor, scale_up: bool = False) -> torch.Tensor:
    """The absolute tolerance of each row: ``atol·min(1, rms(row))``, or ``atol·rms(row)`` with
    ``scale_up`` (for outputs far from unit scale). Never larger than ``atol`` unless ``scale_up``."""
    rms = row_rms(expected)
    return atol * (rms if scale_up else rms.clamp(max=1.0))


def error_ratio(actual: torch.Tensor, expected: torch.Tensor, tol: float | torch.Tensor) -> torch.Tensor:
    """``|a - e| / tol`` per cell (float64): 0 where both hold the same infinity or the error is
    exactly 0, ``inf`` where ``a`` is NaN, either side is an unmatched infinity, or the error is
    non-zero against a zero tolerance. A cell is within tolerance iff its ratio is <= 1."""
    a, e = actual.double(), expected.double()
    err = (a - e).abs()
    ratio = torch.where(err == 0, torch.zeros_like(err), err / tol)
    same_inf = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
    bad = torch.isnan(a) | torch.isnan(e) | ((torch.isinf(a) | torch.isinf(e)) & ~same_inf)
    inf = torch.full_like(ratio, float("inf"))
    return torch.where(same_inf, torch.zeros_like(ratio), torch.where(bad, inf, ratio.nan_to_num(nan=float("inf"))))


def _bound(ratio: float, limit: float) -> float:
    """``ratio / limit`` with a zero limit read as "any excess fails" (0 stays 0, the rest inf)."""
    if limit > 0:
        return ratio / limit
    return 0.0 if ratio <= 0 else float("inf")


def dtype_resolution(dtype: torch.dtype) -> float:
    """The step of ``dtype``'s subnormal grid (its smallest positive value; 0 for non-float types)."""
    if not dtype.is_floating_point:
        return 0.0
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


def _tolerances(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    tol = default_tol(dtype)
    return (tol if atol is None else atol), (tol if rtol is None else rtol)


def _cell_ratios(actual: torch.Tensor, expected: torch.Tensor, atol: float | None, rtol: float | None,
                 row_scaled_atol: bool = False, floor: float = 0.0) -> torch.Tensor:
    """Each cell's error over its tolerance ``row_atol + rtol·|e| + floor`` (see the module docstring)."""
    a_tol, r_tol = _tolerances(actual.dtype, atol, rtol)
    tol = (row_atol(a_tol, expected, row_scaled_atol) + r_tol * expected.double().abs() + dtype_resolution(actual.dtype)
           + floor)
    return error_ratio(actual, expected, tol)


def _worst(actual: torch.Tensor, expected: torch.Tensor, matched: torch.Tensor) -> str:
    bad = (~matched).nonzero()
    if bad.numel() == 0:
        return ""
    idx = tuple(bad[0].tolist())
    err = (actual.double() - expected.double()).abs()
    err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
    return (
        f"{int((~matched).sum())} of {matched.numel()} cells differ{_rows(matched)}; first at {list(idx)}: "
        f"got {actual[idx].item():.6g}, expected {expected[idx].item():.6g}; max |err| {err.max().item():.3g}"
    )


def _rows(matched: torch.Tensor, shown: int = 8) -> str:
    """``, in 2 of 37 rows: 0, 36`` — the rows (every index but the last dimension's) holding a
    differing cell, the first ``shown`` of them; '' for a tensor of fewer than two dimensions."""
    if matched.dim() < 2:
        return ""
    bad = (~matched).reshape(-1, matched.shape[-1]).any(-1)
    rows = bad.nonzero().flatten().tolist()
    lead = matched.shape[:-1]
    names = [str(r) if len(lead) == 1 else str([int(i) for i in torch.unravel_index(torch.tensor(r), lead)])
             for r in rows[:shown]]
    more = f", +{len(rows) - shown} more" if len(rows) > shown else ""
    return f", in {len(rows)} of {bad.numel()} rows: {', '.join(names)}{more}"


@dataclass(frozen=True)
class AllClose:
    """Every cell within ``atol·min(1, rms(row)) + rtol·|e| + floor``; with ``ulps``, the output's
    precision in its dtype's ulps is judged too (:class:`UlpShare`; reported where it fails).

    ``floor`` is an absolute tolerance for values the slot's fp32 math cannot resolve (e.g. silu's
    σ(x) is 0 in fp32 below x = -88.7, where exp(-x) overflows, while the fp64 reference keeps values
    near 1e-37): far below any value a wrong answer changes, and 0 unless the slot says so."""

    atol: float | None = None
    rtol: float | None = None
    ulps: "UlpShare | None" = None
    floor: float = 0.0

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        r = _cell_ratios(actual, expected, self.atol, self.rtol, floor=self.floor)
        m = r <= 1
        ratio = float(m.double().mean()) if m.numel() else 1.0
        worst = float(r.max()) if r.numel() else 0.0
        verdict = Verdict(bool(m.all()), "allclose", ratio, 1.0, _worst(actual, expected, m), worst)
        if self.ulps is None:
            return verdict
        ulp = self.ulps.compare(actual, expected)
        chosen = ulp if verdict.passed and not ulp.passed else verdict
        return dataclasses.replace(chosen, margin=max(verdict.margin, ulp.margin))

    def describe(self) -> str:
        text = "allclose" + (f"(atol={self.atol}, rtol={self.rtol})" if self.atol is not None else "")
        text += f" (+{self.floor:.3g} absolute)" if self.floor else ""
        return f"{text} and {self.ulps.describe()}" if self.ulps is not None else text


@dataclass(frozen=True)
class MatchedRatio:
    """The fraction of matching cells must reach ``min_ratio``, and no cell may be grossly wrong.

    The ratio leaves room for reordered or low-precision arithmetic, not for skipped work: a cell
    whose error exceeds ``outlier_factor · (atol·min(1, rms) + rtol·rms)`` of its expected row (the
    row is the last dimension) fails the comparison however few such cells there are. Rounding noise stays far
    below that bound; a dropped expert, token or lane does not.
    """

    min_ratio: float
    atol: float | None = None
    rtol: float | None = None
    outlier_factor: float = 8.0
    row_scaled_atol: bool = False  # match with atol × rms(expected row), also above 1: outputs far from unit scale
    # the least atol and rtol whatever the dtype: an ill-conditioned profile's compute-precision floor
    # (attention with logits s² times unit scale: a float32 kernel's rounding grows with them)
    min_tol: float = 0.0

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        m = _cell_ratios(actual, expected, *self._tolerances(actual.dtype), self.row_scaled_atol) <= 1
        ratio = float(m.double().mean()) if m.numel() else 1.0
        gross_ratio = self._gross_ratios(actual, expected)
        margin = max(_bound(1.0 - ratio, 1.0 - self.min_ratio), float(gross_ratio.max()) if gross_ratio.numel() else 0.0)
        bad = gross_ratio > 1
        if bad.any():
            idx = tuple(bad.nonzero()[0].tolist())
            gross = (f"{int(bad.sum())} cell(s) grossly wrong (error > {self.outlier_factor:g}x the row-scaled tolerance); "
                     f"first at {list(idx)}: got {actual[idx].item():.6g}, expected {expected[idx].item():.6g}")
            return Verdict(False, "matched_ratio", ratio, self.min_ratio, gross, margin)
        detail = _worst(actual, expected, m) if ratio < self.min_ratio else ""
        return Verdict(ratio >= self.min_ratio, "matched_ratio", ratio, self.min_ratio, detail, margin)

    def _gross_ratios(self, actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
        """Each cell's error over ``outlier_factor · (atol·min(1, rms) + rtol·rms)`` of its row."""
        atol, rtol = self._tolerances(actual.dtype)
        bound = self.outlier_factor * (row_atol(atol, expected) + rtol * row_rms(expected)) + dtype_resolution(actual.dtype)
        return error_ratio(actual, expected, bound)

    def _tolerances(self, dtype: torch.dtype) -> tuple[float, float]:
        atol, rtol = _tolerances(dtype, self.atol, self.rtol)
        return max(atol, self.min_tol), max(rtol, self.min_tol)

    def describe(self) -> str:
        scaled = ", atol scaled by row rms" if self.row_scaled_atol else ""
        least = f", tolerance at least {self.min_tol:g}" if self.min_tol else ""
        return (f"matched_ratio >= {self.min_ratio} (no cell off by > {self.outlier_factor:g}x row-scaled tolerance"
                f"{scaled}{least})")


ULP_DTYPES = (torch.float16, torch.bfloat16)
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


def float_ordinal(x: torch.Tensor) -> torch.Tensor:
    """Each cell's position on its dtype's grid of representable values (int64): adjacent values
    differ by 1, ``+0`` and ``-0`` are both 0, and the infinities sit one past the largest finite
    values. Defined for float16, bfloat16 and float32."""
    i = x.contiguous().view(_BITS[x.dtype]).long()
    magnitude = i & ((1 << (8 * x.element_size() - 1)) - 1)
    return torch.where(i < 0, -magnitude, magnitude)


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """How many representable values of ``actual.dtype`` lie between each cell of ``actual`` and
    the correctly rounded ``expected`` (float64; ``inf`` where either side is NaN)."""
    rounded = expected.to(actual.dtype)
    dist = (float_ordinal(actual) - float_ordinal(rounded)).abs().double()
    return torch.where(torch.isnan(actual) | torch.isnan(rounded), torch.full_like(dist, float("inf")), dist)


@dataclass(frozen=True)
class UlpShare:
    """At most ``max_share`` of the cells more than ``max_ulps`` ulps of the output dtype from the
    correctly rounded reference (:func:`ulp_distance`); judged on float16 and bfloat16 outputs only.

    For fp32 math rounded once to a 16-bit output, the fp32 error is far below half an ulp, so a
    cell lands on the correctly rounded value or its neighbour; two roundings (an intermediate cast
    to the output dtype, as engine kernels do) stay within one ulp too. A cell whose error is at
    most an eighth of the dtype's unit roundoff times :func:`output_scale` (the larger of its row's
    rms and the whole output's) is not counted: below that scale an fp32 path loses its own resolution (a product that
    underflows in fp32, a subnormal intermediate) without losing the output's precision. float32
    outputs are not judged: there the tolerance (1e-5, about 80 ulps) is an accumulation allowance
    and the dtype's precision is below any honest reduction's error.
    """

    max_share: float
    max_ulps: int = 1

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        if actual.dtype not in ULP_DTYPES:
            return Verdict(True, self.metric, 1.0, 1.0 - self.max_share, f"not judged for {actual.dtype}", 0.0)
        dist = ulp_distance(actual, expected)
        err = (actual.double() - expected.double()).abs().nan_to_num(nan=float("inf"))
        floor = unit_roundoff(actual.dtype) / 8 * output_scale(expected)
        off = (dist > self.max_ulps) & ~(err <= floor)
        share = float(off.double().mean()) if off.numel() else 0.0
        margin = _bound(share, self.max_share)
        detail = ""
        if off.any():
            idx = tuple(off.nonzero()[0].tolist())
            detail = (f"{int(off.sum())} of {off.numel()} cells more than {self.max_ulps} ulp from the correctly rounded "
                      f"reference{_rows(~off)}; first at {list(idx)}: got {actual[idx].item():.6g}, expected "
                      f"{expected[idx].item():.6g} ({dist[idx].item():.0f} ulps)")
        return Verdict(margin <= 1, self.metric, 1.0 - share, 1.0 - self.max_share, detail, margin)

    @property
    def metric(self) -> str:
        return f"within_{self.max_ulps}ulp"

    def describe(self) -> str:
        return f"{self.metric} >= {1 - self.max_share:g} of cells (float16/bfloat16 outputs)"


def row_cosines(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each row (last dimension); 1 where both rows are zero, 0 where one is."""
    a, e = actual.double().reshape(-1, actual.shape[-1]), expected.double().reshape(-1, expected.shape[-1])
    na, ne = a.norm(dim=-1), e.norm(dim=-1)
    cos = (a * e).sum(-1) / (na * ne).clamp_min(1e-300)
    return torch.where((na == 0) & (ne == 0), torch.ones_like(cos), torch.where((na == 0) | (ne == 0), torch.zeros_like(cos), cos))


@dataclass(frozen=True)
class Cosine:
    """Cosine similarity of the flattened tensors, guarded by the relative norm error.

    NaN/inf in the output fail outright; ``| ‖a‖ - ‖e‖ | / ‖e‖`` must stay within
    ``max_rel_norm_err`` so that a correctly-shaped but wrongly-scaled output fails. With
    ``row_min_cos``, every row (last dimension) must also reach that cosine on its own, so a
    dropped or garbled token — invisible in the cosine of a large tensor — fails.
    """

    min_cos: float
    max_rel_norm_err: float = 0.05
    row_min_cos: float | None = None

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        a = actual.double().flatten()
        e = expected.double().flatten()
        inf = float("inf")
        if not torch.isfinite(a).all():
            return Verdict(False, "cosine", float("nan"), self.min_cos, "output holds NaN or inf", inf)
        na, ne = a.norm(), e.norm()
        if ne == 0:
            ok = bool(na == 0)
            return Verdict(ok, "cosine", 1.0 if ok else 0.0, self.min_cos, "" if ok else "expected all zeros",
                           0.0 if ok else inf)
        cos = float((a @ e) / (na * ne).clamp_min(1e-300))
        rel = float((na - ne).abs() / ne)
        margin = max(_bound(1.0 - cos, 1.0 - self.min_cos), _bound(rel, self.max_rel_norm_err))
        if self.row_min_cos is not None and actual.dim():
            rows = row_cosines(actual, expected)
            worst = int(rows.argmin())
            margin = max(margin, _bound(1.0 - float(rows[worst]), 1.0 - self.row_min_cos))
            if float(rows[worst]) < self.row_min_cos:
                return Verdict(False, "cosine", cos, self.min_cos,
                               f"row {worst} cosine {float(rows[worst]):.3g} < {self.row_min_cos}", margin)
        if rel > self.max_rel_norm_err:
            return Verdict(False, "cosine", cos, self.min_cos, f"relative norm error {rel:.3g} > {self.max_rel_norm_err}", margin)
        return Verdict(cos >= self.min_cos, "cosine", cos, self.min_cos, f"relative norm error {rel:.3g}", margin)

    def describe(self) -> str:
        rows = f", every row >= {self.row_min_cos}" if self.row_min_cos is not None else ""
        return f"cosine >= {self.min_cos} (|rel norm err| <= {self.max_rel_norm_err}{rows})"


@dataclass(frozen=True)
class TopKOverlap:
    """Overlap of per-row top-k selections over the last dimension.

    ``mode="scores"``: both tensors are score sheets; a row's selection is its top ``k`` finite
    cells (``-inf`` = not selectable). Ties are honoured: a chosen cell counts as matching when
    its *expected* score reaches the expected k-th best score. ``mode="indices"``: both tensors
    hold selected indices with -1 for unused cells; the overlap is set intersection.
    Each row scores ``|A∩B| / max(|A|, |B|)`` (1 when both are empty); the verdict uses the mean over rows, or the
    minimum when ``per_row``. NaN and +inf in the output are rejected before anything else.
    """

    k: int
    min_overlap: float
    mode: str = "scores"
    per_row: bool = False

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        if actual.dtype.is_floating_point and (torch.isnan(actual).any() or torch.isposinf(actual).any()):
            return Verdict(False, "topk_overlap", 0.0, self.min_overlap, "output holds NaN or +inf", float("inf"))
        a = actual.reshape(-1, actual.shape[-1])
        e = expected.reshape(-1, expected.shape[-1])
        scores = self._rows_scores(a, e) if self.mode == "scores" else self._rows_indices(a, e)
        if scores.numel() == 0:
            return Verdict(True, "topk_overlap", 1.0, self.min_overlap, margin=0.0)
        value = float(scores.min() if self.per_row else scores.mean())
        detail = ""
        if value < self.min_overlap:
            worst = int(scores.argmin())
            detail = f"worst row {worst} overlap {float(scores[worst]):.3g}"
        metric = "topk_overlap(min row)" if self.per_row else "topk_overlap"
        margin = _bound(1.0 - value, 1.0 - self.min_overlap)
        return Verdict(value >= self.min_overlap, metric, value, self.min_overlap, detail, margin)

    def _rows_scores(self, a: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        a = a.double()
        e = e.double()
        k = min(self.k, a.shape[-1])
        valid_e = torch.isfinite(e)
        n_e = valid_e.sum(-1).clamp(max=k)
        a_masked = torch.where(torch.isfinite(a), a, torch.full_like(a, float("-inf")))
        top_a_val, top_a_idx = a_masked.topk(k, dim=-1)
        n_a = torch.isfinite(top_a_val).sum(-1)
        e_masked = torch.where(valid_e, e, torch.full_like(e, float("-inf")))
        top_e_val, _ = e_masked.topk(k, dim=-1)
        kth = top_e_val.gather(-1, (n_e - 1).clamp(min=0).unsqueeze(-1))
        chosen_e = e_masked.gather(-1, top_a_idx)
        hit = (chosen_e >= kth) & torch.isfinite(chosen_e) & torch.isfinite(top_a_val)
        hits = hit.sum(-1).clamp(max=n_e)
        denom = torch.maximum(n_a, n_e)
        # a row where neither side can select anything agrees perfectly
        return torch.where(denom == 0, 1.0, hits.double() / denom.clamp(min=1).double())

    def _rows_indices(self, a: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        out = []
        for ra, re in zip(a.tolist(), e.tolist()):
            sa = {v for v in ra if v != -1}
            se = {v for v in re if v != -1}
            out.append(len(sa & se) / max(len(sa), len(se)) if sa or se else 1.0)
        return torch.tensor(out, dtype=torch.float64)

    def describe(self) -> str:
        row = "per-row " if self.per_row else ""
        return f"{row}topk_overlap(k={self.k}, {self.mode}) >= {self.min_overlap}"


@dataclass(frozen=True)
class AllOf:
    """Every comparator must pass; the reported verdict is the first failure (or the last pass),
    with the largest margin of all the parts."""

    parts: tuple

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        verdicts = [part.compare(actual, expected) for part in self.parts]
        chosen = next((v for v in verdicts if not v.passed), verdicts[-1])
        return dataclasses.replace(chosen, margin=max(v.margin for v in verdicts))

    def describe(self) -> str:
        return " and ".join(p.describe() for p in self.parts)
