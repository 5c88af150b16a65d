"""recipes/split_softmax_sweep.py: one evaluation, a four-model report per strength, and the sweep summary."""

import json

from test_eval_rollout import eval_inputs, model, model_dir, run_cli, tokenizer  # noqa: E402,F401  (fixtures)

from gatt.eval.report import NOT_MODELS  # noqa: E402
from recipes import split_softmax_sweep


def test_sweep_writes_a_report_per_strength_and_reuses_the_evaluation(model_dir, eval_inputs, tmp_path, capsys):
    like = run_cli(model_dir, eval_inputs, tmp_path / "like", "--no-attention")
    like_path = tmp_path / "like" / "report.json"
    argv = [
        "--base",
        str(model_dir),
        "--gatt",
        str(model_dir),
        "--like",
        str(like_path),
        "--strengths",
        "0.8",
        "0.4",
        "--out",
        str(tmp_path / "out"),
        "--work",
        str(tmp_path / "work"),
    ]
    summary = split_softmax_sweep.main(argv)
    assert summary["strengths"] == [0.4, 0.8]
    assert list(summary["models"]) == ["base", "base+repeat", "gatt", "base+split@0.4", "base+split@0.8"]
    combined = json.loads((tmp_path / "work" / "all" / "report.json").read_text())
    for strength in ("0.4", "0.8"):
        folder = tmp_path / "out" / f"strength-{strength}"
        assert sorted(p.name for p in folder.iterdir()) == sorted(split_softmax_sweep.COMMITTED)
        report = json.loads((folder / "report.json").read_text())
        assert [k for k in report if k not in NOT_MODELS] == ["base", "base+repeat", "base+split", "gatt"]
        assert report["settings"]["split_softmax"] == {"base": [float(strength)]}
        assert report["base+split"]["per_turn"] == combined[f"base+split@{strength}"]["per_turn"]
        # the sweep keeps the --like report's dialogues: base's scores are the same
        assert report["base"]["per_turn"] == like["base"]["per_turn"]
    row = summary["models"]["base+split@0.8"]
    assert set(row["train"]) == {"2", "10", "20"} and row["with_instruction"]["n"] > 0
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 0 and "base+split@0.4" in (
        tmp_path / "out" / "sweep.md"
    ).read_text()
    capsys.readouterr()
    split_softmax_sweep.main(argv)  # the same command: the evaluation is reused, not run again
    assert "reused" in capsys.readouterr().err
