"""Multi-turn chat generation for a batch of dialogues with one KV cache kept across turns.

`ChatBatch` answers the next turn of several dialogues at once and never re-encodes a history: each
turn feeds only the tokens that are new since the last one (the end of the previous reply, the next
user message, the assistant header). Rows differ in length, so the cache has holes: columns masked out
(attention mask 0) that no query sees, and each row's `position_ids` count its real tokens only. When
the chat template renders the history differently from the tokens the model produced (a reply
re-tokenised differently, a template that rewrites text), the diverging cached tokens become holes too
and the rendered ones are fed instead, so every turn sees exactly the re-encoded history.

With `k > 1` the prompt is encoded once and the cache repeated for k sampled candidates; `keep` then
keeps one candidate per dialogue (rejection sampling) and drops the others' cache rows.
With `split_softmax=STRENGTH`, every forward call boosts each row's attention on its marked tokens (the
instruction) by split-softmax (gatt/split_softmax.py): the cache columns of those tokens are known here.
The attention probe (`measure_attention=True`, for attention that returns its weights: the library's,
or a Hugging Face model loaded with `attn_implementation="gatt"`) gives, for each reply, the share of
attention its tokens put on given prompt tokens (the instruction), per layer, averaged over heads.
"""

from __future__ import annotations

import argparse
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache, DynamicLayer
from transformers.generation import (
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from gatt.cache import cache_kwargs
from gatt.split_softmax import SplitSoftmax


class GrowingLayer(DynamicLayer):
    """A KV cache layer in buffers that double when full.

    `DynamicLayer` concatenates the whole cache at every decoding step, copying O(length) per token; here
    a step writes only its new columns, and `keys` / `values` are views of the filled part."""

    _buffers: tuple[Tensor, Tensor] | None = None  # (B, H_kv, capacity, D) each
    _filled: Tensor | None = None  # the `keys` view this layer last returned

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        # key_states, value_states: (B, H_kv, T_new, D)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        buffers = self._buffers
        # Rebuilt when full, or when `keys` was replaced (batch_select_indices, batch_repeat_interleave, crop, reset).
        if buffers is None or self.keys is not self._filled or buffers[0].shape[-2] < end:
            capacity = max(end, 2 * length, 64)
            buffers = tuple(
                torch.cat([old, new.new_empty(*old.shape[:2], capacity - length, old.shape[-1])], dim=-2)
                if length else new.new_empty(*new.shape[:2], capacity, new.shape[-1])
                for old, new in ((self.keys, key_states), (self.values, value_states))
            )
            self._buffers = buffers
        buffers[0][..., length:end, :] = key_states
        buffers[1][..., length:end, :] = value_states
        self.keys, self.values = buffers[0][..., :end, :], buffers[1][..., :end, :]
        self._filled = self.keys
        return self.keys, self.values


@dataclass(frozen=True)
class Candidate:
    text: str  # decoded, special tokens skipped, stripped
    tokens: list[int]  # generated ids, the end-of-turn token included when one was produced
    attention: list[list[float]] | None  # (layers, heads): mean share on the marked prompt tokens (None: not measured)


@dataclass
class _Row:
    """One cache row: which tokens it holds and where."""

    fed: list[int] = field(default_factory=list)  # token ids in the cache, in order
    columns: list[int] = field(default_factory=list)  # the cache column of each fed token
    marked: list[int] = field(default_factory=list)  # cache columns of the tokens the attention probe measures

    def copy(self) -> "_Row":
        return _Row(list(self.fed), list(self.columns), list(self.marked))


def uses_library_attention(model: PreTrainedModel) -> bool:
    """Whether the model attends with gatt.attention: the library's model, or `attn_implementation="gatt"`."""
    config = model.config
    return config.model_type == "gatt" or getattr(config, "_attn_implementation", None) == "gatt"


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Tokens that end a reply: the generation config's end-of-sequence ids and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class Sampler:
    """Greedy, or temperature + top-p sampling from a seeded generator.

    `repetition_penalty` and `no_repeat_ngram_size` are Hugging Face's logits processors of the same
    names, applied to the reply being written (not to the history): the usual cure for a small model's
    greedy loops ("I am a scientist. I am a scientist. ...").
    """

    def __init__(self, *, do_sample: bool, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                 repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
                 device: torch.device | str = "cpu") -> None:
        self.do_sample = do_sample
        self.processors = LogitsProcessorList(
            ([RepetitionPenaltyLogitsProcessor(repetition_penalty)] if repetition_penalty != 1.0 else [])
            + ([NoRepeatNGramLogitsProcessor(no_repeat_ngram_size)] if no_repeat_ngram_size > 0 else [])
        )
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p)])
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: Tensor, reply: Tensor) -> Tensor:  # (B, V), (B, t) tokens so far -> (B,)
        scores = self.processors(reply, logits.float()) if self.processors else logits
        if not self.do_sample:
            return scores.argmax(-1)
        scores = self.warpers(None, scores.float())
        return torch.multinomial(scores.softmax(-1), 1, generator=self.generator)[:, 0]


