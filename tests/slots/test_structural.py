"""Structural inputs (docs/referee.md "Structural inputs"): skewed MoE routing, clustered maxima
and exact ties in selections, and Hypothesis-drawn profiles logged with their seed."""
from __future__ import annotations

import json
import os
import sys

import torch

from kernelslot.cli import main
from kernelslot.slots import CATALOG, get_slot
from kernelslot.slots.draw import drawn_profiles
from kernelslot.slots.moe_block import HOT_LOGIT, moe_block_reference
from kernelslot.verify import VerifyOptions, verify_slot
from kernelslot.verify.single.pipeline import describe, make_case


def _profiles(slot: str, prefix: str) -> list:
    found = [p for p in get_slot(slot).profiles if p.name.startswith(prefix)]
    assert found, f"{slot} has no {prefix}* profile"
    return found


def test_fused_experts_hot_routing_idles_most_experts():
    defn = get_slot("moe.fused_experts")
    for p in _profiles("moe.fused_experts", "skew_"):
        ids = make_case(defn, p, 0, 1).inputs["topk_ids"]
        counts = torch.bincount(ids[ids >= 0].long(), minlength=p.dims["E"])
        assert int(counts.max()) == p.dims["M"], f"{p.label}: no expert takes every token ({counts.tolist()})"
        assert int((counts == 0).sum()) >= p.dims["E"] // 2 - 1, f"{p.label}: too few idle experts ({counts.tolist()})"


def test_fused_experts_repeated_ids_and_dominant_weight():
    defn = get_slot("moe.fused_experts")
    p = _profiles("moe.fused_experts", "repeated_ids_dominant_weight")[0]
    case = make_case(defn, p, 0, 0)
    ids, w = case.inputs["topk_ids"], case.inputs["topk_weights"]
    assert any(len({i for i in row if i >= 0}) < len([i for i in row if i >= 0]) for row in ids.tolist())
    top = w.max(-1).values
    rest = w.sum(-1) - top  # the other K-1 weights: a 1e-4 share each
    assert bool((rest <= 1e-4 * p.dims["wrange"][1] * (p.dims["K"] - 1)).all()), "all but one of K should be negligible"


def test_block_router_steered_to_one_hot_expert():
    defn = get_slot("moe.block_tkg")
    skewed = [q for q in defn.profiles if q.dims.get("skew") == "hot"]
    assert len({q.model for q in skewed}) >= 3
    for p in skewed:
        case = make_case(defn, p, 0, 2)
        layer, x = case.prepare_args[1], case.inputs["x"]
        logits = moe_block_reference(x, case.inputs["residual"], layer, 1e-6)["router_logits"]
        bias = layer.router_bias.float()
        hot = int(bias.argmax())
        cfg = layer.config
        assert cfg.rank_id * cfg.num_local_experts <= hot < (cfg.rank_id + 1) * cfg.num_local_experts
        chosen = logits.double().argsort(-1, descending=True)[:, :cfg.top_k]
        share = float((chosen == hot).any(-1).double().mean())
        assert share >= 0.9, f"{p.label}: only {share:.0%} of the tokens route to expert {hot}"
        cold = (bias < -HOT_LOGIT / 2).nonzero().flatten()
        assert len(cold) >= 3 and not bool(torch.isin(chosen, cold).any()), f"{p.label}: a cold expert got tokens"


def test_msa_cluster_is_a_tile_with_an_exact_tie_broken_by_the_lower_index():
    defn = get_slot("attention.msa_prefill_block_score")
    p = _profiles("attention.msa_prefill_block_score", "clustered_maxima")[0]
    expected = defn.reference(make_case(defn, p, 0, 0))["out_topk"]
    assert isinstance(expected, torch.Tensor), "an exact tie is decided by the contract, not an admissible set"
    for row in expected.reshape(-1, expected.shape[-1]).tolist():
        picks = set(row) - {-1}
        assert set(range(8, 16)) <= picks and 16 not in picks, row
    score = get_slot("attention.msa_block_score")
    out = score.reference(make_case(score, _profiles("attention.msa_block_score", "clustered_maxima")[0], 0, 0))["out"]
    assert bool((out[..., 15] == out[..., 16]).all()) and bool((out[..., 8:15].diff(dim=-1) < 0).all())


def test_draws_are_seeded_and_stay_inside_each_slot():
    for name, defn in CATALOG.items():
        if defn.draw is None:
            continue
        a, b = drawn_profiles(defn, list(defn.profiles), 3, 2), drawn_profiles(defn, list(defn.profiles), 3, 2)
        assert [(p.name, p.drawn) for p in a] == [(p.name, p.drawn) for p in b], name
        assert len(a) == 2 and all(p.drawn["seed"] == 3 and "~d" in p.name for p in a), name
        assert {p.name for p in a} != {p.name for p in drawn_profiles(defn, list(defn.profiles), 4, 2)} or \
            [p.drawn["dims"] for p in a] != [p.drawn["dims"] for p in drawn_profiles(defn, list(defn.profiles), 4, 2)]
        if defn.slot.kind.value != "collective":
            for p in a:
                describe(defn, make_case(defn, p, 3, 0), p, "cpu")  # a valid case of the slot


def test_draws_ignore_loaded_modules_and_write_nothing(tmp_path, monkeypatch):
    """Hypothesis's constant harvesting would make draws depend on what is imported (and write
    .hypothesis/ into the working directory): both are switched off."""
    defn = get_slot("moe.fused_experts")
    before = [p.drawn for p in drawn_profiles(defn, list(defn.profiles), 11, 4)]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    mod = tmp_path / "constants_everywhere.py"
    mod.write_text("VALUES = [" + ", ".join(str(i) for i in range(1, 200)) + "]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("constants_everywhere")
    try:
        after = [p.drawn for p in drawn_profiles(defn, list(defn.profiles), 11, 4)]
    finally:
        sys.modules.pop("constants_everywhere", None)
    assert after == before
    assert ".hypothesis" not in os.listdir(tmp_path)


def test_verify_logs_drawn_profiles_and_seed_base_reproduces(tmp_path):
    args = ["verify", "--slot", "activation.silu_and_mul", "--dtype", "float32", "--quiet", "--draws", "3"]
    for name, base in (("a", 7), ("b", 7), ("c", 8)):
        assert main([*args, "--seed-base", str(base), "--json", str(tmp_path / f"{name}.json")]) == 0
    drawn = {n: [r["drawn"] | {"profile": r["profile"]} for r in json.loads((tmp_path / f"{n}.json").read_text())
                 ["slots"][0]["results"] if r["drawn"]] for n in "abc"}
    assert len(drawn["a"]) == 3 and all(d["seed"] == 7 for d in drawn["a"])
    assert drawn["a"] == drawn["b"] and drawn["a"] != drawn["c"]


def test_no_draws_when_asked():
    defn = get_slot("norm.rmsnorm")
    report = verify_slot(defn, defn.builtin_candidates(), VerifyOptions(dtypes=(torch.float32,), draws=0))
    assert report.passed and not any(r.drawn for r in report.results)
    assert len(report.results) == len([p for p in defn.profiles if p.dtype == torch.float32])


def test_negative_draws_is_bad_input(capsys):
    assert main(["verify", "--slot", "norm.rmsnorm", "--draws", "-1", "--quiet"]) == 2
    assert "--draws" in capsys.readouterr().err
