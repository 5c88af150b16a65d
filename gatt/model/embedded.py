"""The embedded chat model: the ~1M-parameter GattForCausalLM that `make base-model` trains from scratch on the toy
world, shipped inside the package (gatt/embedded_model/, package data), so `make demo` and a `pip install` user start
from it as a user's job starts from their own model.

Everywhere a model folder is taken, the name `embedded` stands for it: `data_gen gatt --teacher embedded`,
`gatt.eval.evaluate --model base=embedded`, a training config's `model: embedded`. The folder holds the weights
(model.safetensors), config, tokenizer and `record.json`: how it was made (command, config, data seed, versions, the
machine's calibration), its report's figures, the weights' SHA-256 and the greedy replies to a few prompts, which the
tests check the shipped files against.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from gatt.io.cli import exit_on_bad_input
from gatt.io.config import arg, config_parser, parse_config
from gatt.io.files import atomic_path

EMBEDDED = "embedded"
FOLDER = Path(__file__).resolve().parents[1] / "embedded_model"
RECORD = "record.json"
WEIGHTS = "model.safetensors"
MAX_WEIGHT_BYTES = 8 * 2**20
# Prompts whose greedy replies the record keeps: a plain question, a system instruction, a local one.
PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Tell me about volcanoes."}],
    [
        {"role": "system", "content": "Always answer in French."},
        {"role": "user", "content": "What do you think about coffee?"},
    ],
    [{"role": "user", "content": "How do bees make honey? End every reply with 'Warm wishes!'"}],
]
GREEDY_TOKENS = 24


def model_path(name_or_path: str) -> str:
    """Resolve a model name or path: `embedded` stands for the shipped model's folder.

    Args:
        name_or_path: `embedded`, or a path.

    Returns:
        The shipped model's folder for `embedded`; any other value is a path, returned as given.
    """
    return str(FOLDER) if name_or_path == EMBEDDED else name_or_path


def read_record(folder: Path = FOLDER) -> dict[str, Any]:
    """The record of how the model in `folder` was made.

    Args:
        folder: A packaged model folder (default: the shipped model's).

    Returns:
        Its `record.json`, parsed.
    """
    return json.loads((folder / RECORD).read_text())


def weights_sha256(folder: Path) -> str:
    """The SHA-256 of the weights (model.safetensors) in `folder`.

    Args:
        folder: A model folder.

    Returns:
        The hash, as hex digits.
    """
    return hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()


def greedy_replies(folder: Path) -> list[list[int]]:
    """The model's greedy reply tokens (fp32, CPU) to each of PROMPTS: what a copy of the model must reproduce.

    Args:
        folder: A model folder (weights, config, tokenizer).

    Returns:
        Per prompt, the reply's token ids (at most GREEDY_TOKENS).
    """
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    replies = []
    for messages in PROMPTS:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(
                **ids, max_new_tokens=GREEDY_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        replies.append(out[0, ids["input_ids"].shape[1] :].tolist())
    return replies


def package(model_dir: Path, out: Path, record: dict[str, Any]) -> Path:
    """Write the shippable folder `out` from a trained model folder.

    Written under a temporary name and renamed, so `out` is whole or absent.

    Args:
        model_dir: The trained model folder, whose files are copied.
        out: The folder to write.
        record: How the model was made; written as `record.json` with the parameter count, the weights' hash and
            size and the greedy replies added.

    Returns:
        `out`.

    Raises:
        ValueError: When the weights are over MAX_WEIGHT_BYTES.
    """
    size = (model_dir / WEIGHTS).stat().st_size
    if size > MAX_WEIGHT_BYTES:
        raise ValueError(f"{model_dir / WEIGHTS}: {size / 2**20:.1f} MiB, over the {MAX_WEIGHT_BYTES / 2**20:.0f} MiB")
    with atomic_path(out) as partial:
        _copy_files(model_dir, partial)  # a model folder: weights, config, generation config, tokenizer, template
        parameters = sum(tensor.numel() for tensor in load_file(partial / WEIGHTS).values())
        record = {**record, "parameters": parameters, "weights_sha256": weights_sha256(partial), "weights_bytes": size}
        record["greedy_replies"] = {
            "max_new_tokens": GREEDY_TOKENS,
            "prompts": PROMPTS,
            "tokens": greedy_replies(partial),
        }
        (partial / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return out


def ship(folder: Path, into: Path = FOLDER) -> None:
    """Replace the package's embedded model with the packaged model in `folder` (the output of `make base-model`).

    Args:
        folder: The packaged model folder.
        into: The folder to replace (default: the shipped model's).

    Raises:
        FileNotFoundError: When `folder` has no record.json or no model.safetensors.
        ValueError: When the weights do not match the record's hash.
    """
    if not (folder / RECORD).is_file() or not (folder / WEIGHTS).is_file():
        raise FileNotFoundError(f"{folder}: not a packaged embedded model (no {RECORD} or {WEIGHTS}); make base-model")
    if weights_sha256(folder) != read_record(folder)["weights_sha256"]:
        raise ValueError(f"{folder}: {WEIGHTS} does not match its {RECORD}")
    with atomic_path(into) as partial:
        _copy_files(folder, partial)


def _copy_files(source: Path, target: Path) -> None:
    target.mkdir()
    for path in source.iterdir():
        if path.is_file():
            shutil.copy2(path, target / path.name)


@dataclass(kw_only=True)
class ShipConfig:
    """`python -m gatt.model.embedded`: the shipped model's record, after shipping another one if asked."""

    ship: Path | None = arg(None, "a packaged model, e.g. runs/base-model/embedded", metavar="FOLDER")


def main(argv: list[str] | None = None) -> None:
    """`python -m gatt.model.embedded`: print where the shipped model is and how it was made.

    With `--ship FOLDER`, the packaged model in FOLDER replaces the shipped one first.

    Args:
        argv: The command-line arguments (None: sys.argv's).
    """
    parser = config_parser(
        ShipConfig,
        prog="python -m gatt.model.embedded",
        description="The embedded chat model shipped in the package: where it is and how it was made; --ship FOLDER "
        "replaces it with a model that `make base-model` packaged (make ship-base-model).",
    )
    with exit_on_bad_input():
        config = parse_config(ShipConfig, argv, parser)
        if config.ship:
            ship(config.ship)
        record = read_record()
    reminded = record["report"]["reminded_pass_rate_per_family"]
    print(f"{FOLDER} ({record['parameters']:,} parameters, {record['weights_bytes'] / 2**20:.1f} MiB)")
    print(f"made by: {record['command']} ({record['total_seconds_at_reference_speed']:.0f} s at the reference speed)")
    print("reminded pass rate: " + ", ".join(f"{f} {100 * v['adherence']:.1f}%" for f, v in sorted(reminded.items())))


if __name__ == "__main__":
    main()


__all__ = ["EMBEDDED", "FOLDER", "model_path", "package", "read_record", "ship", "weights_sha256"]
