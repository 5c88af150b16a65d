"""Held-out tiers in the evaluation: the plan deals each tier as many dialogues as the trained values, the report
scores each tier on its own (per turn, paired, per family), and make demo holds the catalogue's tiers out."""

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from data_gen.builtin_data import DataFileError
from data_gen.constraints import HELDOUT_TIERS, catalogue
from gatt.eval.evaluate import parse_tiers
from gatt.eval.inputs import load_eval_turns
from gatt.eval.plan import plan_dialogues
from gatt.eval.report import _markdown, build_report, write_report
from gatt.eval.scoring import adherence_per_turn, tier_stratum
from recipes.demo_config import DemoConfig, eval_dialogues, heldout_tiers, inputs
from tests.test_eval_scoring import PNG_MAGIC, F, T, dialogue

TIERED = [family for families in HELDOUT_TIERS.values() for family in families]


def test_each_tier_gets_as_many_dialogues_as_trained_values_and_eight_a_family() -> None:
    plan = plan_dialogues(
        catalogue(heldout_families=TIERED),
        load_eval_turns(None),
        dialogues=320,
        turns=3,
        seed=0,
        tiers=HELDOUT_TIERS,
    )
    units = Counter((d.stratum, d.tier) for d in plan)
    assert units == {
        ("train", ""): 64,
        ("heldout_value", ""): 64,
        **{("heldout_family", tier): 64 for tier in HELDOUT_TIERS},
    }
    for tier, families in HELDOUT_TIERS.items():
        drawn = Counter(d.constraint.family for d in plan if d.tier == tier)
        assert set(drawn) == set(families) and min(drawn.values()) >= 8, (tier, drawn)
    trained = {d.constraint.family for d in plan if d.stratum in ("train", "heldout_value")}
    assert not trained & set(TIERED)  # a tier's family is held out whole: never among trained or held-out values


def test_without_tiers_the_plan_is_the_three_strata_half_on_trained_values() -> None:
    plan = plan_dialogues(catalogue(), load_eval_turns(None), dialogues=64, turns=2, seed=1)
    assert Counter(d.stratum for d in plan) == {"train": 32, "heldout_value": 16, "heldout_family": 16}
    assert {d.tier for d in plan} == {""}


def test_a_tier_of_a_trained_family_and_a_family_in_two_tiers_are_refused() -> None:
    pool = load_eval_turns(None)
    with pytest.raises(ValueError, match="hobby not held out as a whole"):
        plan_dialogues(catalogue(heldout_families=["city"]), pool, dialogues=4, turns=2, seed=0, tiers={"w": ["hobby"]})
    with pytest.raises(ValueError, match="city is in a and in b"):
        tiers = {"a": ["city"], "b": ["city"]}
        plan_dialogues(catalogue(heldout_families=["city"]), pool, dialogues=4, turns=2, seed=0, tiers=tiers)
    assert parse_tiers(["b=brevity, caps", "w=city"]) == {"b": ["brevity", "caps"], "w": ["city"]}
    with pytest.raises(ValueError, match="TIER=FAMILY,FAMILY, got 'brevity'"):
        parse_tiers(["brevity"])


def tiered(model: str, passes: dict[str, list[bool]]) -> list[dict[str, Any]]:
    """A model's transcripts: one trained dialogue and two dialogues in each of the tiers `b` (brevity) and
    `w` (city)."""
    out = [dialogue("d0", "train", "hobby", passes["train"], model=model)]
    for i, (tier, family) in enumerate((("b", "brevity"), ("b", "brevity"), ("w", "city"), ("w", "city"))):
        t = dialogue(f"d{i + 1}", "heldout_family", family, passes[f"{tier}{i % 2}"], model=model)
        out.append({**t, "tier": tier})
    return out


def test_each_tier_is_scored_and_paired_on_its_own_dialogues(tmp_path: Path) -> None:
    gatt = tiered("gatt", {"train": [T, T, T], "b0": [T, T, F], "b1": [T, F, F], "w0": [T, T, T], "w1": [T, T, T]})
    base = tiered("base", {"train": [T, F, F], "b0": [T, F, F], "b1": [T, F, F], "w0": [T, T, F], "w1": [T, F, F]})
    report = build_report(gatt + base, {"seed": 0}, baselines=["base"])
    assert report["tiers"] == {"b": ["brevity"], "w": ["city"]}
    assert report["gatt"]["tier_per_turn"]["b"]["2"]["adherence"] == 0.5
    assert report["gatt"]["tier_per_turn"]["w"]["3"] == adherence_per_turn(gatt, (tier_stratum("w"),))["3"]
    assert report["gatt"]["heldout_family_per_turn"]["3"]["n"] == 4  # the tiers pooled: every held-out family
    assert report["paired_tiers"]["w"]["gatt - base"]["3"]["difference"] == 1.0
    assert report["paired_tiers"]["b"]["gatt - base"]["2"]["difference"] == 0.5
    markdown = _markdown(report)
    assert "## Adherence per turn (held-out tier `b`: brevity)" in markdown
    assert "## Paired differences on held-out tier `w`" in markdown
    assert "| city (w) | – / – / – (n=0) | – / – / – (n=0) |" in markdown  # three turns: none of 10, 20, 30
    write_report(report, gatt + base, tmp_path)
    assert (tmp_path / "tiers.png").read_bytes().startswith(PNG_MAGIC)


def test_the_per_family_table_reads_turns_10_20_30() -> None:
    turns = [T] * 9 + [F] + [T] * 9 + [T] + [T] * 9 + [F]
    gatt = [{**dialogue("d1", "heldout_family", "caps", turns), "tier": "behaviours"}]
    gatt.append(dialogue("d2", "train", "hobby", [T] * 30))
    report = build_report(gatt, {})
    assert "| caps (behaviours) | 0 / 100 / 0 (n=1) |" in _markdown(report)
    assert "| hobby (trained) | 100 / 100 / 100 (n=1) |" in _markdown(report)


def test_make_demo_holds_the_catalogue_tiers_out_and_reports_them(tmp_path: Path) -> None:
    config = DemoConfig(heldout_tiers="catalogue", heldout_families=["hobby"])
    shared = inputs(config, ["heldout_families", "heldout_tiers", "seed"])
    assert shared["heldout_families"] == ["hobby", *TIERED]
    assert shared["heldout_tiers"] == [f"{t}={','.join(f)}" for t, f in HELDOUT_TIERS.items()]
    assert eval_dialogues(config) == 6 * 64  # trained and held-out values, three tiers, hobby in none
    assert eval_dialogues(DemoConfig(heldout_tiers="catalogue", eval={"dialogues": 10})) is None
    assert inputs(DemoConfig(), ["heldout_families", "heldout_tiers"]) == {}
    tiers = tmp_path / "tiers.yaml"
    spec = {"wordings": ["city"], "behaviours": ["caps", "brevity"], "kind": "language"}
    tiers.write_text(yaml.safe_dump({"heldout_tiers": spec}))
    assert set(heldout_tiers(DemoConfig(heldout_tiers=str(tiers)))["behaviours"]) == {"brevity", "caps"}
    tiers.write_text(yaml.safe_dump({"heldout_tiers": {**spec, "behaviours": ["nosuch"]}}))
    with pytest.raises(DataFileError, match=r"tiers\.yaml: heldout_tiers: behaviours: unknown families"):
        heldout_tiers(DemoConfig(heldout_tiers=str(tiers)))
