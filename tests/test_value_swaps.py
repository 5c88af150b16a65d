"""data_gen.value_swaps: a kept GAtt dialogue copied under another value of its constraint's family, only where exact."""

import json
import random
from dataclasses import replace
from pathlib import Path

from data_gen.__main__ import main
from data_gen.constraints import catalogue, conflict
from data_gen.toy_world import ToyResponder
from data_gen.user_turns import all_user_turns
from data_gen.value_swaps import families, swapped
from gatt.data.check_types import Check
from gatt.data.checks import Constraint, passes_all, reply_checks
from gatt.data.events import constraint_entry, instruction_text

CATALOGUE = catalogue()
TRAINED = [c for c in CATALOGUE if c.split == "train"]
POOL = families(TRAINED)
ORACLE = ToyResponder(CATALOGUE)


def record_under(constraints: list[Constraint], turns: int = 4, short: bool = False) -> dict:
    """A first-kind GAtt record as synthesis writes it, the toy world's replies obeying `constraints`."""
    users = all_user_turns()[:turns]
    messages = []
    for user in users:
        messages += [
            {"role": "user", "content": user.text},
            {"role": "assistant", "content": ORACLE.reply(user, constraints)},
        ]
    return {
        "id": "d-000007",
        "instruction": instruction_text(constraints, short=False),
        "instruction_short": instruction_text(constraints, short=True),
        "use_short": short,
        "constraints": [constraint_entry(c) for c in constraints],
        "messages": messages,
        "sampled_with_instruction": [True] * turns,
        "meta": {"teacher": "oracle", "seed": 0, "round": 1, "k": 1, "ended": "complete"},
    }


def named(name: str) -> Constraint:
    return next(c for c in CATALOGUE if c.name == name)


def test_a_swap_writes_another_trained_value_everywhere_and_every_reply_passes_its_checks():
    original = named("heading:Memo")
    record = record_under([original])
    copy = swapped(record, [original], POOL, random.Random(0), 1)
    assert copy is not None
    (entry,) = copy["constraints"]
    new = next(c for c in TRAINED if c.family == "heading" and c.value == entry["value"])
    assert new.value != "Memo" and entry == constraint_entry(new)
    assert copy["instruction"] == new.instruction and copy["instruction_short"] == new.short
    assert copy["id"] == "d-000007-swap-1" and copy["meta"]["swapped_from"] == "d-000007"
    assert copy["meta"]["swaps"] == {"Memo": new.value}
    for before, after in zip(record["messages"], copy["messages"]):
        if before["role"] == "user":
            assert after == before
        else:  # the same reply under the new title: "<<Memo>> Apples: ..." -> "<<Facts>> Apples: ..."
            assert after["content"] == before["content"].replace("<<Memo>>", f"<<{new.value}>>")
            assert passes_all(after["content"], reply_checks([new], "")) and "Memo" not in after["content"]
    assert record["messages"][1]["content"].startswith("<<Memo>>")  # the original is left as it was


def test_a_paraphrase_and_a_case_rule_carry_over_to_the_new_value():
    profession = next(c for c in TRAINED if c.family == "profession" and c.paraphrases)
    caps = named("caps:all caps")
    assert not conflict("profession", "caps")
    worded = replace(profession, instruction=profession.paraphrases[0])
    record = record_under([worded, caps])
    assert profession.value.upper() in record["messages"][1]["content"]  # "MY JOB: JOURNALIST."
    copy = swapped(record, [worded, caps], POOL, random.Random(1), 1)
    assert copy is not None
    new_value = copy["meta"]["swaps"][profession.value]
    new = next(c for c in TRAINED if c.family == "profession" and c.value == new_value)
    assert copy["instruction"] == f"{new.paraphrases[0]} {caps.instruction}"  # the wording drawn, kept
    for message in copy["messages"][1::2]:
        assert new_value.upper() in message["content"] and message["content"] == message["content"].upper()
        assert passes_all(message["content"], reply_checks([new, caps], ""))


