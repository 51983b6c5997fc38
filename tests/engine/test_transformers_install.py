"""kernelslot inside transformers: registration, install, receipts, re-prepare, layouts."""
from __future__ import annotations

import pytest
import torch

from kernelslot.engines.transformers import NotVerifiedError, install, register
from kernelslot.engines.transformers.experts import BUILTIN, MODEL_CODE, ExpertsState
from kernelslot.engines.transformers.installation import experts_modules
from kernelslot.engines.transformers.layout import expert_weights, probe_activation
from kernelslot.engines.transformers.models import MODEL_CLASSES, build_model
from kernelslot.kernels.moe_block import ExpertActivation

from tests.engine.conftest import BUNDLES, logits_of, prompts


def _counters(handle, slot="moe.fused_experts"):
    return handle.counters()[slot]


def _installed_run(model, ids, **kwargs):
    """Logits of ``model`` with kernelslot installed, and the receipts; uninstalled afterwards."""
    handle = install(model, **kwargs)
    got = logits_of(model, ids)
    r = _counters(handle)
    handle.uninstall()
    return got, r


@pytest.mark.parametrize("name", MODEL_CLASSES)
def test_fp32_parity_with_receipts_and_no_fallback(name: str) -> None:
    model = build_model(name)
    ids = prompts(model.config.vocab_size)
    want = logits_of(model, ids)
    got, r = _installed_run(model, ids)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert want.std() > 0.1
    layers = len(experts_modules(model))
    assert r[BUILTIN]["fired"] == r[BUILTIN]["completed"] == 4 * layers  # prefill + 3 decode steps per layer
    assert r[BUILTIN]["fired_decode"] == 3 * layers
    assert r[BUILTIN]["fallback"] == 0 and r[MODEL_CODE]["fired"] == 0
    assert model.config._experts_implementation == "eager"
    torch.testing.assert_close(logits_of(model, ids), want, atol=0, rtol=0)  # uninstalled: the model's own code


def test_register_then_select_by_name_at_load_and_at_run_time() -> None:
    register()
    eager = build_model("mixtral")
    ids = prompts(eager.config.vocab_size)
    want = logits_of(eager, ids)
    loaded = build_model("mixtral", experts_implementation="kernelslot")  # the name alone, at load
    torch.testing.assert_close(logits_of(loaded, ids), want, atol=2e-5, rtol=1e-5)
    module = experts_modules(loaded)[0][1]
    state = module._kernelslot_experts  # prepared lazily on the first call, then reused
    assert isinstance(state, ExpertsState) and state.counters[BUILTIN].fired == 4
    loaded.set_experts_implementation("eager")  # run-time switch back: kernelslot no longer called
    logits_of(loaded, ids)
    assert state.counters[BUILTIN].fired == 4
    loaded.set_experts_implementation("kernelslot")
    torch.testing.assert_close(logits_of(loaded, ids), want, atol=2e-5, rtol=1e-5)
    assert module._kernelslot_experts is state and state.counters[BUILTIN].fired == 8


def test_attention_kernelslot_where_the_call_fits_sdpa() -> None:
    model = build_model("qwen3-moe")
    ids = prompts(model.config.vocab_size)
    want = logits_of(model, ids)
    handle = install(model, slots=("moe.fused_experts", "attention.sdpa"))
    got = logits_of(model, ids)
    r = handle.counters()["attention.sdpa"]
    handle.uninstall()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert r[BUILTIN]["fired"] == r[BUILTIN]["completed"] == 2 * 4 * 2 and r[MODEL_CODE]["fired"] == 0
    assert model.config._attn_implementation == "sdpa"
    # a padded batch carries a mask tensor: outside the slot, transformers' sdpa serves it
    handle = install(model, slots=("attention.sdpa",))
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    r = handle.counters()["attention.sdpa"]
    handle.uninstall()
    assert r[MODEL_CODE]["fired"] == 2 and r[BUILTIN]["fired"] == 0


def test_attention_bundle_candidate_serves_through_the_router(tmp_path) -> None:
    model = build_model("mixtral")
    ids = prompts(model.config.vocab_size)
    want = logits_of(model, ids)
    bundle = BUNDLES.parent.parent.parent / "examples" / "honest_attention"
    handle = install(model, bundle=bundle, slots=("attention.sdpa",), trust_unverified=True)
    got = logits_of(model, ids)
    r = handle.counters()["attention.sdpa"]
    handle.uninstall()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    cand = "example-honest-attention:attention.sdpa"
    assert r[cand]["fired"] == r[cand]["completed"] == 2 * 4 * 2  # layers x (prefill + 3 steps) x batch rows
    assert r[cand]["fired_decode"] == 2 * 3 * 2 and r[BUILTIN]["fired"] == 0


