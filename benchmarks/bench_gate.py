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
uses: `python -m gatt.evaluate --strict-gate`) overall, per family, per language and per reason, the
other gates' for comparison, the disagreements, and a sweep of the relevance threshold.

  python benchmarks/bench_gate.py [--out results/gate_agreement.json]
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from gatt.checks import Check
from gatt.files import write_json
from gatt.gate import AnswerGate, GateConfig, GateItem, GateTurn, RelevanceScorer
from gatt.pretrained import load_smollm2

LABELLED = Path(__file__).parent / "data" / "gate_labelled.jsonl"
# The second audit (issue 44): replies to messages without topic words, of your own, under constraint files of your
# own; reports' replies drawn per gate outcome and GAtt data's replies (ids `data.*`), labelled blind.
OWN = Path(__file__).parent / "data" / "gate_labelled_own.jsonl"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labelled", type=Path, default=LABELLED)
    parser.add_argument("--own", type=Path, default=OWN, help="the second audit's labelled replies (key own_messages)")
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
    judged = {name: AnswerGate(config, scorer).judge(judge_items) for name, (config, judge_items) in gates.items()}
    tabled = {name: tables(rows, verdicts) for name, verdicts in judged.items()}
    result: dict[str, Any] = {
        "labelled": args.labelled.name,
        "gate": "GateConfig.strict() (python -m gatt.evaluate --strict-gate): a near copy is a repeat whatever "
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
        swept = AnswerGate(replace(strict, relevance_sum=threshold), scorer).judge(items)
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
        result["own_messages"] = own_messages_audit(own_rows, AnswerGate(strict, scorer).judge(own_items))
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
    write_json(args.out, result)

    for name, table in tabled.items():
        print(f"{name}: agreement {100 * table['agreement']:.1f}% of {table['n']}; confusion {table['confusion']}")
        for group in ("per_family", "per_language", "per_reason"):
            print("   ", group, {k: (v["agreement"], v["n"]) for k, v in table[group].items()})
    print("relevance_sum sweep (strict):", result["relevance_sum_sweep"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
