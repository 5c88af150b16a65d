"""What a model folder must hold, checked before a stage loads one: a wrong path is one line naming the option,
the folder and what it lacks, not transformers' multi-line error from deep inside a tokenizer backend.

A damaged file (a truncated model.safetensors, a *.bin torch cannot load, a config.json that is not JSON) is one line
too, naming the file and what is wrong: `check_model_folder` reads the headers and small JSON files before a stage
starts, and `loading_model`, around each `from_pretrained`, turns a loader's error into that line when a file of the
folder proves damaged."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CONFIG_FILES = ("config.json", "adapter_config.json")  # a model, or a PEFT adapter over its base
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
HOW_TO_MAKE = "save_pretrained writes one (SmolLM2-135M-Instruct: `python -m gatt.model.pretrained --out DIR`)"
REMEDY = "re-export or re-train this model"
# Small JSON files a load reads (checked before a stage starts); tokenizer.json can be large: checked after a failure.
JSON_FILES = (*CONFIG_FILES, "generation_config.json", "tokenizer_config.json", "special_tokens_map.json")
TOKENIZER_JSON = "tokenizer.json"
TORCH_WEIGHTS = ("pytorch_model*.bin", "adapter_model.bin")  # not training_args.bin and the like: not weights


def check_model_folder(path: str | Path, option: str, *, tokenizer: bool = True, hint: str = "") -> None:
    """Refuse a path `from_pretrained` cannot load a model (and, with `tokenizer`, its tokenizer) from.

    A folder must hold a config (config.json, or adapter_config.json for a PEFT adapter), model weights and, with
    `tokenizer`, tokenizer files, and no damaged file (`damaged_file`); a .gguf file must exist.

    Args:
        path: A model folder or a .gguf file.
        option: Where the path came from (`--teacher`, `model`, or `--model NAME=`, which the path follows
            directly), named in the error.
        tokenizer: Whether the folder must hold a tokenizer too (default True).
        hint: Text put after what is wrong with the path in the error (default "").

    Raises:
        FileNotFoundError: For a missing path.
        ValueError: For a path that is neither a folder nor a .gguf file, a folder that lacks files, or a damaged
            file.
    """
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
    problem = damaged_file(path, tokenizer=tokenizer)
    if problem:
        raise ValueError(f"{problem}; {REMEDY}")


def _brief(error: BaseException) -> str:
    """A loader's message cut to its first line and sentence, for a one-line report."""
    lines = str(error).strip().splitlines()
    return (lines[0].split(". ")[0].rstrip(".") if lines else "") or type(error).__name__


def _json_problem(file: Path) -> str | None:
    try:
        json.loads(file.read_bytes())
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        return f"not valid JSON ({_brief(error)})"
    return None


def _safetensors_problem(file: Path) -> str | None:
    """The header and the length the header promises: what a truncated or overwritten file gets wrong."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt"):
            pass
    except SafetensorError as error:
        return f"not a valid safetensors file ({_brief(error)})"
    return None


def _torch_problem(file: Path) -> str | None:
    """Whether torch loads the file (memory-mapped where it is a zip archive, as torch.save writes)."""
    import torch

    with file.open("rb") as f:
        head = f.read(4)
    if not head:
        return "not a loadable PyTorch weights file (the file is empty)"
    is_zip = zipfile.is_zipfile(file)
    if head.startswith(b"PK") and not is_zip:
        return "not a loadable PyTorch weights file (a truncated or damaged zip archive)"
    if not is_zip and not head.startswith(b"\x80"):
        return "not a loadable PyTorch weights file (neither the zip archive nor the pickle that torch.save writes)"
    try:
        torch.load(file, map_location="cpu", weights_only=True, mmap=is_zip)
    except (OSError, MemoryError):
        return None  # the file is unreadable or too large, not damaged
    except Exception as error:  # noqa: BLE001  (unpickling fails in many ways)
        return f"not a loadable PyTorch weights file ({'the file ends early' if isinstance(error, EOFError) else _brief(error)})"
    return None


def _gguf_problem(file: Path) -> str | None:
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    try:
        GGUFReader(file)
    except (OSError, MemoryError):
        return None
    except Exception as error:  # noqa: BLE001  (a truncated file fails in struct, numpy or the reader)
        return f"not a valid GGUF file ({_brief(error)})"
    return None


def damaged_file(path: str | Path, *, tokenizer: bool = True, thorough: bool = False) -> str | None:
    """`FILE: what is wrong` for the first damaged file of model folder (or .gguf file) `path`; None if none is.

    Always cheap: the small JSON files parse, each safetensors file's header and length agree.

    Args:
        path: A model folder or a .gguf file; any other path has nothing to check.
        tokenizer: Whether tokenizer.json is checked when `thorough` (default True).
        thorough: Also parse tokenizer.json and load *.bin weights and a .gguf file, which reads them (after a
            load failed; default False).

    Returns:
        `FILE: what is wrong` for the first damaged file, or None if none is.
    """
    path = Path(path)
    if path.suffix == ".gguf":
        checks = [(path, _gguf_problem)] if thorough and path.is_file() else []
    elif path.is_dir():
        names = [*JSON_FILES, *(name for name in (TOKENIZER_JSON,) if tokenizer and thorough)]
        checks = [(path / name, _json_problem) for name in names]
        checks += [(file, _json_problem) for file in sorted(path.glob("*.index.json"))]  # shards' index
        checks += [(file, _safetensors_problem) for file in sorted(path.glob("*.safetensors"))]
        if thorough:
            checks += [(file, _torch_problem) for pattern in TORCH_WEIGHTS for file in sorted(path.glob(pattern))]
    else:
        checks = []
    for file, check in checks:
        problem = check(file) if file.is_file() else None
        if problem:
            return f"{file}: {problem}"
    return None


@contextmanager
def loading_model(path: str | Path, *, tokenizer: bool = True, remedy: str = REMEDY) -> Iterator[None]:
    """Around a `from_pretrained` of model folder (or .gguf file) `path`: a damaged file's error is one line.

    When the load fails and a file of `path` proves damaged (`damaged_file`, thorough), the error becomes a
    ValueError `FILE: what is wrong; remedy`, which `gatt.io.cli.exit_on_bad_input` prints as one line. Any other
    error is raised as it is.

    Args:
        path: The model folder or .gguf file loaded.
        tokenizer: Whether tokenizer.json is checked (default True).
        remedy: The advice that ends the message (default REMEDY: "re-export or re-train this model").

    Yields:
        Nothing: the load runs in the `with` block.

    Raises:
        ValueError: When the load fails and a file of `path` proves damaged.
    """
    try:
        yield
    except Exception as error:
        problem = damaged_file(path, tokenizer=tokenizer, thorough=True)
        if problem is None:
            raise
        raise ValueError(f"{problem}; {remedy}") from error


__all__ = ["check_model_folder", "damaged_file", "loading_model"]
