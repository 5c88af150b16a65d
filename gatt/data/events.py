"""Instructions at any turn: the dialogue kinds, the events that give, change, add or withdraw an instruction,
and the instructions in force at each turn.

A dialogue of kind
- `first` gives its instruction in turn one and keeps it (the paper's GAtt);
- `late` gives it in user turn k > 1 ("From now on: ...");
- `replace` gives it in turn one and replaces it at turn j by another value of the same family;
- `revoke` gives it in turn one and withdraws it at turn j;
- `add` gives it in turn one and adds a second one, of another family, at turn j: both hold after.

An `Event` is what one user turn carries: the turn, its action (give, replace, revoke, add), the
constraints it gives (or, for revoke, withdraws), the one it replaces, and its words. The GAtt data
(`data_gen gatt --kinds`) and the report (`gatt.eval.evaluate --kinds`) draw events alike: the wordings are in
gatt/data/events.yaml, or a constraint's own (`changes` in its constraint-file entry).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gatt.data import constraint_sets
from gatt.data.check_types import Check
from gatt.data.checks import CUSTOM_FAMILY, WORDINGS, Constraint, check_wordings

KINDS = ("first", "late", "replace", "revoke", "add")
# How often a dialogue's instruction is in its short form ("half the time shortened", the paper's GAtt data), and the
# flag's help: the GAtt data, the base corpus and the report's dialogues draw it alike.
SHORT_PROB, SHORT_PROB_HELP = 0.5, "chance of the instruction's short form"
WORDINGS_FILE = Path(__file__).with_name("events.yaml")

# The built-in catalogue's families: each one's kind and the families it cannot hold together with (one sentence
# leaves no room for a persona line, capital letters would change a sign-off the check expects), exported from
# data_gen/data/catalogue.yaml by `python -m data_gen eval-set`. `add` never joins two that conflict.
FAMILIES_FILE = Path(__file__).parents[1] / "eval" / "builtin" / "families.yaml"
# Checks that a reply written without the instruction rarely passes: a reply that passes one after the
# instruction was withdrawn still follows it. A word (hobby, name) counts only where a probe asks for it.
SHOWS_ON_CHAT = frozenset({"language", "startswith", "endswith", "all_caps"})
SHOWS_ON_PROBE = SHOWS_ON_CHAT | {"contains_any"}


@functools.cache
def builtin_families() -> dict[str, dict[str, Any]]:
    """The built-in catalogue's families (FAMILIES_FILE).

    Returns:
        name -> {kind, conflicts: [family, ...]}.
    """
    return yaml.safe_load(FAMILIES_FILE.read_text(encoding="utf-8"))["families"]


def conflict(family_a: str, family_b: str) -> bool:
    """Whether two families cannot hold together: a built-in pair, or two types a benchmark says conflict.

    Args:
        family_a: one family's name.
        family_b: the other's.

    Returns:
        True where `family_b` is among the built-in `family_a`'s conflicts, or a benchmark says the two conflict.
    """
    builtin = builtin_families().get(family_a)
    return (builtin is not None and family_b in builtin["conflicts"]) or constraint_sets.conflict(family_a, family_b)


def kinds_help(dealt: str, detail: str) -> str:
    """The help of the `--kinds` flag of `data_gen gatt` and `gatt.eval.evaluate`.

    Args:
        dealt: how the kinds are dealt.
        detail: what follows the kinds' descriptions.

    Returns:
        The help text: how the kinds are dealt, what each is, then `detail`.
    """
    return (
        f"dialogue kinds, {dealt}: first (the instruction in turn one, kept), late (given in a later user turn), "
        "replace (given in turn one, replaced by another value of its family), revoke (given, then withdrawn), add (a "
        f"second instruction of another family joins). {detail}"
    )


@functools.cache
def builtin_wordings() -> dict[str, tuple[str, ...]]:
    """The wordings of gatt/data/events.yaml, every list present.

    Returns:
        Each event (late, replace, revoke, add) -> its wordings.

    Raises:
        ValueError: when the file's wordings are malformed or a list is missing.
    """
    spec = yaml.safe_load(WORDINGS_FILE.read_text(encoding="utf-8"))
    wordings = check_wordings(spec, str(WORDINGS_FILE))
    if missing := [key for key in WORDINGS if key not in wordings]:
        raise ValueError(f"{WORDINGS_FILE}: missing {', '.join(missing)}")
    return wordings


def wording(action: str, rng: random.Random, owner: Constraint, *, instruction: str = "", old: str = "") -> str:
    """The words of one event: a wording of `owner`'s own (its `changes`) or a built-in one, its slots filled.

    Args:
        action: the event: late, replace, revoke or add.
        rng: the generator the wording is drawn with.
        owner: the constraint whose own wordings (its `changes` for `action`) come first.
        instruction: the instruction given, in the dialogue's form, for the `{instruction}` slot.
        old: the one replaced or withdrawn, for the `{old}` slot.

    Returns:
        The event's words.
    """
    texts = owner.changes.get(action) or builtin_wordings()[action]
    return rng.choice(texts).format(instruction=instruction, old=old)


def instruction_text(constraints: Sequence[Constraint], short: bool) -> str:
    """The combined instruction of several constraints.

    Args:
        constraints: the constraints, in order.
        short: join their short forms by "; " instead of their full sentences by spaces.

    Returns:
        The instruction: full sentences joined by spaces, or short forms joined by "; ".
    """
    if short:
        return "; ".join(c.short for c in constraints)
    return " ".join(c.instruction for c in constraints)


@dataclass(frozen=True)
class Event:
    """What user turn `turn` (from 1) carries: `constraints` given (give, add, replace) or withdrawn (revoke);
    `old`: the one a replace withdraws; `text`: the words (a turn-one give: the instruction itself)."""

    turn: int
    action: str
    constraints: tuple[Constraint, ...]
    text: str
    old: Constraint | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record form of the event.

        Returns:
            turn, kind (the action), the constraints (family, value, split, checks), the words (text), and for a
            replace the one it replaces (replaces).
        """
        out: dict[str, Any] = {
            "turn": self.turn,
            "kind": self.action,
            "constraints": [constraint_entry(c) for c in self.constraints],
            "text": self.text,
        }
        if self.old is not None:
            out["replaces"] = constraint_entry(self.old)
        return out


