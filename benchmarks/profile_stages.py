"""A py-spy profile of a demo run, as each stage's time split by what it was doing.

  py-spy record -r 5 --subprocesses -f raw -o PROFILE.raw -- python recipes/demo.py --config CONFIG.yaml
  python benchmarks/profile_stages.py PROFILE.raw [--json OUT.json]

py-spy samples every process's Python stack (5 a second here); `--subprocesses` follows the stages the
demo starts, and each sample names its process's command line, so a sample belongs to the stage whose
command it is. Within a stage a sample counts for the first category below whose frames it holds (the
order matters: a relevance-scorer forward pass is the scorer's, not "model forward").
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from gatt.io.cli import exit_on_bad_input  # noqa: E402
from gatt.io.files import write_json  # noqa: E402

# The stage a process runs, by its command line: recipes/demo.py runs each stage on OUT/configs/STAGE.yaml.
STAGE_CONFIG = re.compile(r"--config \S*/configs/([\w-]+)\.yaml\b")

ATTENTION = ("_explicit_attention (", "_fast_attention (", "split_softmax_attention (")
# What a sample was doing: the first category with a pattern its stack holds; a pattern is a frame substring,
# or a tuple of substrings the stack must all hold.
CATEGORIES: list[tuple[str, tuple[str | tuple[str, ...], ...]]] = [
    ("imports and start-up", ("_find_and_load (",)),
    ("model loading", ("from_pretrained (", "save_pretrained (")),
    ("relevance scorer (its forward passes)", ("RelevanceScorer.",)),
    ("sampling (penalties, top-p)", ("Sampler.__call__ (",)),
    ("attention probe (shares of the marked keys)", ("marked_shares (",)),
    ("prefill of each new turn", ("ChatBatch._prefill (",)),
    ("decode steps: attention over the KV cache", tuple(("ChatBatch._decode (", a) for a in ATTENTION)),
    ("decode steps: the rest (linear layers, norms, LM head)", ("ChatBatch._decode (",)),
    ("backward (autograd)", ("backward (", "_engine_run_backward (")),
    ("optimizer", ("torch/optim/",)),
    ("checks (language detector)", ("gatt/data/checks.py", "lingua/")),
    ("answer gate", ("gatt/eval/gate.py", "gatt/eval/judge.py")),
    (
        "tokenizer and chat template",
        ("apply_chat_template (", "tokenization_utils", "tokenizers/", "render (gatt/eval"),
    ),
    ("collator and packing", ("gatt/data/collator.py",)),
    ("training forward", ("Trainer.train_step (",)),
    ("report and plots", ("gatt/eval/report.py", "matplotlib/")),
]
OTHER = "other Python"
RECORD = re.compile(r"(process \d+:.*?) (\d+)\n(?=process \d+:|\Z)", flags=re.S)
PROCESS = re.compile(r'process \d+:"(.*?)";', flags=re.S)


def stage_of(stack: str) -> str:
    """The stage of the innermost process in the stack (a stage's subprocesses count for it), named as the demo
    names it (gatt-data-2: round 2's GAtt data)."""
    for command in reversed(PROCESS.findall(stack + ";")):
        if re.search(r"recipes/demo\.py", command):
            return "demo.py itself"
        if re.search(r"-m gatt\.(model\.)?pretrained\b", command):
            return "base-model"  # smollm2: the model exported from its GGUF
        if found := STAGE_CONFIG.search(command):
            return found.group(1)
    return "unknown"


def category_of(stack: str) -> str:
    frames = PROCESS.sub("", stack + ";")
    for name, patterns in CATEGORIES:
        for pattern in patterns:
            if all(part in frames for part in ((pattern,) if isinstance(pattern, str) else pattern)):
                return name
    return OTHER


def profile(raw: str, rate: float) -> dict[str, Any]:
    """{stage: {sampled_seconds, share: {category: fraction}}} from py-spy's raw output sampled at `rate` Hz."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for stack, count in RECORD.findall(raw):
        counts[stage_of(stack)][category_of(stack)] += int(count)
    if not counts:
        raise ValueError("no samples found: expected py-spy's raw output (py-spy record --subprocesses -f raw)")
    stages = {}
    for stage, by_category in counts.items():
        total = sum(by_category.values())
        stages[stage] = {
            "sampled_seconds": round(total / rate),
            "share": {c: round(n / total, 3) for c, n in by_category.most_common()},
        }
    return {
        "tool": f"py-spy record -r {rate:g} --subprocesses -f raw ({rate:g} samples/s of each process's Python stack)",
        "stages": stages,
    }


def markdown(result: dict[str, Any], stages: list[str]) -> str:
    """A table: one column per stage, the categories as rows (shares of that stage's sampled time)."""
    categories = list(dict.fromkeys(c for s in stages for c in result["stages"][s]["share"]))
    lines = [
        "| where the time goes | "
        + " | ".join(f"{s} ({result['stages'][s]['sampled_seconds']} s)" for s in stages)
        + " |",
        "|---|" + "---:|" * len(stages),
    ]
    for category in categories:
        cells = [f"{result['stages'][s]['share'].get(category, 0):.0%}" for s in stages]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/profile_stages.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("raw", type=Path, help="py-spy's raw output (record --subprocesses -f raw)")
    parser.add_argument("--rate", type=float, default=5.0, help="the sampling rate it was recorded at (-r; default 5)")
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="write the shares here")
    parser.add_argument("--markdown", nargs="+", metavar="STAGE", help="print a README table of these stages")
    args = parser.parse_args(argv)
    with exit_on_bad_input():
        result = profile(args.raw.read_text(errors="replace"), args.rate)
        if args.json:
            write_json(args.json, result)
        if args.markdown:
            unknown = [s for s in args.markdown if s not in result["stages"]]
            if unknown:
                raise ValueError(
                    f"--markdown: no samples of {', '.join(unknown)}; stages: {', '.join(result['stages'])}"
                )
            print(markdown(result, args.markdown), end="")
        else:
            print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
