"""The effective domain of an op row: manifest and metadata conjoined, canonical spellings,
contradictions as one-line errors, keys the arena uses that kernelslot does not admit."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from kernelslot.abi import CallDescriptor
from kernelslot.bundle import ManifestError, load_bundle, load_manifest
from kernelslot.cli import main
from kernelslot.slots import get_slot
from kernelslot.slots.base import Needs
from kernelslot.verify import VerifyOptions, verify_slot

HEAD = 'bundle_id = "b"\nabi_version = "cacheon-op-abi-v0"\n'
SILU = '[[ops]]\nslot = "activation.silu_and_mul"\nsource = "k.py"\nentry = "entry"\n'
SOURCE = "def entry(x, out):\n    out.copy_(x[..., : x.shape[-1] // 2])\n"


def bundle(tmp_path: Path, extra: str = "", meta: dict | None = None, source: str = SOURCE, head: str = HEAD) -> Path:
    body = head + SILU + ('metadata = "m.json"\n' if meta is not None else "") + extra
    (tmp_path / "manifest.toml").write_text(textwrap.dedent(body))
    (tmp_path / "k.py").write_text(source)
    if meta is not None:
        (tmp_path / "m.json").write_text(json.dumps(meta))
    return tmp_path


def row(tmp_path: Path, extra: str = "", meta: dict | None = None):
    return load_manifest(bundle(tmp_path, extra, meta)).ops[0]


def desc(**kw) -> CallDescriptor:
    base = dict(model="generic", dtype="bfloat16", arch="cpu", num_tokens=4, hidden_size=64, last_dim=128)
    return CallDescriptor(**{**base, **kw})


def test_unbound_row_is_generic_only(tmp_path):
    r = row(tmp_path)
    assert r.model == "generic"
    assert r.domain.matches(desc()) and not r.domain.matches(desc(model="MiniMax-M3"))


def test_metadata_conjoins_with_the_manifest(tmp_path):
    meta = {"model": "MiniMax-M3-NVFP4", "dtypes": ["bf16", "fp16"], "arch": "sm_90a", "max_last_dim": 256,
            "min_num_tokens": 2, "max_num_tokens": 64, "graph_safe": True, "capabilities": {"hidden_dim": {"max": 4096}},
            "notes": "ignored", "correctness": {"metric": "cosine"}}
    r = row(tmp_path, 'dtypes = ["bfloat16", "float32"]\narchitectures = ["sm90", "sm80"]\n', meta)
    assert (r.model, r.dtypes, r.architectures, r.graph_safe) == ("MiniMax-M3", ("bfloat16",), ("sm_90",), True)
    ok = desc(model="MiniMax-M3", arch="sm_90", quant="nvfp4")
    assert r.domain.matches(ok)
    for bad in (dict(dtype="float16"), dict(dtype="float32"), dict(arch="sm_80"), dict(quant="dense"), dict(last_dim=512),
                dict(num_tokens=1), dict(num_tokens=65), dict(hidden_size=8192), dict(model="generic")):
        assert not r.domain.matches(CallDescriptor(**{**ok.__dict__, **bad})), bad


def test_spellings_are_canonical_on_both_sides(tmp_path):
    r = row(tmp_path, 'dtypes = ["bf16", "half"]\narchitectures = ["sm80", "SM_90a", "sm_100"]\n')
    assert r.dtypes == ("bfloat16", "float16") and r.architectures == ("sm_80", "sm_90", "sm_100")
    # the live descriptor is canonical too: a bundle declaring sm80 is exercised on an sm_80 device
    assert r.domain.matches(desc(arch="sm80", dtype="bf16")) and r.domain.matches(desc(arch="sm_90a", dtype="torch.float16"))
    assert Needs(r.architectures).unmet("sm_80") is None
    assert "needs architecture" in Needs(r.architectures).unmet("sm_75")


@pytest.mark.parametrize("extra, meta, key, fragment", [
    ('dtypes = ["float32"]\n', {"dtypes": ["bfloat16"]}, "ops[0].dtypes", "manifest dtypes ['float32'] and metadata dtypes ['bfloat16']"),
    ('architectures = ["sm80"]\n', {"arch": "sm_90"}, "ops[0].architectures", "manifest architectures ['sm_80'] and metadata"),
    ("graph_safe = false\n", {"graph_safe": True}, "ops[0].graph_safe", "manifest graph_safe = false but metadata graph_safe = true"),
    ("", {"op": "norm.rmsnorm"}, "ops[0].metadata.op", "metadata names slot 'norm.rmsnorm'"),
    ("", {"model": "MiniMax-M3", "model_profile": "gpt-oss"}, "ops[0].metadata.model_profile", "name different models"),
    ("", {"model": "llama"}, "ops[0].metadata.model", "model 'llama' is unknown"),
    ("", {"dtypes": ["float64"]}, "ops[0].metadata.dtypes", "unknown dtype 'float64'"),
    ('architectures = ["gfx942"]\n', None, "ops[0].architectures", "unknown architecture 'gfx942'"),
    ("", {"capabilities": {"runtime": "sglang"}}, "ops[0].metadata.capabilities.runtime", "no field 'runtime'"),
    ("", {"max_last_dim": "big"}, "ops[0].metadata.max_last_dim", "non-negative integer"),
    ("[ops.domain]\nnum_tokens = { range = [1, 8] }\n", {"min_num_tokens": 16}, "ops[0]", "contradict each other"),
])
def test_contradictions_are_one_line_errors_naming_both(tmp_path, extra, meta, key, fragment):
    with pytest.raises(ManifestError) as exc:
        load_manifest(bundle(tmp_path, extra, meta))
    msg = str(exc.value)
    assert "\n" not in msg and f": {key}: " in msg and fragment in msg, msg


def test_host_callbacks_are_not_admitted(tmp_path):
    with pytest.raises(ManifestError, match=re.escape(": ops[0].setup: not admitted: a host callback") + ".*outside the slot ABI"):
        load_manifest(bundle(tmp_path, 'setup = "setup"\n'))


def test_dependency_patches_are_not_admitted(tmp_path):
    head = HEAD + "[[dep_patches]]\npackage = 'sglang'\n"
    with pytest.raises(ManifestError, match=": dep_patches: not admitted: dependency patches are not admitted"):
        load_manifest(bundle(tmp_path, head=head))


def test_model_override_rebinds(tmp_path):
    b = load_bundle(bundle(tmp_path, meta={"model": "MiniMax-M3"}))
    (c,) = b.candidates()["activation.silu_and_mul"]
    assert c.model == "MiniMax-M3" and c.domain.matches(desc(model="MiniMax-M3"))
    (g,) = b.candidates(model="generic")["activation.silu_and_mul"]
    assert g.model == "generic" and g.domain.matches(desc()) and not g.domain.matches(desc(model="MiniMax-M3"))


def test_model_bound_row_runs_generic_shapes_with_its_model(tmp_path):
    """A slot without profiles for the bound model judges it on the generic shapes, as that model."""
    (c,) = load_bundle(bundle(tmp_path, meta={"model": "MiniMax-M3"}, source=(
        "import torch.nn.functional as F\n"
        "def entry(x, out):\n    d = x.shape[-1] // 2\n    out.copy_(F.silu(x[..., :d].float()) * x[..., d:])\n"
    ))).candidates()["activation.silu_and_mul"]
    report = verify_slot(get_slot("activation.silu_and_mul"), c, VerifyOptions(dtypes=None, replays=2))
    assert report.passed, [e for e in report.errors]
    assert {r.model for r in report.results} == {"MiniMax-M3"}


def test_scan_prints_the_effective_domain(tmp_path, capsys):
    assert main(["scan", str(bundle(tmp_path, 'dtypes = ["bf16"]\n', {"model": "MiniMax-M3-NVFP4"}))]) == 0
    out = capsys.readouterr().out
    assert "model=MiniMax-M3" in out
    assert "effective domain: model == 'MiniMax-M3' and dtype in ['bfloat16'] and quant == 'nvfp4'" in out


def test_needs_cuda_and_missing_packages_are_not_run(tmp_path, capsys):
    assert Needs(("sm_80",)).unmet("cpu") == "needs CUDA (architectures sm_80); no CUDA device here"
    assert Needs((), ("triton",)).unmet("cpu") == "needs CUDA (imports triton); no CUDA device here"
    assert Needs((), ("no_such_package_xyz",)).unmet("cpu") == "needs the no_such_package_xyz package; it is not installed here"
    assert Needs((), ("torch",)).unmet("cpu") is None
    guarded = "try:\n    import no_such_package_xyz\nexcept ImportError:\n    pass\n"
    b = load_bundle(bundle(tmp_path, source="import no_such_package_xyz\n" + SOURCE))
    assert b.candidates()["activation.silu_and_mul"][0].needs.packages == ("no_such_package_xyz",)
    assert main(["verify", str(tmp_path), "--quiet"]) == 3
    assert "not run: activation.silu_and_mul (needs the no_such_package_xyz package" in capsys.readouterr().out
    b = load_bundle(bundle(tmp_path, source=guarded + SOURCE))
    assert b.candidates()["activation.silu_and_mul"][0].needs.packages == ()


def test_several_rows_exit_with_the_worst_real_verdict(tmp_path, capsys):
    body = (HEAD + SILU + 'variant = "cpu"\narchitectures = ["cpu"]\n'
            + SILU + 'variant = "gpu"\narchitectures = ["sm90"]\n'
            + '[[ops]]\nslot = "norm.rmsnorm"\nsource = "k.py"\nentry = "norm"\narchitectures = ["sm_90"]\n')
    (tmp_path / "manifest.toml").write_text(body)
    (tmp_path / "k.py").write_text(SOURCE + "def norm(x, weight, out, eps):\n    out.copy_(x)\n")
    page = tmp_path / "report.html"
    rc = main(["verify", str(tmp_path), "--quiet", "--dtype", "float32", "--html", str(page)])
    out = capsys.readouterr().out
    assert rc == 1  # the cpu silu variant runs and fails; the rmsnorm row is not run, and listed
    assert "FAIL: 0/1 slots passed" in out and "not run: norm.rmsnorm (needs CUDA" in out
    assert "NOT RUN" in page.read_text() and "(not run: needs CUDA" in page.read_text()


@pytest.mark.parametrize("slot, params, fragment", [
    ("attention.decode", "q, k, v, seq_lens, sm_scale, out", "the dense decode entry(q, k, v, seq_lens, sm_scale, out)"),
    ("attention.msa_prefill_block_score", "q, index_k, prefix_len, scale, block_size, out",
     "the 6-argument score sheet entry(q, index_k, prefix_len, scale, block_size, out)"),
])
def test_earlier_arena_signatures_are_named(tmp_path, slot, params, fragment):
    (tmp_path / "manifest.toml").write_text(HEAD + f'[[ops]]\nslot = "{slot}"\nsource = "k.py"\nentry = "entry"\n')
    (tmp_path / "k.py").write_text(f"def entry({params}):\n    pass\n")
    with pytest.raises(ManifestError) as exc:
        load_bundle(tmp_path)
    msg = str(exc.value)
    assert f"earlier {slot} signature, {fragment}; the current signature is {get_slot(slot).slot.signature()}" in msg


def test_dispatch_routes_only_inside_the_effective_domain(tmp_path):
    from kernelslot.dispatch import INCUMBENT, SlotRouter

    (c,) = load_bundle(bundle(tmp_path, 'dtypes = ["bf16"]\n')).candidates()["activation.silu_and_mul"]
    router = SlotRouter(get_slot("activation.silu_and_mul"), [c])
    assert router.route(desc()) == c.name
    assert router.route(desc(model="MiniMax-M3")) == INCUMBENT  # unbound: generic semantics only
    assert router.route(desc(dtype="float32")) == INCUMBENT


def test_the_model_named_in_the_domain_binds_the_row(tmp_path):
    r = row(tmp_path, '[ops.domain]\nmodel = { exact = "MiniMax-M3" }\n')
    assert r.model == "MiniMax-M3" and r.domain.matches(desc(model="MiniMax-M3"))
    with pytest.raises(ManifestError, match="bound to one model"):
        row(tmp_path, '[ops.domain]\nmodel = { one_of = ["MiniMax-M3", "gpt-oss"] }\n')
    with pytest.raises(ManifestError, match="contradict"):
        row(tmp_path, '[ops.domain]\nmodel = { exact = "gpt-oss" }\n', {"model": "MiniMax-M3"})