def constraint_entry(c: Constraint) -> dict[str, Any]:
    """A constraint as records carry it.

    Args:
        c: the constraint.

    Returns:
        {family, value, split, checks}, the checks in their dict form.
    """
    return {"family": c.family, "value": c.value, "split": c.split, "checks": [ch.to_dict() for ch in c.checks]}


def in_force(events: Sequence[Event], turn: int) -> list[Constraint]:
    """The constraints in force at a user turn: every event up to and including it, in order.

    Args:
        events: the dialogue's events.
        turn: the user turn (from 1).

    Returns:
        The constraints in force at `turn`, in the order given.
    """
    state: list[Constraint] = []
    for event in sorted(events, key=lambda e: e.turn):
        if event.turn > turn:
            break
        if event.action == "revoke":
            state = [c for c in state if c.name not in {w.name for w in event.constraints}]
        else:
            kept = [c for c in state if event.old is None or c.name != event.old.name]
            state = kept + list(event.constraints)
    return state


def withdrawn(events: Sequence[Event], turn: int) -> list[Constraint]:
    """The constraints replaced or withdrawn at or before a turn and not in force there.

    Args:
        events: the dialogue's events.
        turn: the user turn (from 1).

    Returns:
        The constraints revoked or replaced at or before `turn` that are not in force at it.
    """
    names = {c.name for c in in_force(events, turn)}
    gone = [c for e in events if e.turn <= turn and e.action == "revoke" for c in e.constraints]
    gone += [e.old for e in events if e.turn <= turn and e.old is not None]
    return [c for c in gone if c.name not in names]


def following_checks(constraint: Constraint, question: str | None) -> list[Check]:
    """The checks that show a reply still follows `constraint`.

    On a chat turn (question None), those a reply without it rarely passes (SHOWS_ON_CHAT); on one of its probes,
    the probe's (SHOWS_ON_PROBE).

    Args:
        constraint: the constraint.
        question: the probe question the turn asks, or None for a chat turn.

    Returns:
        The checks; empty: not checkable there (a word limit, a one-sentence rule, a hobby on a chat turn).
    """
    if question is None:
        return [c for c in constraint.checks if c.type in SHOWS_ON_CHAT]
    probes = [p for p in constraint.probes if p.question == question]
    return [c for p in probes for c in p.checks if c.type in SHOWS_ON_PROBE]


