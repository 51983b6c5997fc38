"""activation.* slots: ``silu_and_mul``."""
from __future__ import annotations

import torch

from kernelslot.abi import AllClose, PermuteTokens, UlpShare, Arg, CallDescriptor, OutputSpec, Role, Slot, SlotKind
from kernelslot.kernels import activation as builtin
from kernelslot.slots.base import (Candidate, Case, Kernel, NearMiss, Pick, Profile, SlotDef, Traffic, nbytes,
                                   output_traffic, randn)
from kernelslot.slots.triton_variants import superseded_by, triton_variant

DTYPES = (torch.float32, torch.bfloat16, torch.float16)

SILU_AND_MUL = Slot(
    "activation.silu_and_mul",
    SlotKind.OP,
    (Arg("x", Role.INPUT, shape="(..., 2d)", doc="gate half then up half along the last dim"),
     Arg("out", Role.OUTPUT, shape="(..., d)")),
    summary="out = silu(x[..., :d]) * x[..., d:]; x (..., 2d), out (..., d)",
)

# fp32 math, one cast: a 16-bit output holds its dtype's precision (abi/comparators.py UlpShare). Measured
# share of cells > 1 ulp from the correctly rounded reference, every profile in float16/bfloat16, 12 seeds
# (half at drawn sizes): 0 for fp32 math cast once (the built-in, examples/honest_activation, direct_activation,
# tests/verify/honest_kernels) and for silu rounded to the dtype before the product (torch eager, vLLM's
# kernel); at least 0.26 for a float16 output rounded through bfloat16, which allclose's 1e-2 admits.
# silu's σ(x) underflows to 0 in fp32 below x = -88.7 (exp(-x) overflows); the fp64 reference keeps
# |x·σ(x)·up| up to about 88.7·e^-88.7·|up| (~3e-35 at the profiles' values): an honest fp32 kernel
# wrote 0 where 4.97e-37 was expected (drawn saturating_large_values, one cell a row, --seed-base 582020805).
FP32_UNDERFLOW = 2.0 ** -100  # ~7.9e-31: far below any value a wrong answer changes
COMPARATOR = AllClose(ulps=UlpShare(0.01), floor=FP32_UNDERFLOW)

_SHAPES = {
    "single_token": ((1,), 64, 1.0),
    "ragged_rows_nonpow2": ((37,), 200, 1.0),
    "decode_batch": ((16,), 1024, 1.0),
    "leading_dims_3d": ((2, 5), 48, 1.0),
    "saturating_large_values": ((9,), 96, 30.0),  # silu tails: exp overflow / -0 products
}


def _make_case(profile: Profile, gen: torch.Generator) -> Case:
    lead, d, scale = profile.dims["lead"], profile.dims["d"], profile.dims["scale"]
    x = randn((*lead, 2 * d), gen, profile.dtype, scale)
    return Case(inputs={"x": x}, outputs={"out": OutputSpec((*lead, d), profile.dtype)})


def _reference(case: Case) -> dict[str, torch.Tensor]:
    x = case.inputs["x"].double()
    d = x.shape[-1] // 2
    return {"out": (torch.nn.functional.silu(x[..., :d]) * x[..., d:]).float()}


def _halves_swapped(case: Case) -> dict[str, torch.Tensor]:
    x = case.inputs["x"].double()
    d = x.shape[-1] // 2
    return {"out": (torch.nn.functional.silu(x[..., d:]) * x[..., :d]).float()}


def _gelu_for_silu(case: Case) -> dict[str, torch.Tensor]:
    x = case.inputs["x"].double()
    d = x.shape[-1] // 2
    return {"out": (torch.nn.functional.gelu(x[..., :d], approximate="tanh") * x[..., d:]).float()}


NEAR_MISSES = (
    NearMiss("gate and up halves swapped (silu(up)·gate)", _halves_swapped),
    NearMiss("tanh-GELU instead of SiLU", _gelu_for_silu),
)


def _draw(base: Profile, pick: Pick) -> dict:
    """Leading dimensions (one or two) and width around ``base`` (same dtype and value scale)."""
    return {"lead": pick.integers(1, 40, 1, 2), "d": pick.integer(1, 512)}


def _describe(case: Case) -> CallDescriptor:
    x = case.inputs["x"]
    return CallDescriptor(num_tokens=x[..., 0].numel(), hidden_size=x.shape[-1] // 2)


def _traffic(case: Case) -> Traffic:
    """Both halves of x read, every output written."""
    return Traffic(nbytes(case.inputs["x"]) + output_traffic(case).bytes)


INCUMBENT = Kernel(builtin.silu_and_mul, name="builtin.silu_and_mul")
TRITON = triton_variant("activation", "silu_and_mul", name="triton.silu_and_mul", graph_safe=True)

SLOTS = (
    SlotDef(
        slot=SILU_AND_MUL,
        make_case=_make_case,
        reference=_reference,
        comparator=COMPARATOR,
        profiles=tuple(
            Profile(name, {"lead": lead, "d": d, "scale": scale}, dt,
                    tags=frozenset({"adversarial"}) if name.startswith(("ragged", "saturating", "single")) else frozenset())
            for name, (lead, d, scale) in _SHAPES.items()
            for dt in DTYPES
        ),
        incumbent=INCUMBENT,
        builtins=(TRITON, Candidate(INCUMBENT, graph_safe=True, needs=superseded_by(TRITON))),
        describe=_describe,
        relations=(PermuteTokens(("x",), ("out",)),),
        sizes=(("hidden_size", "d"), ("num_tokens", "lead", lambda dims, n: {**dims, "lead": (n,)})),
        # Under Triton's interpreter a program (a row block) costs ~3 ms: every fixed profile and the drawn ones
        # with one leading dimension run, and the long run's up to 256 calls stay near 30 s (verify/interpreted.py)
        interpreted_sizes={"num_tokens": 40, "hidden_size": 1024},
        traffic=_traffic,
        near_misses=NEAR_MISSES,
        draw=_draw,
    ),
)
