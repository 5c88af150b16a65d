"""Masks (True = may attend). Queries are the last Tq of the Tk positions, as with a KV cache.

The causal, key-padding, packed-segment and local-window masks, and the packed rows' segments: their ids
from restarting position ids, and their [start, end) spans for the per-segment fast path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def causal_mask(query_length: int, key_length: int, window: int | None = None, device: Any = None) -> Tensor:
    """(Tq, Tk) mask: query i sees keys up to its own position; with `window`, only the last `window` keys.

    Args:
        query_length: Number of queries Tq: the last Tq of the Tk positions.
        key_length: Number of keys Tk.
        window: Number of most recent keys (its own included) a query may see (default None: all earlier keys).
        device: Device of the mask (default None: torch's default device).

    Returns:
        A bool (Tq, Tk) mask, True where the query may attend to the key.

    Raises:
        ValueError: When `query_length` exceeds `key_length`, or `window` is below 1.
    """
    if query_length > key_length:
        raise ValueError(f"query_length ({query_length}) cannot exceed key_length ({key_length})")
    query_pos = torch.arange(key_length - query_length, key_length, device=device)[:, None]  # (Tq, 1)
    key_pos = torch.arange(key_length, device=device)[None, :]  # (1, Tk)
    mask = key_pos <= query_pos
    if window is not None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        mask &= key_pos > query_pos - window
    return mask


def build_attention_mask(
    query_length: int,
    key_length: int,
    *,
    padding_mask: Tensor | None = None,
    segment_ids: Tensor | None = None,
    causal: bool = True,
    window: int | None = None,
    device: Any = None,
) -> Tensor:
    """Combine causal, key-padding, packed-segment and local-window masks into one (B|1, 1, Tq, Tk) bool mask.

    Args:
        query_length: Number of queries Tq: the last Tq of the Tk positions.
        key_length: Number of keys Tk.
        padding_mask: (B, Tk), nonzero/True on real tokens (default None: no padding).
        segment_ids: (B, Tk), one id per packed dialogue; a token sees only keys of its own segment, so no token
            attends across a boundary (default None: nothing packed).
        causal: Whether a query sees only keys up to its own position (default True; False: all keys).
        window: With `causal`, the number of most recent keys a query may see (default None: no window).
        device: Device of the mask (default None: torch's default device).

    Returns:
        The bool mask, True where a query may attend: (B, 1, Tq, Tk) with `padding_mask` or `segment_ids`,
        else (1, 1, Tq, Tk).

    Raises:
        ValueError: When `padding_mask` or `segment_ids` is not of shape (B, Tk), or as `causal_mask` raises.
    """
    if causal:
        mask = causal_mask(query_length, key_length, window, device)[None, None]  # (1, 1, Tq, Tk)
    else:
        mask = torch.ones(1, 1, query_length, key_length, dtype=torch.bool, device=device)
    if padding_mask is not None:
        _check_2d("padding_mask", padding_mask, key_length)
        mask = mask & padding_mask.bool()[:, None, None, :]  # (B, 1, Tq, Tk)
    if segment_ids is not None:
        _check_2d("segment_ids", segment_ids, key_length)
        query_segments = segment_ids[:, key_length - query_length :]  # (B, Tq)
        mask = mask & (query_segments[:, None, :, None] == segment_ids[:, None, None, :])  # (B, 1, Tq, Tk)
    return mask


def segment_ids_from_position_ids(position_ids: Tensor) -> Tensor | None:
    """Derive segment ids from position ids: packed rows restart positions at 0 for each dialogue.

    Args:
        position_ids: (B, T) position ids.

    Returns:
        (B, T) segment ids, counting up from 0 in each row at every position that does not follow its
        predecessor; None if nothing is packed (no row restarts).
    """
    restarts = torch.zeros_like(position_ids, dtype=torch.bool)
    restarts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    if not restarts.any():
        return None
    return restarts.long().cumsum(-1)  # (B, T)


def segment_spans(segment_ids: Tensor) -> list[list[tuple[int, int]]]:
    """Per row, the [start, end) runs of equal segment id: the packed dialogues (and trailing padding).

    Args:
        segment_ids: (B, T) segment ids, as `segment_ids_from_position_ids` gives.

    Returns:
        One list per row of (start, end) pairs, in order, covering the whole row.
    """
    spans = []
    for row in segment_ids.tolist():
        starts = [0] + [t for t in range(1, len(row)) if row[t] != row[t - 1]]
        spans.append(list(zip(starts, starts[1:] + [len(row)])))
    return spans


def _check_2d(name: str, tensor: Tensor, key_length: int) -> None:
    if tensor.ndim != 2 or tensor.shape[-1] != key_length:
        raise ValueError(f"{name} must have shape (batch, {key_length}), got {tuple(tensor.shape)}")
