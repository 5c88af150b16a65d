"""Masked multi-head attention: score functions, masks, the functional core and the module.

The core follows the attention recipe step by step: scores between each query and each key, a mask
that removes the keys a query may not see, a softmax that turns scores into weights, and the
weighted sum of the values. Scaled dot-product attention has two paths with the same result:

- the fast path hands the work to `torch.nn.functional.scaled_dot_product_attention`, which never
  materialises the (T, T) weights;
- the explicit path writes every step out and can return the weights (the evaluation's attention
  probe reads them).

Shapes: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys, D head dim.
Masks are boolean, True where a query may attend to a key.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gatt.split_softmax import SplitSoftmax, split_softmax_attention, split_softmax_weights

SCORE_FUNCTIONS = ("scaled_dot", "dot", "general", "additive")


# ----------------------------------------------------------------------------------------------
# Score functions: (B, H, Tq, D) x (B, H, Tk, D) -> (B, H, Tq, Tk)
# ----------------------------------------------------------------------------------------------


class AttentionScore(nn.Module):
    """Base class of the score functions: maps queries and keys to one score per (query, key)."""

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        raise NotImplementedError


class ScaledDotScore(AttentionScore):
    """Scaled dot product q.k / sqrt(D) (Vaswani et al.); `scale` overrides 1/sqrt(D)."""

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        scale = self.scale if self.scale is not None else query.shape[-1] ** -0.5
        return (query @ key.transpose(-2, -1)) * scale


class DotScore(AttentionScore):
    """Plain dot product q.k (Luong "dot")."""

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        return query @ key.transpose(-2, -1)


class GeneralScore(AttentionScore):
    """Bilinear q^T W k (Luong "general"), one W per head."""

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Start from the identity plus noise, so the score starts close to a dot product."""
        with torch.no_grad():
            eye = torch.eye(self.weight.shape[-1], dtype=self.weight.dtype, device=self.weight.device)
            self.weight.copy_(eye.expand_as(self.weight) + 0.02 * torch.randn_like(self.weight))

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        query_w = torch.einsum("bhqd,hde->bhqe", query, self.weight)  # (B, H, Tq, D)
        return query_w @ key.transpose(-2, -1) * query.shape[-1] ** -0.5  # (B, H, Tq, Tk)


