"""How often the answer gate agrees with a reader, on labelled replies (`benchmarks/data/gate_labelled.jsonl`).

Each line is a reply a reader labelled `answer` (it addresses the user's question, however weakly) or
`not_answer` (empty, a loop, a repeat of an earlier reply, off topic, a refusal, filler or word salad),
with its family and the language it should be in:

- 217 replies of SmolLM2-135M-Instruct (base and reminded, greedy with repetition penalty 1.2) to the
  built-in held-out user turns, which carry topic words, under every family and language of
  recipes/data/smollm2_constraints.yaml, drawn up to 10 per (family, language, gate outcome) cell by
  `benchmarks/gate_audit_draw.py` and labelled blind to the gate (ids `a.*`);
- 96 earlier SmolLM2 replies with an instruction appended to every user turn (greedy and sampled), and
  28 written by hand (good short, foreign-language and persona answers; the opening word alone;
  toy-world answers with on-topic checks).

The gate judges each with the dialogue's earlier turns; relevance is judged both ways a report does: by
the line's on-topic checks, and by the likelihood contrast under SmolLM2 against 3 other questions of
the file (every line, checks dropped). Writes the strict gate's agreement (the one a real model's report
uses: `python -m gatt.eval.evaluate --strict-gate`) overall, per family, per language and per reason, the
other gates' for comparison, the disagreements, and a sweep of the relevance threshold.

`judges`: each relevance judge (`JUDGES`: contrast, embedding, both, and the embedding ones that leave a reply not in
English to the contrast), its threshold cross-validated on the built-in and own-message labels. `fresh_audit`: every
judge at the gate's defaults on the third audit (`--fresh`: 204 replies to 47 new messages, labelled blind by two
readers before any verdict; the readers' agreement beside it).

  python benchmarks/bench_gate.py [--out results/gate_agreement.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from gatt.data.check_types import Check
from gatt.eval.embedding import EMBEDDING_JUDGE, sentence_embedder
from gatt.eval.gate import RELEVANCE_JUDGES, AnswerGate, GateConfig, GateItem, GateTurn, RelevanceScorer, Verdict
from gatt.eval.scoring import wilson_interval
from gatt.io.files import write_json
from gatt.model.pretrained import load_smollm2

LABELLED = Path(__file__).parent / "data" / "gate_labelled.jsonl"
# The second gate audit (docs/gate.md): replies to messages without topic words, of your own, under constraint files
# of your own; reports' replies drawn per gate outcome and GAtt data's replies (ids `data.*`), labelled blind.
OWN = Path(__file__).parent / "data" / "gate_labelled_own.jsonl"
# The third gate audit (docs/gate.md): replies to new messages without topic words, labelled blind before any verdict
FRESH = Path(__file__).parent / "data" / "gate_labelled_fresh.jsonl"
THRESHOLDS = [round(0.2 + 0.02 * i, 2) for i in range(21)]  # the embedding judge's cosine thresholds tried: 0.2-0.6
# the strict gate's relevance judges, and the embedding ones leaving replies not in English to the contrast
JUDGES = (*RELEVANCE_JUDGES, "embedding_fallback", "both_fallback")


def judge_config(name: str) -> GateConfig:
    """The strict gate judging relevance by the judge `name` of JUDGES."""
    judge, _, fallback = name.partition("_")
    return replace(GateConfig.strict().judged_by(judge), not_english_judge="contrast" if fallback else "embedding")


REASONS = (
    "empty",
    "loop",
    "repeat",
    "template",
    "echo",
    "salad",
)  # a reader's `why` naming none of these is off topic (refusal, filler)


def reader_reason(row: dict[str, Any]) -> str:
    """The reader's reason: `answer`, or the first of empty / loop / repeat / off_topic that `why` names."""
    if row["label"] == "answer":
        return "answer"
    why = row["why"]
    named = [(why.find(reason), reason) for reason in REASONS if reason in why]
    return min(named)[1] if named else "off_topic"


def _turn(user: str, reply: str, on_topic: list[dict[str, Any]], where: str, likelihood_only: bool) -> GateTurn:
    checks = () if likelihood_only else tuple(Check.from_dict(c, where) for c in on_topic)
    return GateTurn(user, reply, "chat", checks)


