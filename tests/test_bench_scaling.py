"""benchmarks/bench_scaling.py: every stage runs at 1 and 2 processes on the same work, and the throughputs
it writes are the work over the measured seconds."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from test_data_gen import tiny_teacher_dir

from data_gen.__main__ import main as data_gen_main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_scaling  # noqa: E402


def test_each_stage_runs_at_1_and_2_processes_and_reports_its_throughput(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    demo = tmp_path / "demo"
    model = tiny_teacher_dir(tmp_path)  # a chat model: the teacher, the model fine-tuned and the one evaluated
    data_gen_main(
        ["gatt", "--teacher", "oracle", "--num-dialogues", "16", "--max-turns", "4", "--out", str(tmp_path / "data")]
    )
    (demo / "base").mkdir(parents=True)
    (demo / "base" / "final").symlink_to(model)
    (demo / "round-1" / "gatt").mkdir(parents=True)
    (demo / "round-1" / "gatt" / "final").symlink_to(model)
    config = yaml.safe_load((ROOT / "recipes" / "configs" / "smoke.yaml").read_text())
    config.update(
        model=str(model), model_config=None, tokenizer_vocab_size=0, train_file=str(tmp_path / "data" / "gatt.jsonl")
    )
    (demo / "round-1" / "gatt" / "config.yaml").write_text(yaml.safe_dump(config))

    result = bench_scaling.main(
        [
            "--demo",
            str(demo),
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "work"),
            "--quick",
            "--size",
            "train_steps=2",
        ]
    )
    assert json.loads((tmp_path / "out" / "scaling.json").read_text()) == result
    stages = result["stages"]
    for processes in ("1", "2"):
        synthesis, training, evaluation = (stages[s][processes] for s in ("synthesis", "training", "evaluation"))
        assert synthesis["dialogues"] == 4 * 4  # 2 x 2 shards of 4 dialogues at every process count
        assert synthesis["dialogues_per_s"] == pytest.approx(synthesis["dialogues"] / synthesis["seconds"], rel=0.01)
        assert training["records"] == 2 * config["batch_size"]
        assert evaluation["replies"] == stages["evaluation"]["1"]["replies"] > 0  # the same rollouts (4 batches of 4)
        assert evaluation["replies_per_s"] == pytest.approx(evaluation["replies"] / evaluation["seconds"], rel=0.01)
    # The 2-process runs split the work: synthesis says so, and training logged each step once.
    summary = json.loads((tmp_path / "work" / "synthesis-2" / "gatt.summary.json").read_text())
    assert summary["processes"] == 2 and summary["per_rank"] == [8, 8]
    assert len((tmp_path / "work" / "training-2" / "metrics.jsonl").read_text().splitlines()) == 2
    assert "speed-up" in (tmp_path / "out" / "scaling.md").read_text()
