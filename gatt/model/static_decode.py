"""A capturable decoding step: a static KV cache and a static mask, written in place.

`ChatBatch` decodes with a cache that grows and a batch that shrinks as rows stop: right for a CPU, where a
step costs its arithmetic. On a GPU a small model's step is a few milliseconds of kernels behind a thousand
launches; what removes the launches is a CUDA graph, one replay of a recorded step, and a graph needs every
tensor the step touches at a fixed address and shape. `decode_step` is such a step. Before a reply,
`StaticBuffers.around` moves each layer's keys and values into buffers with room for the whole reply (the
width rounded up to `bucket` columns, so that later replies reuse the shapes), beside a (B, width) mask; a
step writes its one column of keys, values and mask in place at `column` (a device tensor) and attends over
every column, the unwritten ones masked. It reads nothing to the host and branches on no value, so
`torch.compile(decode_step, fullgraph=True)` takes it whole (tested), and `GraphedStep` records it, eager, as
one CUDA graph per reply and replays it at every step. `ChatBatch(static=True)` decodes this way: rows that
stop keep their place and feed masked padding until the reply ends.

Why record the eager step rather than compile it (`mode="reduce-overhead"`): on an H200
(docs/scaling.md) torch.compile took about 39 s for the first reply and again for the second (a new buffer width),
per model, which cost a report's rollouts more than the graphs saved; a recording costs one step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gatt.model.cache import cache_kwargs
from gatt.model.split_softmax import SplitSoftmax


class StaticCache:
    """Each layer's keys and values in (B, H_kv, width, D) buffers; `update` writes the step's column in place.

    Satisfies the attention module's `KVCache` protocol; `get_seq_length` is the fixed width, so the model sees
    the same shapes at every step.

    Args:
        layers: Each layer's (keys, values) buffers, (B, H_kv, width, D) each.
        column: (1,) long: the column this step writes.
    """

    def __init__(self, layers: list[tuple[Tensor, Tensor]], column: Tensor) -> None:
        self.layers = layers  # each layer's (keys, values), (B, H_kv, width, D)
        self.column = column  # (1,) long: the column this step writes

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        """Write the step's keys and values into the layer's buffers at `column`, in place, in the buffers' dtype.

        Returns the layer's whole (keys, values) buffers, (B, H_kv, width, D) each.

        Args:
            key_states: The step's keys, (B, H_kv, 1, D).
            value_states: The step's values, (B, H_kv, 1, D).
            layer_idx: The layer.
            *args: Ignored.
            **kwargs: Ignored.
        """
        keys, values = self.layers[layer_idx]  # key_states, value_states: (B, H_kv, 1, D)
        keys.index_copy_(2, self.column, key_states.to(keys.dtype))
        values.index_copy_(2, self.column, value_states.to(values.dtype))
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The buffers' fixed width, so the model sees the same shapes at every step.

        Args:
            layer_idx: The layer (default 0).

        Returns:
            The width in columns, written or not.
        """
        return self.layers[layer_idx][0].shape[-2]


