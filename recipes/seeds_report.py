"""make demo over seeds: the mean and the spread of every report cell, and the paired differences pooled.

  python recipes/seeds_report.py runs/demo/seed-0 runs/demo/seed-1 runs/demo/seed-2 --out results/demo
  make demo-seeds                 (make demo at SEED=0, 1, 2, then this into runs/demo)

Each run folder holds a make demo run (its report/report.json and timings.json). The output, seeds.json and
seeds.md, gives per model, stratum (trained values, held-out values, each held-out tier) and turn the mean of the
seeds' adherence with its min and max, and per paired difference ("gatt - base+repeat") the difference pooled over
the seeds' dialogues with its 95% interval: each seed rolls out its own dialogues, so pooling them is one paired
sample of all of them (its mean and variance recovered exactly from each seed's n, mean and interval). Each run's
report files (report.json, report.md, its figures) and timings.json are copied to OUT/seed-S/, the seed's folder.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gatt.eval.scoring import Z95
from gatt.io.files import write_text

MODELS = ("base", "base+repeat", "gatt")
RUN_FILES = (
    "report/report.json",
    "report/report.md",
    "report/adherence.png",
    "report/tiers.png",
    "report/attention.png",
    "timings.json",
)  # what a seed's folder keeps of its run
PAIRS = ("gatt - base+repeat", "gatt - base")


def strata(report: dict[str, Any]) -> dict[str, tuple[str, str | None, str | None]]:
    """Stratum label -> (the per-turn key, its tier or None, the paired key or None) of a report."""
    out: dict[str, tuple[str, str | None, str | None]] = {
        "trained values": ("per_turn", None, "paired"),
        "held-out values": ("heldout_per_turn", None, "paired_heldout"),
    }
    for tier in report.get("tiers", {}):
        out[f"tier: {tier}"] = ("tier_per_turn", tier, None)
    return out


def _series(report: dict[str, Any], model: str, key: str, tier: str | None) -> dict[str, Any]:
    series = report[model].get(key, {})
    return series.get(tier, {}) if tier else series


def _paired(report: dict[str, Any], paired_key: str | None, tier: str | None) -> dict[str, Any]:
    return report.get("paired_tiers", {}).get(tier, {}) if tier else report.get(paired_key or "", {})


def pooled_difference(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Paired differences of several seeds pooled into one over all their dialogues: `{"difference", "n", "ci95"}`.

    Each entry's interval is the normal one, mean +- Z95 * sd / sqrt(n) (clipped to [-1, 1] on at most one side),
    so its sd is recovered from its wider half; the pooled variance adds the seeds' within and between sums of
    squares, as the per-dialogue differences of all seeds together give it."""
    n = sum(e["n"] for e in entries)
    mean = sum(e["n"] * e["difference"] for e in entries) / n
    squares = 0.0
    for e in entries:
        half = max(e["difference"] - e["ci95"][0], e["ci95"][1] - e["difference"])
        sd = half * math.sqrt(e["n"]) / Z95
        squares += (e["n"] - 1) * sd**2 + e["n"] * (e["difference"] - mean) ** 2
    half = Z95 * math.sqrt(squares / (n - 1)) / math.sqrt(n) if n > 1 else 0.0
    lo, hi = max(-1.0, mean - half), min(1.0, mean + half)
    return {"difference": round(mean, 6), "n": n, "ci95": [round(lo, 6), round(hi, 6)]}


