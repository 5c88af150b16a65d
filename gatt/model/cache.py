"""The KV caches: the cache's keyword whatever the transformers version, and the growing layer of `ChatBatch`.

transformers 5.24 renamed the cache a model takes and returns from `past_key_values` to `cache`:
`generate()` passes `cache=`, outputs carry `.cache`, and the old name still works for Hugging Face
models with a deprecation warning. A model that takes only one name loses the cache under the other
(it falls into `**kwargs`, and every decoding step then sees only its last token). The library's model
takes both; the project's own calls pass the name the installed transformers uses, so no run warns.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

# "cache" on transformers >= 5.24, "past_key_values" before.
CACHE_KWARG: str = "cache" if "cache" in {f.name for f in fields(CausalLMOutputWithPast)} else "past_key_values"


def cache_kwargs(cache: Cache | None) -> dict[str, Cache | None]:
    """`model(**cache_kwargs(cache))`: the cache under the name the installed transformers uses.

    Args:
        cache: The KV cache to pass, or None.

    Returns:
        `{CACHE_KWARG: cache}`: the cache keyed `cache` (transformers >= 5.24) or `past_key_values` (before).
    """
    return {CACHE_KWARG: cache}


def output_cache(output: Any) -> Cache | None:
    """The cache a model's output carries (`.cache` or `.past_key_values`, by version).

    Args:
        output: A model's forward output.

    Returns:
        Its cache under the installed transformers' name, or None where it has none.
    """
    return getattr(output, CACHE_KWARG, None)


def either_cache(cache: Cache | None, past_key_values: Cache | None) -> Cache | None:
    """One cache from a forward call that may name it either way; both at once is an error.

    Args:
        cache: The cache passed as `cache` (the name since transformers 5.24), or None.
        past_key_values: The cache passed as `past_key_values` (the name before), or None.

    Returns:
        Whichever of the two was given, or None where neither was.

    Raises:
        ValueError: When both are given.
    """
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the KV cache as `cache` or as `past_key_values`, not both")
    return cache if cache is not None else past_key_values


__all__ = ["CACHE_KWARG", "cache_kwargs", "either_cache", "output_cache"]


class GrowingLayer(DynamicLayer):
    """A KV cache layer in buffers that grow by a quarter when full.

    `DynamicLayer` concatenates the whole cache at every decoding step, copying O(length) per token; here
    a step writes only its new columns, and `keys` / `values` are views of the filled part.
    """

    _buffers: tuple[Tensor, Tensor] | None = None  # (B, H_kv, capacity, D) each
    _filled: Tensor | None = None  # the `keys` view this layer last returned

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Write a step's new columns after the filled ones and return the whole cache.

        The buffers are rebuilt when full or when `keys` was replaced since the last update (`batch_select_indices`,
        `batch_repeat_interleave`, `crop`, `reset`), with room for a quarter more columns than were filled (at least
        the new ones, at least 64 in all).

        Args:
            key_states: The step's keys (B, H_kv, T_new, D).
            value_states: The step's values (B, H_kv, T_new, D).

        Returns:
            (keys, values): views of the filled part of the buffers, (B, H_kv, T, D) each.
        """
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
        """Keep these batch rows: one `index_select` per buffer, room for more kept.

        Args:
            rows: The batch rows to keep (a device index, ascending).
        """
        if self._buffers is None or self.keys is not self._filled:
            self.batch_select_indices(rows)
            return
        length = self.get_seq_length()
        self._buffers = tuple(buffer.index_select(0, rows) for buffer in self._buffers)
        self.keys, self.values = self._buffers[0][..., :length, :], self._buffers[1][..., :length, :]
        self._filled = self.keys

    def adopt(self, keys: Tensor, values: Tensor, end: int) -> None:
        """Hold these buffers, their first `end` columns filled (a static decode's).

        Args:
            keys: The key buffer (B, H_kv, capacity, D).
            values: The value buffer (B, H_kv, capacity, D).
            end: The number of filled columns.
        """
        self._buffers = (keys, values)
        self.keys, self.values = keys[..., :end, :], values[..., :end, :]
        self._filled = self.keys

    def gather_columns(self, start: int, index: Tensor) -> None:
        """Columns `start`, `start` + 1, ... of each row take that row's columns `index`, in order.

        The cache ends at `start` + W. In place: a kept candidate's reply moves next to its history.

        Args:
            start: The first column written.
            index: The columns each row takes (B, W), each >= `start`.
        """
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
        """Hold `keys` / `values` from now on, in buffers with room for `spare` more columns.

        Args:
            keys: The keys to hold (B, H_kv, T, D).
            values: The values to hold (B, H_kv, T, D).
            spare: The number of empty columns the buffers keep after them.
        """
        buffers = tuple(t.new_empty(*t.shape[:2], t.shape[-2] + spare, t.shape[-1]) for t in (keys, values))
        buffers[0][..., : keys.shape[-2], :] = keys
        buffers[1][..., : values.shape[-2], :] = values
        self._buffers = buffers
        self.keys, self.values = buffers[0][..., : keys.shape[-2], :], buffers[1][..., : values.shape[-2], :]
        self._filled = self.keys
