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

from gatt.data.checks import BENCHMARK_CHECKS
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


def kind_of(transcript: Transcript) -> str:
    """A dialogue's kind (gatt/data/events.py KINDS, or "none" without an instruction); transcripts written before
    kinds existed are `first` or `none`."""
    return transcript.get("kind") or ("none" if transcript["instruction"] is None else "first")


def first_turn(transcripts: Iterable[Transcript]) -> list[Transcript]:
    """The dialogues of the paper's setting: the instruction in turn one and kept (and those without one)."""
    return [t for t in transcripts if kind_of(t) in ("first", "none")]


def per_kind(transcripts: Iterable[Transcript], strata: Sequence[str] = TRAIN) -> dict[str, dict[str, Any]]:
    """Per dialogue kind, over the dialogues whose stratum is in `strata`, by d, the turns since the kind's event
    (d = 0: the turn that gives the instruction, or the change):

    - `after[d]`: replies that obey every instruction in force (its checks; none after a withdrawal) and pass the
      answer gate;
    - `old_followed[d]` (replace, revoke): replies that still follow the replaced or withdrawn instruction, by
      the checks that show it (gatt/data/events.py `following_checks`: language, capitals, an opening or a sign-off on
      every turn; a hobby or a persona on its probes), over the turns where it is checkable."""
    selected = _select(transcripts, strata)
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        group = [t for t in selected if kind_of(t) == kind]
        obeyed: Counter[int] = Counter()
        total: Counter[int] = Counter()
        followed: Counter[int] = Counter()
        judged: Counter[int] = Counter()
        for t in group:
            for turn in t["turns"]:
                d = turn.get("since")
                if d is None:
                    continue
                total[d] += 1
                obeyed[d] += turn["checks_passed"] is not False and bool(turn["gate"]["passed"])
                if turn.get("old_followed") is not None:
                    judged[d] += 1
                    followed[d] += bool(turn["old_followed"])
        if not total:
            continue
        entry: dict[str, Any] = {
            "dialogues": len(group),
            "after": {str(d): rate(obeyed[d], total[d]) for d in sorted(total)},
        }
        if kind in ("replace", "revoke"):
            entry["old_followed"] = {str(d): share(followed[d], judged[d]) for d in sorted(judged)}
        out[kind] = entry
    return out


def share(successes: int, n: int) -> dict[str, Any]:
    """`{"share": successes/n, "n": n, "ci95": [lo, hi]}`: `rate` under the name of a share that should be low."""
    scored = rate(successes, n)
    return {"share": scored["adherence"], "n": n, "ci95": scored["ci95"]}


def tier_stratum(tier: str) -> str:
    """The stratum name that selects one held-out tier's dialogues ("heldout_family:behaviours")."""
    return f"heldout_family:{tier}"


def tiers_of(transcripts: Iterable[Transcript]) -> list[str]:
    """The held-out tiers the transcripts' dialogues carry, in order of appearance."""
    return list(dict.fromkeys(t["tier"] for t in transcripts if t.get("tier")))


def _select(transcripts: Iterable[Transcript], strata: Sequence[str]) -> list[Transcript]:
    """The dialogues of `strata`: a stratum's name, or `tier_stratum(TIER)` for one held-out tier's."""
    return [t for t in transcripts if t["stratum"] in strata or (t.get("tier") and tier_stratum(t["tier"]) in strata)]


def _scored_turns(transcripts: Iterable[Transcript], key: Key = "passed") -> list[dict[str, Any]]:
    return [turn for t in transcripts for turn in t["turns"] if turn[key] is not None]


def adherence_per_turn(
    transcripts: Iterable[Transcript], strata: Sequence[str], key: Key = "passed"
) -> dict[str, dict[str, Any]]:
    """Adherence at each turn ("1", "2", ...) over the dialogues whose stratum is in `strata`."""
    passed: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for turn in _scored_turns(_select(transcripts, strata), key):
        total[turn["turn"]] += 1
        passed[turn["turn"]] += bool(turn[key])
    return {str(k): rate(passed[k], total[k]) for k in sorted(total)}


