"""The main job end to end: chat model -> GAtt data -> GAtt fine-tune -> report; and `make base-model`.

  python recipes/demo.py --config recipes/configs/demo.yaml [key=value ...]          (make demo)
  python recipes/demo.py --config recipes/configs/base_model.yaml                    (make base-model)
  python recipes/demo.py --config recipes/configs/demo_smollm2.yaml [key=value ...]  (make demo-smollm2)
  python recipes/demo.py --config recipes/configs/grpo_smollm2.yaml                  (make grpo-smollm2)
  python recipes/demo.py --config recipes/configs/grpo_smollm2_full.yaml             (make grpo-smollm2-full)
  gatt-demo --config recipes/configs/demo.yaml [key=value ...]                       (the same: the installed command)

The config holds the demo's own keys (DemoConfig) and one section per stage: the settings of the command that runs
it, its flags' names with underscores (`data.gatt.max_turns=10` overrides one); a data or train section may name a
YAML file of those settings first (`config: FILE`, relative to the checkout; its other keys over it). Each stage runs its command on
OUT/configs/STAGE.yaml, written from its section and what the demo decides (where data and models are, the seed,
the teacher); `seed`, `constraints`, `user_turns` and `heldout_families` go to every section that takes them.
  data.base    python -m data_gen base     embedded: the toy world's SFT corpus, replayed in the fine-tune
  data.gatt    python -m data_gen gatt     context distillation with rejection sampling, the base model teaching
  data.replay  python -m data_gen replay   smollm2: its own instruction-free answers (over data.gatt's settings)
  train.base   recipes/train_gatt.py       rebuild_base: the chat model from scratch
  train.gatt   recipes/train_gatt.py       the GAtt fine-tune, the base corpus (or the replay data) replayed
  train.grpo   recipes/grpo_gatt.py        optional: RL on the checks (TRL's GRPO) from the GAtt model: gatt+grpo
  eval         python -m gatt.eval.evaluate     base, gatt and the base+repeat upper bound
GAtt starts from the chat model shipped in the package (gatt/model/embedded.py), or with `rebuild_base: true` (make demo
BASE=rebuild) from one trained first; `rounds: 0` with it is make base-model (its report and OUT/embedded, the
model packaged with its record). With `rounds: N` > 1 GAtt is iterated (expert iteration): round r+1's teacher is
round r's model, reminded (OUT/round-R/). On SmolLM2-135M-Instruct (`base_model: smollm2`) the model is its own
teacher. `any_turn: {data: {...}, train: {...}}` adds `gatt-any`, trained on GAtt data of every dialogue kind
(gatt/data/events.py), its sections over data.gatt's and train.gatt's. Stages skip when their inputs are unchanged and
resume when interrupted (recipes/stages.py); OUT/timings.json holds their seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch

from data_gen.__main__ import command_keys
from data_gen.constraints import tier_violations
from gatt.data.events import KINDS
from gatt.eval.eval_config import EvalConfig
from gatt.eval.report import add_rounds, summary_tables
from gatt.io.cli import exit_on_bad_input
from gatt.io.config import config_keys, read_yaml_config, yaml_values
from gatt.io.machine import available_cpus, machine_calibration
from gatt.model.embedded import FOLDER as EMBEDDED_FOLDER
from gatt.model.embedded import weights_sha256
from gatt.model.numerics import resolve_auto
from gatt.training.grpo import PROMPTS, GRPOGattConfig
from recipes.base_model import package_base_model
from recipes.demo_config import (
    ROOT,
    SECTIONS,
    DemoConfig,
    Section,
    eval_dialogues,
    heldout_tiers,
    inputs,
    load_config,
    section,
    validate,
)
from recipes.rounds import gatt_data_dir, gatt_dir, round_entries, round_suffix, student_name
from recipes.stages import Stage, run_stages, stage_timings

CPUS = available_cpus()  # `accelerate launch` gives each process OMP_NUM_THREADS=1 unless set: half speed on a CPU


def stages(config: DemoConfig) -> list[Stage]:
    """The stages of `config` (two per GAtt round), each a command, the settings it reads and its output folder."""
    validate(config)
    out, python = Path(config.out), [sys.executable]
    base_data, replay = out / "data" / "base", out / "data" / "replay"
    replay_file = replay / "replay.jsonl" if config.base_model == "smollm2" else base_data / "base.jsonl"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = resolve_auto(config.mixed_precision, device, "bf16", "no", "mixed_precision")
    launch = ["-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1"]
    launch += ["--mixed_precision", precision, "--dynamo_backend", "no"]
    train_launch = [*python, *(launch if config.launcher == "accelerate" else [])]
    gatt = section(config, "data.gatt")
    gatt = {**({"shard_size": gatt["batch_size"]} if "batch_size" in gatt else {}), **gatt}  # a shard: one batch

    def stage(name: str, command: list[str], settings: Section, output: Path, resumable: bool = True) -> Stage:
        # Folders whose files fingerprint their own inputs, kept when the stage starts again with other inputs: the
        # report's finished columns (gatt/eval/cache.py) and GRPO's prompts (gatt/training/grpo.py make_prompts).
        file, keep = out / "configs" / f"{name}.yaml", {"report": "rollouts", "grpo-model": PROMPTS}.get(name)
        return Stage(name, [*command, "--config", str(file)], output, resumable, keep, file, yaml_values(settings))

    def data(name: str, subcommand: str, settings: Section, folder: Path, teacher: str | None) -> Stage:
        shared = inputs(config, command_keys(subcommand))
        settings = {**shared, **settings, **({"teacher": teacher} if teacher else {}), "out": folder}
        return stage(name, [*python, "-m", "data_gen", subcommand], settings, folder, subcommand != "base")

    def train(name: str, settings: Section, files: dict[str, Any], folder: Path, script: str = "train_gatt") -> Stage:
        settings = dict(settings)
        base = read_yaml_config(ROOT / settings.pop("config")) if "config" in settings else {}
        command = [*train_launch, str(ROOT / "recipes" / f"{script}.py"), "--resume"]
        return stage(name, command, {**base, **settings, **files, "output_dir": folder}, folder)

    def gatt_model(name: str, settings: Section, start: Path, data_files: list[str], folder: Path) -> Stage:
        files = {"model": start, "train_file": data_files[0] if len(data_files) == 1 else data_files}
        return train(name, settings, {**files, "replay_file": replay_file, "seed": config.seed}, folder)

    plan: list[Stage] = []
    if config.base_model == "smollm2":
        base_cmd = [*python, "-m", "gatt.model.pretrained", "--out", str(out / "base" / "final")]
        plan.append(Stage("base-model", base_cmd, out / "base", False))
    else:
        plan.append(data("base-data", "base", section(config, "data.base"), base_data, None))
        if config.rebuild_base:
            files = {"train_file": base_data / "base.jsonl", "seed": config.seed}
            plan.append(train("base-model", section(config, "train.base"), files, out / "base"))
    for r in range(1, config.rounds + 1):
        teacher = round_teacher(config, r)
        plan.append(data(f"gatt-data{round_suffix(r)}", "gatt", {**gatt, "round": r}, gatt_data_dir(out, r), teacher))
        if r == 1 and config.base_model == "smollm2":
            replay_keys = command_keys("replay")
            settings = {**{k: v for k, v in gatt.items() if k in replay_keys}, **section(config, "data.replay")}
            plan.append(data("replay-data", "replay", settings, replay, str(out / "base" / "final")))
        union = [str(gatt_data_dir(out, i) / "gatt.jsonl") for i in range(1, r + 1)]
        start = gatt_dir(out, r - 1) / "final" if config.rounds_continue and r > 1 else base_model_dir(config)
        train_files = union[-1:] if config.rounds_continue else union
        train_section = section(config, "train.gatt")
        plan.append(gatt_model(f"gatt-model{round_suffix(r)}", train_section, start, train_files, gatt_dir(out, r)))
    if config.any_turn is not None:  # GAtt data of every kind, and the model trained on it from the base model
        any_data, any_gatt = out / "any" / "data" / "gatt", out / "any" / "gatt"
        settings = {**gatt, "kinds": list(KINDS), **section(config, "any_turn.data")}
        plan.append(data("gatt-any-data", "gatt", settings, any_data, round_teacher(config, 1)))
        train_section = {**section(config, "train.gatt"), **section(config, "any_turn.train")}
        any_files = [str(any_data / "gatt.jsonl")]
        plan.append(gatt_model("gatt-any-model", train_section, base_model_dir(config), any_files, any_gatt))
    grpo = "grpo" in (config.train or {})
    if grpo:  # RL on the checks from the last round's GAtt model (gatt/training/grpo.py)
        settings = {**inputs(config, config_keys(GRPOGattConfig)), **section(config, "train.grpo")}
        files = {"model": gatt_dir(out, config.rounds) / "final", "seed": config.seed}
        plan.append(train("grpo-model", settings, files, out / "grpo", script="grpo_gatt"))
    models = [f"base={base_model_dir(config)}"] if config.baselines else []
    models += [f"{student_name(r, config.rounds)}={gatt_dir(out, r) / 'final'}" for r in range(1, config.rounds + 1)]
    models += [f"{student_name(config.rounds, config.rounds)}+grpo={out / 'grpo' / 'final'}"] if grpo else []
    models += [f"gatt-any={out / 'any' / 'gatt' / 'final'}"] if config.any_turn is not None else []
    report = {**inputs(config, config_keys(EvalConfig)), **section(config, "eval"), "model": models}
    if (dialogues := eval_dialogues(config)) is not None:
        report["dialogues"] = dialogues
    report |= {"out": out / "report", **({"repeat_instruction": ["base"]} if config.baselines else {})}
    plan.append(stage("report", [*python, "-m", "gatt.eval.evaluate"], report, out / "report"))
    return plan


def base_model_dir(config: DemoConfig) -> Path:
    """The chat model GAtt starts from: the shipped one, or the one this run trained (rebuild_base, smollm2)."""
    if config.base_model == "embedded" and not config.rebuild_base:
        return EMBEDDED_FOLDER
    return Path(config.out) / "base" / "final"


def round_teacher(config: DemoConfig, r: int) -> str:
    """Round r's teacher: the base model (or the oracle) in round 1, then round r-1's GAtt model."""
    if r > 1:
        return str(gatt_dir(Path(config.out), r - 1) / "final")
    return "oracle" if config.teacher == "oracle" else str(base_model_dir(config))


def run(config: DemoConfig, command: str = "") -> dict[str, Any]:
    """Run (or skip) every stage of `config`; `command` is the command line, for make base-model's record."""
    out, plan = Path(config.out), stages(config)  # a config error stops here, before anything runs
    tiers = heldout_tiers(config)
    for problem in tier_violations(tiers) if tiers else []:
        print(f"warning: held-out tiers: {problem}")  # a selection that measures something else than it says
    # From the shipped model: its weights are an input of every stage (a re-shipped model makes them all again).
    upstream = weights_sha256(EMBEDDED_FOLDER) if base_model_dir(config) == EMBEDDED_FOLDER else ""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # stages import this checkout
    env = {"OMP_NUM_THREADS": str(CPUS), **os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    threads = int(env["OMP_NUM_THREADS"])  # the stages' threads: the calibration reads the machine as they use it
    calibration = machine_calibration(threads)
    print(
        f"machine: {calibration['cpu']}, {threads} threads, the project's work {calibration['work_seconds']} s, "
        f"fp32 matmul {calibration['fp32_matmul_gflops']} GFLOP/s"
    )
    timings, skipped = run_stages(plan, out / "stamps", upstream, env, root=ROOT, timeout_s=config.stage_timeout)
    teachers = [round_teacher(config, r) for r in range(1, config.rounds + 1)]
    report = json.loads((out / "report" / "report.json").read_text())
    report = add_rounds(out / "report", round_entries(out, teachers, report, timings))
    summary = stage_timings(timings, skipped, calibration, out / "timings.json")
    if config.rounds == 0:
        packaged = package_base_model(out, dataclasses.asdict(config), command, report, summary)
        print(f"packaged: {packaged} (to ship it: make ship-base-model)")
    print("\n" + summary_tables(report))
    total, at_reference = summary["total_seconds"], summary["total_seconds_at_reference_speed"]
    print(
        f"stage times: {', '.join(f'{name} {s:.0f} s' for name, s in timings.items())}; total {total:.0f} s "
        f"({at_reference:.0f} s at the reference speed)\nreport: {out / 'report' / 'report.md'}"
    )
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    epilog = "each section's keys:\n" + "\n".join(
        textwrap.fill(
            ", ".join(k for k in keys if k not in set_here),
            116,
            initial_indent=f"  {name:15}",
            subsequent_indent=" " * 17,
        )
        for name, (keys, set_here) in SECTIONS.items()
    )
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        default=str(ROOT / "recipes" / "configs" / "demo.yaml"),
        help="YAML of DemoConfig's keys and the stage sections (default: recipes/configs/demo.yaml)",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="a key (data.gatt.max_turns=10), as YAML")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "recipes/demo.py", *(sys.argv[1:] if argv is None else argv)])
    with exit_on_bad_input():
        return run(load_config(args.config, args.overrides), command)


def cli() -> None:
    """`gatt-demo`: `main()` with no return value (an installed command exits with the value its function returns)."""
    main()


if __name__ == "__main__":
    main()