def load_items(
    path: Path, others: int = 3, seed: int = 0, likelihood_only: bool = False
) -> tuple[list[dict[str, Any]], list[GateItem]]:
    """The labelled rows and their gate items; `likelihood_only` drops every on-topic check, so the
    likelihood contrast judges every reply (and no near copy is excused by a topic change)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    questions = sorted({row["user"] for row in rows})
    items = []
    for row in rows:
        where = f"{path.name} {row['id']} on_topic"
        rng = random.Random(f"{seed}-{row['id']}")
        contrast = rng.sample([q for q in questions if q != row["user"]], others)
        earlier = tuple(_turn(e[0], e[1], e[2] if len(e) > 2 else [], where, likelihood_only) for e in row["earlier"])
        items.append(
            GateItem(
                _turn(row["user"], row["reply"], row.get("on_topic", []), where, likelihood_only),
                earlier,
                tuple(contrast),
                row.get("instruction") or "",
            )
        )
    return rows, items


def agreement(rows: list[dict[str, Any]], verdicts: list) -> dict[str, Any]:
    table = {"answer": {"passed": 0, "failed": 0}, "not_answer": {"passed": 0, "failed": 0}}
    for row, verdict in zip(rows, verdicts):
        table[row["label"]]["passed" if verdict.passed else "failed"] += 1
    agree = table["answer"]["passed"] + table["not_answer"]["failed"]
    return {"agreement": round(agree / len(rows), 4), "n": len(rows), "confusion": table}


def breakdown(rows: list[dict[str, Any]], verdicts: list, key) -> dict[str, dict[str, Any]]:
    """{group: {"agreement", "n"}} over the rows grouped by `key(row)`."""
    groups: dict[str, list[bool]] = {}
    for row, verdict in zip(rows, verdicts):
        groups.setdefault(key(row), []).append(verdict.passed == (row["label"] == "answer"))
    return {
        name: {"agreement": round(sum(agree) / len(agree), 4), "n": len(agree)}
        for name, agree in sorted(groups.items())
    }


def tables(rows: list[dict[str, Any]], verdicts: list) -> dict[str, Any]:
    return {
        **agreement(rows, verdicts),
        "per_family": breakdown(rows, verdicts, lambda row: row.get("family", "none")),
        "per_language": breakdown(rows, verdicts, lambda row: row.get("language", "English")),
        "per_reason": breakdown(rows, verdicts, reader_reason),
    }


def gate_outcome(verdict: Any) -> str:
    return "passed" if verdict.passed else verdict.failed[0]


def own_messages_audit(rows: list[dict[str, Any]], verdicts: list) -> dict[str, Any]:
    """The strict gate on replies to messages without topic words: agreement, the share of real answers among the
    replies it passes (overall and in the GAtt data), and the reader's labels per gate outcome."""
    passed = [row["label"] == "answer" for row, v in zip(rows, verdicts) if v.passed]
    data = [row["label"] == "answer" for row in rows if row["id"].split(".")[-3] == "data"]
    outcomes: dict[str, list[bool]] = {}
    for row, verdict in zip(rows, verdicts):
        outcomes.setdefault(gate_outcome(verdict), []).append(row["label"] == "answer")
    return {
        "labelled": OWN.name,
        **tables(rows, verdicts),
        "passed_real_answers": {"share": round(sum(passed) / max(len(passed), 1), 4), "n": len(passed)},
        "gatt_data_real_answers": {"share": round(sum(data) / max(len(data), 1), 4), "n": len(data)},
        "per_gate_outcome": {
            name: {"answers": sum(labels), "n": len(labels)} for name, labels in sorted(outcomes.items())
        },
        "disagreements": [
            {
                "id": row["id"],
                "label": row["label"],
                "why": row["why"],
                "gate": v.to_dict(),
                "reply": row["reply"][:160],
            }
            for row, v in zip(rows, verdicts)
            if v.passed != (row["label"] == "answer")
        ],
    }


