"""Scores rollout transcripts: adherence per turn with Wilson intervals, per family, survival, attention.

A transcript is one dialogue of one model, as the rollout writes it and `judge.apply_gate` judges it;
every function here is pure and works on lists of those dicts, so report.json can be recomputed from
transcripts.jsonl. Adherence is read from a turn's `passed` (checks and the answer gate: the headline)
or, with `key="checks_passed"`, from the checks alone.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from gatt.data.check_types import BENCHMARK_CHECKS
from gatt.data.events import KINDS
from gatt.eval.gate import REASONS

Transcript = dict[str, Any]

REPEAT_SUFFIX = "+repeat"  # the model name of a model's upper bound: the instruction repeated in every user turn
SPLIT_SUFFIX = "+split"  # a model with split-softmax: its attention on the instruction boosted at inference
FOLLOWABLE = 0.8  # a family the upper bound follows this often (all turns) is one the model can follow when reminded
TRAIN: tuple[str, ...] = ("train",)
HELDOUT: tuple[str, ...] = ("heldout_value", "heldout_family")
STRATA_INSTRUCTED: tuple[str, ...] = TRAIN + HELDOUT
Z95 = 1.959963984540054
Key = Literal["passed", "checks_passed"]


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default).

    Args:
        successes: The number of successes.
        n: The number of trials.
        z: The normal quantile of the interval's confidence (default Z95: 95%).

    Returns:
        (lo, hi); lo is exactly 0 at 0 successes and hi exactly 1 at `n`.

    Raises:
        ValueError: When `n` is not positive or `successes` is not in [0, n].
    """
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
    """A rate with its 95% Wilson interval.

    Args:
        successes: The number of successes.
        n: The number of trials.

    Returns:
        `{"adherence": successes/n, "n": n, "ci95": [lo, hi]}`, rounded to 6 decimals.

    Raises:
        ValueError: When `n` is not positive or `successes` is not in [0, n].
    """
    lo, hi = wilson_interval(successes, n)
    return {"adherence": round(successes / n, 6), "n": n, "ci95": [round(lo, 6), round(hi, 6)]}


def kind_of(transcript: Transcript) -> str:
    """A dialogue's kind (gatt/data/events.py KINDS, or "none" without an instruction).

    Args:
        transcript: One dialogue's transcript.

    Returns:
        Its "kind"; for a transcript written before kinds existed, `first`, or `none` where its instruction is None.
    """
    return transcript.get("kind") or ("none" if transcript["instruction"] is None else "first")


def first_turn(transcripts: Iterable[Transcript]) -> list[Transcript]:
    """The dialogues of the paper's setting: the instruction in turn one and kept (and those without one).

    Args:
        transcripts: The transcripts to select from.

    Returns:
        Those of kind `first` or `none`, in input order.
    """
    return [t for t in transcripts if kind_of(t) in ("first", "none")]


