"""The main job end to end on the embedded default: base model -> GAtt data -> GAtt fine-tune -> report.

  python recipes/demo.py --config recipes/configs/demo.yaml [key=value ...]

Stages, each the project's own command run as a subprocess (the same commands work by hand):
  1. base-data   python -m data_gen base                 the toy world's SFT corpus
  2. base-model  recipes/train_gatt.py (base config)     the embedded chat model, from scratch
  3. gatt-data   python -m data_gen gatt --teacher BASE  context distillation with rejection sampling
  4. gatt-model  recipes/train_gatt.py (GAtt config)     the GAtt fine-tune of the base model
  5. report      python -m gatt.evaluate                 base, gatt and the base+repeat upper bound
A stage whose inputs (its command, and the stages before it) are unchanged since it finished is
skipped; an interrupted stage resumes (data shards, training checkpoints); a stage whose inputs
changed starts again from an empty output folder. Writes OUT/timings.json and prints the table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatt.eval.report import format_table
from gatt.train import dataclass_from_dict, read_yaml_config

ROOT = Path(__file__).resolve().parents[1]
# `accelerate launch` gives each process OMP_NUM_THREADS=1 unless it is set: on a CPU that halves training speed.
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
ENV = {"OMP_NUM_THREADS": str(CPUS), **os.environ, "PYTHONUNBUFFERED": "1"}


@dataclass
class DemoConfig:
    out: str = "runs/demo"
    seed: int = 0
    base_dialogues: int = 20000
    base_config: str = "recipes/configs/base_tiny.yaml"
    base_overrides: list[str] = field(default_factory=list)  # key=value for the base training config
    teacher: str = "base"  # "base": the base model writes the GAtt data (context distillation); or "oracle"
    gatt_dialogues: int = 1500
    gatt_min_turns: int = 2
    gatt_max_turns: int = 24
    samples_per_turn: int = 2
    teacher_max_new_tokens: int = 48
    teacher_batch_size: int = 64  # dialogues per teacher batch, and per resumable shard
    gatt_config: str = "recipes/configs/gatt_tiny.yaml"
    gatt_overrides: list[str] = field(default_factory=list)
    eval_turns: int = 30
    eval_dialogues: int = 64
    eval_max_new_tokens: int = 48
    eval_batch_size: int = 32  # dialogues rolled out together
    launcher: str = "accelerate"  # "accelerate" (accelerate launch) or "python"


@dataclass(frozen=True)
class Stage:
    name: str
    command: list[str]
    output: Path  # emptied when the stage's inputs change
    resumable: bool  # an interrupted run continues in place


def stages(config: DemoConfig) -> list[Stage]:
    if config.teacher not in ("base", "oracle") or config.launcher not in ("accelerate", "python"):
        raise ValueError(f"teacher must be 'base' or 'oracle' and launcher 'accelerate' or 'python', got "
                         f"{config.teacher!r}, {config.launcher!r}")
    out = Path(config.out)
    data, base, gatt, report = out / "data", out / "base", out / "gatt", out / "report"
    python = [sys.executable]
    train = ([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no"] if config.launcher == "accelerate"
             else python) + [str(ROOT / "recipes" / "train_gatt.py")]
    return [
        Stage("base-data", [*python, "-m", "data_gen", "base", "--num-dialogues", str(config.base_dialogues),
                            "--seed", str(config.seed), "--out", str(data / "base")], data / "base", False),
        Stage("base-model", [*train, "--config", config.base_config, f"train_file={data / 'base' / 'base.jsonl'}",
                             f"output_dir={base}", f"seed={config.seed}", *config.base_overrides, "--resume"], base, True),
        Stage("gatt-data", [*python, "-m", "data_gen", "gatt", "--teacher", "oracle" if config.teacher == "oracle" else str(base / "final"),
                            "--num-dialogues", str(config.gatt_dialogues), "--min-turns", str(config.gatt_min_turns),
                            "--max-turns", str(config.gatt_max_turns), "--samples-per-turn", str(config.samples_per_turn),
                            "--max-new-tokens", str(config.teacher_max_new_tokens),
                            "--batch-size", str(config.teacher_batch_size), "--shard-size", str(config.teacher_batch_size),
                            "--seed", str(config.seed), "--out", str(data / "gatt")],
              data / "gatt", True),
        Stage("gatt-model", [*train, "--config", config.gatt_config, f"model={base / 'final'}",
                             f"train_file={data / 'gatt' / 'gatt.jsonl'}", f"replay_file={data / 'base' / 'base.jsonl'}",
                             f"output_dir={gatt}", f"seed={config.seed}",
                             *config.gatt_overrides, "--resume"], gatt, True),
        Stage("report", [*python, "-m", "gatt.evaluate", "--model", f"base={base / 'final'}", "--model",
                         f"gatt={gatt / 'final'}", "--turns", str(config.eval_turns), "--dialogues",
                         str(config.eval_dialogues), "--max-new-tokens", str(config.eval_max_new_tokens),
                         "--batch-size", str(config.eval_batch_size),
                         "--seed", str(config.seed), "--out", str(report), "--repeat-instruction", "base"], report, False),
    ]


def fingerprint(stage: Stage, upstream: str) -> str:
    """What a stage's result depends on: its command, the files it names that are configs, and the result before
    (`upstream`: that stage's key and when it finished)."""
    configs = [ROOT / arg for arg in stage.command if arg.endswith(".yaml") and (ROOT / arg).is_file()]
    payload = json.dumps([stage.command, [p.read_text() for p in configs], upstream])
    return hashlib.sha256(payload.encode()).hexdigest()


def run(config: DemoConfig) -> dict[str, Any]:
    out = Path(config.out)
    stamps = out / "stamps"
    stamps.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    upstream = ""
    for i, stage in enumerate(stages(config), start=1):
        key = fingerprint(stage, upstream)
        done, started = stamps / f"{stage.name}.done", stamps / f"{stage.name}.started"
        stamp = done.read_text() if done.exists() else ""  # "KEY FINISHED_NS" of the last run
        if stamp.partition(" ")[0] == key:
            print(f"[{i}/5 {stage.name}] up to date, skipped", flush=True)
            timings[stage.name] = 0.0
            upstream = stamp
            continue
        done.unlink(missing_ok=True)
        interrupted = started.exists() and started.read_text() == key
        if stage.output.exists() and not (interrupted and stage.resumable):
            shutil.rmtree(stage.output)  # stale: made with other inputs (or not resumable)
        started.write_text(key)
        print(f"[{i}/5 {stage.name}] {'resuming' if interrupted else 'running'}: {' '.join(stage.command)}", flush=True)
        begin = time.perf_counter()
        result = subprocess.run(stage.command, cwd=ROOT, env=ENV)
        if result.returncode != 0:
            sys.exit(f"[{i}/5 {stage.name}] failed (exit {result.returncode}); rerun the same command to resume")
        timings[stage.name] = round(time.perf_counter() - begin, 1)
        upstream = f"{key} {time.time_ns()}"  # a new result: every later stage runs again on it
        done.write_text(upstream)
        started.unlink()
        print(f"[{i}/5 {stage.name}] done in {timings[stage.name]:.0f} s", flush=True)
    report = json.loads((out / "report" / "report.json").read_text())
    summary = {"stage_seconds": timings, "total_seconds": round(sum(timings.values()), 1)}
    (out / "timings.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n" + format_table(report))
    print("stage times: " + ", ".join(f"{name} {s:.0f} s" for name, s in timings.items()) +
          f"; total {summary['total_seconds']:.0f} s")
    print(f"report: {out / 'report' / 'report.md'}")
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "recipes" / "configs" / "demo.yaml"),
                        help="YAML mirroring DemoConfig (default: recipes/configs/demo.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config key (value read as YAML)")
    args = parser.parse_args(argv)
    try:
        config = dataclass_from_dict(DemoConfig, read_yaml_config(args.config, args.overrides), args.config)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    return run(config)


if __name__ == "__main__":
    main()
