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
`torch.compile` and CUDA graphs (gatt/model/static_decode.py; `decoder_options` picks the path for a device).

With `k > 1` the prompt is encoded once for k sampled candidates, and `keep` then keeps one candidate per dialogue
(rejection sampling). On the library's model the k candidates decode as k queries of their dialogue's one cache row
(`_decode_candidates`): each step writes their k tokens to k new columns of that row, and a mask lets each candidate
see the history and its own columns only. Every candidate's query reads the history's keys once for all k, not k
copies of them, and no cache row is repeated; `keep` gathers the kept candidate's columns to the end of the
history. Elsewhere (another model, the static decoder, the attention probe or split-softmax) the cache rows are
repeated k times and the unkept ones dropped.
With `split_softmax=STRENGTH`, every forward call boosts each row's attention on its marked tokens (the
instruction) by split-softmax (gatt/model/split_softmax.py): the cache columns of those tokens are known here.
The attention probe (`measure_attention=True`, for attention that returns its weights: the library's,
or a Hugging Face model loaded with `attn_implementation="gatt"`) gives, for each reply, the share of
attention its tokens put on given prompt tokens (the instruction), per layer, averaged over heads.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.cache_utils import Cache

from gatt.model.cache import GrowingLayer, cache_kwargs
from gatt.model.decoding import CacheRow, ChatDecoding, RowCandidates
from gatt.model.sampling import Sampler
from gatt.model.split_softmax import SplitSoftmax
from gatt.model.static_decode import decode_step


@dataclass(frozen=True)
class Candidate:
    """One candidate reply of a dialogue, as `ChatBatch.generate` returns it.

    Attributes:
        text: The reply decoded, special tokens skipped, stripped.
        tokens: The generated ids, the end-of-turn token included when one was produced.
        attention: (layers, heads): the mean share of attention on the marked prompt tokens (None: not measured).
    """

    text: str  # decoded, special tokens skipped, stripped
    tokens: list[int]  # generated ids, the end-of-turn token included when one was produced
    attention: list[list[float]] | None  # (layers, heads): mean share on the marked prompt tokens (None: not measured)


