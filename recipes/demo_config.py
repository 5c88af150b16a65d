"""The demo's config (recipes/demo.py): its own keys, and one section per stage holding the settings of the
command that runs it, checked against that command's settings; a key of the flat configs before the sections is
refused naming its new place."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_gen.__main__ import command_keys
from data_gen.constraints import HELDOUT_TIERS, load_heldout_tiers
from gatt.eval.eval_config import EvalConfig
from gatt.io.config import check_section, config_keys, dataclass_from_dict, override_keys, read_yaml_config
from gatt.training.grpo import GRPOGattConfig
from gatt.training.trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[1]  # the checkout: config files named in a config are relative to it

Section = dict[str, Any]


@dataclass(kw_only=True)
class DemoConfig:
    out: str = "runs/demo"
    seed: int = 0  # every stage's seed
    base_model: str = "embedded"  # "embedded": the shipped chat model; "smollm2": SmolLM2-135M-Instruct from PyPI
    rebuild_base: bool = False  # embedded: train the chat model from scratch first (data.base, train.base)
    teacher: str = "base"  # "base": the base model writes the GAtt data (context distillation); or "oracle"
    rounds: int = 1  # GAtt rounds; 0 with rebuild_base: make base-model
    rounds_continue: bool = False  # round r+1's student continues from round r's model on its data (default: base)
    baselines: bool = True  # also report `base` and `base+repeat`; false: the GAtt models alone
    constraints: str = ""  # YAML with split tags, for the GAtt data and the report (default: the built-in catalogue)
    user_turns: str = ""  # your user messages for the teacher, the replay data and the report (default: built-in)
    heldout_families: list[str] = field(default_factory=list)  # kept out of the GAtt data, reported as held out
    # held-out families in tiers, each reported on its own: "catalogue" (data_gen/data/catalogue.yaml's
    # heldout_tiers), a YAML file with a heldout_tiers mapping of that form, or "" (none)
    heldout_tiers: str = ""
    data: dict[str, Section] = field(default_factory=dict)  # base, gatt, replay
    train: dict[str, Section] = field(default_factory=dict)  # base, gatt, grpo (RL on the checks after GAtt)
    eval: Section = field(default_factory=dict)
    any_turn: dict[str, Section] | None = None  # data, train: over data.gatt's and train.gatt's settings
    launcher: str = "accelerate"  # "accelerate" (accelerate launch) or "python"
    stage_timeout: float = 0.0  # seconds a stage may run before it is killed with all its processes (0: no limit)
    mixed_precision: str = "no"  # accelerate launch --mixed_precision: no | bf16 | fp16 | auto (bf16 where fast)


# Each section: the settings its command takes, and those the demo sets itself (refused in the section).
TRAIN_KEYS = ["config", *config_keys(TrainConfig)]  # `config`: a TrainConfig YAML read first
SECTIONS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "data.base": (["config", *command_keys("base")], ("out", "seed")),
    "data.gatt": (["config", *command_keys("gatt")], ("out", "teacher", "round", "seed")),
    "data.replay": (["config", *command_keys("replay")], ("out", "teacher", "seed")),
    "train.base": (TRAIN_KEYS, ("train_file", "output_dir", "seed")),
    "train.gatt": (TRAIN_KEYS, ("model", "train_file", "replay_file", "output_dir", "seed")),
    "train.grpo": (["config", *config_keys(GRPOGattConfig)], ("model", "output_dir", "seed")),
    "eval": (config_keys(EvalConfig), ("model", "out", "repeat_instruction", "seed")),
}
SECTIONS |= {"any_turn.data": SECTIONS["data.gatt"], "any_turn.train": SECTIONS["train.gatt"]}
# Keys of the flat configs before the sections and where each went; any other eval_X: eval.X, gatt_X and teacher_X:
# data.gatt.X.
MOVED = {
    "base_dialogues": "data.base.num_dialogues",
    "base_max_turns": "data.base.max_turns",
    "base_config": "train.base.config",
    "base_overrides": "train.base (its keys)",
    "gatt_dialogues": "data.gatt.num_dialogues",
    "samples_per_turn": "data.gatt.samples_per_turn",
    "replay_dialogues": "data.replay.num_dialogues",
    "replay_max_turns": "data.replay.max_turns",
    "gatt_config": "train.gatt.config",
    "gatt_overrides": "train.gatt (its keys)",
    "any_turn_dialogues": "any_turn.data.num_dialogues",
    "any_turn_overrides": "any_turn.train (its keys)",
    "eval_baselines": "baselines",
    "repetition_penalty": "data.gatt.repetition_penalty and eval.repetition_penalty",
    "no_repeat_ngram_size": "data.gatt.no_repeat_ngram_size and eval.no_repeat_ngram_size",
    "numerics": "data.gatt.teacher_numerics and eval.numerics",
}


def moved_to(key: str) -> str | None:
    """Where a key of the flat demo configs is now (None: no such key)."""
    if key in MOVED:
        return MOVED[key]
    for prefix, name in (("eval_", "eval"), ("gatt_", "data.gatt"), ("teacher_", "data.gatt")):
        if key.startswith(prefix) and key.removeprefix(prefix) in SECTIONS[name][0]:
            return f"{name}.{key.removeprefix(prefix)}"
    return None


def load_config(path: str | Path, overrides: list[str] = ()) -> DemoConfig:
    """The demo config in `path` with `key=value` overrides; a key of the flat configs is refused with its new place."""
    values = read_yaml_config(path, overrides)
    old = {key: moved_to(key) for key in values if key not in {f.name for f in dataclasses.fields(DemoConfig)}}
    if places := [f"{key} -> {place}" for key, place in old.items() if place]:
        raise ValueError(f"{path}: keys moved into the stage sections (recipes/demo_config.py): {'; '.join(places)}")
    return dataclass_from_dict(DemoConfig, values, str(path), override_keys(overrides))


def section(config: DemoConfig, name: str) -> Section:
    """The section `name` (data.gatt, eval, ...) of `config`, its keys checked against its command's settings. A data
    section's `config: FILE` (a YAML file of that command's settings, relative to the checkout) is read first and the
    section's other keys override it, as a train section's `config` is a TrainConfig YAML."""
    head, _, key = name.partition(".")
    values = getattr(config, head) or {}
    values = check_section(values.get(key) or {} if key else values, name, *SECTIONS[name])
    if "config" in values and (head == "data" or name == "any_turn.data"):
        file = values.pop("config")
        keys = [key for key in SECTIONS[name][0] if key != "config"]  # a settings file names no other file
        values = {
            **check_section(read_yaml_config(ROOT / file), f"{name}.config {file}", keys, SECTIONS[name][1]),
            **values,
        }
    return values


def heldout_tiers(config: DemoConfig) -> dict[str, tuple[str, ...]]:
    """The held-out tiers `config.heldout_tiers` names: {tier: its families} ({} for none).

    Raises:
        DataFileError: a tiers file without a valid `heldout_tiers` mapping (the message names the file and key).
    """
    if config.heldout_tiers in ("", "catalogue"):
        return dict(HELDOUT_TIERS) if config.heldout_tiers else {}
    values = read_yaml_config(config.heldout_tiers)
    return load_heldout_tiers(values.get("heldout_tiers"), f"{config.heldout_tiers}: heldout_tiers")


# The report's dialogues with tiers: at least this many a unit (trained values, held-out values, each tier), and at
# least PER_FAMILY for each of a tier's families.
UNIT_DIALOGUES, PER_FAMILY = 64, 8


def eval_dialogues(config: DemoConfig) -> int | None:
    """The report's dialogues with an instruction where the tiers decide them (eval.dialogues not given): every unit
    of the plan (trained values, held-out values, each tier, the held-out families in none) gets as many."""
    tiers = heldout_tiers(config)
    if not tiers or "dialogues" in section(config, "eval"):
        return None
    tiered = {family for families in tiers.values() for family in families}
    units = 2 + len(tiers) + bool(set(config.heldout_families) - tiered)
    return units * max(UNIT_DIALOGUES, PER_FAMILY * max(len(families) for families in tiers.values()))


def inputs(config: DemoConfig, keys: Collection[str]) -> Section:
    """The demo's shared settings (seed, your constraints, user turns, held-out families and tiers) a command takes:
    the tiers' families are held out with `heldout_families`, and an evaluation is given the tiers themselves."""
    shared: Section = {"seed": config.seed, "constraints": config.constraints, "user_turns": config.user_turns}
    tiers = heldout_tiers(config)
    tiered = [family for families in tiers.values() for family in families]
    shared["heldout_families"] = [f for f in config.heldout_families if f not in tiered] + tiered
    shared["heldout_tiers"] = [f"{tier}={','.join(families)}" for tier, families in tiers.items()]
    return {key: value for key, value in shared.items() if key in keys and value not in ("", [])}


