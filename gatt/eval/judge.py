"""The answer gate over rolled-out transcripts (see `gatt.eval.gate`).

Each turn of a transcript gets `gate` (the verdict: passed, failed reasons, relevance, repeats) and the
headline `passed`: the instruction's checks (`checks_passed`) and the gate. A turn without checks stays
unscored (`passed` None) but is still judged, so the no-regression score of dialogues without an
instruction is the gate's verdict too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from gatt.eval.gate import AnswerGate, GateItem, GateTurn
from gatt.eval.plan import EvalDialogue


def other_questions(dialogues: Sequence[EvalDialogue]) -> list[str]:
    """Every distinct chat message of the plan, in first-seen order: the contrast pool of the relevance test."""
    return list(dict.fromkeys(turn.user for d in dialogues for turn in d.turns if turn.kind == "chat"))


def _items(
    transcript: dict[str, Any], dialogue: EvalDialogue, pool: Sequence[str], seed: int, others: int
) -> list[GateItem]:
    items: list[GateItem] = []
    earlier: list[GateTurn] = []
    # every instruction's words (the gate exempts a run they contain from its template test)
    instructions = " ".join(filter(None, [dialogue.instruction, *(turn.event for turn in dialogue.turns)]))
    for number, turn in enumerate(transcript["turns"], start=1):
        planned = dialogue.turns[number - 1]
        # The planned message, not the transcript's (which has the instruction appended in NAME+repeat runs).
        current = GateTurn(planned.user, turn["reply"], planned.kind, planned.on_topic)
        rng = random.Random(f"{seed}-{dialogue.id}-{number}")
        candidates = [q for q in pool if q != planned.user]
        contrast = tuple(rng.sample(candidates, min(others, len(candidates))))
        items.append(GateItem(current, tuple(earlier), contrast, instructions))
        earlier.append(current)
    return items


def apply_gate(
    transcripts: list[dict[str, Any]],
    dialogues: Sequence[EvalDialogue],
    gate: AnswerGate,
    *,
    seed: int = 0,
    others: int = 3,
) -> None:
    """Judge every reply in place; `passed` becomes checks and gate, `checks_passed` keeps the checks alone."""
    by_id = {d.id: d for d in dialogues}
    pool = other_questions(dialogues)
    items = [item for t in transcripts for item in _items(t, by_id[t["id"]], pool, seed, others)]
    verdicts = iter(gate.judge(items))
    for t in transcripts:
        for turn in t["turns"]:
            verdict = next(verdicts)
            turn["gate"] = verdict.to_dict()
            checks = turn["checks_passed"]
            turn["passed"] = None if checks is None else checks and verdict.passed