class AdditiveScore(AttentionScore):
    """Additive v^T tanh(W1 q + W2 k) (Bahdanau), one (W1, W2, v) per head.

    Materialises a (B, H, Tq, Tk, A) tensor: meant for study and short sequences.
    """

    def __init__(self, num_heads: int, head_dim: int, attn_dim: int | None = None) -> None:
        super().__init__()
        attn_dim = attn_dim or head_dim
        self.w_query = nn.Parameter(torch.empty(num_heads, head_dim, attn_dim))
        self.w_key = nn.Parameter(torch.empty(num_heads, head_dim, attn_dim))
        self.v = nn.Parameter(torch.empty(num_heads, attn_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-style scale so tanh starts in its linear range."""
        head_dim, attn_dim = self.w_query.shape[-2:]
        nn.init.normal_(self.w_query, std=head_dim**-0.5)
        nn.init.normal_(self.w_key, std=head_dim**-0.5)
        nn.init.normal_(self.v, std=attn_dim**-0.5)

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        q = torch.einsum("bhqd,hda->bhqa", query, self.w_query)  # (B, H, Tq, A)
        k = torch.einsum("bhkd,hda->bhka", key, self.w_key)  # (B, H, Tk, A)
        hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, H, Tq, Tk, A)
        return torch.einsum("bhqka,ha->bhqk", hidden, self.v)  # (B, H, Tq, Tk)


def make_score(name: str, num_heads: int, head_dim: int) -> AttentionScore:
    """Build a score function by name; `ValueError` names the valid ones."""
    if name == "scaled_dot":
        return ScaledDotScore()
    if name == "dot":
        return DotScore()
    if name == "general":
        return GeneralScore(num_heads, head_dim)
    if name == "additive":
        return AdditiveScore(num_heads, head_dim)
    raise ValueError(f"unknown score function {name!r}; expected one of {', '.join(SCORE_FUNCTIONS)}")


# ----------------------------------------------------------------------------------------------
# Masks (True = may attend). Queries are the last Tq of the Tk positions, as with a KV cache.
# ----------------------------------------------------------------------------------------------


def causal_mask(query_length: int, key_length: int, window: int | None = None, device: Any = None) -> Tensor:
    """(Tq, Tk) mask: query i sees keys up to its own position; with `window`, only the last `window` keys."""
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

    padding_mask: (B, Tk), nonzero/True on real tokens. segment_ids: (B, Tk), one id per packed
    dialogue; a token sees only keys of its own segment, so no token attends across a boundary.
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
    """Packed rows restart positions at 0 for each dialogue: derive segment ids, or None if nothing is packed."""
    restarts = torch.zeros_like(position_ids, dtype=torch.bool)
    restarts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    if not restarts.any():
        return None
    return restarts.long().cumsum(-1)  # (B, T)


def _check_2d(name: str, tensor: Tensor, key_length: int) -> None:
    if tensor.ndim != 2 or tensor.shape[-1] != key_length:
        raise ValueError(f"{name} must have shape (batch, {key_length}), got {tuple(tensor.shape)}")


# ----------------------------------------------------------------------------------------------
# The functional core
# ----------------------------------------------------------------------------------------------


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

    `mask` is bool, broadcastable to (B, H, Tq, Tk); `is_causal` adds the causal mask with queries
    aligned to the last Tq keys. `score=None` means scaled dot-product with `scale` (default
    1/sqrt(D)): it takes the fast SDPA path unless `return_weights` asks for the weights.
    `split_softmax`: boost each head's attention on the instruction's keys (gatt/split_softmax.py);
    the returned weights are the boosted ones. Returns (output (B, H, Tq, Dv), weights (B, H, Tq, Tk)
    or None). A query that may see no key at all (a padding row) gets zero weights and a zero output.
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
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None, dropout_p: float
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
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, score: AttentionScore, dropout_p: float,
    split_softmax: SplitSoftmax | None = None,
) -> tuple[Tensor, Tensor]:
    batch, heads, query_length, _ = query.shape
    kv_heads, key_length = key.shape[1], key.shape[2]
    n_rep = heads // kv_heads
    # A dot-product score needs no per-head weights: each key/value head serves its query group without being
    # copied n_rep times (with a long KV cache, the copies would cost more than the attention itself).
    grouped = n_rep > 1 and isinstance(score, (ScaledDotScore, DotScore))
    if grouped:
        grouped_query = query.reshape(batch, kv_heads, n_rep * query_length, query.shape[-1])  # heads h = kv * n_rep + r
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


def segment_spans(segment_ids: Tensor) -> list[list[tuple[int, int]]]:
    """Per row, the [start, end) runs of equal segment id: the packed dialogues (and trailing padding)."""
    spans = []
    for row in segment_ids.tolist():
        starts = [0] + [t for t in range(1, len(row)) if row[t] != row[t - 1]]
        spans.append(list(zip(starts, starts[1:] + [len(row)])))
    return spans


def segmented_attention(
    query: Tensor, key: Tensor, value: Tensor, spans: list[list[tuple[int, int]]], *, scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Causal attention inside each packed segment, without a (T, T) mask.

    Equal to `masked_attention` with the segment mask, but each segment runs the causal SDPA kernel on
    its own slice: the cost is the sum of len^2 over segments instead of T^2 per row.
    """
    grouped = query.shape[1] != key.shape[1]
    rows = []
    # unbind/split rather than slicing: their backward is one stack/cat, not a zero-filled (B, H, T, D)
    # gradient per segment.
    for q_row, k_row, v_row, row_spans in zip(query.unbind(0), key.unbind(0), value.unbind(0), spans):
        lengths = [e - s for s, e in row_spans]
        pieces = [
            F.scaled_dot_product_attention(
                q[None], k[None], v[None], dropout_p=dropout_p, is_causal=q.shape[1] > 1, scale=scale,
                enable_gqa=grouped,
            )  # (1, H, len, Dv)
            for q, k, v in zip(q_row.split(lengths, dim=1), k_row.split(lengths, dim=1), v_row.split(lengths, dim=1))
        ]
        rows.append(torch.cat(pieces, dim=2))  # (1, H, T, Dv)
    return torch.cat(rows, dim=0)  # (B, H, T, Dv)


def repeat_kv(hidden: Tensor, n_rep: int) -> Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * n_rep, T, D): each key/value head serves n_rep query heads."""
    if n_rep == 1:
        return hidden
    batch, kv_heads, length, head_dim = hidden.shape
    hidden = hidden[:, :, None].expand(batch, kv_heads, n_rep, length, head_dim)
    return hidden.reshape(batch, kv_heads * n_rep, length, head_dim)


# ----------------------------------------------------------------------------------------------
# Linformer: keys and values projected along the sequence (Wang et al. 2020)
# ----------------------------------------------------------------------------------------------


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

    query (B, H, Tq, D), key (B, Hkv, Tk, D), value (B, Hkv, Tk, Dv); E and F (k, n) with n >= Tk, shared
    by every head. A sequence shorter than n uses the first Tk columns of E and F. `key_padding_mask`
    (B, Tk), True/nonzero on real tokens: padded keys and values are zeroed before the projection, so K'
    and V' mix real tokens only (the k projected keys themselves are never masked; a row with no real
    key gets K' = V' = 0 and a zero output). `score`, `scale`, `dropout_p` and `return_weights` are those
    of `masked_attention`, which runs on (Q, K', V'). Returns (output (B, H, Tq, Dv), weights
    (B, H, Tq, k) or None). Cost O(Tq k) per head instead of O(Tq Tk).

    Not causal: every row of K' and V' mixes all Tk positions, so each query sees projections of the
    tokens after it. There is no `is_causal`; use Linformer for encoders, cross-attention and other
    non-causal attention, never for autoregressive decoding.
    """
    # E and F keep the paper's names; this function does not use torch.nn.functional, which F shadows here.
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
    return masked_attention(query, key, value, score=score, scale=scale, dropout_p=dropout_p, return_weights=return_weights)


# ----------------------------------------------------------------------------------------------
# Rotary position embeddings (the rotate-half layout of Hugging Face Llama checkpoints)
# ----------------------------------------------------------------------------------------------


class RotaryEmbedding(nn.Module):
    """Maps position ids (B, T) to the (cos, sin) tables (B, T, D) shared by every layer."""

    def __init__(self, head_dim: int, base: float = 10000.0, inv_freq: Tensor | None = None, scaling: float = 1.0) -> None:
        super().__init__()
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        if inv_freq is None:
            inv_freq = default_inv_freq(head_dim, base)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, position_ids: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.float()  # (B, T, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (B, T, D)
        return (angles.cos() * self.scaling).to(dtype), (angles.sin() * self.scaling).to(dtype)


def default_inv_freq(head_dim: int, base: float) -> Tensor:
    """The inverse frequencies of the original RoPE."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def apply_rotary(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate query (B, H, T, D) and key (B, Hkv, T, D) by the angles of their positions."""
    return _rotate(query, cos, sin), _rotate(key, cos, sin)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, T, D) by the (cos, sin) tables (B, T, D) of its positions (cross-attention: each side its own)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, D)
    return x * cos + _rotate_half(x) * sin