def test_what_cannot_be_swapped_exactly_is_not_swapped():
    # A language is not written in its replies ("Answer in French." and French replies): nothing to swap.
    # (The language kind is held out of GAtt data by default: its siblings are taken from the whole catalogue.)
    french = next(c for c in CATALOGUE if c.family == "language")
    languages = families(CATALOGUE)
    assert len(languages["language"]) > 1
    assert swapped(record_under([french]), [french], languages, random.Random(0), 1) is None
    # A user's own constraint has no family: no sibling to swap it for.
    own = Constraint(
        "own", 'Say "alpha".', "Word: alpha", (Check.from_dict({"type": "contains_any", "words": ["alpha"]}),)
    )
    assert families([own]) == {}

    # A sibling whose checks the substituted replies would fail: the copy is dropped, not written wrong.
    def word(value: str, must: str) -> Constraint:
        check = Check.from_dict({"type": "contains_any", "words": [must]})
        return Constraint(f"word:{value}", f'Say "{value}".', f"Word: {value}", (check,), family="word", value=value)

    alpha, beta = word("alpha", "alpha"), word("beta", "gamma")
    record = record_under([])
    record.update(instruction=alpha.instruction, instruction_short=alpha.short, constraints=[constraint_entry(alpha)])
    for message in record["messages"][1::2]:
        message["content"] += " alpha"
    assert swapped(record, [alpha], {"word": [alpha, beta]}, random.Random(0), 1) is None
    good = word("delta", "delta")
    copy = swapped(record, [alpha], {"word": [alpha, good]}, random.Random(0), 1)
    assert copy is not None and all(m["content"].endswith(" delta") for m in copy["messages"][1::2])


def test_synthesis_writes_the_swaps_after_each_record_deterministically(tmp_path: Path):
    args = ["gatt", "--teacher", "oracle", "--num-dialogues", "24", "--min-turns", "2", "--max-turns", "6"]
    args += ["--samples-per-turn", "1", "--seed", "0", "--shard-size", "8", "--value-swaps", "2"]
    main([*args, "--out", str(tmp_path / "a")])
    main([*args, "--out", str(tmp_path / "b")])
    data = (tmp_path / "a" / "gatt.jsonl").read_bytes()
    assert data == (tmp_path / "b" / "gatt.jsonl").read_bytes()
    records = [json.loads(line) for line in data.decode().splitlines()]
    originals = [r for r in records if "swapped_from" not in r["meta"]]
    swaps = [r for r in records if "swapped_from" in r["meta"]]
    summary = json.loads((tmp_path / "a" / "gatt.summary.json").read_text())
    assert len(originals) == 24 and summary["value_swaps"] == len(swaps) >= 12
    assert summary["records"] == len(records) and len({r["id"] for r in records}) == len(records)
    trained = {(c.family, c.value) for c in TRAINED}
    by_id = {r["id"]: r for r in originals}
    for copy in swaps:
        source = by_id[copy["meta"]["swapped_from"]]
        assert records.index(copy) > records.index(source)  # each copy follows its record
        assert [m["content"] for m in copy["messages"][::2]] == [m["content"] for m in source["messages"][::2]]
        checks = [Check.from_dict(ch) for c in copy["constraints"] for ch in c["checks"]]
        for entry in copy["constraints"]:
            assert (entry["family"], entry["value"]) in trained
        for message in copy["messages"][1::2]:
            assert passes_all(message["content"], checks)
    drawn = [(c["meta"]["swapped_from"], json.dumps(c["meta"]["swaps"], sort_keys=True)) for c in swaps]
    assert len(set(drawn)) == len(drawn)  # a record's copies swap in other values each
    # Without --value-swaps the same run writes exactly the original records.
    main([*args[:-2], "--out", str(tmp_path / "c")])
    plain = [json.loads(line) for line in (tmp_path / "c" / "gatt.jsonl").read_text().splitlines()]
    assert plain == originals
    # ...and records no value_swaps in its settings, so shard folders written before the option existed resume.
    assert "value_swaps" not in json.loads((tmp_path / "c" / "gatt.shards" / "settings.json").read_text())["config"]
    assert json.loads((tmp_path / "a" / "gatt.shards" / "settings.json").read_text())["config"]["value_swaps"] == 2
