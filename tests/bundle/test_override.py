"""Override submissions: a function for a named point of a built-in base, composed and verified
like any other candidate under the row's model profile."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from kernelslot.abi import CapabilityDomain
from kernelslot.bundle import ManifestError, load_bundle
from kernelslot.kernels import moe as builtin
from kernelslot.kernels.moe_overrides import compose
from kernelslot.kernels.moe_block import ExpertActivation
from kernelslot.slots import Candidate, get_slot
from kernelslot.verify import VerifyOptions, verify_slot

ARENA_OVERRIDE = Path(__file__).resolve().parents[2].parent / "shared" / "arena-examples" / "miner_m3_swigluoai_override"
HEAD = 'bundle_id = "o"\nabi_version = "cacheon-op-abi-v0"\n'
ROW = '[[ops]]\nslot = "moe.fused_experts"\nsource = "ep.py"\nentry = "{entry}"\nbase_kernel = "{base}"\noverride_point = "{point}"\n'
# Written here from the formula (SLOTS.md): the clamped swigluoai of MiniMax-M3 / GPT-OSS.
OAI = textwrap.dedent("""
    import torch

    def act_ref(gate, up):
        g = torch.clamp(gate, max=7.0)
        return g * torch.sigmoid(1.702 * g) * (torch.clamp(up, -7.0, 7.0) + 1.0)

    def scaled(y):
        return 2.0 * y

    def same(y):
        return y

    def wrong_shape(gate, up):
        return gate[:, :1]
""")
OPTS = VerifyOptions(replays=2, dtypes=(torch.float32,))
FEW = VerifyOptions(replays=2, dtypes=(torch.float32,), profiles=("ragged_batch_nonpow2", "ep_shard_minus_one"))


def override_bundle(tmp_path: Path, entry="act", base="nvfp4_moe_megakernel", point="gemm1_epilogue", extra="",
                    meta: dict | None = None) -> Path:
    body = HEAD + ROW.format(entry=entry, base=base, point=point) + extra
    if meta is not None:
        body += 'metadata = "m.json"\n'
        (tmp_path / "m.json").write_text(json.dumps(meta))
    (tmp_path / "manifest.toml").write_text(body)
    (tmp_path / "ep.py").write_text(OAI)
    return tmp_path


def candidate(path: Path, model: str | None = None) -> Candidate:
    (c,) = load_bundle(path).candidates(model=model)["moe.fused_experts"]
    return c


def test_default_points_reproduce_the_builtin():
    gen = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(4, 64, 32, generator=gen) / 6, torch.randn(4, 32, 32, generator=gen) / 6
    x = torch.randn(5, 32, generator=gen)
    ids = torch.tensor([[0, 1], [2, -1], [-1, -1], [3, 0], [1, 2]], dtype=torch.int32)
    w = torch.rand(5, 2, generator=gen)
    for act, ref in ((ExpertActivation("silu"), builtin.fused_experts_silu), (builtin.SWIGLUOAI, builtin.fused_experts_swigluoai)):
        entry, prepare = compose("fused_experts", "down_epilogue", lambda y: y, act)
        got, want = torch.empty(5, 32), torch.empty(5, 32)
        entry(x, ids, w, prepare(w13, w2), got)
        ref(x, ids, w, builtin.prepare(w13, w2), want)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.all(got[2] == 0)  # a row routed nowhere contributes nothing


def test_swigluoai_epilogue_passes_under_minimax_and_fails_under_generic(tmp_path):
    path = override_bundle(tmp_path, meta={"model": "MiniMax-M3"})
    report = verify_slot(get_slot("moe.fused_experts"), candidate(path), OPTS)
    assert report.passed, report.errors + [c.message for r in report.results for c in r.failures()]
    assert {r.model for r in report.results if not r.skipped_reason} == {"MiniMax-M3"}
    generic = verify_slot(get_slot("moe.fused_experts"), candidate(path, model="generic"), FEW)
    assert not generic.passed and "compare" in generic.failed_checks()


@pytest.mark.skipif(not ARENA_OVERRIDE.is_dir(), reason="../shared/arena-examples is absent")
def test_arena_epilogue_fails_on_the_generic_model():
    """The arena's own control: with the generic model's SiLU semantics its epilogue is wrong."""
    (c,) = load_bundle(ARENA_OVERRIDE).candidates(model="generic")["moe.fused_experts"]
    generic = Candidate(c.kernel, CapabilityDomain.from_mapping({"model": {"exact": "generic"}}), label=c.name, model="generic")
    report = verify_slot(get_slot("moe.fused_experts"), generic, FEW)
    assert not report.passed and "compare" in report.failed_checks()


def test_down_epilogue_is_an_override_point(tmp_path):
    same = verify_slot(get_slot("moe.fused_experts"), candidate(override_bundle(tmp_path, "same", point="down_epilogue")), FEW)
    assert same.passed, same.errors
    scaled = verify_slot(get_slot("moe.fused_experts"), candidate(override_bundle(tmp_path, "scaled", point="down_epilogue")), FEW)
    assert "compare" in scaled.failed_checks()


def test_an_override_returning_the_wrong_shape_raises(tmp_path):
    report = verify_slot(get_slot("moe.fused_experts"), candidate(override_bundle(tmp_path, "wrong_shape")), FEW)
    assert "raised" in report.failed_checks()
    assert any("must return a tensor of shape" in c.message for r in report.results for c in r.failures())


@pytest.mark.parametrize("kw, key, fragment", [
    (dict(base="flashinfer_moe"), "ops[0].base_kernel", "not a built-in base of moe.fused_experts"),
    (dict(point="router_epilogue"), "ops[0].override_point", "known: gemm1_epilogue, down_epilogue"),
    (dict(extra='prepare = "p"\n'), "ops[0].prepare", "an override uses its base's prepare"),
    (dict(entry="nothing"), "ops[0].entry", "defines no top-level 'nothing'"),
    (dict(entry="scaled"), "ops[0].entry", "scaled() takes 1 positional arguments, gemm1_epilogue passes 2"),
])
def test_malformed_override_rows(tmp_path, kw, key, fragment):
    with pytest.raises(ManifestError) as exc:
        load_bundle(override_bundle(tmp_path, **kw))
    assert f": {key}: " in str(exc.value) and fragment in str(exc.value), str(exc.value)
