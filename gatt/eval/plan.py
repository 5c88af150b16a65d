"""The test dialogues of the adherence evaluation: which constraint, which user turns, where the probes go.

The same plan is rolled out with every model under test, so their dialogues differ only in the replies.
Constraints fall in three strata: values GAtt trained on ("train"), held-out values of trained families
("heldout_value"), and families held out as a whole ("heldout_family", the paper's zero-shot case). Held-out
families may be declared in named tiers (`tiers`: e.g. wordings, behaviours, a kind): each tier is then a unit of
the plan as the other strata are, with as many dialogues, and its dialogues carry the tier's name.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gatt.data.check_types import Check
from gatt.data.checks import Constraint
from gatt.data.events import (
    KINDS,
    SHORT_PROB,
    Event,
    dialogue_kind,
    draw_events,
    following_checks,
    in_force,
    instruction_text,
    withdrawn,
)
from gatt.eval.inputs import EvalTurn

STRATA = ("train", "heldout_value", "heldout_family")
# Half the instruction dialogues test trained values, a quarter each held-out values and held-out families.
STRATUM_CYCLE = ("train", "heldout_value", "train", "heldout_family")


@dataclass(frozen=True)
class PlannedTurn:
    """One planned user turn of a test dialogue and what its reply is scored on.

    Attributes:
        kind: "chat" or "probe".
        user: The user message.
        checks: What the reply must pass: the checks of every instruction in force, or the probe's.
        on_topic: The user turn's on-topic checks (no-regression score).
        event: Words this user turn carries after turn one: an instruction given late, changed, withdrawn.
        state: The instructions in force, appended to the turn by the NAME+repeat column.
        since: Turns since the dialogue's last event (d; 0: this turn gives it); None before it.
        old_checks: Checks that show a withdrawn or replaced instruction still followed.
    """

    kind: str  # "chat" or "probe"
    user: str
    checks: tuple[Check, ...]  # what the reply must pass: the checks of every instruction in force, or the probe's
    on_topic: tuple[Check, ...] = ()  # the user turn's on-topic checks (no-regression score)
    event: str = ""  # words this user turn carries after turn one: an instruction given late, changed, withdrawn
    state: str = ""  # the instructions in force, appended to the turn by the NAME+repeat column
    since: int | None = None  # turns since the dialogue's last event (d; 0: this turn gives it); None before it
    old_checks: tuple[Check, ...] = ()  # checks that show a withdrawn or replaced instruction still followed


@dataclass(frozen=True)
class EvalDialogue:
    """One test dialogue of the plan: its instruction, its events and its planned turns.

    Attributes:
        id: The dialogue's id ("e-00000", ...).
        stratum: One of STRATA, or "none" for a dialogue without instruction.
        constraint: The instruction given first.
        instruction: The text given in turn one (the full or the short form); None: none in turn one.
        turns: The planned turns.
        kind: gatt/data/events.py KINDS, or "none" for a dialogue without instruction.
        events: The dialogue's events, in turn order.
        tier: The held-out tier of its family (a heldout_family dialogue); "" outside any tier.
    """

    id: str
    stratum: str  # one of STRATA, or "none" for a dialogue without instruction
    constraint: Constraint | None  # the instruction given first
    instruction: str | None  # the text given in turn one (the full or the short form); None: none in turn one
    turns: tuple[PlannedTurn, ...]
    kind: str = "first"  # gatt/data/events.py KINDS, or "none" for a dialogue without instruction
    events: tuple[Event, ...] = ()
    tier: str = ""  # the held-out tier of its family (a heldout_family dialogue); "" outside any tier

    @property
    def instructed(self) -> bool:
        """Whether some turn of the dialogue has an instruction in force."""
        return self.instruction is not None or any(turn.state for turn in self.turns)


def stratify(constraints: Sequence[Constraint]) -> dict[str, list[Constraint]]:
    """Constraints by stratum: a family is held out as a whole when none of its values is in the train split.

    Args:
        constraints: The constraints, each with its split ("train" or held out).

    Returns:
        Each of STRATA -> its constraints, in input order (possibly none): "train" those of the train split,
        "heldout_value" held-out values of trained families, "heldout_family" the values of the other families.
    """
    trained_families = {c.family for c in constraints if c.split == "train"}
    strata: dict[str, list[Constraint]] = {name: [] for name in STRATA}
    for c in constraints:
        stratum = (
            "train" if c.split == "train" else "heldout_value" if c.family in trained_families else "heldout_family"
        )
        strata[stratum].append(c)
    return strata


Unit = tuple[str, str]  # (stratum, tier): what the plan deals its dialogues over in turn


def plan_units(
    constraints: Sequence[Constraint], strata: Sequence[str], tiers: Mapping[str, Sequence[str]]
) -> dict[Unit, list[Constraint]]:
    """The plan's units in the order it deals them, each with its constraints.

    Without tiers the units are the strata (train, heldout_value, heldout_family); with tiers train, heldout_value,
    then one unit per tier (its held-out families), and the held-out families in no tier last.

    Args:
        constraints: The constraints to evaluate (see `stratify`).
        strata: The strata to keep; a stratum without constraints makes no unit.
        tiers: Tier -> its held-out families (empty: no tiers).

    Returns:
        (stratum, tier) -> its constraints, in dealing order; the tier is "" outside any tier.

    Raises:
        ValueError: a tier's family that is not held out as a whole, or a family in two tiers.
    """
    every = stratify(constraints)
    by_stratum = {name: members for name, members in every.items() if members and name in strata}
    if not tiers:
        return {(name, ""): members for name, members in by_stratum.items()}
    tier_of: dict[str, str] = {}
    for tier, families in tiers.items():
        for family in families:
            if family in tier_of:
                raise ValueError(f"held-out tiers: {family} is in {tier_of[family]} and in {tier}")
            tier_of[family] = tier
    held = {c.family for c in every["heldout_family"]}
    if trained := sorted(set(tier_of) - held):
        raise ValueError(f"held-out tiers: {', '.join(trained)} not held out as a whole (hold the tiers' families out)")
    units: dict[Unit, list[Constraint]] = {}
    for name, members in by_stratum.items():
        if name != "heldout_family":
            units[name, ""] = members
            continue
        for tier in [*tiers, ""]:
            if in_tier := [c for c in members if tier_of.get(c.family, "") == tier]:
                units[name, tier] = in_tier
    return units


def draw_turns(rng: random.Random, pool: Sequence[EvalTurn], turns: int) -> list[EvalTurn]:
    """`turns` distinct messages, each topic at most once while the pool has topics left.

    A message without a topic is its own; with a pool smaller than `turns`, messages are drawn with replacement.

    Args:
        rng: The random generator the draw uses.
        pool: The user messages to draw from.
        turns: The number of messages to draw.

    Returns:
        The `turns` messages, in dialogue order.
    """
    if len(pool) < turns:
        return rng.choices(list(pool), k=turns)
    shuffled = rng.sample(list(pool), len(pool))
    chosen: list[EvalTurn] = []
    topics: set[str] = set()
    for turn in shuffled:
        if turn.topic is None or turn.topic not in topics:
            chosen.append(turn)
            if turn.topic is not None:
                topics.add(turn.topic)
            if len(chosen) == turns:
                return chosen
    return chosen + [t for t in shuffled if t not in chosen][: turns - len(chosen)]


def plan_dialogues(
    constraints: Sequence[Constraint],
    pool: Sequence[EvalTurn],
    *,
    dialogues: int,
    turns: int,
    seed: int,
    no_instruction: int = 0,
    short_prob: float = SHORT_PROB,
    probe_start: int = 2,
    probe_every: int = 4,
    kinds: Sequence[str] = ("first",),
    strata: Sequence[str] = STRATA,
    tiers: Mapping[str, Sequence[str]] | None = None,
) -> list[EvalDialogue]:
    """`dialogues` with an instruction and `no_instruction` without any.

    The instruction dialogues take the kinds in turn, then strata and families balanced.
    A kind other than `first` changes its instruction at a turn from 2 to 11 of 30 (gatt/data/events.py), so that 19
    turns follow the change; its second constraint is of the dialogue's stratum.

    Without `tiers` half the dialogues test trained values and a quarter each held-out values and held-out
    families; with `tiers` every unit gets as many.

    Args:
        constraints: The constraints to evaluate, with their train/heldout split.
        pool: The user messages the turns are drawn from (`draw_turns`).
        dialogues: The number of dialogues with an instruction.
        turns: The number of user turns of each dialogue.
        seed: Seed of every draw, so the same arguments give the same plan.
        no_instruction: The number of dialogues without any instruction, after the others (default 0).
        short_prob: The chance of an instruction's short form (default SHORT_PROB).
        probe_start: The first turn that may be a probe (default 2); a probe comes only after the instruction.
        probe_every: Turns from one probe to the next (default 4; 0: no probes).
        kinds: The kinds of gatt/data/events.py KINDS the instruction dialogues take in turn (default ("first",)).
        strata: The strata to evaluate, some of STRATA (default all).
        tiers: Tier -> its held-out families, see `plan_units` (default None: no tiers).

    Returns:
        The dialogues, ids "e-00000", ... in order: those with an instruction first, then those without.

    Raises:
        ValueError: When `dialogues` or `no_instruction` is negative, `turns` is below 1, `kinds` or `strata` is
            empty or names an unknown one, the pool is empty, there are no constraints to evaluate in `strata`, or
            the tiers are invalid (`plan_units`).
    """
    _check_plan(dialogues, no_instruction, turns, kinds, strata, pool)
    by_unit = plan_units(constraints, strata, tiers or {})
    if dialogues and not by_unit:
        raise ValueError(f"no constraints to evaluate in {', '.join(strata)}")
    rng = random.Random(seed)
    # with tiers every unit in turn; without, the strata's cycle (trained values twice as often)
    cycle = list(by_unit) if tiers else [(s, "") for s in STRATUM_CYCLE if (s, "") in by_unit] or list(by_unit)
    drawn: Counter[tuple[Unit, str]] = Counter()  # dialogues of each (unit, kind) so far: families in turn in each
    plan = []
    for i in range(dialogues + no_instruction):
        user = draw_turns(rng, pool, turns)
        if i >= dialogues:
            chat = tuple(PlannedTurn("chat", u.text, (), u.checks) for u in user)
            plan.append(EvalDialogue(f"e-{i:05d}", "none", None, None, chat, kind="none"))
            continue
        kind = kinds[i % len(kinds)]
        unit = cycle[(i // len(kinds)) % len(cycle)]
        stratum, members = unit[0], by_unit[unit]
        if kind == "replace":  # a family with another value to change to, where the stratum has one
            members = [c for c in members if sum(o.family == c.family for o in members) > 1] or members
        families = sorted({c.family for c in members})
        family = families[drawn[unit, kind] % len(families)]  # families in turn, values at random
        drawn[unit, kind] += 1
        constraint = rng.choice([c for c in members if c.family == family])
        short = rng.random() < short_prob
        instruction = constraint.short if short else constraint.instruction
        events_rng = random.Random(f"{seed}-{i}-events")  # first-kind plans draw nothing from it
        events = draw_events(kind, [constraint], instruction, by_unit[unit], turns, events_rng, short=short, after=19)
        planned = tuple(_turns(events, user, short, rng, probe_start, probe_every))
        given = instruction if events[0].turn == 1 else None
        made = dialogue_kind(events)
        plan.append(EvalDialogue(f"e-{i:05d}", stratum, constraint, given, planned, made, tuple(events), unit[1]))
    return plan


def _check_plan(
    dialogues: int,
    no_instruction: int,
    turns: int,
    kinds: Sequence[str],
    strata: Sequence[str],
    pool: Sequence[EvalTurn],
) -> None:
    """`plan_dialogues`' ValueErrors for its counts, kinds, strata and pool (its Raises)."""
    if dialogues < 0 or no_instruction < 0 or turns < 1:
        raise ValueError(
            f"need dialogues >= 0, no_instruction >= 0 and turns >= 1, got {dialogues}, {no_instruction}, {turns}"
        )
    if not kinds or set(kinds) - set(KINDS):
        raise ValueError(f"kinds must be some of {', '.join(KINDS)}, got {list(kinds)}")
    if not strata or set(strata) - set(STRATA):
        raise ValueError(f"strata must be some of {', '.join(STRATA)}, got {list(strata)}")
    if not pool:
        raise ValueError("the user-turn pool is empty")


