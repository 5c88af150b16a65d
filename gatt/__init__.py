"""Ghost Attention (GAtt): teach a chat model to keep a first-turn instruction for 20+ turns.

The library in wings by concern:

- `gatt.io`: configs that are the command line, one-line errors, whole writes, the machine, a job's processes;
- `gatt.model`: masked multi-head attention, `GattForCausalLM` (Llama-compatible), its tokenizer, generation and the
  chat-model loader;
- `gatt.data`: dialogues, the checks and constraint sets, instructions at any turn, the GAtt collator;
- `gatt.eval`: the adherence evaluation over 20+ turns (`python -m gatt.eval.evaluate`), the answer gate, the report;
- `gatt.training`: the Accelerate training loop, representation distillation, GRPO.

A wing imports only the wings above it in this list.

The public names below are importable from `gatt` itself; the model's are imported at once, the others on first use
(so `import gatt` does not load Accelerate, PEFT or the evaluation). The flat paths from before the wings
(`gatt.collator`, `python -m gatt.evaluate`, ...) still import the same modules (`gatt/moved.py`).

Importing `gatt` registers the library's attention with transformers under the name "gatt", so
any Hugging Face model can run on it: `AutoModelForCausalLM.from_pretrained(..., attn_implementation="gatt")`.
"""

import importlib
from typing import Any

from gatt.model.attention import MaskedMultiHeadAttention, masked_attention, register_with_transformers
from gatt.model.modeling import GattConfig, GattForCausalLM, GattModel
from gatt.moved import install

register_with_transformers("gatt")
install()

# public name -> the module that defines it, imported when the name is first read
LAZY = {
    "GAttCollator": "gatt.data.collator",
    "load_dialogues": "gatt.data.dialogues",
    "TrainConfig": "gatt.training.trainer",
    "Trainer": "gatt.training.trainer",
    "EvalConfig": "gatt.eval.evaluate",
    "GateConfig": "gatt.eval.gate",
    "load_chat_model": "gatt.model.chat_model",
}


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'gatt' has no attribute {name!r}")


__all__ = ["GattConfig", "GattForCausalLM", "GattModel", "MaskedMultiHeadAttention", "masked_attention", *LAZY]
__version__ = "0.1.0"
