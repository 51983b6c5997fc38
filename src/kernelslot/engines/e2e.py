"""End-to-end qualification inside transformers: pristine model vs the model with kernelslot.

One run (``run_e2e``): build the model class with seeded random weights in fp32, sharpen the
LM head so the pristine next-token distribution has the stated mean entropy (random init gives
near-uniform logits that make KL blind), then on the same weights and prompts run

- ``pristine``: the model in dtype D with its own (``eager``) experts code, prefill + greedy
  decode; its greedy tokens are the teacher-forced tokens of every other run;
- ``candidate``: the same model with :func:`install` (the built-ins, or a bundle's candidates);
- in bf16/fp16 also the stock floor: the other stock implementations of the same model in D
  (transformers' ``batched_mm`` and ``grouped_mm`` experts, eager instead of sdpa attention)
  and the same D-rounded weights computed in fp32 (``fp32``). Stock experts paths often agree
  bit for bit in bf16, so the fp32-compute pair is what makes the floor non-zero for a
  kernel that accumulates in fp32.

Reported: per-layer relative error of the prefill hidden states, KL(pristine ‖ candidate) over
the full vocabulary at every prefill and decode position (mean, p99, max), margin-gated argmax
flips, greedy agreement and first divergence (teacher-forced: the first step where the
candidate's argmax differs from the pristine token), and the installation's counters.

The gate (:data:`GATE`): fp32 — mean KL ≤ 1e-8 and no flips; bf16/fp16 — mean KL ≤
``floor_multiple`` × max(the largest stock-pair KL, ``floor_min``) and KL(fp32 ‖ candidate) ≤
``fp32_slack`` × max over the stock implementations of KL(fp32 ‖ stock) + ``floor_min`` (no
worse than pristine transformers against fp32; one near-tie position can put any single stock
path far from fp32, so the pristine figure is the largest of them). In every dtype the qualified variants
must have fired, on at least one decode step, and never fallen back.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from kernelslot.engines.transformers.models import build_model

GATE = {"fp32_mean_kl": 1e-8, "floor_multiple": 4.0, "floor_min": 1e-6, "fp32_slack": 1.25,
        "flip_margin": {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.05}}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Trace:
    """One teacher-forced run: logits at every position (N, V) fp32, argmax, prefill hidden states."""

    logits: torch.Tensor
    hidden: list[torch.Tensor]
    tokens: torch.Tensor  # (P, S) the tokens fed at decode steps
    decode_rows: slice  # rows of ``logits`` that are decode steps


@dataclass
class E2EReport:
    model: str
    dtype: str
    passed: bool
    reasons: list[str]
    kl: dict[str, float]
    flips: int
    near_tie_changes: int
    greedy_agreement: float
    first_divergence: list[Optional[int]]
    layer_rel_error: list[float]
    counters: dict[str, Any]
    qualified: list[str]
    entropy: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _entropy(logits: torch.Tensor) -> float:
    logp = torch.log_softmax(logits.double(), -1)
    return float(-(logp.exp() * logp).sum(-1).mean())


def sharpen_lm_head(model: torch.nn.Module, prompts: torch.Tensor, entropy: float) -> float:
    """Scale the LM head so the mean next-token entropy over the prompts is ``entropy`` (nats);
    returns the scale (bisection on log scale over [1/16, 1e4])."""
    with torch.no_grad():
        base = model(input_ids=prompts).logits.float().reshape(-1, model.config.vocab_size)
        lo, hi = math.log(1 / 16), math.log(1e4)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _entropy(base * math.exp(mid)) > entropy else (lo, mid)
        scale = math.exp((lo + hi) / 2)
        model.get_output_embeddings().weight.mul_(scale)
    return scale


def run_trace(model: torch.nn.Module, prompts: torch.Tensor, steps: int, forced: Optional[torch.Tensor] = None) -> Trace:
    """Prefill then ``steps`` greedy decode steps (feeding ``forced`` tokens when given)."""
    rows: list[torch.Tensor] = []
    fed = []
    with torch.no_grad():
        out = model(input_ids=prompts, use_cache=True, output_hidden_states=True)
        hidden = [h.float() for h in out.hidden_states[1:]]
        p, length = prompts.shape
        rows.append(out.logits.float().reshape(p * length, -1))
        cache, last = out.cache, out.logits[:, -1].float()
        for s in range(steps):
            tok = forced[:, s] if forced is not None else last.argmax(-1)
            fed.append(tok)
            out = model(input_ids=tok[:, None], cache=cache, use_cache=True)
            cache, last = out.cache, out.logits[:, -1].float()
            rows.append(last)
    logits = torch.cat(rows)
    return Trace(logits, hidden, torch.stack(fed, 1) if fed else prompts[:, :0], slice(p * length, None))


def kl_stats(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    """KL(ref ‖ got) per row over the full vocabulary, in fp64: mean, p99, max."""
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).clamp(min=0)
    return {"mean": float(kl.mean()), "p99": float(torch.quantile(kl, 0.99)), "max": float(kl.max())}


def _flips(ref: torch.Tensor, got: torch.Tensor, margin: float) -> tuple[int, int]:
    top2 = ref.topk(2, -1).values
    changed = ref.argmax(-1) != got.argmax(-1)
    decisive = (top2[:, 0] - top2[:, 1]) > margin
    return int((changed & decisive).sum()), int((changed & ~decisive).sum())


def _first_divergence(pristine: Trace, cand: Trace, p: int) -> tuple[float, list[Optional[int]]]:
    want = pristine.tokens  # (P, S): token fed at step s = pristine argmax of the previous position
    if want.shape[1] == 0:
        return 1.0, [None] * p
    steps = want.shape[1]
    prev = torch.cat([cand.logits[: pristine.decode_rows.start].reshape(p, -1, cand.logits.shape[-1])[:, -1:],
                      cand.logits[cand.decode_rows].reshape(steps, p, -1).transpose(0, 1)[:, :-1]], 1)
    agree = prev.argmax(-1) == want
    first = [int((~a).nonzero()[0]) if not bool(a.all()) else None for a in agree]
    return float(agree.float().mean()), first


def _rel_errors(ref: list[torch.Tensor], got: list[torch.Tensor]) -> list[float]:
    return [float((g - r).norm() / r.norm().clamp(min=1e-30)) for r, g in zip(ref, got)]


def _qualified_counters(counters: dict[str, Any], variants: list[str]) -> tuple[int, int, int, list[str]]:
    fired = decode = fallback = 0
    errors: list[str] = []
    for slot_counters in counters.values():
        for name, r in slot_counters.items():
            if name in variants:
                fired += r["fired"]
                decode += r["fired_decode"]
                fallback += r["fallback"]
                errors += r["errors"]
    return fired, decode, fallback, errors


def run_e2e(model_name: str, dtype: str = "float32", *, bundle: Any = None, store: Optional[str] = None,
            trust_unverified: bool = False, prompts: int = 4, prompt_len: int = 8, steps: int = 8, seed: int = 0,
            entropy: float = 1.0, sizes: Optional[dict] = None, slots: tuple[str, ...] = ("moe.fused_experts",),
            trust: str = "sandbox") -> E2EReport:
    """Qualify the built-ins (``bundle=None``) or ``bundle`` on ``model_name`` in ``dtype``.

    ``trust`` is :func:`~kernelslot.engines.transformers.install`'s: the bundle is served from the
    sandboxed executor, so none of its code runs in this process, which holds the pristine runs,
    the statistics, the gate and the counters. ``"in-process"`` exists only to show what that
    buys (tests/engine/test_e2e_trust.py); no verdict made with it holds, and the CLI never uses it."""
    from kernelslot.engines.transformers import install

    dt = DTYPES[dtype]
    master = build_model(model_name, seed=seed, sizes=sizes)
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, master.config.vocab_size, (prompts, prompt_len), generator=gen)
    scale = sharpen_lm_head(master, ids, entropy)

    def variant(impl: str, to: torch.dtype) -> torch.nn.Module:
        m = copy.deepcopy(master).to(to)
        m.set_experts_implementation(impl)
        return m

    pristine_model = variant("eager", dt)
    pristine = run_trace(pristine_model, ids, steps)
    measured_entropy = _entropy(pristine.logits)
    cand_model = variant("eager", dt)
    handle = install(cand_model, bundle=bundle, slots=slots, store=store, trust_unverified=trust_unverified,
                     trust=trust)
    cand = run_trace(cand_model, ids, steps, forced=pristine.tokens)
    counters = handle.counters()
    handle.uninstall()

    kl = kl_stats(pristine.logits, cand.logits)
    flips, ties = _flips(pristine.logits, cand.logits, GATE["flip_margin"][dtype])
    agreement, first = _first_divergence(pristine, cand, prompts)
    reasons: list[str] = []
    extra: dict[str, Any] = {"lm_head_scale": scale}
    if dtype == "float32":
        if kl["mean"] > GATE["fp32_mean_kl"]:
            reasons.append(f"mean KL {kl['mean']:.3g} > {GATE['fp32_mean_kl']:.0e} (fp32)")
        if flips:
            reasons.append(f"{flips} argmax flip(s) with a margin > {GATE['flip_margin'][dtype]}")
    else:
        stock = _stock_traces(master, dt, ids, steps, pristine, slots)
        ref = run_trace(variant("eager", dt).float(), ids, steps, pristine.tokens).logits  # same (rounded) weights
        floors = {k: kl_stats(pristine.logits, v)["mean"] for k, v in stock.items()}
        kl_cand_fp32 = kl_stats(ref, cand.logits)
        kl_stock_fp32 = {k: kl_stats(ref, v)["mean"] for k, v in {"eager": pristine.logits, **stock}.items()}
        floors["fp32 compute"] = kl_stock_fp32["eager"]
        floor, stock_fp32 = max(floors.values()), max(kl_stock_fp32.values())
        extra.update(floor_kl=floors, fp32_vs_stock_kl=kl_stock_fp32, fp32_vs_candidate_kl=kl_cand_fp32)
        bound = GATE["floor_multiple"] * max(floor, GATE["floor_min"])
        if kl["mean"] > bound:
            reasons.append(f"mean KL {kl['mean']:.3g} > {GATE['floor_multiple']}x the stock floor {floor:.3g} "
                           f"({', '.join(f'{k} {v:.2g}' for k, v in floors.items())}; bound {bound:.3g})")
        worst = GATE["fp32_slack"] * stock_fp32 + GATE["floor_min"]
        if kl_cand_fp32["mean"] > worst:
            reasons.append(f"KL against fp32 {kl_cand_fp32['mean']:.3g} is worse than pristine's "
                           f"(largest of the stock implementations: {stock_fp32:.3g}; bound {worst:.3g})")
    qualified = _qualified_variants(counters, bundle is not None)
    fired, fired_decode, fallback, errors = _qualified_counters(counters, qualified)
    if not fired:
        reasons.append(f"the qualified variant(s) {', '.join(qualified) or '(none)'} never fired")
    elif not fired_decode:
        reasons.append("the qualified variant(s) fired on no decode step")
    if fallback or errors:
        reasons.append(f"{fallback} fallback(s); errors: {'; '.join(errors[:3]) or 'none'}")
    return E2EReport(model_name, dtype, not reasons, reasons, kl, flips, ties, agreement, first,
                     _rel_errors(pristine.hidden, cand.hidden), counters, qualified, measured_entropy, extra)


def _stock_traces(master: torch.nn.Module, dt: torch.dtype, ids: torch.Tensor, steps: int,
                  pristine: Trace, slots: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Teacher-forced logits of the model's other stock implementations in ``dt``: transformers'
    batched_mm and grouped_mm experts, each of ``slots``' regions computed in fp32 (its install
    point's ``region``) and, where the model runs both, eager attention instead of sdpa."""
    out = {}
    for impl in ("batched_mm", "grouped_mm"):
        m = copy.deepcopy(master).to(dt)
        m.set_experts_implementation(impl)
        out[f"experts {impl}"] = run_trace(m, ids, steps, pristine.tokens).logits
    for slot in slots:
        region = _fp32_region(master, dt, slot)
        if region is not None:
            out[f"{slot} region fp32"] = run_trace(region, ids, steps, pristine.tokens).logits
    if master.config._attn_implementation != "eager":
        m = copy.deepcopy(master).to(dt)
        m.set_experts_implementation("eager")
        m.set_attn_implementation("eager")
        out["attention eager"] = run_trace(m, ids, steps, pristine.tokens).logits
    return out


