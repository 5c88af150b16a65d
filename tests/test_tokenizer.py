"""Tests for the byte-level BPE tokenizer and its chat template."""

import itertools

import pytest
from jinja2.exceptions import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from gatt.model.tokenizer import (
    ASSISTANT_TOKEN,
    BOS_TOKEN,
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
    SYSTEM_TOKEN,
    USER_TOKEN,
    train_tokenizer,
)

SUBJECTS = ["The cat", "A young girl", "My neighbour", "Le chat", "Une élève", "Mon voisin"]
VERBS = ["reads", "paints", "watches", "lit", "peint", "regarde"]
OBJECTS = ["a long book.", "the old house.", "the river at night.", "un long livre.", "la vieille maison."]
CORPUS = [f"{s} {v} {o}" for s, v, o in itertools.product(SUBJECTS, VERBS, OBJECTS)]  # 180 sentences

DIALOGUE = [
    {"role": "system", "content": "Always answer in French."},
    {"role": "user", "content": "Hello, who are you?"},
    {"role": "assistant", "content": "Je suis un assistant."},
    {"role": "user", "content": "What do you like?"},
    {"role": "assistant", "content": "J'aime la rivière la nuit 🌙"},
]
EXPECTED_RENDER = (
    "<|begin|>"
    "<|system|>\nAlways answer in French.<|end|>\n"
    "<|user|>\nHello, who are you?<|end|>\n"
    "<|assistant|>\nJe suis un assistant.<|end|>\n"
    "<|user|>\nWhat do you like?<|end|>\n"
    "<|assistant|>\nJ'aime la rivière la nuit 🌙<|end|>\n"
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(CORPUS, vocab_size=600)


def _masked_encoding(tok: PreTrainedTokenizerFast, messages: list[dict[str, str]]):
    return tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)


def test_special_tokens_ids_and_strings(tokenizer):
    expected = {PAD_TOKEN: 0, BOS_TOKEN: 1, EOS_TOKEN: 2, SYSTEM_TOKEN: 3, USER_TOKEN: 4, ASSISTANT_TOKEN: 5}
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in expected} == expected
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == ("<|pad|>", "<|begin|>", "<|end|>")
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert {"<|system|>", "<|user|>", "<|assistant|>"} <= set(tokenizer.all_special_tokens)
    assert tokenizer.model_max_length == 2048
    assert len(tokenizer) <= 600


@pytest.mark.parametrize("text", ["The cat reads a book.", "Une élève peint où ça?", "Moon 🌙 and ∑ 中文 \t\n end"])
def test_round_trip_is_lossless(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids


def test_plain_encoding_adds_no_special_tokens(tokenizer):
    ids = tokenizer("The cat reads.")["input_ids"]
    assert not set(ids) & set(tokenizer.all_special_ids)


def test_chat_template_renders_expected_string(tokenizer):
    assert tokenizer.apply_chat_template(DIALOGUE, tokenize=False) == EXPECTED_RENDER
    ids = _masked_encoding(tokenizer, DIALOGUE)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids) == EXPECTED_RENDER


def test_assistant_mask_covers_exactly_replies_and_end_token(tokenizer):
    enc = _masked_encoding(tokenizer, DIALOGUE)
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    assert len(mask) == len(ids) and set(mask) <= {0, 1}
    masked = [i for i, m in zip(ids, mask) if m]
    unmasked = [i for i, m in zip(ids, mask) if not m]
    replies = [m["content"] + EOS_TOKEN for m in DIALOGUE if m["role"] == "assistant"]
    assert tokenizer.decode(masked) == "".join(replies)
    # Two separate spans, one per assistant turn.
    starts = [k for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1])]
    assert len(starts) == 2
    # Everything else (bos, headers, user/system turns, trailing newlines) is unmasked.
    assert tokenizer.decode(unmasked) == EXPECTED_RENDER.replace(replies[0], "").replace(replies[1], "")


def test_generation_prompt_appends_assistant_header(tokenizer):
    rendered = tokenizer.apply_chat_template(DIALOGUE[:2], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|end|>\n<|assistant|>\n")
    assert not tokenizer.apply_chat_template(DIALOGUE[:2], tokenize=False).endswith("<|assistant|>\n")


def test_unknown_role_raises(tokenizer):
    with pytest.raises(TemplateError, match="Unknown role: tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "42"}], tokenize=False)


def test_save_and_reload_round_trip(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.chat_template == CHAT_TEMPLATE
    before, after = _masked_encoding(tokenizer, DIALOGUE), _masked_encoding(reloaded, DIALOGUE)
    assert after["input_ids"] == before["input_ids"]
    assert after["assistant_masks"] == before["assistant_masks"]
    assert (reloaded.pad_token_id, reloaded.bos_token_id, reloaded.eos_token_id) == (0, 1, 2)
    assert reloaded("The cat reads.")["input_ids"] == tokenizer("The cat reads.")["input_ids"]


@pytest.mark.parametrize(
    ("texts", "vocab_size", "message"),
    [([], 600, "at least one non-empty"), (["", ""], 600, "at least one non-empty"), (CORPUS, 100, "at least 262")],
)
def test_bad_input_raises_value_error(texts, vocab_size, message):
    with pytest.raises(ValueError, match=message):
        train_tokenizer(texts, vocab_size=vocab_size)