def event_turn(num_turns: int, rng: random.Random, after: int = 0) -> int:
    """The turn of a late event: from 2 to the middle of the dialogue, or earlier so that `after` turns follow it.

    Args:
        num_turns: the dialogue's user turns.
        rng: the generator the turn is drawn with.
        after: turns that should follow the event.

    Returns:
        The event's turn, drawn uniformly from 2 to the last allowed (at least 2).
    """
    last = max(2, min((num_turns + 1) // 2, num_turns - after))
    return rng.randint(2, last)


def second_constraint(
    kind: str, first: Sequence[Constraint], pool: Sequence[Constraint], rng: random.Random
) -> Constraint | None:
    """What a `replace` gives or an `add` adds.

    Args:
        kind: "replace" (another value of the family of one of `first`) or any other kind: an add (a constraint of a
            family `first` lacks that conflicts with none of it; in the `custom` family, any other constraint).
        first: the constraints given in turn one.
        pool: the constraints to draw from.
        rng: the generator the constraint is drawn with.

    Returns:
        The constraint drawn, or None if `pool` has none.
    """
    names = {c.name for c in first}
    if kind == "replace":
        options = [c for c in pool if c.name not in names and any(c.family == f.family for f in first)]
    else:
        taken = {c.family for c in first}
        options = [
            c
            for c in pool
            if c.name not in names
            and (c.family not in taken or c.family == CUSTOM_FAMILY)
            and not any(conflict(c.family, t) for t in taken)
        ]
    return rng.choice(options) if options else None


def draw_events(
    kind: str,
    first: Sequence[Constraint],
    first_text: str,
    pool: Sequence[Constraint],
    num_turns: int,
    rng: random.Random,
    *,
    short: bool,
    after: int = 0,
) -> list[Event]:
    """A dialogue's events: its instruction given, then the kind's change at a later turn.

    A kind that cannot apply (a one-turn dialogue, no second constraint in `pool`) falls back to `first`.

    Args:
        kind: one of KINDS.
        first: the constraints given in turn one (kind first, replace, revoke, add) or at a later turn (late).
        first_text: the words that give `first` (a late event wraps them in a wording).
        pool: the constraints the second one (of a replace or an add) is drawn from.
        num_turns: the dialogue's user turns.
        rng: the generator the turns, constraints and wordings are drawn with.
        short: the second constraint's instruction in its short form.
        after: turns that should follow the later event (`event_turn`).

    Returns:
        The events in turn order.

    Raises:
        ValueError: when `kind` is not one of KINDS.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown dialogue kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "first" or num_turns < 2:
        return [Event(1, "give", tuple(first), first_text)]
    turn = event_turn(num_turns, rng, after)
    if kind == "late":
        return [Event(turn, "give", tuple(first), wording("late", rng, first[0], instruction=first_text))]
    opening = Event(1, "give", tuple(first), first_text)
    if kind == "revoke":
        old = rng.choice(list(first))
        return [opening, Event(turn, "revoke", (old,), wording("revoke", rng, old, old=old.short))]
    second = second_constraint(kind, first, pool, rng)
    if second is None:
        return [opening]
    second = second.phrased(rng)
    given = instruction_text([second], short)
    if kind == "add":
        return [opening, Event(turn, "add", (second,), wording("add", rng, second, instruction=given))]
    old = next(c for c in first if c.family == second.family)
    text = wording("replace", rng, second, instruction=given, old=old.short)
    return [opening, Event(turn, "replace", (second,), text, old=old)]


def dialogue_kind(events: Sequence[Event]) -> str:
    """The kind a dialogue's events make.

    What a fallback in `draw_events` or a dialogue cut short left of the kind asked for.

    Args:
        events: the dialogue's events, in turn order.

    Returns:
        One of KINDS, or `none` without any events.
    """
    if not events:
        return "none"
    if events[0].turn > 1:
        return "late"
    if len(events) == 1:
        return "first"
    return "revoke" if events[1].action == "revoke" else events[1].action