def summarize(runs: Sequence[Path]) -> dict[str, Any]:
    """The seeds' summary (seeds.json) from make demo run folders (or folders holding report.json)."""
    reports, timings = [], []
    for run in runs:
        path = run / "report" / "report.json" if (run / "report" / "report.json").exists() else run / "report.json"
        if not path.exists():
            raise FileNotFoundError(f"{run}: no report/report.json (a make demo run folder) nor report.json")
        reports.append(json.loads(path.read_text()))
        timing = run / "timings.json"
        timings.append(json.loads(timing.read_text()) if timing.exists() else None)
    seeds = [r["settings"]["seed"] for r in reports]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the runs repeat a seed: {seeds}")
    labels = strata(reports[0])
    if any(strata(r) != labels for r in reports):
        raise ValueError("the runs hold different strata or tiers: not one recipe over seeds")
    cells: dict[str, dict[str, Any]] = {}
    for model in MODELS:
        cells[model] = {}
        for label, (key, tier, _) in labels.items():
            per_seed = [_series(r, model, key, tier) for r in reports]
            turns = [t for t in per_seed[0] if all(t in s for s in per_seed)]
            values = {t: [s[t]["adherence"] for s in per_seed] for t in turns}
            cells[model][label] = {
                t: {
                    "mean": round(sum(v) / len(v), 6),
                    "min": min(v),
                    "max": max(v),
                    "n": sum(s[t]["n"] for s in per_seed),
                }
                for t, v in values.items()
            }
    paired: dict[str, dict[str, Any]] = {}
    for pair in PAIRS:
        paired[pair] = {}
        for label, (_, tier, paired_key) in labels.items():
            per_seed = [_paired(r, paired_key, tier).get(pair, {}) for r in reports]
            turns = [t for t in per_seed[0] if all(t in s for s in per_seed)]
            paired[pair][label] = {t: pooled_difference([s[t] for s in per_seed]) for t in turns}
    attention = [r["gatt"]["attention_on_instruction_max_head"].get("20") for r in reports]
    base_attention = [r["base"]["attention_on_instruction_max_head"].get("20") for r in reports]
    return {
        "seeds": seeds,
        "runs": [str(run) for run in runs],
        "tiers": reports[0].get("tiers", {}),
        "adherence": cells,
        "paired_pooled": paired,
        "attention_max_head_turn_20": {"base": base_attention, "gatt": attention},
        "no_regression_on_topic": {m: [r[m]["no_regression"]["on_topic"] for r in reports] for m in ("base", "gatt")},
        "seconds": [None if t is None else t["total_seconds"] for t in timings],
        "work_seconds": [None if t is None else t["machine"].get("work_seconds") for t in timings],
    }


def markdown(summary: dict[str, Any], turns: Sequence[str] = ("2", "4", "6", "10", "20", "30")) -> str:
    """seeds.md: per stratum a table of each model's mean (min-max) at `turns`, and the pooled paired differences."""
    seeds = ", ".join(map(str, summary["seeds"]))
    parts = [f"# make demo over seeds {seeds}: mean (min-max) of the seeds; paired differences pooled"]
    for label in summary["adherence"]["gatt"]:
        header = ["turn", *MODELS, *PAIRS]
        rows = []
        for t in turns:
            cells = []
            for model in MODELS:
                c = summary["adherence"][model][label].get(t)
                cells.append(
                    "–" if c is None else f"{100 * c['mean']:.1f}% ({100 * c['min']:.1f}-{100 * c['max']:.1f})"
                )
            for pair in PAIRS:
                d = summary["paired_pooled"][pair][label].get(t)
                cells.append(
                    "–"
                    if d is None
                    else f"{100 * d['difference']:+.1f} [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}] (n={d['n']})"
                )
            rows.append([t, *cells])
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        parts += [f"## {label}", "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="make demo run folders, one a seed")
    parser.add_argument("--out", type=Path, required=True, help="folder for seeds.json and seeds.md")
    args = parser.parse_args(argv)
    summary = summarize(args.runs)
    for seed, run in zip(summary["seeds"], args.runs):
        if (args.out / f"seed-{seed}").resolve() == run.resolve():
            continue  # the run is already the seed's folder (make demo-seeds into runs/demo)
        for name in RUN_FILES:
            if (run / name).exists() and (run / "report").exists():
                (args.out / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run / name, args.out / f"seed-{seed}" / Path(name).name)
    write_text(args.out / "seeds.json", json.dumps(summary, indent=2) + "\n")
    write_text(args.out / "seeds.md", markdown(summary))
    print(markdown(summary))
    return summary


if __name__ == "__main__":
    main()
