"""Target-owned comparators: how a candidate's output is judged against the trusted reference.

Thresholds belong to the slot, never to the bundle. Default elementwise tolerances by the
*output* dtype: float32 1e-5, float16 1e-2, bfloat16 2e-2 (atol = rtol).
A cell matches when ``|a - e| <= atol + rtol·|e|``; NaN never matches, and matching
infinities of the same sign do. There are no don't-care cells: where the contract leaves a
result open (a routing or selection tie within the dtype path's rounding), the slot's reference
returns an :class:`Admissible` set, and the candidate is judged against the admissible answer
nearest to its own (:func:`resolve_expected`).
"""
from __future__ import annotations

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


@dataclass(frozen=True)
class AnyOfRows:
    """Each row (last dimension) must match the same row of one of ``choices`` (``(A, *shape)``).

    The row nearest to the candidate's (smallest max-abs error, NaN counted as infinite) is chosen;
    the slot's comparator then judges the assembled reference as usual.
    """

    choices: torch.Tensor

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


def _matched(actual: torch.Tensor, expected: torch.Tensor, atol: float | torch.Tensor, rtol: float) -> torch.Tensor:
    """Cells within ``atol + rtol·|e|`` (NaN on either side never matches)."""
    a = actual.double()
    e = expected.double()
    close = (a - e).abs() <= atol + rtol * e.abs()
    same_inf = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
    return (close | same_inf) & ~torch.isnan(a)


def _matched_ratio(actual: torch.Tensor, expected: torch.Tensor, atol: float | None, rtol: float | None,
                   row_scaled_atol: bool = False) -> tuple[torch.Tensor, float]:
    """The per-cell match mask at the given (or the dtype's default) tolerances, and the matched fraction."""
    tol = default_tol(actual.dtype)
    atol_t: float | torch.Tensor = tol if atol is None else atol
    if row_scaled_atol:
        atol_t = atol_t * row_rms(expected).clamp(min=1.0)
    m = _matched(actual, expected, atol_t, tol if rtol is None else rtol)
    return m, float(m.double().mean()) if m.numel() else 1.0


def _worst(actual: torch.Tensor, expected: torch.Tensor, matched: torch.Tensor) -> str:
    bad = (~matched).nonzero()
    if bad.numel() == 0:
        return ""
    idx = tuple(bad[0].tolist())
    err = (actual.double() - expected.double()).abs()
    err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
    return (
        f"{int((~matched).sum())} of {matched.numel()} cells differ; first at {list(idx)}: "
        f"got {actual[idx].item():.6g}, expected {expected[idx].item():.6g}; max |err| {err.max().item():.3g}"
    )


@dataclass(frozen=True)
class AllClose:
    """Every cell within ``atol + rtol·|e|``."""

    atol: float | None = None
    rtol: float | None = None

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        m, ratio = _matched_ratio(actual, expected, self.atol, self.rtol)
        return Verdict(bool(m.all()), "allclose", ratio, 1.0, _worst(actual, expected, m))

    def describe(self) -> str:
        return "allclose" + (f"(atol={self.atol}, rtol={self.rtol})" if self.atol is not None else "")


