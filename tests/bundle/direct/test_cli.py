"""Direct bundles through the CLI, in the default isolated mode."""
from __future__ import annotations

import shutil

import pytest

from kernelslot.cli import main

from .conftest import EXAMPLES


def test_honest_moe_artifact_passes_a_profile_in_the_worker(capsys):
    rc = main(["verify", str(EXAMPLES / "direct_moe"), "--quiet", "--profile", "ep_shard_minus_one", "--dtype", "bfloat16"])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert "worker" in out.out and "PASS: 1/1 slots passed" in out.out


def test_scan_shows_bindings_inventory_and_seal(capsys):
    assert main(["scan", str(EXAMPLES / "direct_moe")]) == 0
    out = capsys.readouterr().out
    assert "export pack_bf16: role prepare" in out and "prelaunch: fill workspace.acc with 0" in out
    assert "binding 3: pointer prepared.w13 (host_ptr) [8 B]" in out
    assert "kernel ks_moe_pack_f32: declared [8, 8, 8, 8, 8, 8, 8, 8]; object [8, 8, 8, 8, 8, 8, 8, 8]" in out
    assert "index sha256" in out and "artifact.so" in out and "network: " in out


def test_cuda_artifact_is_not_run_without_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the CUDA provider runs (tests/bundle/direct needs a GPU check instead)")
    rc = main(["verify", str(EXAMPLES / "direct_cuda_activation"), "--quiet"])
    out = capsys.readouterr()
    assert rc == 3, out.out + out.err
    assert "NOT RUN: 0/0 slots passed" in out.out and "not run: activation.silu_and_mul (" in out.out
    assert "Traceback" not in out.err
    if shutil.which("nvcc"):  # the CUBIN is still built, sealed and inspected here
        assert main(["scan", str(EXAMPLES / "direct_cuda_activation")]) == 0
        out = capsys.readouterr().out
        assert "kernel ks_silu_and_mul_f32: declared [8, 8, 8, 8, 12, 8, 8, 8, 8, 8, 8]; object [8, 8, 8, 8, 12" in out


def test_a_mixed_bundle_runs_every_row_it_can(tmp_path, capsys, monkeypatch):
    """A bundle of a Python kernel and a direct row this machine cannot build (its builder's
    toolchain is missing, simulated): the kernel row gets its verdict, the direct row is recorded as
    not run with its reason — not the whole bundle."""
    import json

    import kernelslot.bundle.direct as direct

    def no_toolchain(op, root):
        raise direct.ToolchainMissing("the cuda.cubin.v1 builder needs nvcc, which is not installed here")

    monkeypatch.setattr(direct, "build_and_seal", no_toolchain)
    bundle = tmp_path / "mixed"
    shutil.copytree(EXAMPLES / "direct_cuda_activation", bundle)
    for f in ("rmsnorm.py", "metadata.json"):
        shutil.copy(EXAMPLES / "honest_norm" / f, bundle / f)
    manifest = (bundle / "manifest.toml").read_text()
    head, ops = manifest.split("[[ops]]", 1)
    norm = ('[[ops]]\nslot = "norm.rmsnorm"\nsource = "rmsnorm.py"\nentry = "rmsnorm"\nmetadata = "metadata.json"\n'
            '[ops.domain]\nmodel = { exact = "MiniMax-M3" }\n\n')
    (bundle / "manifest.toml").write_text(head + norm + "[[ops]]" + ops)
    report = tmp_path / "r.json"
    rc = main(["verify", str(bundle), "--quiet", "--in-process", "--dtype", "float32", "--envelope-field", "num_tokens",
               "--json", str(report)])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert "PASS: 1/1 slots passed" in out.out and "not run: activation.silu_and_mul (the cuda.cubin.v1 builder" in out.out
    slots = {s["slot"]: s for s in json.loads(report.read_text())["slots"]}
    assert slots["norm.rmsnorm"]["status"] == "pass" and slots["activation.silu_and_mul"]["status"] == "not run"
    assert slots["activation.silu_and_mul"]["not_run"]
