"""Loading a chat model and its tokenizer for generation: the one loader of the evaluation and the teacher.

A model folder (or a .gguf file) is checked first (gatt/model/folder.py: one line naming what is missing or
damaged), its tokenizer must carry a chat template, a missing pad token becomes the end-of-sequence token, and
the model comes back in eval mode on its device, in the numerics asked for (gatt/model/numerics.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import gatt  # noqa: F401  (registers the "gatt" attention and the library's model with transformers)
from gatt.io.distributed import process_state
from gatt.model.folder import check_model_folder, loading_model
from gatt.model.modeling import GattForCausalLM
from gatt.model.numerics import for_inference

TORCH_DTYPES: dict[str, torch.dtype | str] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "auto": "auto",  # the checkpoint's own
}


def load_chat_model(
    path: str | Path,
    *,
    role: str = "model",
    attention: bool = False,
    device: str | None = None,
    device_map: str | None = None,
    dtype: str | None = None,
    numerics: str = "exact",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A chat model folder (or a .gguf file) and its tokenizer, `role` naming it in errors (`model`, `teacher`).

    Args:
        path: The model folder, or a .gguf file (its folder holds the tokenizer).
        role: What the model is, in error messages (default "model"; e.g. "teacher").
        attention: Load it on attention that returns its weights (the attention probe): the library's model, or a
            Hugging Face model's with `attn_implementation="gatt"` (default False).
        device: The device (default this process's: cuda:LOCAL_RANK under a launcher, else cuda if there is one,
            else cpu).
        device_map: Spreads the model over the visible devices instead of `device` (e.g. "auto"; default None).
        dtype: A key of TORCH_DTYPES (default None: transformers' default).
        numerics: exact, bf16, or int8 on CPU (default "exact"; gatt/model/numerics.py).

    Returns:
        (model, tokenizer): the model in eval mode on its device, in the numerics asked for, and its tokenizer, whose
        pad token is the end-of-sequence token where it had none.

    Raises:
        ValueError: When both `device` and `device_map` are given, the folder lacks files, or the tokenizer has no
            chat template.
        FileNotFoundError: When `path` does not exist.
    """
    if device is not None and device_map is not None:
        raise ValueError(f"give the {role} a --device or a --{role}-device-map, not both")
    path = Path(path)
    gguf: dict[str, str] = {}
    if path.suffix == ".gguf":
        path, gguf = path.parent, {"gguf_file": path.name}
    source = path / gguf.get("gguf_file", "")  # the folder, or the .gguf file
    check_model_folder(source, role)
    with loading_model(source):
        tokenizer = AutoTokenizer.from_pretrained(path, **gguf)
    if not tokenizer.chat_template:
        raise ValueError(f"{role} {path}: the tokenizer has no chat template; a {role} must be a chat model")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    kwargs: dict[str, Any] = {**gguf, **({} if dtype is None else {"dtype": TORCH_DTYPES[dtype]})}
    if device_map is not None:
        kwargs["device_map"] = device_map
    with loading_model(source):
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if attention and not isinstance(model, GattForCausalLM):
            model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="gatt", **kwargs)
    if device_map is None:
        model = model.to(device or process_state().device)
    return for_inference(model.eval(), numerics), tokenizer
