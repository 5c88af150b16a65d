"""The gate audit's tools: drawing replies for a reader (from reports and GAtt data) and the second audit's
tables (benchmarks/gate_audit_draw.py, benchmarks/bench_gate.py)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gate  # noqa: E402
import gate_audit_draw  # noqa: E402

from gatt.gate import Verdict  # noqa: E402


def test_gatt_data_replies_are_drawn_with_their_earlier_turns_and_the_instruction_in_view(tmp_path):
    record = {
        "messages": [
            {"role": "user", "content": "Why do cats purr?"},
            {"role": "assistant", "content": "Mostly contentment."},
            {"role": "user", "content": "How do I clean a pan?"},
            {"role": "assistant", "content": "Scrub it with salt."},
        ],
        "instruction": "Keep every answer under 30 words.",
        "instruction_short": "Under 30 words",
        "use_short": True,
        "constraints": [{"name": "thirty-words"}],
    }
    path = tmp_path / "gatt.jsonl"
    path.write_text(json.dumps(record) + "\n")
    rows = sorted(gate_audit_draw.record_rows(path, 5, seed=0), key=lambda row: row["id"])
    assert [row["id"] for row in rows] == ["data.0.1", "data.0.2"]
    assert rows[1]["earlier"] == [["Why do cats purr?", "Mostly contentment.", []]]
    assert rows[1]["user"] == "How do I clean a pan?" and rows[1]["reply"] == "Scrub it with salt."
    assert rows[0]["instruction"] == "Under 30 words" and rows[0]["label"] == "" and "gate" not in rows[0]
    assert len(gate_audit_draw.record_rows(path, 1, seed=0)) == 1


def test_the_second_audit_counts_the_readers_answers_per_gate_outcome():
    rows = [
        {"id": "base.e-1.2", "label": "answer", "why": "", "reply": "a"},
        {"id": "base.e-1.3", "label": "not_answer", "why": "template: the opening of turn 2", "reply": "b"},
        {"id": "data.4.1", "label": "answer", "why": "", "reply": "c"},
        {"id": "data.4.2", "label": "not_answer", "why": "echo of the question", "reply": "d"},
        {"id": "gatt.e-2.5", "label": "not_answer", "why": "off topic", "reply": "e"},
    ]
    verdicts = [Verdict(), Verdict(("template",)), Verdict(), Verdict(), Verdict(("echo", "off_topic"))]
    audit = bench_gate.own_messages_audit(rows, verdicts)
    assert audit["agreement"] == 0.8 and audit["n"] == 5
    assert audit["passed_real_answers"] == {"share": round(2 / 3, 4), "n": 3}
    assert audit["gatt_data_real_answers"] == {"share": 0.5, "n": 2}
    assert audit["per_gate_outcome"] == {
        "echo": {"answers": 0, "n": 1},
        "passed": {"answers": 2, "n": 3},
        "template": {"answers": 0, "n": 1},
    }
    assert [d["id"] for d in audit["disagreements"]] == ["data.4.2"]
    assert audit["per_reason"]["echo"] == {"agreement": 0.0, "n": 1}
    assert audit["per_reason"]["template"] == {"agreement": 1.0, "n": 1}
