"""Tests for data_gen.user_turns: the topic lexicon, the built-in user messages and the dialogue loader."""

import json
import re
from collections import Counter
from pathlib import Path

import datasets
import pytest

from data_gen.user_turns import (
    LANGUAGE_CODES,
    PHRASINGS,
    TOPIC_KEYWORDS,
    TOPICS,
    UserTurn,
    all_user_turns,
    load_dialogues,
    load_user_turns,
    sample_user_turns,
    split_user_turns,
    validate_messages,
)

RESERVED_HOBBIES = {
    "tennis",
    "golf",
    "yoga",
    "football",
    "jazz",
    "karate",
    "judo",
    "ski",
    "hockey",
    "rugby",
    "volleyball",
    "basketball",
    "baseball",
    "poker",
    "origami",
    "sudoku",
    "badminton",
    "bowling",
    "cricket",
    "skateboard",
    "snowboard",
    "salsa",
    "tango",
    "pilates",
    "surfing",
}


def _words_regex(words: tuple[str, ...]) -> re.Pattern[str]:
    # The same whole-word, case-insensitive matching as the `contains_any` check.
    alternatives = [r"\s+".join(re.escape(part) for part in word.split()) for word in words]
    return re.compile("|".join(rf"(?<!\w){alt}(?!\w)" for alt in alternatives), re.IGNORECASE)


# --- lexicon ------------------------------------------------------------------------------------


def test_every_topic_has_all_languages_and_keywords() -> None:
    assert len(TOPICS) >= 40
    assert set(TOPIC_KEYWORDS) == set(TOPICS)
    for topic, phrases in TOPICS.items():
        assert tuple(phrases) == LANGUAGE_CODES, topic
        assert all(isinstance(p, str) and p.strip() for p in phrases.values()), topic
        assert tuple(TOPIC_KEYWORDS[topic]) == LANGUAGE_CODES, topic
        for language, keywords in TOPIC_KEYWORDS[topic].items():
            assert keywords and all(isinstance(k, str) and k.strip() for k in keywords), (topic, language)


def test_topics_are_not_hobbies() -> None:
    for topic in TOPICS:
        assert topic not in RESERVED_HOBBIES
        for keyword in TOPIC_KEYWORDS[topic]["en"]:
            assert keyword.lower() not in RESERVED_HOBBIES


def test_each_phrase_contains_its_own_keyword_and_no_other_topics() -> None:
    for topic, phrases in TOPICS.items():
        for language, phrase in phrases.items():
            assert _words_regex(TOPIC_KEYWORDS[topic][language]).search(phrase), (topic, language)
            for other in TOPICS:
                if other != topic:
                    other_keywords = _words_regex(TOPIC_KEYWORDS[other][language])
                    assert not other_keywords.search(phrase), (topic, other, language)


def test_spec_example_translations() -> None:
    assert TOPICS["ocean"] == {
        "en": "the ocean",
        "fr": "l'océan",
        "es": "el océano",
        "de": "der Ozean",
        "it": "l'oceano",
        "pt": "o oceano",
        "nl": "de oceaan",
    }
    assert TOPIC_KEYWORDS["ocean"]["fr"][0] == "océan"
    assert TOPIC_KEYWORDS["ocean"]["de"][0] == "Ozean"


# --- built-in messages --------------------------------------------------------------------------


def test_at_least_500_distinct_messages_in_fixed_order() -> None:
    turns = all_user_turns()
    assert len(PHRASINGS) >= 15
    assert len(turns) == len(TOPICS) * len(PHRASINGS)
    assert len({turn.text for turn in turns}) == len(turns) >= 500
    assert turns == all_user_turns()


def test_phrasings_have_one_slot() -> None:
    for phrasing in PHRASINGS:
        assert phrasing.count("{topic}") == 1, phrasing
        assert not phrasing.startswith("{topic}"), phrasing


def test_every_message_mentions_its_topic_and_only_it() -> None:
    for turn in all_user_turns():
        assert turn.topic in TOPICS
        assert _words_regex(TOPIC_KEYWORDS[turn.topic]["en"]).search(turn.text), turn.text
        others = [t for t in TOPICS if t != turn.topic and _words_regex(TOPIC_KEYWORDS[t]["en"]).search(turn.text)]
        assert not others, (turn.text, others)


