"""Fine-tuning with GAtt vs boosting attention at inference: split-softmax at several strengths beside GAtt.

  python recipes/split_softmax_sweep.py --base embedded --gatt runs/demo/round-1/gatt/final \
      --like results/demo/width-128/report.json --strengths 0.25 0.5 0.75 --out results/split-softmax/embedded

One `python -m gatt.eval.evaluate` run with the settings of an earlier report (`--like`: same dialogues, turns,
seed, decoding) rolls out base, base+repeat, gatt and base+split at every strength; then:
  OUT/strength-S/   report.json, report.md, adherence.png, attention.png: the four models with base+split at S
  OUT/sweep.json    per model and strength: adherence at turns 2/10/20 (train constraints and held-out values),
                    the on-topic rate and reply length with and without the instruction, attention on it
  OUT/sweep.md, OUT/sweep.png   the same as a table and a figure.
The evaluation's own folder (transcripts included) is WORK/all (default: runs/split-softmax/OUT's name); a
finished evaluation with the same command is reused, so a rerun only rewrites the summaries.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from gatt.eval.evaluate import main as evaluate_main
from gatt.eval.evaluate import split_column
from gatt.eval.report import build_report, write_report
from gatt.eval.scoring import REPEAT_SUFFIX, SPLIT_SUFFIX
from gatt.io.cli import exit_on_bad_input
from gatt.io.files import write_text

TURNS = (2, 10, 20)
COMMITTED = ("report.json", "report.md", "adherence.png", "attention.png")  # transcripts stay under WORK


def evaluate_argv(like: dict[str, Any], base: str, gatt: str, strengths: list[float], out: Path) -> list[str]:
    """The evaluation command of the `--like` report's settings, with base+split at every strength."""
    s = like["settings"]
    argv = [
        "--model",
        f"base={base}",
        "--model",
        f"gatt={gatt}",
        "--repeat-instruction",
        "base",
        "--split-softmax",
        "base:" + ",".join(f"{x:g}" for x in strengths),
        "--turns",
        str(s["turns"]),
        "--dialogues",
        str(s["dialogues"]),
        "--no-instruction-dialogues",
        str(s["no_instruction_dialogues"]),
        "--seed",
        str(s["seed"]),
        "--placement",
        s["placement"],
        "--probe-every",
        str(s["probe_every"]),
        "--short-prob",
        str(s["short_prob"]),
        "--max-new-tokens",
        str(s["max_new_tokens"]),
        "--out",
        str(out),
    ]
    if s["constraints"] != "built-in":
        argv += ["--constraints", s["constraints"]]
    if s["user_turns"] != "built-in held-out pool":
        argv += ["--user-turns", s["user_turns"]]
    if s["decoding"] == "sample":
        argv += ["--sample", "--temperature", str(s["temperature"]), "--top-p", str(s["top_p"])]
    if "repetition_penalty" in s:
        argv += ["--repetition-penalty", str(s["repetition_penalty"])]
    if "no_repeat_ngram_size" in s:
        argv += ["--no-repeat-ngram-size", str(s["no_repeat_ngram_size"])]
    return argv


