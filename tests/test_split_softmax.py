"""Split-softmax (Li et al. 2024): the formula, the fused path against it, and every place it plugs in."""

import pytest
import torch

from gatt.model.cache import cache_kwargs, output_cache
from gatt.model.split_softmax import SplitSoftmax, split_softmax_attention, split_softmax_weights


def reference_weights(query, key, mask):
    """float64 softmax(QK^T / sqrt(D)) with grouped heads repeated, masked keys at -inf."""
    n_rep = query.shape[1] // key.shape[1]
    scores = query @ key.repeat_interleave(n_rep, 1).transpose(-1, -2) / query.shape[-1] ** 0.5
    return scores.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)  # a query that sees no key: 0


def causal_with_holes(batch, query_length, key_length):
    """(B, 1, Tq, Tk): causal for queries at the last Tq columns, with cache holes in rows 1 and 2."""
    query_pos = torch.arange(key_length - query_length, key_length)[:, None]
    mask = (torch.arange(key_length)[None] <= query_pos)[None, None].repeat(batch, 1, 1, 1)
    mask[1, ..., 0] = False
    mask[2, ..., 5] = False
    return mask


def test_weights_follow_the_papers_power_law():
    torch.manual_seed(0)
    weights = torch.rand(2, 3, 4, 10, dtype=torch.float64).softmax(-1)  # every query after column 6
    split = SplitSoftmax.from_columns(0.6, [[1, 2, 3], [0, 5]])
    boosted = split_softmax_weights(weights, split)
    on = split.instruction_mask(10)[:, None, None, :]
    pi, new_pi = (weights * on).sum(-1), (boosted * on).sum(-1)
    torch.testing.assert_close(new_pi, pi ** (1 - 0.6))  # pi' = pi^k, k = 1 - strength
    torch.testing.assert_close(boosted.sum(-1), torch.ones_like(pi))
    # proportions kept inside each part
    torch.testing.assert_close(boosted[0, :, :, 1] / boosted[0, :, :, 2], weights[0, :, :, 1] / weights[0, :, :, 2])
    torch.testing.assert_close(boosted[1, :, :, 8] / boosted[1, :, :, 9], weights[1, :, :, 8] / weights[1, :, :, 9])
    assert torch.equal(split_softmax_weights(weights, SplitSoftmax.from_columns(0.0, [[1, 2], [0]])), weights)


def test_only_queries_after_the_instruction_change():
    weights = torch.rand(2, 1, 6, 6, dtype=torch.float64).softmax(-1)
    boosted = split_softmax_weights(weights, SplitSoftmax.from_columns(0.5, [[1, 2], []]))
    assert torch.equal(boosted[0, :, :3], weights[0, :, :3])  # queries at columns 0-2: not after the instruction
    assert not torch.allclose(boosted[0, :, 3:], weights[0, :, 3:])
    assert torch.equal(boosted[1], weights[1])  # a row without instruction


@pytest.mark.parametrize("strength", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("heads,kv_heads,query_length", [(4, 4, 12), (4, 2, 5), (6, 2, 1)])
def test_fused_path_equals_the_formula(strength, heads, kv_heads, query_length):
    torch.manual_seed(1)
    batch, key_length, dim = 4, 12, 8
    query = torch.randn(batch, heads, query_length, dim, dtype=torch.float64)
    key, value = torch.randn(2, batch, kv_heads, key_length, dim, dtype=torch.float64)
    mask = causal_with_holes(batch, query_length, key_length)
    # row 3: its only instruction column is a hole, so no query sees the instruction
    mask[3, ..., 4] = False
    split = SplitSoftmax.from_columns(strength, [[2, 3, 4], [1, 2], [4, 5, 6], [4]])
    expected = split_softmax_weights(reference_weights(query, key, mask), split) @ value.repeat_interleave(
        heads // kv_heads, 1
    )
    torch.testing.assert_close(
        split_softmax_attention(query, key, value, mask, split), expected, rtol=1e-10, atol=1e-10
    )


def test_fused_path_in_float32_and_without_mask():
    torch.manual_seed(2)
    query, (key, value) = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 4, 6, 16)
    split = SplitSoftmax.from_columns(0.5, [[0, 1], [3]])
    expected = (
        split_softmax_weights(reference_weights(query, key, torch.ones(1, 1, 1, 1, dtype=torch.bool)), split) @ value
    )
    torch.testing.assert_close(split_softmax_attention(query, key, value, None, split), expected, rtol=1e-5, atol=1e-5)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="strength"):
        SplitSoftmax.from_columns(1.5, [[0]])
    with pytest.raises(ValueError, match="row 0"):
        SplitSoftmax.from_columns(0.5, [[-2]])
    split = SplitSoftmax.from_columns(0.5, [[9]])
    with pytest.raises(ValueError, match="beyond"):
        split.instruction_mask(4)
    with pytest.raises(ValueError, match="rows"):
        split_softmax_weights(torch.rand(2, 1, 1, 10).softmax(-1), split)


