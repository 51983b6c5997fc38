"""Not run is per variant: a variant this machine cannot run is recorded, the others get their verdict."""
from __future__ import annotations

import torch

from kernelslot.abi import CapabilityDomain
from kernelslot.slots import Candidate, get_slot
from kernelslot.verify import VerifyOptions


def test_a_variant_this_machine_cannot_run_is_noted_while_the_others_get_their_verdict():
    from kernelslot.slots.base import Needs
    from kernelslot.verify.referee import verify_slot as front_door

    defn = get_slot("activation.silu_and_mul")
    few = Candidate(defn.incumbent, CapabilityDomain.from_mapping({"num_tokens": {"range": [1, 16]}}), label="few")
    many = Candidate(defn.incumbent, CapabilityDomain.from_mapping({"num_tokens": {"range": [17, 10**6]}}), label="many",
                     needs=Needs(blocked="its toolchain is not installed here"))
    report = front_door(defn, [few, many], VerifyOptions(dtypes=(torch.float32,)))
    assert report.status == "pass" and "many: not run: its toolchain is not installed here" in report.notes
    assert all(r.skipped_reason for r in report.results if r.kernel == "-")  # the blocked variant's profiles: skipped