def per_kind(transcripts: Iterable[Transcript], strata: Sequence[str] = TRAIN) -> dict[str, dict[str, Any]]:
    """Per dialogue kind, over the dialogues whose stratum is in `strata`: scores by d, the turns since its event.

    d = 0 is the turn that gives the instruction, or the change (the kind's event):

    - `after[d]`: replies that obey every instruction in force (its checks; none after a withdrawal) and pass the
      answer gate;
    - `old_followed[d]` (replace, revoke): replies that still follow the replaced or withdrawn instruction, by
      the checks that show it (gatt/data/events.py `following_checks`: language, capitals, an opening or a sign-off on
      every turn; a hobby or a persona on its probes), over the turns where it is checkable;
    - `old_followed_per_family[family]` (replace, revoke): the same share by the old instruction's family (the
      one the dialogue's constraint names), pooled over d = 1 to `pooled_ds`' end, the last d every dialogue of
      the kind reaches (19 in 30 turns with changes at turns 2-11), to say which families a change fails.

    Args:
        transcripts: Judged transcripts (each turn with "since", "checks_passed", "gate" and, where checkable,
            "old_followed").
        strata: The strata to score: stratum names, or `tier_stratum(TIER)` for one held-out tier (default TRAIN).

    Returns:
        Kind -> `{"dialogues": count, "after": {d: rate}}`, with `"old_followed": {d: share}` and
        `"old_followed_per_family": {family: share}` and `"pooled_ds": [1, last d]` for replace and revoke; d as a
        string. A kind with no turn after its event is left out.
    """
    selected = _select(transcripts, strata)
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        group = [t for t in selected if kind_of(t) == kind]
        obeyed: Counter[int] = Counter()
        total: Counter[int] = Counter()
        followed: Counter[int] = Counter()
        judged: Counter[int] = Counter()
        by_family: list[tuple[str, int, bool]] = []  # (the old instruction's family, d, followed) of judged turns
        last_d: list[int] = []  # per dialogue, its last d
        for t in group:
            last_d.append(-1)
            for turn in t["turns"]:
                d = turn.get("since")
                if d is None:
                    continue
                last_d[-1] = max(last_d[-1], d)
                total[d] += 1
                obeyed[d] += turn["checks_passed"] is not False and bool(turn["gate"]["passed"])
                if turn.get("old_followed") is not None:
                    judged[d] += 1
                    followed[d] += bool(turn["old_followed"])
                    by_family.append((t["constraint"]["family"], d, bool(turn["old_followed"])))
        if not total:
            continue
        entry: dict[str, Any] = {
            "dialogues": len(group),
            "after": {str(d): rate(obeyed[d], total[d]) for d in sorted(total)},
        }
        if kind in ("replace", "revoke"):
            entry["old_followed"] = {str(d): share(followed[d], judged[d]) for d in sorted(judged)}
            end = min(last_d)
            family_judged: Counter[str] = Counter()
            family_followed: Counter[str] = Counter()
            for family, d, was_followed in by_family:
                if 1 <= d <= end:
                    family_judged[family] += 1
                    family_followed[family] += was_followed
            entry["old_followed_per_family"] = {
                family: share(family_followed[family], family_judged[family]) for family in sorted(family_judged)
            }
            entry["pooled_ds"] = [1, end]
        out[kind] = entry
    return out


def share(successes: int, n: int) -> dict[str, Any]:
    """`rate` under the name of a share that should be low.

    Args:
        successes: The number of replies counted.
        n: The number of replies.

    Returns:
        `{"share": successes/n, "n": n, "ci95": [lo, hi]}`, rounded to 6 decimals.

    Raises:
        ValueError: When `n` is not positive or `successes` is not in [0, n].
    """
    scored = rate(successes, n)
    return {"share": scored["adherence"], "n": n, "ci95": scored["ci95"]}


def tier_stratum(tier: str) -> str:
    """The stratum name that selects one held-out tier's dialogues.

    Args:
        tier: The tier's name, e.g. "behaviours".

    Returns:
        "heldout_family:TIER", e.g. "heldout_family:behaviours".
    """
    return f"heldout_family:{tier}"


def tiers_of(transcripts: Iterable[Transcript]) -> list[str]:
    """The held-out tiers the transcripts' dialogues carry, in order of appearance.

    Args:
        transcripts: The transcripts; those without a "tier" (or with "") carry none.

    Returns:
        The tier names, without duplicates.
    """
    return list(dict.fromkeys(t["tier"] for t in transcripts if t.get("tier")))


def _select(transcripts: Iterable[Transcript], strata: Sequence[str]) -> list[Transcript]:
    """The dialogues of `strata`: a stratum's name, or `tier_stratum(TIER)` for one held-out tier's."""
    return [t for t in transcripts if t["stratum"] in strata or (t.get("tier") and tier_stratum(t["tier"]) in strata)]


def _scored_turns(transcripts: Iterable[Transcript], key: Key = "passed") -> list[dict[str, Any]]:
    return [turn for t in transcripts for turn in t["turns"] if turn[key] is not None]


def adherence_per_turn(
    transcripts: Iterable[Transcript], strata: Sequence[str], key: Key = "passed"
) -> dict[str, dict[str, Any]]:
    """Adherence at each turn ("1", "2", ...) over the dialogues whose stratum is in `strata`.

    Args:
        transcripts: Judged transcripts.
        strata: The strata to score: stratum names, or `tier_stratum(TIER)` for one held-out tier.
        key: What counts as adherent: "passed" (checks and the answer gate, the default) or "checks_passed" (the
            checks alone).

    Returns:
        Turn number (a string) -> `rate` of its scored replies (`key` not None); turns without any are left out.
    """
    passed: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for turn in _scored_turns(_select(transcripts, strata), key):
        total[turn["turn"]] += 1
        passed[turn["turn"]] += bool(turn[key])
    return {str(k): rate(passed[k], total[k]) for k in sorted(total)}


