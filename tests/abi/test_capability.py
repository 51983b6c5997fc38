from __future__ import annotations

import pytest

from kernelslot.abi import CallDescriptor, CapabilityDomain, CapabilityError, Staircase, domains_overlap


def dom(**spec):
    return CapabilityDomain.from_mapping(spec)


def test_predicates_match():
    d = dom(num_tokens={"range": [1, 8]}, dtype={"one_of": ["bfloat16"]}, model={"exact": "MiniMax-M3"})
    assert d.matches(CallDescriptor(num_tokens=8, dtype="bfloat16", model="MiniMax-M3"))
    assert not d.matches(CallDescriptor(num_tokens=9, dtype="bfloat16", model="MiniMax-M3"))
    assert not d.matches(CallDescriptor(num_tokens=1, dtype="float32", model="MiniMax-M3"))


def test_missing_field_is_a_mismatch_not_a_wildcard():
    d = dom(top_k={"exact": 4})
    assert not d.matches(CallDescriptor(num_tokens=1))
    assert d.mismatches(CallDescriptor()) == ["top_k == 4"]
    assert CapabilityDomain().matches(CallDescriptor())


@pytest.mark.parametrize("spec, msg", [
    ({"num_tokens": {"between": [1, 2]}}, "unknown predicate"),
    ({"tokens": {"exact": 1}}, "unknown descriptor field"),
    ({"num_tokens": {"range": [3]}}, "range needs"),
    ({"num_tokens": {"one_of": []}}, "non-empty list"),
    ({"num_tokens": {"exact": 1, "range": [1, 2]}}, "exactly one predicate"),
])
def test_bad_domains_rejected(spec, msg):
    with pytest.raises(CapabilityError, match=msg):
        CapabilityDomain.from_mapping(spec)


def test_overlap():
    assert domains_overlap(dom(num_tokens={"range": [1, 8]}), dom(num_tokens={"range": [8, 16]}))
    assert not domains_overlap(dom(num_tokens={"range": [1, 8]}), dom(num_tokens={"range": [9, 16]}))
    assert not domains_overlap(dom(dtype={"exact": "bfloat16"}), dom(dtype={"one_of": ["float16", "float32"]}))
    assert domains_overlap(dom(dtype={"exact": "bfloat16"}), dom(num_tokens={"range": [1, 2]}))
    assert not domains_overlap(dom(num_tokens={"one_of": [1, 2]}), dom(num_tokens={"range": [3, 9]}))


def test_a_staircase_holds_what_ran_not_the_box_around_it():
    st = Staircase.of_runs([{"num_tokens": 64, "hidden_size": 2048}, {"num_tokens": 32, "hidden_size": 4096},
                            {"num_tokens": 1, "hidden_size": 128}, {"num_tokens": 16, "hidden_size": 1024}],
                           ("num_tokens", "hidden_size", "kv_len"))
    assert st.fields == ("num_tokens", "hidden_size")  # kv_len: no run set it
    assert st.corners == ((32, 4096), (64, 2048))  # (16, 1024) and (1, 128) lie below a corner
    assert st.matches(CallDescriptor(num_tokens=64, hidden_size=2048))
    assert st.matches(CallDescriptor(num_tokens=2, hidden_size=4000))
    assert not st.matches(CallDescriptor(num_tokens=64, hidden_size=4096))  # both maxima never ran together
    assert not st.matches(CallDescriptor(num_tokens=33, hidden_size=2049))
    assert not st.matches(CallDescriptor(num_tokens=8, hidden_size=64))  # below the smallest run
    assert not st.matches(CallDescriptor(num_tokens=8))  # a missing field is a mismatch
    assert "inside one of (num_tokens <= 32, hidden_size <= 4096) | (num_tokens <= 64, hidden_size <= 2048)" in st.describe()


def test_a_staircase_reads_back_its_json_and_old_box_receipts():
    st = Staircase.of_runs([{"num_tokens": 64, "hidden_size": 2048}, {"num_tokens": 32, "hidden_size": 4096}],
                           ("num_tokens", "hidden_size"))
    env = st.to_json()
    assert env == {"num_tokens": [32, 64], "hidden_size": [2048, 4096],
                   "corners": [{"num_tokens": 32, "hidden_size": 4096}, {"num_tokens": 64, "hidden_size": 2048}]}
    assert Staircase.from_json(env) == st
    box = Staircase.from_json({"num_tokens": [1, 64], "hidden_size": [8, 4096]})  # a receipt before corners
    assert box.corners == ((64, 4096),) and box.matches(CallDescriptor(num_tokens=64, hidden_size=4096))
    assert not box.matches(CallDescriptor(num_tokens=65, hidden_size=8))


@pytest.mark.parametrize("env, msg", [
    ({"tokens": [1, 2]}, "expected a descriptor field"),
    ({"num_tokens": [3, 2]}, "expected a descriptor field and"),
    ({"num_tokens": [1, 8], "corners": [{"hidden_size": 4}]}, "corners must be a list"),
    ({"num_tokens": [1, 8], "corners": [{"num_tokens": 9}]}, "outside the bounds"),
])
def test_a_malformed_envelope_is_rejected(env, msg):
    with pytest.raises(CapabilityError, match=msg):
        Staircase.from_json(env)
