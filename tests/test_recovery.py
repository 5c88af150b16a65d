"""gatt.data.recovery: GAtt dialogues whose first reply names another value of its family, that reply not trained on."""

import copy
import json
from pathlib import Path

import pytest
from test_value_swaps import CATALOGUE
from test_value_swaps import record_under as gatt_record

from gatt.data.check_types import Check
from gatt.data.checks import Constraint, passes_all
from gatt.data.collator import IGNORE_INDEX, GAttCollator
from gatt.data.recovery import recovery_copies
from gatt.data.values import substitute
from gatt.model.tokenizer import train_tokenizer
from gatt.training.train_config import TrainConfig, split_records


def record_under(constraints: list[Constraint], ident: str) -> dict:
    """A GAtt record as synthesis writes it (four turns of the toy world's replies obeying `constraints`)."""
    return {**gatt_record(constraints), "id": ident}


def checks_of(constraint: dict) -> list[Check]:
    return [Check.from_dict(c) for c in constraint["checks"]]


STARTWORDS = [c for c in CATALOGUE if c.family == "startword" and c.split == "train"][:3]
RECORDS = [record_under([c], f"d-{i}") for i, c in enumerate(STARTWORDS)]


def test_a_copy_names_another_value_in_its_first_reply_which_fails_and_carries_no_loss():
    originals = copy.deepcopy(RECORDS)
    copies = recovery_copies(RECORDS, 1.0, seed=0)
    assert [c["id"] for c in copies] == [f"d-{i}-recovery" for i in range(3)]
    for record, out in zip(RECORDS, copies, strict=True):
        (constraint,) = record["constraints"]
        first = out["messages"][1]["content"]
        new = out["meta"]["recovery"]["written"]
        recovery = {"family": "startword", "value": constraint["value"], "written": new, "reply": 1}
        assert out["meta"]["recovery"] == recovery
        assert new in {c.value for c in STARTWORDS} - {constraint["value"]}  # a value the records hold
        assert first == record["messages"][1]["content"].replace(constraint["value"], new)
        assert constraint["value"] not in first and not passes_all(first, checks_of(constraint))
        assert out["messages"][2:] == record["messages"][2:] and out["instruction"] == record["instruction"]
        assert out["sampled_with_instruction"] == [False, True, True, True]
    assert RECORDS == originals  # the originals are left as they were


def test_any_turn_replaces_one_reply_with_a_reply_after_it_and_leaves_the_rest_trained():
    records = [record_under([STARTWORDS[i % 3]], f"d-{i}") for i in range(30)]
    copies = recovery_copies(records, 1.0, seed=0, turn="any")
    assert len(copies) == 30
    by_id = {r["id"]: r for r in records}
    numbers = set()
    for out in copies:
        record, number = by_id[out["id"].removesuffix("-recovery")], out["meta"]["recovery"]["reply"]
        numbers.add(number)
        (constraint,) = record["constraints"]
        index = 2 * number - 1  # messages: user, reply, user, reply, ...
        replaced = out["messages"][index]["content"]
        assert replaced == substitute(
            record["messages"][index]["content"], constraint["value"], out["meta"]["recovery"]["written"]
        )
        assert not passes_all(replaced, checks_of(constraint))
        assert [m for i, m in enumerate(out["messages"]) if i != index] == [
            m for i, m in enumerate(record["messages"]) if i != index
        ]
        assert out["sampled_with_instruction"] == [k != number - 1 for k in range(4)]
    assert numbers == {1, 2, 3}  # every reply but the last is drawn, never the last (nothing after it to learn)
    # "first" copies are the ones made before "any" existed (the reply is drawn from a generator of its own): the
    # values and records below are what the first-reply-only code drew at seed 0.
    assert [c["meta"]["recovery"]["reply"] for c in recovery_copies(records, 1.0, seed=0)] == [1] * 30
    assert [c["meta"]["recovery"]["written"] for c in recovery_copies(RECORDS, 1.0, seed=0)] == [
        "Naturally",
        "Naturally",
        "Certainly",
    ]
    assert [c["id"] for c in recovery_copies(RECORDS, 0.5, seed=0)] == ["d-0-recovery", "d-1-recovery"]
    with pytest.raises(ValueError, match="recovery_turn must be one of first, any, got 'last'"):
        recovery_copies(records, 1.0, seed=0, turn="last")