def per_family(transcripts: Iterable[Transcript], key: Key = "passed") -> dict[str, dict[str, Any]]:
    """Per constraint family: per-turn adherence on train and heldout strata, and one overall rate.

    Args:
        transcripts: Judged transcripts; those without a constraint are left out.
        key: What counts as adherent: "passed" (checks and the answer gate, the default) or "checks_passed" (the
            checks alone).

    Returns:
        Family (sorted) -> `{"train": per-turn, "heldout": per-turn, "overall": rate}` (`adherence_per_turn`; a
        split without scored turns left out); a family without any scored turn is left out.
    """
    by_family: dict[str, list[Transcript]] = defaultdict(list)
    for t in transcripts:
        if t["constraint"] is not None:
            by_family[t["constraint"]["family"]].append(t)
    out: dict[str, dict[str, Any]] = {}
    for family in sorted(by_family):
        group = by_family[family]
        turns = _scored_turns(group, key)
        if not turns:
            continue
        entry: dict[str, Any] = {}
        for split, strata in (("train", TRAIN), ("heldout", HELDOUT)):
            table = adherence_per_turn(group, strata, key)
            if table:
                entry[split] = table
        entry["overall"] = rate(sum(bool(turn[key]) for turn in turns), len(turns))
        out[family] = entry
    return out


def survival(transcripts: Iterable[Transcript], strata: Sequence[str], key: Key = "passed") -> dict[str, Any]:
    """Share of dialogues still adherent at each turn, and the mean turn of the first violation.

    Args:
        transcripts: Judged transcripts.
        strata: The strata to score: stratum names, or `tier_stratum(TIER)` for one held-out tier.
        key: What counts as adherent: "passed" (checks and the answer gate, the default) or "checks_passed" (the
            checks alone).

    Returns:
        `{"per_turn": {turn: share}, "mean_turns_to_first_violation": mean, "n": dialogues}`: a violation is a turn
        whose `key` is False; a dialogue without one counts its last turn + 1; the mean is None without dialogues.
    """
    dialogues = _select(transcripts, strata)
    first_violation: list[int] = []
    survived: Counter[int] = Counter()
    reached: Counter[int] = Counter()
    for d in dialogues:
        turns = sorted(d["turns"], key=lambda turn: turn["turn"])
        last = turns[-1]["turn"] if turns else 0
        failed = [turn["turn"] for turn in turns if turn[key] is False]
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
    """Mean attention share on the instruction per turn, over dialogues with an instruction.

    Args:
        transcripts: Transcripts whose turns may carry "attention_on_instruction" (the attention probe's).

    Returns:
        Turn number (a string) -> the mean share, rounded to 6 decimals; turns without any share are left out.
    """
    values: dict[int, list[float]] = defaultdict(list)
    for t in transcripts:
        if t["instruction"] is None:
            continue
        for turn in t["turns"]:
            if turn.get("attention_on_instruction") is not None:
                values[turn["turn"]].append(turn["attention_on_instruction"])
    return {str(k): round(sum(values[k]) / len(values[k]), 6) for k in sorted(values)}


def attention_per_head(transcripts: Iterable[Transcript]) -> dict[str, list[list[float]]]:
    """Per turn, the (layers, heads) attention shares on the instruction.

    Each share is averaged over the turn's replies in dialogues with an instruction.

    Args:
        transcripts: Transcripts whose turns may carry "attention_per_head", a (layers, heads) list of lists.

    Returns:
        Turn number (a string) -> the (layers, heads) mean shares, rounded to 6 decimals; turns without any are
        left out.
    """
    sums: dict[int, list[list[float]]] = {}
    counts: Counter[int] = Counter()
    for t in transcripts:
        if t["instruction"] is None:
            continue
        for turn in t["turns"]:
            heads = turn.get("attention_per_head")
            if not heads:
                continue
            total = sums.setdefault(turn["turn"], [[0.0] * len(row) for row in heads])
            for total_row, row in zip(total, heads):
                total_row[:] = [a + b for a, b in zip(total_row, row)]
            counts[turn["turn"]] += 1
    return {str(k): [[round(v / counts[k], 6) for v in row] for row in sums[k]] for k in sorted(sums)}


