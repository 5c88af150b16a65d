"""make demo over seeds (recipes/seeds_report.py): the seeds' mean and spread, and paired differences pooled over
every seed's dialogues exactly as one paired sample of all of them."""

import json
import random
from pathlib import Path

import pytest

from gatt.eval.report import build_report
from gatt.eval.scoring import paired_difference
from recipes.seeds_report import main, pooled_difference
from tests.test_eval_scoring import dialogue
from tests.test_eval_tiers import tiered


def seed_transcripts(seed: int, dialogues: int = 12) -> list[dict]:
    """Two models (gatt and base) over the same `dialogues` trained dialogues of 4 turns, at random."""
    rng = random.Random(seed)
    out = []
    for i in range(dialogues):
        for model, p in (("gatt", 0.8), ("base", 0.5)):
            out.append(dialogue(f"s{seed}-{i}", "train", "hobby", [rng.random() < p for _ in range(4)], model=model))
    return out


def test_pooled_difference_is_the_paired_difference_of_all_seeds_dialogues() -> None:
    seeds = [seed_transcripts(s, dialogues=10 + 3 * s) for s in range(3)]
    split = [([t for t in s if t["model"] == "gatt"], [t for t in s if t["model"] == "base"]) for s in seeds]
    every = paired_difference([t for a, _ in split for t in a], [t for _, b in split for t in b])
    for turn in ("1", "2", "3", "4"):
        pooled = pooled_difference([paired_difference(a, b)[turn] for a, b in split])
        assert pooled["n"] == every[turn]["n"] == 39
        assert pooled["difference"] == pytest.approx(every[turn]["difference"], abs=1e-6)
        assert pooled["ci95"] == pytest.approx(every[turn]["ci95"], abs=1e-5)


def test_the_seeds_summary_gives_mean_min_max_and_refuses_a_repeated_seed(tmp_path: Path) -> None:
    runs = []
    for seed, b1 in enumerate(([True, False, False], [True, True, False], [True, True, True])):
        passes = {"train": [True] * 3, "b0": [True] * 3, "b1": b1, "w0": [True] * 3, "w1": [False] * 3}
        transcripts = tiered("gatt", passes) + [{**t, "model": "base"} for t in tiered("gatt", passes)]
        transcripts += [{**t, "model": "base+repeat"} for t in tiered("gatt", passes)]
        report = build_report(transcripts, {"seed": seed}, baselines=["base"])
        for model in ("base", "gatt"):
            report[model]["attention_on_instruction_max_head"] = {"20": 0.1 * (seed + 1)}
            report[model]["no_regression"] = {"on_topic": 0.9}
        run = tmp_path / f"seed-{seed}"
        (run / "report").mkdir(parents=True)
        (run / "report" / "report.json").write_text(json.dumps(report))
        runs.append(run)
    summary = main([*map(str, runs), "--out", str(tmp_path / "out")])
    cell = summary["adherence"]["gatt"]["tier: b"]["3"]
    assert cell == {"mean": pytest.approx((0.5 + 0.5 + 1.0) / 3, abs=1e-6), "min": 0.5, "max": 1.0, "n": 6}
    assert summary["paired_pooled"]["gatt - base"]["tier: w"]["2"] == {"difference": 0.0, "n": 6, "ci95": [0.0, 0.0]}
    assert (tmp_path / "out" / "seed-2" / "report.json").exists()
    assert "## tier: b" in (tmp_path / "out" / "seeds.md").read_text()
    with pytest.raises(ValueError, match="repeat a seed"):
        main([str(runs[0]), str(runs[0]), "--out", str(tmp_path / "again")])


def test_a_families_curve_point_pools_its_seeds_replies() -> None:
    from recipes.variety_curve import pooled

    def at_seed(passed: int) -> dict:
        cell = {"adherence": passed / 8, "n": 8, "ci95": [0.0, 1.0]}
        return {"trained_families": "5", "distinct_values": {"hobby": 3}, "tier: b": cell, "per_turn": {"tier: b": {}}}

    point = pooled([at_seed(2), at_seed(5), at_seed(8)])
    assert point["tier: b"]["adherence"] == 15 / 24 and point["tier: b"]["n"] == 24
    assert [p["tier: b"]["n"] for p in point["seeds"]] == [8, 8, 8] and point["trained_families"] == "5"
