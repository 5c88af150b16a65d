"""What a training run is built from: its tokenizer (a new one trained on the records, or the start model's), the model
(from scratch or a folder, LoRA on the named modules), and the learning-rate schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from peft import LoraConfig, get_peft_model
from torch.optim.lr_scheduler import LambdaLR
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
)

import gatt  # noqa: F401  (registers the "gatt" model type and attention)
from gatt.data.collator import later_events
from gatt.io.files import first_write
from gatt.model.folder import loading_model
from gatt.model.modeling import GattConfig, GattForCausalLM
from gatt.model.tokenizer import train_tokenizer
from gatt.training.train_config import TrainConfig


def build_tokenizer(config: TrainConfig, records: list[dict[str, Any]], save_dir: Path) -> PreTrainedTokenizerBase:
    """The model's tokenizer, or a new one trained on the records (saved, so a resumed run reuses it).

    Args:
        config: The run's config: `tokenizer_vocab_size` > 0 without `tokenizer` trains a byte-level BPE of that size
            (its model_max_length the new model's `max_position_embeddings`, default 4096); else the tokenizer is
            loaded from `tokenizer`, or from `model` (its `gguf_file` where one is named).
        records: The training records, whose messages, instructions and later events' texts train a new tokenizer.
        save_dir: Where a trained tokenizer is saved, and found again by a resumed run.

    Returns:
        The tokenizer.
    """
    if config.tokenizer_vocab_size > 0 and config.tokenizer is None:
        if (save_dir / "tokenizer_config.json").exists():
            return AutoTokenizer.from_pretrained(save_dir)
        texts = [m["content"] for r in records for m in r["messages"]]
        texts += [r.get("instruction") or "" for r in records] + [r.get("instruction_short") or "" for r in records]
        texts += [event["text"] for r in records for event in later_events(r)]
        context = (config.model_config or {}).get("max_position_embeddings", 4096)
        tokenizer = train_tokenizer(texts, vocab_size=config.tokenizer_vocab_size, model_max_length=context)
        # Every process of a launch trains the same tokenizer: the first complete folder stays, none is read half-written.
        with first_write(save_dir) as folder:
            tokenizer.save_pretrained(folder)
        return tokenizer
    source = config.tokenizer or config.model
    gguf = {"gguf_file": config.gguf_file} if config.gguf_file and not config.tokenizer else {}
    with loading_model(Path(source) / gguf.get("gguf_file", "")):
        return AutoTokenizer.from_pretrained(source, **gguf)


def load_start_model(config: TrainConfig) -> PreTrainedModel:
    """`config.model` (its .gguf file where `gguf_file` names one), as saved: no LoRA, no checkpointing.

    Args:
        config: The run's config; `model` must be set.

    Returns:
        The loaded causal LM.
    """
    assert config.model is not None
    kwargs = {"gguf_file": config.gguf_file} if config.gguf_file else {}
    with loading_model(Path(config.model) / (config.gguf_file or ""), tokenizer=False):
        return AutoModelForCausalLM.from_pretrained(config.model, **kwargs)


def build_model(config: TrainConfig, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    """Load or create the model; wrap it with LoRA adapters when lora_r > 0.

    Args:
        config: The run's config: `model_config` makes a new GattForCausalLM, else `model` is loaded
            (`load_start_model`); `gradient_checkpointing` and the LoRA fields apply to either.
        tokenizer: The tokenizer, whose special token ids and length a new model's config takes.

    Returns:
        The model, a PEFT model with LoRA adapters when `lora_r` > 0.
    """
    if config.model_config is not None:
        special = {
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "vocab_size": len(tokenizer),
        }
        model = GattForCausalLM(GattConfig(**{**special, **config.model_config}))
    else:
        model = load_start_model(config)
    if config.gradient_checkpointing:
        model.activation_checkpointing_enable()
    if config.lora_r > 0:
        model = get_peft_model(model, lora_config(config))
    return model


class LoraSettings(Protocol):
    """The LoRA fields a config carries (TrainConfig, gatt.training.grpo.GRPOGattConfig)."""

    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_targets: list[str]


def lora_config(config: LoraSettings) -> LoraConfig:
    """The LoRA adapters a config asks for (`lora_r` > 0): rank, alpha, dropout and target modules.

    Args:
        config: A config with the LoRA fields (`LoraSettings`).

    Returns:
        The peft LoraConfig, for a causal LM.
    """
    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_targets),
        task_type="CAUSAL_LM",
    )


def learning_rate_schedule(config: TrainConfig, optimizer: torch.optim.Optimizer) -> LambdaLR:
    """Linear warm-up, then a cosine to `min_lr_ratio` (hard restarts or one re-warming where the config asks).

    Args:
        config: The run's config: `warmup_steps`, `max_steps` and `min_lr_ratio`; `lr_restarts` (that many hard
            restarts, each cycle ending at 0), or `lr_rewarm_step` and `lr_first_horizon` (the cosine as if max_steps
            were `lr_first_horizon` until `lr_rewarm_step`, then the cosine over `max_steps`).
        optimizer: The optimizer whose learning rate it sets.

    Returns:
        The scheduler, stepped once per optimizer step.
    """
    if config.lr_restarts:
        return get_cosine_with_hard_restarts_schedule_with_warmup(
            optimizer, config.warmup_steps, config.max_steps, num_cycles=config.lr_restarts + 1
        )

    def cosine(horizon: int) -> LambdaLR:
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, config.warmup_steps, horizon, min_lr_rate=config.min_lr_ratio
        )

    if not config.lr_rewarm_step:
        return cosine(config.max_steps)
    first, then = cosine(config.lr_first_horizon).lr_lambdas[0], cosine(config.max_steps).lr_lambdas[0]
    # The scheduler's step s sets the rate of optimizer step s + 1: step lr_rewarm_step + 1 still has the first
    # cosine's rate, as in a resumed run, whose optimizer state carries the rate it was stopped at.
    return LambdaLR(optimizer, lambda step: first(step) if step <= config.lr_rewarm_step else then(step))
