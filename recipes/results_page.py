"""Render the measured tables and figures of README.md and docs/results.md from the committed JSON under results/.

  python recipes/results_page.py            # rewrite every result block in place
  python recipes/results_page.py --check    # exit 1, naming the block, where a block differs from its JSON

A result block is `<!-- result: NAME -->` ... `<!-- /result -->`, a table on the lines between or a figure inline;
NAME is one of TABLES below, each a function that reads its JSON and returns the markdown. The prose around a block
is written by hand; the figures inside it come only from here, so a block cannot drift from the result it shows
(tests/test_results_page.py runs the check).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from statistics import mean
from typing import Any

from gatt.io.files import write_text

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/results.md")
BLOCK = re.compile(r"(<!-- result: (\S+) -->\n?)(.*?)(<!-- /result -->)", re.S)
TURNS = ("2", "4", "6", "10", "20", "30")


@cache
def read(path: str) -> dict[str, Any]:
    """A committed result file, by its path under the repository (read once: several blocks show one file)."""
    return json.loads((ROOT / path).read_text(encoding="utf-8"))


def pct(share: float) -> str:
    """0.765625 -> "76.6%"."""
    return f"{100 * share:.1f}%"


def diff(paired: dict[str, Any]) -> str:
    """A paired difference with its 95% interval, in points: "+12.5 [+3.1, +21.9]"."""
    lo, hi = paired["ci95"]
    return f"{100 * paired['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def per_turn(path: str, models: Sequence[str], paired: Sequence[str] = (), turns: Sequence[str] = TURNS) -> str:
    """Rows per turn: each model's adherence on trained values, then paired differences ("gatt - base")."""
    report = read(path)
    rows = [
        [
            t,
            *(pct(report[m]["per_turn"][t]["adherence"]) for m in models),
            *(diff(report["paired"][p][t]) for p in paired),
        ]
        for t in turns
    ]
    return table(["turn", *models, *paired], rows)


DEMO_TIMINGS = "results/demo/seed-0/timings.json"  # make demo at seed 0: stage seconds and calibration
SEEDS = "results/demo/seeds.json"  # make demo-seeds: make demo at seeds 0, 1, 2 (recipes/seeds_report.py)


def spread(cell: dict[str, Any]) -> str:
    """A cell over seeds, its mean and its range: "91.1% (89.1-93.8)"."""
    return f"{pct(cell['mean'])} ({100 * cell['min']:.1f}-{100 * cell['max']:.1f})"


def main_result() -> str:
    """make demo over three seeds: each model on trained values, then GAtt on held-out values and on each held-out
    tier, per turn: the mean of the seeds and their range (README)."""
    seeds = read(SEEDS)["adherence"]
    rows = [[m, *(spread(seeds[m]["trained values"][t]) for t in TURNS)] for m in ("base", "base+repeat", "gatt")]
    rows += [[f"gatt, {label}", *(spread(seeds["gatt"][label][t]) for t in TURNS)] for label in list(seeds["gatt"])[1:]]
    return table(["model", *(f"turn {t}" for t in TURNS)], rows)


def embedded_strata() -> str:
    """make demo over three seeds: base, base+repeat and gatt on every stratum and tier (means), and gatt -
    base+repeat paired, pooled over the seeds' dialogues."""
    summary = read(SEEDS)
    seeds, paired = summary["adherence"], summary["paired_pooled"]["gatt - base+repeat"]
    rows = []
    for label in seeds["gatt"]:
        for t in TURNS:
            cells = [pct(seeds[m][label][t]["mean"]) for m in ("base", "base+repeat", "gatt")]
            rows.append([label, t, *cells, diff(paired[label][t]), str(paired[label][t]["n"])])
    return table(["stratum", "turn", "base", "base+repeat", "gatt", "gatt - base+repeat, pooled", "n"], rows)


def embedded_more() -> str:
    """make demo over three seeds: attention on the instruction at turn 20, no regression without an instruction, the
    time of each seed with its machine's work reading."""
    summary = read(SEEDS)
    heads, topic = summary["attention_max_head_turn_20"], summary["no_regression_on_topic"]
    ratios = [g / b for g, b in zip(heads["gatt"], heads["base"])]
    times = ", ".join(f"{s:.0f} s" for s in summary["seconds"])
    works = ", ".join(f"{w} s" for w in summary["work_seconds"])
    return table(
        ["measure", "base", "gatt"],
        [
            [
                "max-head attention on the instruction, turn 20",
                f"{mean(heads['base']):.3f}",
                f"{mean(heads['gatt']):.3f}",
            ],
            ["gatt / base (per seed)", "", ", ".join(f"{r:.1f}x" for r in ratios)],
            ["on topic without an instruction", pct(mean(topic["base"])), pct(mean(topic["gatt"]))],
            ["make demo, wall on 2 cores, per seed", "", times],
            ["the machine's work reading, per seed", "", works],
        ],
    )


