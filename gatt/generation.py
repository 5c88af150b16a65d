"""Multi-turn chat generation for a batch of dialogues with one KV cache kept across turns.

`ChatBatch` answers the next turn of several dialogues at once and never re-encodes a history: each
turn feeds only the tokens that are new since the last one (the end of the previous reply, the next
user message, the assistant header). Rows differ in length, so the cache has holes: columns masked out
(attention mask 0) that no query sees, and each row's `position_ids` count its real tokens only. When
the chat template renders the history differently from the tokens the model produced (a reply
re-tokenised differently, a template that rewrites text), the diverging cached tokens become holes too
and the rendered ones are fed instead, so every turn sees exactly the re-encoded history.

A row that has stopped (its end-of-turn token drawn) leaves the decoding batch, its cache row set
aside, so the steps until the longest reply ends compute only the rows still writing; at the turn's end
every row goes back into one cache with its real columns packed to the left (`shrink`, the default;
the same tokens as decoding every row to the end, tested).

A decoding step reads the device once (its drawn tokens); which rows have stopped, their positions, the next
mask column and the attention probe's sums stay on the device (tests/test_generation.py counts it). With
`static=True` (or `compile_step`) a reply decodes over preallocated buffers, one capturable step a token, for
`torch.compile` and CUDA graphs (gatt/static_decode.py; `decoder_options` picks the path for a device).

With `k > 1` the prompt is encoded once for k sampled candidates, and `keep` then keeps one candidate per dialogue
(rejection sampling). On the library's model the k candidates decode as k queries of their dialogue's one cache row
(`_decode_candidates`): each step writes their k tokens to k new columns of that row, and a mask lets each candidate
see the history and its own columns only. Every candidate's query reads the history's keys once for all k, not k
copies of them, and no cache row is repeated; `keep` gathers the kept candidate's columns to the end of the
history. Elsewhere (another model, the static decoder, the attention probe or split-softmax) the cache rows are
repeated k times and the unkept ones dropped.
With `split_softmax=STRENGTH`, every forward call boosts each row's attention on its marked tokens (the
instruction) by split-softmax (gatt/split_softmax.py): the cache columns of those tokens are known here.
The attention probe (`measure_attention=True`, for attention that returns its weights: the library's,
or a Hugging Face model loaded with `attn_implementation="gatt"`) gives, for each reply, the share of
attention its tokens put on given prompt tokens (the instruction), per layer, averaged over heads.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.cache_utils import Cache, DynamicLayer
from transformers.generation import (
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from gatt.cache import cache_kwargs
from gatt.config import arg
from gatt.split_softmax import SplitSoftmax
from gatt.static_decode import GraphedStep, StaticBuffers, decode_step


class GrowingLayer(DynamicLayer):
    """A KV cache layer in buffers that grow by a quarter when full.

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
        # A quarter more room, not double: copies stay amortised O(1) per token, and a teacher's k x batch rows of
        # 2,000-token SmolLM2 histories (~6 GB) no longer need 12 GB beside the copy they replace (24 GB ran out).
        if buffers is None or self.keys is not self._filled or buffers[0].shape[-2] < end:
            capacity = max(end, length + length // 4, 64)
            buffers = tuple(
                torch.cat([old, new.new_empty(*old.shape[:2], capacity - length, old.shape[-1])], dim=-2)
                if length
                else new.new_empty(*new.shape[:2], capacity, new.shape[-1])
                for old, new in ((self.keys, key_states), (self.values, value_states))
            )
            self._buffers = buffers
        buffers[0][..., length:end, :] = key_states
        buffers[1][..., length:end, :] = value_states
        self.keys, self.values = buffers[0][..., :end, :], buffers[1][..., :end, :]
        self._filled = self.keys
        return self.keys, self.values

    def keep_rows(self, rows: Tensor) -> None:
        """Keep these batch rows (a device index, ascending): one `index_select` per buffer, room for more kept."""
        if self._buffers is None or self.keys is not self._filled:
            self.batch_select_indices(rows)
            return
        length = self.get_seq_length()
        self._buffers = tuple(buffer.index_select(0, rows) for buffer in self._buffers)
        self.keys, self.values = self._buffers[0][..., :length, :], self._buffers[1][..., :length, :]
        self._filled = self.keys

    def adopt(self, keys: Tensor, values: Tensor, end: int) -> None:
        """Hold these buffers (B, H_kv, capacity, D), their first `end` columns filled (a static decode's)."""
        self._buffers = (keys, values)
        self.keys, self.values = keys[..., :end, :], values[..., :end, :]
        self._filled = self.keys

    def gather_columns(self, start: int, index: Tensor) -> None:
        """Columns `start`, `start` + 1, ... of each row take that row's columns `index` (B, W) (each >= `start`), in
        order; the cache ends at `start` + W. In place: a kept candidate's reply moves next to its history."""
        if self._buffers is None or self.keys is not self._filled:
            self.assign(self.keys, self.values, 0)  # into buffers of its own
        assert self._buffers is not None
        width = index.shape[1]
        for buffer in self._buffers:  # (B, H_kv, capacity, D)
            picked = index[:, None, :, None].expand(-1, buffer.shape[1], -1, buffer.shape[-1])  # (B, H_kv, W, D)
            buffer[..., start : start + width, :] = buffer.gather(2, picked)
        self.keys, self.values = (buffer[..., : start + width, :] for buffer in self._buffers)
        self._filled = self.keys

    def assign(self, keys: Tensor, values: Tensor, spare: int) -> None:
        """Hold `keys` / `values` (B, H_kv, T, D) from now on, in buffers with room for `spare` more columns."""
        buffers = tuple(t.new_empty(*t.shape[:2], t.shape[-2] + spare, t.shape[-1]) for t in (keys, values))
        buffers[0][..., : keys.shape[-2], :] = keys
        buffers[1][..., : values.shape[-2], :] = values
        self._buffers = buffers
        self.keys, self.values = buffers[0][..., : keys.shape[-2], :], buffers[1][..., : values.shape[-2], :]
        self._filled = self.keys


@dataclass(frozen=True)
class Candidate:
    text: str  # decoded, special tokens skipped, stripped
    tokens: list[int]  # generated ids, the end-of-turn token included when one was produced
    attention: list[list[float]] | None  # (layers, heads): mean share on the marked prompt tokens (None: not measured)


@dataclass(frozen=True)
class _Candidates:
    """The k (`ChatBatch.k`) candidates of each row decoded by `_decode_candidates`, until `keep` chooses: token `s`
    of candidate `c` of a row sits at cache column `start + s * k + c`."""

    start: int  # the first reply column
    fed: list[list[int]]  # (B * k): each candidate's tokens in the cache (its stop token not fed), row-major


@dataclass
class _Row:
    """One cache row: which tokens it holds and where."""

    fed: list[int] = field(default_factory=list)  # token ids in the cache, in order
    columns: list[int] = field(default_factory=list)  # the cache column of each fed token
    marked: list[int] = field(default_factory=list)  # cache columns of the tokens the attention probe measures

    def copy(self) -> _Row:
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


class NucleusWarper(LogitsProcessor):
    """Top-p (nucleus) filtering that keeps Hugging Face's `TopPLogitsWarper` set without sorting the vocabulary.

    A token stays when the probability mass of the tokens more likely than it is below `top_p` (the most
    likely token always stays): the smallest most-likely set whose mass reaches `top_p`. The set is
    found among each row's `candidates` most likely tokens (`topk`, linear in the vocabulary) where they
    hold `top_p` of the mass; a row whose mass is spread wider falls back to the full sort. Sorting all
    49,152 tokens of SmolLM2's vocabulary for 64 rows at every step was most of a teacher's sampling time.
    The kept set equals `TopPLogitsWarper`'s up to float rounding of a token whose mass sits exactly on
    the boundary (tested on random rows)."""

    def __init__(self, top_p: float, candidates: int = 1024) -> None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.top_p, self.candidates = top_p, candidates
        self.fallback = TopPLogitsWarper(top_p)

    def __call__(self, input_ids: Tensor | None, scores: Tensor) -> Tensor:  # (B, V) -> (B, V)
        if self.top_p >= 1.0:
            return scores
        probs = scores.float().softmax(-1)  # (B, V)
        top, index = probs.topk(min(self.candidates, scores.shape[-1]), dim=-1)  # (B, k), most likely first
        keep = top.cumsum(-1) - top < self.top_p  # the mass of the tokens before each is below top_p
        keep[:, 0] = True
        out = torch.full_like(scores, float("-inf")).scatter(
            1, index, scores.gather(1, index).masked_fill(~keep, float("-inf"))
        )
        wide = top.sum(-1) < self.top_p  # (B,): the nucleus reaches past the candidates
        if wide.any():
            out[wide] = self.fallback(input_ids, scores[wide])
        return out


class Sampler:
    """Greedy, or temperature + top-p sampling from a seeded generator.

    `repetition_penalty` and `no_repeat_ngram_size` are Hugging Face's logits processors of the same
    names, applied to the reply being written (not to the history): the usual cure for a small model's
    greedy loops ("I am a scientist. I am a scientist. ...").
    """

    def __init__(
        self,
        *,
        do_sample: bool,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.do_sample = do_sample
        self.processors = LogitsProcessorList(
            ([RepetitionPenaltyLogitsProcessor(repetition_penalty)] if repetition_penalty != 1.0 else [])
            + ([NoRepeatNGramLogitsProcessor(no_repeat_ngram_size)] if no_repeat_ngram_size > 0 else [])
        )
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), NucleusWarper(top_p)])
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: Tensor, reply: Tensor) -> Tensor:  # (B, V), (B, t) tokens so far -> (B,)
        scores = self.processors(reply, logits.float()) if self.processors else logits
        if not self.do_sample:
            return scores.argmax(-1)
        scores = self.warpers(None, scores.float())
        return torch.multinomial(scores.softmax(-1), 1, generator=self.generator)[:, 0]