def per_family(transcripts: Iterable[Transcript], key: Key = "passed") -> dict[str, dict[str, Any]]:
    """Per constraint family: per-turn adherence on train and heldout strata, and one overall rate."""
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
    """Share of dialogues still adherent at each turn, and the mean turn of the first violation."""
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
    """Mean attention share on the instruction per turn, over dialogues with an instruction."""
    values: dict[int, list[float]] = defaultdict(list)
    for t in transcripts:
        if t["instruction"] is None:
            continue
        for turn in t["turns"]:
            if turn.get("attention_on_instruction") is not None:
                values[turn["turn"]].append(turn["attention_on_instruction"])
    return {str(k): round(sum(values[k]) / len(values[k]), 6) for k in sorted(values)}


def attention_per_head(transcripts: Iterable[Transcript]) -> dict[str, list[list[float]]]:
    """Per turn, the (layers, heads) attention shares on the instruction, each averaged over the turn's replies
    in dialogues with an instruction."""
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
    """Per turn, the largest share that any single (layer, head) puts on the instruction (Figure 10's maximum),
    from `attention_per_head`: the head that keeps the instruction, averaged over the turn's replies."""
    return {turn: max(max(row) for row in heads) for turn, heads in per_head.items()}


def no_regression(
    transcripts: Iterable[Transcript], key: Key = "passed", strata: Sequence[str] = ("none",)
) -> dict[str, Any] | None:
    """Over the chat turns of the dialogues without an instruction (or of `strata`): the share of replies on
    the user's topic, and their mean length.

    With the gate (`key="passed"`), on topic means a real answer: the gate's verdict, which judges the
    topic by the turn's on-topic checks or, without them, by likelihood; with the checks alone, the
    turn's on-topic checks (None when no turn has any)."""
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
    """How many replies the gate passed, and the share failed for each reason (a reply may fail several)."""
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
    """The scores that depend on what counts as adherent: per turn and stratum (and held-out tier, where the
    dialogues carry tiers), per family, survival, no regression."""
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
    """IFEval's own metrics, per turn, over the replies that carry checks of type `name` (ifeval, ifbench):
    `prompt_strict`, the share of replies that follow every such instruction in force, `instruction_strict`,
    the share of those instructions followed, each by the benchmark's strict checker and without the answer
    gate; `n` replies (Wilson interval of prompt_strict). None where no reply has such a check."""
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
    """Every score of one model's transcripts, as one JSON-serialisable dict: checks and gate as the headline,
    the same scores from the checks alone under `checks_only`; the per-turn scores are those of the dialogues
    with the instruction in turn one (and none), `per_kind` those of every kind, by turns since its event."""
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
    where the models fail the same dialogues."""
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
    """{"A - B": per-turn paired difference on `strata` (trained values)} for every model A against each baseline B: a model
    given NAME+repeat (NAME) and its NAME+repeat column, then the models named in `baselines` (one fine-tune
    against another), where the two share scored dialogues. `by_model`: each model's transcripts (as
    `build_report` groups them)."""
    reminded = [m for m in by_model if m.endswith(REPEAT_SUFFIX)]
    upper = [b for m in reminded for b in (m.removesuffix(REPEAT_SUFFIX), m) if b in by_model]
    others = [m for m in by_model if m not in upper and REPEAT_SUFFIX not in m and SPLIT_SUFFIX not in m]
    against = list(dict.fromkeys(upper + [b for b in baselines if b in by_model]))
    # a model that is a baseline itself is paired only against those named before it (r2 - r1, not r1 - r2 too)
    earlier = {a: against[: against.index(a)] if a in against else against for a in others}
    pairs = {f"{a} - {b}": paired_difference(by_model[a], by_model[b], strata) for a in others for b in earlier[a]}
    return {pair: per_turn for pair, per_turn in pairs.items() if per_turn}  # pairs that share scored dialogues


def followable(report: dict[str, Any], transcripts: Sequence[Transcript]) -> dict[str, Any] | None:
    """Which families the model can follow when reminded, by the first NAME+repeat model's per-family adherence
    (>= FOLLOWABLE), and each model's per-turn adherence on those families' train constraints: GAtt is judged
    there; a family the reminded model cannot follow is beyond the model, not a GAtt failure. None without
    an upper bound in the report."""
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