def smollm2() -> str:
    """make smollm2-full: two GAtt rounds on SmolLM2-135M-Instruct, paired against base and base+repeat."""
    return per_turn(
        "results/smollm2-135m-full/report.json",
        ["base", "base+repeat", "gatt-r1", "gatt-r2"],
        ["gatt-r2 - base", "gatt-r2 - base+repeat"],
        turns=TURNS[:-1],
    )


def smollm2_rounds() -> str:
    """make smollm2-full: each round's teacher pass rate per family and its student per turn."""
    rounds = read("results/smollm2-135m-full/report.json")["rounds"]
    families = list(rounds[0]["teacher_pass_rate_per_family"])
    rows = [
        [
            str(r["round"]),
            str(r["records"]),
            *(pct(r["teacher_pass_rate_per_family"][f]) for f in families),
            *(pct(r["per_turn"][t]["adherence"]) for t in ("2", "10", "20")),
        ]
        for r in rounds
    ]
    return table(["round", "records", *(f"teacher: {f}" for f in families), "turn 2", "turn 10", "turn 20"], rows)


def grpo(path: str) -> str:
    """GAtt followed by GRPO on the checks: each model per turn and gatt+grpo paired against gatt and base+repeat."""
    return per_turn(
        path,
        ["base", "base+repeat", "gatt", "gatt+grpo"],
        ["gatt+grpo - gatt", "gatt+grpo - base+repeat"],
        turns=TURNS[:-1],
    )


def any_turn() -> str:
    """make any-turn: adherence d turns after each kind's event, and the share still following an old instruction."""
    report, models = read("results/any-turn/report.json"), ("base", "base+repeat", "gatt", "gatt-any")
    rows = []
    for kind in ("first", "late", "replace", "revoke", "add"):
        for d in ("1", "19"):
            if kind != "revoke" and not (kind == "first" and d == "1"):
                rows.append(
                    [f"{kind}, {d}", *(pct(report[m]["per_kind"][kind]["after"][d]["adherence"]) for m in models)]
                )
            if kind in ("replace", "revoke"):
                old = [pct(report[m]["per_kind"][kind]["old_followed"][d]["share"]) for m in models]
                rows.append([f"{kind}: old followed, {d}", *old])
    return table(["kind, d", *models], rows)


def ifeval() -> str:
    """make smollm2-ifeval: IFBench's and IFEval's own prompt_strict per turn, and the gated adherence on held-out
    IFBench types."""
    report, models = read("results/smollm2-135m-ifeval/report.json"), ("base", "base+repeat", "gatt")
    rows = [
        [t, *(pct(report[m]["ifbench"]["per_turn"][t]["prompt_strict"]) for m in models)]
        + [pct(report[m]["heldout_family_per_turn"][t]["adherence"]) for m in models]
        for t in ("2", "4", "6", "10", "20")
    ]
    return table(["turn", *(f"{m}: IFBench prompt_strict" for m in models), *(f"{m}: gated" for m in models)], rows)


def split_softmax() -> str:
    """GAtt or split-softmax: trained values at turns 2, 10, 20 and on-topic replies, per model of the sweep."""
    models = read("results/split-softmax/embedded/sweep.json")["models"]
    rows = [
        [name, *(pct(m["train"][t]) for t in ("2", "10", "20")), pct(m["with_instruction"]["on_topic"])]
        for name, m in models.items()
    ]
    return table(["model", "turn 2", "turn 10", "turn 20", "on topic"], rows)


def benchmarks() -> str:
    """make bench: each speed or memory ratio against its baseline, its goal and whether it is met."""
    results = read("results/benchmarks.json")
    rows = [
        [
            f"`{name}`",
            f"{entry['ratio']:.2f}x",
            entry["unit"],
            f"{entry['goal']:.2f}x",
            "met" if entry["met"] else "missed",
        ]
        for name, entry in results.items()
        if isinstance(entry, dict) and "ratio" in entry
    ]
    return table(["comparison", "ratio", "unit", "goal", ""], rows)


def calibration() -> str:
    """benchmarks/bench_calibration.py: one job on several machines, its wall time converted to the reference by the
    project's own kind of work and by an fp32 matmul, and how far the machines disagree by each."""
    result = read("results/calibration.json")
    rows = [
        [
            f"{r['cpu']}, {r['cores']} core{'s' if r['cores'] > 1 else ''}",
            f"`{r['job']}`",
            f"{r['wall_seconds']:.0f} s",
            f"{r['work_seconds']:.2f} s",
            f"{r['fp32_matmul_gflops']:.0f}",
            f"{r['at_reference_by_work']:.0f} s",
            f"{r['at_reference_by_matmul']:.0f} s",
        ]
        for r in result["rows"].values()
    ]
    rows += [
        [f"spread, {job}", "", f"{s['wall']:.2f}x", "", "", f"{s['by_work']:.2f}x", f"{s['by_matmul']:.2f}x"]
        for job, s in result["spread"].items()
    ]
    header = ["machine", "job", "wall", "work reading", "fp32 GFLOP/s", "at the reference, by work", "by matmul"]
    return table(header, rows)


