"""Cross-attention in `MaskedMultiHeadAttention`: queries from one sequence, keys and values from another.

Every test has `cross` in its name: `pytest -k cross` runs them.
"""

import math

import pytest
import torch
from transformers import DynamicCache

from gatt.model.attention import MaskedMultiHeadAttention, RotaryEmbedding, build_attention_mask

B, C, H, HKV, TQ, TK = 3, 16, 4, 2, 5, 7
KDIM, VDIM = 12, 20


def padding(lengths: list[int], total: int, left: bool = False) -> torch.Tensor:
    """(B, total) bool, True on the real tokens: `lengths[b]` of them, at the end when `left`."""
    mask = torch.zeros(len(lengths), total, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if left:
            mask[b, total - n :] = True
        else:
            mask[b, :n] = True
    return mask


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries (B, TQ, C), key source (B, TK, KDIM), value source (B, TK, VDIM), query and key padding."""
    g = torch.Generator().manual_seed(seed)
    x, keys, values = (
        torch.randn(B, TQ, C, generator=g),
        torch.randn(B, TK, KDIM, generator=g),
        torch.randn(B, TK, VDIM, generator=g),
    )
    return x, keys, values, padding([5, 3, 4], TQ), padding([7, 2, 5], TK, left=True)


def rotate_by_hand(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """x (T, D) float64 at `positions` (T,): pair (i, i + D/2) turned by the angle position * base^(-2i/D)."""
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        for i in range(half):
            angle = positions[t].item() * base ** (-2 * i / x.shape[-1])
            c, s = math.cos(angle), math.sin(angle)
            out[t, i] = x[t, i] * c - x[t, i + half] * s
            out[t, i + half] = x[t, i + half] * c + x[t, i] * s
    return out


def reference(
    attn: MaskedMultiHeadAttention,
    x: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    query_real: torch.Tensor,
    key_real: torch.Tensor,
    query_pos: torch.Tensor | None = None,
    key_pos: torch.Tensor | None = None,
) -> torch.Tensor:
    """The formula in float64, one head at a time: softmax(Q_h K_g^T / sqrt(D)) V_g over real keys, heads concatenated,
    then o_proj; a padded query's row is zero. Head h uses key/value head g = h // (H / Hkv)."""

    def linear(layer: torch.nn.Linear, inp: torch.Tensor, rows: slice) -> torch.Tensor:
        out = inp.double() @ layer.weight[rows].double().T
        return out + layer.bias[rows].double() if layer.bias is not None else out

    d, group = attn.head_dim, attn.num_heads // attn.num_key_value_heads
    out = torch.zeros(x.shape[0], x.shape[1], C, dtype=torch.float64)
    for b in range(x.shape[0]):
        heads = []
        for h in range(attn.num_heads):
            g = h // group
            q = linear(attn.q_proj, x[b], slice(h * d, (h + 1) * d))  # (Tq, D)
            k = linear(attn.k_proj, keys[b], slice(g * d, (g + 1) * d))  # (Tk, D)
            v = linear(attn.v_proj, values[b], slice(g * d, (g + 1) * d))  # (Tk, D)
            if query_pos is not None and key_pos is not None:
                q, k = rotate_by_hand(q, query_pos[b]), rotate_by_hand(k, key_pos[b])
            scores = (q @ k.T / math.sqrt(d)).masked_fill(~key_real[b][None, :], float("-inf"))  # (Tq, Tk)
            heads.append(torch.softmax(scores, dim=-1) @ v)  # (Tq, D)
        out[b] = linear(attn.o_proj, torch.cat(heads, dim=-1), slice(None))  # (Tq, C)
    return out.masked_fill(~query_real[:, :, None], 0.0)


@pytest.mark.parametrize("kv_heads", [H, HKV])
@pytest.mark.parametrize("return_weights", [False, True])  # the fast (SDPA) path and the explicit one
def test_cross_attention_matches_float64_formula(kv_heads, return_weights):
    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(C, H, kv_heads, bias=True, kdim=KDIM, vdim=VDIM).eval()
    x, keys, values, query_real, key_real = inputs()
    out, weights = attn(
        x,
        None,
        key_value_states=keys,
        value_states=values,
        query_padding_mask=query_real,
        key_padding_mask=key_real,
        return_weights=return_weights,
    )
    expected = reference(attn, x, keys, values, query_real, key_real)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.all(out[~query_real] == 0)  # exactly zero at padded queries
    if return_weights:
        assert weights.shape == (B, H, TQ, TK)
        assert torch.all(weights[~key_real[:, None, None, :].expand_as(weights)] == 0)
        assert torch.all(weights[~query_real[:, None, :, None].expand_as(weights)] == 0)


def test_cross_attention_values_default_to_the_key_source():
    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(C, H, HKV, kdim=KDIM, vdim=KDIM).eval()
    x, keys, _, query_real, key_real = inputs(1)
    out, _ = attn(x, None, key_value_states=keys, query_padding_mask=query_real, key_padding_mask=key_real)
    torch.testing.assert_close(out.double(), reference(attn, x, keys, keys, query_real, key_real), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("return_weights", [False, True])
def test_cross_attention_matches_torch_multihead_attention(return_weights):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(C, H, kdim=KDIM, vdim=VDIM, bias=True, batch_first=True).eval()
    attn = MaskedMultiHeadAttention(C, H, bias=True, kdim=KDIM, vdim=VDIM).eval()
    q_bias, k_bias, v_bias = mha.in_proj_bias.chunk(3)
    with torch.no_grad():
        for ours, weight, bias in (
            (attn.q_proj, mha.q_proj_weight, q_bias),
            (attn.k_proj, mha.k_proj_weight, k_bias),
            (attn.v_proj, mha.v_proj_weight, v_bias),
            (attn.o_proj, mha.out_proj.weight, mha.out_proj.bias),
        ):
            ours.weight.copy_(weight)
            ours.bias.copy_(bias)
    x, keys, values, query_real, key_real = inputs(2)
    expected, expected_weights = mha(
        x, keys, values, key_padding_mask=~key_real, need_weights=True, average_attn_weights=False
    )  # torch's mask: True = ignore
    out, weights = attn(
        x,
        None,
        key_value_states=keys,
        value_states=values,
        query_padding_mask=query_real,
        key_padding_mask=key_real,
        return_weights=return_weights,
    )
    torch.testing.assert_close(out[query_real], expected[query_real], atol=1e-5, rtol=1e-5)
    assert torch.all(out[~query_real] == 0)  # as documented: a padded query's row is zero, o_proj's bias included
    if return_weights:
        real_rows = query_real[:, None, :].expand(B, H, TQ)  # (B, H, Tq)
        torch.testing.assert_close(weights[real_rows], expected_weights[real_rows], atol=1e-6, rtol=1e-5)
        assert torch.all(weights[~real_rows] == 0)


@pytest.mark.parametrize("kv_heads", [H, HKV])
def test_cross_attention_explicit_rope_equals_rotation_by_hand(kv_heads):
    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(C, H, kv_heads, kdim=KDIM, vdim=VDIM).eval()
    rotary = RotaryEmbedding(attn.head_dim)
    x, keys, values, query_real, key_real = inputs(3)
    query_pos = torch.arange(TQ)[None].expand(B, -1) + torch.tensor([[0], [3], [10]])  # each row its own offset
    key_pos = torch.arange(TK)[None].expand(B, -1) * 2
    out, _ = attn(
        x,
        rotary(query_pos),
        key_value_states=keys,
        value_states=values,
        key_position_embeddings=rotary(key_pos),
        query_padding_mask=query_real,
        key_padding_mask=key_real,
    )
    expected = reference(attn, x, keys, values, query_real, key_real, query_pos, key_pos)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    unrotated, _ = attn(
        x, None, key_value_states=keys, value_states=values, query_padding_mask=query_real, key_padding_mask=key_real
    )
    assert not torch.allclose(out, unrotated, atol=1e-3)  # the rotation did something


def test_cross_attention_is_not_causal_by_default_and_trains():
    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(C, H, HKV, kdim=KDIM, vdim=VDIM)
    x, keys, values, query_real, key_real = inputs(4)
    x.requires_grad_(True)
    out, weights = attn(
        x,
        None,
        key_value_states=keys,
        value_states=values,
        query_padding_mask=query_real,
        key_padding_mask=key_real,
        return_weights=True,
    )
    assert torch.all(weights[0, :, 0] > 0)  # the first query sees every key of a row without padding
    out.pow(2).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())
    assert torch.all(x.grad[~query_real] == 0)  # a padded query contributes nothing
    _, causal = attn(x, None, key_value_states=keys, value_states=values, is_causal=True, return_weights=True)
    # Explicit is_causal=True: queries aligned to the last Tq keys, so query 0 sees keys up to TK - TQ.
    assert torch.all(causal[0, :, 0, TK - TQ + 1 :] == 0) and torch.all(causal[0, :, 0, : TK - TQ + 1] > 0)


def test_cross_padding_keywords_also_serve_self_attention():
    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(C, H, HKV).eval()
    rotary = RotaryEmbedding(attn.head_dim)
    x = torch.randn(B, TK, C)
    real = padding([7, 2, 5], TK, left=True)
    position_embeddings = rotary(torch.arange(TK)[None].expand(B, -1))
    out, _ = attn(x, position_embeddings, query_padding_mask=real, key_padding_mask=real)
    expected, _ = attn(x, position_embeddings, build_attention_mask(TK, TK, padding_mask=real))
    torch.testing.assert_close(out[real], expected[real])
    assert torch.all(out[~real] == 0)
    # Default widths keep the self-attention parameters and names of a checkpoint.
    assert (
        [name for name, _ in attn.named_parameters()] == [f"{p}_proj.weight" for p in "qkvo"]
        and attn.k_proj.in_features == C
        and attn.linformer_e is None
    )


def test_cross_attention_bad_input_raises_value_error_naming_the_argument():
    attn = MaskedMultiHeadAttention(C, H, HKV, kdim=KDIM, vdim=VDIM)
    rotary = RotaryEmbedding(attn.head_dim)
    x, keys, values, query_real, key_real = inputs()
    kv = {"key_value_states": keys, "value_states": values}
    with pytest.raises(
        ValueError, match=r"key_value_states must have shape \(batch=3, Tk, kdim=12\), got \(3, 7, 20\)"
    ):
        attn(x, None, key_value_states=values)
    with pytest.raises(ValueError, match=r"key_value_states must have shape \(batch=3"):
        attn(x, None, key_value_states=keys[:2], value_states=values[:2])
    with pytest.raises(
        ValueError, match=r"value_states \(batch, Tk, vdim=20\) is required: kdim \(12\) != vdim \(20\)"
    ):
        attn(x, None, key_value_states=keys)
    with pytest.raises(
        ValueError, match=r"value_states must have shape \(batch, Tk, vdim\) = \(3, 7, 20\), got \(3, 6, 20\)"
    ):
        attn(x, None, key_value_states=keys, value_states=values[:, :6])
    with pytest.raises(ValueError, match="value_states needs key_value_states"):
        attn(x, rotary(torch.arange(TQ)[None]), value_states=values)
    with pytest.raises(ValueError, match=r"query_padding_mask must have shape \(batch, Tq\) = \(3, 5\), got \(3, 7\)"):
        attn(x, None, **kv, query_padding_mask=key_real)
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(batch, Tk\) = \(3, 7\).*got \(3, 5\)"):
        attn(x, None, **kv, key_padding_mask=query_real)
    with pytest.raises(ValueError, match="needs both position_embeddings .* and key_position_embeddings"):
        attn(x, rotary(torch.arange(TQ)[None].expand(B, -1)), **kv)
    with pytest.raises(ValueError, match="past_key_values is for self-attention"):
        attn(x, None, **kv, past_key_values=DynamicCache())
    with pytest.raises(ValueError, match=r"hidden_states must have shape \(batch, Tq, hidden_size=16\)"):
        attn(keys, None, **kv)
    with pytest.raises(ValueError, match=r"kdim=12 and values of width vdim=20.*pass key_value_states"):
        attn(x, rotary(torch.arange(TQ)[None].expand(B, -1)))  # built for cross-attention, called as self-attention
    with pytest.raises(ValueError, match="kdim must be >= 1"):
        MaskedMultiHeadAttention(C, H, kdim=0)
    self_attn = MaskedMultiHeadAttention(C, H)
    with pytest.raises(ValueError, match="position_embeddings .* is required for self-attention"):
        self_attn(x, None)
    with pytest.raises(ValueError, match="key_position_embeddings is for cross-attention"):
        pe = rotary(torch.arange(TQ)[None].expand(B, -1))
        self_attn(x, pe, key_position_embeddings=pe)