def test_sampling_is_deterministic() -> None:
    assert sample_user_turns(50, seed=3) == sample_user_turns(50, seed=3)
    assert sample_user_turns(50, seed=3) != sample_user_turns(50, seed=4)
    assert sample_user_turns(0, seed=3) == []


@pytest.mark.parametrize("exclude_recent", [0, 1, 4, 10])
def test_no_topic_repeats_within_window(exclude_recent: int) -> None:
    turns = sample_user_turns(500, seed=11, exclude_recent=exclude_recent)
    assert len(turns) == 500
    for i, turn in enumerate(turns):
        window = turns[max(0, i - exclude_recent) : i]
        assert turn.topic not in {t.topic for t in window}, i


def test_sampling_covers_many_topics() -> None:
    counts = Counter(turn.topic for turn in sample_user_turns(2000, seed=0))
    assert len(counts) == len(TOPICS)


def test_sampling_from_a_pool() -> None:
    pool = [turn for turn in all_user_turns() if turn.topic in {"ocean", "music", "coffee"}]
    turns = sample_user_turns(30, seed=1, exclude_recent=2, pool=pool)
    assert set(turns) <= set(pool)
    for previous, current in zip(turns, turns[1:]):
        assert previous.topic != current.topic
    for i in range(2, len(turns)):
        assert len({turns[i - 2].topic, turns[i - 1].topic, turns[i].topic}) == 3


def test_small_pool_relaxes_window_instead_of_failing() -> None:
    pool = [turn for turn in all_user_turns() if turn.topic in {"ocean", "music"}]
    turns = sample_user_turns(20, seed=5, exclude_recent=4, pool=pool)
    assert len(turns) == 20
    for previous, current in zip(turns, turns[1:]):
        assert previous.topic != current.topic


def test_own_messages_do_not_repeat_within_window() -> None:
    pool = [UserTurn(text=f"message {i}", topic=None) for i in range(8)]
    turns = sample_user_turns(100, seed=2, exclude_recent=4, pool=pool)
    for i in range(4, len(turns)):
        assert len({t.text for t in turns[i - 4 : i + 1]}) == 5


def test_sampling_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="empty"):
        sample_user_turns(3, seed=0, pool=[])
    with pytest.raises(ValueError):
        sample_user_turns(-1, seed=0)


def test_split_is_a_deterministic_partition_with_every_topic_on_both_sides() -> None:
    train, heldout = split_user_turns(0.2, seed=0)
    assert sorted(train + heldout, key=lambda t: t.text) == sorted(all_user_turns(), key=lambda t: t.text)
    assert not {t.text for t in train} & {t.text for t in heldout}
    assert {t.topic for t in train} == set(TOPICS) == {t.topic for t in heldout}
    assert 0.15 < len(heldout) / len(all_user_turns()) < 0.25
    assert (train, heldout) == split_user_turns(0.2, seed=0)
    assert split_user_turns(0.2, seed=1) != (train, heldout)


def test_split_extremes_keep_both_sides_per_topic() -> None:
    for fraction in (0.01, 0.99):
        train, heldout = split_user_turns(fraction)
        assert {t.topic for t in train} == set(TOPICS) == {t.topic for t in heldout}
    for fraction in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError):
            split_user_turns(fraction)


def test_sampling_from_the_heldout_side() -> None:
    _, heldout = split_user_turns()
    turns = sample_user_turns(40, seed=0, pool=heldout)
    assert set(turns) <= set(heldout)


# --- loader -------------------------------------------------------------------------------------

DIALOGUES = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "How tall is Everest?"},
        {"role": "assistant", "content": "8,849 m."},
    ],
    [
        {"role": "user", "content": "  Hello there\n"},
        {"role": "assistant", "content": "Hello again."},
        {"role": "user", "content": "Name a river."},
    ],
    [
        {"role": "user", "content": "What is a haiku?"},
        {"role": "assistant", "content": "A short poem."},
    ],
]
EXPECTED_TEXTS = ["Hello there", "How tall is Everest?", "Name a river.", "What is a haiku?"]

