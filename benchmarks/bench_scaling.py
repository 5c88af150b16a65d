"""Throughput of each stage at 1 and N processes on this machine: GAtt synthesis, the GAtt fine-tune and the
evaluation, on a demo run's trained models (`make demo`, `make demo-smollm2`; its first GAtt round's).

Each stage runs as a user runs it, the same work at every process count:
- 1 process: `python -m data_gen gatt ...`, `python recipes/train_gatt.py ...`, `python -m gatt.eval.evaluate ...`
  (torch's default thread count: every core);
- N processes: `torchrun --standalone --nproc_per_node N` with the same arguments (torchrun gives each
  process OMP_NUM_THREADS=1; gloo on CPU; on a GPU machine each process takes its own GPU).

A stage's time is its command's wall time, start-up and model loading included. Its work is sized so the
processes have equal shares: synthesis 2 x max(N) shards of dialogues (each a teacher batch), evaluation
2 x max(N) rollout batches, training global batches split N ways (DDP). The throughputs:
- synthesis: dialogues/s and teacher candidates/s (the summary's `candidates`);
- training: records/s (optimizer steps x global batch / s) and supervised tokens/s;
- evaluation: replies/s (every turn of every transcript).
Printed as a table with the speed-up over 1 process, and written to OUT/scaling.json and scaling.md with
the machine's calibration (`gatt.io.machine`).

  python benchmarks/bench_scaling.py --demo runs/demo --out results/scaling/embedded [--processes 1 2] [--quick]
  python benchmarks/bench_scaling.py --demo runs/smollm2 --out results/scaling/smollm2-135m --size max_turns=6 ...
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
# The demo run's first GAtt round (`recipes/demo.py` lays each round out as round-R/{data/gatt,gatt}).
GATT = Path("round-1") / "gatt"

from gatt.io.files import write_text  # noqa: E402
from gatt.io.machine import machine_calibration  # noqa: E402
from gatt.io.processes import run as run_tree  # noqa: E402

FULL = {"dialogues_per_shard": 24, "max_turns": 30, "train_steps": 40, "eval_dialogues": 24, "eval_turns": 30}
QUICK = {"dialogues_per_shard": 4, "max_turns": 6, "train_steps": 4, "eval_dialogues": 4, "eval_turns": 6}


def launcher(processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]


def timed(command: list[str], log: Path, timeout_s: float) -> float:
    """Run `command` (from the repository root), its output to `log`; its wall time in seconds.

    A command still running after `timeout_s` is killed with all its processes (a launcher's ranks too, though
    torchrun puts each in a session of its own) and raises, naming the stuck ranks: a distributed job whose ranks
    wait on one another forever fails instead of hanging the benchmark."""
    begin = time.perf_counter()
    returncode = run_tree(command, log, timeout_s, cwd=ROOT).returncode
    seconds = time.perf_counter() - begin
    if returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {returncode}); see {log}")
    return seconds


def synthesis(
    demo: Path, work: Path, processes: int, shares: int, sizes: dict[str, int], extra: list[str], timeout_s: float
) -> dict[str, Any]:
    """The demo's GAtt-data stage (its base model, the one its GAtt fine-tune started from, as teacher; k=2, 48
    tokens) on `shares` shards."""
    shard = sizes["dialogues_per_shard"]
    dialogues = shares * shard
    out = work / f"synthesis-{processes}"
    seconds = timed(
        [
            *launcher(processes),
            "-m",
            "data_gen",
            "gatt",
            "--teacher",
            yaml.safe_load((demo / GATT / "config.yaml").read_text())["model"],
            "--num-dialogues",
            str(dialogues),
            "--min-turns",
            "2",
            "--max-turns",
            str(sizes["max_turns"]),
            "--samples-per-turn",
            "2",
            "--max-new-tokens",
            "48",
            "--batch-size",
            str(shard),
            "--shard-size",
            str(shard),
            "--seed",
            "0",
            *extra,
            "--out",
            str(out),
        ],
        work / f"synthesis-{processes}.log",
        timeout_s,
    )
    summary = json.loads((out / "gatt.summary.json").read_text())
    return {
        "seconds": round(seconds, 1),
        "dialogues": dialogues,
        "candidates": summary["candidates"],
        "dialogues_per_s": round(dialogues / seconds, 3),
        "candidates_per_s": round(summary["candidates"] / seconds, 2),
    }


def training(demo: Path, work: Path, processes: int, sizes: dict[str, int], timeout_s: float) -> dict[str, Any]:
    """The demo's GAtt fine-tune (its saved config: batch 16, base records replayed) for a few steps."""
    out = work / f"training-{processes}"
    steps = sizes["train_steps"]
    seconds = timed(
        [
            *launcher(processes),
            str(ROOT / "recipes" / "train_gatt.py"),
            "--config",
            str(demo / GATT / "config.yaml"),
            f"output_dir={out}",
            f"max_steps={steps}",
            "save_every=0",
            "eval_every=0",
            "log_every=1",
            "warmup_steps=0",
        ],
        work / f"training-{processes}.log",
        timeout_s,
    )
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = steps * yaml.safe_load((demo / GATT / "config.yaml").read_text())["batch_size"]
    tokens = sum(m["supervised_tokens"] for m in metrics if "supervised_tokens" in m)
    return {
        "seconds": round(seconds, 1),
        "steps": steps,
        "records": records,
        "records_per_s": round(records / seconds, 2),
        "supervised_tokens_per_s": round(tokens / seconds, 1),
    }


