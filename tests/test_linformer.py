"""Linformer (Wang et al. 2020): keys and values projected along the sequence by learned E and F (k, n)."""

import math

import pytest
import torch
from transformers import DynamicCache

from gatt.model.attention import MaskedMultiHeadAttention, RotaryEmbedding, linformer_attention, masked_attention
from gatt.model.split_softmax import SplitSoftmax

B, H, HKV, TQ, TK, D, K, N = 2, 4, 2, 6, 9, 8, 5, 12


def tensors(kv_heads: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D), E and F (K, N) with N > Tk: the short-sequence case."""
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, TQ, D, generator=g),
        torch.randn(B, kv_heads, TK, D, generator=g),
        torch.randn(B, kv_heads, TK, D, generator=g),
        torch.randn(K, N, generator=g),
        torch.randn(K, N, generator=g),
    )


def reference(q, k, v, E, F, key_real=None):
    """The formula in float64, per (batch, head): K' = E[:, :Tk] K, V' = F[:, :Tk] V (padded keys and values zeroed
    first), then softmax(Q K'^T / sqrt(D)) V'. Head h reads key/value head h // (H / Hkv)."""
    q, k, v, E, F = (t.double() for t in (q, k, v, E, F))
    tk, group = k.shape[2], q.shape[1] // k.shape[1]
    out = torch.empty(q.shape[0], q.shape[1], q.shape[2], v.shape[-1], dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            keys, values = k[b, h // group].clone(), v[b, h // group].clone()  # (Tk, D)
            if key_real is not None:
                keys[~key_real[b]] = 0.0
                values[~key_real[b]] = 0.0
            projected_keys = sum(E[:, j : j + 1] * keys[j] for j in range(tk))  # (K, D), written as the sum over j
            projected_values = sum(F[:, j : j + 1] * values[j] for j in range(tk))
            weights = torch.softmax(q[b, h] @ projected_keys.T / math.sqrt(q.shape[-1]), dim=-1)  # (Tq, K)
            out[b, h] = weights @ projected_values
    return out


@pytest.mark.parametrize("kv_heads", [H, HKV])
@pytest.mark.parametrize("return_weights", [False, True])  # SDPA on (Q, K', V') and the explicit path
def test_linformer_matches_float64_formula_on_a_short_sequence(kv_heads, return_weights):
    q, k, v, E, F = tensors(kv_heads)
    out, weights = linformer_attention(q, k, v, E, F, return_weights=return_weights)
    torch.testing.assert_close(out.double(), reference(q, k, v, E, F), atol=1e-5, rtol=1e-5)
    assert (weights is not None) == return_weights
    if return_weights:
        assert weights.shape == (B, H, TQ, K)  # a query attends to k projected keys, not Tk positions
    # Tk < n: only the first Tk columns of E and F take part.
    truncated, _ = linformer_attention(q, k, v, E[:, :TK], F[:, :TK])
    torch.testing.assert_close(out, truncated)


@pytest.mark.parametrize("kv_heads", [H, HKV])
def test_linformer_key_padding_zeroes_padded_keys_and_values(kv_heads):
    q, k, v, E, F = tensors(kv_heads, seed=1)
    key_real = torch.ones(B, TK, dtype=torch.bool)
    key_real[0, :3] = False  # left padding
    key_real[1, 6:] = False  # right padding
    out, _ = linformer_attention(q, k, v, E, F, key_padding_mask=key_real)
    torch.testing.assert_close(out.double(), reference(q, k, v, E, F, key_real), atol=1e-5, rtol=1e-5)
    # What a padded position holds does not matter.
    noisy_k, noisy_v = k.clone(), v.clone()
    noisy_k[~key_real[:, None, :].expand_as(k[..., 0])] = 1e3
    noisy_v[~key_real[:, None, :].expand_as(v[..., 0])] = -1e3
    torch.testing.assert_close(linformer_attention(q, noisy_k, noisy_v, E, F, key_padding_mask=key_real.long())[0], out)


def test_linformer_with_identity_projections_is_full_non_causal_attention():
    q, k, v, _, _ = tensors(HKV, seed=2)
    eye = torch.eye(TK)  # k = n = Tk, E = F = I: K' = K, V' = V
    out, weights = linformer_attention(q, k, v, eye, eye, return_weights=True)
    full, full_weights = masked_attention(q, k, v, is_causal=False, return_weights=True)
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(weights, full_weights)

    torch.manual_seed(0)
    linformer = MaskedMultiHeadAttention(32, 4, 2, linformer_k=10, linformer_max_length=10).eval()
    plain = MaskedMultiHeadAttention(32, 4, 2).eval()
    plain.load_state_dict(linformer.state_dict(), strict=False)  # the same q/k/v/o projections
    with torch.no_grad():
        linformer.linformer_e.copy_(torch.eye(10))
        linformer.linformer_f.copy_(torch.eye(10))
    x = torch.randn(2, 10, 32)
    rope = RotaryEmbedding(plain.head_dim)(torch.arange(10)[None].expand(2, -1))
    torch.testing.assert_close(linformer(x, rope)[0], plain(x, rope, is_causal=False)[0])


def test_linformer_module_matches_the_functional_core_with_padding_and_trains():
    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(32, 4, 2, linformer_k=K, linformer_max_length=N)
    assert attn.linformer_e.shape == attn.linformer_f.shape == (K, N)
    assert {"linformer_e", "linformer_f"} <= set(dict(attn.named_parameters()))
    x = torch.randn(B, TK, 32)
    real = torch.ones(B, TK, dtype=torch.bool)
    real[1, :4] = False
    rope = RotaryEmbedding(attn.head_dim)(torch.arange(TK)[None].expand(B, -1))
    out, weights = attn(x, rope, query_padding_mask=real, key_padding_mask=real, return_weights=True)
    assert weights.shape == (B, 4, TK, K) and torch.all(out[~real] == 0)

    # The same by hand: projections, RoPE, the functional core, o_proj.
    q = attn.q_proj(x).view(B, TK, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(B, TK, 2, 8).transpose(1, 2)
    v = attn.v_proj(x).view(B, TK, 2, 8).transpose(1, 2)
    cos, sin = (t.unsqueeze(1) for t in rope)
    rotate_half = lambda t: torch.cat((-t[..., 4:], t[..., :4]), dim=-1)  # noqa: E731
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    core = reference(q, k, v, attn.linformer_e, attn.linformer_f, real).float()
    expected = attn.o_proj(core.transpose(1, 2).reshape(B, TK, 32))
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)

    out.pow(2).sum().backward()
    assert attn.linformer_e.grad.abs().sum() > 0 and attn.linformer_f.grad.abs().sum() > 0
    assert torch.all(attn.linformer_e.grad[:, TK:] == 0)  # columns past the sequence take no part


def test_linformer_cross_attention():
    torch.manual_seed(0)
    attn = MaskedMultiHeadAttention(16, 4, kdim=12, vdim=20, linformer_k=3, linformer_max_length=8).eval()
    x, keys, values = torch.randn(B, 4, 16), torch.randn(B, 7, 12), torch.randn(B, 7, 20)
    out, weights = attn(x, None, key_value_states=keys, value_states=values, return_weights=True)
    assert out.shape == (B, 4, 16) and weights.shape == (B, 4, 4, 3)


def test_linformer_refuses_causal_attention_and_a_kv_cache():
    attn = MaskedMultiHeadAttention(32, 4, linformer_k=K, linformer_max_length=N)
    x = torch.randn(B, TK, 32)
    rope = RotaryEmbedding(attn.head_dim)(torch.arange(TK)[None].expand(B, -1))
    attn(x, rope)  # the default is not causal
    with pytest.raises(ValueError, match="^is_causal=True cannot be used with Linformer"):
        attn(x, rope, is_causal=True)
    with pytest.raises(ValueError, match="^past_key_values cannot be used with Linformer"):
        attn(x, rope, past_key_values=DynamicCache())
    with pytest.raises(ValueError, match="^mask cannot be used with Linformer"):
        attn(x, rope, torch.ones(1, 1, TK, TK, dtype=torch.bool))
    with pytest.raises(ValueError, match="^spans cannot be used with Linformer"):
        attn(x, rope, spans=[[(0, TK)]] * B)
    with pytest.raises(ValueError, match="^split_softmax cannot be used with Linformer"):
        attn(x, rope, split_softmax=SplitSoftmax.from_columns(0.5, [[0]] * B))


def test_linformer_bad_input_raises_value_error():
    q, k, v, E, F = tensors(H)
    with pytest.raises(ValueError, match=r"E and F must both have shape \(k, n\); got E \(5, 12\), F \(5, 11\)"):
        linformer_attention(q, k, v, E, F[:, :11])
    with pytest.raises(ValueError, match=r"key length \(9\) exceeds the Linformer projection length n \(8"):
        linformer_attention(q, k, v, E[:, :8], F[:, :8])
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(batch, Tk\) = \(2, 9\), got \(2, 6\)"):
        linformer_attention(q, k, v, E, F, key_padding_mask=torch.ones(B, TQ))
    with pytest.raises(ValueError, match="linformer_k and linformer_max_length go together"):
        MaskedMultiHeadAttention(32, 4, linformer_k=8)
    with pytest.raises(ValueError, match="linformer_k must be >= 1, got 0"):
        MaskedMultiHeadAttention(32, 4, linformer_k=0, linformer_max_length=8)


def test_linformer_benchmark_merges_into_existing_results(tmp_path, monkeypatch):
    import json

    import bench_linformer
    import run as runner

    monkeypatch.setattr(bench_linformer, "LENGTH", 128)  # the same code at sizes a test can afford
    monkeypatch.setattr(bench_linformer, "PROJECTED", 16)
    out = tmp_path / "bench.json"
    out.write_text(
        json.dumps(
            {
                "machine": {"cpu": "before"},
                "quick": False,
                "seconds": {"bench_x": 1.0},
                "attention_vs_sdpa": {"ratio": 1.0},
            }
        )
    )
    runner.main(["--quick", "--only", "linformer_memory_vs_full", "--json", str(out)])
    payload = json.loads(out.read_text())
    assert payload["machine"] == {"cpu": "before"} and payload["attention_vs_sdpa"] == {"ratio": 1.0}  # kept
    assert set(payload["seconds"]) == {"bench_x", "bench_linformer"}
    result = payload["linformer_memory_vs_full"]
    assert result["quick"] is True and result["machine"]["cores"] >= 1
    assert result["ratio"] == pytest.approx(result["theirs"] / result["ours"], rel=1e-3)
    peaks = result["peak_mib_by_length"]["128"]
    assert peaks["full"] > peaks["linformer"] and set(result["ms_by_length"]["128"]) == set(peaks)
