"""Held-out adherence against the variety of the GAtt data: does GAtt learn "keep what the system message
says", or a list of constraints?

  python recipes/variety_curve.py --values 1 4 all [--demo-run runs/demo] [--out runs/variety] [key=value ...]

For each K in --values, the main job's GAtt stages run again on its chat model (the shipped one, as in
--config): GAtt data with at most K train values of each family (`data_gen gatt --values-per-family K`, a
nested fixed-seed draw), the GAtt fine-tune, and the report of the GAtt model alone, under OUT/K/ (stages
skip and resume as in recipes/demo.py); K = all is a finished main job's own GAtt model (--demo-run), read
from its report (so --config should be the one that made it). Then OUT/variety.json and OUT/variety.png: the distinct values
each family had in the GAtt data -> adherence at --turn on trained values, held-out values and the
held-out family. `key=value` overrides DemoConfig fields of --config for every point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo import ROOT, DemoConfig, gatt_data_dir, run  # noqa: E402

from gatt.cli import exit_on_bad_input  # noqa: E402
from gatt.train import dataclass_from_dict, read_yaml_config  # noqa: E402

STRATA = {
    "trained values": "per_turn",
    "held-out values": "heldout_per_turn",
    "held-out family": "heldout_family_per_turn",
}


def distinct_values(gatt_file: Path) -> dict[str, int]:
    """Per family, how many distinct values the GAtt data holds."""
    values: dict[str, set[str]] = {}
    with gatt_file.open(encoding="utf-8") as f:
        for line in f:
            for c in json.loads(line)["constraints"]:
                values.setdefault(c["family"], set()).add(c["value"])
    return {family: len(v) for family, v in sorted(values.items())}


def point(config: DemoConfig, values: str, out: Path, turn: str, demo_run: Path) -> dict[str, Any]:
    """One K: run its stages (K = all: the demo run's own GAtt model and report) and read back its figures."""
    if values == "all":
        folder = demo_run
        report = json.loads((folder / "report" / "report.json").read_text())
    else:
        folder = out / values
        report = run(
            DemoConfig(
                **{**vars(config), "out": str(folder), "gatt_values_per_family": int(values), "eval_baselines": False}
            )
        )
    gatt = report[report["rounds"][0]["student"] if report.get("rounds") else "gatt"]  # trained on round 1's data
    return {
        "values_per_family": values,
        "distinct_values": distinct_values(gatt_data_dir(folder, 1) / "gatt.jsonl"),
        **{name: gatt[key].get(turn) for name, key in STRATA.items()},  # {"adherence", "n", "ci95"}
    }


def adherence(p: dict[str, Any], name: str) -> float:
    return 100 * p[name]["adherence"] if p[name] else float("nan")


def plot(points: list[dict[str, Any]], turn: str, path: Path) -> None:
    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    x = [sum(p["distinct_values"].values()) for p in points]
    for name in STRATA:
        axes.plot(x, [adherence(p, name) for p in points], marker="o", label=name)
    axes.set_xscale("log")
    axes.set_xlabel("distinct constraint values in the GAtt data (all families)")
    axes.set_ylabel(f"GAtt adherence at turn {turn} (%)")
    axes.set_ylim(-5, 105)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--values",
        nargs="+",
        required=True,
        metavar="K",
        help="values per family for each point: positive integers, or 'all'",
    )
    parser.add_argument(
        "--config",
        default=str(ROOT / "recipes" / "configs" / "demo.yaml"),
        help="the DemoConfig YAML the points share (default: recipes/configs/demo.yaml)",
    )
    parser.add_argument(
        "--demo-run", type=Path, default=Path("runs/demo"), help="a finished make-demo folder: the point K = all"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/variety"), help="one folder per point, and the curve")
    parser.add_argument("--turn", default="20", help="the turn the curve reads (default: 20)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a DemoConfig key for every point")
    args = parser.parse_args(argv)
    with exit_on_bad_input():
        bad = [v for v in args.values if v != "all" and not (v.isdigit() and int(v) >= 1)]
        if bad:
            raise ValueError(f"--values takes positive integers or 'all', got {', '.join(bad)}")
        values = read_yaml_config(args.config, args.overrides)
        config = dataclass_from_dict(DemoConfig, values, args.config)
        points = [point(config, v, args.out, args.turn, args.demo_run) for v in args.values]
        args.out.mkdir(parents=True, exist_ok=True)
        tmp = args.out / ".variety.json.tmp"
        tmp.write_text(
            json.dumps({"turn": args.turn, "demo_run": str(args.demo_run), "points": points}, indent=2) + "\n"
        )
        os.replace(tmp, args.out / "variety.json")
        plot(points, args.turn, args.out / "variety.png")
    for p in points:
        print(
            f"K={p['values_per_family']:>4} distinct={sum(p['distinct_values'].values()):>4} "
            + "  ".join(f"{name} {adherence(p, name):5.1f}%" for name in STRATA)
        )
    print(f"wrote {args.out / 'variety.json'} and {args.out / 'variety.png'}")
    return points


if __name__ == "__main__":
    main()