MALFORMED = {
    "roles out of order": (
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        "messages[1]: role 'user' where 'assistant' was expected",
    ),
    "starts with assistant": (
        [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
        "messages[0]: role 'assistant' where 'user' was expected",
    ),
    "empty content": (
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "   "}],
        "messages[1]: content is empty",
    ),
    "non-string content": (
        [{"role": "user", "content": 42}],
        "messages[0]: content must be a string",
    ),
    "unknown role": (
        [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
        "messages[1]: unknown role 'tool'",
    ),
    "system not first": (
        [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
        "messages[1]: role 'system' is only allowed as the first message",
    ),
    "missing content": (
        [{"role": "user"}],
        "messages[0]: missing 'content'",
    ),
    "empty list": ([], "'messages' is empty"),
    "not a list": ("hello", "'messages' must be a list"),
    "only system": ([{"role": "system", "content": "x"}], "'messages' holds only a system message"),
}


def _write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _all_formats(tmp_path: Path, dialogues: list[list[dict[str, str]]]) -> list[Path]:
    records = [{"id": f"d-{i}", "messages": m} for i, m in enumerate(dialogues)]
    jsonl = _write_jsonl(tmp_path / "data.jsonl", records)
    parquet = tmp_path / "data.parquet"
    datasets.Dataset.from_list(records).to_parquet(str(parquet))
    folder = tmp_path / "saved"
    datasets.Dataset.from_list(records).save_to_disk(str(folder))
    return [jsonl, parquet, folder]


def test_all_formats_give_the_same_dialogues_and_user_turns(tmp_path: Path) -> None:
    for path in _all_formats(tmp_path, DIALOGUES):
        dialogues, skipped = load_dialogues(path)
        assert skipped == 0
        assert dialogues == DIALOGUES, path
        turns = load_user_turns(path)
        assert [t.text for t in turns] == EXPECTED_TEXTS, path
        assert all(t.topic is None for t in turns)


def test_loader_accepts_str_paths(tmp_path: Path) -> None:
    jsonl, _, folder = _all_formats(tmp_path, DIALOGUES)
    assert load_dialogues(str(jsonl)) == load_dialogues(str(folder))


def test_dataset_dict_folder(tmp_path: Path) -> None:
    records = [{"messages": m} for m in DIALOGUES]
    folder = tmp_path / "dict"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(records[:2]), "test": datasets.Dataset.from_list(records[2:])}
    ).save_to_disk(str(folder))
    assert [t.text for t in load_user_turns(folder)] == EXPECTED_TEXTS


def test_txt_file_one_message_per_line(tmp_path: Path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("What is rain?\n\n   \n  Why is the sky blue?  \nWhat is rain?\n", encoding="utf-8")
    assert load_user_turns(path) == [
        UserTurn("What is rain?", None),
        UserTurn("Why is the sky blue?", None),
    ]


def test_a_file_with_no_user_message_is_one_clear_error(tmp_path: Path) -> None:
    # data_gen gatt drew its user turns from the pool and ended in random.choice's IndexError on an empty one.
    from data_gen.__main__ import main

    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"blank\.txt: no user turns found"):
        load_user_turns(blank)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"^error: .*blank\.txt: no user turns found"):
        main(["gatt", "--teacher", "oracle", "--num-dialogues", "2", "--user-turns", str(blank), "--out", str(out)])
    assert not (out / "gatt.jsonl").exists()


def test_blank_lines_in_jsonl_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "gaps.jsonl"
    path.write_text("\n" + json.dumps({"messages": DIALOGUES[2]}) + "\n\n", encoding="utf-8")
    assert load_dialogues(path) == ([DIALOGUES[2]], 0)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_jsonl_names_file_line_and_problem(tmp_path: Path, case: str) -> None:
    messages, problem = MALFORMED[case]
    path = _write_jsonl(
        tmp_path / "data.jsonl", [{"messages": DIALOGUES[2]}, {"messages": DIALOGUES[0]}, {"messages": messages}]
    )
    with pytest.raises(ValueError) as info:
        load_dialogues(path)
    assert f"data.jsonl:3: {problem}" in str(info.value)
    with pytest.raises(ValueError, match=re.escape("data.jsonl:3:")):
        load_user_turns(path)


