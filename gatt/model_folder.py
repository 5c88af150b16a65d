"""What a model folder must hold, checked before a stage loads one: a wrong path is one line naming the option,
the folder and what it lacks, not transformers' multi-line error from deep inside a tokenizer backend."""

from __future__ import annotations

from pathlib import Path

CONFIG_FILES = ("config.json", "adapter_config.json")  # a model, or a PEFT adapter over its base
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
HOW_TO_MAKE = "save_pretrained writes one (SmolLM2-135M-Instruct: `python -m gatt.pretrained --out DIR`)"


def check_model_folder(path: str | Path, option: str, *, tokenizer: bool = True, hint: str = "") -> None:
    """Refuse a path `from_pretrained` cannot load a model (and, with `tokenizer`, its tokenizer) from.

    `path` is a model folder or a .gguf file; `option` names where it came from (`--teacher`, `model`, or
    `--model NAME=`, which the path follows directly). The error is a FileNotFoundError for a missing path,
    a ValueError for a folder that lacks files."""
    path = Path(path)
    where = f"{option}{'' if option.endswith('=') else ' '}{path}"
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"{where}: no such .gguf file{hint}")
        return
    if not path.exists():
        raise FileNotFoundError(f"{where}: no such model folder{hint}")
    if not path.is_dir():
        raise ValueError(f"{where}: not a model folder or a .gguf file{hint}")
    missing = []
    if not any((path / name).is_file() for name in CONFIG_FILES):
        missing.append("config.json")
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        missing.append("model weights (model.safetensors or pytorch_model.bin)")
    if tokenizer and not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append("tokenizer files (tokenizer.json or tokenizer.model)")
    if missing:
        raise ValueError(f"{where}: not a model folder{hint}: it has no {', no '.join(missing)}; {HOW_TO_MAKE}")


__all__ = ["check_model_folder"]