MAX_NEW_TOKENS = 64  # a reply's length limit in tokens, wherever replies are generated (teacher, report, GRPO)

# The `Sampler` flags' built-in defaults: what a flag not given takes when the model folder's
# generation_config.json does not set it (as `generate()` reads its defaults from that file).
SAMPLER_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.7,
    "top_p": 0.95,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
}
FLAG_GIVEN, BUILT_IN = "command line", "built-in default"  # sources of a sampler setting besides the folder's file


def sampler_flags(folder: str) -> type:
    """A dataclass of the four sampler settings as command-line fields (gatt/config.py), each None unless given:
    `sampler_settings` then reads it from `folder` generation_config.json, else takes SAMPLER_DEFAULTS. A command's
    config inherits it, so every generating command has the same flags, each default named once."""
    what = {
        "temperature": "sampling temperature",
        "top_p": "nucleus sampling mass",
        "repetition_penalty": "Hugging Face's repetition penalty over the reply being written; 1.0: off",
        "no_repeat_ngram_size": "no n-gram of this size twice in one reply; 0: off",
    }
    fields = [
        (
            key,
            type(default) | None,
            arg(None, f"{what[key]} (default: {folder} generation_config.json, else {default})"),
        )
        for key, default in SAMPLER_DEFAULTS.items()
    ]
    return dataclasses.make_dataclass("SamplerFlags", fields, kw_only=True)