def evaluation(
    demo: Path, work: Path, processes: int, shares: int, sizes: dict[str, int], extra: list[str], timeout_s: float
) -> dict[str, Any]:
    """The demo's report stage on its GAtt model: `shares` rollout batches of 30-turn dialogues."""
    out = work / f"evaluation-{processes}"
    dialogues = shares * sizes["eval_dialogues"]
    seconds = timed(
        [
            *launcher(processes),
            "-m",
            "gatt.eval.evaluate",
            "--model",
            f"gatt={demo / GATT / 'final'}",
            "--turns",
            str(sizes["eval_turns"]),
            "--dialogues",
            str(dialogues),
            "--no-instruction-dialogues",
            "0",
            "--batch-size",
            str(sizes["eval_dialogues"]),
            "--max-new-tokens",
            "48",
            "--seed",
            "0",
            *extra,
            "--out",
            str(out),
        ],
        work / f"evaluation-{processes}.log",
        timeout_s,
    )
    replies = sum(len(json.loads(line)["turns"]) for line in (out / "transcripts.jsonl").read_text().splitlines())
    return {"seconds": round(seconds, 1), "replies": replies, "replies_per_s": round(replies / seconds, 2)}


HEADLINE = {"synthesis": "dialogues_per_s", "training": "records_per_s", "evaluation": "replies_per_s"}


def markdown(result: dict[str, Any]) -> str:
    counts = result["processes"]
    lines = [
        "| stage | " + " | ".join(f"{p} process{'es' * (p > 1)}" for p in counts) + " | speed-up |",
        "|---" * (len(counts) + 2) + "|",
    ]
    for stage, key in HEADLINE.items():
        runs = result["stages"][stage]
        cells = [f"{runs[str(p)][key]} {key.replace('_per_s', '/s')} ({runs[str(p)]['seconds']} s)" for p in counts]
        speedup = runs[str(counts[-1])][key] / runs[str(counts[0])][key]
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {speedup:.2f}x |")
    machine = result["machine"]
    lines.append(
        f"\n{machine['cpu']}, {machine['threads']} CPUs, {machine['fp32_matmul_gflops']} GFLOP/s fp32 matmul, "
        f"torch {machine['torch']}; models of {result['demo']}, sizes {result['sizes']}"
        + (f", `{result['stage_args']}`" if result["stage_args"] else "")
        + "."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--demo", type=Path, default=ROOT / "runs" / "demo", help="a `make demo` output folder (its models)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "scaling", help="where scaling.json/md go")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="process counts to compare")
    parser.add_argument(
        "--work",
        type=Path,
        default=ROOT / "runs" / "bench-scaling",
        help="scratch folder for the stages' outputs and logs (emptied first)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the wiring in about a minute")
    parser.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="KEY=N",
        help=f"override a size ({', '.join(FULL)}), e.g. max_turns=6 for a slow teacher",
    )
    parser.add_argument(
        "--stage-args",
        default="",
        metavar="'ARGS'",
        help="more arguments for the synthesis and evaluation commands, e.g. "
        "'--constraints recipes/data/smollm2_constraints.yaml --repetition-penalty 1.2'",
    )
    parser.add_argument(
        "--stage-timeout",
        type=float,
        default=4 * 3600,
        metavar="SECONDS",
        help="kill a stage command still running after this long and fail (default: 4 hours)",
    )
    args = parser.parse_args(argv)
    for needed in (f"{GATT}/final", f"{GATT}/config.yaml"):
        if not (args.demo / needed).exists():
            raise SystemExit(f"error: {args.demo / needed} not found: run `make demo` (or pass --demo DIR)")
    sizes = dict(QUICK if args.quick else FULL)
    for override in args.size:
        key, _, value = override.partition("=")
        if key not in sizes or not value.isdigit():
            raise SystemExit(f"error: --size {override}: expected KEY=N with KEY one of {', '.join(sizes)}")
        sizes[key] = int(value)
    extra = shlex.split(args.stage_args)
    work = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    stages: dict[str, dict[str, Any]] = {stage: {} for stage in HEADLINE}
    shares = 2 * max(args.processes)  # shards, rollout batches: the same work, an equal share for each process
    for processes in args.processes:
        print(f"== {processes} process(es)", flush=True)
        stages["synthesis"][str(processes)] = synthesis(
            args.demo, work, processes, shares, sizes, extra, args.stage_timeout
        )
        stages["training"][str(processes)] = training(args.demo, work, processes, sizes, args.stage_timeout)
        stages["evaluation"][str(processes)] = evaluation(
            args.demo, work, processes, shares, sizes, extra, args.stage_timeout
        )
        for stage in HEADLINE:
            print(f"   {stage}: {stages[stage][str(processes)]}", flush=True)
    result = {
        "demo": str(args.demo),
        "processes": args.processes,
        "sizes": sizes,
        "stage_args": args.stage_args,
        "machine": machine_calibration(),
        "stages": stages,
    }
    for name, text in (("scaling.json", json.dumps(result, indent=2) + "\n"), ("scaling.md", markdown(result))):
        write_text(args.out / name, text)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