def attention_max_head(per_head: dict[str, list[list[float]]]) -> dict[str, float]:
    """Per turn, the largest share that any single (layer, head) puts on the instruction (Figure 10's maximum).

    Args:
        per_head: `attention_per_head`'s output: per turn, the (layers, heads) shares averaged over the turn's
            replies.

    Returns:
        Turn number -> the share of the head that keeps the instruction best.
    """
    return {turn: max(max(row) for row in heads) for turn, heads in per_head.items()}


def no_regression(
    transcripts: Iterable[Transcript], key: Key = "passed", strata: Sequence[str] = ("none",)
) -> dict[str, Any] | None:
    """The share of replies on the user's topic, and their mean length.

    Over the chat turns of the dialogues without an instruction (or of `strata`). With the gate (`key="passed"`),
    on topic means a real answer: the gate's verdict, which judges the topic by the turn's on-topic checks or,
    without them, by likelihood; with the checks alone, the turn's on-topic checks (None when no turn has any).

    Args:
        transcripts: Judged transcripts.
        key: "passed" (the gate's verdict, the default) or "checks_passed" (the turn's on-topic checks).
        strata: The strata to score (default ("none",): the dialogues without an instruction).

    Returns:
        `{"on_topic": share, "n": replies judged, "ci95": [lo, hi], "mean_words": mean}`, the mean length in words
        over every chat turn; None where no chat turn is judged.
    """
    turns = [turn for t in _select(transcripts, strata) for turn in t["turns"] if turn["kind"] == "chat"]
    flags = [turn["gate"]["passed"] if key == "passed" else turn.get("on_topic") for turn in turns]
    flags = [f for f in flags if f is not None]
    if not flags:
        return None
    scored = rate(sum(bool(f) for f in flags), len(flags))
    mean_words = sum(len(turn["reply"].split()) for turn in turns) / len(turns)
    return {
        "on_topic": scored["adherence"],
        "n": scored["n"],
        "ci95": scored["ci95"],
        "mean_words": round(mean_words, 3),
    }


def answer_gate(transcripts: Iterable[Transcript]) -> dict[str, Any] | None:
    """How many replies the gate passed, and the share failed for each reason (a reply may fail several).

    Args:
        transcripts: Transcripts whose turns may carry the gate's verdict ("gate").

    Returns:
        `{"passed": share, "n": replies judged, "failed": {reason: share}}` with every one of REASONS, shares rounded
        to 6 decimals; None where no reply was judged.
    """
    verdicts = [turn["gate"] for t in transcripts for turn in t["turns"] if "gate" in turn]
    if not verdicts:
        return None
    failed = Counter(reason for v in verdicts for reason in v["failed"])
    return {
        "passed": round(sum(v["passed"] for v in verdicts) / len(verdicts), 6),
        "n": len(verdicts),
        "failed": {reason: round(failed[reason] / len(verdicts), 6) for reason in REASONS},
    }


def adherence_scores(transcripts: Sequence[Transcript], key: Key = "passed") -> dict[str, Any]:
    """The scores that depend on what counts as adherent.

    Per turn and stratum (and held-out tier, where the dialogues carry tiers), per family, survival, no regression.

    Args:
        transcripts: Judged transcripts of one model.
        key: What counts as adherent: "passed" (checks and the answer gate, the default) or "checks_passed" (the
            checks alone).

    Returns:
        `per_turn` (train), `heldout_per_turn`, `heldout_family_per_turn`, `tier_per_turn` (tier -> per-turn, where
        the dialogues carry tiers), `per_family`, `survival` (train and heldout), `no_regression` (dialogues without
        an instruction) and `no_regression_instructed` (dialogues with one).
    """
    scores: dict[str, Any] = {
        "per_turn": adherence_per_turn(transcripts, TRAIN, key),
        "heldout_per_turn": adherence_per_turn(transcripts, ("heldout_value",), key),
        "heldout_family_per_turn": adherence_per_turn(transcripts, ("heldout_family",), key),
    }
    if tiers := tiers_of(transcripts):  # the held-out families above, split by the tier each was declared in
        scores["tier_per_turn"] = {tier: adherence_per_turn(transcripts, (tier_stratum(tier),), key) for tier in tiers}
    return scores | {
        "per_family": per_family(transcripts, key),
        "survival": {"train": survival(transcripts, TRAIN, key), "heldout": survival(transcripts, HELDOUT, key)},
        "no_regression": no_regression(transcripts, key),
        # The same scores in the dialogues with an instruction: what the model gives up to follow it (a model
        # whose attention is boosted at inference, NAME+split, differs from NAME only there).
        "no_regression_instructed": no_regression(transcripts, key, STRATA_INSTRUCTED),
    }