def test_activation_is_identified_by_probing() -> None:
    gpt = build_model("gpt-oss")
    gpt.config.swiglu_limit = 5.0
    for _, m in experts_modules(gpt):
        m.alpha, m.limit = 1.5, 5.0
    assert probe_activation(experts_modules(gpt)[0][1]) == ExpertActivation.swigluoai(1.5, 5.0)
    mm3 = experts_modules(build_model("minimax-m3"))[0][1]
    assert probe_activation(mm3) == ExpertActivation.swigluoai(1.702, 7.0)
    assert probe_activation(experts_modules(build_model("qwen3-moe"))[0][1]) == ExpertActivation("silu")
    # an activation no kernel expresses: the module's own code serves it, counted as such
    relu = build_model("qwen3-moe")
    for _, m in experts_modules(relu):
        m.act_fn = torch.nn.ReLU()
    assert probe_activation(experts_modules(relu)[0][1]) is None
    ids = prompts(relu.config.vocab_size)
    want = logits_of(relu, ids)
    handle = install(relu)
    torch.testing.assert_close(logits_of(relu, ids), want, atol=0, rtol=0)
    r = _counters(handle)
    assert r[BUILTIN]["fired"] == 0 and r[MODEL_CODE]["fired"] == 8


def test_gpt_oss_layout_transposed_interleaved_with_biases() -> None:
    module = experts_modules(build_model("gpt-oss"))[0][1]
    assert module.is_transposed and not module.is_concatenated and module.has_bias
    w = expert_weights(module)
    e, h, two_i = module.gate_up_proj.shape
    assert tuple(w.gate_up.shape) == (e, two_i, h) and tuple(w.down.shape) == (e, h, two_i // 2)
    x = torch.randn(3, h)
    gu = x @ module.gate_up_proj[1] + module.gate_up_proj_bias[1]  # the module's own convention
    ours = x @ w.gate_up[1].T + w.gate_up_bias[1]
    torch.testing.assert_close(ours[:, : two_i // 2], gu[:, 0::2])  # gate rows first
    torch.testing.assert_close(ours[:, two_i // 2:], gu[:, 1::2])
    assert module.down_proj_bias.abs().max() > 0 and torch.equal(w.down_bias, module.down_proj_bias.float())
    ids = torch.tensor([[1, 2], [0, 3], [3, 1]])
    wts = torch.rand(3, 2)
    with torch.no_grad():
        want = type(module).forward.__wrapped__(module, x, ids, wts)
        got = ExpertsState(module)(module, x, ids, wts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_expert_parallel_placeholder_ids_contribute_nothing() -> None:
    module = experts_modules(build_model("qwen3-moe"))[0][1]
    e = module.num_experts
    x = torch.randn(4, module.gate_up_proj.shape[2])
    ids = torch.tensor([[0, e], [e, e], [3, 1], [e + 5, 2]])  # EP sentinels are >= num_experts
    wts = torch.rand(4, 2)
    state = ExpertsState(module)
    with torch.no_grad():
        got = state(module, x, ids, wts)
        keep = ids < e
        want = type(module).forward.__wrapped__(module, x, torch.where(keep, ids, 0), wts * keep)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got[1].abs().max() == 0


@pytest.mark.parametrize("change", ["load_state_dict", pytest.param("to", marks=pytest.mark.slow), "in_place"])
def test_reprepared_when_weights_change(change: str) -> None:
    model = build_model("qwen3-moe")
    ids = prompts(model.config.vocab_size)
    handle = install(model)
    state = next(iter(handle.states.values()))
    before = state.key
    if change == "load_state_dict":
        other = build_model("qwen3-moe", seed=7)
        model.load_state_dict(other.state_dict())
        assert state.key != before  # re-prepared eagerly by the load hook
    elif change == "to":
        model.to(torch.float64)
        other = build_model("qwen3-moe").to(torch.float64)
    else:
        other = build_model("qwen3-moe")
        with torch.no_grad():
            for m in (model, other):
                for _, ex in experts_modules(m):
                    ex.down_proj.mul_(-2.0)
    got = logits_of(model, ids)
    assert state.key != before
    handle.uninstall()
    torch.testing.assert_close(got.double(), logits_of(other, ids).double(), atol=5e-5, rtol=1e-5)


def test_bundle_needs_a_passing_receipt_unless_overridden(tmp_path) -> None:
    model = build_model("qwen3-moe")
    with pytest.raises(NotVerifiedError, match="no passing verify receipt"):
        install(model, bundle=BUNDLES / "honest_experts", store=str(tmp_path / "empty.sqlite"))
    assert model.config._experts_implementation == "eager"
    ids = prompts(model.config.vocab_size)
    want = logits_of(model, ids)
    got, r = _installed_run(model, ids, bundle=BUNDLES / "honest_experts", trust_unverified=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    silu = "engines-honest-experts:moe.fused_experts[silu]"
    assert r[silu]["fired"] == r[silu]["completed"] == 8 and r[silu]["fired_decode"] == 6
    assert r[BUILTIN]["fired"] == 0 and r[silu]["fallback"] == 0


def test_gpt_oss_bundle_call_folds_biases_losslessly() -> None:
    model = build_model("gpt-oss")
    ids = prompts(model.config.vocab_size)
    want = logits_of(model, ids)
    got, r = _installed_run(model, ids, bundle=BUNDLES / "honest_experts", trust_unverified=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert r["engines-honest-experts:moe.fused_experts[swigluoai]"]["fired"] == 8


def test_receipt_lookup_needs_a_passing_run_for_the_hash_and_dtype(tmp_path) -> None:
    from kernelslot.bundle import load_bundle
    from kernelslot.store.receipts import passing_slots
    from kernelslot.slots import get_slot
    from kernelslot.store import ResultStore
    from kernelslot.verify import VerifyOptions, verify_slot

    bundle = load_bundle(BUNDLES / "honest_experts")
    store = tmp_path / "r.sqlite"
    db = ResultStore(store)
    run = db.start_run("test", "cpu", "in-process", bundle.bundle_id, bundle.content_hash)
    cands = bundle.candidates()["moe.fused_experts"]
    db.add_report(run, verify_slot(get_slot("moe.fused_experts"), cands,
                                   VerifyOptions(dtypes=(torch.float32,),
                                                 profiles=("ragged_batch_nonpow2", "minimax_swigluoai_clamped"))))
    db.close()
    assert passing_slots(store, bundle.content_hash) == {"moe.fused_experts"}
    assert passing_slots(store, bundle.content_hash, "float32") == {"moe.fused_experts"}
    assert passing_slots(store, bundle.content_hash, "bfloat16") == set()  # never exercised in bf16
    assert passing_slots(store, "0" * 64) == set()
    model = build_model("qwen3-moe")
    install(model, bundle=bundle, store=str(store)).uninstall()  # fp32 model: covered
    with pytest.raises(NotVerifiedError, match="bfloat16"):
        install(model.to(torch.bfloat16), bundle=bundle, store=str(store))


def test_engine_imports_stay_lazy() -> None:
    import subprocess
    import sys

    code = ("import sys, kernelslot.cli as c, kernelslot.engines.transformers as t; c.build_parser(); "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_install_routes_only_inside_the_receipts_verified_envelope(tmp_path) -> None:
    """The receipt's verified envelope (recorded by verify with ``envelope``) bounds live routing:
    a call larger than anything that ran goes to the built-in, though the declared domain admits it."""
    import dataclasses

    from kernelslot.bundle import load_bundle
    from kernelslot.dispatch.router import INCUMBENT
    from kernelslot.slots import get_slot
    from kernelslot.store import ResultStore
    from kernelslot.store.receipts import verified_envelopes
    from kernelslot.verify import VerifyOptions, verify_slot
    from kernelslot.verify.cases import describe, make_case

    bundle = load_bundle(BUNDLES / "honest_experts")
    defn = get_slot("moe.fused_experts")
    store = tmp_path / "r.sqlite"
    db = ResultStore(store)
    run = db.start_run("test", "cpu", "in-process", bundle.bundle_id, bundle.content_hash)
    cands = bundle.candidates()["moe.fused_experts"]
    opts = VerifyOptions(dtypes=(torch.float32,), profiles=("ragged_batch_nonpow2", "minimax_swigluoai_clamped"), draws=0,
                         envelope=True,
                         envelope_fields=())
    db.add_report(run, verify_slot(defn, cands, opts))
    db.close()
    silu = "engines-honest-experts:moe.fused_experts[silu]"
    envelopes = verified_envelopes(store, bundle.content_hash, "moe.fused_experts", "float32")
    assert silu in envelopes and verified_envelopes(store, bundle.content_hash, "moe.fused_experts", "bfloat16") == {}
    profile = next(p for p in defn.profiles if p.name == "ragged_batch_nonpow2" and p.dtype == torch.float32)
    ran = describe(defn, make_case(defn, profile, 0, 0), profile, "cpu")
    top = envelopes[silu]["num_tokens"][1]
    model = build_model("qwen3-moe")
    handle = install(model, bundle=bundle, store=str(store))
    try:
        router = next(iter(handle.states.values())).router
        assert router.route(dataclasses.replace(ran, num_tokens=top)) == silu
        beyond = dataclasses.replace(ran, num_tokens=top + 1)
        assert next(c for c in cands if c.name == silu).domain.matches(beyond)  # declared: admitted
        assert router.route(beyond) == INCUMBENT  # never verified: the built-in serves it
    finally:
        handle.uninstall()