def generation_config_file(folder: str | Path) -> Path:
    """Where a model folder's generation config is (a .gguf file: its folder's)."""
    folder = Path(folder)
    return (folder.parent if folder.suffix == ".gguf" else folder) / "generation_config.json"


def folder_sampler_settings(folder: str | Path) -> dict[str, float | int]:
    """The sampler settings that `folder`'s generation_config.json sets; {} without the file. Only the keys the
    file gives: transformers leaves the others None."""
    path = generation_config_file(folder)
    if not path.is_file():
        return {}
    config = GenerationConfig.from_pretrained(path.parent)
    values = {key: getattr(config, key, None) for key in SAMPLER_DEFAULTS}
    return {key: type(SAMPLER_DEFAULTS[key])(v) for key, v in values.items() if v is not None}


def sampler_settings(
    given: Mapping[str, Any], folder: str | Path | None
) -> tuple[dict[str, float | int], dict[str, str]]:
    """Each sampler setting's value (in `given`, the command line's settings, and not None; else set by `folder`'s
    generation_config.json; else SAMPLER_DEFAULTS; no folder: an oracle, no file to read) and where each came from."""
    read = folder_sampler_settings(folder) if folder is not None else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, built_in in SAMPLER_DEFAULTS.items():
        if given.get(key) is not None:
            values[key], sources[key] = given[key], FLAG_GIVEN
        elif key in read:
            values[key], sources[key] = read[key], str(generation_config_file(folder))
        else:
            values[key], sources[key] = built_in, BUILT_IN
    return values, sources


DECODERS: tuple[str, ...] = ("auto", "growing", "static", "graphs", "compiled")