# ------------------------------------------------------------------------------------------------
# Behind the library's attention: our model, a Hugging Face model on attn_implementation="gatt", the KV cache
# ------------------------------------------------------------------------------------------------

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import gatt  # noqa: E402,F401  (registers attn_implementation="gatt")
from gatt.model.generation import ChatBatch  # noqa: E402
from gatt.model.modeling import GattForCausalLM  # noqa: E402
from gatt.model.sampling import Sampler  # noqa: E402


def tiny_llama(attn_implementation: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return tiny_llama("gatt")


@pytest.fixture(scope="module")
def model(llama) -> GattForCausalLM:
    return GattForCausalLM.from_llama(llama)


IDS = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(0))
SPLIT = SplitSoftmax.from_columns(0.7, [[3, 4, 5, 6], [2, 3]])


@torch.no_grad()
def test_library_model_fused_and_explicit_paths_agree_and_change_the_logits(model):
    plain = model(IDS).logits
    fused = model(IDS, split_softmax=SPLIT).logits
    explicit = model(IDS, split_softmax=SPLIT, output_attentions=True)
    torch.testing.assert_close(fused, explicit.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused[0, :7], plain[0, :7])  # queries up to the instruction's end: unchanged
    torch.testing.assert_close(fused[1, :4], plain[1, :4])
    assert (fused[0, 7:] - plain[0, 7:]).abs().max() > 1e-2
    # the weights returned are the boosted ones: the instruction's share is pi^k of the plain share
    plain_weights = model(IDS, output_attentions=True).attentions[0][0, :, -1, 3:7].sum(-1)
    boosted_weights = explicit.attentions[0][0, :, -1, 3:7].sum(-1)
    torch.testing.assert_close(boosted_weights, plain_weights**0.3, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def test_hugging_face_model_on_gatt_attention_takes_the_keyword(llama, model):
    torch.testing.assert_close(
        llama(IDS, split_softmax=SPLIT).logits, model(IDS, split_softmax=SPLIT).logits, rtol=1e-4, atol=1e-4
    )
    assert (llama(IDS, split_softmax=SPLIT).logits - llama(IDS).logits).abs().max() > 1e-2


@pytest.mark.parametrize("which", ["llama", "model"])
@torch.no_grad()
def test_kv_cache_decoding_with_split_softmax_equals_the_full_forward(llama, model, which):
    net = llama if which == "llama" else model
    full = net(IDS, split_softmax=SPLIT).logits  # (B, T, V)
    out = net(IDS[:, :10], split_softmax=SPLIT, use_cache=True)
    cache, steps = output_cache(out), [out.logits[:, -1]]
    for t in range(10, 23):
        out = net(IDS[:, t : t + 1], **cache_kwargs(cache), use_cache=True, split_softmax=SPLIT)
        steps.append(out.logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 9:23], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_generate_of_the_library_model_takes_split_softmax(model):
    ids, split = IDS[:1, :16], SplitSoftmax.from_columns(0.9, [[2, 3, 4, 5]])
    tokens = ids[0].tolist()
    for _ in range(6):  # greedy, re-encoding everything each step
        tokens.append(int(model(torch.tensor([tokens]), split_softmax=split).logits[0, -1].argmax()))
    out = model.generate(ids, max_new_tokens=6, do_sample=False, split_softmax=split, pad_token_id=0, eos_token_id=None)
    assert out[0].tolist() == tokens


def test_chat_batch_boosts_each_rows_instruction_like_reencoding(model):
    """Rows of different lengths (left padding, holes): each reply equals a greedy loop that re-encodes the row
    alone with split-softmax on its instruction's columns."""
    prompts = {"a": list(range(10, 30)), "b": list(range(40, 52))}
    marked = {"a": [2, 3, 4, 5], "b": [1, 2, 3]}
    chat = ChatBatch(model, _Tokenizer(), Sampler(do_sample=False), max_new_tokens=8, split_softmax=0.8)
    out = chat.generate(prompts, marked=marked)
    for key, ids in prompts.items():
        tokens = list(ids)
        split = SplitSoftmax.from_columns(0.8, [marked[key]])
        for _ in range(8):
            tokens.append(int(model(torch.tensor([tokens]), split_softmax=split).logits[0, -1].argmax()))
        assert out[key][0].tokens == tokens[len(ids) :]
    plain = ChatBatch(model, _Tokenizer(), Sampler(do_sample=False), max_new_tokens=8).generate(prompts, marked=marked)
    assert any(plain[k][0].tokens != out[k][0].tokens for k in prompts)


def test_chat_batch_refuses_split_softmax_on_attention_that_ignores_it():
    with pytest.raises(ValueError, match="attn_implementation"):
        ChatBatch(tiny_llama("sdpa"), _Tokenizer(), Sampler(do_sample=False), max_new_tokens=4, split_softmax=0.5)


class _Tokenizer:
    """What ChatBatch needs of a tokenizer, for token ids that are not text."""

    pad_token_id, eos_token_id = 0, 2

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))
