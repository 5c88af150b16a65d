"""Linformer: keys and values projected along the sequence (Wang et al. 2020), then the core attends.

`linformer_attention` is the functional form; `MaskedMultiHeadAttention(..., linformer_k=k,
linformer_max_length=n)` (gatt/model/attention/module.py) holds the learned E and F.
"""

from __future__ import annotations

from torch import Tensor

from gatt.model.attention.core import masked_attention
from gatt.model.attention.scores import AttentionScore


def linformer_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    E: Tensor,
    F: Tensor,
    *,
    key_padding_mask: Tensor | None = None,
    score: AttentionScore | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Linformer attention: K' = E K and V' = F V over the sequence axis, then softmax(Q K'^T / sqrt(D)) V'.

    `masked_attention` runs on (Q, K', V'). Cost O(Tq k) per head instead of O(Tq Tk).

    Not causal: every row of K' and V' mixes all Tk positions, so each query sees projections of the
    tokens after it. There is no `is_causal`; use Linformer for encoders, cross-attention and other
    non-causal attention, never for autoregressive decoding.

    Args:
        query: Queries, (B, H, Tq, D).
        key: Keys, (B, Hkv, Tk, D).
        value: Values, (B, Hkv, Tk, Dv).
        E: The key projection, (k, n) with n >= Tk, shared by every head; a sequence shorter than n uses the first
            Tk columns.
        F: The value projection, (k, n), like `E`.
        key_padding_mask: (B, Tk), True/nonzero on real tokens, or None: padded keys and values are zeroed before
            the projection, so K' and V' mix real tokens only (the k projected keys themselves are never masked; a
            row with no real key gets K' = V' = 0 and a zero output).
        score: The score, as in `masked_attention` (None: scaled dot-product).
        scale: The scale, as in `masked_attention` (None: 1/sqrt(D)).
        dropout_p: Dropout on the attention weights, as in `masked_attention`.
        return_weights: Whether to return the weights, as in `masked_attention`.

    Returns:
        (output (B, H, Tq, Dv), weights (B, H, Tq, k) or None).

    Raises:
        ValueError: When E and F are not both (k, n), key or value is not 4-D, Tk exceeds n, or `key_padding_mask`
            is not (B, Tk).
    """
    # E and F keep the paper's names; this file does not use torch.nn.functional, the usual F.
    if E.ndim != 2 or E.shape != F.shape:
        raise ValueError(f"E and F must both have shape (k, n); got E {tuple(E.shape)}, F {tuple(F.shape)}")
    if key.ndim != 4 or value.ndim != 4:
        raise ValueError(
            f"key and value must be 4-D (batch, heads, length, head_dim); got {tuple(key.shape)}, {tuple(value.shape)}"
        )
    batch, key_length = key.shape[0], key.shape[2]
    if key_length > E.shape[1]:
        raise ValueError(
            f"key length ({key_length}) exceeds the Linformer projection length n ({E.shape[1]} columns of E and F)"
        )
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (batch, key_length):
            raise ValueError(
                f"key_padding_mask must have shape (batch, Tk) = {(batch, key_length)}, got {tuple(key_padding_mask.shape)}"
            )
        real = key_padding_mask.bool()[:, None, :, None]  # (B, 1, Tk, 1)
        key, value = key.masked_fill(~real, 0.0), value.masked_fill(~real, 0.0)
    key = E[:, :key_length] @ key  # (k, Tk) @ (B, Hkv, Tk, D) -> (B, Hkv, k, D)
    value = F[:, :key_length] @ value  # (B, Hkv, k, Dv)
    return masked_attention(
        query, key, value, score=score, scale=scale, dropout_p=dropout_p, return_weights=return_weights
    )
