"""The referee's own mechanics: allocation, poisoning, replay, routing by domain."""
from __future__ import annotations

import torch

from kernelslot.abi import CapabilityDomain, OutputSpec, allocate_output
from kernelslot.abi.tensor_spec import FINITE_POISON
from kernelslot.slots import Candidate, Kernel, get_slot
from kernelslot.verify import VerifyOptions, verify_slot

F32 = VerifyOptions(dtypes=(torch.float32,))
seen: list[dict] = []


def test_padded_outputs_are_not_contiguous_and_canaried():
    a = allocate_output(OutputSpec((3, 5, 7), torch.float32), "cpu")
    assert not a.view.is_contiguous() and a.view.storage_offset() > 0
    assert a.canary_intact()
    a.base[0] = 0.0
    assert not a.canary_intact()
    c = allocate_output(OutputSpec((4, 6), torch.int32, "contiguous"), "cpu")
    assert c.view.is_contiguous()
    c.poison()
    assert (c.view == torch.iinfo(torch.int32).min).all()


def spy(x, out):
    poisoned = bool(torch.isnan(out).all() or (out == FINITE_POISON).all())
    seen.append({"nan": poisoned, "finite": not torch.isnan(out).any(), "ptr": x.data_ptr(), "x0": x.reshape(-1)[-1].item(),
                 "contiguous": out.is_contiguous() and out.storage_offset() == 0})
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())


def test_every_call_sees_poison_and_fresh_inputs_at_stable_addresses():
    seen.clear()
    defn = get_slot("activation.silu_and_mul")
    report = verify_slot(defn, Candidate(Kernel(spy, name="spy")), VerifyOptions(dtypes=(torch.float32,), profiles=("decode_batch",), replays=3))
    assert report.passed
    # first call + 3 replays (full, tail, head refills) + one engine-like call with plain outputs
    assert len(seen) == 5 and all(s["nan"] for s in seen[:4])  # poisoned before the eager call too
    assert [s["finite"] for s in seen] == [False, True, False, False, True]  # a finite sentinel, then random fill
    assert not seen[4]["nan"] and seen[4]["contiguous"]
    assert len({s["ptr"] for s in seen}) == 1  # same input storage across replays
    assert len({s["x0"] for s in seen}) >= 4  # fresh values (the head refill keeps the tail cell)


def test_profiles_outside_the_domain_are_skipped_and_unexercised_domains_fail():
    defn = get_slot("activation.silu_and_mul")
    narrow = Candidate(defn.incumbent, CapabilityDomain.from_mapping({"num_tokens": {"range": [1, 1]}}))
    report = verify_slot(defn, narrow, F32)
    assert report.passed
    assert [r.profile for r in report.results if not r.skipped_reason] == ["single_token"]
    never = Candidate(defn.incumbent, CapabilityDomain.from_mapping({"model": {"exact": "gpt-oss"}}))
    report = verify_slot(defn, never, F32)
    assert not report.passed and "never exercised" in report.errors[0]


def test_raising_candidate_is_contained_with_traceback():
    def boom(x, out):
        raise ValueError("kaput")

    report = verify_slot(get_slot("activation.silu_and_mul"), Candidate(Kernel(boom, name="boom")), F32)
    assert not report.passed
    msg = report.results[0].check("raised").message
    assert "ValueError: kaput" in msg


def test_json_report_roundtrip(tmp_path):
    from kernelslot.cli import main
    import json

    out = tmp_path / "r.json"
    assert main(["verify", "--slot", "norm.rmsnorm", "--dtype", "float32", "--quiet", "--json", str(out),
                 "--store", str(tmp_path / "r.db")]) == 0
    data = json.loads(out.read_text())
    assert data["passed"] and data["slots"][0]["slot"] == "norm.rmsnorm"
    import sqlite3

    rows = sqlite3.connect(tmp_path / "r.db").execute("select count(*), min(status) from results").fetchone()
    assert rows[0] == len(data["slots"][0]["results"]) and rows[1] == "pass"