# ----------------------------------------------------------------------------------------------
# The module
# ----------------------------------------------------------------------------------------------


class KVCache(Protocol):
    """What the module needs of a cache: Hugging Face's `DynamicCache` and friends satisfy it."""

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]: ...


class MaskedMultiHeadAttention(nn.Module):
    """Multi-head attention with grouped-query heads, RoPE, a KV cache and a choice of score function.

    Self-attention by default. Cross-attention: `forward(..., key_value_states=...)` takes the keys (and
    values) from another sequence, of widths `kdim` and `vdim` (default `hidden_size`), as
    `torch.nn.MultiheadAttention` does. Linformer: `linformer_k` and `linformer_max_length` add the
    learned projections E and F (k, n) of `linformer_attention`, one pair shared by every head and by
    keys of every head group (the paper's headwise sharing: 2kn parameters per layer); such a module is
    never causal.

    Parameter names (`q_proj`, `k_proj`, `v_proj`, `o_proj`) are those of Hugging Face Llama, so
    checkpoints load unchanged and LoRA targets are the usual ones; E and F are `linformer_e`,
    `linformer_f`, absent without Linformer.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        *,
        score: str = "scaled_dot",
        bias: bool = False,
        dropout: float = 0.0,
        layer_idx: int = 0,
        kdim: int | None = None,
        vdim: int | None = None,
        linformer_k: int | None = None,
        linformer_max_length: int | None = None,
    ) -> None:
        super().__init__()
        num_key_value_heads = num_key_value_heads or num_heads
        if num_heads % num_key_value_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_key_value_heads})"
            )
        if head_dim is None:
            if hidden_size % num_heads != 0:
                raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
            head_dim = hidden_size // num_heads
        for name, width in (("kdim", kdim), ("vdim", vdim)):
            if width is not None and width < 1:
                raise ValueError(f"{name} must be >= 1 (the width of the key/value source), got {width}")
        self.num_heads, self.num_key_value_heads, self.head_dim = num_heads, num_key_value_heads, head_dim
        self.dropout, self.layer_idx = dropout, layer_idx
        # The dtype scores, softmax, the KV cache and the weighted sum run in (None: the projections' own).
        self.attention_dtype: torch.dtype | None = None
        self.hidden_size = hidden_size
        self.kdim = kdim if kdim is not None else hidden_size
        self.vdim = vdim if vdim is not None else hidden_size
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, num_key_value_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(self.vdim, num_key_value_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        # Scaled dot-product keeps score=None so the fast path applies; the others hold their parameters here.
        self.score = None if score == "scaled_dot" else make_score(score, num_heads, head_dim)
        self.linformer_e: nn.Parameter | None = None
        self.linformer_f: nn.Parameter | None = None
        if (linformer_k is None) != (linformer_max_length is None):
            raise ValueError(
                f"linformer_k and linformer_max_length go together; got linformer_k={linformer_k}, "
                f"linformer_max_length={linformer_max_length}"
            )
        if linformer_k is not None and linformer_max_length is not None:
            if linformer_k < 1:
                raise ValueError(f"linformer_k must be >= 1, got {linformer_k}")
            if linformer_max_length < 1:
                raise ValueError(f"linformer_max_length must be >= 1, got {linformer_max_length}")
            self.linformer_e = nn.Parameter(torch.empty(linformer_k, linformer_max_length))  # (k, n)
            self.linformer_f = nn.Parameter(torch.empty(linformer_k, linformer_max_length))  # (k, n)
            self.reset_linformer_parameters()

    def reset_linformer_parameters(self) -> None:
        """E, F ~ N(0, 1/n): a row of E K then has the scale of one key at the full length n."""
        for projection in (self.linformer_e, self.linformer_f):
            if projection is not None:
                nn.init.normal_(projection, std=projection.shape[1] ** -0.5)

    def forward(
        self,
        hidden_states: Tensor,
        position_embeddings: tuple[Tensor, Tensor] | None,
        mask: Tensor | None = None,
        *,
        is_causal: bool | None = None,
        past_key_values: KVCache | None = None,
        return_weights: bool = False,
        spans: list[list[tuple[int, int]]] | None = None,
        split_softmax: SplitSoftmax | None = None,
        key_value_states: Tensor | None = None,
        value_states: Tensor | None = None,
        key_position_embeddings: tuple[Tensor, Tensor] | None = None,
        query_padding_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """hidden_states (B, T, C) -> (B, T, C); `mask` (bool, broadcastable to (B, H, T, Tk)) covers cached keys too.

        `spans` (packed rows without cache): the segments `mask` describes, for the per-segment fast path.
        `split_softmax`: boost the attention on the instruction's key columns (inference; gatt/split_softmax.py).
        `is_causal=None` means causal for self-attention, not causal for cross-attention or Linformer.

        Self-attention (no `key_value_states`): `position_embeddings` (cos, sin) (B, T, D) is required
        and rotates queries and keys alike.

        Cross-attention: the queries come from `hidden_states` (B, Tq, C), the keys from
        `key_value_states` (B, Tk, kdim), the values from `value_states` (B, Tk, vdim) if given, else
        from `key_value_states` (then kdim must equal vdim). RoPE is off with `position_embeddings=None`,
        or explicit: `position_embeddings` rotates the queries and `key_position_embeddings` (B, Tk, D)
        the keys. No KV cache: its `update` appends, so the same encoder keys would pile up at every
        decoding step; the keys are projected from `key_value_states` at every call instead (a cache of
        the encoder keys is left out).

        `query_padding_mask` (B, Tq) and `key_padding_mask` (B, Tk, cached keys included), either mode:
        True/nonzero on real tokens (the opposite of `torch.nn.MultiheadAttention`'s key_padding_mask).
        No query attends to a padded key; a padded query's output row is zero (after `o_proj`, bias
        included) and its weights are zero.

        Linformer (`linformer_k` set): `linformer_attention` with E and F; `key_padding_mask` zeroes the
        padded keys and values before the projection; `is_causal=True`, a KV cache, `mask`, `spans` and
        `split_softmax` are refused (E mixes every position, future ones included). With RoPE the keys are rotated before
        E mixes them, which loses RoPE's relative-position property.
        """
        cross = key_value_states is not None
        self._check_inputs(hidden_states, position_embeddings, mask, is_causal, past_key_values, spans, split_softmax,
                           key_value_states, value_states, key_position_embeddings, query_padding_mask)
        if is_causal is None:
            is_causal = not cross and self.linformer_e is None
        batch, length, _ = hidden_states.shape
        key_source = key_value_states if key_value_states is not None else hidden_states  # (B, Tk, kdim)
        value_source = value_states if value_states is not None else key_source  # (B, Tk, vdim)
        key_length = key_source.shape[1]
        query = self.q_proj(hidden_states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        key = self.k_proj(key_source).view(batch, key_length, self.num_key_value_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, Tk, D)
        value = self.v_proj(value_source).view(batch, key_length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        if not cross:
            assert position_embeddings is not None  # _check_inputs refused None for self-attention
            query, key = apply_rotary(query, key, *position_embeddings)
        elif position_embeddings is not None and key_position_embeddings is not None:
            query, key = _rotate(query, *position_embeddings), _rotate(key, *key_position_embeddings)
        if self.attention_dtype is not None:  # e.g. fp32 attention and KV cache in a bf16 model (gatt/numerics.py)
            query, key, value = query.to(self.attention_dtype), key.to(self.attention_dtype), value.to(self.attention_dtype)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)  # (B, Hkv, Tk, D)
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, key.shape[2]):
            raise ValueError(
                f"key_padding_mask must have shape (batch, Tk) = {(batch, key.shape[2])} (cached keys included), "
                f"got {tuple(key_padding_mask.shape)}"
            )
        dropout_p = self.dropout if self.training else 0.0
        if self.linformer_e is not None and self.linformer_f is not None:
            output, weights = linformer_attention(
                query, key, value, self.linformer_e, self.linformer_f, key_padding_mask=key_padding_mask,
                score=self.score, dropout_p=dropout_p, return_weights=return_weights,
            )
        elif (spans is not None and self.score is None and not return_weights and split_softmax is None
              and key_padding_mask is None):
            output, weights = segmented_attention(query, key, value, spans, dropout_p=dropout_p), None
        else:
            if key_padding_mask is not None:
                real_keys = key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, Tk)
                mask = real_keys if mask is None else mask & real_keys
            output, weights = masked_attention(
                query, key, value, mask, is_causal=is_causal, score=self.score, dropout_p=dropout_p,
                return_weights=return_weights, split_softmax=split_softmax,
            )
        output = output.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)  # (B, T, H*D)
        output = self.o_proj(output.to(hidden_states.dtype))  # (B, T, C)
        if query_padding_mask is not None:
            real_queries = query_padding_mask.bool()  # (B, Tq)
            output = output.masked_fill(~real_queries[:, :, None], 0.0)
            if weights is not None:
                weights = weights.masked_fill(~real_queries[:, None, :, None], 0.0)  # (B, H, Tq, Tk)
        return output, weights

    def _check_inputs(
        self,
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
    ) -> None:
        """The forward's ValueErrors, each naming the argument at fault (key_padding_mask is checked after the cache)."""
        if hidden_states.ndim != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"hidden_states must have shape (batch, Tq, hidden_size={self.hidden_size}), got {tuple(hidden_states.shape)}"
            )
        batch, query_length, _ = hidden_states.shape
        if key_value_states is None:
            if value_states is not None:
                raise ValueError("value_states needs key_value_states: it is the value source of cross-attention")
            if key_position_embeddings is not None:
                raise ValueError("key_position_embeddings is for cross-attention (with key_value_states); "
                                 "self-attention rotates keys by position_embeddings")
            if self.kdim != self.hidden_size or self.vdim != self.hidden_size:
                raise ValueError(
                    f"this module takes keys of width kdim={self.kdim} and values of width vdim={self.vdim}, not "
                    f"hidden_size={self.hidden_size}: pass key_value_states (and value_states) for cross-attention"
                )
            if position_embeddings is None:
                raise ValueError("position_embeddings (cos, sin) is required for self-attention; "
                                 "only cross-attention may pass None (no RoPE)")
        else:
            if key_value_states.ndim != 3 or key_value_states.shape[0] != batch or key_value_states.shape[-1] != self.kdim:
                raise ValueError(
                    f"key_value_states must have shape (batch={batch}, Tk, kdim={self.kdim}), got {tuple(key_value_states.shape)}"
                )
            key_length = key_value_states.shape[1]
            if value_states is None and self.kdim != self.vdim:
                raise ValueError(
                    f"value_states (batch, Tk, vdim={self.vdim}) is required: kdim ({self.kdim}) != vdim ({self.vdim}), "
                    "so key_value_states cannot also be the values"
                )
            if value_states is not None and tuple(value_states.shape) != (batch, key_length, self.vdim):
                raise ValueError(
                    f"value_states must have shape (batch, Tk, vdim) = {(batch, key_length, self.vdim)}, "
                    f"got {tuple(value_states.shape)}"
                )
            if (position_embeddings is None) != (key_position_embeddings is None):
                raise ValueError("cross-attention RoPE needs both position_embeddings (queries) and "
                                 "key_position_embeddings (keys), or neither (no RoPE)")
            if past_key_values is not None:
                raise ValueError("past_key_values is for self-attention: a cache appends keys, and cross-attention's "
                                 "keys come whole from key_value_states at every call")
            if spans is not None:
                raise ValueError("spans (packed self-attention segments) does not apply to cross-attention")
        if query_padding_mask is not None and tuple(query_padding_mask.shape) != (batch, query_length):
            raise ValueError(
                f"query_padding_mask must have shape (batch, Tq) = {(batch, query_length)}, got {tuple(query_padding_mask.shape)}"
            )
        if self.linformer_e is not None:
            given = {"is_causal=True": bool(is_causal), "past_key_values": past_key_values is not None,
                     "mask": mask is not None, "spans": spans is not None, "split_softmax": split_softmax is not None}
            refused = [name for name, present in given.items() if present]
            if refused:
                raise ValueError(
                    f"{', '.join(refused)} cannot be used with Linformer: E and F mix every position (future ones "
                    "included) into each of the k projected keys, so it is neither causal nor addressable by key "
                    "position; use it for non-causal attention and pass key_padding_mask for padding"
                )


