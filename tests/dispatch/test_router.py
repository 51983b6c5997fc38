from __future__ import annotations

import torch

from kernelslot.abi import CallDescriptor, CapabilityDomain
from kernelslot.dispatch import INCUMBENT, SlotRouter
from kernelslot.slots import Candidate, Kernel, get_slot

calls: list[str] = []


def small(x, out):
    calls.append("small")
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())


def broken(x, out):
    calls.append("broken")
    raise RuntimeError("boom")


def test_routes_inside_domain_and_falls_back_outside():
    defn = get_slot("activation.silu_and_mul")
    cand = Candidate(Kernel(small, name="small"), CapabilityDomain.from_mapping({"num_tokens": {"range": [1, 4]}}))
    router = SlotRouter(defn, [cand])
    x = torch.randn(2, 8)
    out = torch.empty(2, 4)
    router(CallDescriptor(num_tokens=2), x, out)
    router(CallDescriptor(num_tokens=9), x, out)
    router(CallDescriptor(), x, out)  # missing field: a mismatch, never a wildcard
    assert router.counters["small"].fired == 1 and router.counters["small"].completed == 1
    assert router.counters[INCUMBENT].fallback == 2
    torch.testing.assert_close(out, torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def test_failing_variant_falls_back_and_is_counted():
    defn = get_slot("activation.silu_and_mul")
    router = SlotRouter(defn, [Candidate(Kernel(broken, name="broken"))])
    x = torch.randn(3, 8)
    out = torch.full((3, 4), float("nan"))
    router(CallDescriptor(num_tokens=3), x, out)
    r = router.counters["broken"]
    assert (r.fired, r.completed, r.fallback) == (1, 0, 1) and "boom" in r.errors[0]
    assert not torch.isnan(out).any()


def test_routes_only_below_a_run_of_the_verified_staircase():
    from kernelslot.verify.envelope import envelope_domain, verified_envelope

    defn = get_slot("activation.silu_and_mul")
    cand = Candidate(Kernel(small, name="small"), CapabilityDomain.from_mapping({"num_tokens": {"range": [1, 4096]}}))
    ran = [CallDescriptor(num_tokens=64, hidden_size=512), CallDescriptor(num_tokens=8, hidden_size=4096)]
    router = SlotRouter(defn, [cand], verified={"small": envelope_domain(verified_envelope(ran))})
    assert router.route(CallDescriptor(num_tokens=64, hidden_size=512)) == "small"
    assert router.route(CallDescriptor(num_tokens=8, hidden_size=4096)) == "small"
    assert router.route(CallDescriptor(num_tokens=64, hidden_size=4096)) == INCUMBENT  # no run there
    assert router.route(CallDescriptor(num_tokens=65, hidden_size=8)) == INCUMBENT
    assert router.route(CallDescriptor(num_tokens=4097, hidden_size=8)) == INCUMBENT
