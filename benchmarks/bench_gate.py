"""How often the answer gate agrees with a reader, on labelled replies (`benchmarks/data/gate_labelled.jsonl`).

Each line is a reply a reader labelled `answer` (it addresses the user's question, however weakly) or
`not_answer` (empty, a loop, a repeat of an earlier reply, off topic, a refusal or filler): 96 replies
of SmolLM2-135M-Instruct with an instruction appended to every user turn (greedy and sampled), and 28
written by hand (good short, foreign-language and persona answers; the opening word alone; toy-world
answers with on-topic checks). The gate judges each with the dialogue's earlier turns, the line's
on-topic checks where it has them, and otherwise the likelihood contrast under SmolLM2 against 3
other questions of the file. Prints agreement and the confusion table, lists the disagreements, and
sweeps the relevance threshold.

  python benchmarks/bench_gate.py [--out results/gate_agreement.json]
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from gatt.checks import Check
from gatt.gate import AnswerGate, GateConfig, GateItem, GateTurn, RelevanceScorer
from gatt.pretrained import load_smollm2

LABELLED = Path(__file__).parent / "data" / "gate_labelled.jsonl"


def load_items(path: Path, others: int = 3, seed: int = 0) -> tuple[list[dict[str, Any]], list[GateItem]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    questions = sorted({row["user"] for row in rows})
    items = []
    for row in rows:
        on_topic = tuple(Check.from_dict(c, f"{row['id']} on_topic") for c in row.get("on_topic", []))
        rng = random.Random(f"{seed}-{row['id']}")
        contrast = rng.sample([q for q in questions if q != row["user"]], others)
        earlier = tuple(GateTurn(user, reply) for user, reply in row["earlier"])
        items.append(GateItem(GateTurn(row["user"], row["reply"], "chat", on_topic), earlier, tuple(contrast)))
    return rows, items


def agreement(rows: list[dict[str, Any]], verdicts: list) -> dict[str, Any]:
    table = {"answer": {"passed": 0, "failed": 0}, "not_answer": {"passed": 0, "failed": 0}}
    for row, verdict in zip(rows, verdicts):
        table[row["label"]]["passed" if verdict.passed else "failed"] += 1
    agree = table["answer"]["passed"] + table["not_answer"]["failed"]
    return {"agreement": round(agree / len(rows), 4), "n": len(rows), "confusion": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labelled", type=Path, default=LABELLED)
    parser.add_argument("--out", type=Path, default=Path("results/gate_agreement.json"))
    args = parser.parse_args()

    rows, items = load_items(args.labelled)
    model, tokenizer = load_smollm2()
    scorer = RelevanceScorer(model, tokenizer)
    config = GateConfig()
    verdicts = AnswerGate(config, scorer).judge(items)
    without_scorer = AnswerGate(config).judge(items)
    result: dict[str, Any] = {
        "labelled": args.labelled.name,
        "config": vars(config) if hasattr(config, "__dict__") else {},
        "with_relevance_model": agreement(rows, verdicts),
        "heuristics_only": agreement(rows, without_scorer),
        "relevance_sum_sweep": {},
        "disagreements": [],
    }
    for threshold in (0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 15.0):
        swept = AnswerGate(replace(config, relevance_sum=threshold), scorer).judge(items)
        result["relevance_sum_sweep"][str(threshold)] = agreement(rows, swept)["agreement"]
    for row, verdict in zip(rows, verdicts):
        if verdict.passed != (row["label"] == "answer"):
            result["disagreements"].append({"id": row["id"], "label": row["label"], "why": row["why"],
                                            "gate": verdict.to_dict(), "reply": row["reply"][:120]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(args.out)

    for name in ("with_relevance_model", "heuristics_only"):
        r = result[name]
        print(f"{name}: agreement {100 * r['agreement']:.1f}% of {r['n']}; confusion {r['confusion']}")
    print("relevance_sum sweep:", result["relevance_sum_sweep"])
    for d in result["disagreements"]:
        print(f"  {d['id']} reader={d['label']} ({d['why']}) gate={d['gate']} | {d['reply']!r}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
