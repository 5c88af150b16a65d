"""Scores rollout transcripts: adherence per turn with Wilson intervals, per family, survival, attention.

A transcript is one dialogue of one model, as the rollout writes it; every function here is pure
and works on lists of those dicts, so report.json can be recomputed from transcripts.jsonl.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

Transcript = dict[str, Any]

TRAIN: tuple[str, ...] = ("train",)
HELDOUT: tuple[str, ...] = ("heldout_value", "heldout_family")
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default)."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 or n successes one bound is exactly 0 or 1; floats would land a rounding error off.
    lo = 0.0 if successes == 0 else centre - half
    hi = 1.0 if successes == n else centre + half
    return lo, hi


def rate(successes: int, n: int) -> dict[str, Any]:
    """`{"adherence": successes/n, "n": n, "ci95": [lo, hi]}`, rounded to 6 decimals."""
    lo, hi = wilson_interval(successes, n)
    return {"adherence": round(successes / n, 6), "n": n, "ci95": [round(lo, 6), round(hi, 6)]}


def _select(transcripts: Iterable[Transcript], strata: Sequence[str]) -> list[Transcript]:
    return [t for t in transcripts if t["stratum"] in strata]


def _scored_turns(transcripts: Iterable[Transcript]) -> list[dict[str, Any]]:
    return [turn for t in transcripts for turn in t["turns"] if turn["passed"] is not None]


def _per_turn(transcripts: Iterable[Transcript]) -> dict[str, dict[str, Any]]:
    passed: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for turn in _scored_turns(transcripts):
        total[turn["turn"]] += 1
        passed[turn["turn"]] += bool(turn["passed"])
    return {str(k): rate(passed[k], total[k]) for k in sorted(total)}


def adherence_per_turn(transcripts: Iterable[Transcript], strata: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Adherence at each turn ("1", "2", ...) over the dialogues whose stratum is in `strata`."""
    return _per_turn(_select(transcripts, strata))


def per_family(transcripts: Iterable[Transcript]) -> dict[str, dict[str, Any]]:
    """Per constraint family: per-turn adherence on train and heldout strata, and one overall rate."""
    by_family: dict[str, list[Transcript]] = defaultdict(list)
    for t in transcripts:
        if t["constraint"] is not None:
            by_family[t["constraint"]["family"]].append(t)
    out: dict[str, dict[str, Any]] = {}
    for family in sorted(by_family):
        group = by_family[family]
        turns = _scored_turns(group)
        if not turns:
            continue
        entry: dict[str, Any] = {}
        for key, strata in (("train", TRAIN), ("heldout", HELDOUT)):
            table = adherence_per_turn(group, strata)
            if table:
                entry[key] = table
        entry["overall"] = rate(sum(bool(turn["passed"]) for turn in turns), len(turns))
        out[family] = entry
    return out


def survival(transcripts: Iterable[Transcript], strata: Sequence[str]) -> dict[str, Any]:
    """Share of dialogues still adherent at each turn, and the mean turn of the first violation."""
    dialogues = _select(transcripts, strata)
    first_violation: list[int] = []
    survived: Counter[int] = Counter()
    reached: Counter[int] = Counter()
    for d in dialogues:
        turns = sorted(d["turns"], key=lambda turn: turn["turn"])
        last = turns[-1]["turn"] if turns else 0
        failed = [turn["turn"] for turn in turns if turn["passed"] is False]
        first = failed[0] if failed else last + 1
        first_violation.append(first)
        for t in range(1, last + 1):
            reached[t] += 1
            survived[t] += t < first
    return {
        "per_turn": {str(t): round(survived[t] / reached[t], 6) for t in sorted(reached)},
        "mean_turns_to_first_violation": round(sum(first_violation) / len(first_violation), 6) if dialogues else None,
        "n": len(dialogues),
    }


def attention_per_turn(transcripts: Iterable[Transcript]) -> dict[str, float]:
    """Mean attention share on the instruction per turn, over dialogues with an instruction."""
    values: dict[int, list[float]] = defaultdict(list)
    for t in transcripts:
        if t["instruction"] is None:
            continue
        for turn in t["turns"]:
            if turn.get("attention_on_instruction") is not None:
                values[turn["turn"]].append(turn["attention_on_instruction"])
    return {str(k): round(sum(values[k]) / len(values[k]), 6) for k in sorted(values)}


def no_regression(transcripts: Iterable[Transcript]) -> dict[str, Any] | None:
    """On-topic rate over the dialogues without an instruction (None when there are none)."""
    flags = [turn["on_topic"] for t in _select(transcripts, ("none",)) for turn in t["turns"] if turn.get("on_topic") is not None]
    if not flags:
        return None
    scored = rate(sum(bool(f) for f in flags), len(flags))
    return {"on_topic": scored["adherence"], "n": scored["n"], "ci95": scored["ci95"]}


def score_model(transcripts: Sequence[Transcript]) -> dict[str, Any]:
    """Every score of one model's transcripts, as one JSON-serialisable dict."""
    return {
        "per_turn": adherence_per_turn(transcripts, TRAIN),
        "heldout_per_turn": adherence_per_turn(transcripts, ("heldout_value",)),
        "heldout_family_per_turn": adherence_per_turn(transcripts, ("heldout_family",)),
        "per_family": per_family(transcripts),
        "survival": {"train": survival(transcripts, TRAIN), "heldout": survival(transcripts, HELDOUT)},
        "attention_on_instruction": attention_per_turn(transcripts),
        "no_regression": no_regression(transcripts),
        "stop_reasons": dict(Counter(t["stop_reason"] for t in transcripts)),
        "dialogues": len(transcripts),
    }
