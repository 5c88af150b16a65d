"""Instructions at any turn (gatt/data/events.py): the state in force, event drawing and wordings, GAtt data of every
kind, the report's plan and its per-kind scores."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import yaml

from data_gen.__main__ import main as data_gen_main
from data_gen.constraints import catalogue
from data_gen.synthesis import SynthesisConfig, _Dialogue
from data_gen.user_turns import UserTurn
from gatt.data.check_types import Check
from gatt.data.checks import Constraint, dump_constraints, load_constraints, passes_all
from gatt.data.events import (
    KINDS,
    Event,
    builtin_wordings,
    conflict,
    draw_events,
    event_turn,
    following_checks,
    in_force,
    withdrawn,
)
from gatt.eval.inputs import EvalTurn
from gatt.eval.plan import plan_dialogues
from gatt.eval.report import _kinds_section
from gatt.eval.scoring import per_kind
from gatt.eval.turns import RolloutConfig, user_message

CATALOGUE = catalogue()
BY_NAME = {c.name: c for c in CATALOGUE}
FRENCH, SPANISH = BY_NAME["language:French"], BY_NAME["language:Spanish"]
CAPS = BY_NAME["caps:all caps"]
HOBBY = next(c for c in CATALOGUE if c.family == "hobby" and c.split == "train")


def test_the_state_in_force_follows_every_event_in_order():
    events = [
        Event(1, "give", (FRENCH, HOBBY), "Language: French; Hobby: x"),
        Event(3, "replace", (SPANISH,), "Instead of French: Spanish", old=FRENCH),
        Event(5, "add", (CAPS,), "Also: caps"),
        Event(7, "revoke", (HOBBY,), "Stop the hobby"),
    ]
    names = lambda cs: [c.name for c in cs]  # noqa: E731
    assert names(in_force(events, 1)) == names(in_force(events, 2)) == [FRENCH.name, HOBBY.name]
    assert names(in_force(events, 3)) == [HOBBY.name, SPANISH.name]
    assert names(in_force(events, 6)) == [HOBBY.name, SPANISH.name, CAPS.name]
    assert names(in_force(events, 9)) == [SPANISH.name, CAPS.name]
    assert withdrawn(events, 2) == [] and names(withdrawn(events, 4)) == [FRENCH.name]
    assert names(withdrawn(events, 8)) == [HOBBY.name, FRENCH.name]
    late = [Event(4, "give", (FRENCH,), "From now on: French")]
    assert in_force(late, 3) == [] and in_force(late, 4) == [FRENCH]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_draws_its_events_and_words(kind):
    rng = random.Random(1)
    train = [c for c in CATALOGUE if c.split == "train"]
    for _ in range(50):
        first = [rng.choice(train)]
        text = rng.choice([first[0].instruction, first[0].short])
        events = draw_events(kind, first, text, train, 30, rng, short=text == first[0].short, after=19)
        actions = [e.action for e in events]
        if kind == "first":
            assert events == [Event(1, "give", tuple(first), text)]
            continue
        if kind == "replace" and len(events) == 1:  # no value to change to (all caps, one sentence): stays `first`
            assert events == [Event(1, "give", tuple(first), text)]
            assert sum(c.family == first[0].family for c in train) == 1
            continue
        change = events[-1]
        assert 2 <= change.turn <= 11  # 19 turns follow it
        if kind == "late":
            assert actions == ["give"] and change.text.endswith(text)
            assert any(change.text == w.format(instruction=text) for w in builtin_wordings()["late"])
        elif kind == "revoke":
            assert actions == ["give", "revoke"] and change.constraints == tuple(first)
            assert f'"{first[0].short}"' in change.text and in_force(events, change.turn) == []
        elif kind == "replace":
            (new,) = change.constraints
            assert actions == ["give", "replace"] and change.old == first[0]
            assert new.family == first[0].family and new.name != first[0].name
            assert f'"{first[0].short}"' in change.text and (new.short in change.text or new.instruction in change.text)
        else:
            (new,) = change.constraints
            assert actions == ["give", "add"] and new.family != first[0].family
            assert not conflict(new.family, first[0].family)
            assert [c.name for c in in_force(events, change.turn)] == [first[0].name, new.name]


def test_the_event_turn_leaves_room_after_it():
    rng = random.Random(0)
    assert {event_turn(30, rng, after=19) for _ in range(400)} == set(range(2, 12))
    assert {event_turn(8, rng) for _ in range(200)} == {2, 3, 4}
    assert {event_turn(12, rng, after=19) for _ in range(50)} == {2}
    assert {event_turn(2, rng) for _ in range(20)} == {2}


def test_checks_that_show_a_withdrawn_instruction_is_still_followed():
    assert following_checks(FRENCH, None) == list(FRENCH.checks)  # a language shows on every reply
    assert following_checks(CAPS, None) == list(CAPS.checks)
    assert following_checks(HOBBY, None) == []  # a hobby word on a chat turn proves nothing
    question = HOBBY.probes[0].question
    assert following_checks(HOBBY, question) == list(HOBBY.probes[0].checks)  # but its probe asks for it
    assert following_checks(BY_NAME["brevity:one sentence"], None) == []  # a short reply is not evidence


def test_a_constraint_file_gives_its_own_wordings(tmp_path):
    entry = {
        "name": "pirate",
        "instruction": "Talk like a pirate.",
        "short": "Pirate talk",
        "checks": [{"type": "contains_any", "words": ["arr"]}],
        "changes": {"revoke": ["Enough pirate talk, please."], "late": ["Ahoy, from now on: {instruction}"]},
    }
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"constraints": [entry]}))
    (pirate,) = load_constraints(path)
    assert pirate.changes == {"revoke": ("Enough pirate talk, please.",), "late": ("Ahoy, from now on: {instruction}",)}
    dump_constraints([pirate], tmp_path / "again.yaml")
    assert load_constraints(tmp_path / "again.yaml") == [pirate]
    rng = random.Random(0)
    late = draw_events("late", [pirate], pirate.short, [pirate], 10, rng, short=True)
    assert late[0].text == "Ahoy, from now on: Pirate talk"
    revoke = draw_events("revoke", [pirate], pirate.short, [pirate], 10, rng, short=True)
    assert revoke[1].text == "Enough pirate talk, please."
    # without its own, an event uses the built-in wordings
    add = draw_events("add", [FRENCH], FRENCH.short, [FRENCH, pirate], 10, rng, short=True)
    assert add[1].text in [w.format(instruction="Pirate talk") for w in builtin_wordings()["add"]]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"withdraw": ["x"]}, "unknown key 'withdraw'"),
        ({"revoke": "Stop."}, "non-empty list"),
        ({"revoke": ["Stop {instruction}."]}, "uses \\['instruction'\\]; a revoke wording may use \\{old\\}"),
        ({"late": ["From now on: {instruction"]}, "not a valid wording"),
    ],
)
def test_bad_wordings_are_refused_naming_the_constraint(tmp_path, changes, message):
    entry = {"name": "pirate", "instruction": "Talk like a pirate.", "short": "Pirate", "checks": [], "probes": []}
    entry["checks"] = [{"type": "contains_any", "words": ["arr"]}]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"constraints": [{**entry, "changes": changes}]}))
    with pytest.raises(ValueError, match=rf"constraints\[0\] 'pirate' changes.*{message}"):
        load_constraints(path)


# -- GAtt data of every kind --------------------------------------------------------------------------


def test_the_teacher_sees_the_instructions_in_force_at_each_turn():
    turns = [UserTurn(f"Tell me about topic {i}.", None) for i in range(5)]
    events = [
        Event(1, "give", (FRENCH,), "Language: French"),
        Event(3, "replace", (SPANISH,), "To Spanish", old=FRENCH),
    ]
    dialogue = _Dialogue(0, [FRENCH, SPANISH], True, turns, ["r1", "r2", "r3"], events)
    users = [m["content"] for m in dialogue.request().messages if m["role"] == "user"]
    assert users == [
        "Tell me about topic 0. Language: French",
        "Tell me about topic 1. Language: French",
        "Tell me about topic 2. Language: Spanish",  # only the new one, from the turn it is given
        "Tell me about topic 3. Language: Spanish",
    ]
    assert dialogue.request().constraints == [SPANISH]
    revoked = _Dialogue(0, [FRENCH], True, turns, ["r1"], [events[0], Event(2, "revoke", (FRENCH,), "Stop")])
    assert [m["content"] for m in revoked.request().messages if m["role"] == "user"][-1] == "Tell me about topic 1."
    assert not revoked.accepts("Je vous parle de ce sujet avec plaisir, c'est une question intéressante.")
    assert revoked.accepts("Topic 1: a fascinating subject. There is always something new to learn.")
    # Why a candidate is refused before the gate: it follows the withdrawn instruction, or fails a check in force.
    assert revoked.refusal("Je vous parle de ce sujet avec plaisir, c'est une question intéressante.") == "withdrawn"
    assert revoked.refusal("Topic 1: a fascinating subject. There is always something new to learn.") is None
    assert dialogue.refusal("Topic 3: a fascinating subject. There is always something new to learn.") == "language"


@pytest.fixture(scope="module")
def kinds_run(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("kinds")
    args = ["gatt", "--teacher", "oracle", "--num-dialogues", "60", "--min-turns", "2", "--max-turns", "12"]
    data_gen_main([*args, "--samples-per-turn", "1", "--seed", "0", "--out", str(out), "--kinds", *KINDS])
    return [json.loads(line) for line in (out / "gatt.jsonl").read_text().splitlines()]


def test_gatt_data_of_every_kind_carries_its_events_and_obeys_the_state_in_force(kinds_run):
    kinds = Counter(r["kind"] for r in kinds_run)
    assert set(kinds) == set(KINDS) and min(kinds.values()) >= 5
    for record in kinds_run:
        events = [
            Event(
                e["turn"],
                e["kind"],
                tuple(_constraint(c) for c in e["constraints"]),
                e["text"],
                None if "replaces" not in e else _constraint(e["replaces"]),
            )
            for e in record["events"]
        ]
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        assert events[0].turn == (1 if record["kind"] != "late" else events[0].turn) and all(
            e.turn <= len(users) for e in events
        )
        assert (record["instruction"] is None) == (record["kind"] == "late")
        for e in events:  # the words of an event are in the record, never in its messages
            assert all(e.text not in u for u in users)
        for number, reply in enumerate(replies, start=1):
            checks = [ch for c in in_force(events, number) for ch in c.checks]
            assert passes_all(reply, checks), (record["id"], number, reply)
            for old in withdrawn(events, number):
                shows = following_checks(old, None)
                assert not (shows and passes_all(reply, shows)), (record["id"], number, reply)


def _constraint(entry: dict) -> Constraint:
    name = f"{entry['family']}:{entry['value']}"
    return Constraint(
        name,
        name,
        name,
        tuple(Check.from_dict(c) for c in entry["checks"]),
        family=entry["family"],
        value=entry["value"],
    )


def test_first_kind_data_is_what_it_always_was(tmp_path, kinds_run):
    args = ["gatt", "--teacher", "oracle", "--num-dialogues", "12", "--max-turns", "6", "--samples-per-turn", "1"]
    data_gen_main([*args, "--out", str(tmp_path / "a")])
    data_gen_main([*args, "--out", str(tmp_path / "b"), "--kinds", "first"])
    a, b = ((tmp_path / d / "gatt.jsonl").read_bytes() for d in "ab")
    assert a == b and b'"events"' not in a
    assert SynthesisConfig(num_dialogues=1).kinds == ("first",)


# -- the report's plan and scores -----------------------------------------------------------------------

TURNS = [EvalTurn(f"Tell me about topic {i}.", (Check("contains_any", {"words": [f"topic {i}"]}),)) for i in range(40)]


def test_a_first_kind_plan_is_the_plan_it_always_was():
    plan = plan_dialogues(CATALOGUE, TURNS, dialogues=8, turns=10, seed=3, no_instruction=2)
    assert plan == plan_dialogues(CATALOGUE, TURNS, dialogues=8, turns=10, seed=3, no_instruction=2, kinds=["first"])
    for d in plan[:8]:
        assert d.kind == "first" and d.instruction in (d.constraint.short, d.constraint.instruction)
        assert [t.since for t in d.turns] == list(range(10)) and {t.state for t in d.turns} == {d.instruction}
        assert not any(t.event or t.old_checks for t in d.turns)
    assert all(d.kind == "none" and not d.instructed for d in plan[8:])


def test_each_kind_plans_its_change_and_what_shows_the_old_instruction():
    plan = plan_dialogues(CATALOGUE, TURNS, dialogues=100, turns=30, seed=0, kinds=KINDS, strata=["train"])
    assert Counter(d.kind for d in plan) == Counter(dict.fromkeys(KINDS, 20))
    assert {d.stratum for d in plan} == {"train"}
    for kind in KINDS:  # each kind tests every family in turn
        families = Counter(d.constraint.family for d in plan if d.kind == kind)
        assert len(families) >= 4 and max(families.values()) - min(families.values()) <= 1, (kind, families)
    for d in plan:
        change = d.events[-1]
        assert all(t.since == (n - change.turn if n >= change.turn else None) for n, t in enumerate(d.turns, start=1))
        for n, t in enumerate(d.turns, start=1):
            state = in_force(list(d.events), n)
            assert t.event == (change.text if n == change.turn and n > 1 else "")
            if t.kind == "chat":
                assert t.checks == tuple(ch for c in state for ch in c.checks)
            gone = withdrawn(list(d.events), n)
            question = t.user if t.kind == "probe" else None
            assert t.old_checks == tuple(ch for c in gone for ch in following_checks(c, question))
        if d.kind == "late":
            assert d.instruction is None and all(t.kind == "chat" and not t.checks for t in d.turns[: change.turn - 1])
        if d.kind == "revoke":
            assert all(not t.checks for t in d.turns[change.turn - 1 :])
    replaced = [d for d in plan if d.kind == "replace"]
    assert any(t.old_checks for d in replaced for t in d.turns)  # some replaced values show (a language, a sign-off)
    # NAME+repeat gives the state in force each turn; the model under test sees each event once
    late = next(d for d in plan if d.kind == "late")
    turn = late.events[0].turn
    repeat, plain = RolloutConfig(repeat_instruction=True), RolloutConfig()
    assert user_message(late, late.turns[turn - 2], repeat) == late.turns[turn - 2].user  # nothing in force yet
    assert user_message(late, late.turns[turn], repeat).endswith(" " + late.turns[turn].state)
    assert user_message(late, late.turns[turn - 1], plain).endswith(" " + late.events[0].text)
    assert user_message(late, late.turns[turn], plain) == late.turns[turn].user


def _judged(kind: str, turns: list[tuple[int | None, bool | None, bool, bool | None]], family: str = "hobby") -> dict:
    """A judged transcript of a constraint of `family`; each turn (since, checks_passed, gate passed, old_followed)."""
    return {
        "id": f"e-{kind}",
        "stratum": "train",
        "kind": kind,
        "constraint": {"family": family},
        "instruction": "x",
        "turns": [
            {"turn": i, "since": s, "checks_passed": c, "gate": {"passed": g}, "old_followed": o}
            for i, (s, c, g, o) in enumerate(turns, start=1)
        ],
    }


def test_per_kind_scores_adherence_and_the_old_instruction_by_d():
    transcripts = [
        _judged(
            "late", [(None, None, True, None), (0, True, True, None), (1, True, False, None), (2, False, True, None)]
        ),
        _judged("late", [(None, None, True, None), (0, True, True, None), (1, True, True, None)]),
        _judged(
            "revoke", [(None, True, True, None), (0, None, True, True), (1, None, True, False), (2, None, False, None)]
        ),
        {**_judged("first", [(0, True, True, None)]), "stratum": "heldout_value"},  # not on trained values
    ]
    scores = per_kind(transcripts)
    assert set(scores) == {"late", "revoke"}
    late = scores["late"]
    assert late["dialogues"] == 2 and "old_followed" not in late
    assert {d: (v["adherence"], v["n"]) for d, v in late["after"].items()} == {
        "0": (1.0, 2),
        "1": (0.5, 2),
        "2": (0.0, 1),
    }
    revoke = scores["revoke"]  # nothing in force after a withdrawal: a real answer is adherent
    assert {d: v["adherence"] for d, v in revoke["after"].items()} == {"0": 1.0, "1": 1.0, "2": 0.0}
    assert {d: (v["share"], v["n"]) for d, v in revoke["old_followed"].items()} == {"0": (1.0, 1), "1": (0.0, 1)}
    assert set(revoke["old_followed"]["0"]) == {"share", "n", "ci95"}
    assert {f: (v["share"], v["n"]) for f, v in revoke["old_followed_per_family"].items()} == {"hobby": (0.0, 1)}


def test_old_followed_per_family_pools_the_ds_every_dialogue_reaches_by_the_old_instructions_family():
    transcripts = [  # the last d of each: 2, 3, 2, so d = 1..2 count (d = 0, the change's own turn, does not)
        _judged(
            "replace",
            [(None, True, True, None), (0, True, True, True), (1, True, True, True), (2, True, True, True)],
            "salutation",
        ),
        _judged(
            "replace",
            [(0, True, True, False), (1, True, True, False), (2, True, True, None), (3, True, True, True)],
            "salutation",
        ),
        _judged("replace", [(0, True, True, False), (1, True, True, False), (2, True, True, False)], "language"),
    ]
    replace = per_kind(transcripts)["replace"]
    assert {f: (v["share"], v["n"]) for f, v in replace["old_followed_per_family"].items()} == {
        "language": (0.0, 2),
        "salutation": (round(2 / 3, 6), 3),  # a turn where it does not show (old_followed None) is not counted
    }
    assert replace["pooled_ds"] == [1, 2]
    assert sum(v["n"] for v in replace["old_followed_per_family"].values()) == sum(
        replace["old_followed"][d]["n"] for d in ("1", "2")
    )
    markdown = "\n".join(_kinds_section({"gatt": {"per_kind": {"replace": replace}}}))
    table = markdown.split(
        "### replace: given in turn one, replaced by another value of its family; old instruction "
        "followed, by its family (d = 1..2)\n"
    )[1]
    assert table.splitlines()[2:4] == [
        "| language | 0.0% [0.0–65.8] (n=2) |",
        "| salutation | 66.7% [20.8–93.9] (n=3) |",
    ]
