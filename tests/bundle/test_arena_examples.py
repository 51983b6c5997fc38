"""Every bundle the arena publishes (../shared/arena-examples) gets the verdict its README lists.

The bundles are Apache-2.0 and not ours: they are run through the CLI in the default mode
(isolated worker, random seeds), never copied. The test skips when ../shared is absent.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kernelslot.cli import main

ARENA = Path(__file__).resolve().parents[2].parent / "shared" / "arena-examples"
pytestmark = pytest.mark.skipif(not ARENA.is_dir(), reason=f"{ARENA} is absent (the shared arena corpus)")

MINUS_ONE_PROFILES = {"ep_shard_minus_one", "decode_t1_ep_minus_one", "large_batch_ep", "all_ids_minus_one_rows",
                      "repeated_ids_dominant_weight"}

# bundle -> (exit status, a fragment the one-line error or the summary must hold)
REJECTED = {
    "miner_attention_decode_torch": "earlier attention.decode signature, the dense decode entry(q, k, v, seq_lens, sm_scale, out); "
                                    "the current signature is entry(q, k_cache, v_cache, req_to_token",
    "miner_setup_demo": "ops[0].setup: not admitted: a host callback",
}
TRITON = ("miner_silu_triton", "miner_rmsnorm_triton", "miner_silu_broken", "miner_silu_sparse", "miner_rmsnorm_broken")
PASSES = ("miner_silu_torch", "miner_attention_torch")  # and the override, below
SLOW = {"miner_attention_torch"}  # ~15 s on a loaded machine


def verify(name: str, tmp_path: Path, capsys, *extra: str) -> tuple[int, str, dict | None]:
    out = tmp_path / "report.json"
    rc = main(["verify", str(ARENA / name), "--quiet", "--json", str(out), "--envelope-field", "num_tokens", *extra])
    cap = capsys.readouterr()
    return rc, cap.out + cap.err, json.loads(out.read_text()) if out.exists() else None


def results(report: dict) -> list[dict]:
    return [r for s in report["slots"] for r in s["results"] if r["status"] != "skip"]


def failing(name: str, tmp_path: Path, capsys, *extra: str) -> tuple[str, list[dict], list[dict]]:
    """Run a bundle that must fail: its output, the profile runs and the failed ones (at least one)."""
    rc, text, report = verify(name, tmp_path, capsys, *extra)
    assert rc == 1, text
    ran = results(report)
    failed = [r for r in ran if r["status"] == "fail"]
    assert failed, text
    return text, ran, failed


def test_every_arena_bundle_is_covered():
    named = set(REJECTED) | set(TRITON) | set(PASSES) | {
        "miner_m3_swigluoai_override", "miner_silu_broken_torch", "miner_moe_fused_experts_torch", "miner_allreduce_torch", "miner_moe_fused_experts_reduce_torch"}
    assert {p.name for p in ARENA.iterdir() if p.is_dir()} == named


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_at_load_with_one_line(name, tmp_path, capsys):
    rc, text, _ = verify(name, tmp_path, capsys)
    assert rc == 2, text
    lines = [ln for ln in text.strip().splitlines() if not ln.startswith("kernelslot: seeds")]
    assert len(lines) == 1 and "Traceback" not in text, text
    assert REJECTED[name] in lines[0]


# The Triton bundles run under Triton's interpreter on CPU tensors (verify/interpreted.py; docs/bundles.md,
# "Triton rows on a CPU"): every verdict says so, and each failure says what a Triton author changes.
INTERPRETED = "triton-interpreter on cpu; CUDA not run"
RESHAPED = ("cannot be viewed as 2-D, so out.reshape(-1, ", "returns a copy and the kernel stored into the copy; "
            "do not reshape out: store through out.stride()")
X_STRIDES = ("tensor with x's strides (", "the kernel indexed out with those strides; index it with its own, out.stride() = ",
             "pass out.stride(0) to the kernel as its row stride")
ONE_ROW = ("single_token",)  # the rmsnorm profile whose out has one row: a row stride cannot be wrong there
TWO_D_SILU = ("single_token", "ragged_rows_nonpow2", "decode_batch", "saturating_large_values")


def interpreted(name: str, tmp_path: Path, capsys, *extra: str) -> tuple[str, list[dict], list[dict]]:
    """A Triton bundle's failing run under the interpreter: its output, the profile runs and the failed ones."""
    text, ran, failed = failing(name, tmp_path, capsys, *extra)
    assert f"evidence: {INTERPRETED}]" in text and f"FAIL ({INTERPRETED}): 0/1 slots passed" in text, text
    assert all(r["evidence"] == INTERPRETED for r in ran)
    return text, ran, failed