def ratio(name: str, what: str) -> Callable[[], str]:
    """An inline figure: benchmark `name`'s ratio, "1.48x TRL's speed"."""
    return lambda: f"{read('results/benchmarks.json')[name]['ratio']:.2f}x {what}"


def points(path: str, column: str, turn: str, what: str) -> Callable[[], str]:
    """An inline figure: a paired difference in points at `turn`, "+18.8 points over base at turn 20"."""
    return lambda: f"{100 * read(path)['paired'][column][turn]['difference']:+.1f} points {what}"


def stress_hangs() -> str:
    """Hangs over every two-process test run of the teardown stress (benchmarks/stress_teardown.py)."""
    stress = read("results/stress_teardown.json")
    return f"{stress['hangs']} hangs in {len(stress['tests']) * len(stress['rounds'])} teardowns"


FIGURES: dict[str, Callable[[], str]] = {
    # seed 0's run (the committed one is a fresh clone's make demo, alone on its machine; seeds.md gives every seed's)
    "demo-minutes": lambda: (
        f"{read(DEMO_TIMINGS)['total_seconds'] / 60:.0f} minutes "
        f"({read(DEMO_TIMINGS)['total_seconds_at_reference_speed'] / 60:.0f} at the reference speed)"
    ),
    "test-minutes": lambda: f"{read('results/test_suite.json')['seconds'] / 60:.0f} minutes",
    "bench-attention": ratio("attention_vs_sdpa", "SDPA's speed"),
    "bench-teacher": ratio("teacher_vs_hf_generate_batched", "batched `generate()`"),
    "bench-train": ratio("train_vs_trl", "TRL's speed"),
    "bench-rollout": ratio("rollout_vs_hf_generate_batched", "batched `generate()`"),
    "gate-agreement": lambda: f"{pct(read('results/gate_agreement.json')['agreement'])} agreement with a reader",
    "embedded-size": lambda: f"{(ROOT / 'gatt/embedded_model/model.safetensors').stat().st_size / 1e6:.1f} MB",
    "smollm2-gain": points("results/smollm2-135m-full/report.json", "gatt-r2 - base", "20", "over base at turn 20"),
    "grpo-gain": points("results/grpo/smollm2-full/report.json", "gatt+grpo - gatt", "20", "over GAtt at turn 20"),
    "any-turn-late": lambda: (
        f"{pct(read('results/any-turn/report.json')['gatt-any']['per_kind']['late']['after']['19']['adherence'])}"
        " 19 turns after a late one"
    ),
    "ifbench-gatt": lambda: (
        f"{pct(read('results/smollm2-135m-ifeval/report.json')['gatt']['ifbench']['per_turn']['10']['prompt_strict'])}"
        " IFBench prompt_strict at turn 10"
    ),
    "split-softmax-10": lambda: (
        f"{pct(read('results/split-softmax/embedded/sweep.json')['models']['base+split@0.5']['train']['10'])}"
        " at turn 10"
    ),
    "stress-hangs": stress_hangs,
}

TABLES: dict[str, Callable[[], str]] = {
    "main-result": main_result,
    "embedded-strata": embedded_strata,
    "embedded-more": embedded_more,
    "smollm2": smollm2,
    "smollm2-rounds": smollm2_rounds,
    "grpo-smollm2": lambda: grpo("results/grpo/smollm2-full/report.json"),
    "grpo-embedded": lambda: grpo("results/grpo/embedded/report.json"),
    "any-turn": any_turn,
    "ifeval": ifeval,
    "split-softmax": split_softmax,
    "benchmarks": benchmarks,
    "calibration": calibration,
    **FIGURES,
}


def render(text: str, source: str = "the page") -> str:
    """`text` with every result block filled from its JSON; an unknown table name is an error naming it."""

    def fill(match: re.Match[str]) -> str:
        opening, name, _, closing = match.groups()
        if name not in TABLES:
            raise ValueError(f"{source}: unknown result {name!r} (known: {', '.join(TABLES)})")
        return opening + TABLES[name]() + closing

    return BLOCK.sub(fill, text)


def stale_blocks(text: str, source: str = "the page") -> list[str]:
    """The names of the blocks of `text` whose table differs from what its JSON renders."""
    fresh = {m.group(2): m.group(3) for m in BLOCK.finditer(render(text, source))}
    return [m.group(2) for m in BLOCK.finditer(text) if fresh[m.group(2)] != m.group(3)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs from its JSON")
    parser.add_argument("pages", nargs="*", default=list(PAGES), help="markdown files (default: %(default)s)")
    args = parser.parse_args(argv)
    stale = []
    for page in args.pages:
        path = ROOT / page if not Path(page).is_absolute() else Path(page)
        text = path.read_text(encoding="utf-8")
        if args.check:
            stale += [f"{page}: result {name!r} differs from its JSON" for name in stale_blocks(text, page)]
        elif (new := render(text, page)) != text:
            write_text(path, new)
            print(f"rewrote {page}")
    for line in stale:
        print(line, file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