@pytest.mark.parametrize("case", ["roles out of order", "empty content", "unknown role", "system not first"])
def test_malformed_parquet_and_folder_name_file_row_and_problem(tmp_path: Path, case: str) -> None:
    messages, problem = MALFORMED[case]
    jsonl, parquet, folder = _all_formats(tmp_path, [DIALOGUES[2], messages])
    for path in (parquet, folder):
        with pytest.raises(ValueError) as info:
            load_dialogues(path)
        assert f"{path.name}: row 1: {problem}" in str(info.value)


def test_on_error_skip_counts_bad_records(tmp_path: Path) -> None:
    good = [{"messages": DIALOGUES[0]}, {"messages": DIALOGUES[2]}]
    bad = [{"messages": messages} for messages, _ in MALFORMED.values()]
    path = _write_jsonl(tmp_path / "mixed.jsonl", [good[0], *bad, {"text": "no messages"}, [1, 2], good[1]])
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"messages": [\n')
    dialogues, skipped = load_dialogues(path, on_error="skip")
    assert dialogues == [DIALOGUES[0], DIALOGUES[2]]
    assert skipped == len(MALFORMED) + 3
    texts = [t.text for t in load_user_turns(path, on_error="skip")]
    assert texts == ["Hello there", "How tall is Everest?", "What is a haiku?"]


def test_on_error_skip_on_parquet_rows(tmp_path: Path) -> None:
    bad = MALFORMED["roles out of order"][0]
    for path in _all_formats(tmp_path, [bad, DIALOGUES[2], bad]):
        assert load_dialogues(path, on_error="skip") == ([DIALOGUES[2]], 2)


def test_json_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"messages": DIALOGUES[2]}) + '\n{"messages": [}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.jsonl:2: invalid JSON"):
        load_dialogues(path)


def test_record_without_messages(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "hi", "completion": "hello"}])
    expected = r"plain\.jsonl:1: record has no 'messages' field \(fields: prompt, completion\)"
    with pytest.raises(ValueError, match=expected):
        load_dialogues(path)
    parquet = tmp_path / "plain.parquet"
    datasets.Dataset.from_list([{"prompt": "hi"}]).to_parquet(str(parquet))
    with pytest.raises(ValueError, match=r"plain\.parquet: no 'messages' column \(columns: prompt\)"):
        load_dialogues(parquet)
    folder = tmp_path / "plain_folder"
    datasets.Dataset.from_list([{"prompt": "hi"}]).save_to_disk(str(folder))
    with pytest.raises(ValueError, match=r"plain_folder: no 'messages' column"):
        load_dialogues(folder)


def test_missing_file_or_folder(tmp_path: Path) -> None:
    for name in ("absent.jsonl", "absent.txt", "absent_folder"):
        with pytest.raises(FileNotFoundError, match=re.escape(name)):
            load_user_turns(tmp_path / name)
    with pytest.raises(FileNotFoundError, match="absent.parquet"):
        load_dialogues(tmp_path / "absent.parquet")


def test_unsupported_extension_names_accepted_ones(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("role,content\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_dialogues(path)
    message = str(info.value)
    assert "data.csv" in message and "'.csv'" in message
    assert ".jsonl" in message and ".parquet" in message and "save_to_disk" in message
    with pytest.raises(ValueError, match=r"\.txt"):
        load_user_turns(path)


def test_folder_that_is_not_a_dataset(tmp_path: Path) -> None:
    folder = tmp_path / "random_folder"
    folder.mkdir()
    (folder / "notes.md").write_text("hi", encoding="utf-8")
    with pytest.raises(ValueError, match="random_folder"):
        load_dialogues(folder)


def test_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_text("not parquet", encoding="utf-8")
    with pytest.raises(ValueError, match=r"fake\.parquet: not a readable Parquet file"):
        load_dialogues(path)


def test_bad_on_error_value(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "data.jsonl", [{"messages": DIALOGUES[2]}])
    with pytest.raises(ValueError, match="on_error"):
        load_dialogues(path, on_error="ignore")  # type: ignore[arg-type]


def test_validate_messages_accepts_valid_chats() -> None:
    for dialogue in DIALOGUES:
        validate_messages(dialogue)
    validate_messages([{"role": "user", "content": "x", "name": None}])
