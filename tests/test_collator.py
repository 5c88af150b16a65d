"""GAttCollator: instruction placement, label masks per mode, truncation, batching, packing, trainers.

Everything is built here: records in the format of docs/data.md ("Formats"), a tokenizer trained on their texts
(`gatt.model.tokenizer.train_tokenizer`, whose template has {% generation %} marks) and, on copies of it,
three more templates without generation marks: ChatML, Llama-3-style and one without a system role.
"""

from __future__ import annotations

import copy
import logging
import math
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from gatt.data.collator import IGNORE_INDEX, GAttCollator
from gatt.model.attention.masks import segment_ids_from_position_ids, segment_spans
from gatt.model.modeling import GattConfig, GattForCausalLM
from gatt.model.tokenizer import train_tokenizer

# -- records (docs/data.md format) -------------------------------------------------------------------

FRENCH = {
    "id": "d-000001",
    "instruction": "Always answer in French.",
    "instruction_short": "Language: French",
    "use_short": False,
    "constraints": [{"family": "language", "value": "French", "checks": [{"type": "language", "code": "fr"}]}],
    "messages": [
        {"role": "user", "content": "Hello, who are you?"},
        {"role": "assistant", "content": "Je suis un assistant patient."},
        {"role": "user", "content": "What is the weather like today?"},
        {"role": "assistant", "content": "Il fait beau et chaud aujourd'hui."},
        {"role": "user", "content": "Can you recommend a good book?"},
        {"role": "assistant", "content": "Je vous recommande Les Misérables."},
        {"role": "user", "content": "Where should I travel next summer?"},
        {"role": "assistant", "content": "Allez en Bretagne, la mer est belle."},
    ],
    "sampled_with_instruction": [True, True, True, True],
    "meta": {"teacher": "oracle", "seed": 1},
}

NAPOLEON = {
    "id": "d-000002",
    "instruction": "Always act as Napoleon from now.",
    "instruction_short": "Figure: Napoleon",
    "use_short": True,
    "constraints": [
        {"family": "figure", "value": "Napoleon", "checks": [{"type": "contains_any", "words": ["emperor", "France"]}]},
        {"family": "format", "value": "short", "checks": [{"type": "max_words", "n": 40}]},
    ],
    "messages": [
        {"role": "user", "content": "Tell me about your childhood."},
        {"role": "assistant", "content": "I grew up on Corsica, dreaming of glory for France."},
        {"role": "user", "content": "What do you eat for breakfast?"},
        {"role": "assistant", "content": "Bread and coffee, like any soldier."},
        {"role": "user", "content": "Who is your greatest rival?"},
        {"role": "assistant", "content": "Wellington, though I would never admit he was my equal."},
    ],
    "sampled_with_instruction": [True, False, True],
    "meta": {"teacher": "oracle", "seed": 2},
}

TENNIS = {
    "id": "d-000003",
    "instruction": "You enjoy playing tennis and mention it often.",
    "instruction_short": "Hobby: tennis",
    "use_short": False,
    "constraints": [
        {"family": "hobby", "value": "tennis", "checks": [{"type": "contains_any", "words": ["tennis"]}]},
        {"family": "format", "value": "caps", "checks": [{"type": "regex", "pattern": "^[A-Z]"}]},
    ],
    "messages": [
        {"role": "user", "content": "How was your weekend?"},
        {"role": "assistant", "content": "Great, I played tennis all Saturday."},
        {"role": "user", "content": "Do you like cooking?"},
        {"role": "assistant", "content": "Yes, after a tennis match I cook pasta."},
        {"role": "user", "content": "What music do you listen to?"},
        {"role": "assistant", "content": "Rock music, it keeps me going on the court."},
        {"role": "user", "content": "Any plans for the holidays?"},
        {"role": "assistant", "content": "A tennis camp in Spain, of course."},
        {"role": "user", "content": "What is your favorite hobby?"},
        {"role": "assistant", "content": "Tennis, without any doubt."},
    ],
    "sampled_with_instruction": [True, True, False, True, True],
    "meta": {"teacher": "oracle", "seed": 3},
}

RECORDS = [FRENCH, NAPOLEON, TENNIS]


def _texts(records):
    for r in records:
        yield r["instruction"]
        yield r["instruction_short"]
        for m in r["messages"]:
            yield m["content"]


def instruction_of(record) -> str:
    return record["instruction_short"] if record["use_short"] else record["instruction"]


def other_instruction_of(record) -> str:
    return record["instruction"] if record["use_short"] else record["instruction_short"]


def replies(record) -> list[str]:
    return [m["content"] for m in record["messages"] if m["role"] == "assistant"]


def user_messages(record) -> list[str]:
    return [m["content"] for m in record["messages"] if m["role"] == "user"]


# -- templates ----------------------------------------------------------------------------------

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ message['content'] ~ '<|im_end|>' ~ '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

