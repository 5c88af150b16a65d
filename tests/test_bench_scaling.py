"""benchmarks/bench_scaling.py: every stage runs at 1 and 2 processes on the same work, and the throughputs
it writes are the work over the measured seconds."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from test_data_gen import tiny_teacher_dir

from data_gen.__main__ import main as data_gen_main
from gatt.io.processes import running

ROOT = Path(__file__).resolve().parents[1]

import bench_scaling  # noqa: E402


def test_each_stage_runs_at_1_and_2_processes_and_reports_its_throughput(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    demo = tmp_path / "demo"
    model = tiny_teacher_dir(tmp_path)  # a chat model: the teacher, the model fine-tuned and the one evaluated
    data_gen_main(
        ["gatt", "--teacher", "oracle", "--num-dialogues", "16", "--max-turns", "4", "--out", str(tmp_path / "data")]
    )
    (demo / "round-1" / "gatt").mkdir(parents=True)
    (demo / "round-1" / "gatt" / "final").symlink_to(model)
    config = yaml.safe_load((ROOT / "recipes" / "configs" / "smoke.yaml").read_text())
    config.update(
        model=str(model), model_config=None, tokenizer_vocab_size=0, train_file=str(tmp_path / "data" / "gatt.jsonl")
    )
    (demo / "round-1" / "gatt" / "config.yaml").write_text(yaml.safe_dump(config))
    # The benchmark's wiring, not the checks: one constraint with a regex check, so that no stage process spends
    # seconds loading the language detector's models (the built-in catalogue has a language family).
    constraints = tmp_path / "any.yaml"
    constraints.write_text(
        "constraints:\n  - {name: anything, instruction: Say anything., short: 'Say: anything', "
        "checks: [{type: regex, pattern: '(?s).*'}]}\n"
    )

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
            "--stage-timeout",
            "600",  # a stage whose processes wait on one another forever fails instead of hanging the suite
            "--stage-args",
            f"--constraints {constraints}",
        ]
    )
    assert json.loads((tmp_path / "out" / "scaling.json").read_text()) == result
    stages = result["stages"]
    for processes in ("1", "2"):
        synthesis, training, evaluation = (stages[s][processes] for s in ("synthesis", "training", "evaluation"))
        assert synthesis["dialogues"] == 4 * 4  # 2 x 2 shards of 4 dialogues at every process count
        # the seconds are recorded to 0.1 s: the rate from them is as exact as that rounding allows
        rounding = 0.05 / synthesis["seconds"]
        assert synthesis["dialogues_per_s"] == pytest.approx(
            synthesis["dialogues"] / synthesis["seconds"], rel=rounding + 0.001
        )
        assert training["records"] == 2 * config["batch_size"]
        assert evaluation["replies"] == stages["evaluation"]["1"]["replies"] > 0  # the same rollouts (4 batches of 4)
        assert evaluation["replies_per_s"] == pytest.approx(evaluation["replies"] / evaluation["seconds"], rel=0.01)
    # The 2-process runs split the work: synthesis says so, and training logged each step once.
    summary = json.loads((tmp_path / "work" / "synthesis-2" / "gatt.summary.json").read_text())
    assert summary["processes"] == 2 and summary["per_rank"] == [8, 8]
    assert len((tmp_path / "work" / "training-2" / "metrics.jsonl").read_text().splitlines()) == 2
    assert "speed-up" in (tmp_path / "out" / "scaling.md").read_text()


def test_a_stage_still_running_at_its_timeout_is_killed_with_its_workers_and_fails(tmp_path):
    # A launcher that starts a worker in a session of its own and waits on it, like torchrun: both must go.
    worker_pid = tmp_path / "worker.pid"
    launcher = (
        "import subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        f"open({str(worker_pid)!r}, 'w').write(str(worker.pid))\n"
        "worker.wait()\n"
    )
    log = tmp_path / "stage.log"
    with pytest.raises(RuntimeError, match=r"(?s)still running after 3 s, killed: .*its output: .*stage\.log"):
        bench_scaling.timed([sys.executable, "-c", launcher], log, timeout_s=3)
    assert not running(int(worker_pid.read_text()))  # gone, or a zombie waiting for its reaper: not sleeping on


def test_a_stage_that_fails_names_its_exit_code_and_log(tmp_path):
    with pytest.raises(RuntimeError, match=r"failed \(exit 3\); see .*stage\.log"):
        bench_scaling.timed([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "stage.log", timeout_s=60)
