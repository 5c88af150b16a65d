"""The functional core of masked attention: `masked_attention`, its two paths, and the packed-segment path.

The core follows the attention recipe step by step: scores between each query and each key, a mask
that removes the keys a query may not see, a softmax that turns scores into weights, and the
weighted sum of the values. Scaled dot-product attention has two paths with the same result:

- the fast path hands the work to `torch.nn.functional.scaled_dot_product_attention`, which never
  materialises the (T, T) weights;
- the explicit path writes every step out and can return the weights (the evaluation's attention
  probe reads them).

Shapes: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys, D head dim.
Masks are boolean, True where a query may attend to a key.

`segmented_attention` runs causal attention inside each packed segment without a (T, T) mask;
`repeat_kv` copies each key/value head for its group of query heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gatt.model.attention.masks import causal_mask
from gatt.model.attention.scores import AttentionScore, DotScore, ScaledDotScore
from gatt.model.split_softmax import SplitSoftmax, split_softmax_attention, split_softmax_weights


def _validate(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> None:
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(
            "query, key and value must be 4-D (batch, heads, length, head_dim); got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if key.shape != value.shape[:-1] + (key.shape[-1],) or key.shape[:3] != value.shape[:3]:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must agree on (batch, heads, length)")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query head_dim ({query.shape[-1]}) must equal key head_dim ({key.shape[-1]})")
    if query.shape[1] % key.shape[1] != 0:
        raise ValueError(
            f"query heads ({query.shape[1]}) must be a multiple of key/value heads ({key.shape[1]}) for grouped-query attention"
        )
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a torch.bool tensor (True = may attend), got dtype {mask.dtype}")
    expected = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    if mask.ndim != 4 or any(m not in (1, e) for m, e in zip(mask.shape, expected)):
        raise ValueError(
            f"mask must be 4-D and broadcastable to (batch, heads, Tq, Tk) = {expected}, got {tuple(mask.shape)}"
        )


def masked_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    score: AttentionScore | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    split_softmax: SplitSoftmax | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Attend `query` (B, H, Tq, D) over `key` (B, Hkv, Tk, D) / `value` (B, Hkv, Tk, Dv).

    A query that may see no key at all (a padding row) gets zero weights and a zero output.

    Args:
        query: Queries, (B, H, Tq, D); H must be a multiple of Hkv (grouped-query attention).
        key: Keys, (B, Hkv, Tk, D).
        value: Values, (B, Hkv, Tk, Dv).
        mask: Bool mask, True where a query may attend, broadcastable to (B, H, Tq, Tk) (default None: no mask).
        is_causal: Add the causal mask, with queries aligned to the last Tq keys (default False).
        score: Score function (default None: scaled dot-product with `scale`, which takes the fast SDPA path
            unless `return_weights` asks for the weights or `split_softmax` is set).
        scale: Scale of the dot-product scores when `score` is None (default None: 1/sqrt(D)).
        dropout_p: Dropout probability on the attention weights (default 0.0: none).
        return_weights: Also return the attention weights (takes the explicit path).
        split_softmax: Boost each head's attention on the instruction's keys (gatt/model/split_softmax.py); the
            returned weights are the boosted ones (default None: no boost).

    Returns:
        (output (B, H, Tq, Dv), weights (B, H, Tq, Tk) or None): the weights only when `return_weights`.

    Raises:
        ValueError: When query, key and value are not 4-D, disagree on batch, heads, length or head size, the
            query heads are not a multiple of the key/value heads, or `mask` is not a bool tensor broadcastable
            to (B, H, Tq, Tk).
    """
    _validate(query, key, value, mask)
    query_length, key_length = query.shape[2], key.shape[2]
    if score is None and not return_weights and split_softmax is None:
        return _fast_attention(query, key, value, mask, is_causal, scale, dropout_p), None
    if is_causal:
        causal = causal_mask(query_length, key_length, device=query.device)[None, None]  # (1, 1, Tq, Tk)
        mask = causal if mask is None else mask & causal
    if split_softmax is not None and score is None and not return_weights:
        return split_softmax_attention(query, key, value, mask, split_softmax, scale=scale), None
    return _explicit_attention(query, key, value, mask, score or ScaledDotScore(scale), dropout_p, split_softmax)