def add_sampler_arguments(parser: argparse.ArgumentParser) -> None:
    """The `Sampler` flags every generating command line shares."""
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default: 0.7)")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default: 0.95)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="Hugging Face's repetition penalty over the reply being written; 1.0: off (default)")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=0,
                        help="no n-gram of this size twice in one reply; 0: off (default)")


class ChatBatch:
    """The next turn of several dialogues at a time, each keeping its KV cache from turn to turn."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sampler: Sampler,
        *,
        max_new_tokens: int,
        measure_attention: bool = False,
        split_softmax: float | None = None,
    ) -> None:
        self.model, self.sampler, self.max_new_tokens = model, sampler, max_new_tokens
        self.measure_attention = measure_attention
        if split_softmax is not None and not uses_library_attention(model):
            raise ValueError("split-softmax runs in the library's attention: use a GattForCausalLM, or load the "
                             "Hugging Face model with attn_implementation=\"gatt\"")
        self.split_softmax = split_softmax  # strength: boost the attention on each row's marked tokens
        self.stops = stop_token_ids(model, tokenizer)
        self.tokenizer = tokenizer
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.cache = Cache(layer_class_to_replicate=GrowingLayer)
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=model.device)  # (rows, columns): 1 = a real token
        self.keys: list[Hashable] = []  # the dialogue in each cache row, in cache order
        self.rows: list[_Row] = []
        self.k = 1  # candidates per dialogue in the cache now

    def __contains__(self, key: Hashable) -> bool:
        return key in self.keys

    @torch.no_grad()
    def generate(
        self, prompts: Mapping[Hashable, Sequence[int]], k: int = 1, marked: Mapping[Hashable, Sequence[int]] | None = None
    ) -> dict[Hashable, list[Candidate]]:
        """k candidates for each dialogue in `prompts` (its whole rendered history, ready for the reply).

        A dialogue seen before must have kept one candidate (`keep`, implicit for k=1); a new key adds a
        row. Dialogues left out of `prompts` are dropped. `marked`: indices into a prompt of the tokens
        the attention probe measures, for new dialogues.
        """
        if self.k != 1:
            raise RuntimeError("call keep() to choose one candidate per dialogue before the next turn")
        self._select([i for i, key in enumerate(self.keys) if key in prompts])
        for key in prompts:
            if key not in self.keys:
                self._add_row(key)
        segments = []
        for i, key in enumerate(self.keys):
            row, ids = self.rows[i], list(prompts[key])
            same = _common_prefix(row.fed, ids)
            self.mask[i, row.columns[same:]] = 0  # the template rendered something else here: mask it out
            del row.fed[same:], row.columns[same:]
            if not row.fed and marked and key in marked:
                row.marked = list(marked[key])  # prompt indices for now; cache columns once fed
            segments.append(ids[same:])
        logits = self._prefill(segments)
        if k > 1:  # encode each prompt once, then one cache row per candidate
            self.cache.batch_repeat_interleave(k)
            self.mask = self.mask.repeat_interleave(k, dim=0)
            self.keys = [key for key in self.keys for _ in range(k)]
            self.rows = [row.copy() for row in self.rows for _ in range(k)]
            logits = logits.repeat_interleave(k, dim=0)
            self.k = k
        replies, attention = self._decode(logits)
        out: dict[Hashable, list[Candidate]] = {}
        for key, tokens, shares in zip(self.keys, replies, attention):
            content = tokens[:-1] if tokens and tokens[-1] in self.stops else tokens
            text = self.tokenizer.decode(content, skip_special_tokens=True).strip()
            heads = torch.stack(shares).mean(0).tolist() if shares else None  # (steps, layers, heads) -> (layers, heads)
            out.setdefault(key, []).append(Candidate(text, tokens, heads))
        return out

    def keep(self, chosen: Mapping[Hashable, int]) -> None:
        """Keep candidate `chosen[key]` of each dialogue; dialogues left out are dropped."""
        keep = [i for i, key in enumerate(self.keys) if key in chosen and i % self.k == chosen[key]]
        self._select(keep)
        self.k = 1

    def _add_row(self, key: Hashable) -> None:
        if self.cache.get_seq_length() > 0:
            raise ValueError(f"dialogue {key!r} is new, but this batch is under way: start a new ChatBatch for it")
        self.keys.append(key)
        self.rows.append(_Row())
        self.mask = torch.zeros(len(self.keys), 0, dtype=torch.long, device=self.model.device)

    def _select(self, indices: list[int]) -> None:
        if indices == list(range(len(self.keys))):
            return
        if self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(torch.tensor(indices, dtype=torch.long, device=self.model.device))
        self.mask = self.mask[indices]
        self.keys = [self.keys[i] for i in indices]
        self.rows = [self.rows[i] for i in indices]

    def _prefill(self, segments: list[list[int]]) -> Tensor:
        """Feed each row's new tokens so that they end at the last column (left-padded with holes); (B, V) logits."""
        width = max(len(s) for s in segments)
        base = self.mask.shape[1]
        input_ids = torch.full((len(segments), width), self.pad, dtype=torch.long)
        position_ids = torch.zeros(len(segments), width, dtype=torch.long)
        segment_mask = torch.zeros(len(segments), width, dtype=torch.long)
        for i, (row, segment) in enumerate(zip(self.rows, segments)):
            offset = width - len(segment)
            input_ids[i, offset:] = torch.tensor(segment, dtype=torch.long)
            position_ids[i, offset:] = torch.arange(len(row.fed), len(row.fed) + len(segment))
            segment_mask[i, offset:] = 1
            if not row.fed:
                row.marked = [base + offset + j for j in row.marked]
            row.columns += range(base + offset, base + width)
            row.fed += segment
        device = self.model.device
        self.mask = torch.cat([self.mask, segment_mask.to(device)], dim=1)
        output = self.model(
            input_ids=input_ids.to(device), attention_mask=self.mask, position_ids=position_ids.to(device),
            **cache_kwargs(self.cache), use_cache=True, logits_to_keep=1, **self._split_softmax(),
        )
        return output.logits[:, -1]

    def _split_softmax(self) -> dict[str, SplitSoftmax]:
        """The `split_softmax` keyword of a forward call: every row's marked columns (none: nothing to boost)."""
        if self.split_softmax is None:
            return {}
        return {"split_softmax": SplitSoftmax.from_columns(self.split_softmax, [r.marked for r in self.rows], self.model.device)}

    def _decode(self, logits: Tensor) -> tuple[list[list[int]], list[list[Tensor]]]:
        """One token per row and step until every row has stopped; finished rows feed holes."""
        device = self.model.device
        replies: list[list[int]] = [[] for _ in self.rows]
        attention: list[list[Tensor]] = [[] for _ in self.rows]  # per row: one (layers, heads) share per reply token read
        split_softmax = self._split_softmax()  # the rows and their marked columns stay as they are until the reply ends
        finished = [False] * len(self.rows)
        reply = torch.zeros(len(self.rows), 0, dtype=torch.long, device=device)  # (B, step): every row's draws
        for step in range(self.max_new_tokens):
            drawn = self.sampler(logits, reply)  # (B,)
            reply = torch.cat([reply, drawn[:, None]], dim=1)
            tokens = drawn.tolist()
            for i, token in enumerate(tokens):
                if not finished[i]:
                    replies[i].append(token)
                    finished[i] = token in self.stops
            if all(finished) or step == self.max_new_tokens - 1:
                break
            feeding = [not f for f in finished]
            column = self.mask.shape[1]
            for i, row in enumerate(self.rows):
                if feeding[i]:
                    row.fed.append(tokens[i])
                    row.columns.append(column)
            self.mask = torch.cat([self.mask, torch.tensor(feeding, dtype=torch.long, device=device)[:, None]], dim=1)
            output = self.model(
                input_ids=torch.tensor([t if f else self.pad for t, f in zip(tokens, feeding)], device=device)[:, None],
                attention_mask=self.mask,
                position_ids=torch.tensor([len(r.fed) - 1 for r in self.rows], device=device)[:, None],
                **cache_kwargs(self.cache), use_cache=True, output_attentions=self.measure_attention, **split_softmax,
            )
            logits = output.logits[:, -1]
            if self.measure_attention:
                shares = marked_shares(output.attentions, [r.marked for r in self.rows])  # (B, layers, heads)
                for i in range(len(self.rows)):
                    if feeding[i]:
                        attention[i].append(shares[i])
        return replies, attention


def marked_shares(attentions: Sequence[Tensor], columns: Sequence[Sequence[int]]) -> Tensor:
    """(B, layers, heads): each row's attention mass on its marked columns, from the last query, per head."""
    batch, keys = attentions[0].shape[0], attentions[0].shape[-1]
    marked = torch.zeros(batch, keys, device=attentions[0].device)
    for i, cols in enumerate(columns):
        marked[i, list(cols)] = 1.0
    # each layer's weights: (B, H, Tq, K) -> the last query's mass on the marked keys: (B, H)
    return torch.stack([(w[:, :, -1].float() * marked[:, None]).sum(-1) for w in attentions], dim=1).cpu()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
