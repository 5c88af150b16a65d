"""The answer gate over rolled-out transcripts (see `gatt.eval.gate`).

Each turn of a transcript gets `gate` (the verdict: passed, failed reasons, relevance, repeats) and the
headline `passed`: the instruction's checks (`checks_passed`) and the gate. A turn without checks stays
unscored (`passed` None) but is still judged, so the no-regression score of dialogues without an
instruction is the gate's verdict too. `judge` builds the gate a report asks for (its relevance judges loaded once,
on the device the report runs on) and applies it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from gatt.eval.gate import (
    AnswerGate,
    GateConfig,
    GateItem,
    GateTurn,
    RelevanceScorer,
    relevance_embedder,
)
from gatt.eval.plan import EvalDialogue
from gatt.io.distributed import process_state
from gatt.model.chat_model import load_chat_model
from gatt.model.numerics import Numerics


def other_questions(dialogues: Sequence[EvalDialogue]) -> list[str]:
    """Every distinct chat message of the plan, in first-seen order: the contrast pool of the relevance test.

    Args:
        dialogues: The planned dialogues.

    Returns:
        The user messages of their "chat" turns, without duplicates.
    """
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
    """Judge every reply in place; `passed` becomes checks and gate, `checks_passed` keeps the checks alone.

    Each turn gets `gate`, the verdict as a dict; a turn whose `checks_passed` is None keeps `passed` None.

    Args:
        transcripts: Rolled-out transcripts, each with "id" and "turns" (each turn with "reply" and
            "checks_passed"); updated in place.
        dialogues: The planned dialogues, one per transcript id.
        gate: The gate that judges every turn.
        seed: Seed of each turn's draw of contrast questions (default 0).
        others: Number of other chat messages of the plan each turn is contrasted with (default 3).
    """
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


def needs_relevance_model(dialogues: list[EvalDialogue]) -> bool:
    """Whether some chat turn has no on-topic checks, so a relevance judge decides whether a reply is on its topic.

    Args:
        dialogues: The planned dialogues.

    Returns:
        True where some chat turn has no on-topic checks.
    """
    return any(turn.kind == "chat" and not turn.on_topic for d in dialogues for turn in d.turns)


def has_topic_words(dialogues: list[EvalDialogue]) -> bool:
    """Whether some chat turn has on-topic checks (which the strict gate judges by a relevance judge too).

    Args:
        dialogues: The planned dialogues.

    Returns:
        True where some chat turn has on-topic checks.
    """
    return any(turn.kind == "chat" and turn.on_topic for d in dialogues for turn in d.turns)


def judge(
    transcripts: list[dict[str, Any]],
    dialogues: list[EvalDialogue],
    *,
    relevance_model: str | None,
    others: int,
    seed: int,
    device: str | None = None,
    numerics: Numerics | str = "exact",
    gate: GateConfig = GateConfig(),
) -> None:
    """Apply the answer gate to every transcript, in place.

    The relevance judges `gate` names are loaded only where a turn needs them: the likelihood contrast's chat model
    `relevance_model` (in `numerics`), the embedding model.

    Args:
        transcripts: The rolled-out transcripts, judged in place (`apply_gate`).
        dialogues: The planned dialogues, one per transcript id.
        relevance_model: The chat model whose likelihoods judge relevance (None: no likelihood contrast).
        others: The other questions each reply is contrasted with in the relevance test.
        seed: The seed of each turn's draw of contrast questions.
        device: The device the judges are loaded on (None: this process's).
        numerics: The relevance model's numeric mode (default "exact").
        gate: The answer gate's settings (default GateConfig()).
    """
    models = gate.models(has_topic_words(dialogues), needs_relevance_model(dialogues))
    scorer = None
    if "contrast" in models and relevance_model is not None:
        model, tokenizer = load_chat_model(relevance_model, device=device, numerics=numerics)
        scorer = RelevanceScorer(model, tokenizer, progress=True)
    embedder = relevance_embedder(gate, device or process_state().device) if "embedding" in models else None
    apply_gate(transcripts, dialogues, AnswerGate(gate, scorer, embedder), seed=seed, others=others)
