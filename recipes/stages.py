"""A recipe's stages, made the way `make` makes targets (recipes/demo.py runs its data, training and report so).

Each stage is a command and the folder it writes, and its settings: the YAML file its command reads (`--config
FILE`), written from the stage's `settings` before it runs. A stage whose fingerprint (its command, its settings,
the files they name, and the result of the stage before) matches its `.done` stamp is skipped; one interrupted
mid-way is resumed in place where it can be (its `.started` stamp names the attempt and counts its seconds, rewritten every few
seconds, so a run killed at any point still counts its time); any other is made again from an empty folder, and
every stage after it with it. `stage_timings` writes what each stage took, with the machine's calibration, so
wall times from two machines compare at a reference speed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from gatt.io.files import write_text
from gatt.io.machine import REFERENCE_WORK_SECONDS, matmul_gflops, seconds_at_reference, work_seconds
from gatt.io.processes import ProcessTree

HEARTBEAT_SECONDS = 10.0  # how often a running stage's `.started` stamp is rewritten


@dataclass(frozen=True)
class Stage:
    name: str
    command: list[str]
    output: Path  # emptied when the stage's inputs change
    resumable: bool  # an interrupted run continues in place
    # A sub-folder of `output` kept when the stage starts again with other inputs: its files carry fingerprints of
    # their own inputs (the report's finished columns, gatt/eval/cache.py), so only the stale ones are made again.
    keep: str | None = None
    config: Path | None = None  # the YAML file the command reads its settings from, written from `settings`
    settings: Mapping[str, Any] | None = None  # YAML values (gatt.io.config.yaml_values)

    def write_config(self) -> None:
        """Write `settings` to `config`, the file the command names."""
        if self.config is not None:
            write_text(self.config, yaml.safe_dump(dict(self.settings or {}), sort_keys=False, allow_unicode=True))


def _strings(value: Any) -> list[str]:
    """Every string in `value` (a YAML tree)."""
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def clear(output: Path, keep: str | None) -> None:
    """Remove `output`, all but its sub-folder `keep` (None: all of it)."""
    if keep is None or not (output / keep).is_dir():
        shutil.rmtree(output)
        return
    for path in output.iterdir():
        if path.name == keep:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def run_stage(
    command: list[str],
    env: Mapping[str, str],
    started: Path,
    key: str,
    before: float,
    every: float = HEARTBEAT_SECONDS,
    timeout_s: float = 0.0,
    cwd: Path | None = None,
) -> tuple[int, float]:
    """Run a stage's command (in `cwd`); its exit code and seconds, `before` (its interrupted attempts' seconds)
    included.

    `started` holds "KEY SECONDS" from the start, rewritten every `every` seconds and at the end, so that a
    run killed at any point (Ctrl-C, a closed session, a lost machine) still counts its time when resumed.
    A stage still running after `timeout_s` (0: no limit) is killed with every process it started, and
    `TreeTimeout` names the processes that were stuck (a launcher's ranks by their rank)."""
    begin = time.perf_counter()

    def mark() -> float:
        seconds = round(before + time.perf_counter() - begin, 1)
        write_text(started, f"{key} {seconds}")  # whole: a kill mid-write leaves the last mark, never an empty stamp
        return seconds

    mark()
    # A process tree: interrupted here, the stage ends with every process it started (a launcher's ranks too).
    with ProcessTree(command, None, cwd=cwd, env=dict(env)) as tree:
        try:
            while True:
                try:
                    returncode = tree.process.wait(timeout=every)
                    break
                except subprocess.TimeoutExpired:
                    mark()
                    if timeout_s and time.perf_counter() - begin > timeout_s:
                        raise tree.time_out(timeout_s) from None
        finally:
            seconds = mark()
    return returncode, seconds


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a setting that is no path (too long a name, say)
        return False


def fingerprint(stage: Stage, upstream: str, root: Path) -> str:
    """What a stage's result depends on: its command, the files it and its settings name relative to `root` (its
    settings' YAML, your constraints and user turns), and the result before (`upstream`: that stage's key and when it
    finished). The Python that runs it is not an input: stages made on another machine (a GPU's run copied here, say)
    are up to date here."""
    named = [arg for arg in [*stage.command, *_strings(stage.settings)] if arg != str(stage.config)]
    files = [root / arg for arg in named if _is_file(root / arg) and not arg.endswith(".py")]
    command = ["python" if arg == sys.executable else arg for arg in stage.command]
    hashes = [hashlib.sha256(p.read_bytes()).hexdigest() for p in files]
    payload = json.dumps([command, stage.settings, hashes, upstream], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def run_stages(
    plan: Sequence[Stage],
    stamps: Path,
    upstream: str,
    env: Mapping[str, str],
    *,
    root: Path,
    timeout_s: float = 0.0,
) -> tuple[dict[str, float], list[str]]:
    """Make (or skip) each stage of `plan` in order, its commands run in `root`; the seconds each took when it was
    made (now, or by an earlier run) and the names of those skipped. `upstream` is what the first stage's result
    depends on besides its own fingerprint (the weights it starts from, say). A stage that fails exits the recipe
    with its name: the same command resumes it."""
    stamps.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    skipped: list[str] = []
    for i, stage in enumerate(plan, start=1):
        stage.write_config()
        key = fingerprint(stage, upstream, root)
        done, started = stamps / f"{stage.name}.done", stamps / f"{stage.name}.started"
        stamp = done.read_text() if done.exists() else ""  # "KEY FINISHED_NS SECONDS" of the last run
        fields = stamp.split()
        if fields and fields[0] == key:
            print(f"[{i}/{len(plan)} {stage.name}] up to date, skipped", flush=True)
            timings[stage.name] = float(fields[2]) if len(fields) > 2 else 0.0
            skipped.append(stage.name)
            upstream = " ".join(fields[:2])  # the result's identity; the seconds are bookkeeping
            continue
        done.unlink(missing_ok=True)
        earlier = started.read_text().split() if started.exists() else []  # "KEY SECONDS" of interrupted attempts
        interrupted = earlier[:1] == [key]
        if stage.output.exists() and not (interrupted and stage.resumable):
            clear(stage.output, stage.keep)  # stale: made with other inputs (or not resumable)
        print(
            f"[{i}/{len(plan)} {stage.name}] {'resuming' if interrupted else 'running'}: {' '.join(stage.command)}",
            flush=True,
        )
        before = float(earlier[1]) if interrupted and stage.resumable and len(earlier) > 1 else 0.0
        returncode, timings[stage.name] = run_stage(
            stage.command, env, started, key, before, timeout_s=timeout_s, cwd=root
        )
        if returncode != 0:
            sys.exit(f"[{i}/{len(plan)} {stage.name}] failed (exit {returncode}); rerun the same command to resume")
        upstream = f"{key} {time.time_ns()}"  # a new result: every later stage runs again on it
        write_text(done, f"{upstream} {timings[stage.name]}")
        started.unlink()
        print(f"[{i}/{len(plan)} {stage.name}] done in {timings[stage.name]:.0f} s", flush=True)
    return timings, skipped


def stage_timings(
    timings: dict[str, float], skipped: list[str], calibration: dict[str, Any], path: Path
) -> dict[str, Any]:
    """Write `path` (timings.json): each stage's seconds, their total and that total at the reference speed, with
    the machine's `calibration` (read at the start). When every stage was skipped, the calibration is the one of
    the run that made them (read from `path`). When some ran, it is read again now and the faster reading counts:
    one taken while something else held the cores is slow and would flatter the time at the reference speed (both
    readings are recorded). The time at the reference converts by the project's own kind of work
    (`seconds_at_reference`); the matmul reading is recorded beside it."""
    earlier = json.loads(path.read_text()).get("machine", {}) if path.exists() else {}
    if len(skipped) == len(timings) and "work_seconds" in earlier:
        calibration = earlier
    else:
        threads = calibration["threads"]
        works = [calibration["work_seconds"], work_seconds(threads)]
        readings = [calibration["fp32_matmul_gflops"], matmul_gflops(torch.float32, threads=threads)]
        calibration = {
            **calibration,
            "work_seconds": min(works),
            "work_seconds_start_end": works,
            "fp32_matmul_gflops": max(readings),
            "fp32_matmul_gflops_start_end": readings,
        }
    total = sum(timings.values())
    summary = {
        "stage_seconds": timings,
        "total_seconds": round(total, 1),
        "total_seconds_at_reference_speed": seconds_at_reference(total, calibration),
        "reference_work_seconds": REFERENCE_WORK_SECONDS,
        "made_by_an_earlier_run": skipped,
        "machine": calibration,
    }
    write_text(path, json.dumps(summary, indent=2) + "\n")
    return summary