def run_evaluation(argv: list[str], folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The evaluation's report and transcripts; made again only when its command changed."""
    stamp = folder / "command.json"
    if not (stamp.exists() and json.loads(stamp.read_text()) == argv and (folder / "transcripts.jsonl").exists()):
        stamp.unlink(missing_ok=True)
        evaluate_main(argv)
        write_text(stamp, json.dumps(argv) + "\n")
    else:
        print(f"[sweep] {folder}: evaluated with the same command before, reused", file=sys.stderr)
    transcripts = [json.loads(line) for line in (folder / "transcripts.jsonl").read_text().splitlines()]
    return json.loads((folder / "report.json").read_text()), transcripts


def strength_report(
    report: dict[str, Any], transcripts: list[dict[str, Any]], strength: float, strengths: list[float]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The four-model report of one strength: base, base+repeat, gatt and base+split (at `strength`)."""
    column = split_column("base", strength, strengths)
    keep = {"base", "base" + REPEAT_SUFFIX, "gatt", column}
    chosen = [
        {**t, "model": "base" + SPLIT_SUFFIX} if t["model"] == column else t for t in transcripts if t["model"] in keep
    ]
    settings = {**report["settings"], "split_softmax": {"base": [strength]}}
    return build_report(chosen, settings), chosen


def summary_row(scores: dict[str, Any]) -> dict[str, Any]:
    """What the sweep table shows of one model: adherence at TURNS, the fluency cost, the attention."""

    def at(table: dict[str, Any]) -> dict[str, float | None]:
        return {str(t): table[str(t)]["adherence"] if str(t) in table else None for t in TURNS}

    def regression(entry: dict[str, Any] | None) -> dict[str, float] | None:
        return (
            None
            if entry is None
            else {"on_topic": entry["on_topic"], "n": entry["n"], "mean_words": entry["mean_words"]}
        )

    heads = scores.get("attention_on_instruction_max_head") or {}
    return {
        "train": at(scores["per_turn"]),
        "heldout_values": at(scores["heldout_per_turn"]),
        "train_checks_alone": at(scores["checks_only"]["per_turn"]),
        "with_instruction": regression(scores.get("no_regression_instructed")),
        "without_instruction": regression(scores["no_regression"]),
        "attention_max_head": {str(t): heads.get(str(t)) for t in TURNS},
    }


def sweep_summary(report: dict[str, Any], strengths: list[float]) -> dict[str, Any]:
    rows = {name: summary_row(report[name]) for name in ("base", "base" + REPEAT_SUFFIX, "gatt")}
    for strength in strengths:
        rows[f"base+split@{strength:g}"] = summary_row(report[split_column("base", strength, strengths)])
    return {"settings": report["settings"], "strengths": strengths, "models": rows}


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def sweep_markdown(summary: dict[str, Any]) -> str:
    turns = " | ".join(f"turn {t}" for t in TURNS)
    lines = [
        f"| model | {turns} | held-out values, turn {TURNS[-1]} | on topic with the instruction | "
        "mean words with it | on topic without | max-head attention, turn 20 |",
        "|---" * (len(TURNS) + 6) + "|",
    ]
    for name, row in summary["models"].items():
        with_, without = row["with_instruction"] or {}, row["without_instruction"] or {}
        head = row["attention_max_head"][str(TURNS[-1])]
        lines.append(
            f"| {name} | "
            + " | ".join(_pct(row["train"][str(t)]) for t in TURNS)
            + f" | {_pct(row['heldout_values'][str(TURNS[-1])])} | {_pct(with_.get('on_topic'))}"
            f" | {with_.get('mean_words', float('nan')):.1f} | {_pct(without.get('on_topic'))}"
            f" | {'–' if head is None else f'{head:.3f}'} |"
        )
    return (
        "Adherence on train constraints (checks and answer gate); on topic: chat turns answered on the user's "
        "topic (the gate's verdict).\n\n" + "\n".join(lines) + "\n"
    )


def sweep_figure(summary: dict[str, Any], title: str) -> Figure:
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    strengths = summary["strengths"]
    rows = summary["models"]
    split_rows = [rows[f"base+split@{s:g}"] for s in strengths]
    for i, t in enumerate(TURNS):
        values = [100 * (r["train"][str(t)] or 0.0) for r in split_rows]
        left.plot(
            [0.0, *strengths],
            [100 * (rows["base"]["train"][str(t)] or 0.0), *values],
            marker="o",
            color=f"C{i}",
            label=f"base+split, turn {t}",
        )
        gatt = rows["gatt"]["train"][str(t)]
        if gatt is not None:
            left.axhline(100 * gatt, color=f"C{i}", linestyle="--", linewidth=1, label=f"gatt, turn {t}")
    left.set(
        xlabel="split-softmax strength (0: base)",
        ylabel="adherence (%)",
        ylim=(0, 102),
        title="Adherence (train constraints)",
    )
    left.legend(fontsize=7)
    on_topic = [100 * ((r["with_instruction"] or {}).get("on_topic") or 0.0) for r in split_rows]
    base_on_topic = 100 * ((rows["base"]["with_instruction"] or {}).get("on_topic") or 0.0)
    right.plot([0.0, *strengths], [base_on_topic, *on_topic], marker="o", color="C3", label="base+split")
    gatt_on_topic = (rows["gatt"]["with_instruction"] or {}).get("on_topic")
    if gatt_on_topic is not None:
        right.axhline(100 * gatt_on_topic, color="C3", linestyle="--", linewidth=1, label="gatt")
    right.set(
        xlabel="split-softmax strength (0: base)",
        ylabel="on topic (%)",
        ylim=(0, 102),
        title="Fluency cost: on topic with the instruction",
    )
    right.legend(fontsize=7)
    fig.suptitle(title)
    return fig


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.strengths or any(not 0.0 < s <= 1.0 for s in args.strengths):
        raise ValueError(f"--strengths must be numbers in (0, 1], got {args.strengths}")
    like = json.loads(Path(args.like).read_text())
    work = args.work or Path("runs/split-softmax") / args.out.name
    strengths = sorted(set(args.strengths))
    report, transcripts = run_evaluation(
        evaluate_argv(like, args.base, args.gatt, strengths, work / "all"), work / "all"
    )
    for strength in strengths:
        folder = work / f"strength-{strength:g}"
        write_report(*strength_report(report, transcripts, strength, strengths), folder)
        target = args.out / f"strength-{strength:g}"
        target.mkdir(parents=True, exist_ok=True)
        for name in COMMITTED:
            shutil.copyfile(folder / name, target / name)
    summary = sweep_summary(report, strengths)
    write_text(args.out / "sweep.json", json.dumps(summary, indent=2) + "\n")
    write_text(args.out / "sweep.md", sweep_markdown(summary))
    sweep_figure(summary, args.title or args.out.name).savefig(args.out / "sweep.png", dpi=120)
    print(sweep_markdown(summary))
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the base chat model folder (`embedded`: the shipped chat model)")
    parser.add_argument("--gatt", required=True, help="the GAtt model folder (fine-tuned from --base)")
    parser.add_argument("--like", required=True, type=Path, help="a report.json whose settings the sweep reuses")
    parser.add_argument(
        "--strengths",
        type=float,
        nargs="+",
        default=[0.25, 0.5, 0.75],
        help="split-softmax strengths, each in (0, 1] (default: 0.25 0.5 0.75)",
    )
    parser.add_argument("--out", type=Path, required=True, help="results folder (per-strength reports and the sweep)")
    parser.add_argument("--work", type=Path, help="the evaluation's folder (default: runs/split-softmax/<out name>)")
    parser.add_argument("--title", help="figure title (default: the out folder's name)")
    args = parser.parse_args(argv)
    with exit_on_bad_input():
        return run(args)


if __name__ == "__main__":
    main()