def uses_library_attention(model: PreTrainedModel) -> bool:
    """Whether the model attends with gatt.model.attention: the library's model, or `attn_implementation="gatt"`.

    Args:
        model: The model.

    Returns:
        True for the library's model (model type `gatt`) or a model loaded with `attn_implementation="gatt"`.
    """
    config = model.config
    return config.model_type == "gatt" or getattr(config, "_attn_implementation", None) == "gatt"


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Tokens that end a reply: the generation config's end-of-sequence ids and the tokenizer's.

    Args:
        model: The model, whose generation config's `eos_token_id` (one id, a list or None) counts.
        tokenizer: The tokenizer, whose `eos_token_id` counts where it has one.

    Returns:
        The token ids.
    """
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


DECODERS: tuple[str, ...] = ("auto", "growing", "static", "graphs", "compiled")


def decoder_options(model: PreTrainedModel, decoder: str) -> dict[str, Any]:
    """`ChatBatch` keywords of a decoder.

    The decoders: growing (the cache grows, stopped rows leave: a CPU's fastest), static (preallocated buffers,
    gatt/model/static_decode.py), graphs (static, the eager step recorded as one CUDA graph a reply and replayed),
    compiled (static, `torch.compile(mode="reduce-overhead")`: fused kernels in CUDA graphs, after a compile of about
    39 s per buffer width and model); auto: graphs on a GPU for the library's model (without an attention window),
    else growing.

    Args:
        model: The model to decode with: its type, attention window and device decide what auto picks.
        decoder: One of DECODERS: auto, growing, static, graphs, compiled.

    Returns:
        The keywords to pass to `ChatBatch` ({} for growing).

    Raises:
        ValueError: When `decoder` is not one of DECODERS, or is graphs or compiled with the model not on a CUDA device.
    """
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


class ChatBatch(ChatDecoding):
    """The next turn of several dialogues at a time, each keeping its KV cache from turn to turn.

    Args:
        model: The model to decode with.
        tokenizer: Its tokenizer: decodes the replies; its pad token (0 where it has none) pads, its end-of-sequence
            token ends a reply (with the model's, `stop_token_ids`).
        sampler: Draws each step's tokens from the logits (and the reply so far).
        max_new_tokens: The most tokens a reply has.
        measure_attention: Whether the attention probe measures each reply's share of attention on its dialogue's
            marked prompt tokens (for attention that returns its weights).
        split_softmax: Strength: every forward call boosts each row's attention on its marked tokens by split-softmax
            (the library's attention only); None: off.
        shrink: Drop stopped rows from decoding and compact the cache each turn (False: the older path).
        static: Decode over preallocated buffers with capturable steps (gatt/model/static_decode.py).
        compile_step: The torch.compile keywords of that step, e.g. {"mode": "reduce-overhead"} (implies `static`);
            None: the step runs eager.
        graphs: Record the step as a CUDA graph a reply (`GraphedStep`; on a CPU run as a replay would, unrecorded);
            implies `static`.

    Raises:
        ValueError: When static decoding (`static`, `compile_step` or `graphs`) is asked of a model other than the
            library's (GattForCausalLM) or one with an attention window, or `split_softmax` of a model that does not
            attend with the library's attention.
    """

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
        # static: decode over preallocated buffers with capturable steps (gatt/model/static_decode.py); compile_step: the
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
        self.rows: list[CacheRow] = []
        self.k = 1  # candidates per dialogue in the cache now
        self.candidates: RowCandidates | None = None  # candidates sharing their row, until `keep`

    def __contains__(self, key: Hashable) -> bool:
        return key in self.keys

    @torch.no_grad()
    def generate(
        self,
        prompts: Mapping[Hashable, Sequence[int]],
        k: int = 1,
        marked: Mapping[Hashable, Sequence[int]] | None = None,
    ) -> dict[Hashable, list[Candidate]]:
        """k candidates for each dialogue in `prompts`.

        A dialogue seen before must have kept one candidate (`keep`, implicit for k=1); a new key adds a
        row. Dialogues left out of `prompts` are dropped.

        Args:
            prompts: Each dialogue's token ids by key: its whole rendered history, ready for the reply.
            k: Candidates sampled per dialogue (default 1); the prompt is encoded once for all k.
            marked: Indices into a prompt of the tokens the attention probe measures (and split-softmax boosts), by key,
                for new dialogues; None: none.

        Returns:
            Each dialogue's k candidates, by key.

        Raises:
            RuntimeError: When the last turn had k > 1 and `keep` has not chosen one candidate per dialogue since.
            ValueError: When a new dialogue comes to a batch under way (start a new ChatBatch for it).
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
        """Keep candidate `chosen[key]` of each dialogue; dialogues left out are dropped.

        Args:
            chosen: The index (0 to k - 1) of each dialogue's kept candidate, by key.
        """
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
        self.rows.append(CacheRow())
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


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists.

    Args:
        a: A token list.
        b: Another token list.

    Returns:
        The number of leading tokens `a` and `b` share.
    """
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def new_tokens(fed: list[int], columns: list[int], mask: Tensor, ids: Sequence[int]) -> list[int]:
    """The tokens of `ids` (a history as rendered now) past those a cache row already holds.

    The cached tokens `ids` no longer starts with (the template rendered something else there) are masked out of
    the row's `mask` and dropped from `fed` and `columns`, in place.

    Args:
        fed: The tokens the row holds, in order.
        columns: The cache column of each token of `fed`.
        mask: The row's attention mask, (columns,): 1 = a real token.
        ids: The history as rendered now.

    Returns:
        The tokens of `ids` past the prefix it shares with `fed`: those to feed.
    """
    same = common_prefix(fed, ids)
    mask[columns[same:]] = 0
    del fed[same:], columns[same:]
    return list(ids[same:])


def left_padded(segments: Sequence[Sequence[int]], pad: int) -> tuple[Tensor, Tensor]:
    """Token lists as one left-padded block.

    Args:
        segments: The token lists, one a row.
        pad: The padding token id.

    Returns:
        (ids, mask), (B, longest) each, mask 1 on the real tokens.
    """
    width = max(len(segment) for segment in segments)
    ids = torch.full((len(segments), width), pad, dtype=torch.long)
    mask = torch.zeros(len(segments), width, dtype=torch.long)
    for i, segment in enumerate(segments):
        if segment:
            ids[i, width - len(segment) :], mask[i, width - len(segment) :] = torch.tensor(segment), 1
    return ids, mask
