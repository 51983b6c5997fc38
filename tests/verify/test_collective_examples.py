"""Every collective example bundle gets its documented verdict through ``kernelslot verify DIR --world-size N``
in the default (isolated) mode: the candidate loads in every rank from the bundle's own files."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelslot.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# example -> (exit status, texts that must all appear in stdout+stderr)
EXPECTED = {
    "collective_honest_all_reduce": (0, ["PASS: 1/1 slots passed"]),
    "collective_honest_ar_residual_rmsnorm": (0, ["PASS: 1/1 slots passed"]),
    "collective_honest_moe_finalize_ar_rmsnorm": (0, ["PASS: 1/1 slots passed"]),
    "collective_honest_fused_experts_reduce": (0, ["PASS: 1/1 slots passed"]),
    "collective_broken_reduce_padded_out": (1, ["out_of_bounds_write: rank 0: output out: wrote outside its view",
                                                "reduce a contiguous temporary, then copy into the output"]),
    "collective_broken_no_reduce": (1, ["compare: rank 0: out_norm: matched_ratio"]),
    "collective_broken_rank0_writes": (1, ["poison_left: rank 1: output out_norm"]),
    "collective_broken_no_group_arg": (2, ["takes 2 positional arguments, the slot passes 3: entry(x, out, group)"]),
}


def test_every_collective_example_has_an_expectation():
    assert {p.name for p in EXAMPLES.iterdir() if p.name.startswith("collective_")} == set(EXPECTED)


def _verify(name: str, capsys, *extra: str) -> tuple[int, str]:
    rc = main(["verify", str(EXAMPLES / name), "--quiet", "--world-size", "2", *extra])
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_collective_example_verdict(name, capsys):
    status, texts = EXPECTED[name]
    rc, text = _verify(name, capsys, "--dtype", "float32", "--profile", *_one_profile(name))
    assert rc == status, text
    for t in texts:
        assert t in text, text
    assert "collective(isolated ranks)" in text or status == 2


def _one_profile(name: str) -> list[str]:
    """The default suite runs one padded float32 profile per example (the slow test runs them all)."""
    return {"collective_honest_fused_experts_reduce": ["ep_padded_ids.w2"],
            "collective_honest_moe_finalize_ar_rmsnorm": ["head_trimmed_nonpow2.w2"],
            "collective_broken_rank0_writes": ["decode_full.w2"]}.get(name, ["decode_batch.w2"])


@pytest.mark.slow  # every profile at world sizes 2 and 4: about a minute on two cores
@pytest.mark.parametrize("name", sorted(n for n, (s, _) in EXPECTED.items() if s != 2))
def test_collective_example_verdict_every_profile_world_2_and_4(name, capsys):
    status, texts = EXPECTED[name]
    rc, text = _verify(name, capsys, "--world-size", "4")
    assert rc == status, text
    for t in texts:
        assert t in text, text