def bucketed(columns: int, bucket: int) -> int:
    """`columns` rounded up to a multiple of `bucket`.

    Args:
        columns: A number of columns.
        bucket: The multiple.

    Returns:
        The smallest multiple of `bucket` not below `columns`.
    """
    return -(-columns // bucket) * bucket


@dataclass
class StaticBuffers:
    """One reply's static state: each layer's (keys, values) buffers (B, H_kv, width, D), the (B, width) bool mask,
    and `column`, the (1,) device index of the column the next step writes."""

    layers: list[tuple[Tensor, Tensor]]
    mask: Tensor
    column: Tensor

    @classmethod
    def around(cls, layers: list[tuple[Tensor, Tensor]], mask: Tensor, steps: int, bucket: int = 64) -> StaticBuffers:
        """Buffers holding `layers` and `mask`, with room for `steps` more columns.

        Their width is rounded up to a multiple of `bucket` (later replies reuse the shapes). Every tensor is marked as
        a static address, which a CUDA graph writes in place at every replay.

        Args:
            layers: Each layer's (keys, values), (B, H_kv, T, D) each.
            mask: The attention mask, (B, T).
            steps: The columns to make room for (a reply's most tokens).
            bucket: The width's multiple (default 64).

        Returns:
            The buffers: `layers` and `mask` in the first T columns (the rest zeros, masked out), `column` at T.
        """
        filled = mask.shape[1]
        width = bucketed(filled + steps, bucket)
        buffers = []
        for keys, values in layers:
            pair = (
                keys.new_zeros(*keys.shape[:2], width, keys.shape[-1]),
                values.new_zeros(*values.shape[:2], width, values.shape[-1]),
            )
            pair[0][..., :filled, :] = keys
            pair[1][..., :filled, :] = values
            buffers.append(pair)
        full = torch.zeros(mask.shape[0], width, dtype=torch.bool, device=mask.device)
        full[:, :filled] = mask.bool()
        column = torch.full((1,), filled, dtype=torch.long, device=mask.device)
        # Static addresses: a CUDA graph (torch.compile's "reduce-overhead") writes them in place at every replay,
        # where it would skip graphing a step that mutates ordinary inputs.
        for tensor in (full, column, *(t for pair in buffers for t in pair)):
            torch._dynamo.mark_static_address(tensor)
        return cls(buffers, full, column)


def decode_step(
    model: nn.Module,
    buffers: StaticBuffers,
    tokens: Tensor,
    feeding: Tensor,
    positions: Tensor,
    *,
    pad: int,
    output_attentions: bool = False,
    split_softmax: SplitSoftmax | None = None,
) -> tuple[Tensor, tuple[Tensor, ...] | None]:
    """Write and attend one column: the next logits after the last draws.

    Reads nothing to the host and branches on no value: `torch.compile(decode_step, fullgraph=True)` takes it
    whole. The caller advances `buffers.column` after it.

    Args:
        model: The model (the library's, as `ChatBatch(static=True)` requires).
        buffers: The reply's static state: the mask's column `buffers.column` is set to `feeding`, and each layer's
            keys and values are written there.
        tokens: (B,) the last draws.
        feeding: (B,) bool: the rows that write them.
        positions: (B,) their positions.
        pad: The token id the rows not feeding feed instead (masked).
        output_attentions: Whether to return each layer's attention weights (the probe's).
        split_softmax: The split-softmax boost of the forward call; None: off.

    Returns:
        The next logits (B, V) and, with `output_attentions`, each layer's (B, H, 1, width) weights.
    """
    buffers.mask.index_copy_(1, buffers.column, feeding[:, None])
    output = model(
        input_ids=torch.where(feeding, tokens, pad)[:, None],  # (B, 1)
        attention_mask=buffers.mask[:, None, None, :],  # (B, 1, 1, width)
        position_ids=positions[:, None],  # (B, 1)
        **cache_kwargs(StaticCache(buffers.layers, buffers.column)),  # type: ignore[arg-type]
        use_cache=True,
        output_attentions=output_attentions,
        **({} if split_softmax is None else {"split_softmax": split_softmax}),
    )
    return output.logits[:, -1], output.attentions


class GraphedStep:
    """`decode_step` over one reply's buffers, recorded once as a CUDA graph and replayed at every step.

    A graph replays fixed addresses: the step's inputs (tokens, feeding, positions) are copied into tensors it owns,
    and its outputs (logits, the probe's weights) are the same tensors at every replay, overwritten by the next
    (read them before). Recording runs the step once first, on a side stream (lazy kernel and library set-up cannot
    be recorded); that run writes the column the first replay writes again. On a CPU (`record=False`) no graph is
    recorded and each call runs the step on the owned inputs, as a replay would (what tests check on a CPU).

    Args:
        model: The model, as `decode_step` takes it.
        buffers: The reply's static state (`StaticBuffers.around`).
        pad: The token id the rows not feeding feed instead (masked).
        output_attentions: Whether the step returns each layer's attention weights (the probe's).
        split_softmax: The split-softmax boost of each step; None: off.
        record: Whether to record a CUDA graph (False on a CPU).
    """

    def __init__(
        self,
        model: nn.Module,
        buffers: StaticBuffers,
        *,
        pad: int,
        output_attentions: bool = False,
        split_softmax: SplitSoftmax | None = None,
        record: bool = True,
    ) -> None:
        batch, device = buffers.mask.shape[0], buffers.mask.device
        self.tokens = torch.full((batch,), pad, dtype=torch.long, device=device)  # (B,)
        self.feeding = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        self.positions = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)

        def step() -> tuple[Tensor, tuple[Tensor, ...] | None]:
            return decode_step(
                model,
                buffers,
                self.tokens,
                self.feeding,
                self.positions,
                pad=pad,
                output_attentions=output_attentions,
                split_softmax=split_softmax,
            )

        self.run: Callable[[], tuple[Tensor, tuple[Tensor, ...] | None]] = step
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[Tensor, tuple[Tensor, ...] | None] | None = None  # the same tensors at every call
        if record:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                step()
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outputs = step()

    def __call__(self, tokens: Tensor, feeding: Tensor, positions: Tensor) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """tokens (B,), feeding (B,) bool, positions (B,) -> the next logits (B, V) and the probe's weights, as
        `decode_step` returns them."""
        self.tokens.copy_(tokens)
        self.feeding.copy_(feeding)
        self.positions.copy_(positions)
        if self.graph is not None:
            self.graph.replay()
        else:  # unrecorded: the step's results copied into the same tensors at every call, as a replay writes them
            logits, attentions = self.run()
            if self.outputs is None:
                self.outputs = logits, attentions
            else:
                self.outputs[0].copy_(logits)
                for kept, new in zip(self.outputs[1] or (), attentions or ()):
                    kept.copy_(new)
        assert self.outputs is not None
        return self.outputs