def decoder_options(model: PreTrainedModel, decoder: str) -> dict[str, Any]:
    """`ChatBatch` keywords of a decoder: growing (the cache grows, stopped rows leave: a CPU's fastest), static
    (preallocated buffers, gatt/static_decode.py), graphs (static, the eager step recorded as one CUDA graph a reply
    and replayed), compiled (static, `torch.compile(mode="reduce-overhead")`: fused kernels in CUDA graphs, after a
    compile of about 39 s per buffer width and model); auto: graphs on a GPU for the library's model, else growing."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    static_ok = model.config.model_type == "gatt" and getattr(model.config, "attention_window", None) is None
    if decoder == "auto":
        decoder = "graphs" if model.device.type == "cuda" and static_ok else "growing"
    if decoder in ("graphs", "compiled") and model.device.type != "cuda":
        raise ValueError(
            f"decoder {decoder} replays CUDA graphs: the model is on {model.device} (use static or growing)"
        )
    return {
        "growing": {},
        "static": {"static": True},
        "graphs": {"graphs": True},
        "compiled": {"compile_step": {"mode": "reduce-overhead"}},
    }[decoder]


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
        shrink: bool = True,
        static: bool = False,
        compile_step: dict[str, Any] | None = None,
        graphs: bool = False,
    ) -> None:
        self.model, self.sampler, self.max_new_tokens = model, sampler, max_new_tokens
        self.shrink = shrink  # drop stopped rows from decoding, compact the cache each turn (False: the older path)
        # static: decode over preallocated buffers with capturable steps (gatt/static_decode.py); compile_step: the
        # torch.compile keywords of that step, e.g. {"mode": "reduce-overhead"}; graphs: the step recorded as a CUDA
        # graph a reply (GraphedStep; on a CPU run as a replay would, unrecorded)
        self.static = static or compile_step is not None or graphs
        if self.static and (model.config.model_type != "gatt" or model.config.attention_window is not None):
            raise ValueError("static decoding needs the library's model (GattForCausalLM) without an attention window")
        self.graphs = graphs
        self.step = decode_step if compile_step is None else torch.compile(decode_step, fullgraph=True, **compile_step)
        self.measure_attention = measure_attention
        if split_softmax is not None and not uses_library_attention(model):
            raise ValueError(
                "split-softmax runs in the library's attention: use a GattForCausalLM, or load the "
                'Hugging Face model with attn_implementation="gatt"'
            )
        self.split_softmax = split_softmax  # strength: boost the attention on each row's marked tokens
        self.stops = stop_token_ids(model, tokenizer)
        self.tokenizer = tokenizer
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.cache = Cache(layer_class_to_replicate=GrowingLayer)
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=model.device)  # (rows, columns): 1 = a real token
        self.keys: list[Hashable] = []  # the dialogue in each cache row, in cache order
        self.rows: list[_Row] = []
        self.k = 1  # candidates per dialogue in the cache now
        self.candidates: _Candidates | None = None  # candidates sharing their row, until `keep`

    def __contains__(self, key: Hashable) -> bool:
        return key in self.keys

    @torch.no_grad()
    def generate(
        self,
        prompts: Mapping[Hashable, Sequence[int]],
        k: int = 1,
        marked: Mapping[Hashable, Sequence[int]] | None = None,
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
            segment = new_tokens(row.fed, row.columns, self.mask[i], ids)
            if not row.fed and marked and key in marked:
                row.marked = list(marked[key])  # prompt indices for now; cache columns once fed
            segments.append(segment)
        logits = self._prefill(segments)
        keys = [key for key in self.keys for _ in range(k)]  # each candidate's dialogue
        if k > 1 and self._shares_rows():
            replies, attention = self._decode_candidates(logits, k), [None] * len(keys)
        else:
            if k > 1:  # encode each prompt once, then one cache row per candidate
                self.cache.batch_repeat_interleave(k)
                self.mask = self.mask.repeat_interleave(k, dim=0)
                self.keys = keys
                self.rows = [row.copy() for row in self.rows for _ in range(k)]
                logits = logits.repeat_interleave(k, dim=0)
            replies, attention = self._decode(logits)
        self.k = k
        out: dict[Hashable, list[Candidate]] = {}
        for key, tokens, heads in zip(keys, replies, attention):
            content = tokens[:-1] if tokens and tokens[-1] in self.stops else tokens
            text = self.tokenizer.decode(content, skip_special_tokens=True).strip()
            out.setdefault(key, []).append(Candidate(text, tokens, heads))
        return out

    def keep(self, chosen: Mapping[Hashable, int]) -> None:
        """Keep candidate `chosen[key]` of each dialogue; dialogues left out are dropped."""
        if self.candidates is not None:
            self._keep_candidates(chosen)
        else:
            self._select([i for i, key in enumerate(self.keys) if key in chosen and i % self.k == chosen[key]])
        self.k = 1

    def _shares_rows(self) -> bool:
        """Whether k candidates decode in their dialogue's one cache row (`_decode_candidates`): the library's model
        (a 4-D mask used as is) on the growing decoder, without the probe or split-softmax."""
        config = self.model.config
        return (
            config.model_type == "gatt"
            and config.attention_window is None
            and not self.static
            and not self.measure_attention
            and self.split_softmax is None
        )

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
            input_ids=input_ids.to(device),
            attention_mask=self.mask,
            position_ids=position_ids.to(device),
            **cache_kwargs(self.cache),
            use_cache=True,
            logits_to_keep=1,
            **self._split_softmax(),
        )
        return output.logits[:, -1]

    def _split_softmax(self, rows: Sequence[int] | None = None) -> dict[str, SplitSoftmax]:
        """The `split_softmax` keyword of a forward call on `rows` (default: all): their marked columns."""
        if self.split_softmax is None:
            return {}
        chosen = self.rows if rows is None else [self.rows[i] for i in rows]
        return {
            "split_softmax": SplitSoftmax.from_columns(
                self.split_softmax, [r.marked for r in chosen], self.model.device
            )
        }

    def _decode(self, logits: Tensor) -> tuple[list[list[int]], list[list[list[float]] | None]]:
        return self._decode_static(logits) if self.static else self._decode_growing(logits)

    def _decode_static(self, logits: Tensor) -> tuple[list[list[int]], list[list[list[float]] | None]]:
        """`_decode` over static buffers: every row stays until the reply ends (a stopped row feeds masked padding
        and keeps its last logits), each step one `decode_step` (compiled with `compile_step`, or replayed as a CUDA
        graph with `graphs`); the same device reads as `_decode_growing`: one per step."""
        device = self.model.device
        batch = len(self.rows)
        replies: list[list[int]] = [[] for _ in self.rows]
        finished = [False] * batch
        stops = torch.tensor(sorted(self.stops), device=device)  # (S,)
        stopped_rows = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        fed = torch.tensor([len(row.fed) for row in self.rows], device=device)  # (B,)
        rows = torch.arange(batch, device=device)
        layers = [(layer.keys, layer.values) for layer in self.cache.layers]
        buffers = StaticBuffers.around(layers, self.mask, self.max_new_tokens)
        split = self._split_softmax().get("split_softmax")
        probe = _Probe(self.rows, self.mask.shape[1], device) if self.measure_attention else None
        options = {"pad": self.pad, "output_attentions": self.measure_attention, "split_softmax": split}
        step: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, tuple[Tensor, ...] | None]] = (
            GraphedStep(self.model, buffers, record=device.type == "cuda", **options)
            if self.graphs
            else functools.partial(self.step, self.model, buffers, **options)
        )
        reply = torch.zeros(batch, self.max_new_tokens, dtype=torch.long, device=device)  # (B, steps)
        written = self.mask.shape[1]
        for index in range(self.max_new_tokens):
            drawn, tokens = self._draw(logits, reply, index, replies, finished)
            if all(finished) or index == self.max_new_tokens - 1:
                break
            stopped_rows |= torch.isin(drawn, stops)
            feeding = ~stopped_rows  # (B,)
            for i, row in enumerate(self.rows):
                if not finished[i]:
                    row.fed.append(tokens[i])
                    row.columns.append(written)
            fed += feeding
            new_logits, attentions = step(drawn, feeding, fed - 1)
            buffers.column += 1
            written += 1
            logits = torch.where(feeding[:, None], new_logits, logits)  # stopped rows keep their last logits
            if probe is not None:
                probe.add(attentions, rows, feeding)
        for layer, (keys, values) in zip(self.cache.layers, buffers.layers):
            layer.adopt(keys, values, written)
        self.mask = buffers.mask[:, :written].long()
        if self.shrink and 4 * sum(written - len(row.columns) for row in self.rows) >= self.mask.numel():
            self._compact([(list(range(batch)), self._cache_rows(None))])  # a quarter of the cache holes
        return replies, probe.means() if probe is not None else [None] * batch

    def _decode_growing(self, logits: Tensor) -> tuple[list[list[int]], list[list[list[float]] | None]]:
        """One token per row and step until every row has stopped: each row's tokens and its probe shares.

        With `shrink`, rows that have stopped leave the decoding batch (their cache rows set aside) once
        they are an eighth of it, so later steps compute only the rows still writing; when the reply
        ends, `_compact` puts every row back with its real columns packed to the left (also when holes
        are a quarter of the cache, so that later turns do not attend over them). Without it,
        stopped rows feed holes until the longest reply ends. Every row is drawn at every step either
        way (a stopped row from its last logits), so a seeded sampler draws the same tokens.

        A step reads the device once (its drawn tokens, for the host's bookkeeping and the stop test) and
        creates no tensor from host data: which rows still feed, their positions, the next mask column and
        the attention probe's sums stay on the device. Tensors from host lists are made only when rows
        leave (once per eighth of the batch) and once per turn."""
        device = self.model.device
        batch = len(self.rows)
        replies: list[list[int]] = [[] for _ in self.rows]
        finished = [False] * batch  # the host's copy, from each step's one read
        stops = torch.tensor(sorted(self.stops), device=device)  # (S,)
        stopped_rows = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,) the device's copy
        fed = torch.tensor([len(row.fed) for row in self.rows], device=device)  # (B,) tokens in each row's cache
        decoding = list(range(batch))  # the rows in the cache now, in cache order
        index = torch.arange(batch, device=device)  # the same on the device
        parked: list[tuple[list[int], list[tuple[Tensor, Tensor]]]] = []  # rows set aside: indices, each layer's (K, V)
        mask = self.mask  # (len(decoding), columns)
        split_softmax = self._split_softmax()  # the rows and their marked columns stay as they are until the reply ends
        probe = _Probe(self.rows, mask.shape[1], device) if self.measure_attention else None
        reply = torch.zeros(batch, self.max_new_tokens, dtype=torch.long, device=device)  # (B, steps): every draw
        for step in range(self.max_new_tokens):
            drawn, tokens = self._draw(logits, reply, step, replies, finished)
            if all(finished) or step == self.max_new_tokens - 1:
                break
            stopped_rows |= torch.isin(drawn, stops)
            stopped = [j for j, i in enumerate(decoding) if finished[i]]
            if self.shrink and stopped and 8 * len(stopped) >= len(decoding):
                parked.append(([decoding[j] for j in stopped], self._cache_rows(stopped)))
                kept = torch.tensor([j for j, i in enumerate(decoding) if not finished[i]], device=device)
                for layer in self.cache.layers:
                    layer.keep_rows(kept)
                mask, index = mask[kept], index[kept]
                decoding = [i for i in decoding if not finished[i]]
                split_softmax = self._split_softmax(decoding)
                if probe is not None:
                    probe.keep(kept)
            column = mask.shape[1]
            for i in decoding:
                if not finished[i]:
                    self.rows[i].fed.append(tokens[i])
                    self.rows[i].columns.append(column)
            holes = any(len(self.rows[i].columns) <= column for i in decoding)  # a masked-out column: the host knows
            feeding = ~stopped_rows[index]  # (D,)
            fed.index_add_(0, index, feeding.long())
            mask = torch.cat([mask, feeding[:, None].long()], dim=1)
            output = self.model(
                input_ids=torch.where(feeding, drawn[index], self.pad)[:, None],  # (D, 1)
                attention_mask=self._attention_mask(mask, holes),
                position_ids=(fed[index] - 1)[:, None],  # (D, 1)
                **cache_kwargs(self.cache),
                use_cache=True,
                output_attentions=self.measure_attention,
                **split_softmax,
            )
            if len(decoding) == batch:
                logits = output.logits[:, -1]  # (B, V)
            else:
                logits = logits.index_copy(0, index, output.logits[:, -1])  # stopped rows keep their last logits
            if probe is not None:
                probe.add(output.attentions, index, feeding)
        if parked or (
            self.shrink and 4 * sum(mask.shape[1] - len(self.rows[i].columns) for i in decoding) >= mask.numel()
        ):
            self._compact([(decoding, self._cache_rows(None)), *parked])  # rows to put back, or a quarter holes
        else:
            self.mask = mask
        return replies, probe.means() if probe is not None else [None] * batch

    def _decode_candidates(self, logits: Tensor, k: int) -> list[list[int]]:
        """k candidates of every row (B * k, row-major), from its prompt's logits (B, V): the k candidates are k
        queries of their row, each step's k tokens written to k new columns of it, a (B, 1, k, columns) mask showing
        each candidate the history and its own columns. One token per candidate and step until every candidate has
        stopped; a stopped one feeds masked padding and keeps its last logits (drawn from, not written), so a seeded
        sampler draws what it draws over k repeated rows (tested). One device read a step, as `_decode_growing`."""
        device = self.model.device
        batch, start, steps = len(self.rows), self.mask.shape[1], self.max_new_tokens
        count = batch * k
        replies: list[list[int]] = [[] for _ in range(count)]
        finished = [False] * count
        fed: list[list[int]] = [[] for _ in range(count)]
        stops = torch.tensor(sorted(self.stops), device=device)  # (S,)
        stopped = torch.zeros(count, dtype=torch.bool, device=device)  # (B * k,)
        visible = torch.zeros(batch, k, start + k * steps, dtype=torch.bool, device=device)  # (B, k, columns)
        visible[:, :, :start] = self.mask.bool()[:, None, :]  # the history, holes masked
        own = torch.eye(k, dtype=torch.bool, device=device)  # (k, k): a step's column c is candidate c's
        positions = torch.tensor([len(row.fed) for row in self.rows], device=device)[:, None].expand(batch, k)
        logits = logits.repeat_interleave(k, dim=0)  # (B * k, V)
        reply = torch.zeros(count, steps, dtype=torch.long, device=device)  # (B * k, steps): every draw
        for step in range(steps):
            drawn, tokens = self._draw(logits, reply, step, replies, finished)
            if all(finished) or step == steps - 1:
                break
            stopped |= torch.isin(drawn, stops)
            feeding = ~stopped  # (B * k,)
            for i in range(count):
                if not finished[i]:
                    fed[i].append(tokens[i])
            end = start + k * (step + 1)
            visible[:, :, end - k : end] = own & feeding.view(batch, k)[:, :, None]
            output = self.model(
                input_ids=torch.where(feeding, drawn, self.pad).view(batch, k),  # (B, k)
                attention_mask=visible[:, None, :, :end],  # (B, 1, k, end)
                position_ids=positions + step,  # (B, k)
                **cache_kwargs(self.cache),
                use_cache=True,
            )
            logits = torch.where(feeding[:, None], output.logits.reshape(count, -1), logits)  # (B * k, V)
        self.candidates = _Candidates(start, fed)
        return replies

    def _keep_candidates(self, chosen: Mapping[Hashable, int]) -> None:
        """`keep` after `_decode_candidates`: each kept dialogue's chosen candidate's columns gathered, in order, to
        follow its history; the other candidates' columns are dropped (a shorter reply's last columns are holes)."""
        assert self.candidates is not None
        start, k, fed = self.candidates.start, self.k, self.candidates.fed
        self.candidates = None
        rows = [d for d, key in enumerate(self.keys) if key in chosen]
        picks = [d * k + chosen[self.keys[d]] for d in rows]
        width = max((len(fed[i]) for i in picks), default=0)
        device = self.model.device
        index = torch.tensor([[start + s * k + i % k for s in range(width)] for i in picks], dtype=torch.long)
        index = index.view(len(picks), width)  # (B', width), also for no row
        kept = torch.tensor(rows, dtype=torch.long, device=device)
        for layer in self.cache.layers:
            if len(rows) < len(self.keys):
                layer.keep_rows(kept)
            layer.gather_columns(start, index.to(device))
        lengths = torch.tensor([len(fed[i]) for i in picks], device=device)  # (B',)
        written = (torch.arange(width, device=device) < lengths[:, None]).long()  # (B', width)
        self.mask = torch.cat([self.mask[kept], written], dim=1)
        self.keys = [self.keys[d] for d in rows]
        self.rows = [self.rows[d] for d in rows]
        for row, i in zip(self.rows, picks):
            row.columns += range(start, start + len(fed[i]))
            row.fed += fed[i]
        holes = sum(self.mask.shape[1] - len(row.columns) for row in self.rows)
        if self.shrink and self.rows and 4 * holes >= self.mask.numel():
            self._compact([(list(range(len(self.rows))), self._cache_rows(None))])  # a quarter of the cache holes

    def _draw(
        self, logits: Tensor, reply: Tensor, step: int, replies: list[list[int]], finished: list[bool]
    ) -> tuple[Tensor, list[int]]:
        """Step `step`'s token for every row (B,), written into `reply` (B, steps), and read to the host once: each
        row still writing appends it to its reply and stops on a stop token (`replies`, `finished` updated)."""
        drawn = self.sampler(logits, reply[:, :step])  # (B,)
        reply[:, step] = drawn
        tokens = drawn.tolist()  # the step's one read to the host
        for i, token in enumerate(tokens):
            if not finished[i]:
                replies[i].append(token)
                finished[i] = token in self.stops
        return drawn, tokens

    def _attention_mask(self, mask: Tensor, holes: bool) -> Tensor | None:
        """A decoding step's `attention_mask` (D, columns). The library's model would read it to choose its causal
        fast path (no holes) or build a (D, 1, 1, columns) bool mask from it: the host knows which, so the model
        gets None or that mask, and reads nothing. Other models get `mask` as it is."""
        config = self.model.config
        if config.model_type != "gatt" or config.attention_window is not None:
            return mask
        return mask.bool()[:, None, None, :] if holes else None

    def _cache_rows(self, rows: list[int] | None) -> list[tuple[Tensor, Tensor]]:
        """Each layer's (K, V) of these cache rows (None: all of them), (rows, H_kv, columns, D) each."""
        if rows is None:
            return [(layer.keys, layer.values) for layer in self.cache.layers]
        index = torch.tensor(rows, device=self.model.device)
        return [(layer.keys[index], layer.values[index]) for layer in self.cache.layers]

    def _compact(self, groups: list[tuple[list[int], list[tuple[Tensor, Tensor]]]]) -> None:
        """Rebuild the cache from `groups` (row indices and each layer's (K, V) of those rows) in row order,
        each row's real columns packed to the left: the holes of earlier turns are dropped. The groups' layer lists
        are emptied as the layers are packed, so the old rows are freed one layer at a time."""
        device = self.model.device
        width = max(len(row.columns) for row in self.rows)
        spare = self.max_new_tokens + 128  # the next turn's prompt and reply fit without growing
        sources = []
        for indices, layers in groups:
            # each row's real columns, then column 0 for the holes (masked, never seen): one tensor for the group
            columns = torch.tensor([c + [0] * (width - len(c)) for c in (self.rows[i].columns for i in indices)])
            sources.append((torch.tensor(indices, device=device), columns.to(device), layers))
        for layer in self.cache.layers:
            # this layer's old (K, V) of each group, taken out of `sources` (and the caller's `parked`): freed by the
            # next iteration, so the peak is the cache and a layer or two, not two caches
            old = [layers.pop(0) for _, _, layers in sources]
            _, heads, _, head_dim = old[0][0].shape
            shape = (len(self.rows), heads, width, head_dim)  # (B, H_kv, width, D)
            packed = [old[0][0].new_empty(shape) for _ in range(2)]
            for (indices, columns, _), group in zip(sources, old):
                index = columns[:, None, :, None].expand(-1, heads, -1, head_dim)  # (rows, H_kv, width, D)
                for out, tensor in zip(packed, group):
                    out[indices] = tensor.gather(2, index)
            layer.assign(*packed, spare)
        lengths = torch.tensor([len(row.columns) for row in self.rows], device=device)  # (B,)
        self.mask = (torch.arange(width, device=device) < lengths[:, None]).long()  # (B, width): real columns first
        for row in self.rows:
            new_column = {old: new for new, old in enumerate(row.columns)}
            row.marked = [new_column[c] for c in row.marked if c in new_column]
            row.columns = list(range(len(row.columns)))


