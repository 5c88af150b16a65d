"""The reward-hacking audit of a GRPO run (docs/grpo.md): did RL on the checks teach real answers, or ways past the gate?

From a `make grpo-*` report (its transcripts.jsonl), per model: the answer gate's pass rate on the chat replies of
dialogues with an instruction and of those without, the mean reply length in words, and the on-topic share without
an instruction (replies to built-in messages that pass their topic words). `--draw N` writes N chat replies of
`--model`, drawn at random from dialogues with an instruction, for readers who see the message, the two turns before
it, the instruction and the reply, and neither the reward nor the gate's verdict (benchmarks/data/fresh_audit/
labelling_guide.md); `--labels FILE` (those rows with `label` "answer" or "not_answer") adds how many are real answers and how often the gate agrees with the readers.

  python benchmarks/grpo_audit.py runs/grpo-smollm2/report --draw 40 --model gatt+grpo --out runs/grpo-audit.jsonl
  python benchmarks/grpo_audit.py runs/grpo-smollm2/report --labels results/grpo/smollm2/audit_labels.jsonl \\
      --json results/grpo/smollm2/audit.json
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from gatt.eval.non_answers import words
from gatt.eval.scoring import wilson_interval
from gatt.io.files import write_json, write_text


def chat_turns(transcripts: list[dict[str, Any]]) -> dict[str, dict[str, list[tuple[dict, dict]]]]:
    """model -> "instructed" | "none" -> [(transcript, turn)] of its chat replies."""
    out: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for t in transcripts:
        side = "none" if t["stratum"] == "none" else "instructed"
        out[t["model"]][side] += [(t, turn) for turn in t["turns"] if turn["kind"] == "chat"]
    return out


def share(hits: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(hits, n)
    return {"share": round(hits / n, 4) if n else None, "n": n, "ci95": [round(low, 4), round(high, 4)]}


def model_figures(turns: dict[str, list[tuple[dict, dict]]]) -> dict[str, Any]:
    everything = [turn for side in turns.values() for _, turn in side]
    on_topic = [turn["on_topic"] for _, turn in turns["none"] if turn["on_topic"] is not None]
    return {
        "real_answer_instructed": share(
            sum(turn["gate"]["passed"] for _, turn in turns["instructed"]), len(turns["instructed"])
        ),
        "real_answer_no_instruction": share(
            sum(turn["gate"]["passed"] for _, turn in turns["none"]), len(turns["none"])
        ),
        "on_topic_no_instruction": share(sum(on_topic), len(on_topic)),
        "mean_words": round(sum(len(words(turn["reply"])) for turn in everything) / len(everything), 2),
    }


def draw(turns: list[tuple[dict, dict]], n: int, seed: int) -> list[dict[str, Any]]:
    """`n` replies for blind readers: the instruction, the message, the two turns before it, the reply; no reward, no
    verdict."""
    rows = []
    for transcript, turn in random.Random(seed).sample(turns, min(n, len(turns))):
        before = [t for t in transcript["turns"] if t["turn"] < turn["turn"]][-2:]
        rows.append(
            {
                "id": f"{transcript['id']}-t{turn['turn']}",
                "instruction": transcript["instruction"],
                "earlier": [[t["user"], t["reply"]] for t in before],
                "user": turn["user"],
                "reply": turn["reply"],
                "label": "",
                "why": "",
            }
        )
    return rows


def labelled(rows: list[dict[str, Any]], turns: list[tuple[dict, dict]]) -> dict[str, Any]:
    """The readers' real-answer count, and the gate's agreement with them on the same replies."""
    verdicts = {f"{t['id']}-t{turn['turn']}": turn["gate"]["passed"] for t, turn in turns}
    bad = [row["id"] for row in rows if row.get("label") not in ("answer", "not_answer") or row["id"] not in verdicts]
    if bad:
        raise ValueError(
            f"labels: rows without an 'answer'/'not_answer' label or not in the report: {', '.join(bad[:5])}"
        )
    answers = [row["label"] == "answer" for row in rows]
    agree = [verdicts[row["id"]] == answer for row, answer in zip(rows, answers, strict=True)]
    passed = [answer for row, answer in zip(rows, answers, strict=True) if verdicts[row["id"]]]
    return {
        "replies": len(rows),
        "real_answers": share(sum(answers), len(answers)),
        "gate_agreement": share(sum(agree), len(agree)),
        "gate_pass_precision": share(sum(passed), len(passed)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="a gatt.eval.evaluate output folder (its transcripts.jsonl)")
    parser.add_argument("--model", default="gatt+grpo", help="the model whose replies are drawn or labelled")
    parser.add_argument("--draw", type=int, default=0, help="write this many of --model's replies for blind readers")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed")
    parser.add_argument("--out", type=Path, help="where --draw writes its rows (JSONL)")
    parser.add_argument("--labels", type=Path, help="the drawn rows, labelled: adds the readers' figures")
    parser.add_argument("--json", type=Path, help="write the audit here")
    args = parser.parse_args(argv)
    transcripts = [json.loads(line) for line in (args.report / "transcripts.jsonl").read_text().splitlines() if line]
    turns = chat_turns(transcripts)
    if args.model not in turns:
        parser.error(f"--model {args.model!r} is not in {args.report}: {', '.join(turns)}")
    audit: dict[str, Any] = {"models": {name: model_figures(sides) for name, sides in turns.items()}}
    if args.draw:
        if args.out is None:
            parser.error("--draw needs --out")
        rows = draw(turns[args.model]["instructed"], args.draw, args.seed)
        write_text(args.out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    if args.labels:
        rows = [json.loads(line) for line in args.labels.read_text().splitlines() if line]
        audit["readers"] = {"model": args.model, **labelled(rows, turns[args.model]["instructed"])}
    if args.json:
        write_json(args.json, audit)
    print(json.dumps(audit, indent=2))
    return audit


if __name__ == "__main__":
    main()