def benchmark_metrics(transcripts: Iterable[Transcript], name: str) -> dict[str, Any] | None:
    """IFEval's own metrics, per turn, over the replies that carry checks of type `name`.

    `prompt_strict` is the share of replies that follow every such instruction in force, `instruction_strict`
    the share of those instructions followed, each by the benchmark's strict checker and without the answer gate.

    Args:
        transcripts: Transcripts whose turns carry their checks' verdicts ("checks", each with "type" and "passed").
        name: The benchmark's check type (ifeval, ifbench).

    Returns:
        `{"per_turn": {turn: {"prompt_strict", "instruction_strict", "n", "ci95"}}}`: `n` replies, `ci95` the
        Wilson interval of prompt_strict; None where no reply has such a check.
    """
    replies: Counter[int] = Counter()
    all_followed: Counter[int] = Counter()
    instructions: Counter[int] = Counter()
    followed: Counter[int] = Counter()
    for t in transcripts:
        for turn in t["turns"]:
            verdicts = [check["passed"] for check in turn["checks"] if check["type"] == name]
            if verdicts:
                replies[turn["turn"]] += 1
                all_followed[turn["turn"]] += all(verdicts)
                instructions[turn["turn"]] += len(verdicts)
                followed[turn["turn"]] += sum(verdicts)
    if not replies:
        return None
    per_turn = {}
    for number in sorted(replies):
        scored = rate(all_followed[number], replies[number])
        per_turn[str(number)] = {
            "prompt_strict": scored["adherence"],
            "instruction_strict": round(followed[number] / instructions[number], 6),
            "n": replies[number],
            "ci95": scored["ci95"],
        }
    return {"per_turn": per_turn}


def score_model(transcripts: Sequence[Transcript]) -> dict[str, Any]:
    """Every score of one model's transcripts, as one JSON-serialisable dict.

    Checks and gate are the headline, the same scores from the checks alone are under `checks_only`; the per-turn
    scores are those of the dialogues with the instruction in turn one (and none), `per_kind` those of every kind,
    by turns since its event.

    Args:
        transcripts: One model's judged transcripts.

    Returns:
        `adherence_scores`' scores, `checks_only`, `per_kind`, the benchmarks' metrics (BENCHMARK_CHECKS, where
        their checks score replies), `answer_gate`, `attention_on_instruction`, `attention_on_instruction_max_head`,
        `stop_reasons` (reason -> count) and `dialogues` (the count).
    """
    first = first_turn(transcripts)
    return {
        **adherence_scores(first, "passed"),
        "checks_only": adherence_scores(first, "checks_passed"),
        "per_kind": per_kind(transcripts),
        # IFEval's and IFBench's own metrics beside the gated adherence, where their checks score the replies
        **{name: metrics for name in BENCHMARK_CHECKS if (metrics := benchmark_metrics(first, name))},
        "answer_gate": answer_gate(transcripts),
        "attention_on_instruction": attention_per_turn(first),
        "attention_on_instruction_max_head": attention_max_head(attention_per_head(first)),
        "stop_reasons": dict(Counter(t["stop_reason"] for t in transcripts)),
        "dialogues": len(transcripts),
    }


