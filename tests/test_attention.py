"""The masked multi-head attention core: score functions, masks, the two paths, the module, HF registration."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import gatt  # noqa: F401  (registers attn_implementation="gatt")
from gatt.model.attention import (
    MaskedMultiHeadAttention,
    RotaryEmbedding,
    ScaledDotScore,
    build_attention_mask,
    causal_mask,
    make_score,
    masked_attention,
    segment_ids_from_position_ids,
    segment_spans,
    segmented_attention,
)

B, H, HKV, TQ, TK, D = 2, 4, 2, 5, 7, 8


@pytest.fixture
def qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(B, H, TQ, D, generator=g),
        torch.randn(B, H, TK, D, generator=g),
        torch.randn(B, H, TK, D, generator=g),
    )


def reference_scores(name: str, q: torch.Tensor, k: torch.Tensor, score: torch.nn.Module) -> torch.Tensor:
    """Each formula written per (query, key) pair in float64 loops: no shared code with the library."""
    q, k = q.double(), k.double()
    out = torch.empty(q.shape[0], q.shape[1], q.shape[2], k.shape[2], dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                for j in range(k.shape[2]):
                    qi, kj = q[b, h, i], k[b, h, j]
                    if name == "scaled_dot":
                        out[b, h, i, j] = torch.dot(qi, kj) / math.sqrt(q.shape[-1])
                    elif name == "dot":
                        out[b, h, i, j] = torch.dot(qi, kj)
                    elif name == "general":
                        out[b, h, i, j] = qi @ score.weight[h].double() @ kj / math.sqrt(q.shape[-1])
                    elif name == "additive":
                        w1, w2, v = score.w_query[h].double(), score.w_key[h].double(), score.v[h].double()
                        out[b, h, i, j] = v @ torch.tanh(qi @ w1 + kj @ w2)
    return out


@pytest.mark.parametrize("name", ["scaled_dot", "dot", "general", "additive"])
def test_score_functions_match_float64_reference(name, qkv):
    q, k, v = qkv
    score = make_score(name, H, D)
    got = score(q, k)
    expected = reference_scores(name, q, k, score)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["scaled_dot", "dot", "general", "additive"])
def test_masked_weights_are_zero_and_rows_sum_to_one(name, qkv):
    q, k, v = qkv
    padding = torch.ones(B, TK, dtype=torch.bool)
    padding[0, :2] = False  # the first query (position 2) still sees one key
    mask = build_attention_mask(TQ, TK, padding_mask=padding)
    out, weights = masked_attention(q, k, v, mask, score=make_score(name, H, D), return_weights=True)
    full = mask.expand(B, H, TQ, TK)
    assert torch.all(weights[~full] == 0.0)  # exactly zero, not just small
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, TQ), atol=1e-6, rtol=0)
    # The output is the weighted sum of the values, computed in float64 from the weights.
    torch.testing.assert_close(out.double(), weights.double() @ v.double(), atol=1e-5, rtol=1e-5)


def test_softmax_of_reference_scores_gives_the_weights(qkv):
    q, k, v = qkv
    mask = build_attention_mask(TQ, TK)
    _, weights = masked_attention(q, k, v, mask, return_weights=True)
    scores = reference_scores("scaled_dot", q, k, ScaledDotScore()).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(weights.double(), torch.softmax(scores, -1), atol=1e-6, rtol=1e-6)


def test_causal_mask_is_bottom_right_aligned_with_window():
    mask = causal_mask(2, 5)
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    windowed = causal_mask(5, 5, window=2)
    expected = [[j <= i and j > i - 2 for j in range(5)] for i in range(5)]
    assert windowed.tolist() == expected


def test_packed_segments_never_attend_across_a_boundary():
    segment_ids = torch.tensor([[0, 0, 0, 1, 1, 2]])
    mask = build_attention_mask(6, 6, segment_ids=segment_ids)[0, 0]
    for i in range(6):
        for j in range(6):
            assert mask[i, j].item() == (j <= i and segment_ids[0, i] == segment_ids[0, j])
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    assert segment_ids_from_position_ids(positions).tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 0]]
    assert segment_ids_from_position_ids(positions[1:]) is None


@pytest.mark.parametrize("kv_heads", [H, HKV])
@pytest.mark.parametrize("case", ["causal", "causal_cached", "padding", "segments", "window", "single_query"])
def test_fast_path_equals_explicit_path(case, kv_heads):
    g = torch.Generator().manual_seed(1)
    tq = {"causal_cached": 3, "single_query": 1}.get(case, 9)
    q = torch.randn(B, H, tq, D, generator=g)
    k, v = torch.randn(B, kv_heads, 9, D, generator=g), torch.randn(B, kv_heads, 9, D, generator=g)
    mask, is_causal = None, True
    if case == "padding":
        padding = torch.ones(B, 9, dtype=torch.bool)
        padding[1, :4] = False
        mask, is_causal = build_attention_mask(tq, 9, padding_mask=padding), False
    elif case == "segments":
        mask, is_causal = build_attention_mask(tq, 9, segment_ids=torch.tensor([[0] * 4 + [1] * 5] * B)), False
    elif case == "window":
        mask, is_causal = build_attention_mask(tq, 9, window=3), False
    fast, none = masked_attention(q, k, v, mask, is_causal=is_causal)
    explicit, weights = masked_attention(q, k, v, mask, is_causal=is_causal, return_weights=True)
    assert none is None and weights.shape == (B, H, tq, 9)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


def test_fully_masked_query_rows_give_zero_on_both_paths(qkv):
    q, k, v = qkv
    mask = torch.zeros(B, 1, TQ, TK, dtype=torch.bool)
    mask[:, :, 1:] = True
    fast, _ = masked_attention(q, k, v, mask)
    explicit, weights = masked_attention(q, k, v, mask, return_weights=True)
    assert torch.all(fast[:, :, 0] == 0) and torch.all(explicit[:, :, 0] == 0) and torch.all(weights[:, :, 0] == 0)
    assert not torch.isnan(fast).any() and not torch.isnan(explicit).any()


def test_bad_input_raises_value_error_saying_what_was_expected(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        masked_attention(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match="torch.bool"):
        masked_attention(q, k, v, torch.zeros(B, 1, TQ, TK))
    with pytest.raises(ValueError, match=r"broadcastable to \(batch, heads, Tq, Tk\)"):
        masked_attention(q, k, v, torch.ones(B, 1, TQ, TK + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="4-D"):
        masked_attention(q, k, v, torch.ones(TQ, TK, dtype=torch.bool))
    with pytest.raises(
        ValueError, match="unknown score function 'cosine'; expected one of scaled_dot, dot, general, additive"
    ):
        make_score("cosine", H, D)
    with pytest.raises(ValueError, match=r"num_heads \(6\) must be a multiple of num_key_value_heads \(4\)"):
        MaskedMultiHeadAttention(48, 6, 4)
    with pytest.raises(ValueError, match=r"padding_mask must have shape \(batch, 7\)"):
        build_attention_mask(TQ, TK, padding_mask=torch.ones(B, 5))


def test_module_kv_cache_decoding_equals_full_forward():
    from transformers import DynamicCache

    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(32, 4, 2).eval()
    rotary = RotaryEmbedding(attn.head_dim)
    x = torch.randn(2, 10, 32)
    full, _ = attn(x, rotary(torch.arange(10)[None].expand(2, -1)))
    cache = DynamicCache()
    steps = [attn(x[:, :6], rotary(torch.arange(6)[None].expand(2, -1)), past_key_values=cache)[0]]
    for t in range(6, 10):  # one token at a time, keys and values from the cache
        steps.append(attn(x[:, t : t + 1], rotary(torch.tensor([[t], [t]])), past_key_values=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("score", "n_params"), [("dot", 0), ("general", 1), ("additive", 3)])
def test_module_with_other_scores_trains(score, n_params):
    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(16, 2, score=score)
    rotary = RotaryEmbedding(attn.head_dim)
    x = torch.randn(1, 5, 16)
    out, weights = attn(x, rotary(torch.arange(5)[None]), return_weights=True)
    out.pow(2).mean().backward()
    params = dict(attn.score.named_parameters())
    assert len(params) == n_params  # the module holds the score's parameters, so they train with it
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params.values())
    assert torch.all(weights.triu(diagonal=1) == 0)  # causal by default


def tiny_llama(attn_implementation: str) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()


def test_llama_with_gatt_attention_matches_sdpa():
    sdpa, ours = tiny_llama("sdpa"), tiny_llama("gatt")
    ours.load_state_dict(sdpa.state_dict())
    assert ours.config._attn_implementation == "gatt"
    ids = torch.randint(1, 97, (2, 16), generator=torch.Generator().manual_seed(3))
    padding = torch.ones_like(ids)
    padding[0, :5] = 0  # left padding
    with torch.no_grad():
        for mask in (None, padding):
            expected, got = sdpa(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
            keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
            torch.testing.assert_close(got[keep], expected[keep], atol=1e-5, rtol=1e-5)
        # The explicit path returns the weights through transformers' output_attentions.
        attentions = ours(ids, attention_mask=padding, output_attentions=True).attentions
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 16, 16)
    assert torch.all(attentions[0][0, :, 5:, :5] == 0)  # real tokens put no weight on padding


@pytest.mark.parametrize("kv_heads", [H, HKV])
def test_segmented_attention_equals_the_segment_mask(kv_heads):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, H, 11, D, generator=g, requires_grad=True)
    k, v = torch.randn(2, kv_heads, 11, D, generator=g), torch.randn(2, kv_heads, 11, D, generator=g)
    segment_ids = torch.tensor([[0] * 4 + [1] * 6 + [2], [0] * 11])
    spans = segment_spans(segment_ids)
    assert spans == [[(0, 4), (4, 10), (10, 11)], [(0, 11)]]
    fast = segmented_attention(q, k, v, spans)
    reference, _ = masked_attention(q, k, v, build_attention_mask(11, 11, segment_ids=segment_ids), return_weights=True)
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-5)
    (grad,) = torch.autograd.grad(fast.sum(), q)
    (expected,) = torch.autograd.grad(reference.sum(), q)
    torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)
