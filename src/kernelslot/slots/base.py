"""How a slot is described to the referee: profiles, cases, references, incumbents.

A :class:`SlotDef` is data plus four trusted functions. ``make_case`` builds one diagnostic
call on the CPU from a seeded generator; the shapes depend only on the profile (values on the
seed), so the referee can replay with fresh values at the same addresses. ``reference``
computes the expected outputs in fp32/fp64 from *clones* of the inputs, in the referee's
process only. ``describe`` turns a case into the :class:`CallDescriptor` used for routing.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

import torch

from kernelslot.abi import CallDescriptor, CapabilityDomain, Comparator, OutputSpec, Slot

__all__ = ["Profile", "Pick", "Case", "Kernel", "KernelSource", "Override", "Needs", "Candidate", "NearMiss", "SlotDef",
           "OutputSpec", "Traffic", "randn", "dtype_name", "nbytes", "output_traffic", "LOW_BIT", "multiple_of", "cycled",
           "CUDA_PACKAGES", "importable"]


# Profile tag: 4-bit (E2M1) weights or activations on the profile's path; its own comparator admits that
# noise, so the oracle's lower-precision answers for the outputs it judges are the output rounded to
# 1 significant bit and to each count up to the slot's ``low_bit_resolution`` (verify/oracle.py).
LOW_BIT = "low_bit"


@dataclass(frozen=True)
class Profile:
    """One diagnostic configuration: shape parameters, dtype and model profile."""

    name: str
    dims: Mapping[str, Any]
    dtype: torch.dtype
    model: str = "generic"
    tags: frozenset[str] = frozenset()
    # overrides the slot's comparator (e.g. low-bit profiles): one for every output, or some outputs by name
    comparator: Comparator | Mapping[str, Comparator] | None = None
    drawn: Mapping[str, Any] | None = None  # a drawn profile's record (slots/draw.py): seed, index, base, dims

    @property
    def label(self) -> str:
        return f"{self.name}[{dtype_name(self.dtype)}]"


_T = TypeVar("_T")


class Pick(Protocol):
    """The choices a slot's ``draw`` function makes (slots/draw.py backs them with Hypothesis)."""

    def integer(self, lo: int, hi: int) -> int: ...  # in [lo, hi]

    def choice(self, options: Sequence[_T]) -> _T: ...

    def flag(self) -> bool: ...

    def integers(self, lo: int, hi: int, min_size: int, max_size: int) -> tuple[int, ...]: ...

    def subset(self, options: Sequence[_T]) -> tuple[_T, ...]: ...  # in the order given


@dataclass
class Case:
    """One concrete call: inputs by argument name, output specs, prepare arguments."""

    inputs: dict[str, Any]
    outputs: dict[str, OutputSpec | None]
    prepare_args: tuple = ()
    live: tuple[str, ...] | None = None  # inputs refreshed on replay; None = every tensor input
    meta: dict[str, Any] = field(default_factory=dict)

    def live_names(self) -> tuple[str, ...]:
        if self.live is not None:
            return self.live
        return tuple(k for k, v in self.inputs.items() if isinstance(v, torch.Tensor))


@dataclass(frozen=True)
class Override:
    """An override submission: ``attr`` of the kernel's source, composed into the built-in
    ``base`` at its named override ``point``, under ``model``'s semantics elsewhere
    (``kernelslot.kernels.moe_overrides``)."""

    base: str
    point: str
    attr: str
    model: str = "generic"


@dataclass(frozen=True)
class KernelSource:
    """Where a kernel's code lives, so another process can load it by itself.

    Either ``file`` (a Python source file, e.g. inside a bundle) or ``module`` (an importable
    module name); ``entry``/``prepare`` are attribute names in it. Or ``sealed``
    (``DIR@INDEX_SHA256``): a sealed direct artifact, launched by the referee's own launcher
    (kernelslot.bundle.direct); ``entry``/``prepare`` then only say which roles exist. With
    ``override``, the callables are the built-in base composed with ``override.attr`` (``entry``
    then names the row's entry and ``prepare`` the base's, for messages only). ``interpret``: the
    source is imported under Triton's interpreter (``TRITON_INTERPRET=1`` set before the import).
    """

    entry: str
    prepare: str | None = None
    file: str | None = None
    module: str | None = None
    sealed: str | None = None
    override: Override | None = None
    interpret: bool = False


