"""The decoding step of `ChatBatch` (gatt/model/generation.py): one reply's tokens, drawn for every row at once.

`ChatBatch` holds the state (its cache rows, their tokens and columns, the mask) and the turn (`generate`, `keep`);
`ChatDecoding`, the mixin it inherits, writes a reply into that state, as `GenerationMixin` does for a Hugging Face
model: on the growing cache (stopped rows leave the batch), over static buffers (one capturable step a token), or as
k candidates sharing their dialogue's one cache row. The attention probe (`_Probe`) sums each row's share on its
marked columns on the device while the reply is written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache

from gatt.model.cache import cache_kwargs
from gatt.model.static_decode import GraphedStep, StaticBuffers


@dataclass(frozen=True)
class RowCandidates:
    """The k (`ChatBatch.k`) candidates of each row decoded by `_decode_candidates`, until `keep` chooses: token `s`
    of candidate `c` of a row sits at cache column `start + s * k + c`."""

    start: int  # the first reply column
    fed: list[list[int]]  # (B * k): each candidate's tokens in the cache (its stop token not fed), row-major


@dataclass
class CacheRow:
    """One cache row: which tokens it holds and where."""

    fed: list[int] = field(default_factory=list)  # token ids in the cache, in order
    columns: list[int] = field(default_factory=list)  # the cache column of each fed token
    marked: list[int] = field(default_factory=list)  # cache columns of the tokens the attention probe measures

    def copy(self) -> CacheRow:
        """A copy of the row, with its own lists.

        Returns:
            The new `CacheRow`.
        """
        return CacheRow(list(self.fed), list(self.columns), list(self.marked))


class ChatDecoding:
    """The decoding methods of `ChatBatch`: they read and write the batch's state (these attributes, set by
    `ChatBatch.__init__`) and call its cache bookkeeping (`_cache_rows`, `_compact`, `_split_softmax`)."""

    model: Any
    sampler: Any
    cache: Cache
    mask: Tensor  # (rows, columns): 1 = a real token
    rows: list[CacheRow]
    stops: set[int]
    pad: int
    k: int
    candidates: RowCandidates | None
    max_new_tokens: int
    static: bool
    graphs: bool
    shrink: bool
    measure_attention: bool
    step: Any

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
        self.candidates = RowCandidates(start, fed)
        return replies

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


class _Probe:
    """The attention probe of one reply, on the device: each row's summed share on its marked columns, per layer
    and head, and the number of reply tokens read; read to the host once, when the reply ends."""

    def __init__(self, rows: Sequence[CacheRow], width: int, device: torch.device) -> None:
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
    """Each row's attention mass on its marked columns, from the last query, per head.

    Args:
        attentions: Each layer's attention weights, (B, H, Tq, K).
        marked: (B, K0), 1 on a marked column among the first K0 keys.

    Returns:
        (B, layers, heads), float.
    """
    width = marked.shape[1]
    # each layer's weights: (B, H, Tq, K) -> the last query's mass on the marked keys: (B, H)
    return torch.stack([(w[:, :, -1, :width].float() * marked[:, None]).sum(-1) for w in attentions], dim=1)
