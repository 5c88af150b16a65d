"""Teachers for context distillation: the toy world's scripted oracle, or any causal LM directory.

A teacher answers a batch of turn requests, each the dialogue so far with the instruction appended to
every user message, with `k` candidate replies per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_gen.toy_world import ToyResponder
from data_gen.user_turns import UserTurn
from gatt.checks import Constraint


@dataclass(frozen=True)
class TurnRequest:
    """One assistant turn to sample: the augmented history ending in a user message, and what it holds."""

    messages: list[dict[str, str]]
    turn: UserTurn
    constraints: Sequence[Constraint]


class Teacher(Protocol):
    """Answers each request with up to `k` candidates; an empty list means the dialogue cannot go on."""

    name: str

    def sample(self, requests: Sequence[TurnRequest], k: int) -> list[list[str]]: ...


class OracleTeacher:
    """The toy world's scripted responder: one deterministic, always-obeying candidate."""

    name = "oracle"

    def __init__(self, catalogue: Sequence[Constraint]) -> None:
        self.responder = ToyResponder(catalogue)

    def sample(self, requests: Sequence[TurnRequest], k: int) -> list[list[str]]:
        """One candidate per request (sampling it k times would give k copies)."""
        return [[self.responder.reply(r.turn, r.constraints)] for r in requests]


class ModelTeacher:
    """A causal LM with a chat template: batched sampling with the KV cache, left padding, k candidates each."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        temperature: float = 0.7,
        top_p: float = 0.95,
        max_new_tokens: int = 64,
        batch_size: int = 16,
        device: str | None = None,
    ) -> None:
        self.name = str(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if not self.tokenizer.chat_template:
            raise ValueError(f"teacher {model_dir} has no chat template: a teacher must be a chat model")
        self.tokenizer.padding_side = "left"  # generation continues every row from its last token
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).to(self.device).eval()
        self.temperature, self.top_p, self.max_new_tokens, self.batch_size = temperature, top_p, max_new_tokens, batch_size
        self.max_prompt = getattr(self.model.config, "max_position_embeddings", 2048) - max_new_tokens

    def sample(self, requests: Sequence[TurnRequest], k: int) -> list[list[str]]:
        """k sampled replies per request; none for a request whose prompt no longer fits the context."""
        prompts = [
            self.tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            for r in requests
        ]
        candidates: list[list[str]] = [[] for _ in requests]
        fits = [i for i, p in enumerate(prompts) if len(p) <= self.max_prompt]
        for start in range(0, len(fits), self.batch_size):
            chunk = fits[start : start + self.batch_size]
            replies = self._generate([prompts[i] for i in chunk], k)
            for row, i in enumerate(chunk):
                candidates[i] = replies[row * k : (row + 1) * k]
        return candidates

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], k: int) -> list[str]:
        batch = self.tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to(self.device)
        output = self.model.generate(
            **batch,
            do_sample=True,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            num_return_sequences=k,
            pad_token_id=self.tokenizer.pad_token_id,
        )  # (len(prompts) * k, prompt + new)
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        return [text.strip() for text in self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]