def _turns(
    events: Sequence[Event],
    user: Sequence[EvalTurn],
    short: bool,
    rng: random.Random,
    probe_start: int,
    probe_every: int,
) -> list[PlannedTurn]:
    """A dialogue's turns under its events: each turn checked against the instructions in force, probes of those
    (and of a withdrawn one) every `probe_every` turns once an instruction is given, and d counted from the last event."""
    start, last = events[0].turn, events[-1].turn
    first_probe = probe_start if start == 1 else max(probe_start, start + 1)  # no probe before an instruction
    planned = []
    for t, u in enumerate(user, start=1):
        state, gone = in_force(events, t), withdrawn(events, t)
        event = next((e.text for e in events if e.turn == t and t > 1), "")
        common = {
            "event": event,
            "state": instruction_text(state, short) if state else "",
            "since": t - last if t >= last else None,
        }
        is_probe = probe_every > 0 and t >= first_probe and (t - probe_start) % probe_every == 0
        askers = [c for c in [*state, *gone] if c.probes]
        if is_probe and askers:
            # one draw for one candidate too, as plans of the first kind always drew
            asker = askers[0] if len(askers) == 1 else rng.choice(askers)
            probe = rng.choice(asker.probes)
            own = probe.checks if asker in state else ()
            checks = (*own, *(c for other in state if other is not asker for c in other.checks))
            old = tuple(c for w in gone for c in following_checks(w, probe.question))
            planned.append(PlannedTurn("probe", probe.question, checks, old_checks=old, **common))
        else:
            checks = tuple(c for constraint in state for c in constraint.checks)
            old = tuple(c for w in gone for c in following_checks(w, None))
            planned.append(PlannedTurn("chat", u.text, checks, u.checks, old_checks=old, **common))
    return planned