def proportion(successes: int, n: int) -> dict[str, Any]:
    """{"value", "ci95" (Wilson), "k", "n"}; an empty set has no value."""
    if n == 0:
        return {"value": None, "ci95": None, "k": 0, "n": 0}
    lo, hi = wilson_interval(successes, n)
    return {"value": round(successes / n, 4), "ci95": [round(lo, 4), round(hi, 4)], "k": successes, "n": n}


def judged_scores(answers: Sequence[bool], passed: Sequence[bool]) -> dict[str, Any]:
    """A judge against the reader: agreement, pass precision (real answers among the replies it passes) and pass
    recall (real answers it passes), each with its Wilson interval."""
    true_passes = sum(a and p for a, p in zip(answers, passed, strict=True))
    return {
        "agreement": proportion(sum(a == p for a, p in zip(answers, passed)), len(answers)),
        "pass_precision": proportion(true_passes, sum(passed)),
        "pass_recall": proportion(true_passes, sum(answers)),
    }


def unthresholded(items: Sequence[GateItem], judge: str, scorer: Any, embedder: Any) -> list[Verdict]:
    """The strict gate judging relevance by `judge`, its embedding threshold at the floor: every other reason is
    decided, and each reply the embedding judges carries its similarity, for `passes` to threshold."""
    config = replace(judge_config(judge), embedding_min=-1.0)
    return AnswerGate(config, scorer, embedder).judge(items)


def passes(verdicts: Sequence[Verdict], threshold: float) -> list[bool]:
    """The gate's verdicts at embedding threshold `threshold` (a reply not judged by embedding keeps its verdict)."""
    return [v.passed and (v.similarity is None or v.similarity >= threshold) for v in verdicts]


def best_threshold(answers: Sequence[bool], verdicts: Sequence[Verdict]) -> float:
    """The threshold of THRESHOLDS with the highest agreement with the reader (the lowest of ties)."""
    agreement = [sum(a == p for a, p in zip(answers, passes(verdicts, t))) for t in THRESHOLDS]
    return THRESHOLDS[agreement.index(max(agreement))]


def cross_validated(answers: list[bool], verdicts: list[Verdict], groups: list[str], folds: int = 5) -> dict[str, Any]:
    """The embedding threshold chosen on 4/5 of the replies and scored on the fifth it did not see, for each fifth
    (folds drawn within each labelled set); the verdicts pooled over the held-out fifths, and the threshold that
    all the replies choose (the gate's default)."""
    fold_of = [0] * len(answers)
    for group in sorted(set(groups)):
        members = [i for i, g in enumerate(groups) if g == group]
        random.Random(f"folds-{group}").shuffle(members)
        for rank, i in enumerate(members):
            fold_of[i] = rank % folds
    held_out = [False] * len(answers)
    chosen = []
    for fold in range(folds):
        train = [i for i in range(len(answers)) if fold_of[i] != fold]
        threshold = best_threshold([answers[i] for i in train], [verdicts[i] for i in train])
        chosen.append(threshold)
        test = [i for i in range(len(answers)) if fold_of[i] == fold]
        for i, passed in zip(test, passes([verdicts[i] for i in test], threshold)):
            held_out[i] = passed
    return {
        "folds": folds,
        "thresholds_per_fold": chosen,
        "held_out": judged_scores(answers, held_out),
        "held_out_per_set": {
            group: judged_scores(
                [a for a, g in zip(answers, groups) if g == group], [p for p, g in zip(held_out, groups) if g == group]
            )
            for group in sorted(set(groups))
        },
        "threshold_on_all": best_threshold(answers, verdicts),
    }