def fails_with(r: dict) -> dict[str, str]:
    return {c["name"]: c["message"] for c in r["checks"] if c["status"] == "fail"}


def check_reshaped(failed: list[dict]) -> None:
    """Each failure is miner_silu_triton's launcher: a 3-D out reshaped into a copy, left poisoned."""
    for r in failed:
        fails = fails_with(r)
        assert set(fails) == {"poison_left"} and all(f in fails["poison_left"] for f in RESHAPED), fails


def check_x_strides(failed: list[dict]) -> None:
    """Each failure is miner_rmsnorm_triton's launcher: out stored with x's row stride."""
    for r in failed:
        fails = fails_with(r)
        assert set(fails) == {"poison_left", "out_of_bounds_write"}, fails
        assert all(f in m for m in fails.values() for f in X_STRIDES), fails


def test_silu_triton_leaves_a_reshaped_3d_out_poisoned(tmp_path, capsys):
    _, ran, failed = interpreted("miner_silu_triton", tmp_path, capsys, "--profile", "leading_dims_3d")
    check_reshaped(failed)
    assert {(r["profile"], r["dtype"]) for r in failed} >= {("leading_dims_3d", "bfloat16"), ("leading_dims_3d", "float16")}
    assert any(r["status"] == "pass" for r in ran)  # its num_tokens boundaries have one leading dimension: viewable


def test_rmsnorm_triton_stores_out_with_x_row_stride(tmp_path, capsys):
    _, _, failed = interpreted("miner_rmsnorm_triton", tmp_path, capsys, "--profile", "ragged_rows_nonpow2")
    check_x_strides(failed)
    assert "(13, 1000) tensor with x's strides (1000, 1), contiguous" in fails_with(failed[0])["poison_left"]


def test_silu_sparse_fails_compare_naming_its_rows(tmp_path, capsys):
    _, ran, failed = interpreted("miner_silu_sparse", tmp_path, capsys, "--profile", "ragged_rows_nonpow2")
    assert failed == ran and all(set(fails_with(r)) == {"compare"} for r in failed)
    rows = {r["profile"]: fails_with(r)["compare"] for r in failed}
    assert "in 1 of 37 rows: 0;" in rows["ragged_rows_nonpow2"], rows  # SiLU dropped on every 64th row


@pytest.mark.slow
@pytest.mark.parametrize("name", ["miner_silu_triton", "miner_rmsnorm_triton"])
def test_the_arena_honest_triton_bundles_fail_only_where_out_is_padded_their_way(name, tmp_path, capsys):
    """Every profile, drawn and boundary run: each failure is the launcher's layout mistake, and they pass
    wherever out happens to be laid out as the launcher assumes (2-D silu outputs, one-row rmsnorm outputs)."""
    _, ran, failed = interpreted(name, tmp_path, capsys)
    (check_reshaped if name == "miner_silu_triton" else check_x_strides)(failed)
    fixed = {r["profile"]: r["status"] for r in ran if not r["drawn"] and "@" not in r["profile"]}
    passing = TWO_D_SILU if name == "miner_silu_triton" else ONE_ROW
    assert {p for p, st in fixed.items() if st == "pass"} == set(passing), fixed


@pytest.mark.slow
@pytest.mark.parametrize("name", ["miner_silu_broken", "miner_silu_sparse", "miner_rmsnorm_broken"])
def test_the_arena_broken_triton_bundles_fail_compare_naming_the_rows(name, tmp_path, capsys):
    """Every profile run fails: compare, naming the rows, where out is written; elsewhere the launcher's
    layout mistake (the broken bundles share the honest ones' launchers) is found first."""
    _, ran, failed = interpreted(name, tmp_path, capsys)
    assert failed == ran
    compared = [fails_with(r)["compare"] for r in failed if "compare" in fails_with(r)]
    rows = {"miner_silu_broken": r"in \d+ of \d+ rows: 0[,;]",  # SiLU dropped on every row (a row of large gates can still match)
            "miner_silu_sparse": r"in 1 of \d+ rows: 0;",  # on rows 0, 64, ...: row 0 of every profile (<= 40 rows)
            "miner_rmsnorm_broken": r"in 1 of 1 rows: 0;"}[name]  # written whole only where out has one row
    assert compared and all(re.search(rows, m) for m in compared), compared
    (check_reshaped if "silu" in name else check_x_strides)([r for r in failed if "compare" not in fails_with(r)])