@dataclass(frozen=True)
class Kernel:
    """An implementation of a slot: ``entry(*args) -> None`` and an optional ``prepare``."""

    entry: Callable[..., Any] | None  # None: resolved from ``source`` by the runner that executes it
    prepare: Callable[..., Any] | None = None
    name: str = ""
    source: KernelSource | None = None  # None: derived from the callables' module and qualname

    def origin(self) -> KernelSource:
        """The loadable origin of this kernel (explicit, or the callables' module/qualname)."""
        if self.source is not None:
            return self.source
        if self.entry is None:
            raise ValueError(f"kernel {self.name}: neither callables nor a source")
        if "<locals>" in self.entry.__qualname__ or (self.prepare and "<locals>" in self.prepare.__qualname__):
            raise ValueError(f"kernel {self.name or self.entry}: a locally defined function cannot be loaded in another process")
        if self.prepare is not None and self.prepare.__module__ != self.entry.__module__:
            raise ValueError(f"kernel {self.name}: entry and prepare must live in one module to be loaded elsewhere")
        return KernelSource(
            entry=self.entry.__qualname__,
            prepare=self.prepare.__qualname__ if self.prepare else None,
            module=self.entry.__module__,
        )


# Packages whose kernels run only on a CUDA device.
CUDA_PACKAGES = ("triton", "cutlass", "cuda", "cupy", "tilelang", "flashinfer", "pycuda", "numba")


@dataclass(frozen=True)
class Needs:
    """What a candidate needs from the machine: one of ``archs`` (canonical, e.g. ``sm_90``;
    empty = any device) and every top-level package in ``packages``.

    :meth:`unmet` is the reason the candidate cannot run here (its verdict is then *not run*,
    never a failure of the candidate), or None. ``blocked`` is such a reason known in advance (a
    direct artifact this machine cannot build, or whose provider cannot run on this device).
    ``superseded_by`` names built-in variants (with their needs) routed ahead of this one that
    serve its whole domain: on a machine where one of them can run, this one is left out, its
    calls verified as that variant (a torch kernel where its Triton twin runs). ``interpret``: a
    bundle row whose source imports triton; where no CUDA device can run it, the referee may run it
    under Triton's interpreter on CPU tensors instead (``verify/interpreted.py``).
    """

    archs: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    blocked: str | None = None
    superseded_by: tuple[tuple[str, "Needs"], ...] = ()
    interpret: bool = False

    def unmet(self, arch: str) -> str | None:
        if self.blocked:
            return self.blocked
        for name, needs in self.superseded_by:
            if needs.unmet(arch) is None:
                return f"{name} serves its calls on {arch} (verified in its place)"
        cuda = [p for p in self.packages if p in CUDA_PACKAGES]
        if arch == "cpu" and ((self.archs and "cpu" not in self.archs) or cuda):
            why = f"architectures {', '.join(self.archs)}" if self.archs and "cpu" not in self.archs else f"imports {cuda[0]}"
            return f"needs CUDA ({why}); no CUDA device here"
        if self.archs and arch not in self.archs:
            return f"needs architecture {' or '.join(self.archs)}; this device is {arch}"
        missing = [p for p in self.packages if not importable(p)]
        if missing:
            return f"needs the {missing[0]} package; it is not installed here"
        return None