@dataclass(frozen=True)
class MatchedRatio:
    """The fraction of matching cells must reach ``min_ratio``, and no cell may be grossly wrong.

    The ratio leaves room for reordered or low-precision arithmetic, not for skipped work: a cell
    whose error exceeds ``outlier_factor · (atol + rtol · rms(expected row))`` (the row is the last
    dimension) fails the comparison however few such cells there are. Rounding noise stays far
    below that bound; a dropped expert, token or lane does not.
    """

    min_ratio: float
    atol: float | None = None
    rtol: float | None = None
    outlier_factor: float = 8.0
    row_scaled_atol: bool = False  # atol × max(1, rms(expected row)): for outputs far from unit scale

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        m, ratio = _matched_ratio(actual, expected, self.atol, self.rtol, self.row_scaled_atol)
        gross = self._gross_errors(actual, expected)
        if gross:
            return Verdict(False, "matched_ratio", ratio, self.min_ratio, gross)
        detail = _worst(actual, expected, m) if ratio < self.min_ratio else ""
        return Verdict(ratio >= self.min_ratio, "matched_ratio", ratio, self.min_ratio, detail)

    def _gross_errors(self, actual: torch.Tensor, expected: torch.Tensor) -> str:
        if actual.numel() == 0:
            return ""
        tol = default_tol(actual.dtype)
        atol = tol if self.atol is None else self.atol
        rtol = tol if self.rtol is None else self.rtol
        a, e = actual.double(), expected.double()
        rms = row_rms(expected)
        bound = self.outlier_factor * (atol + rtol * rms)
        err = (a - e).abs()
        ignore = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
        err = torch.where(ignore, torch.zeros_like(err), err)
        bad = ~(err <= bound)  # NaN errors count as gross
        if not bad.any():
            return ""
        idx = tuple(bad.nonzero()[0].tolist())
        return (f"{int(bad.sum())} cell(s) grossly wrong (error > {self.outlier_factor:g}x the row-scaled tolerance); "
                f"first at {list(idx)}: got {actual[idx].item():.6g}, expected {expected[idx].item():.6g}")

    def describe(self) -> str:
        scaled = ", atol scaled by row rms" if self.row_scaled_atol else ""
        return f"matched_ratio >= {self.min_ratio} (no cell off by > {self.outlier_factor:g}x row-scaled tolerance{scaled})"


@dataclass(frozen=True)
class Cosine:
    """Cosine similarity of the flattened tensors, guarded by the relative norm error.

    NaN/inf in the output fail outright; ``| ‖a‖ - ‖e‖ | / ‖e‖`` must stay within
    ``max_rel_norm_err`` so that a correctly-shaped but wrongly-scaled output fails.
    """

    min_cos: float
    max_rel_norm_err: float = 0.05

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        a = actual.double().flatten()
        e = expected.double().flatten()
        if not torch.isfinite(a).all():
            return Verdict(False, "cosine", float("nan"), self.min_cos, "output holds NaN or inf")
        na, ne = a.norm(), e.norm()
        if ne == 0:
            ok = bool(na == 0)
            return Verdict(ok, "cosine", 1.0 if ok else 0.0, self.min_cos, "" if ok else "expected all zeros")
        cos = float((a @ e) / (na * ne).clamp_min(1e-300))
        rel = float((na - ne).abs() / ne)
        if rel > self.max_rel_norm_err:
            return Verdict(False, "cosine", cos, self.min_cos, f"relative norm error {rel:.3g} > {self.max_rel_norm_err}")
        return Verdict(cos >= self.min_cos, "cosine", cos, self.min_cos, f"relative norm error {rel:.3g}")

    def describe(self) -> str:
        return f"cosine >= {self.min_cos} (|rel norm err| <= {self.max_rel_norm_err})"


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
            return Verdict(False, "topk_overlap", 0.0, self.min_overlap, "output holds NaN or +inf")
        a = actual.reshape(-1, actual.shape[-1])
        e = expected.reshape(-1, expected.shape[-1])
        scores = self._rows_scores(a, e) if self.mode == "scores" else self._rows_indices(a, e)
        if scores.numel() == 0:
            return Verdict(True, "topk_overlap", 1.0, self.min_overlap)
        value = float(scores.min() if self.per_row else scores.mean())
        detail = ""
        if value < self.min_overlap:
            worst = int(scores.argmin())
            detail = f"worst row {worst} overlap {float(scores[worst]):.3g}"
        metric = "topk_overlap(min row)" if self.per_row else "topk_overlap"
        return Verdict(value >= self.min_overlap, metric, value, self.min_overlap, detail)

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
    """Every comparator must pass; the reported verdict is the first failure (or the last pass)."""

    parts: tuple

    def compare(self, actual: torch.Tensor, expected: torch.Tensor) -> Verdict:
        verdict = None
        for part in self.parts:
            verdict = part.compare(actual, expected)
            if not verdict.passed:
                return verdict
        return verdict

    def describe(self) -> str:
        return " and ".join(p.describe() for p in self.parts)
