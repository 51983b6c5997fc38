"""norm.* slots: ``rmsnorm`` (pure RMSNorm, no residual; Gemma-style models pass ``1 + w``)."""
from __future__ import annotations

import torch

from kernelslot.abi import AllClose, PermuteTokens, UlpShare, Arg, CallDescriptor, OutputSpec, Role, Slot, SlotKind
from kernelslot.kernels import norm as builtin
from kernelslot.slots.base import (Candidate, Case, Kernel, NearMiss, Pick, Profile, SlotDef, Traffic, nbytes,
                                   output_traffic, randn)
from kernelslot.slots.models import model_profile
from kernelslot.slots.triton_variants import superseded_by, triton_variant

DTYPES = (torch.float32, torch.bfloat16, torch.float16)

RMSNORM = Slot(
    "norm.rmsnorm",
    SlotKind.OP,
    (Arg("x", Role.INPUT), Arg("weight", Role.INPUT), Arg("out", Role.OUTPUT), Arg("eps", Role.SCALAR)),
    summary="out = x * rsqrt(mean(x^2, -1) + eps) * weight (fp32 math)",
)

# fp32 math, one cast: a 16-bit output holds its dtype's precision (abi/comparators.py UlpShare). Measured
# share of cells > 1 ulp from the correctly rounded reference, every profile in float16/bfloat16, 12 seeds
# (half at drawn sizes): 0 for fp32 math cast once (the built-in, examples/honest_norm) and for the engine
# style that rounds x·rsqrt to the dtype before the weight; 0.59-0.65 for a float16 output rounded through
# bfloat16 (allclose's 1e-2 admits it); 0-0.18 for math done in the 16-bit dtype itself (not the contract).
COMPARATOR = AllClose(ulps=UlpShare(0.01))

# name: (rows, hidden, eps, x offset, model)
_SHAPES = {
    "single_token": (1, 128, 1e-6, 0.0, "generic"),
    "ragged_rows_nonpow2": (13, 1000, 1e-5, 0.0, "generic"),
    "decode_batch": (32, 2048, 1e-6, 0.0, "generic"),
    "large_mean_offset": (5, 384, 1e-6, 50.0, "generic"),  # cancellation-prone: mean(x²) dominated by offset
    "tiny_values_eps_dominated": (4, 256, 1e-2, 0.0, "generic"),
    "gemma_one_plus_w": (7, 192, 1e-6, 0.0, "MiniMax-M3"),
}


def _make_case(profile: Profile, gen: torch.Generator) -> Case:
    rows, hidden, eps, offset = (profile.dims[k] for k in ("rows", "hidden", "eps", "offset"))
    scale = 1e-3 if profile.name.startswith("tiny") else 1.0
    x = (randn((rows, hidden), gen, torch.float32, scale) + offset).to(profile.dtype)
    w = randn((hidden,), gen, torch.float32, 0.1)
    w = (1.0 + w) if model_profile(profile.model).gemma_norm else (w + 1.0) * 0.5
    return Case(
        inputs={"x": x, "weight": w.to(profile.dtype), "eps": eps},
        outputs={"out": OutputSpec((rows, hidden), profile.dtype)},
    )


def _reference(case: Case) -> dict[str, torch.Tensor]:
    x = case.inputs["x"].double()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + case.inputs["eps"])
    return {"out": (y * case.inputs["weight"].double()).float()}


def _weight_ignored(case: Case) -> dict[str, torch.Tensor]:
    x = case.inputs["x"].double()
    return {"out": (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + case.inputs["eps"])).float()}


def _one_plus_w_twice(case: Case) -> dict[str, torch.Tensor]:
    return {"out": (_reference(case)["out"].double() * (1 + case.inputs["weight"].double())).float()}


def _eps_outside_root(case: Case) -> dict[str, torch.Tensor] | None:
    """Exercised where eps is not negligible against mean(x²) (eps-dominated rows)."""
    x, eps = case.inputs["x"].double(), case.inputs["eps"]
    ms = x.square().mean(-1, keepdim=True)
    if eps < 0.1 * float(ms.min()):
        return None
    return {"out": (x / (ms.sqrt() + eps) * case.inputs["weight"].double()).float()}


def _layernorm(case: Case) -> dict[str, torch.Tensor] | None:
    """Exercised where a row's mean is at least its spread (offset-dominated rows)."""
    x = case.inputs["x"].double()
    if not bool((x.mean(-1).abs() >= x.std(-1)).any()):
        return None
    c = x - x.mean(-1, keepdim=True)
    y = c * torch.rsqrt(c.square().mean(-1, keepdim=True) + case.inputs["eps"])
    return {"out": (y * case.inputs["weight"].double()).float()}


NEAR_MISSES = (
    NearMiss("weight ignored", _weight_ignored),
    NearMiss("(1 + w) applied to a weight that already holds it", _one_plus_w_twice),
    NearMiss("eps added outside the root (x / (rms + eps))", _eps_outside_root),
    NearMiss("LayerNorm (mean subtracted) instead of RMSNorm", _layernorm),
)


def _draw(base: Profile, pick: Pick) -> dict:
    """Rows and hidden size around ``base`` (same dtype, model, eps and value regime)."""
    return {"rows": pick.integer(1, 64), "hidden": pick.integer(1, 2048)}


def _describe(case: Case) -> CallDescriptor:
    x = case.inputs["x"]
    return CallDescriptor(num_tokens=x.shape[0], hidden_size=x.shape[-1])


def _traffic(case: Case) -> Traffic:
    """Every x and weight element read, every output written."""
    return Traffic(nbytes(case.inputs["x"], case.inputs["weight"]) + output_traffic(case).bytes)


INCUMBENT = Kernel(builtin.rmsnorm, name="builtin.rmsnorm")
TRITON = triton_variant("norm", "rmsnorm", name="triton.rmsnorm", graph_safe=True)

SLOTS = (
    SlotDef(
        slot=RMSNORM,
        make_case=_make_case,
        reference=_reference,
        comparator=COMPARATOR,
        profiles=tuple(
            Profile(name, {"rows": r, "hidden": h, "eps": e, "offset": o}, dt, model=m,
                    tags=frozenset({"adversarial"}) if name.startswith(("ragged", "large", "tiny", "single")) else frozenset())
            for name, (r, h, e, o, m) in _SHAPES.items()
            for dt in DTYPES
        ),
        incumbent=INCUMBENT,
        builtins=(TRITON, Candidate(INCUMBENT, graph_safe=True, needs=superseded_by(TRITON))),
        describe=_describe,
        relations=(PermuteTokens(("x",), ("out",)),),
        sizes=(("num_tokens", "rows"), ("hidden_size", "hidden")),
        # Under Triton's interpreter one row costs ~1.3 ms at H = 2048: every fixed and drawn profile runs, and the
        # long run's up to 256 calls stay near 20 s (verify/interpreted.py)
        interpreted_sizes={"num_tokens": 64, "hidden_size": 2048},
        traffic=_traffic,
        near_misses=NEAR_MISSES,
        draw=_draw,
    ),
)