def _fast_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
    dropout_p: float,
) -> Tensor:
    query_length, key_length = query.shape[2], key.shape[2]
    # SDPA's own is_causal is aligned top-left; it equals ours when Tq == Tk, and a single query sees every key.
    sdpa_causal = is_causal and mask is None and query_length == key_length and query_length > 1
    if is_causal and not sdpa_causal and query_length > 1:
        causal = causal_mask(query_length, key_length, device=query.device)[None, None]
        mask = causal if mask is None else mask & causal
    grouped = query.shape[1] != key.shape[1]  # SDPA shares each key/value head across its query group
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=sdpa_causal, scale=scale, enable_gqa=grouped
    )  # (B, H, Tq, Dv)


def _explicit_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    score: AttentionScore,
    dropout_p: float,
    split_softmax: SplitSoftmax | None = None,
) -> tuple[Tensor, Tensor]:
    batch, heads, query_length, _ = query.shape
    kv_heads, key_length = key.shape[1], key.shape[2]
    n_rep = heads // kv_heads
    # A dot-product score needs no per-head weights: each key/value head serves its query group without being
    # copied n_rep times (with a long KV cache, the copies would cost more than the attention itself).
    grouped = n_rep > 1 and isinstance(score, (ScaledDotScore, DotScore))
    if grouped:
        grouped_query = query.reshape(
            batch, kv_heads, n_rep * query_length, query.shape[-1]
        )  # heads h = kv * n_rep + r
        scores = score(grouped_query, key).view(batch, heads, query_length, key_length)
    else:
        key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)  # (B, H, Tk, D)
        scores = score(query, key)  # (B, H, Tq, Tk)
    scores = scores.float()  # softmax in fp32 for low-precision inputs
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # all-masked rows: 0, not NaN
    if split_softmax is not None:
        weights = split_softmax_weights(weights, split_softmax)
    weights = weights.to(query.dtype)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    if grouped:
        output = dropped.reshape(batch, kv_heads, n_rep * query_length, key_length) @ value
        return output.view(batch, heads, query_length, value.shape[-1]), weights  # (B, H, Tq, Dv), (B, H, Tq, Tk)
    return dropped @ value, weights  # (B, H, Tq, Dv), (B, H, Tq, Tk)


def segmented_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    spans: list[list[tuple[int, int]]],
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Causal attention inside each packed segment, without a (T, T) mask.

    Equal to `masked_attention` with the segment mask, but each segment runs the causal SDPA kernel on
    its own slice: the cost is the sum of len^2 over segments instead of T^2 per row.

    Args:
        query: Queries, (B, H, T, D); H may be a multiple of Hkv (grouped-query attention).
        key: Keys, (B, Hkv, T, D).
        value: Values, (B, Hkv, T, Dv).
        spans: Per row, the [start, end) spans of its segments, covering the row (as `segment_spans` gives).
        scale: Scale of the dot-product scores (default None: 1/sqrt(D)).
        dropout_p: Dropout probability on the attention weights (default 0.0: none).

    Returns:
        The output, (B, H, T, Dv).
    """
    grouped = query.shape[1] != key.shape[1]
    rows = []
    # unbind/split rather than slicing: their backward is one stack/cat, not a zero-filled (B, H, T, D)
    # gradient per segment.
    for q_row, k_row, v_row, row_spans in zip(query.unbind(0), key.unbind(0), value.unbind(0), spans):
        lengths = [e - s for s, e in row_spans]
        pieces = [
            F.scaled_dot_product_attention(
                q[None],
                k[None],
                v[None],
                dropout_p=dropout_p,
                is_causal=q.shape[1] > 1,
                scale=scale,
                enable_gqa=grouped,
            )  # (1, H, len, Dv)
            for q, k, v in zip(q_row.split(lengths, dim=1), k_row.split(lengths, dim=1), v_row.split(lengths, dim=1))
        ]
        rows.append(torch.cat(pieces, dim=2))  # (1, H, T, Dv)
    return torch.cat(rows, dim=0)  # (B, H, T, Dv)


def repeat_kv(hidden: Tensor, n_rep: int) -> Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * n_rep, T, D): each key/value head serves n_rep query heads.

    Args:
        hidden: Key or value heads, (B, Hkv, T, D).
        n_rep: Number of query heads per key/value head.

    Returns:
        Each head repeated n_rep times in a row, (B, Hkv * n_rep, T, D); `hidden` itself when n_rep is 1.
    """
    if n_rep == 1:
        return hidden
    batch, kv_heads, length, head_dim = hidden.shape
    hidden = hidden[:, :, None].expand(batch, kv_heads, n_rep, length, head_dim)
    return hidden.reshape(batch, kv_heads * n_rep, length, head_dim)
