"""Interpreted-Triton evidence (verify/interpreted.py): a bundle row with Triton kernels runs, on a CPU, under
Triton's interpreter in the sandboxed worker; its verdict says which evidence it rests on; what the interpreter
cannot run makes the row "not run" with the interpreter's message, never a failure."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from kernelslot.bundle import load_bundle
from kernelslot.cli import main
from kernelslot.report.payload import payload_from_store
from kernelslot.slots import get_slot
from kernelslot.slots.base import Needs
from kernelslot.store import ResultStore
from kernelslot.verify import InProcessRunner, VerifyOptions, verify_slot
from kernelslot.verify import interpreted as interp
from kernelslot.verify.interpreted import EVIDENCE, interpreted, interpreted_sizes, interpreter_limit, why_not_interpreted

pytest.importorskip("triton", reason="triton not installed (pip install 'kernelslot[triton]')")
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

SLOT = "activation.silu_and_mul"
ROW = f'[[ops]]\nslot = "{SLOT}"\nsource = "k.py"\nentry = "silu_and_mul"\ndtypes = ["float32"]\narchitectures = ["sm90"]\n'
KERNEL = '''import torch
import triton
import triton.language as tl
{imports}


@triton.jit
def _silu(x_ptr, out_ptr, d, sx0, so0, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    col = tl.arange(0, BLOCK)
    mask = col < d
    gate = tl.load(x_ptr + row * sx0 + col, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * sx0 + d + col, mask=mask, other=0.0)
    y = {value}
    tl.store(out_ptr + row * so0 + col, y, mask=mask)


def silu_and_mul(x, out):
    d = out.shape[-1]
    {launcher}
    _silu[(x.shape[0],)](x, out, d, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(d))
'''
SILU = "gate * tl.sigmoid(gate) * up"
TWO_D = ("single_token", "ragged_rows_nonpow2")  # 2-D outputs: the kernel above indexes rows through out.stride(0)
FAST = VerifyOptions(profiles=TWO_D, dtypes=(torch.float32,), draws=0)


def bundle(tmp_path: Path, value: str = SILU, launcher: str = "pass", extra_row: str = "", imports: str = "") -> Path:
    """A bundle of one Triton row (``value``: the kernel's ``y``; ``launcher``: a host line before the launch),
    ``extra_row`` after it."""
    tmp_path.mkdir(exist_ok=True)
    row = ROW + ('variant = "triton"\n' if extra_row else "")
    (tmp_path / "manifest.toml").write_text('bundle_id = "tri"\nabi_version = "cacheon-op-abi-v0"\n' + row + extra_row)
    (tmp_path / "k.py").write_text(KERNEL.format(value=value, launcher=launcher, imports=imports))
    return tmp_path


def candidates(path: Path):
    return load_bundle(path).candidates(device="cpu")[SLOT]


def test_a_triton_row_passes_in_the_worker_and_every_verdict_says_its_evidence(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["verify", str(bundle(tmp_path / "b")), "--quiet", "--json", str(out), "--store", str(tmp_path / "s.db"),
               "--profile", "single_token", "--profile", "ragged_rows_nonpow2", "--seed-base", "5"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert f"cpu; evidence: {EVIDENCE}]" in text and f"=> PASS ({EVIDENCE}):" in text and f"PASS ({EVIDENCE}): 1/1" in text
    p = json.loads(out.read_text())
    slot = p["slots"][0]
    assert p["runner"].startswith("worker") and p["verdict"] == f"pass ({EVIDENCE})" and p["evidence"] == EVIDENCE
    assert slot["verdict"] == f"pass ({EVIDENCE})" and slot["status"] == "pass"
    ran = [r for r in slot["results"] if not r["skipped_reason"]]
    assert ran and all(r["evidence"] == EVIDENCE for r in ran)
    assert any("up to the slot's interpreted sizes (num_tokens <= 40, hidden_size <= 1024)" in n for n in slot["notes"])
    assert main(["report", str(tmp_path / "s.db"), "-o", str(tmp_path / "p.html")]) == 0
    page = (tmp_path / "p.html").read_text()
    assert f'id="evidence">({EVIDENCE})' in page and f"evidence: {EVIDENCE}" in page


def test_the_interpreted_candidate_drops_arch_and_runs_within_the_slots_interpreted_sizes(tmp_path):
    (cand,) = candidates(bundle(tmp_path))
    assert cand.needs.interpret and "needs CUDA" in cand.needs.unmet("cpu")
    run = interpreted(cand, get_slot(SLOT))
    assert run.kernel.source.interpret and run.kernel.entry is None and run.needs == Needs()
    assert "arch" not in run.domain.describe() and "dtype in ['float32']" in run.domain.describe()
    assert "0 <= num_tokens <= 40" in run.domain.describe() and "0 <= hidden_size <= 1024" in run.domain.describe()
    small = dataclasses.replace(get_slot(SLOT), interpreted_sizes={"num_tokens": 8})
    report = verify_slot(small, cand, FAST, runner=InProcessRunner())
    assert report.passed and report.evidence == EVIDENCE
    assert {r.profile for r in report.results if not r.skipped_reason} == {"single_token"}
    (big,) = [r for r in report.results if r.profile == "ragged_rows_nonpow2"]
    assert big.skipped_reason == "outside declared domain: 0 <= num_tokens <= 8" and big.evidence == ""


def test_interpreted_sizes_are_the_slots_or_its_fixed_profiles_largest():
    assert interpreted_sizes(get_slot("norm.rmsnorm")) == {"num_tokens": 64, "hidden_size": 2048}
    sdpa = get_slot("attention.sdpa")
    assert sdpa.interpreted_sizes is None
    sizes = interpreted_sizes(sdpa)
    assert sizes and all(v >= 1 for v in sizes.values())
    largest = max(sdpa.describe(sdpa.make_case(p, torch.Generator().manual_seed(0))).num_tokens for p in sdpa.profiles)
    assert sizes["num_tokens"] == largest


@pytest.mark.parametrize("value, launcher, words, imports", [
    ('tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [gate], dtype=tl.float32, is_pure=True, pack=1) * up', "pass",
     "NotImplementedError('inline_asm not supported in interpreter mode') (at k.py:14 in _silu: y = tl.inline_asm", ""),
    ("gate * up + tl.extra.cuda.globaltimer().to(tl.float32)", "pass",
     "ValueError('Did you forget to add @triton.jit ? (`_semantic` argument must be provided outside of JIT functions.)')"
     " (at k.py:14 in _silu: y = gate * up + tl.extra.cuda.globaltimer()", ""),
    ("libdevice.tanh(gate)", "pass",
     "cannot convert None of type <class 'NoneType'> to tensor\") (at k.py:15 in _silu: tl.store(out_ptr + row * so0 + col, y, "
     "mask=mask)); its libdevice functions return None under the interpreter", "from triton.language.extra import libdevice"),
    (SILU, "torch.cuda.current_stream()", "it needs CUDA beyond its Triton kernels: Torch not compiled with CUDA enabled "
                                         "(at k.py:20 in silu_and_mul: torch.cuda.current_stream())", ""),
], ids=["inline_asm", "globaltimer", "libdevice", "torch_cuda"])
def test_what_the_interpreter_cannot_run_is_not_run_with_its_message(tmp_path, value, launcher, words, imports):
    path = bundle(tmp_path, value, launcher, imports=imports)
    report = verify_slot(get_slot(SLOT), candidates(path), FAST, runner=InProcessRunner())
    assert report.status == "not run" and words in report.not_run, report.not_run
    assert not report.results and not report.failed_checks()


def test_the_interpreters_limit_on_one_profile_makes_the_whole_row_not_run(tmp_path):
    """A kernel cannot trade the profiles it fails for "not run": the row is not run, not those profiles."""
    path = bundle(tmp_path)
    asm = 'tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [y], dtype=tl.float32, is_pure=True, pack=1)'
    source = (path / "k.py").read_text()
    (path / "k.py").write_text(source.replace(f"    y = {SILU}\n", f"    y = {SILU}\n    if d > 100:\n        y = {asm}\n"))
    report = verify_slot(get_slot(SLOT), candidates(path), FAST, runner=InProcessRunner())
    assert report.status == "not run" and "inline_asm not supported in interpreter mode" in report.not_run


@pytest.mark.parametrize("value", ["tl.reshape(gate, (BLOCK // 2, 3)) * up", "gate * tl.sigmoid(gate)"],
                         ids=["shape_error", "wrong_value"])
def test_a_kernel_mistake_under_the_interpreter_is_a_failure(tmp_path, value):
    report = verify_slot(get_slot(SLOT), candidates(bundle(tmp_path, value)), FAST, runner=InProcessRunner())
    assert report.status == "fail" and report.evidence == EVIDENCE, report.not_run
    assert report.failed_checks() & {"raised", "compare"}
    assert interpreter_limit("triton.runtime.errors.InterpreterError: ValueError('Shape element 1 must be a power of 2')") is None


def test_timing_is_not_run_under_the_interpreter(tmp_path):
    report = verify_slot(get_slot(SLOT), candidates(bundle(tmp_path)), dataclasses.replace(FAST, time=True),
                         runner=InProcessRunner())
    assert report.passed and not any(r.timing for r in report.results)
    assert f"tri:{SLOT}: timing not run ({EVIDENCE})" in report.notes


def test_a_cpu_row_and_a_triton_row_of_one_slot_each_get_their_own_evidence(tmp_path):
    torch_row = ROW.replace('source = "k.py"', 'source = "t.py"').replace('"sm90"', '"cpu"').replace('"float32"', '"bfloat16"')
    path = bundle(tmp_path, extra_row=torch_row + 'variant = "torch"\n')
    (path / "t.py").write_text("import torch.nn.functional as F\n\ndef silu_and_mul(x, out):\n"
                               "    d = out.shape[-1]\n    out.copy_(F.silu(x[..., :d].float()) * x[..., d:].float())\n")
    opts = VerifyOptions(profiles=TWO_D, dtypes=(torch.float32, torch.bfloat16), draws=0)
    report = verify_slot(get_slot(SLOT), candidates(path), opts, runner=InProcessRunner())
    assert report.passed, report.errors
    by = {(r.kernel, r.dtype): r.evidence for r in report.results if not r.skipped_reason}
    assert by == {(k, d): EVIDENCE if d == "float32" else "" for k, d in by} and len(set(by.values())) == 2
    row = f"tri:{SLOT}[triton]"
    assert report.evidence == f"{row}: {EVIDENCE}" and report.verdict == f"pass ({row}: {EVIDENCE})"
    store = ResultStore(tmp_path / "s.db")
    run = store.start_run("kernelslot verify", "cpu", "in-process", "tri", "h")
    store.add_report(run, report)
    assert payload_from_store(store, run)["slots"][0]["evidence"] == report.evidence  # read back by variant too
    store.close()


def test_without_triton_a_triton_row_is_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(interp, "importable", lambda p: p != "triton")
    report = verify_slot(get_slot(SLOT), candidates(bundle(tmp_path)), FAST, runner=InProcessRunner())
    assert report.status == "not run" and not report.results
    assert report.not_run == ("needs CUDA (architectures sm_90); no CUDA device here, and triton is not installed to run "
                              "its Triton kernels under the interpreter (pip install 'kernelslot[triton]')")


def test_which_rows_are_interpreted():
    native = "needs CUDA (architectures sm_90); no CUDA device here"
    assert why_not_interpreted(Needs(("sm_90",), ("triton",), interpret=True), "cpu", native) is None
    assert why_not_interpreted(Needs(("sm_90",)), "cpu", native) == native  # no Triton kernels: nothing to interpret
    assert why_not_interpreted(Needs(("sm_90",), ("triton",), interpret=True), "sm_80", "x") == "x"  # a CUDA device
    blocked = Needs((), ("triton",), blocked="its toolchain is missing", interpret=True)
    assert why_not_interpreted(blocked, "cpu", "its toolchain is missing") == "its toolchain is missing"
    cupy = why_not_interpreted(Needs((), ("triton", "cupy"), interpret=True), "cpu", "needs CUDA (imports triton); x")
    assert cupy.endswith("; it imports cupy, which Triton's interpreter cannot run")
    assert why_not_interpreted(Needs((), ("triton", "no_such_pkg"), interpret=True), "cpu", "needs CUDA (imports triton)") \
        == "needs the no_such_pkg package; it is not installed here"


def test_a_row_whose_profiles_all_exceed_the_interpreted_sizes_is_not_run(tmp_path):
    """Not a failure "never exercised": its declared domain admits profiles the interpreter does not run here."""
    path = bundle(tmp_path)
    (path / "manifest.toml").write_text((path / "manifest.toml").read_text() + "[ops.domain]\nnum_tokens = { range = [16, 4096] }\n")
    small = dataclasses.replace(get_slot(SLOT), interpreted_sizes={"num_tokens": 8})
    report = verify_slot(small, candidates(path), FAST, runner=InProcessRunner())
    assert report.status == "not run" and report.not_run == (
        "none of its profiles fits the slot's interpreted sizes (num_tokens <= 8); verify it on a GPU")
    never = VerifyOptions(profiles=("single_token",), dtypes=(torch.float32,), draws=0)  # outside what it declares
    assert verify_slot(small, candidates(path), never, runner=InProcessRunner()).status == "fail"
