"""The gate audit's tools: drawing replies for a reader (from reports and GAtt data) and the second audit's
tables (benchmarks/gate_audit_draw.py, benchmarks/bench_gate.py)."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import bench_gate  # noqa: E402
import gate_audit_draw  # noqa: E402

from gatt.eval.gate import GateConfig, Verdict  # noqa: E402


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


ANSWERS = [True] * 6 + [False] * 6
SIMILARITY = [0.7, 0.6, 0.55, 0.5, 0.45, 0.3] + [0.42, 0.35, 0.3, 0.2, 0.1, 0.0]


def test_the_embedding_threshold_is_the_one_that_agrees_most_with_the_reader():
    verdicts = [Verdict(similarity=s) for s in SIMILARITY]
    assert bench_gate.best_threshold(ANSWERS, verdicts) == 0.44  # between the 0.42 non-answer and the 0.45 answer
    passed = bench_gate.passes(verdicts, 0.44)
    assert passed == [True] * 5 + [False] * 7
    scores = bench_gate.judged_scores(ANSWERS, passed)
    assert scores["agreement"]["k"] == 11 and scores["agreement"]["value"] == round(11 / 12, 4)
    assert scores["pass_precision"]["value"] == 1.0 and scores["pass_recall"]["value"] == round(5 / 6, 4)
    assert scores["pass_precision"]["ci95"][1] == 1.0 and scores["pass_precision"]["ci95"][0] < 1.0  # Wilson
    # a reply failed for another reason stays failed, one the embedding did not judge keeps its verdict
    assert bench_gate.passes([Verdict(("loop",), similarity=0.9), Verdict(), Verdict(("echo",))], 0.2) == [
        False,
        True,
        False,
    ]
    assert bench_gate.judged_scores([False], [False])["pass_precision"] == {"value": None, "ci95": None, "k": 0, "n": 0}


def test_cross_validation_scores_each_reply_with_a_threshold_chosen_without_it():
    verdicts = [Verdict(similarity=s) for s in SIMILARITY * 2]
    answers, groups = ANSWERS * 2, ["builtin"] * 12 + ["own"] * 12
    cv = bench_gate.cross_validated(answers, verdicts, groups, folds=3)
    assert cv["threshold_on_all"] == 0.44 and len(cv["thresholds_per_fold"]) == 3
    assert cv["held_out"]["agreement"]["n"] == 24 and set(cv["held_out_per_set"]) == {"builtin", "own"}
    assert all(0.3 < t <= 0.46 for t in cv["thresholds_per_fold"])  # each fold's, from the replies outside it


def test_the_expected_language_of_a_constraint_of_your_own_is_its_language_checks():
    from types import SimpleNamespace

    from gatt.data.checks import Constraint
    from gatt.data.events import constraint_entry

    def own(checks):
        spec = {"name": "x", "instruction": "Reply in it.", "short": "x", "checks": checks}
        return Constraint.from_dict(spec)

    italian, short = own([{"type": "language", "code": "it"}]), own([{"type": "max_words", "n": 30}])
    assert gate_audit_draw.dialogue_language(SimpleNamespace(constraint=italian)) == "Italian"
    assert gate_audit_draw.dialogue_language(SimpleNamespace(constraint=short)) == "English"
    assert gate_audit_draw.dialogue_language(SimpleNamespace(constraint=None)) == "English"
    # a GAtt record's replies: the language of whichever of its constraints asks for one
    record = {"constraints": [constraint_entry(short), constraint_entry(italian)]}
    assert gate_audit_draw.record_language(record) == "Italian"
    assert gate_audit_draw.record_language({"constraints": [constraint_entry(short)]}) == "English"


def test_each_judge_compared_is_the_strict_gate_with_its_judge_and_its_treatment_of_replies_not_in_english():
    assert bench_gate.judge_config("contrast") == GateConfig.strict().judged_by("contrast")
    assert bench_gate.judge_config("embedding").not_english_judge == "embedding"
    fallback = bench_gate.judge_config("both_fallback")
    assert fallback.relevance_judge == fallback.topic_words_judge == "both" and fallback.not_english_judge == "contrast"
