"""Every example bundle gets its documented verdict through the CLI."""
from __future__ import annotations

from pathlib import Path

import pytest

from kernelslot.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# example -> (exit status, text that must appear in stdout+stderr)
EXPECTED = {
    "honest_activation": (0, "PASS: 1/1 slots passed"),
    "honest_norm": (0, "PASS: 1/1 slots passed"),
    "honest_attention": (0, "PASS: 1/1 slots passed"),
    "honest_moe_fused_experts": (0, "PASS: 1/1 slots passed"),  # MiniMax-M3: dense swigluoai + NVFP4 prepare
    "honest_moe_block_tkg": (0, "PASS: 1/1 slots passed"),  # every model profile and expert format
    "direct_activation": (0, "PASS: 1/1 slots passed"),  # sealed native artifacts (docs/direct-artifacts.md)
    "direct_moe": (0, "PASS: 1/1 slots passed"),
    "direct_cuda_activation": (3, "NOT RUN"),  # on a CUDA machine: tests/bundle/direct (not run here)
    "direct_broken_extra_kernel": (2, "extra exported kernel(s) ks_debug_dump"),
    "direct_broken_missing_kernel": (2, "missing kernel(s) ks_silu_tail_f32"),
    "direct_broken_param_width": (2, "parameter 2 is 4 bytes wide in the object, the manifest declares 8"),
    "direct_broken_vocabulary": (2, "is outside the expression vocabulary"),
    "direct_broken_prelaunch_input": (2, "a prelaunch fill may initialise only an output or an artifact resource"),
    "direct_broken_work_in_init": (2, "is not available to an init export"),
    "honest_override": (0, "PASS: 1/1 slots passed"),
    "notrun_cuda_only": (3, "not run: activation.silu_and_mul (needs CUDA (architectures sm_80, sm_90); no CUDA device here)"),
    "broken_partial_write": (1, "poison_left"),
    "broken_returns_tensor": (1, "returned_value"),
    "broken_unknown_slot": (2, "ops[0].slot: unknown slot 'activation.gelu_and_mul'"),
    "broken_path_escape": (2, "leaves the bundle"),
    "broken_overlapping_variants": (2, "overlap"),
    "broken_wrong_arity": (2, "takes 3 positional arguments, the slot passes 4"),
    "broken_bad_predicate": (2, "unknown predicate 'at_most'"),
}


def test_every_example_has_an_expectation():
    # collective_* examples run across rank processes: tests/verify/test_collective_examples.py
    assert {p.name for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith("collective_")} == set(EXPECTED)


SLOW = {"honest_moe_fused_experts", "honest_moe_block_tkg",  # MoE profiles in a worker: tens of seconds on a loaded machine
        "direct_moe"}  # every profile of a C MoE kernel; tests/bundle/direct runs one profile by default


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(EXPECTED)])
def test_example_verdict(name, capsys):
    status, text = EXPECTED[name]
    # the envelope runs along num_tokens only, its cases clipped to 2 MiB: the verdicts, at a test's cost
    # (every field's boundaries: tests/verify/test_envelope.py and the wider_* cheats)
    rc = main(["verify", str(EXAMPLES / name), "--quiet", "--dtype", "float32", "--dtype", "bfloat16",
               "--envelope-field", "num_tokens", "--envelope-mib", "2"])
    out = capsys.readouterr()
    assert rc == status, out.out + out.err
    assert text in out.out + out.err
    if status == 2:  # bad input is one line, never a traceback
        assert "Traceback" not in out.err and len(out.err.strip().splitlines()) == 1