class _Probe:
    """The attention probe of one reply, on the device: each row's summed share on its marked columns, per layer
    and head, and the number of reply tokens read; read to the host once, when the reply ends."""

    def __init__(self, rows: Sequence[_Row], width: int, device: torch.device) -> None:
        at = [(i, column) for i, row in enumerate(rows) for column in row.marked]
        marked = torch.zeros(len(rows), width)  # (B, columns at the reply's start): 1 on a marked column
        if at:
            marked[tuple(torch.tensor(at).T)] = 1.0
        self.marked = marked.to(device)  # (D, width): the rows decoding now
        self.sums: Tensor | None = None  # (B, layers, heads)
        self.counts = torch.zeros(len(rows), device=device)  # (B,)

    def keep(self, kept: Tensor) -> None:
        self.marked = self.marked[kept]

    def add(self, attentions: Sequence[Tensor], index: Tensor, feeding: Tensor) -> None:
        shares = marked_shares(attentions, self.marked) * feeding[:, None, None]  # (D, layers, heads)
        if self.sums is None:
            self.sums = torch.zeros(len(self.counts), *shares.shape[1:], device=shares.device)
        self.sums.index_add_(0, index, shares)
        self.counts.index_add_(0, index, feeding.float())

    def means(self) -> list[list[list[float]] | None]:
        """Each row's mean share over the reply tokens it read (layers, heads); None for a row that read none."""
        if self.sums is None:
            return [None] * len(self.counts)
        counts = self.counts.tolist()
        means = (self.sums / self.counts.clamp(min=1)[:, None, None]).tolist()
        return [mean if count else None for mean, count in zip(means, counts)]


