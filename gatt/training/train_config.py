"""The settings of a training run (`TrainConfig`, a YAML file mirrors it field for field, unknown keys refused) and
the inputs they name: the data files, checked and read, and the records split into training, replay and evaluation."""

from __future__ import annotations

import json
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gatt.data.collator import RENDERINGS
from gatt.data.recovery import RECOVERY_TURNS, recovery_copies
from gatt.io.config import REQUIRED, arg, dataclass_from_dict, override_keys, read_yaml_config
from gatt.model.embedded import model_path
from gatt.model.folder import check_model_folder


@dataclass
class TrainConfig:
    """Every knob of a training run; the YAML configs in recipes/configs mirror it."""

    output_dir: str = arg(REQUIRED, "where checkpoints, metrics.jsonl and the final model go")
    train_file: str | list[str] = arg(
        REQUIRED, "a JSONL file, or several read as one (e.g. every GAtt round's data)", nargs="+"
    )
    # how long: set exactly one of max_steps and num_epochs
    max_steps: int = arg(0, "optimizer steps (set this or num_epochs)")
    num_epochs: float = arg(
        0.0,
        "passes over the training records, replay included (TRL's default is 3); the steps are then "
        "ceil(num_epochs x records / batch_size)",
    )
    save_every: int = arg(0, "a checkpoint every N steps; 0: only the final model")
    seed: int = arg(0, "data order, initialisation and dropout seed")
    # data
    eval_file: str | None = arg(None, "held-out records for the eval loss (default: eval_fraction of train_file)")
    eval_fraction: float = arg(0.02, "held-out share of train_file when there is no eval_file")
    replay_file: str | None = arg(
        None, "records mixed in against forgetting (e.g. the SFT data or data_gen replay's), replay_ratio of them"
    )
    replay_ratio: float = arg(0.0, "replay records drawn per training record (replay_ratio x len(train_file))")
    recovery_share: float = arg(
        0.0,
        "this share of the GAtt records also trained as a recovery copy: a reply (recovery_turn) under another value of "
        "its family, not trained on, so GAtt follows the system message over its own miss (gatt/data/recovery.py)",
    )
    recovery_turn: str = arg(
        "first",
        "which reply a recovery copy replaces: the first, or any (one that has a reply after it)",
        choices=list(RECOVERY_TURNS),
    )
    mode: str = arg(
        "last",
        "which replies carry loss (GAttCollator): last (the paper's: the last reply), all, expand",
        choices=["last", "all", "expand"],
    )
    instruction_placement: str = arg("system", "where turn one gives the instruction", choices=["system", "first_user"])
    max_length: int = arg(1024, "tokens per training row")
    packing: bool = arg(True, "pack several dialogues into one row")
    padding_free: bool = arg(
        False, "with packing: each micro-batch in one row, no padding (the model must honour segments)"
    )
    distill_weight: float = arg(
        0.0,
        "GAtt records also match the start model's hidden states reading the reminded dialogue, at the positions "
        "that predict their replies, with this weight (gatt/training/distill.py); 0: replies only (the paper)",
    )
    distill_view: str = arg(
        "reminded",
        "what the start model reads for distill_weight: `reminded` (the whole dialogue, the instruction appended to "
        "every user message), `near` (each supervised reply alone, the instruction in turn one's place) or `both`",
        choices=list(RENDERINGS),
    )
    # model: a directory, or a GattConfig to start from scratch
    model: str | None = arg(
        None,
        "a model directory (the library's model or any Hugging Face causal LM; `embedded`: the shipped chat model); "
        "or model_config",
    )
    gguf_file: str | None = arg(None, "a .gguf file in the model directory to load")
    model_config: dict[str, Any] | None = arg(
        None, "a GattConfig (YAML mapping) for a new model from scratch; or model", type=yaml.safe_load
    )
    tokenizer: str | None = arg(None, "a tokenizer directory (default: the model directory)")
    tokenizer_vocab_size: int = arg(0, "> 0: train a byte-level BPE of this size on the training texts")
    # optimisation
    batch_size: int = arg(16, "records per optimizer step (the global batch)")
    gradient_accumulation_steps: int = arg(1, "micro-batches per optimizer step (batch_size must divide by it)")
    learning_rate: float = arg(3e-4, "peak learning rate")
    min_lr_ratio: float = arg(0.1, "the cosine's floor, a share of the peak")
    lr_restarts: int = arg(
        0, "> 0: cosine with this many hard restarts to the peak, each cycle ending at 0 (min_lr_ratio unused)"
    )
    # Re-warming: a run stopped at lr_rewarm_step and resumed on a longer schedule, written as one run.
    lr_first_horizon: int = arg(
        0,
        "until lr_rewarm_step the cosine runs as if max_steps were this; after it, over max_steps, so the learning "
        "rate rises to where the longer cosine is (0: one cosine over max_steps)",
    )
    lr_rewarm_step: int = arg(0, "the step the longer schedule takes over (see lr_first_horizon)")
    warmup_steps: int = arg(0, "linear warm-up steps")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient clipping norm")
    gradient_checkpointing: bool = arg(False, "recompute activations in the backward pass (less memory, slower)")
    mixed_precision: str | None = arg(
        None,
        "no, bf16, fp16, or auto (bf16 where the CPU or GPU has fast bf16 arithmetic, else no; the choice is "
        "printed) (default: accelerate launch --mixed_precision's)",
        choices=["no", "bf16", "fp16", "auto"],
    )
    # LoRA (lora_r = 0: full fine-tune)
    lora_r: int = arg(0, "LoRA rank; 0: full fine-tune")
    lora_alpha: int = arg(16, "LoRA alpha")
    lora_dropout: float = arg(0.0, "LoRA dropout")
    lora_targets: list[str] = arg(["q_proj", "k_proj", "v_proj", "o_proj"], "modules LoRA adapts", nargs="+")
    merge_lora: bool = arg(True, "merge the adapters into the final model")
    # bookkeeping
    eval_every: int = arg(0, "the eval loss every N steps and at the end; 0: none (and no records held out)")
    log_every: int = arg(10, "a metrics.jsonl line every N steps")
    keep_checkpoints: int = arg(2, "checkpoints kept (the newest)")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config", overridden: Collection[str] = ()) -> TrainConfig:
        """Build from a mapping and validate it.

        Unknown keys are refused naming them, where they were given and the valid ones. A `model` or `tokenizer` of
        `embedded` becomes the shipped model's folder.

        Args:
            values: The settings, by key.
            source: Where `values` were read, named in errors (default "config").
            overridden: The keys given on the command line.

        Returns:
            The config.

        Raises:
            ValueError: When a key is unknown, a required one is missing, a value is outside its choices, or the
                settings are inconsistent (`validate`).
        """
        config = dataclass_from_dict(cls, values, source, overridden)
        config.model, config.tokenizer = (
            None if v is None else model_path(v) for v in (config.model, config.tokenizer)
        )
        config.validate(source)
        return config

    def validate(self, source: str = "config") -> None:
        """Refuse inconsistent settings, naming the key.

        Args:
            source: Where the settings were read, named in errors (default "config").

        Raises:
            ValueError: When not exactly one of `model` and `model_config`, or of `max_steps` and `num_epochs`, is
                set; a new model has no tokenizer; the learning-rate schedule's keys disagree; `train_file` is not a
                path or a non-empty list of paths; replay or distillation is half set; or batch_size does not divide
                by gradient_accumulation_steps.
        """
        if (self.model is None) == (self.model_config is None):
            raise ValueError(f"{source}: set exactly one of `model` (a directory) or `model_config` (a new model)")
        if self.model_config is not None and self.tokenizer is None and self.tokenizer_vocab_size <= 0:
            raise ValueError(f"{source}: a new model needs `tokenizer` (a directory) or `tokenizer_vocab_size` > 0")
        if (self.max_steps > 0) == (self.num_epochs > 0) or self.max_steps < 0 or self.num_epochs < 0:
            raise ValueError(
                f"{source}: set exactly one of max_steps (>= 1) or num_epochs (> 0), got max_steps={self.max_steps}, "
                f"num_epochs={self.num_epochs}"
            )
        if self.num_epochs and self.lr_first_horizon:
            raise ValueError(f"{source}: lr_first_horizon counts steps: give max_steps, not num_epochs")
        if self.lr_restarts < 0:
            raise ValueError(f"{source}: lr_restarts must be >= 0, got {self.lr_restarts}")
        if (self.lr_rewarm_step > 0) != (self.lr_first_horizon > 0) or not (
            self.lr_rewarm_step <= self.lr_first_horizon <= (self.max_steps or self.lr_first_horizon)
        ):
            raise ValueError(
                f"{source}: re-warming needs 0 < lr_rewarm_step <= lr_first_horizon <= max_steps (or both 0), got "
                f"lr_rewarm_step={self.lr_rewarm_step}, lr_first_horizon={self.lr_first_horizon}, "
                f"max_steps={self.max_steps}"
            )
        if self.lr_restarts and self.lr_rewarm_step:
            raise ValueError(f"{source}: lr_restarts and lr_rewarm_step are two schedules; set one")
        if not train_files(self) or not all(isinstance(path, str) and path for path in train_files(self)):
            raise ValueError(
                f"{source}: train_file must be a path or a non-empty list of paths, got {self.train_file!r}"
            )
        if self.replay_ratio < 0 or (self.replay_ratio > 0) != (self.replay_file is not None):
            raise ValueError(
                f"{source}: replay needs both `replay_file` and `replay_ratio` > 0, got "
                f"{self.replay_file!r} and {self.replay_ratio}"
            )
        if not 0.0 <= self.recovery_share <= 1.0:
            raise ValueError(f"{source}: recovery_share must be in [0, 1], got {self.recovery_share}")
        if self.batch_size % self.gradient_accumulation_steps:
            raise ValueError(
                f"{source}: batch_size ({self.batch_size}) must be divisible by gradient_accumulation_steps"
            )
        if self.distill_weight < 0 or (self.distill_weight > 0 and self.model is None):
            raise ValueError(
                f"{source}: distill_weight must be >= 0 and needs `model` (the start model is the teacher), got "
                f"{self.distill_weight} with model={self.model!r}"
            )


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML config and apply `key=value` overrides (values parsed as YAML).

    Args:
        path: The YAML config file.
        overrides: `key=value` strings, from the command line.

    Returns:
        The validated config.
    """
    return TrainConfig.from_dict(read_yaml_config(path, overrides), str(path), override_keys(overrides))


# The command that writes each data file `python -m data_gen` makes, by file name (DIR/<name>.jsonl).
DATA_COMMANDS: dict[str, str] = {
    "base": "python -m data_gen base --out {dir}",
    "gatt": "python -m data_gen gatt --teacher oracle --out {dir}",
    "replay": "python -m data_gen replay --teacher MODEL_DIR --out {dir}",
}


def check_input_files(config: TrainConfig) -> None:
    """Every data file and model folder the config names exists.

    A missing one is reported with its key (and, for data, the command that makes it).

    Args:
        config: The run's config.

    Raises:
        FileNotFoundError: When a data file (train_file, replay_file, eval_file), the model folder or .gguf file, or
            the tokenizer folder does not exist.
        ValueError: When the model or tokenizer path is not a model folder (`check_model_folder`).
    """
    if config.model is not None:
        check_model_folder(Path(config.model) / (config.gguf_file or ""), "model", tokenizer=config.tokenizer is None)
    if config.tokenizer is not None:
        check_model_folder(config.tokenizer, "tokenizer")
    for key, path in [("train_file", p) for p in train_files(config)] + [
        ("replay_file", config.replay_file),
        ("eval_file", config.eval_file),
    ]:
        if path is None or Path(path).is_file():
            continue
        command = DATA_COMMANDS.get(Path(path).stem) if Path(path).suffix == ".jsonl" else None
        how = (
            f"; make it first, e.g. `{command.format(dir=Path(path).parent)}` (python -m data_gen --help)"
            if command
            else ""
        )
        raise FileNotFoundError(f"{key}: {path} does not exist{how}")


def train_files(config: TrainConfig) -> list[str]:
    """`train_file` as a list of paths.

    Args:
        config: The run's config.

    Returns:
        The paths, one when `train_file` is a string.
    """
    return [config.train_file] if isinstance(config.train_file, str) else list(config.train_file)


def read_records(path: str | Path, *, allow_empty: bool = False) -> list[dict[str, Any]]:
    """JSONL records; a bad line is reported with its file and line number, an empty file unless `allow_empty`.

    Args:
        path: The JSONL file; blank lines are skipped.
        allow_empty: Whether a file with no records is accepted.

    Returns:
        The records, each an object with a `messages` list.

    Raises:
        ValueError: When a line is not valid JSON or not an object with a `messages` list, or the file has no records
            and `allow_empty` is false.
    """
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from error
            if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
                raise ValueError(f"{path}:{number}: expected an object with a `messages` list")
            records.append(record)
    if not records and not allow_empty:
        raise ValueError(f"{path}: no records")
    return records


def split_records(config: TrainConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The training and evaluation records of `config` and how many replayed records were drawn.

    The training records are the task files' (one may be empty, not all), then the replay sample (`replay_ratio` of
    the task records, its own seeded draw), then with `recovery_share` the recovery copies of the training GAtt
    records (gatt/data/recovery.py; none of a held-out one); the evaluation records are eval_file's, or a seeded
    `eval_fraction` held out of them (none when `eval_every` is 0).

    Args:
        config: The run's config.

    Returns:
        (training records, evaluation records, replayed count).

    Raises:
        ValueError: When the task files hold no records, or replay_file or eval_file is empty or malformed.
    """
    # Several files (every GAtt round's data): one may be empty (a round whose teacher kept no dialogue), not all.
    records = [record for path in train_files(config) for record in read_records(path, allow_empty=True)]
    if not records:
        raise ValueError(f"train_file: no records in {', '.join(train_files(config))}")
    replayed = 0
    if config.replay_file:
        replay = read_records(config.replay_file)
        replayed = min(len(replay), round(config.replay_ratio * len(records)))
        records += random.Random(f"replay-{config.seed}").sample(replay, replayed)
    if config.eval_file:
        train, evaluation = records, read_records(config.eval_file)
    else:
        shuffled = random.Random(config.seed).sample(records, len(records))
        n_eval = int(len(records) * config.eval_fraction) if config.eval_every else 0
        train, evaluation = shuffled[n_eval:], shuffled[:n_eval]
    if config.recovery_share:
        train += recovery_copies(train, config.recovery_share, config.seed, config.recovery_turn)
    return train, evaluation, replayed
