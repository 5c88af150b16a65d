"""The benchmark runner: its JSON contract, its errors, and the benchmarks page's table generated from the committed results."""

import json
import re
import sys
import types
from pathlib import Path

import pytest

from gatt.io import processes

ROOT = Path(__file__).resolve().parents[1]

import bench_attention  # noqa: E402
import run as runner  # noqa: E402

CONTRACT = [
    "train_vs_trl",
    "one_pass_vs_expand",
    "attention_vs_sdpa",
    "attention_memory_vs_eager",
    "linformer_memory_vs_full",
    "rollout_vs_hf_generate",
    "rollout_vs_hf_generate_batched",
    "teacher_vs_hf_generate",
    "teacher_vs_hf_generate_batched",
    "grpo_completions_vs_trl_generate",
    "smollm2_rollout_tokens_per_s",
    "smollm2_report_scorer_share",
    "smollm2_rollout_vs_hf_generate",
    "smollm2_teacher_vs_hf_generate",
    "smollm2_rollout_vs_hf_generate_batched",
    "smollm2_teacher_vs_hf_generate_batched",
]


def test_runner_names_every_contract_key_once() -> None:
    assert list(runner.BENCHMARKS) == CONTRACT


def test_attention_benchmarks_write_results_with_their_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_attention, "LENGTH", 256)  # the same code at a length a test can afford
    out = tmp_path / "bench.json"
    runner.main(["--quick", "--only", "attention_vs_sdpa", "attention_memory_vs_eager", "--json", str(out)])
    payload = json.loads(out.read_text())
    assert {"machine", "attention_vs_sdpa", "attention_memory_vs_eager"} <= set(payload)
    assert payload["machine"]["fp32_matmul_gflops"] > 0 and payload["machine"]["cores"] >= 1
    speed, memory = payload["attention_vs_sdpa"], payload["attention_memory_vs_eager"]
    assert speed["ratio"] == pytest.approx(speed["ours"] / speed["theirs"], rel=1e-3)
    # eager materialises the (B, H, T, T) weights (and their gradient); ours holds O(T) per head
    weights_mib = 4 * 8 * 256 * 256 * 4 / 2**20
    assert memory["theirs"] - memory["ours"] >= weights_mib
    assert memory["ratio"] == pytest.approx(memory["theirs"] / memory["ours"], rel=1e-3)
    assert not list(tmp_path.glob(".*.tmp"))


def test_each_finished_module_is_saved_before_the_next_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed at a time budget (make gpu-check's benchmark stage) keeps the rows of the modules it finished,
    merged into the file's earlier rows."""
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"machine": {"cpu": "earlier"}, "quick": False, "seconds": {}, "kept": {"ratio": 2.0}}))
    finished, killed = types.ModuleType("bench_finished"), types.ModuleType("bench_killed")
    finished.run = lambda quick, device: {"row_a": {"ratio": 1.5}}

    def stuck(quick: bool, device: str) -> dict:
        raise KeyboardInterrupt  # the stage's budget ran out in this module

    killed.run = stuck
    monkeypatch.setitem(sys.modules, "bench_finished", finished)
    monkeypatch.setitem(sys.modules, "bench_killed", killed)
    monkeypatch.setattr(runner, "BENCHMARKS", {"row_a": "bench_finished", "row_b": "bench_killed"})
    with pytest.raises(KeyboardInterrupt):
        runner.main(["--quick", "--only", "row_a", "row_b", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["kept"] == {"ratio": 2.0} and saved["machine"] == {"cpu": "earlier"}
    assert saved["row_a"]["ratio"] == 1.5 and saved["row_a"]["quick"] is True
    assert "row_b" not in saved and set(saved["seconds"]) == {"bench_finished"}


def test_bad_benchmark_key_is_one_error_line(tmp_path) -> None:
    command = [sys.executable, "benchmarks/run.py", "--only", "nope"]
    result = processes.run(command, tmp_path / "run.log", timeout_s=300, cwd=ROOT, split_errors=True)
    assert result.returncode == 1
    assert result.errors.strip().splitlines()[-1].startswith("error: --only: unknown benchmark(s) nope")
    assert "Traceback" not in result.errors


def test_docs_table_is_the_committed_results(tmp_path) -> None:
    """The benchmarks page's table is `run.py --markdown` of results/benchmarks.json, byte for byte."""
    command = [sys.executable, "benchmarks/run.py", "--markdown"]
    result = processes.run(command, tmp_path / "run.log", timeout_s=300, cwd=ROOT, split_errors=True)
    assert result.returncode == 0, result.errors
    table = result.output
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    block = re.search(
        r"<!-- benchmarks: python benchmarks/run.py --markdown -->\n(.*?)<!-- /benchmarks -->", page, re.S
    )
    assert block is not None, "docs/benchmarks.md lacks the generated benchmark table"
    assert block.group(1) == table


def test_the_calibration_benchmark_converts_a_job_by_both_readings() -> None:
    """benchmarks/bench_calibration.py: one job's timings.json -> its time at the reference by the work reading and by
    the matmul reading; the spread of two machines is largest / smallest."""
    import bench_calibration

    from gatt.io.machine import REFERENCE_GFLOPS, REFERENCE_WORK_SECONDS

    timings = {
        "total_seconds": 400.0,
        "machine": {"cpu": "AMD EPYC", "threads": 2, "work_seconds": 2 * REFERENCE_WORK_SECONDS},
    }
    timings["machine"]["fp32_matmul_gflops"] = 2 * REFERENCE_GFLOPS
    entry = bench_calibration.row(timings, "recipes/configs/demo.yaml")
    assert entry["at_reference_by_work"] == 200.0 and entry["at_reference_by_matmul"] == 800.0
    assert entry["cores"] == 2 and entry["wall_seconds"] == 400.0
    other = {**entry, "at_reference_by_work": 220.0, "at_reference_by_matmul": 400.0}
    assert bench_calibration.spread([entry, other], "at_reference_by_work") == 1.1
    assert bench_calibration.spread([entry, other], "at_reference_by_matmul") == 2.0