def judges_comparison(
    labelled: dict[str, tuple[list[dict[str, Any]], list[GateItem]]], scorer: Any, embedder: Any
) -> dict[str, Any]:
    """Each relevance judge in the strict gate, on every labelled set: the embedding threshold set by
    cross-validation over the sets together, then each judge's scores per set (the embedding's at the threshold of
    all the replies), per language, and the similarity of answers and non-answers."""
    rows = [row for name in labelled for row in labelled[name][0]]
    groups = [name for name in labelled for _ in labelled[name][0]]
    items = [item for name in labelled for item in labelled[name][1]]
    answers = [row["label"] == "answer" for row in rows]
    out: dict[str, Any] = {"sets": {name: len(labelled[name][0]) for name in labelled}, "thresholds": THRESHOLDS}
    for judge in JUDGES:
        verdicts = unthresholded(items, judge, scorer, embedder)
        entry: dict[str, Any] = {}
        threshold = -1.0
        if judge != "contrast":
            entry["cross_validation"] = cross_validated(answers, verdicts, groups)
            threshold = entry["cross_validation"]["threshold_on_all"]
            entry["embedding_min"] = threshold
        passed = passes(verdicts, threshold)
        entry["per_set"] = {
            name: judged_scores(
                [a for a, g in zip(answers, groups) if g == name], [p for p, g in zip(passed, groups) if g == name]
            )
            for name in labelled
        }
        languages = sorted({row.get("language", "English") for row in rows})
        entry["per_language"] = {
            language: judged_scores(
                [a for a, r in zip(answers, rows) if r.get("language", "English") == language],
                [p for p, r in zip(passed, rows) if r.get("language", "English") == language],
            )["agreement"]
            for language in languages
        }
        out[judge] = entry
    similarity = [v.similarity for v in unthresholded(items, "embedding", None, embedder)]
    out["similarity_quartiles"] = {
        label: [
            round(q, 3)
            for q in statistics.quantiles([s for s, a in zip(similarity, answers) if a == want and s is not None], n=4)
        ]
        for label, want in (("answer", True), ("not_answer", False))
    }
    return out