class _Fp32Twin(torch.nn.Module):
    """A module computed in fp32 on fp32 copies of its floating inputs; ``cast_back``: its floating
    outputs are rounded to ``dtype`` (the single final cast of an fp32-accumulating kernel)."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype, cast_back: bool):
        super().__init__()
        self.twin, self.dtype, self.cast_back = copy.deepcopy(module).float(), dtype, cast_back

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        up = lambda v: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
        out = self.twin(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
        if not self.cast_back:
            return out
        down = lambda v: v.to(self.dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
        return tuple(map(down, out)) if isinstance(out, tuple) else down(out)


def _fp32_region(master: torch.nn.Module, dt: torch.dtype, slot: str) -> Optional[torch.nn.Module]:
    """The model in ``dt`` with ``slot``'s region (the modules its install point takes over) in fp32,
    or None when the point has no module region or the model no site for it."""
    from kernelslot.engines.transformers.install_points import INSTALL_POINTS

    point = INSTALL_POINTS.get(slot)
    m = copy.deepcopy(master).to(dt)
    m.set_experts_implementation("eager")
    names = point.region(m) if point is not None and point.region is not None else []
    for name, cast_back in names:
        parent_name, _, child = name.rpartition(".")
        parent = m.get_submodule(parent_name) if parent_name else m
        setattr(parent, child, _Fp32Twin(getattr(parent, child), dt, cast_back))
    return m if names else None


def _qualified_variants(counters: dict[str, Any], from_bundle: bool) -> list[str]:
    from kernelslot.engines.transformers.experts import BUILTIN, MODEL_CODE

    names = {n for slot in counters.values() for n in slot}
    if from_bundle:
        return sorted(names - {BUILTIN, MODEL_CODE})
    return [BUILTIN]
