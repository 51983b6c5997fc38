"""`kernelslot slots NAME` shows a slot's full contract, from the catalog; docs/slots/ is that text."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kernelslot.cli import main
from kernelslot.formats import Nvfp4MoeLayer
from kernelslot.slots import CATALOG
from kernelslot.slots.contract import families, family_page

DOCS = Path(__file__).resolve().parents[2] / "docs" / "slots"


def slots_text(capsys, *argv: str) -> str:
    assert main(["slots", *argv]) == 0
    return capsys.readouterr().out


def test_fused_experts_contract_names_every_fact_an_author_needs(capsys):
    text = slots_text(capsys, "moe.fused_experts")
    # argument order with roles, shapes, dtypes and layouts
    assert "prepare(w13, w2) -> prepared; entry(x, topk_ids, topk_weights, prepared, out)" in text
    for row in ("| 0 | `x` | input | (M, H) |", "| 1 | `topk_ids` | input | (M, K) | int32 |",
                "| 2 | `topk_weights` | input | (M, K) | float32 |", "| 3 | `prepared` | prepared |",
                "| 4 | `out` | output | (M, H) |"):
        assert row in text
    assert "write through the given strides" in text
    # both prepare forms; the dense weights' symbolic shapes; every field of the NVFP4 view
    assert "`w13` | float32 (E, 2I, H) or bfloat16 (E, 2I, H)" in text and "`w2` | float32 (E, H, I)" in text
    assert "gate rows then the up rows" in text
    assert 'prepare("nvfp4_layer", view)' in text
    for f in dataclasses.fields(Nvfp4MoeLayer):
        assert f"`view.{f.name}`" in text, f.name
    assert "swizzled" in text and "g_alpha * a_inv" in text
    # model profiles: MiniMax-M3's swigluoai with alpha, beta (the up bias) and the clamps
    assert "clamp(g, None, 7.0)" in text and "clamp(u, -7.0, 7.0)" in text and "σ(1.702·g')·(u' + 1)" in text
    # the comparator and the NVFP4 override with their thresholds
    assert "matched_ratio >= 0.97" in text and "cosine >= 0.999" in text and "matched_ratio >= 0.9" in text
    # every diagnostic profile
    for p in CATALOG["moe.fused_experts"].profiles:
        assert f"| {p.name} |" in text
    # descriptor fields with ranges
    assert "| `num_tokens` | 1 … 96 | slot |" in text and "| `quant` | dense, nvfp4 | slot |" in text


def test_json_is_the_same_contract(capsys):
    data = json.loads(slots_text(capsys, "moe.fused_experts", "--json"))
    assert [a["name"] for a in data["arguments"]] == ["x", "topk_ids", "topk_weights", "prepared", "out"]
    forms = {f["form"]: f for f in data["prepare"]}
    view = {f["path"]: f["holds"] for f in forms['prepare("nvfp4_layer", view)']["fields"]}
    assert set(view) == {"kind", "view"} | {f"view.{f.name}" for f in dataclasses.fields(Nvfp4MoeLayer)}
    assert view["view.w13_weight"] == ["uint8 (6, 128, 64)"] and forms["prepare(w13, w2)"]["profiles"]
    minimax = next(m for m in data["models"] if m["model"] == "MiniMax-M3")
    assert minimax["activation"] == {**minimax["activation"], "kind": "swigluoai", "alpha": 1.702, "up_bias": 1.0,
                                     "gate_clamp": [None, 7.0], "up_clamp": [-7.0, 7.0]}
    fields = {d["field"]: d for d in data["descriptor"]}
    assert fields["num_experts"]["range"] == [4, 16]


def test_every_slot_has_a_contract_with_every_argument_and_profile(capsys):
    for name, defn in CATALOG.items():
        text = slots_text(capsys, name)
        for a in defn.slot.args:
            assert f"`{a.name}`" in text, (name, a.name)
        for p in defn.profiles:
            assert f"| {p.name} |" in text, (name, p.name)


def test_catalog_listing_and_json(capsys):
    text = slots_text(capsys)
    assert all(n in text for n in CATALOG) and "kernelslot slots NAME" in text
    assert {r["slot"] for r in json.loads(slots_text(capsys, "--json"))} == set(CATALOG)


def test_docs_match_the_catalog():
    """docs/slots/<family>.md is generated; regenerate with `kernelslot slots --docs docs/slots`."""
    assert sorted(p.stem for p in DOCS.glob("*.md")) == families()
    for fam in families():
        assert (DOCS / f"{fam}.md").read_text(encoding="utf-8") == family_page(fam), (
            f"docs/slots/{fam}.md is stale: run `kernelslot slots --docs docs/slots`")


def test_slot_docs_link_nothing_outside_the_repository():
    for page in DOCS.glob("*.md"):  # generated from docstrings: they must not point outside either
        text = page.read_text(encoding="utf-8")
        for foreign in ("SLOTS.md", "FORMATS.md", "DESIGN.md", "DIRECT.md", "../shared", "shared/"):
            assert foreign not in text, f"{page.name} refers to {foreign}, which is not in this repository"