@pytest.mark.parametrize("name", TRITON)
def test_without_triton_a_triton_bundle_is_not_run(name, tmp_path, capsys, monkeypatch):
    from kernelslot.verify import interpreted as interp

    monkeypatch.setattr(interp, "importable", lambda package: package != "triton")
    rc, text, report = verify(name, tmp_path, capsys)
    assert rc == 3, text
    assert "NOT RUN" in text and "needs CUDA" in text and "triton is not installed" in text
    assert report["slots"][0]["status"] == "not run" and not report["slots"][0]["results"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in PASSES])
def test_faithful_bundles_pass(name, tmp_path, capsys):
    rc, text, report = verify(name, tmp_path, capsys)
    assert rc == 0, text
    assert results(report) and all(r["status"] == "pass" for r in results(report))


def test_override_is_judged_on_the_minimax_profiles(tmp_path, capsys):
    rc, text, report = verify("miner_m3_swigluoai_override", tmp_path, capsys)
    assert rc == 0, text
    ran = results(report)
    assert {r["model"] for r in ran} == {"MiniMax-M3"} and {r["dtype"] for r in ran} == {"bfloat16", "float16"}
    assert "gemm1_epilogue_ref in fused_experts.gemm1_epilogue" in text


def test_dropped_silu_fails_compare(tmp_path, capsys):
    rc, text, report = verify("miner_silu_broken_torch", tmp_path, capsys)
    assert rc == 1, text
    assert results(report) and all(
        any(c["name"] == "compare" and c["status"] == "fail" for c in r["checks"]) for r in results(report))


def test_unbound_moe_bundle_fails_only_on_minus_one_profiles(tmp_path, capsys):
    rc, text, report = verify("miner_moe_fused_experts_torch", tmp_path, capsys)
    assert rc == 1, text
    ran = results(report)
    assert {r["model"] for r in ran} == {"generic"}  # it names no model: never judged on MiniMax-M3's swigluoai
    base = lambda r: r["profile"].split("@")[0]  # noqa: E731 - a boundary profile (verified envelope) is judged as its base
    failed = {base(r) for r in ran if r["status"] == "fail"}
    drawn_minus_one = {r["profile"] for r in ran if r["drawn"] and r["drawn"]["dims"]["drop"] > 0}
    assert failed == (MINUS_ONE_PROFILES | drawn_minus_one) & {base(r) for r in ran}, text
    assert failed and any(r["status"] == "pass" for r in ran)


GLOO_PADDING = "gloo's all_reduce reduces the"  # the collective referee's explanation
GLOO_FIX = "reduce a contiguous temporary, then copy into the output"


@pytest.mark.slow
def test_allreduce_fails_only_on_padded_outputs(tmp_path, capsys):
    text, ran, failed = failing("miner_allreduce_torch", tmp_path, capsys)
    assert len(failed) < len(ran), text
    for r in failed:  # the padding write, explained; and, on the calls whose values are compared, the
        # view's last rows that gloo left unreduced (a numeric failure of the same cause, on a replay, or on
        # the repeat of the plain-output call, whose contiguous view gloo reduced right: determinism)
        fails = [c for c in r["checks"] if c["status"] == "fail"]
        names = {c["name"] for c in fails}
        assert "out_of_bounds_write" in names and names <= {"out_of_bounds_write", "replay", "compare", "determinism"}, fails
        assert all(GLOO_PADDING in c["message"] and GLOO_FIX in c["message"] for c in fails if c["name"] == "out_of_bounds_write")


@pytest.mark.slow
def test_fused_experts_reduce_fails_with_a_reason_per_profile(tmp_path, capsys):
    text, ran, failed = failing("miner_moe_fused_experts_reduce_torch", tmp_path, capsys)
    assert all(any(c["status"] == "fail" and c["message"] for c in r["checks"]) for r in failed)
    assert any(r["profile"] == "ep_padded_ids.w2" for r in failed)  # the -1 ids mapped to expert E-1
    assert GLOO_PADDING in text and GLOO_FIX in text
