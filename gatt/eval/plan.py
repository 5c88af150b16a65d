"""The test dialogues of the adherence evaluation: which constraint, which user turns, where the probes go.

The same plan is rolled out with every model under test, so their dialogues differ only in the replies.
Constraints fall in three strata: values GAtt trained on ("train"), held-out values of trained families
("heldout_value"), and families held out as a whole ("heldout_family", the paper's zero-shot case).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gatt.checks import Check, Constraint
from gatt.eval.inputs import EvalTurn

STRATA = ("train", "heldout_value", "heldout_family")
# Half the instruction dialogues test trained values, a quarter each held-out values and held-out families.
STRATUM_CYCLE = ("train", "heldout_value", "train", "heldout_family")


@dataclass(frozen=True)
class PlannedTurn:
    kind: str  # "chat" or "probe"
    user: str
    checks: tuple[Check, ...]  # what the reply must pass: the constraint's checks, or the probe's
    on_topic: tuple[Check, ...] = ()  # the user turn's on-topic checks (no-regression score)


@dataclass(frozen=True)
class EvalDialogue:
    id: str
    stratum: str  # one of STRATA, or "none" for a dialogue without instruction
    constraint: Constraint | None
    instruction: str | None  # the text given in turn one: the full or the short form
    turns: tuple[PlannedTurn, ...]


def stratify(constraints: Sequence[Constraint]) -> dict[str, list[Constraint]]:
    """Constraints by stratum: a family is held out as a whole when none of its values is in the train split."""
    trained_families = {c.family for c in constraints if c.split == "train"}
    strata: dict[str, list[Constraint]] = {name: [] for name in STRATA}
    for c in constraints:
        stratum = (
            "train" if c.split == "train" else "heldout_value" if c.family in trained_families else "heldout_family"
        )
        strata[stratum].append(c)
    return strata


def draw_turns(rng: random.Random, pool: Sequence[EvalTurn], turns: int) -> list[EvalTurn]:
    """`turns` distinct messages, each topic at most once while the pool has topics left (a message without a
    topic is its own); with a pool smaller than `turns`, messages drawn with replacement."""
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
    short_prob: float = 0.5,
    probe_start: int = 2,
    probe_every: int = 4,
) -> list[EvalDialogue]:
    """`dialogues` with one constraint each (strata and families balanced) and `no_instruction` without any."""
    if dialogues < 0 or no_instruction < 0 or turns < 1:
        raise ValueError(
            f"need dialogues >= 0, no_instruction >= 0 and turns >= 1, got {dialogues}, {no_instruction}, {turns}"
        )
    if not pool:
        raise ValueError("the user-turn pool is empty")
    strata = {name: members for name, members in stratify(constraints).items() if members}
    if dialogues and not strata:
        raise ValueError("no constraints to evaluate")
    rng = random.Random(seed)
    cycle = [s for s in STRATUM_CYCLE if s in strata] or list(strata)
    drawn: dict[str, int] = dict.fromkeys(strata, 0)
    plan = []
    for i in range(dialogues + no_instruction):
        user = draw_turns(rng, pool, turns)
        if i >= dialogues:
            chat = tuple(PlannedTurn("chat", u.text, (), u.checks) for u in user)
            plan.append(EvalDialogue(f"e-{i:05d}", "none", None, None, chat))
            continue
        stratum = cycle[i % len(cycle)]
        families = sorted({c.family for c in strata[stratum]})
        family = families[drawn[stratum] % len(families)]  # families in turn, values at random
        drawn[stratum] += 1
        constraint = rng.choice([c for c in strata[stratum] if c.family == family])
        instruction = constraint.short if rng.random() < short_prob else constraint.instruction
        planned = []
        for t, u in enumerate(user, start=1):
            is_probe = probe_every > 0 and t >= probe_start and (t - probe_start) % probe_every == 0
            if is_probe and constraint.probes:
                probe = rng.choice(constraint.probes)
                planned.append(PlannedTurn("probe", probe.question, probe.checks))
            else:
                planned.append(PlannedTurn("chat", u.text, constraint.checks, u.checks))
        plan.append(EvalDialogue(f"e-{i:05d}", stratum, constraint, instruction, tuple(planned)))
    return plan
