from __future__ import annotations

import pytest

from kernelslot.abi import CallDescriptor, CapabilityDomain, CapabilityError, domains_overlap


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
