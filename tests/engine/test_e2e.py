"""``kernelslot e2e``: the gate passes the built-ins and an honest bundle, fails a broken one."""
from __future__ import annotations

import shutil

import pytest
import torch

from kernelslot.cli import main
from kernelslot.engines.e2e import run_e2e, sharpen_lm_head, _entropy
from kernelslot.engines.transformers.models import build_model

from tests.engine.conftest import BUNDLES, prompts

SMALL = dict(prompts=2, prompt_len=4, steps=3)


def test_lm_head_is_sharpened_to_the_stated_entropy() -> None:
    model = build_model("mixtral")
    ids = prompts(model.config.vocab_size, 4, 6)
    with torch.no_grad():
        flat = _entropy(model(input_ids=ids).logits)
    assert flat > 0.9 * torch.log(torch.tensor(float(model.config.vocab_size)))  # random init: near uniform
    sharpen_lm_head(model, ids, 1.0)
    with torch.no_grad():
        assert abs(_entropy(model(input_ids=ids).logits) - 1.0) < 1e-3


@pytest.mark.parametrize("name", ["qwen3-moe", pytest.param("gpt-oss", marks=pytest.mark.slow)])
def test_builtins_pass_fp32(name: str) -> None:
    r = run_e2e(name, "float32", **SMALL)
    assert r.passed, r.reasons
    assert r.kl["mean"] <= 1e-8 and r.flips == 0 and r.greedy_agreement == 1.0
    assert r.counters["moe.fused_experts"]["builtin"]["fired_decode"] > 0


@pytest.mark.slow
def test_builtins_pass_bf16_against_the_stock_floor() -> None:
    r = run_e2e("minimax-m3", "bfloat16", **SMALL)
    assert r.passed, r.reasons
    assert set(r.extra["floor_kl"]) >= {"experts batched_mm", "fp32 compute"}


def test_honest_bundle_passes_and_broken_bundle_fails_the_gate() -> None:
    honest = run_e2e("deepseek-v3", "float32", bundle=BUNDLES / "honest_experts", trust_unverified=True, **SMALL)
    assert honest.passed, honest.reasons
    assert honest.qualified == ["engines-honest-experts:moe.fused_experts[silu]"]
    broken = run_e2e("deepseek-v3", "float32", bundle=BUNDLES / "broken_experts", trust_unverified=True, **SMALL)
    # the gate (mean KL) or, first, serving's audit at call 1: the broken variant is disabled and never fires
    assert not broken.passed and any("mean KL" in r or "audit against the incumbent failed" in r
                                     for r in broken.reasons), broken.reasons


def test_candidate_that_fires_on_no_decode_step_does_not_pass(tmp_path) -> None:
    bundle = tmp_path / "prefill_only"
    shutil.copytree(BUNDLES / "honest_experts", bundle)
    manifest = (bundle / "manifest.toml").read_text()
    (bundle / "manifest.toml").write_text(manifest.replace('quant = { exact = "dense" }',
                                                           'quant = { exact = "dense" }\nphase = { exact = "prefill" }'))
    r = run_e2e("qwen3-moe", "float32", bundle=bundle, trust_unverified=True, **SMALL)
    assert not r.passed and any("no decode step" in x for x in r.reasons), r.reasons
    table = r.counters["moe.fused_experts"]
    assert table["builtin"]["fired_decode"] > 0  # outside the candidate's domain the built-in served


def test_cli_builtins_pass_and_bad_input_is_exit_2(tmp_path, capsys) -> None:
    out = tmp_path / "e2e.json"
    assert main(["e2e", "--model", "mixtral", "--prompts", "2", "--prompt-len", "4", "--steps", "2",
                 "--json", str(out)]) == 0
    assert "PASS" in capsys.readouterr().out and out.exists()
    assert main(["e2e", "--model", "mixtral", "--steps", "0"]) == 2
    assert main(["e2e", str(tmp_path / "nope"), "--model", "mixtral"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-moe", "mixtral", "deepseek-v3", "minimax-m3", "gpt-oss"])
def test_cli_runs_the_referee_first_and_qualifies_only_what_passed(name: str, tmp_path, capsys) -> None:
    store = str(tmp_path / "results.sqlite")
    assert main(["e2e", str(BUNDLES / "broken_experts"), "--model", name, "--store", store, "--steps", "2"]) == 1
    assert "slot referee rejected" in capsys.readouterr().out
    assert main(["e2e", str(BUNDLES / "honest_experts"), "--model", name, "--store", store, "--steps", "2"]) == 0
    # the receipt is now in the store: the second run installs without re-running the referee
    from kernelslot.bundle import load_bundle
    from kernelslot.store.receipts import passing_slots

    assert passing_slots(store, load_bundle(BUNDLES / "honest_experts").content_hash) == {"moe.fused_experts"}
    assert main(["e2e", str(BUNDLES / "honest_experts"), "--model", name, "--store", store, "--dtype", "bfloat16",
                 "--steps", "2"]) == 0


def test_the_floor_holds_each_slot_region_in_fp32_and_nothing_else() -> None:
    """The honest-precision floor: the model in bf16 with only the slot's region (its install point's
    modules) computed in fp32, one cast at its end."""
    from kernelslot.engines.e2e import _Fp32Twin, _fp32_region

    master = build_model("gpt-oss")
    m = _fp32_region(master, torch.bfloat16, "moe.block_tkg")
    twins = {n: t for n, t in m.named_modules() if isinstance(t, _Fp32Twin)}
    assert sorted(twins) == ["model.layers.0.mlp", "model.layers.0.post_attention_layernorm",
                             "model.layers.1.mlp", "model.layers.1.post_attention_layernorm"]
    assert all(p.dtype == torch.float32 for t in twins.values() for p in t.twin.parameters())
    assert m.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16  # outside the region: bf16
    assert not twins["model.layers.0.post_attention_layernorm"].cast_back and twins["model.layers.0.mlp"].cast_back
    x = torch.randn(1, 3, master.config.hidden_size, dtype=torch.bfloat16)
    with torch.no_grad():
        h = m.model.layers[0].post_attention_layernorm(x)
        out = m.model.layers[0].mlp(h)
    assert h.dtype == torch.float32 and (out[0] if isinstance(out, tuple) else out).dtype == torch.bfloat16
    assert _fp32_region(master, torch.bfloat16, "attention.sdpa") is None  # no module region: no such floor


@pytest.mark.slow
def test_builtin_block_passes_bf16_where_routing_is_near_a_tie() -> None:
    """GPT-OSS seed 0 in bf16: the built-in block (h in fp32 into the router, as the slot says) lands on
    the other side of a routing near-tie from pristine (mean KL 4.9e-3, 10x the fp32-compute floor);
    the block region computed in fp32 lands there too, so the floor reads it and the gate passes."""
    r = run_e2e("gpt-oss", "bfloat16", slots=("moe.block_tkg",), prompts=4, prompt_len=8, steps=4)
    assert r.passed, r.reasons
    assert "moe.block_tkg region fp32" in r.extra["floor_kl"]
