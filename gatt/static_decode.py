"""A capturable decoding step: a static KV cache and a static mask, written in place.

`ChatBatch` decodes with a cache that grows and a batch that shrinks as rows stop: right for a CPU, where a
step costs its arithmetic. On a GPU a small model's step is a few milliseconds of kernels behind a thousand
launches; what removes the launches is a CUDA graph, one replay of a recorded step, and a graph needs every
tensor the step touches at a fixed address and shape. `decode_step` is such a step. Before a reply,
`StaticBuffers.around` moves each layer's keys and values into buffers with room for the whole reply (the
width rounded up to `bucket` columns, so that later replies reuse the shapes), beside a (B, width) mask; a
step writes its one column of keys, values and mask in place at `column` (a device tensor) and attends over
every column, the unwritten ones masked. It reads nothing to the host and branches on no value, so
`torch.compile(decode_step, fullgraph=True)` takes it whole (tested), and on CUDA `mode="reduce-overhead"`
replays it as a CUDA graph. `ChatBatch(static=True)` decodes this way: rows that stop keep their place and
feed masked padding until the reply ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from gatt.cache import cache_kwargs
from gatt.split_softmax import SplitSoftmax


class StaticCache:
    """Each layer's keys and values in (B, H_kv, width, D) buffers; `update` writes the step's column in place.

    Satisfies the attention module's `KVCache` protocol; `get_seq_length` is the fixed width, so the model sees
    the same shapes at every step."""

    def __init__(self, layers: list[tuple[Tensor, Tensor]], column: Tensor) -> None:
        self.layers = layers  # each layer's (keys, values), (B, H_kv, width, D)
        self.column = column  # (1,) long: the column this step writes

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values = self.layers[layer_idx]  # key_states, value_states: (B, H_kv, 1, D)
        keys.index_copy_(2, self.column, key_states.to(keys.dtype))
        values.index_copy_(2, self.column, value_states.to(values.dtype))
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx][0].shape[-2]


def bucketed(columns: int, bucket: int) -> int:
    """`columns` rounded up to a multiple of `bucket`."""
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
        """Buffers holding `layers` (each (B, H_kv, T, D)) and `mask` (B, T), with room for `steps` more columns,
        their width rounded up to a multiple of `bucket` (later replies reuse the shapes)."""
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
    """Write and attend one column: tokens (B,) the last draws, feeding (B,) bool the rows that write them,
    positions (B,) their positions -> the next logits (B, V) and, with `output_attentions`, each layer's
    (B, H, 1, width) weights. Reads nothing to the host and branches on no value: `torch.compile(decode_step,
    fullgraph=True)` takes it whole. The caller advances `buffers.column` after it."""
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