LLAMA3_TEMPLATE = (
    "{{- '<|begin_of_text|>' -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ (message['content'] | trim) ~ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

# Gemma-like turns, but refusing a system message (as some Mistral-era templates do).
NOSYSTEM_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{{- raise_exception('System role not supported') -}}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' ~ role ~ '\\n' ~ message['content'] ~ '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

# name -> (end-of-turn token, header in front of a user message's content, header of a system message)
TEMPLATE_INFO = {
    "library": ("<|end|>", "<|user|>\n", "<|system|>\n"),
    "chatml": ("<|im_end|>", "<|im_start|>user\n", "<|im_start|>system\n"),
    "llama3": (
        "<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "<|start_header_id|>system<|end_header_id|>\n\n",
    ),
    "nosystem": ("<end_of_turn>", "<start_of_turn>user\n", None),
}
WITH_SYSTEM = ["library", "chatml", "llama3"]
ALL_TEMPLATES = [*WITH_SYSTEM, "nosystem"]


def _with_template(base, template: str, specials: list[str]):
    tok = copy.deepcopy(base)
    # transformers v5: `extra_special_tokens` (was `additional_special_tokens`); keep the role tokens special too.
    tok.add_special_tokens({"extra_special_tokens": specials}, replace_extra_special_tokens=False)
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def tokenizers():
    base = train_tokenizer(list(_texts(RECORDS)) * 3, vocab_size=700, min_frequency=2)
    toks = {
        "library": base,
        "chatml": _with_template(base, CHATML_TEMPLATE, ["<|im_start|>", "<|im_end|>"]),
        "llama3": _with_template(
            base, LLAMA3_TEMPLATE, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        ),
        "nosystem": _with_template(base, NOSYSTEM_TEMPLATE, ["<start_of_turn>", "<end_of_turn>"]),
    }
    for name, tok in toks.items():  # the end-of-turn token is one special token, not split by BPE
        eot = TEMPLATE_INFO[name][0]
        assert tok.convert_ids_to_tokens(tok(eot, add_special_tokens=False)["input_ids"]) == [eot]
    return toks


# -- helpers ----------------------------------------------------------------------------------------


def decode(tok, ids) -> str:
    return tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def runs(labels) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of supervised positions."""
    labels = list(labels)
    out, start = [], None
    for i, label in enumerate([*labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = i
        elif label == IGNORE_INDEX and start is not None:
            out.append((start, i))
            start = None
    return out


def supervised_ids(example) -> list[int]:
    return [t for t in example.labels if t != IGNORE_INDEX]


def batch_supervised_ids(batch) -> Counter:
    labels = batch["labels"]
    return Counter(labels[labels != IGNORE_INDEX].tolist())


def assert_labels_copy_inputs(example):
    assert len(example.input_ids) == len(example.labels)
    for token, label in zip(example.input_ids, example.labels):
        assert label == IGNORE_INDEX or label == token


def expected_chat(record, placement: str) -> list[dict[str, str]]:
    """The dialogue the collator should render (used only where the placement is system)."""
    messages = [dict(m) for m in record["messages"]]
    if placement == "system":
        return [{"role": "system", "content": instruction_of(record)}, *messages]
    raise AssertionError("only used for the system placement")


# -- 1. instruction placement ---------------------------------------------------------------------


@pytest.mark.parametrize("name", WITH_SYSTEM)
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["id"])
def test_instruction_once_in_the_system_message_by_default(tokenizers, name, record):
    tok = tokenizers[name]
    _, user_header, system_header = TEMPLATE_INFO[name]
    collator = GAttCollator(tok, mode="last")
    (example,) = collator.examples(record)
    text = decode(tok, example.input_ids)
    instruction = instruction_of(record)
    # The whole input is exactly the template's render of [system: instruction, *messages].
    assert text == tok.apply_chat_template(expected_chat(record, "system"), tokenize=False)
    assert text.count(instruction) == 1
    assert other_instruction_of(record) not in text  # full or short per use_short, not both
    assert text.count(system_header) == 1
    assert system_header + instruction in text
    assert text.index(system_header + instruction) < text.index(user_header)  # before the first user turn
    for user in user_messages(record):
        assert text.count(user_header + user) == 1  # every user message unchanged


@pytest.mark.parametrize("name", ALL_TEMPLATES)
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["id"])
def test_instruction_once_in_front_of_the_first_user_message(tokenizers, name, record, caplog):
    tok = tokenizers[name]
    _, user_header, system_header = TEMPLATE_INFO[name]
    with caplog.at_level(logging.WARNING, logger="gatt.data.collator"):
        collator = GAttCollator(tok, mode="last", instruction_placement="first_user")
    assert not caplog.records  # an explicit first_user placement is no fallback
    assert collator.instruction_placement == "first_user"
    (example,) = collator.examples(record)
    text = decode(tok, example.input_ids)
    instruction = instruction_of(record)
    users = user_messages(record)
    assert text.count(instruction) == 1
    assert other_instruction_of(record) not in text
    if system_header is not None:
        assert system_header not in text
    # The first user message starts with the instruction, then its own content.
    assert re.search(re.escape(user_header + instruction) + r"\s*" + re.escape(users[0]), text)
    # Later user messages are exactly as in the record, without the instruction.
    for user in users[1:]:
        assert text.count(user_header + user) == 1
    first_turn_end = text.index(users[0]) + len(users[0])
    assert instruction not in text[first_turn_end:]


def test_template_without_system_role_falls_back_to_first_user_with_a_warning(tokenizers, caplog):
    tok = tokenizers["nosystem"]
    with caplog.at_level(logging.WARNING, logger="gatt.data.collator"):
        collator = GAttCollator(tok, mode="last")  # default placement: system
    warnings = [r for r in caplog.records if r.name == "gatt.data.collator" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "system role" in warnings[0].getMessage()
    assert collator.instruction_placement == "first_user"
    for record in RECORDS:
        (example,) = collator.examples(record)
        text = decode(tok, example.input_ids)
        instruction = instruction_of(record)
        assert text.count(instruction) == 1
        assert text.startswith("<start_of_turn>user\n" + instruction)
        assert "<start_of_turn>system" not in text


def test_template_that_silently_drops_system_messages_also_falls_back(tokenizers, caplog):
    dropping = (
        "{%- for message in messages if message['role'] != 'system' -%}"
        + CHATML_TEMPLATE[len("{%- for message in messages -%}") :]
    )
    tok = copy.deepcopy(tokenizers["chatml"])
    tok.chat_template = dropping
    with caplog.at_level(logging.WARNING, logger="gatt.data.collator"):
        collator = GAttCollator(tok, mode="last")
    assert collator.instruction_placement == "first_user"
    assert any("system role" in r.getMessage() for r in caplog.records)
    (example,) = collator.examples(FRENCH)
    text = decode(tok, example.input_ids)
    assert text.count(FRENCH["instruction"]) == 1  # not silently lost
    assert text.startswith("<|im_start|>user\n" + FRENCH["instruction"])


def test_templates_with_a_system_role_give_no_warning(tokenizers, caplog):
    with caplog.at_level(logging.WARNING, logger="gatt.data.collator"):
        for name in WITH_SYSTEM:
            assert GAttCollator(tokenizers[name]).instruction_placement == "system"
    assert not caplog.records


# -- 2. mode="last" -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_TEMPLATES)
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["id"])
def test_last_mode_supervises_only_the_final_reply_and_its_end_of_turn(tokenizers, name, record):
    tok = tokenizers[name]
    eot = TEMPLATE_INFO[name][0]
    collator = GAttCollator(tok, mode="last")
    (example,) = collator.examples(record)
    assert_labels_copy_inputs(example)
    spans = runs(example.labels)
    assert len(spans) == 1  # one contiguous span; every other label is -100 (earlier replies included)
    start, end = spans[0]
    assert decode(tok, example.input_ids[start:end]) == replies(record)[-1] + eot
    assert decode(tok, supervised_ids(example)) == replies(record)[-1] + eot
    # The span starts right after the generation prompt of the final turn: the header is not trained on.
    chat = collator.chat(record)
    prompt = tok.apply_chat_template(chat[:-1], tokenize=False, add_generation_prompt=True)
    assert decode(tok, example.input_ids[:start]) == prompt
    # Nothing of the earlier replies is supervised.
    for reply in replies(record)[:-1]:
        assert reply not in decode(tok, supervised_ids(example))


# -- 3. mode="all" --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_TEMPLATES)
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["id"])
def test_all_mode_supervises_exactly_the_sampled_replies_in_order(tokenizers, name, record):
    tok = tokenizers[name]
    eot = TEMPLATE_INFO[name][0]
    collator = GAttCollator(tok, mode="all")
    (example,) = collator.examples(record)
    assert_labels_copy_inputs(example)
    sampled = [r for r, s in zip(replies(record), record["sampled_with_instruction"]) if s]
    not_sampled = [r for r, s in zip(replies(record), record["sampled_with_instruction"]) if not s]
    spans = runs(example.labels)
    assert [decode(tok, example.input_ids[a:b]) for a, b in spans] == [r + eot for r in sampled]
    assert decode(tok, supervised_ids(example)) == "".join(r + eot for r in sampled)
    text = decode(tok, supervised_ids(example))
    for reply in not_sampled:
        assert reply not in text
    # The reply marked false is still in the input (the context), just not trained on.
    for reply in not_sampled:
        assert reply in decode(tok, example.input_ids)


def test_all_mode_without_sampled_field_trains_every_reply(tokenizers):
    tok = tokenizers["chatml"]
    record = {k: v for k, v in NAPOLEON.items() if k != "sampled_with_instruction"}
    (example,) = GAttCollator(tok, mode="all").examples(record)
    assert decode(tok, supervised_ids(example)) == "".join(r + "<|im_end|>" for r in replies(record))


# -- 4. mode="expand" -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_TEMPLATES)
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["id"])
def test_expand_mode_one_example_per_sampled_reply_cut_after_it(tokenizers, name, record):
    tok = tokenizers[name]
    eot = TEMPLATE_INFO[name][0]
    expand = GAttCollator(tok, mode="expand").examples(record)
    sampled_idx = [i for i, s in enumerate(record["sampled_with_instruction"]) if s]
    assert len(expand) == len(sampled_idx)
    users = user_messages(record)
    for example, k in zip(expand, sampled_idx):
        assert_labels_copy_inputs(example)
        spans = runs(example.labels)
        assert len(spans) == 1
        start, end = spans[0]
        assert decode(tok, example.input_ids[start:end]) == replies(record)[k] + eot
        # The input ends with that reply's end-of-turn token, at most template whitespace after it.
        assert decode(tok, example.input_ids[end:]).strip() == ""
        text = decode(tok, example.input_ids)
        for later in users[k + 1 :]:
            assert later not in text
        for earlier in users[: k + 1]:
            assert earlier in text
        assert text.count(instruction_of(record)) == 1  # the instruction in every expanded example, once
    (all_example,) = GAttCollator(tok, mode="all").examples(record)
    assert Counter(t for e in expand for t in supervised_ids(e)) == Counter(supervised_ids(all_example))


# -- 5. over-long dialogues -------------------------------------------------------------------------


def _render_len(tok, chat) -> int:
    return len(tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"])


def _chat_keeping(record, turns: list[int]) -> list[dict[str, str]]:
    messages = record["messages"]
    kept = [m for k in turns for m in messages[2 * k : 2 * k + 2]]
    return [{"role": "system", "content": instruction_of(record)}, *kept]


@pytest.mark.parametrize("name", WITH_SYSTEM)
def test_overlong_dialogue_drops_middle_turns_oldest_first(tokenizers, name):
    tok = tokenizers[name]
    eot = TEMPLATE_INFO[name][0]
    record = TENNIS  # 5 turns
    users = user_messages(record)
    full = _render_len(tok, _chat_keeping(record, [0, 1, 2, 3, 4]))
    # (max_length, turns that must remain): exact fits after dropping 0, 1, 2 and 3 middle turns.
    cases = [
        (full, [0, 1, 2, 3, 4]),
        (_render_len(tok, _chat_keeping(record, [0, 2, 3, 4])), [0, 2, 3, 4]),
        (_render_len(tok, _chat_keeping(record, [0, 3, 4])), [0, 3, 4]),
        (_render_len(tok, _chat_keeping(record, [0, 4])), [0, 4]),
    ]
    for max_length, kept in cases:
        collator = GAttCollator(tok, mode="last", max_length=max_length)
        (example,) = collator.examples(record)
        assert len(example.input_ids) <= max_length
        assert len(example.input_ids) == max_length  # the cases are built to fit exactly
        text = decode(tok, example.input_ids)
        assert [u for u in users if u in text] == [users[k] for k in kept]
        assert text.count(instruction_of(record)) == 1  # the first turn, with the instruction, is kept
        assert replies(record)[0] in text
        assert decode(tok, supervised_ids(example)) == replies(record)[-1] + eot  # the target is whole
        assert collator.stats["dropped_turns"] == 5 - len(kept)
        assert collator.stats["skipped_examples"] == 0
    # One token less than the smallest case: nothing left to drop, the example is skipped, never truncated.
    collator = GAttCollator(tok, mode="last", max_length=cases[-1][0] - 1)
    assert collator.examples(record) == []
    assert collator.stats["skipped_examples"] == 1
    assert collator.stats["examples"] == 0


def test_overlong_dialogue_with_first_user_placement(tokenizers):
    tok = tokenizers["nosystem"]
    record = FRENCH
    collator = GAttCollator(tok, mode="last", instruction_placement="first_user", max_length=10_000)
    (full,) = collator.examples(record)
    collator = GAttCollator(tok, mode="last", instruction_placement="first_user", max_length=len(full.input_ids) - 1)
    (example,) = collator.examples(record)
    text = decode(tok, example.input_ids)
    users = user_messages(record)
    assert [u for u in users if u in text] == [users[0], users[2], users[3]]  # turn 1 dropped, oldest first
    assert text.startswith("<start_of_turn>user\n" + instruction_of(record))
    assert collator.stats["dropped_turns"] == 1
    assert decode(tok, supervised_ids(example)) == replies(record)[-1] + "<end_of_turn>"


@pytest.mark.parametrize("name", ["library", "llama3"])
def test_overlong_all_mode_drops_only_unsupervised_turns(tokenizers, name):
    tok = tokenizers[name]
    eot = TEMPLATE_INFO[name][0]
    record = {**TENNIS, "id": "d-long", "sampled_with_instruction": [True, False, True, False, True]}
    users = user_messages(record)
    fits = _render_len(tok, _chat_keeping(record, [0, 2, 4]))  # both unsupervised turns dropped
    collator = GAttCollator(tok, mode="all", max_length=fits)
    (example,) = collator.examples(record)
    text = decode(tok, example.input_ids)
    assert len(example.input_ids) <= fits
    assert [u for u in users if u in text] == [users[0], users[2], users[4]]
    assert [decode(tok, example.input_ids[a:b]) for a, b in runs(example.labels)] == [
        replies(record)[k] + eot for k in (0, 2, 4)
    ]
    assert collator.stats["dropped_turns"] == 2
    collator = GAttCollator(tok, mode="all", max_length=fits - 1)  # supervised turns are never dropped
    assert collator.examples(record) == []
    assert collator.stats["skipped_examples"] == 1


def test_batch_skips_what_cannot_fit_and_keeps_the_rest(tokenizers):
    tok = tokenizers["library"]
    long_tail = [*TENNIS["messages"][:-1], {"role": "assistant", "content": " ".join(replies(TENNIS)) * 2}]
    long = {**TENNIS, "id": "d-long-tail", "messages": long_tail}
    limit = len(GAttCollator(tok, mode="last").examples(NAPOLEON)[0].input_ids)  # NAPOLEON fits whole
    assert _render_len(tok, _chat_keeping(long, [0, 4])) > limit  # `long` cannot fit even with turns dropped
    collator = GAttCollator(tok, mode="last", max_length=limit)
    batch = collator([long, NAPOLEON])
    assert batch["input_ids"].shape == (1, limit)
    assert collator.stats["skipped_examples"] == 1 and collator.stats["examples"] == 1
    assert collator.stats["dropped_turns"] == 3  # it tried every middle turn before giving up
    assert decode(tok, batch["labels"][batch["labels"] != IGNORE_INDEX].tolist()) == replies(NAPOLEON)[-1] + "<|end|>"
    with pytest.raises(ValueError, match="max_length"):  # a batch where nothing fits
        GAttCollator(tok, mode="last", max_length=limit)([long])
    # The trainer filters with `fits` up front, so no process ever draws such a batch; the check counts nothing.
    assert [collator.fits(r) for r in (long, NAPOLEON)] == [False, True]
    assert collator.stats["skipped_examples"] == 1 and collator.stats["examples"] == 1


@pytest.mark.parametrize("mode", ["last", "all", "expand"])
@pytest.mark.parametrize("max_length", [40, 60, 80, 120, 400])
def test_examples_never_exceed_max_length(tokenizers, mode, max_length):
    tok = tokenizers["chatml"]
    collator = GAttCollator(tok, mode=mode, max_length=max_length)
    for record in RECORDS:
        for example in collator.examples(record):
            assert len(example.input_ids) <= max_length
            assert runs(example.labels)  # a kept example always has its (whole) target
            for a, b in runs(example.labels):  # each supervised span is one whole reply + <|im_end|>
                assert decode(tok, example.input_ids[a:b]) in [r + "<|im_end|>" for r in replies(record)]


# -- 6. batching: padding and packing --------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_TEMPLATES)
@pytest.mark.parametrize("mode", ["last", "all", "expand"])
def test_padding_batch_is_right_padded(tokenizers, name, mode):
    tok = tokenizers[name]
    collator = GAttCollator(tok, mode=mode)
    examples = [e for r in RECORDS for e in GAttCollator(tok, mode=mode).examples(r)]
    batch = collator(RECORDS)
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    shape = batch["input_ids"].shape
    assert batch["labels"].shape == shape == batch["attention_mask"].shape
    assert shape == (len(examples), max(len(e.input_ids) for e in examples))
    assert collator.pad_token_id == tok.pad_token_id
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        assert batch["input_ids"][row, :n].tolist() == example.input_ids
        assert batch["labels"][row, :n].tolist() == example.labels
        assert (batch["input_ids"][row, n:] == tok.pad_token_id).all()
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (shape[1] - n)
    assert collator.stats["supervised_tokens"] == int((batch["labels"] != IGNORE_INDEX).sum())


def _segments(position_ids_row) -> list[tuple[int, int]]:
    starts = [i for i, p in enumerate(position_ids_row.tolist()) if p == 0]
    return list(zip(starts, [*starts[1:], len(position_ids_row)]))


@pytest.mark.parametrize("name", ALL_TEMPLATES)
@pytest.mark.parametrize("mode", ["last", "all", "expand"])
@pytest.mark.parametrize("max_length", [160, 300, 1000])
def test_packing_batch_rows_positions_and_supervised_tokens(tokenizers, name, mode, max_length):
    tok = tokenizers[name]
    padded = GAttCollator(tok, mode=mode, max_length=max_length)(RECORDS)
    collator = GAttCollator(tok, mode=mode, max_length=max_length, packing=True)
    examples = [e for r in RECORDS for e in GAttCollator(tok, mode=mode, max_length=max_length).examples(r)]
    batch = collator(RECORDS)
    assert set(batch) == {"input_ids", "labels", "position_ids"}  # no attention_mask
    shape = batch["input_ids"].shape
    assert batch["labels"].shape == shape == batch["position_ids"].shape
    assert shape[1] <= max_length
    assert shape[0] <= len(examples)
    if max_length >= sum(len(e.input_ids) for e in examples):
        assert shape[0] == 1  # everything fits one row
    found = []
    for row in range(shape[0]):
        for a, b in _segments(batch["position_ids"][row]):
            ids = batch["input_ids"][row, a:b].tolist()
            labels = batch["labels"][row, a:b].tolist()
            assert batch["position_ids"][row, a:b].tolist() == list(range(b - a))  # restart at 0 per example
            if all(t == tok.pad_token_id for t in ids) and all(t == IGNORE_INDEX for t in labels):
                assert b == shape[1]  # padding only at the end of a row
                continue
            found.append((ids, labels))
    # Every example appears once, whole, with its own labels.
    assert sorted(found) == sorted((e.input_ids, e.labels) for e in examples)
    assert batch_supervised_ids(batch) == batch_supervised_ids(padded)
    assert int((batch["labels"] != IGNORE_INDEX).sum()) == int((padded["labels"] != IGNORE_INDEX).sum())


# -- 7. packing loss equals padding loss with the library's model ----------------------------------


def tiny_model(tok) -> GattForCausalLM:
    torch.manual_seed(0)
    config = GattConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return GattForCausalLM(config)


def _summed_ce(logits, labels) -> tuple[torch.Tensor, int]:
    shift_logits, shift_labels = logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
    total = F.cross_entropy(shift_logits.double(), shift_labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return total, int((shift_labels != IGNORE_INDEX).sum())


@pytest.mark.parametrize("name", ["library", "llama3", "nosystem"])
@pytest.mark.parametrize("mode", ["all", "expand"])
def test_packed_loss_equals_padded_loss(tokenizers, name, mode):
    tok = tokenizers[name]
    model = tiny_model(tok).eval()
    records = RECORDS * 2
    padded = GAttCollator(tok, mode=mode, max_length=512)(records)
    packed = GAttCollator(tok, mode=mode, max_length=512, packing=True)(records)
    assert packed["input_ids"].shape[0] < padded["input_ids"].shape[0]  # rows really hold several examples
    with torch.no_grad():  # use_cache=False: see test_packed_rows_with_the_default_model_call below
        out_pad = model(**padded, use_cache=False)
        out_pack = model(**packed, use_cache=False)
    total_pad, count_pad = _summed_ce(out_pad.logits, padded["labels"])
    total_pack, count_pack = _summed_ce(out_pack.logits, packed["labels"])
    assert count_pad == count_pack == int((padded["labels"] != IGNORE_INDEX).sum())
    assert abs(total_pad / count_pad - total_pack / count_pack) < 1e-5
    # The model's own loss (mean over supervised tokens) agrees too.
    assert abs(out_pad.loss.item() - out_pack.loss.item()) < 1e-5
    assert abs(out_pad.loss.item() - (total_pad / count_pad).item()) < 1e-5
    assert math.isfinite(out_pack.loss.item())


@pytest.mark.parametrize("mode", ["all", "expand"])
def test_padding_free_packs_every_example_in_one_row_with_the_padded_loss(tokenizers, mode):
    tok = tokenizers["library"]
    model = tiny_model(tok).eval()
    records = RECORDS * 3
    padded = GAttCollator(tok, mode=mode, max_length=256)(records)
    rows = GAttCollator(tok, mode=mode, max_length=256, packing=True)(records)
    flat = GAttCollator(tok, mode=mode, max_length=256, packing=True, padding_free=True)(records)
    real_tokens = int(padded["attention_mask"].sum())
    assert rows["input_ids"].shape[0] > 1  # rows of at most max_length need several rows here
    assert flat["input_ids"].shape == (1, real_tokens)  # one row, not one padding token
    assert int((flat["labels"] != IGNORE_INDEX).sum()) == int((padded["labels"] != IGNORE_INDEX).sum())
    with torch.no_grad():
        assert abs(model(**padded, use_cache=False).loss.item() - model(**flat, use_cache=False).loss.item()) < 1e-5
    with pytest.raises(ValueError, match="padding_free"):
        GAttCollator(tok, mode=mode, padding_free=True)


def test_packed_rows_with_the_default_model_call(tokenizers):
    """`model(**packed_batch)` as a plain Trainer calls it: no use_cache argument."""
    tok = tokenizers["library"]
    model = tiny_model(tok).eval()
    padded = GAttCollator(tok, mode="all", max_length=512)(RECORDS)
    packed = GAttCollator(tok, mode="all", max_length=512, packing=True)(RECORDS)
    assert packed["input_ids"].shape[0] == 1
    with torch.no_grad():
        assert abs(model(**padded).loss.item() - model(**packed).loss.item()) < 1e-5


# -- 8. as a data_collator: DataLoader and trl.SFTTrainer ------------------------------------------


@pytest.mark.parametrize("packing", [False, True])
def test_works_as_collate_fn_of_a_dataloader(tokenizers, packing):
    tok = tokenizers["library"]
    collator = GAttCollator(tok, mode="all", max_length=512, packing=packing)
    reference = GAttCollator(tok, mode="all", max_length=512, packing=packing)
    loader = torch.utils.data.DataLoader(RECORDS * 2, batch_size=2, shuffle=False, collate_fn=collator)
    batches = list(loader)
    assert len(batches) == 3
    records = RECORDS * 2
    for i, batch in enumerate(batches):
        expected = reference(records[2 * i : 2 * i + 2])
        assert batch.keys() == expected.keys()
        for key in expected:
            assert torch.equal(batch[key], expected[key])
    supervised = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
    assert supervised == collator.stats["supervised_tokens"] > 0


@pytest.mark.parametrize("packing", [False, True])
def test_works_as_data_collator_of_sft_trainer(tokenizers, tmp_path, packing):
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    tok = tokenizers["library"]
    records = RECORDS * 2
    dataset = datasets.Dataset.from_list(records)  # nested, heterogeneous check dicts: arrow merges them
    assert dataset[0]["messages"] == FRENCH["messages"]
    collator = GAttCollator(tok, mode="all", max_length=512, packing=packing)
    model = tiny_model(tok)
    config = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=2,
        report_to=[],
        remove_unused_columns=False,
        dataset_kwargs={"skip_prepare_dataset": True},
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
    )
    trainer = trl.SFTTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tok, data_collator=collator
    )
    trainer.train()
    assert trainer.state.global_step == 2
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert collator.stats["supervised_tokens"] > 0 and collator.stats["examples"] >= 4


# -- 9. bad input ---------------------------------------------------------------------------------


def test_unknown_mode_or_placement_is_refused_naming_the_allowed_values(tokenizers):
    tok = tokenizers["library"]
    with pytest.raises(ValueError, match=r"'last', 'all' or 'expand'.*'final'"):
        GAttCollator(tok, mode="final")
    with pytest.raises(ValueError, match=r"'system' or 'first_user'.*'user'"):
        GAttCollator(tok, instruction_placement="user")


def test_tokenizer_without_chat_template_is_refused(tokenizers):
    tok = copy.deepcopy(tokenizers["library"])
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        GAttCollator(tok)


@pytest.mark.parametrize("sampled", [[True, True], [True, False, True, True]])
@pytest.mark.parametrize("mode", ["last", "all", "expand"])
def test_sampled_flags_of_the_wrong_length_are_refused_naming_the_record(tokenizers, sampled, mode):
    record = {**NAPOLEON, "id": "d-bad-042", "sampled_with_instruction": sampled}
    collator = GAttCollator(tokenizers["library"], mode=mode)
    with pytest.raises(ValueError, match="d-bad-042"):
        collator.examples(record)
    with pytest.raises(ValueError, match="d-bad-042"):
        collator([record])


def test_empty_sampled_flags_are_refused_too(tokenizers):
    """An explicit empty list is a wrong length too (3 replies), not 'field absent, all sampled'."""
    record = {**NAPOLEON, "id": "d-empty-7", "sampled_with_instruction": []}
    with pytest.raises(ValueError, match="d-empty-7"):
        GAttCollator(tokenizers["library"], mode="all").examples(record)


# -- instructions at any turn (gatt/data/events.py): each event only in the user turn that gives it ---------

FRENCH_ENTRY = {"family": "language", "value": "French", "checks": [{"type": "language", "code": "fr"}]}
REVOKED = {
    **FRENCH,
    "id": "d-000004",
    "kind": "revoke",
    "events": [
        {"turn": 1, "kind": "give", "constraints": [FRENCH_ENTRY], "text": "Always answer in French."},
        {
            "turn": 3,
            "kind": "revoke",
            "constraints": [FRENCH_ENTRY],
            "text": 'You can stop following "Language: French" now.',
        },
    ],
    "messages": [
        *FRENCH["messages"][:4],
        {"role": "user", "content": "Can you recommend a good book?"},
        {"role": "assistant", "content": "I recommend Les Misérables, in English this time."},
        {"role": "user", "content": "Where should I travel next summer?"},
        {"role": "assistant", "content": "Brittany: the sea is beautiful there."},
    ],
}
LATE = {
    **TENNIS,
    "id": "d-000005",
    "instruction": None,
    "instruction_short": None,
    "kind": "late",
    "sampled_with_instruction": [True] * 5,
    "events": [{"turn": 2, "kind": "give", "constraints": TENNIS["constraints"], "text": "From now on: Hobby: tennis"}],
}
EVENT_RECORDS = [REVOKED, LATE]


def expected_event_chat(record, placement: str) -> list[dict[str, str]]:
    """The dialogue with the turn-one instruction placed and each later event appended to its user turn."""
    messages = [dict(m) for m in record["messages"]]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    for event in record["events"]:
        if event["turn"] > 1:
            messages[users[event["turn"] - 1]]["content"] += " " + event["text"]
    instruction = instruction_of(record)
    if instruction and placement == "system":
        return [{"role": "system", "content": instruction}, *messages]
    if instruction:
        messages[0]["content"] = f"{instruction}\n{messages[0]['content']}"
    return messages


@pytest.mark.parametrize("name", ALL_TEMPLATES)
@pytest.mark.parametrize("placement", ["system", "first_user"])
@pytest.mark.parametrize("record", EVENT_RECORDS, ids=lambda r: r["id"])
def test_each_event_only_in_the_user_turn_that_gives_it(tokenizers, name, placement, record):
    tok = tokenizers[name]
    eot, user_header, _ = TEMPLATE_INFO[name]
    placement = placement if name != "nosystem" else "first_user"
    collator = GAttCollator(tok, mode="all", instruction_placement=placement)
    (example,) = collator.examples(record)
    text = decode(tok, example.input_ids)
    assert text == tok.apply_chat_template(expected_event_chat(record, placement), tokenize=False)
    users = user_messages(record)
    for event in record["events"][1 if record["instruction"] else 0 :]:
        assert text.count(event["text"]) == 1
        assert user_header + users[event["turn"] - 1] + " " + event["text"] + eot in text
    # the loss covers every reply sampled with the state in view, and nothing of the events
    assert decode(tok, supervised_ids(example)) == "".join(r + eot for r in replies(record))
    assert [decode(tok, example.input_ids[a:b]) for a, b in runs(example.labels)] == [r + eot for r in replies(record)]


@pytest.mark.parametrize("name", ["library", "llama3"])
def test_overlong_dialogue_never_drops_a_turn_that_gives_an_event(tokenizers, name):
    tok = tokenizers[name]
    record = REVOKED  # the withdrawal is in turn 3 (index 2); the target is the last reply
    collator = GAttCollator(tok, mode="last", max_length=10_000)
    (full,) = collator.examples(record)
    collator = GAttCollator(tok, mode="last", max_length=len(full.input_ids) - 1)
    (example,) = collator.examples(record)
    text = decode(tok, example.input_ids)
    users = user_messages(record)
    assert [u for u in users if u in text] == [users[0], users[2], users[3]]  # turn 2 dropped, not turn 3
    assert record["events"][1]["text"] in text
    # with only the first turn, the event's turn and the target left, nothing more can go: skipped
    collator = GAttCollator(tok, mode="last", max_length=len(example.input_ids) - 1)
    assert collator.examples(record) == []
    assert collator.stats["skipped_examples"] == 1


def test_an_event_after_the_last_user_turn_is_refused_naming_the_record(tokenizers):
    record = {**LATE, "events": [{**LATE["events"][0], "turn": 9}]}
    with pytest.raises(ValueError, match="d-000005.*turn 9"):
        GAttCollator(tokenizers["library"], mode="all").examples(record)


# -- 8. the teacher view (representation distillation, gatt/training/distill.py) ----------------------------


@pytest.mark.parametrize("name", ["library", "chatml", "llama3"])
@pytest.mark.parametrize("packing", [False, True])
def test_the_teacher_view_pairs_positions_that_predict_the_same_supervised_token(tokenizers, name, packing):
    tok = tokenizers[name]
    plain = {k: v for k, v in TENNIS.items() if k != "sampled_with_instruction"}  # SFT data: no view
    batch = GAttCollator(tok, mode="all", max_length=512, packing=packing, teacher_view=True)([FRENCH, plain, NAPOLEON])
    student, teacher = batch["input_ids"].flatten(), batch["teacher_input_ids"]
    if packing:  # the views packed as the student's rows are: segments where the positions restart
        assert "teacher_attention_mask" not in batch
        positions = batch["teacher_position_ids"]
        spans = segment_spans(segment_ids_from_position_ids(positions))
        views = [teacher[r, a:b] for r, row in enumerate(spans) for a, b in row]
        views = [v for v in views if (v != tok.pad_token_id).any()]  # trailing padding is a segment of its own
    else:
        assert "teacher_position_ids" not in batch and teacher.shape[0] == 2
        views = [teacher[row][batch["teacher_attention_mask"][row].bool()] for row in range(teacher.shape[0])]
    assert len(views) == 2  # FRENCH and NAPOLEON; the plain record has none
    for view, record in zip(views, [FRENCH, NAPOLEON], strict=True):
        text = decode(tok, view)
        instruction = record["instruction_short" if record["use_short"] else "instruction"]
        assert text.count(instruction) == len(user_messages(record))  # after every user message, in no system one
    mine, theirs = batch["distill_index"].unbind(-1)
    # each pair: the positions whose next token is the same supervised reply token in both renderings
    assert torch.equal(student[mine + 1], teacher.flatten()[theirs + 1])
    labels = batch["labels"].flatten()
    supervised = int((labels != IGNORE_INDEX).sum())
    assert bool((labels[mine + 1] != IGNORE_INDEX).all())
    plain_tokens = int((GAttCollator(tok, mode="all", max_length=512)([plain])["labels"] != IGNORE_INDEX).sum())
    assert len(mine) == supervised - plain_tokens  # every supervised token of the two GAtt records, once
    assert len(set(mine.tolist())) == len(mine)


def test_no_teacher_view_without_asking_or_for_a_cut_dialogue(tokenizers):
    tok = tokenizers["library"]
    assert "distill_index" not in GAttCollator(tok, mode="all", max_length=512)([FRENCH])
    full = GAttCollator(tok, mode="all", max_length=512, teacher_view=True).examples(FRENCH)[0]
    cut = GAttCollator(tok, mode="last", max_length=len(full.input_ids) - 5, teacher_view=True)
    example = cut.examples(FRENCH)[0]
    assert cut.stats["dropped_turns"] >= 1 and example.teacher_views == []


@pytest.mark.parametrize("name", ["library", "chatml", "llama3"])
def test_the_near_teacher_view_reads_each_reply_one_turn_after_the_instruction(tokenizers, name):
    tok = tokenizers[name]
    collator = GAttCollator(tok, mode="all", max_length=512, packing=True, teacher_view=True, teacher_rendering="near")
    batch = collator([FRENCH, NAPOLEON])
    student, teacher = batch["input_ids"].flatten(), batch["teacher_input_ids"]
    spans = segment_spans(segment_ids_from_position_ids(batch["teacher_position_ids"]))
    views = [teacher[r, a:b] for r, row in enumerate(spans) for a, b in row]
    views = [v for v in views if (v != tok.pad_token_id).any()]
    records = [FRENCH, NAPOLEON]
    turns = [
        (r, u, a)
        for r in records
        for u, a, sampled in zip(user_messages(r), replies(r), r["sampled_with_instruction"], strict=True)
        if sampled
    ]
    assert len(views) == len(turns) < sum(len(replies(r)) for r in records)  # a view per supervised reply
    for view, (record, user, reply) in zip(views, turns, strict=True):
        text = decode(tok, view)
        instruction = record["instruction_short" if record["use_short"] else "instruction"]
        assert text.count(instruction) == 1 and text.index(instruction) < text.index(user) < text.index(reply)
        assert not any(other in text for other in user_messages(record) if other != user)  # no history
    mine, theirs = batch["distill_index"].unbind(-1)
    assert torch.equal(student[mine + 1], teacher.flatten()[theirs + 1])
    labels = batch["labels"].flatten()
    assert len(mine) == int((labels != IGNORE_INDEX).sum()) and len(set(mine.tolist())) == len(mine)
    both = GAttCollator(tok, mode="all", max_length=512, packing=True, teacher_view=True, teacher_rendering="both")
    examples = [e for r in records for e in both.examples(r)]
    assert [len(e.teacher_views) for e in examples] == [1 + sum(r["sampled_with_instruction"]) for r in records]
    with pytest.raises(ValueError, match="teacher_rendering"):
        GAttCollator(tok, teacher_rendering="far")
