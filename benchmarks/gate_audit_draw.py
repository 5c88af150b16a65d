"""Draw replies for a reader to label, from a `gatt.eval.evaluate` run: the gate audit's sample.

Re-plans the run's dialogues (same constraints, user turns, seed and sizes) to recover each turn's
on-topic checks, then draws up to `--per-cell` replies from every (family, expected language, gate
outcome) cell, outcome being passed or the first failed reason, so the sample holds failed and passed
replies of every family and language. Rows are written in `benchmarks/data/gate_labelled.jsonl`'s form
with `label` and `why` empty, the gate's verdict left out (the reader labels blind), and each earlier
turn as [user, reply, on-topic checks]; `bench_gate.py` judges them again.

  python -m gatt.eval.evaluate --model base=runs/smollm2/base/final --repeat-instruction base \\
      --constraints recipes/data/smollm2_constraints.yaml --turns 8 --dialogues 64 \\
      --no-instruction-dialogues 0 --probe-every 0 --repetition-penalty 1.2 --seed 7 --out runs/audit/gen
  python benchmarks/gate_audit_draw.py runs/audit/gen --constraints recipes/data/smollm2_constraints.yaml \\
      --turns 8 --dialogues 64 --seed 7 --out runs/audit/unlabelled.jsonl

The third audit (docs/gate.md) draws `--blind`: per (constraint, language, model), so that no verdict decides the
sample.

The second audit (messages without topic words, docs/gate.md) draws from reports on your own `--user-turns`
(`--probe-every` as the run had it) and adds `--records N` replies of GAtt data (`--records-file`, the
`data_gen gatt` output the reports' model was trained on: every one of them passed the gate).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gatt.eval.inputs import load_eval_constraints, load_eval_turns
from gatt.eval.plan import EvalDialogue, plan_dialogues
from gatt.io.files import write_text

SOURCES = {
    "base": "SmolLM2-135M-Instruct, greedy (repetition penalty 1.2), instruction in the system message only",
    "base+repeat": "SmolLM2-135M-Instruct, greedy (repetition penalty 1.2), instruction appended to every user turn",
}


def expected_language(family: str, value: str, checks: Sequence[dict[str, Any]]) -> str:
    """The language a reply to a constraint should be in: the language family's value, the language a `language`
    check asks for (a constraint of your own), else English."""
    if family == "language":
        return value
    codes = [check["code"] for check in checks if check["type"] == "language"]
    if not codes:
        return "English"
    import lingua

    return lingua.Language.from_iso_code_639_1(getattr(lingua.IsoCode639_1, codes[0].upper())).name.title()


def dialogue_language(dialogue: EvalDialogue) -> str:
    """The language an evaluation dialogue's replies should be in (English without a constraint)."""
    constraint = dialogue.constraint
    if constraint is None:
        return "English"
    return expected_language(constraint.family, constraint.value, [check.to_dict() for check in constraint.checks])


def record_language(record: dict[str, Any]) -> str:
    """The language a GAtt record's replies should be in (of its first constraint that asks for one)."""
    languages = [
        expected_language(constraint.get("family", ""), constraint.get("value", ""), constraint.get("checks", []))
        for constraint in record.get("constraints", [])
    ]
    return next((language for language in languages if language != "English"), "English")


def outcome(turn: dict[str, Any]) -> str:
    gate = turn["gate"]
    return "passed" if gate["passed"] else gate["failed"][0]


