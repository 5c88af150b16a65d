"""The likelihood contrast of the answer gate (gatt/eval/gate.py): how much more likely a reply is after its own
question than after other questions, from a chat model, batched. Each question's prompt is encoded once and its KV
cache shared by every reply scored after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from gatt.model.cache import cache_kwargs

RELEVANCE_TOKENS = 64  # reply tokens scored (the start of a reply says most about what it answers)


class RelevanceScorer:
    """Log-likelihoods of replies after single-turn questions, from a chat model, batched."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int | None = None,
        max_reply_tokens: int = RELEVANCE_TOKENS,
        progress: bool = False,
    ) -> None:
        """Score with `model`, caching each question's prompt and each (question, reply) score.

        Args:
            model: the chat model (put in eval mode).
            tokenizer: its tokenizer, with a chat template.
            batch_size: replies scored in one pass; by default 16 on the CPU and 128 on a GPU (a report's gate ran
                1,162 batches of 16 in 65 s on an H100, latency-bound).
            max_reply_tokens: how many of a reply's first tokens are scored.
            progress: a progress bar over the batches of a call that has several (a report's whole gate).

        Raises:
            ValueError: when the tokenizer has no chat template.
        """
        if not tokenizer.chat_template:
            raise ValueError("the relevance scorer needs a chat model (a tokenizer with a chat template)")
        self.model, self.tokenizer = model.eval(), tokenizer
        if batch_size is None:
            batch_size = 16 if model.device.type == "cpu" else 128
        self.batch_size, self.max_reply_tokens, self.progress = batch_size, max_reply_tokens, progress
        self._prompts: dict[str, list[int]] = {}
        self._scores: dict[tuple[str, str], tuple[float, int]] = {}  # a reply is often scored again (sweeps, reruns)

    def _prompt(self, question: str) -> list[int]:
        if question not in self._prompts:
            chat = [{"role": "user", "content": question}]
            self._prompts[question] = list(
                self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
            )
        return self._prompts[question]

    def log_likelihoods(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, int]]:
        """(sum of log p over the reply's first tokens, their count) for each (question, reply).

        Args:
            pairs: (question, reply) pairs; a pair scored before is not scored again.

        Returns:
            One (sum of log p, token count) per pair, in order; (0.0, 0) for a reply without tokens.
        """
        todo = list(dict.fromkeys(pair for pair in pairs if pair not in self._scores))
        self._scores.update(zip(todo, self._score(todo)))
        return [self._scores[pair] for pair in pairs]

    @torch.no_grad()
    def _score(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, int]]:
        """Each question's prompt is encoded once; its replies are scored on its KV cache, in batches.

        A pair costs its reply tokens only: the prompt (the chat template's system turn and the question,
        about as long as a scored reply) is shared by every reply scored against that question."""
        targets = [
            self.tokenizer(reply, add_special_tokens=False)["input_ids"][: self.max_reply_tokens] for _, reply in pairs
        ]
        questions = list(dict.fromkeys(question for question, _ in pairs))
        rank = {question: n for n, question in enumerate(questions)}
        # Pairs of one question together (their prompt's cache is live only while they are scored), similar lengths
        # next to each other.
        order = sorted((i for i in range(len(pairs)) if targets[i]), key=lambda i: (rank[pairs[i][0]], len(targets[i])))
        out: list[tuple[float, int]] = [(0.0, 0)] * len(pairs)
        prompts: dict[str, _Prompt] = {}
        starts = range(0, len(order), self.batch_size)
        for start in tqdm(starts, desc="relevance", unit="batch", disable=not self.progress or len(starts) < 2):
            batch = order[start : start + self.batch_size]
            needed = list(dict.fromkeys(pairs[i][0] for i in batch))
            prompts = {q: prompts[q] for q in needed if q in prompts}  # earlier questions are done
            prompts.update(self._encode([q for q in needed if q not in prompts]))
            scores = self._score_replies([prompts[pairs[i][0]] for i in batch], [targets[i] for i in batch])
            for i, score in zip(batch, scores):
                out[i] = (score, len(targets[i]))
        return out

    def _encode(self, questions: Sequence[str]) -> dict[str, _Prompt]:
        """Each question's prompt through the model, left-padded in one batch: its per-layer (K, V) and next-token log-probs."""
        if not questions:
            return {}
        ids = [self._prompt(q) for q in questions]
        width = max(len(p) for p in ids)
        input_ids, mask, positions = _left_padded(ids, width, self._pad)
        cache = DynamicCache()
        device = self.model.device
        logits = self.model(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            **cache_kwargs(cache),
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]  # (Q, V)
        logp = logits.float().log_softmax(-1)
        out = {}
        for b, (question, prompt) in enumerate(zip(questions, ids)):
            kv = [
                (layer.keys[b, :, width - len(prompt) :], layer.values[b, :, width - len(prompt) :])
                for layer in cache.layers
            ]
            out[question] = _Prompt(kv, logp[b])  # each layer's (Hkv, P, D) keys and values
        return out

    def _score_replies(self, prompts: Sequence[_Prompt], targets: Sequence[list[int]]) -> list[float]:
        """Sum of log p over each target after its prompt: the first token from the prompt's own log-probs, the
        rest from one forward pass of the targets (all but their last token) over the prompts' caches."""
        batch, device = len(targets), self.model.device
        width = max(p.length for p in prompts)
        cache = DynamicCache()
        for layer in range(len(prompts[0].kv)):
            keys, values = (torch.stack([_left_pad(p.kv[layer][n], width) for p in prompts]) for n in (0, 1))
            cache.update(keys, values, layer)  # (B, Hkv, width, D), left-padded
        prompt_mask = torch.stack([torch.arange(width) >= width - p.length for p in prompts]).long()  # (B, width)
        fed = [t[:-1] for t in targets]
        length = max(len(t) for t in fed)
        first = [float(p.logp[t[0]]) for p, t in zip(prompts, targets)]
        if length == 0:
            return first
        input_ids = torch.full((batch, length), self._pad, dtype=torch.long)  # (B, R): right-padded
        reply_mask = torch.zeros(batch, length, dtype=torch.long)
        for b, tokens in enumerate(fed):
            input_ids[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            reply_mask[b, : len(tokens)] = 1
        positions = torch.tensor([p.length for p in prompts])[:, None] + torch.arange(length)  # (B, R)
        mask = torch.cat([prompt_mask, reply_mask], dim=1)  # (B, width + R)
        logits = self.model(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            **cache_kwargs(cache),
            use_cache=True,
        ).logits  # (B, R, V)
        predicted = torch.full((batch, length), self._pad, dtype=torch.long)  # the token each position predicts
        for b, tokens in enumerate(targets):
            predicted[b, : len(tokens) - 1] = torch.tensor(tokens[1:], dtype=torch.long)
        logp = logits.float().log_softmax(-1).gather(-1, predicted[..., None].to(device))[..., 0].cpu()  # (B, R)
        return [first[b] + float(logp[b, : len(fed[b])].sum()) for b in range(batch)]

    @property
    def _pad(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


@dataclass(frozen=True)
class _Prompt:
    """A question's prompt through the scorer: each layer's (K, V) of shape (Hkv, P, D), and the first reply
    token's log-probs (V,)."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    logp: torch.Tensor

    @property
    def length(self) -> int:
        return self.kv[0][0].shape[-2]


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """(..., P, D) -> (..., width, D) with zeros in front."""
    return torch.nn.functional.pad(tensor, (0, 0, width - tensor.shape[-2], 0))


def _left_padded(
    sequences: Sequence[Sequence[int]], width: int, pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), each (B, width), for token lists left-padded to `width`."""
    input_ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    positions = torch.zeros(len(sequences), width, dtype=torch.long)
    for b, tokens in enumerate(sequences):
        offset = width - len(tokens)
        input_ids[b, offset:] = torch.tensor(tokens, dtype=torch.long)
        mask[b, offset:] = 1
        positions[b, offset:] = torch.arange(len(tokens))
    return input_ids, mask, positions