CHOICES = {
    "base_model": ("embedded", "smollm2"),
    "teacher": ("base", "oracle"),
    "launcher": ("accelerate", "python"),
    "mixed_precision": ("no", "bf16", "fp16", "auto"),
}
PARTS = {"data": ("base", "gatt", "replay"), "train": ("base", "gatt", "grpo"), "any_turn": ("data", "train")}


def validate(config: DemoConfig) -> None:
    for key, choices in CHOICES.items():
        if getattr(config, key) not in choices:
            raise ValueError(f"{key} must be one of {', '.join(choices)}, got {getattr(config, key)!r}")
    for name, parts in PARTS.items():
        if not isinstance(value := getattr(config, name) or {}, Mapping) or set(value) - set(parts):
            raise ValueError(f"{name} must be a mapping with the sections {', '.join(parts)}, got {value!r}")
    if config.base_model == "smollm2" and (config.teacher != "base" or config.rebuild_base):
        raise ValueError("smollm2 is its own teacher (teacher: base) and is not rebuilt (rebuild_base: false)")
    if config.rounds < (0 if config.rebuild_base and config.baselines else 1):
        raise ValueError(f"rounds must be >= 1 (0: make base-model, with rebuild_base and baselines): {config.rounds}")
    if config.base_model == "smollm2" and not section(config, "data.replay").get("num_dialogues"):
        raise ValueError("data.replay.num_dialogues must be >= 1 on smollm2 (its replay data)")
