"""What `MaskedMultiHeadAttention.forward` accepts: the KV cache protocol and the checks of its arguments.

`check_forward_inputs` raises the forward's ValueErrors for self-attention, cross-attention and
Linformer (gatt/model/attention/module.py), each naming the argument at fault.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from gatt.model.split_softmax import SplitSoftmax


class KVCache(Protocol):
    """What the module needs of a cache: Hugging Face's `DynamicCache` and friends satisfy it."""

    def update(
        self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        """Append a layer's new keys and values to the cache.

        Args:
            key_states: The new keys, (B, Hkv, T_new, D).
            value_states: The new values, (B, Hkv, T_new, D).
            layer_idx: The layer whose keys and values they are.
            *args: Whatever else the cache takes.
            **kwargs: Whatever else the cache takes.

        Returns:
            The layer's keys and values, the cached ones included.
        """
        ...


def check_forward_inputs(
    hidden_states: Tensor,
    position_embeddings: tuple[Tensor, Tensor] | None,
    mask: Tensor | None,
    is_causal: bool | None,
    past_key_values: KVCache | None,
    spans: list[list[tuple[int, int]]] | None,
    split_softmax: SplitSoftmax | None,
    key_value_states: Tensor | None,
    value_states: Tensor | None,
    key_position_embeddings: tuple[Tensor, Tensor] | None,
    query_padding_mask: Tensor | None,
    *,
    hidden_size: int,
    kdim: int,
    vdim: int,
    linformer: bool,
) -> None:
    """The forward's ValueErrors, each naming the argument at fault (key_padding_mask is checked after the cache).

    The arguments before `hidden_size` are the forward's own.

    Args:
        hidden_states: The queries' source, (B, Tq, hidden_size).
        position_embeddings: RoPE (cos, sin) of the queries (and of the keys in self-attention), or None.
        mask: Bool attention mask, or None.
        is_causal: The forward's `is_causal` (None: its default).
        past_key_values: The KV cache, or None.
        spans: Packed self-attention segments, or None.
        split_softmax: The split-softmax boost, or None.
        key_value_states: Cross-attention's key source, (B, Tk, kdim); None for self-attention.
        value_states: Cross-attention's value source, (B, Tk, vdim), or None.
        key_position_embeddings: Cross-attention's RoPE (cos, sin) of the keys, or None.
        query_padding_mask: (B, Tq), True on real queries, or None.
        hidden_size: The module's width.
        kdim: The module's key source width.
        vdim: The module's value source width.
        linformer: Whether the module has Linformer's E and F.

    Raises:
        ValueError: When `hidden_states` is not (B, Tq, hidden_size); self-attention gets a cross-attention
            argument, widths other than hidden_size or no `position_embeddings`; cross-attention gets a source of
            the wrong shape, no `value_states` where kdim != vdim, RoPE on one side only, a cache or spans;
            `query_padding_mask` is not (B, Tq); or Linformer gets `is_causal=True`, a cache, `mask`, `spans` or
            `split_softmax`.
    """
    if hidden_states.ndim != 3 or hidden_states.shape[-1] != hidden_size:
        raise ValueError(
            f"hidden_states must have shape (batch, Tq, hidden_size={hidden_size}), got {tuple(hidden_states.shape)}"
        )
    batch, query_length, _ = hidden_states.shape
    if key_value_states is None:
        _check_self_attention(value_states, key_position_embeddings, position_embeddings, hidden_size, kdim, vdim)
    else:
        _check_cross_attention(
            key_value_states,
            value_states,
            position_embeddings,
            key_position_embeddings,
            past_key_values,
            spans,
            batch=batch,
            kdim=kdim,
            vdim=vdim,
        )
    if query_padding_mask is not None and tuple(query_padding_mask.shape) != (batch, query_length):
        raise ValueError(
            f"query_padding_mask must have shape (batch, Tq) = {(batch, query_length)}, got {tuple(query_padding_mask.shape)}"
        )
    if linformer:
        _check_linformer(
            {
                "is_causal=True": bool(is_causal),
                "past_key_values": past_key_values is not None,
                "mask": mask is not None,
                "spans": spans is not None,
                "split_softmax": split_softmax is not None,
            }
        )


def _check_linformer(given: dict[str, bool]) -> None:
    """Refuse what Linformer cannot honour, naming each argument `given` (name -> whether it was passed)."""
    refused = [name for name, present in given.items() if present]
    if refused:
        raise ValueError(
            f"{', '.join(refused)} cannot be used with Linformer: E and F mix every position (future ones "
            "included) into each of the k projected keys, so it is neither causal nor addressable by key "
            "position; use it for non-causal attention and pass key_padding_mask for padding"
        )


def _check_self_attention(
    value_states: Tensor | None,
    key_position_embeddings: tuple[Tensor, Tensor] | None,
    position_embeddings: tuple[Tensor, Tensor] | None,
    hidden_size: int,
    kdim: int,
    vdim: int,
) -> None:
    """Self-attention's inputs: no cross-attention argument, widths equal to hidden_size, RoPE given."""
    if value_states is not None:
        raise ValueError("value_states needs key_value_states: it is the value source of cross-attention")
    if key_position_embeddings is not None:
        raise ValueError(
            "key_position_embeddings is for cross-attention (with key_value_states); "
            "self-attention rotates keys by position_embeddings"
        )
    if kdim != hidden_size or vdim != hidden_size:
        raise ValueError(
            f"this module takes keys of width kdim={kdim} and values of width vdim={vdim}, not "
            f"hidden_size={hidden_size}: pass key_value_states (and value_states) for cross-attention"
        )
    if position_embeddings is None:
        raise ValueError(
            "position_embeddings (cos, sin) is required for self-attention; "
            "only cross-attention may pass None (no RoPE)"
        )


def _check_cross_attention(
    key_value_states: Tensor,
    value_states: Tensor | None,
    position_embeddings: tuple[Tensor, Tensor] | None,
    key_position_embeddings: tuple[Tensor, Tensor] | None,
    past_key_values: KVCache | None,
    spans: list[list[tuple[int, int]]] | None,
    *,
    batch: int,
    kdim: int,
    vdim: int,
) -> None:
    """Cross-attention's inputs: the key and value sources' shapes, RoPE on both sides or neither, no cache or spans."""
    if key_value_states.ndim != 3 or key_value_states.shape[0] != batch or key_value_states.shape[-1] != kdim:
        raise ValueError(
            f"key_value_states must have shape (batch={batch}, Tk, kdim={kdim}), got {tuple(key_value_states.shape)}"
        )
    key_length = key_value_states.shape[1]
    if value_states is None and kdim != vdim:
        raise ValueError(
            f"value_states (batch, Tk, vdim={vdim}) is required: kdim ({kdim}) != vdim ({vdim}), "
            "so key_value_states cannot also be the values"
        )
    if value_states is not None and tuple(value_states.shape) != (batch, key_length, vdim):
        raise ValueError(
            f"value_states must have shape (batch, Tk, vdim) = {(batch, key_length, vdim)}, "
            f"got {tuple(value_states.shape)}"
        )
    if (position_embeddings is None) != (key_position_embeddings is None):
        raise ValueError(
            "cross-attention RoPE needs both position_embeddings (queries) and "
            "key_position_embeddings (keys), or neither (no RoPE)"
        )
    if past_key_values is not None:
        raise ValueError(
            "past_key_values is for self-attention: a cache appends keys, and cross-attention's "
            "keys come whole from key_value_states at every call"
        )
    if spans is not None:
        raise ValueError("spans (packed self-attention segments) does not apply to cross-attention")