# ----------------------------------------------------------------------------------------------
# Hugging Face integration: `attn_implementation="gatt"` runs any HF model on this core
# ----------------------------------------------------------------------------------------------


def hf_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """The `AttentionInterface` signature: returns (output (B, Tq, H, Dv), weights or None).

    A `split_softmax=SplitSoftmax(...)` keyword given to the model's forward reaches every layer here
    through transformers' attention kwargs (`generate()` refuses keywords its model does not name; the
    library's model names it, so its `generate()` takes it too)."""
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # The "gatt" mask function is transformers' SDPA one: None means a plain causal (or single-query) mask.
    output, weights = masked_attention(
        query,
        key,
        value,
        attention_mask,
        is_causal=is_causal and attention_mask is None and query.shape[2] > 1,
        scale=scaling,
        dropout_p=dropout,
        return_weights=bool(kwargs.get("output_attentions", False)),
        split_softmax=kwargs.get("split_softmax"),
    )
    return output.transpose(1, 2).contiguous(), weights


def register_with_transformers(name: str = "gatt") -> None:
    """Register the core in transformers' attention and mask interfaces under `name`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, hf_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)


__all__ = [
    "SCORE_FUNCTIONS",
    "AdditiveScore",
    "AttentionScore",
    "DotScore",
    "GeneralScore",
    "MaskedMultiHeadAttention",
    "RotaryEmbedding",
    "ScaledDotScore",
    "apply_rotary",
    "build_attention_mask",
    "causal_mask",
    "hf_attention_forward",
    "linformer_attention",
    "make_score",
    "masked_attention",
    "register_with_transformers",
    "repeat_kv",
    "segment_ids_from_position_ids",
    "segment_spans",
    "segmented_attention",
]