def test_the_share_is_drawn_by_seed_and_what_cannot_miss_gets_no_copy():
    assert recovery_copies(RECORDS, 0.0, seed=0) == []
    assert len(recovery_copies(RECORDS, 0.5, seed=0)) == 2  # round(0.5 x 3)
    assert recovery_copies(RECORDS, 0.5, seed=3) == recovery_copies(RECORDS, 0.5, seed=3)
    assert {tuple(c["id"] for c in recovery_copies(RECORDS, 1 / 3, seed=s)) for s in range(8)} == {
        ("d-0-recovery",),
        ("d-1-recovery",),
        ("d-2-recovery",),
    }
    # Not GAtt data (replay), a single reply, a first reply not sampled with the instruction: no copy.
    replay = {"id": "b-1", "kind": "local", "messages": RECORDS[0]["messages"]}
    single = {**RECORDS[0], "messages": RECORDS[0]["messages"][:2], "sampled_with_instruction": [True]}
    unsampled = {**RECORDS[1], "sampled_with_instruction": [False, True, True, True]}
    assert recovery_copies([replay, single, unsampled], 1.0, seed=0) == []
    # One value of its family in the records: nothing else to name.
    assert recovery_copies(RECORDS[:1], 1.0, seed=0) == []
    # A rule with no value in the reply (title case) has none to replace.
    titlecase = next(c for c in CATALOGUE if c.family == "titlecase")
    assert recovery_copies([record_under([titlecase], "t-1"), record_under([titlecase], "t-2")], 1.0, 0) == []
    with pytest.raises(ValueError, match="recovery_share must be in \\[0, 1\\], got 1.5"):
        recovery_copies(RECORDS, 1.5, seed=0)


def test_a_value_whose_replacement_still_passes_is_passed_over():
    # "alpha" is checked by "alpha or beta": naming beta instead still passes, so no copy names it.
    def word(value: str) -> dict:
        check = {"type": "contains_any", "words": ["alpha", "beta"] if value == "alpha" else [value]}
        return {"family": "word", "value": value, "checks": [check]}

    def record(value: str, ident: str) -> dict:
        out = copy.deepcopy(RECORDS[0])
        out.update(id=ident, constraints=[word(value)])
        for message in out["messages"][1::2]:
            message["content"] += f" {value}"
        return out

    records = [record("alpha", "a"), record("beta", "b"), record("gamma", "g")]
    copies = {c["id"]: c["meta"]["recovery"]["written"] for c in recovery_copies(records, 1.0, seed=0)}
    assert copies["a-recovery"] == "gamma"  # never beta
    assert set(copies) == {"a-recovery", "b-recovery", "g-recovery"}


def test_a_value_is_found_and_replaced_as_whole_words_in_the_case_it_is_written():
    # The value only inside a longer word ("Whale" in "Whales") is not in the reply: no copy, where a substring
    # match would have written "Dolphins".
    def animal(value: str) -> dict:
        return {"family": "animal", "value": value, "checks": [{"type": "contains_any", "words": [value]}]}

    def record(value: str, first: str, ident: str) -> dict:
        out = copy.deepcopy(RECORDS[0])
        out.update(id=ident, constraints=[animal(value)])
        out["messages"][1]["content"] = first
        return out

    inside = record("Whale", "Whales sing.", "w")
    upper = record("Whale", "A WHALE sings.", "u")
    copies = recovery_copies([inside, upper, record("Dolphin", "A dolphin swims.", "d")], 1.0, seed=0)
    by_id = {c["id"]: c["messages"][1]["content"] for c in copies}
    assert "w-recovery" not in by_id
    assert by_id["u-recovery"] == "A DOLPHIN sings."  # upper case kept
    assert by_id["d-recovery"] == "A whale swims."  # lower case kept


def test_split_records_adds_copies_of_training_records_only_and_the_collator_leaves_their_first_reply_out(
    tmp_path: Path,
):
    records = [record_under([STARTWORDS[i % 3]], f"d-{i}") for i in range(30)]
    (tmp_path / "gatt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    values = {"output_dir": str(tmp_path / "out"), "train_file": str(tmp_path / "gatt.jsonl"), "max_steps": 1}
    values |= {"model_config": {}, "tokenizer_vocab_size": 300, "eval_every": 1, "eval_fraction": 0.2}
    config = TrainConfig.from_dict({**values, "recovery_share": 0.5})
    train, evaluation, _ = split_records(config)
    held_out = {r["id"] for r in evaluation}
    copies = [r for r in train if "recovery" in r["meta"]]
    assert len(evaluation) == 6 and len(copies) == 12  # half of the 24 training records
    assert not {c["id"].removesuffix("-recovery") for c in copies} & held_out
    plain, _, _ = split_records(TrainConfig.from_dict(values))
    assert [r for r in train if "recovery" not in r["meta"]] == plain
    with pytest.raises(ValueError, match="recovery_share must be in \\[0, 1\\], got -0.1"):
        TrainConfig.from_dict({**values, "recovery_share": -0.1})
    with pytest.raises(ValueError, match="recovery_turn"):
        TrainConfig.from_dict({**values, "recovery_share": 0.5, "recovery_turn": "last"})

    texts = [m["content"] for r in train for m in r["messages"]] + [r["instruction"] for r in train]
    tokenizer = train_tokenizer(texts, vocab_size=400)
    collator = GAttCollator(tokenizer, mode="all", max_length=1024)
    for record in (copies[0], next(r for r in train if r["id"] == copies[0]["id"].removesuffix("-recovery"))):
        (example,) = collator.examples(record)
        supervised = tokenizer.decode(
            [t for t, label in zip(example.input_ids, example.labels) if label != IGNORE_INDEX]
        )
        replies = [m["content"] for m in record["messages"][1::2]]
        assert (replies[0] in supervised) == ("recovery" not in record["meta"])
        assert all(reply in supervised for reply in replies[1:])