def paired_difference(
    a: Sequence[Transcript], b: Sequence[Transcript], strata: Sequence[str] = TRAIN, key: Key = "passed"
) -> dict[str, dict[str, Any]]:
    """Per turn, the mean of (a passed) - (b passed) over the dialogues both scored there, with its 95% interval.

    The same dialogues are rolled out with every model, so the difference is paired: its interval (normal
    approximation, sample variance of the per-dialogue differences) is narrower than two independent rates'
    where the models fail the same dialogues.

    Args:
        a: One model's judged transcripts.
        b: Another model's judged transcripts of the same dialogues (matched by "id").
        strata: The strata to compare (default TRAIN).
        key: What counts as adherent: "passed" (checks and the answer gate, the default) or "checks_passed" (the
            checks alone).

    Returns:
        Turn number (a string) -> `{"difference": mean, "n": dialogues, "ci95": [lo, hi]}`, the interval clipped to
        [-1, 1], rounded to 6 decimals; turns no dialogue of both scored are left out.
    """
    b_passed = {
        (t["id"], turn["turn"]): bool(turn[key])
        for t in _select(b, strata)
        for turn in t["turns"]
        if turn[key] is not None
    }
    diffs: dict[int, list[int]] = {}
    for t in _select(a, strata):
        for turn in t["turns"]:
            if turn[key] is not None and (t["id"], turn["turn"]) in b_passed:
                diffs.setdefault(turn["turn"], []).append(int(bool(turn[key])) - int(b_passed[t["id"], turn["turn"]]))
    out = {}
    for number in sorted(diffs):
        values = diffs[number]
        n, mean = len(values), sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
        half = Z95 * sd / math.sqrt(n)
        lo, hi = max(-1.0, mean - half), min(1.0, mean + half)  # a difference of two rates lies in [-1, 1]
        out[str(number)] = {"difference": round(mean, 6), "n": n, "ci95": [round(lo, 6), round(hi, 6)]}
    return out


def paired_differences(
    by_model: Mapping[str, Sequence[Transcript]], baselines: Sequence[str] = (), strata: Sequence[str] = TRAIN
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every model A's per-turn paired difference against each baseline B, where the two share scored dialogues.

    The baselines are a model given NAME+repeat (NAME) and its NAME+repeat column, then the models named in
    `baselines` (one fine-tune against another). A model that is a baseline itself is paired only against those
    named before it.

    Args:
        by_model: Each model's transcripts (as `build_report` groups them).
        baselines: Models every model is also compared against (default none).
        strata: The strata to compare (default TRAIN: trained values).

    Returns:
        `{"A - B": paired_difference(A, B)}`, pairs without shared scored dialogues left out.
    """
    reminded = [m for m in by_model if m.endswith(REPEAT_SUFFIX)]
    upper = [b for m in reminded for b in (m.removesuffix(REPEAT_SUFFIX), m) if b in by_model]
    others = [m for m in by_model if m not in upper and REPEAT_SUFFIX not in m and SPLIT_SUFFIX not in m]
    against = list(dict.fromkeys(upper + [b for b in baselines if b in by_model]))
    # a model that is a baseline itself is paired only against those named before it (r2 - r1, not r1 - r2 too)
    earlier = {a: against[: against.index(a)] if a in against else against for a in others}
    pairs = {f"{a} - {b}": paired_difference(by_model[a], by_model[b], strata) for a in others for b in earlier[a]}
    return {pair: per_turn for pair, per_turn in pairs.items() if per_turn}  # pairs that share scored dialogues


def followable(report: dict[str, Any], transcripts: Sequence[Transcript]) -> dict[str, Any] | None:
    """Which families the model can follow when reminded, and each model's per-turn adherence on them.

    The families are those of the first NAME+repeat model's per-family adherence >= FOLLOWABLE; each model is
    scored on those families' train constraints: GAtt is judged there; a family the reminded model cannot follow is
    beyond the model, not a GAtt failure.

    Args:
        report: The report so far: model name -> `score_model` scores.
        transcripts: Every model's judged transcripts, each with its "model".

    Returns:
        `{"reference": NAME+repeat, "threshold": FOLLOWABLE, "families": [...], "beyond_the_model": {family:
        adherence}, "per_turn": {model: per-turn adherence}}`; None without an upper bound in the report.
    """
    reference = next((m for m in report if m.endswith(REPEAT_SUFFIX)), None)
    if reference is None:
        return None
    overall = {f: v["overall"]["adherence"] for f, v in report[reference]["per_family"].items()}
    families = sorted(f for f, a in overall.items() if a >= FOLLOWABLE)
    kept = [t for t in transcripts if t["constraint"] is not None and t["constraint"]["family"] in families]
    models = list(dict.fromkeys(t["model"] for t in transcripts))
    return {
        "reference": reference,
        "threshold": FOLLOWABLE,
        "families": families,
        "beyond_the_model": {f: a for f, a in sorted(overall.items()) if a < FOLLOWABLE},
        "per_turn": {m: adherence_per_turn([t for t in kept if t["model"] == m], TRAIN) for m in models},
    }
