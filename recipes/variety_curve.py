"""Held-out adherence against the variety of the GAtt data: does GAtt learn "keep what the system message
says", or a list of constraints?

  python recipes/variety_curve.py --families 5 10 20 all [--seeds 0 1 2] [--out runs/families] [key=value ...]
  python recipes/variety_curve.py --values 1 4 all [--demo-run runs/demo/seed-0] [--out runs/variety] [key=value ...]

Two axes of variety, one per run. For each K, the main job's GAtt stages run again on its chat model (the
shipped one, as in --config), under OUT/K/ (stages skip and resume as in recipes/demo.py): GAtt data with the
train values of at most K families (`--families`: `data_gen gatt --trained-families K`) or at most K train
values of each family (`--values`: `--values-per-family K`), both nested fixed-seed draws; the GAtt fine-tune;
and the report of the GAtt model alone. K = all is a finished main job's own GAtt model (--demo-run), read from
its report (so --config should be the one that made it). Then OUT/families.json and OUT/families.png (or
variety.json and variety.png): the families and distinct values the GAtt data held -> GAtt adherence at --turn
on trained values, held-out values, held-out families and each held-out tier, each with its n and 95% Wilson
interval (every turn's figures under `per_turn`), with --seeds each cell the seeds' replies pooled; OUT/families.md
(variety.md) has the same as tables.
`key=value` overrides DemoConfig fields of --config for every point.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from gatt.eval.report import rate_cell
from gatt.eval.scoring import rate
from gatt.io.cli import exit_on_bad_input
from gatt.io.files import write_text
from recipes.demo import ROOT, DemoConfig, load_config, run
from recipes.rounds import gatt_data_dir

STRATA = {
    "trained values": "per_turn",
    "held-out values": "heldout_per_turn",
    "held-out families": "heldout_family_per_turn",
}


def distinct_values(gatt_file: Path) -> dict[str, int]:
    """Per family, how many distinct values the GAtt data holds."""
    values: dict[str, set[str]] = {}
    with gatt_file.open(encoding="utf-8") as f:
        for line in f:
            for c in json.loads(line)["constraints"]:
                values.setdefault(c["family"], set()).add(c["value"])
    return {family: len(v) for family, v in sorted(values.items())}


# The two axes, --families K and --values K: the data.gatt key each sets (the point's key in the JSON).
AXES = {"families": "trained_families", "values": "values_per_family"}


def point(config: DemoConfig, axis: str, k: str, out: Path, turn: str, demo_run: Path) -> dict[str, Any]:
    """One K of `axis` at `config.seed`: run its stages (K = all: the demo run's own GAtt model and report) and read
    back its figures."""
    name = AXES[axis]
    if k == "all":
        folder = demo_run
        report = json.loads((folder / "report" / "report.json").read_text())
    else:
        folder = out / k if config.seed == 0 else out / k / f"seed-{config.seed}"
        data = {**config.data, "gatt": {**config.data.get("gatt", {}), name: int(k)}}
        report = run(dataclasses.replace(config, out=str(folder), data=data, baselines=False))
    gatt = report[report["rounds"][0]["student"] if report.get("rounds") else "gatt"]  # trained on round 1's data
    series = {stratum: gatt[key] for stratum, key in STRATA.items()}
    series |= {f"tier: {tier}": gatt["tier_per_turn"][tier] for tier in report.get("tiers", {})}  # held-out tiers
    return {
        name: k,
        "distinct_values": distinct_values(gatt_data_dir(folder, 1) / "gatt.jsonl"),
        **{stratum: per_turn.get(turn) for stratum, per_turn in series.items()},  # {"adherence", "n", "ci95"}
        "per_turn": series,  # every turn, for the docs
    }


def _pool(cells: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Cells of one stratum and turn at several seeds as one: successes and n added, a Wilson interval on the sum."""
    present = [c for c in cells if c]
    if not present:
        return None
    return rate(sum(round(c["adherence"] * c["n"]) for c in present), sum(c["n"] for c in present))


def pooled(points: list[dict[str, Any]]) -> dict[str, Any]:
    """One K's points at several seeds as one: each stratum's replies pooled at the curve's turn and at every turn
    of `per_turn`, the distinct values of the first seed's data, each seed's point under `seeds`."""
    if len(points) == 1:
        return points[0]
    out: dict[str, Any] = {key: points[0][key] for key in (*AXES.values(), "distinct_values") if key in points[0]}
    per_turn: dict[str, dict[str, Any]] = {}
    for stratum in points[0]["per_turn"]:
        out[stratum] = _pool([p[stratum] for p in points])
        turns = sorted({t for p in points for t in p["per_turn"][stratum]}, key=int)
        per_turn[stratum] = {t: _pool([p["per_turn"][stratum].get(t) for p in points]) for t in turns}
    return {**out, "per_turn": per_turn, "seeds": points}


TABLE_TURNS = ("2", "4", "6", "10", "20", "30")  # the columns of the markdown's per-stratum tables, where present


def markdown(points: list[dict[str, Any]], axis: str, turn: str, seeds: list[int]) -> str:
    """The curve as tables: every stratum at `turn` by K, then each stratum by turn."""
    key = AXES[axis]
    strata = list(points[0]["per_turn"])

    def row(label: str, cells: list[str]) -> str:
        return "| " + " | ".join([label, *cells]) + " |"

    def labelled(p: dict[str, Any]) -> str:
        return f"{p[key]} ({len(p['distinct_values'])} families, {sum(p['distinct_values'].values())} values)"

    lines = [
        f"# GAtt adherence against the {axis} in its data",
        "",
        f"Seeds {', '.join(map(str, seeds))}, each cell their replies pooled (n) with its 95% Wilson interval; K = all"
        " is the make-demo run's own GAtt model. K, then the families and distinct values the GAtt data held (the"
        " first seed's).",
        "",
        f"## Turn {turn}",
        "",
        row("K", strata),
        row("---", ["---"] * len(strata)),
        *(row(labelled(p), [rate_cell(p[s]) for s in strata]) for p in points),
    ]
    for stratum in strata:
        turns = [t for t in TABLE_TURNS if any(t in p["per_turn"][stratum] for p in points)]
        lines += [
            "",
            f"## {stratum}, by turn",
            "",
            row("K", [f"turn {t}" for t in turns]),
            row("---", ["---"] * len(turns)),
            *(row(str(p[key]), [rate_cell(p["per_turn"][stratum].get(t)) for t in turns]) for p in points),
        ]
    return "\n".join(lines) + "\n"


def adherence(p: dict[str, Any], name: str) -> float:
    return 100 * p[name]["adherence"] if p[name] else float("nan")


def plot(points: list[dict[str, Any]], axis: str, turn: str, path: Path) -> None:
    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    if axis == "families":
        x = [len(p["distinct_values"]) for p in points]
        axes.set_xlabel("families in the GAtt data")
    else:
        x = [sum(p["distinct_values"].values()) for p in points]
        axes.set_xscale("log")
        axes.set_xlabel("distinct constraint values in the GAtt data (all families)")
    for name in points[0]["per_turn"]:
        y = [adherence(p, name) for p in points]
        low = [y_ - 100 * p[name]["ci95"][0] if p[name] else 0.0 for y_, p in zip(y, points, strict=True)]
        high = [100 * p[name]["ci95"][1] - y_ if p[name] else 0.0 for y_, p in zip(y, points, strict=True)]
        axes.errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=name)
    axes.set_ylabel(f"GAtt adherence at turn {turn} (%), 95% Wilson")
    axes.set_ylim(-5, 105)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    axis = parser.add_mutually_exclusive_group(required=True)
    axis.add_argument(
        "--families",
        nargs="+",
        metavar="K",
        help="trained families for each point: positive integers, or 'all' (the families curve)",
    )
    axis.add_argument(
        "--values",
        nargs="+",
        metavar="K",
        help="values per family for each point: positive integers, or 'all' (the variety curve)",
    )
    parser.add_argument(
        "--config",
        default=str(ROOT / "recipes" / "configs" / "demo.yaml"),
        help="the DemoConfig YAML the points share (default: recipes/configs/demo.yaml)",
    )
    parser.add_argument(
        "--demo-run",
        default="runs/demo/seed-{seed}",
        help="a finished make-demo folder, the point K = all; {seed} is each seed (default: %(default)s)",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="run every point at these seeds and pool each point's replies over them (default: the config's seed)",
    )
    parser.add_argument(
        "--out", type=Path, help="one folder per point, and the curve (default: runs/families or runs/variety)"
    )
    parser.add_argument("--turn", default="20", help="the turn the curve reads (default: 20)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a demo config key for every point")
    args = parser.parse_args(argv)
    name = "families" if args.families else "variety"
    axis, ks = ("families", args.families) if args.families else ("values", args.values)
    out = args.out or Path("runs") / name
    with exit_on_bad_input():
        bad = [k for k in ks if k != "all" and not (k.isdigit() and int(k) >= 1)]
        if bad:
            raise ValueError(f"--{axis} takes positive integers or 'all', got {', '.join(bad)}")
        config = load_config(args.config, args.overrides)
        seeds = args.seeds or [config.seed]
        points = []
        for k in ks:
            at_seeds = []
            for seed in seeds:
                demo_run = Path(str(args.demo_run).format(seed=seed))
                at_seeds.append(point(dataclasses.replace(config, seed=seed), axis, k, out, args.turn, demo_run))
            points.append(pooled(at_seeds))
        out.mkdir(parents=True, exist_ok=True)
        write_text(
            out / f"{name}.json",
            json.dumps({"turn": args.turn, "demo_run": args.demo_run, "seeds": seeds, "points": points}, indent=2)
            + "\n",
        )
        write_text(out / f"{name}.md", markdown(points, axis, args.turn, seeds))
        plot(points, axis, args.turn, out / f"{name}.png")
    for p in points:
        print(
            f"K={p[AXES[axis]]:>4} families={len(p['distinct_values']):>3} "
            f"distinct={sum(p['distinct_values'].values()):>4} "
            + "  ".join(f"{stratum} {adherence(p, stratum):5.1f}%" for stratum in p["per_turn"])
        )
    print(f"wrote {out / f'{name}.json'}, {out / f'{name}.md'} and {out / f'{name}.png'}")
    return points


if __name__ == "__main__":
    main()