def marked_shares(attentions: Sequence[Tensor], marked: Tensor) -> Tensor:
    """(B, layers, heads): each row's attention mass on its marked columns (`marked`: (B, K0), 1 on a marked column
    among the first K0 keys), from the last query, per head."""
    width = marked.shape[1]
    # each layer's weights: (B, H, Tq, K) -> the last query's mass on the marked keys: (B, H)
    return torch.stack([(w[:, :, -1, :width].float() * marked[:, None]).sum(-1) for w in attentions], dim=1)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def new_tokens(fed: list[int], columns: list[int], mask: Tensor, ids: Sequence[int]) -> list[int]:
    """The tokens of `ids` (a history as rendered now) past those a cache row already holds (`fed`, at cache
    `columns`): the cached tokens `ids` no longer starts with (the template rendered something else there) are
    masked out of the row's `mask` (columns,) and dropped from `fed` and `columns`."""
    same = common_prefix(fed, ids)
    mask[columns[same:]] = 0
    del fed[same:], columns[same:]
    return list(ids[same:])


def left_padded(segments: Sequence[Sequence[int]], pad: int) -> tuple[Tensor, Tensor]:
    """Token lists as one left-padded block: (ids, mask), (B, longest) each, mask 1 on the real tokens."""
    width = max(len(segment) for segment in segments)
    ids = torch.full((len(segments), width), pad, dtype=torch.long)
    mask = torch.zeros(len(segments), width, dtype=torch.long)
    for i, segment in enumerate(segments):
        if segment:
            ids[i, width - len(segment) :], mask[i, width - len(segment) :] = torch.tensor(segment), 1
    return ids, mask
