"""The built-in Triton variants' registration: routed on CUDA sm_80+ only, loaded by name.

The kernels live in :mod:`kernelslot.kernels.triton` (one module per slot family, docs/triton.md).
This module imports none of them and never imports triton: :func:`triton_variant` names the
kernel's module and functions, and the runner that calls it imports them, which on a CPU never
happens (the variant is left out: "needs CUDA").

Routing: each variant's domain is ``arch`` in :data:`SM80_PLUS` conjoined with the torch variant's
own domain (e.g. its models), and it needs one of those architectures and the triton package. The
torch variant it replaces gets :func:`superseded_by`: where the Triton variant can run, it serves
the torch variant's whole domain, so the torch variant is left out there (the verdict is the
Triton variant's) and stays the incumbent the Triton variant is timed against
(:meth:`kernelslot.slots.base.SlotDef.incumbent_for`). Elsewhere (a CPU, an older GPU, no triton)
nothing changes.
"""
from __future__ import annotations

from kernelslot.abi import CapabilityDomain
from kernelslot.slots.base import Candidate, Kernel, KernelSource, Needs

__all__ = ["SM80_PLUS", "CUDA_DOMAIN", "TRITON_NEEDS", "triton_variant", "superseded_by"]

# CUDA architectures the Triton kernels are routed on: Ampere (sm_80) and later, as
# kernelslot.abi.canonical_arch spells them. A device of another architecture keeps the torch kernel.
SM80_PLUS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_101", "sm_103", "sm_110", "sm_120", "sm_121")
CUDA_DOMAIN = {"arch": {"one_of": list(SM80_PLUS)}}
TRITON_NEEDS = Needs(archs=SM80_PLUS, packages=("triton",))


def triton_variant(module: str, entry: str, prepare: str | None = None, *, name: str,
                   domain: CapabilityDomain = CapabilityDomain(), graph_safe: bool = False) -> Candidate:
    """The built-in Triton variant ``kernelslot.kernels.triton.<module>.<entry>``: routed where ``domain``
    holds on an sm_80+ device with triton installed, loaded by name only when it runs."""
    source = KernelSource(entry=entry, prepare=prepare, module=f"kernelslot.kernels.triton.{module}")
    cuda = CapabilityDomain.from_mapping(CUDA_DOMAIN)
    return Candidate(Kernel(entry=None, name=name, source=source),
                     CapabilityDomain(cuda.predicates + domain.predicates), graph_safe=graph_safe, label=name,
                     needs=TRITON_NEEDS)


def superseded_by(variant: Candidate) -> Needs:
    """The needs of a torch variant whose whole domain ``variant`` serves where ``variant`` can run."""
    return Needs(superseded_by=((variant.name, variant.needs),))