def fresh_audit(path: Path, scorer: Any, embedder: Any) -> dict[str, Any]:
    """Every relevance judge in the strict gate at its defaults (nothing set on these replies) against a blind
    audit's labels: overall, per source (a report's replies, GAtt data) and on the replies not in English."""
    rows, items = load_items(path)
    answers = [row["label"] == "answer" for row in rows]
    out: dict[str, Any] = {"labelled": path.name, "n": len(rows), "messages": len({row["user"] for row in rows})}
    readers = [row["readers"] for row in rows if "readers" in row]  # two readers' labels; the rest adjudicated
    if readers:
        out["readers_agreement"] = proportion(sum(a == b for a, b in readers), len(readers))
        out["adjudicated"] = sum(bool(row.get("adjudicated")) for row in rows)
    for judge in JUDGES:
        config = judge_config(judge)
        passed = [v.passed for v in AnswerGate(config, scorer, embedder).judge(items)]
        subsets = {
            "all": [True] * len(rows),
            "gatt_data": [row["id"].startswith("data.") for row in rows],
            "report": [not row["id"].startswith("data.") for row in rows],
            "not_english": [row.get("language", "English") != "English" for row in rows],
        }
        out[judge] = {
            name: judged_scores([a for a, m in zip(answers, mask) if m], [p for p, m in zip(passed, mask) if m])
            for name, mask in subsets.items()
            if any(mask)
        }
        out[judge]["embedding_min"] = config.embedding_min if config.uses_embedding else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labelled", type=Path, default=LABELLED)
    parser.add_argument("--own", type=Path, default=OWN, help="the second audit's labelled replies (key own_messages)")
    parser.add_argument(
        "--fresh",
        type=Path,
        default=FRESH if FRESH.exists() else None,
        help="a blind audit's labelled replies, judged by every relevance judge at the gate's defaults (key fresh_audit)",
    )
    parser.add_argument("--out", type=Path, default=Path("results/gate_agreement.json"))
    args = parser.parse_args()

    model, tokenizer = load_smollm2()
    scorer = RelevanceScorer(model, tokenizer)
    strict = GateConfig.strict()
    rows, items = load_items(args.labelled)
    _, likelihood_items = load_items(args.labelled, likelihood_only=True)
    gates = {  # name: (config, the items it judges)
        "strict": (strict, items),
        "default": (GateConfig(), items),
        "likelihood_only": (GateConfig(topic_change_exempts=False), likelihood_items),
        "topic_words_strict_repeats": (GateConfig(topic_change_exempts=False), items),
    }
    embedder = sentence_embedder()
    judged = {
        name: AnswerGate(config, scorer, embedder).judge(judge_items) for name, (config, judge_items) in gates.items()
    }
    tabled = {name: tables(rows, verdicts) for name, verdicts in judged.items()}
    result: dict[str, Any] = {
        "labelled": args.labelled.name,
        "gate": "GateConfig.strict() (python -m gatt.eval.evaluate --strict-gate): a near copy is a repeat whatever "
        "its topic word; on-topic checks and the likelihood contrast under SmolLM2-135M-Instruct both",
        "config": asdict(strict),
        **tabled["strict"],
        "other_gates": {
            "default": "GateConfig(): on-topic checks where a turn has them (near copies with a new topic word "
            "pass), the likelihood contrast only without them",
            "likelihood_only": "every reply judged by the likelihood contrast, on-topic checks dropped",
            "topic_words_strict_repeats": "on-topic checks alone, near copies with a new topic word are repeats",
            **{name: table for name, table in tabled.items() if name != "strict"},
        },
        "heuristics_only": agreement(rows, AnswerGate(GateConfig(topic_change_exempts=False)).judge(likelihood_items)),
        "relevance_sum_sweep": {},
        "disagreements": [],
    }
    for threshold in (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 15.0):
        swept = AnswerGate(replace(strict, relevance_sum=threshold), scorer, embedder).judge(items)
        result["relevance_sum_sweep"][str(threshold)] = agreement(rows, swept)["agreement"]
    for row, verdict in zip(rows, judged["strict"]):
        if verdict.passed != (row["label"] == "answer"):
            result["disagreements"].append(
                {
                    "id": row["id"],
                    "label": row["label"],
                    "why": row["why"],
                    "gate": verdict.to_dict(),
                    "reply": row["reply"][:120],
                }
            )
    if args.own.exists():
        own_rows, own_items = load_items(args.own)
        result["own_messages"] = own_messages_audit(own_rows, AnswerGate(strict, scorer, embedder).judge(own_items))
        own = result["own_messages"]
        print(
            f"own messages: agreement {100 * own['agreement']:.1f}% of {own['n']}; passed replies that are answers "
            f"{100 * own['passed_real_answers']['share']:.1f}% of {own['passed_real_answers']['n']}; GAtt data "
            f"{100 * own['gatt_data_real_answers']['share']:.1f}% of {own['gatt_data_real_answers']['n']}"
        )
        print(
            "    per gate outcome (answers / n):",
            {k: (v["answers"], v["n"]) for k, v in own["per_gate_outcome"].items()},
        )
    by_relevance = {"builtin_messages": load_items(args.labelled, likelihood_only=True)}
    if args.own.exists():
        by_relevance["own_messages"] = load_items(args.own, likelihood_only=True)
    result["judges"] = {
        "gate": "GateConfig.strict() with each relevance judge (--relevance-judge), every reply judged by relevance "
        "(topic words dropped: what a message of the user's own gets)",
        "embedding_judge": EMBEDDING_JUDGE,
        **judges_comparison(by_relevance, scorer, embedder),
    }
    for judge in JUDGES:
        for name, scores in result["judges"][judge]["per_set"].items():
            print(
                f"{judge} on {name}: agreement {scores['agreement']['value']:.1%}, pass precision "
                f"{scores['pass_precision']['value']:.1%}, pass recall {scores['pass_recall']['value']:.1%}"
            )
        if judge != "contrast":
            cv = result["judges"][judge]["cross_validation"]
            print(
                f"    threshold {cv['threshold_on_all']} (folds {cv['thresholds_per_fold']}); held out: agreement "
                f"{cv['held_out']['agreement']['value']:.1%}, precision {cv['held_out']['pass_precision']['value']:.1%}"
            )
    if args.fresh is not None:
        result["fresh_audit"] = fresh_audit(args.fresh, scorer, embedder)
    write_json(args.out, result)

    for name, table in tabled.items():
        print(f"{name}: agreement {100 * table['agreement']:.1f}% of {table['n']}; confusion {table['confusion']}")
        for group in ("per_family", "per_language", "per_reason"):
            print("   ", group, {k: (v["agreement"], v["n"]) for k, v in table[group].items()})
    print("relevance_sum sweep (strict):", result["relevance_sum_sweep"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
