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
) -> tuple[Tensor, Tensor | None]:
    """Attend `query` (B, H, Tq, D) over `key` (B, Hkv, Tk, D) / `value` (B, Hkv, Tk, Dv).

    `mask` is bool, broadcastable to (B, H, Tq, Tk); `is_causal` adds the causal mask with queries
    aligned to the last Tq keys. `score=None` means scaled dot-product with `scale` (default
    1/sqrt(D)): it takes the fast SDPA path unless `return_weights` asks for the weights.
    Returns (output (B, H, Tq, Dv), weights (B, H, Tq, Tk) or None). A query that may see no key
    at all (a padding row) gets zero weights and a zero output.
    """
    _validate(query, key, value, mask)
    query_length, key_length = query.shape[2], key.shape[2]
    if score is None and not return_weights:
        return _fast_attention(query, key, value, mask, is_causal, scale, dropout_p), None
    if is_causal:
        causal = causal_mask(query_length, key_length, device=query.device)[None, None]  # (1, 1, Tq, Tk)
        mask = causal if mask is None else mask & causal
    return _explicit_attention(query, key, value, mask, score or ScaledDotScore(scale), dropout_p)


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
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, score: AttentionScore, dropout_p: float
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
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, D)
    return query * cos + _rotate_half(query) * sin, key * cos + _rotate_half(key) * sin


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# ----------------------------------------------------------------------------------------------
# The module
# ----------------------------------------------------------------------------------------------


class KVCache(Protocol):
    """What the module needs of a cache: Hugging Face's `DynamicCache` and friends satisfy it."""

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]: ...


class MaskedMultiHeadAttention(nn.Module):
    """Multi-head self-attention with grouped-query heads, RoPE, a KV cache and a choice of score function.

    Parameter names (`q_proj`, `k_proj`, `v_proj`, `o_proj`) are those of Hugging Face Llama, so
    checkpoints load unchanged and LoRA targets are the usual ones.
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
        self.num_heads, self.num_key_value_heads, self.head_dim = num_heads, num_key_value_heads, head_dim
        self.dropout, self.layer_idx = dropout, layer_idx
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        # Scaled dot-product keeps score=None so the fast path applies; the others hold their parameters here.
        self.score = None if score == "scaled_dot" else make_score(score, num_heads, head_dim)

    def forward(
        self,
        hidden_states: Tensor,
        position_embeddings: tuple[Tensor, Tensor],
        mask: Tensor | None = None,
        *,
        is_causal: bool = True,
        past_key_values: KVCache | None = None,
        return_weights: bool = False,
        spans: list[list[tuple[int, int]]] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """hidden_states (B, T, C) -> (B, T, C); `mask` (bool, broadcastable to (B, H, T, Tk)) covers cached keys too.

        `spans` (packed rows without cache): the segments `mask` describes, for the per-segment fast path.
        """
        batch, length, _ = hidden_states.shape
        query = self.q_proj(hidden_states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        key = self.k_proj(hidden_states).view(batch, length, self.num_key_value_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        value = self.v_proj(hidden_states).view(batch, length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        query, key = apply_rotary(query, key, *position_embeddings)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)  # (B, Hkv, Tk, D)
        dropout_p = self.dropout if self.training else 0.0
        if spans is not None and self.score is None and not return_weights:
            output, weights = segmented_attention(query, key, value, spans, dropout_p=dropout_p), None
        else:
            output, weights = masked_attention(
                query, key, value, mask, is_causal=is_causal, score=self.score, dropout_p=dropout_p,
                return_weights=return_weights,
            )
        output = output.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)  # (B, T, H*D)
        return self.o_proj(output), weights


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
    """The `AttentionInterface` signature: returns (output (B, Tq, H, Dv), weights or None)."""
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
    "make_score",
    "masked_attention",
    "register_with_transformers",
    "repeat_kv",
    "segment_ids_from_position_ids",
    "segment_spans",
    "segmented_attention",
]
