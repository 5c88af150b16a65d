"""`MaskedMultiHeadAttention`: the attention module (grouped-query heads, RoPE, a KV cache, a score function).

Self-attention by default; cross-attention with `key_value_states`; Linformer with `linformer_k` and
`linformer_max_length`. The arguments its forward accepts are checked in gatt/model/attention/inputs.py; the
attention itself runs in the functional core (gatt/model/attention/core.py) or Linformer
(gatt/model/attention/linformer.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gatt.model.attention.core import masked_attention, segmented_attention
from gatt.model.attention.inputs import KVCache, check_forward_inputs
from gatt.model.attention.linformer import linformer_attention
from gatt.model.attention.rotary import _rotate, apply_rotary
from gatt.model.attention.scores import make_score
from gatt.model.split_softmax import SplitSoftmax


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

    Cross-attention's forward: the queries come from `hidden_states` (B, Tq, C), the keys from `key_value_states`
    (B, Tk, kdim), the values from `value_states` (B, Tk, vdim) if given, else from `key_value_states` (then kdim must
    equal vdim). RoPE is off with `position_embeddings=None`, or explicit: `position_embeddings` rotates the queries
    and `key_position_embeddings` (B, Tk, D) the keys. No KV cache: its `update` appends, so the same encoder keys
    would pile up at every decoding step; the keys are projected from `key_value_states` at every call instead.

    Linformer's forward: `linformer_attention` with E and F; `key_padding_mask` zeroes the padded keys and values
    before the projection; `is_causal=True`, a KV cache, `mask`, `spans` and `split_softmax` are refused (E mixes
    every position, future ones included). With RoPE the keys are rotated before E mixes them, which loses RoPE's
    relative-position property.

    Args:
        hidden_size: The width C of `hidden_states` and of the output.
        num_heads: The number of query heads H.
        num_key_value_heads: The number of key/value heads Hkv (default `num_heads`); `num_heads` must be a multiple
            of it.
        head_dim: A head's width D (default `hidden_size // num_heads`, which must then divide evenly).
        score: The score function, one of "scaled_dot" (default: the fast SDPA path), "dot", "general" or "additive"
            (`make_score`).
        bias: Whether the projections have a bias.
        dropout: Dropout on the attention weights, in training only.
        layer_idx: The layer's index in the KV cache.
        kdim: The width of the keys' source in cross-attention (default `hidden_size`).
        vdim: The width of the values' source in cross-attention (default `hidden_size`).
        linformer_k: Linformer's projected length k; given with `linformer_max_length` or not at all.
        linformer_max_length: Linformer's longest key sequence n; given with `linformer_k` or not at all.

    Raises:
        ValueError: When `num_heads` is not a multiple of `num_key_value_heads`, `hidden_size` is not divisible by
            `num_heads` (without `head_dim`), `kdim`, `vdim`, `linformer_k` or `linformer_max_length` is below 1, or
            only one of `linformer_k` and `linformer_max_length` is given.
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
        """Attend: hidden_states (B, T, C) -> (B, T, C).

        Cross-attention and Linformer: the class's docstring.

        Args:
            hidden_states: The queries' source, (B, T, C); also the keys' and values' in self-attention.
            position_embeddings: RoPE's (cos, sin), (B, T, D). Self-attention (no `key_value_states`): required, and
                rotates queries and keys alike. Cross-attention: None turns RoPE off; given (with
                `key_position_embeddings`), it rotates the queries.
            mask: Bool, broadcastable to (B, H, T, Tk); covers cached keys too.
            is_causal: Whether to add the causal mask; None means causal for self-attention, not causal for
                cross-attention or Linformer.
            past_key_values: The KV cache, which this layer's new keys and values are appended to (self-attention
                only).
            return_weights: Whether to return the attention weights.
            spans: (packed rows without cache) the segments `mask` describes, for the per-segment fast path.
            split_softmax: Boost the attention on the instruction's key columns (inference;
                gatt/model/split_softmax.py).
            key_value_states: Cross-attention: the keys' source, (B, Tk, kdim).
            value_states: Cross-attention: the values' source, (B, Tk, vdim) (default `key_value_states`).
            key_position_embeddings: Cross-attention: RoPE's (cos, sin) for the keys, (B, Tk, D).
            query_padding_mask: (B, Tq), True/nonzero on real tokens, either mode: a padded query's output row is
                zero (after `o_proj`, bias included) and its weights are zero.
            key_padding_mask: (B, Tk, cached keys included), True/nonzero on real tokens, either mode (the opposite
                of `torch.nn.MultiheadAttention`'s key_padding_mask): no query attends to a padded key.

        Returns:
            (output (B, T, C), the weights (B, H, T, Tk; k with Linformer) if `return_weights`, else None).

        Raises:
            ValueError: When an argument does not fit the module or the mode (gatt/model/attention/inputs.py), or
                `key_padding_mask` is not (B, Tk).
        """
        cross = key_value_states is not None
        check_forward_inputs(
            hidden_states,
            position_embeddings,
            mask,
            is_causal,
            past_key_values,
            spans,
            split_softmax,
            key_value_states,
            value_states,
            key_position_embeddings,
            query_padding_mask,
            hidden_size=self.hidden_size,
            kdim=self.kdim,
            vdim=self.vdim,
            linformer=self.linformer_e is not None,
        )
        if is_causal is None:
            is_causal = not cross and self.linformer_e is None
        query, key, value = self._project(
            hidden_states, key_value_states, value_states, position_embeddings, key_position_embeddings, past_key_values
        )
        batch, length, _ = hidden_states.shape
        output, weights = self._attend(
            query, key, value, mask, is_causal, spans, split_softmax, key_padding_mask, return_weights
        )
        output = output.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)  # (B, T, H*D)
        output = self.o_proj(output.to(hidden_states.dtype))  # (B, T, C)
        return _zero_padded_queries(output, weights, query_padding_mask)

    def _project(
        self,
        hidden_states: Tensor,
        key_value_states: Tensor | None,
        value_states: Tensor | None,
        position_embeddings: tuple[Tensor, Tensor] | None,
        key_position_embeddings: tuple[Tensor, Tensor] | None,
        past_key_values: KVCache | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The queries (B, H, T, D), and the keys and values (B, Hkv, Tk, D) with the cached ones before them:
        projected, rotated (self-attention always; cross-attention where both position embeddings are given), in
        `attention_dtype`."""
        batch, length, _ = hidden_states.shape
        key_source = key_value_states if key_value_states is not None else hidden_states  # (B, Tk, kdim)
        value_source = value_states if value_states is not None else key_source  # (B, Tk, vdim)
        key_length = key_source.shape[1]
        query = (
            self.q_proj(hidden_states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        )  # (B, H, T, D)
        key = (
            self.k_proj(key_source).view(batch, key_length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        )  # (B, Hkv, Tk, D)
        value = (
            self.v_proj(value_source).view(batch, key_length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        )
        if key_value_states is None:
            assert position_embeddings is not None  # check_forward_inputs refused None for self-attention
            query, key = apply_rotary(query, key, *position_embeddings)
        elif position_embeddings is not None and key_position_embeddings is not None:
            query, key = _rotate(query, *position_embeddings), _rotate(key, *key_position_embeddings)
        if (
            self.attention_dtype is not None
        ):  # e.g. fp32 attention and KV cache in a bf16 model (gatt/model/numerics.py)
            query, key, value = (
                query.to(self.attention_dtype),
                key.to(self.attention_dtype),
                value.to(self.attention_dtype),
            )
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)  # (B, Hkv, Tk, D)
        return query, key, value

    def _attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        spans: list[list[tuple[int, int]]] | None,
        split_softmax: SplitSoftmax | None,
        key_padding_mask: Tensor | None,
        return_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """(B, H, T, D) outputs and the weights if asked: Linformer, the per-segment fast path (packed rows,
        nothing to return or change in the scores), or the masked core."""
        batch, keys = key.shape[0], key.shape[2]  # key: (B, H_kv, Tk, D)
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, keys):
            raise ValueError(
                f"key_padding_mask must have shape (batch, Tk) = {(batch, keys)} (cached keys included), "
                f"got {tuple(key_padding_mask.shape)}"
            )
        dropout_p = self.dropout if self.training else 0.0
        if self.linformer_e is not None and self.linformer_f is not None:
            return linformer_attention(
                query,
                key,
                value,
                self.linformer_e,
                self.linformer_f,
                key_padding_mask=key_padding_mask,
                score=self.score,
                dropout_p=dropout_p,
                return_weights=return_weights,
            )
        fast = self.score is None and not return_weights and split_softmax is None and key_padding_mask is None
        if spans is not None and fast:
            return segmented_attention(query, key, value, spans, dropout_p=dropout_p), None
        if key_padding_mask is not None:
            real_keys = key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, Tk)
            mask = real_keys if mask is None else mask & real_keys
        return masked_attention(
            query,
            key,
            value,
            mask,
            is_causal=is_causal,
            score=self.score,
            dropout_p=dropout_p,
            return_weights=return_weights,
            split_softmax=split_softmax,
        )


def _zero_padded_queries(
    output: Tensor, weights: Tensor | None, query_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The output rows (B, Tq, C) and weights (B, H, Tq, Tk) of padded queries (0 in `query_padding_mask`) zeroed."""
    if query_padding_mask is None:
        return output, weights
    real_queries = query_padding_mask.bool()  # (B, Tq)
    output = output.masked_fill(~real_queries[:, :, None], 0.0)
    if weights is not None:
        weights = weights.masked_fill(~real_queries[:, None, :, None], 0.0)  # (B, H, Tq, Tk)
    return output, weights