def importable(package: str) -> bool:
    """Whether the top-level ``package`` can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class Candidate:
    """A kernel as admitted for one slot: its declared capability domain and graph safety."""

    kernel: Kernel
    domain: CapabilityDomain = CapabilityDomain()
    graph_safe: bool = False
    label: str = ""
    model: str | None = None  # the model profile the candidate is bound to (bundle metadata; generic if none)
    needs: Needs = Needs()  # what the machine must provide for it to run at all

    @property
    def name(self) -> str:
        return self.label or self.kernel.name


@dataclass(frozen=True)
class Traffic:
    """The least work one call must do: bytes it must read plus write, and floating-point operations.

    A lower bound, never an estimate: only what every honest implementation touches (each output
    cell is written, every input the result depends on wholly is read; a prepared weight counts
    where every call needs it). ``verify/single/roofline.py`` turns it into the call's physics floor.
    """

    bytes: int
    flops: int = 0


def nbytes(*tensors: Any) -> int:
    """Bytes held by the tensors among ``tensors`` (anything else counts 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def output_traffic(case: Case) -> Traffic:
    """The floor every slot has: each output cell is written once (``poison_left`` checks it)."""
    return Traffic(sum(math.prod(s.shape) * torch.empty((), dtype=s.dtype).element_size()
                       for s in case.outputs.values() if s is not None))


@dataclass(frozen=True)
class NearMiss:
    """A named plausible mistake of the slot (SiLU for swigluoai, -1 read as an expert, ...).

    ``outputs(case)`` is what a kernel making the mistake writes: every output by name, fp32
    (the slot's reference with the mistake), or None where ``case`` does not exercise it. The
    oracle self-test (:mod:`kernelslot.verify.oracle`) requires each to fail the slot's
    comparator; on a failed comparison the referee may name the near-miss the output matches.
    """

    name: str
    outputs: Callable[[Case], dict[str, Any] | None]


@dataclass(frozen=True)
class SlotDef:
    slot: Slot
    make_case: Callable[[Profile, torch.Generator], Case]
    reference: Callable[[Case], dict[str, torch.Tensor]]
    comparator: Comparator | Mapping[str, Comparator]
    profiles: tuple[Profile, ...]
    incumbent: Kernel
    describe: Callable[[Case], CallDescriptor]
    audit: Callable[[Case, dict[str, torch.Tensor]], list[str]] | None = None
    notes: str = ""
    # The built-in kernels as routed variants (e.g. one per model activation); default: the incumbent alone.
    builtins: tuple["Candidate", ...] = ()
    # The largest size (CallDescriptor size field -> value) a profile runs at under Triton's interpreter
    # (verify/interpreted.py); None: each size field's largest over the fixed profiles
    interpreted_sizes: Mapping[str, int] | None = None
    # (CallDescriptor field, profile dimension that sets it[, fit]) for verify/envelope.py boundary profiles;
    # fit(dims, target) -> the dims of a valid case near target (other dims adjusted), or None if none
    sizes: tuple[tuple[str, str] | tuple[str, str, Callable[[dict, int], dict | None]], ...] = ()
    # the least bytes/flops of one call (verify/single/roofline.py physics floor); default: its outputs, written once
    traffic: Callable[[Case], Traffic] = output_traffic
    # Named near-misses the comparator must reject (verify/oracle.py), with the slot's semantics.
    near_misses: tuple[NearMiss, ...] = ()
    # Metamorphic relations its semantics guarantee (abi/relations.py), checked on a sample of calls
    relations: tuple[Any, ...] = ()
    # What prepared state may persist across calls, where the slot has prepare() (docs/slots; slots/contract.py)
    prepared_state: str = ""
    # draw(base, pick) -> dims overriding base.dims: one drawn profile inside the declared domain (slots/draw.py)
    draw: Callable[[Profile, "Pick"], Mapping[str, Any]] | None = None
    # The most significant bits of output rounding a LOW_BIT profile's comparator must reject (verify/oracle.py
    # judges the output rounded to 1..this many bits); 1 where honest path choices err as much as 2 bits do
    low_bit_resolution: int = 1

    def builtin_candidates(self) -> tuple["Candidate", ...]:
        return self.builtins or (Candidate(self.incumbent),)

    def incumbent_for(self, desc: CallDescriptor) -> Kernel:
        """The torch built-in that serves ``desc``: the routed built-in variant among those that need
        nothing of the machine (not the Triton variants, which are timed against it), else the incumbent."""
        return next((c.kernel for c in self.builtin_candidates()
                     if not c.needs.packages and not c.needs.archs and c.domain.matches(desc)), self.incumbent)

    @property
    def name(self) -> str:
        return self.slot.name

    def comparator_for(self, output: str, profile: Profile | None = None) -> Comparator:
        override = profile.comparator if profile is not None else None
        if isinstance(override, Mapping) and output in override:
            return override[output]
        if override is not None and not isinstance(override, Mapping):
            return override
        if isinstance(self.comparator, Mapping):
            return self.comparator[output]
        return self.comparator

    def describe_comparator(self) -> str:
        return comparator_text(self.comparator)

    def near_miss_matching(self, case: Case, output: str, actual: torch.Tensor, profile: Profile | None = None) -> str | None:
        """The first named near-miss whose ``output`` the comparator accepts ``actual`` as (the likely
        cause of a failed comparison), or None. ``case`` is a copy: near-misses read it only."""
        for near in self.near_misses:
            outs = near.outputs(case)
            if outs is not None and self.comparator_for(output, profile).compare(actual, outs[output]).passed:
                return near.name
        return None

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        seen: list[torch.dtype] = []
        for p in self.profiles:
            if p.dtype not in seen:
                seen.append(p.dtype)
        return tuple(seen)


def comparator_text(comparator: Comparator | Mapping[str, Comparator]) -> str:
    """One line for a comparator, or for comparators by output name (``out: ...; other: ...``)."""
    if isinstance(comparator, Mapping):
        return "; ".join(f"{k}: {c.describe()}" for k, c in comparator.items())
    return comparator.describe()


def multiple_of(value: int, step: int) -> int:
    """The nearest positive multiple of ``step`` to ``value`` (a size fit for ``SlotDef.sizes``)."""
    return max(step, step * round(value / step))


def cycled(values: tuple, n: int) -> tuple:
    """``values`` repeated or cut to length ``n`` (per-request dims resized to ``n`` requests)."""
    return tuple(values[i % len(values)] for i in range(n))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def randn(shape: tuple[int, ...] | list[int], gen: torch.Generator, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Seeded normal values, generated in fp32 then cast (so every dtype sees the same draw)."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(dtype)