def candidate_rows(
    transcripts: list[dict[str, Any]], dialogues: list[EvalDialogue], prefix: str = "", blind: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """(cell, row) for every chat reply of the transcripts; a cell is the family, the expected language and the gate's
    outcome, or (`blind`) the constraint's name, the language and the model: a draw that no verdict decides."""
    by_id = {d.id: d for d in dialogues}
    rows = []
    for transcript in (t for t in transcripts if t["id"] in by_id):
        dialogue = by_id[transcript["id"]]
        earlier: list[list[str]] = []
        for number, (turn, planned) in enumerate(zip(transcript["turns"], dialogue.turns), start=1):
            if not turn.get("user", planned.user).startswith(planned.user):  # NAME+repeat appends the instruction
                raise ValueError(
                    f"{transcript['model']} {dialogue.id} turn {number}: the re-planned message is not the run's; "
                    "give the run's --constraints, --user-turns, --turns, --dialogues, --seed and --probe-every"
                )
            family = dialogue.constraint.family if dialogue.constraint is not None else "none"
            language = dialogue_language(dialogue)
            row = {
                "id": f"{prefix}{transcript['model']}.{dialogue.id}.{number}",
                "source": SOURCES.get(transcript["model"], transcript["model"]),
                "instruction": dialogue.instruction,
                "family": family,
                "language": language,
                "user": planned.user,
                "reply": turn["reply"],
                "earlier": list(earlier),
                "on_topic": [check.to_dict() for check in planned.on_topic],
                "label": "",
                "why": "",
            }
            earlier.append([planned.user, turn["reply"], row["on_topic"]])
            if planned.kind == "chat":
                if blind:  # per instruction (a constraint of your own has the family `custom`), no verdict
                    name = dialogue.constraint.name if dialogue.constraint is not None else "none"
                    rows.append((f"{name}|{language}|{transcript['model']}", row))
                else:
                    rows.append((f"{family}|{language}|{outcome(turn)}", row))
    return rows


def record_rows(path: Path, n: int, seed: int, prefix: str = "data.") -> list[dict[str, Any]]:
    """`n` replies drawn from GAtt records (`data_gen gatt`'s gatt.jsonl), each with its dialogue's earlier turns
    and the instruction it was sampled with in view (the records keep it apart from the messages)."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    replies = []
    for index, record in enumerate(records):
        messages = [m for m in record["messages"] if m["role"] in ("user", "assistant")]
        earlier: list[list[Any]] = []
        for number in range(0, len(messages) - 1, 2):
            user, reply = messages[number]["content"], messages[number + 1]["content"]
            replies.append(
                {
                    "id": f"{prefix}{index}.{number // 2 + 1}",
                    "source": f"GAtt data ({path.name}): sampled with the instruction in view, best of k",
                    "instruction": record["instruction_short"] if record.get("use_short") else record["instruction"],
                    "family": ",".join(sorted({c.get("family", "custom") for c in record.get("constraints", [])}))
                    or "none",
                    "language": record_language(record),
                    "user": user,
                    "reply": reply,
                    "earlier": list(earlier),
                    "on_topic": [],
                    "label": "",
                    "why": "",
                }
            )
            earlier.append([user, reply, []])
    return random.Random(seed).sample(replies, min(n, len(replies)))


def draw(rows: list[tuple[str, dict[str, Any]]], per_cell: int, seed: int) -> list[dict[str, Any]]:
    cells: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for cell, row in rows:
        cells[cell].append(row)
    rng = random.Random(seed)
    drawn = []
    for cell in sorted(cells):
        drawn += rng.sample(cells[cell], min(per_cell, len(cells[cell])))
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a gatt.eval.evaluate output folder (its transcripts.jsonl)")
    parser.add_argument("--constraints", help="the run's --constraints")
    parser.add_argument("--user-turns", help="the run's --user-turns")
    parser.add_argument("--turns", type=int, required=True, help="the run's --turns")
    parser.add_argument("--dialogues", type=int, required=True, help="the run's --dialogues")
    parser.add_argument("--seed", type=int, required=True, help="the run's --seed")
    parser.add_argument("--short-prob", type=float, default=0.5, help="the run's --short-prob")
    parser.add_argument("--probe-every", type=int, default=0, help="the run's --probe-every")
    parser.add_argument("--per-cell", type=int, default=6, help="replies drawn per (family, language, outcome)")
    parser.add_argument(
        "--blind",
        action="store_true",
        help="cells of (constraint, language, model), no gate outcome: the sample does not depend on any verdict "
        "(the third gate audit)",
    )
    parser.add_argument("--id-prefix", default="", help="prefix of every drawn row's id (a second run's rows)")
    parser.add_argument("--records-file", type=Path, help="GAtt data (gatt.jsonl) to draw --records replies from")
    parser.add_argument("--records", type=int, default=0, help="replies drawn from --records-file")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    dialogues = plan_dialogues(
        load_eval_constraints(args.constraints),
        load_eval_turns(args.user_turns),
        dialogues=args.dialogues,
        turns=args.turns,
        seed=args.seed,
        short_prob=args.short_prob,
        probe_every=args.probe_every,
    )
    lines = (args.run / "transcripts.jsonl").read_text(encoding="utf-8").splitlines()
    transcripts = [json.loads(line) for line in lines if line.strip()]
    drawn = draw(candidate_rows(transcripts, dialogues, args.id_prefix, args.blind), args.per_cell, args.seed)
    if args.records_file is not None:
        drawn += record_rows(args.records_file, args.records, args.seed, prefix=f"{args.id_prefix}data.")
    write_text(args.out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in drawn))
    print(f"wrote {len(drawn)} replies to {args.out}")


if __name__ == "__main__":
    main()
