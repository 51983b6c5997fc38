"""The slot ABI: contracts only, no execution. Imports nothing else from kernelslot."""
from kernelslot.abi.capability import (
    DESCRIPTOR_FIELDS,
    CallDescriptor,
    CapabilityDomain,
    CapabilityError,
    Predicate,
    Staircase,
    canonical_arch,
    canonical_dtype,
    domains_overlap,
)
from kernelslot.abi.comparators import AllClose, AllOf, Comparator, Cosine, MatchedRatio, TopKOverlap, UlpShare, Verdict
from kernelslot.abi.relations import PermuteTokens, Relation, ScaleLinear
from kernelslot.abi.slot import Arg, Role, Slot, SlotKind
from kernelslot.abi.tensor_spec import AllocatedOutput, OutputSpec, allocate_output, poison_value

__all__ = [
    "DESCRIPTOR_FIELDS", "CallDescriptor", "CapabilityDomain", "CapabilityError", "Predicate", "Staircase", "canonical_arch", "canonical_dtype", "domains_overlap",
    "AllClose", "AllOf", "Comparator", "Cosine", "MatchedRatio", "TopKOverlap", "UlpShare", "Verdict",
    "PermuteTokens", "Relation", "ScaleLinear",
    "Arg", "Role", "Slot", "SlotKind", "AllocatedOutput", "OutputSpec", "allocate_output", "poison_value",
]
