"""The main job's wiring (recipes/demo.py) on a tiny variant: every stage runs, the report has every model and turn."""

import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
from accelerate.state import AcceleratorState, GradientState  # noqa: E402

import data_gen.__main__  # noqa: E402
import gatt.eval.evaluate  # noqa: E402
import gatt.model.pretrained  # noqa: E402
import recipes.stages  # noqa: E402
from data_gen.constraints import HELDOUT_FAMILIES  # noqa: E402
from gatt.data.checks import load_constraints  # noqa: E402
from gatt.data.events import KINDS  # noqa: E402
from gatt.eval.scoring import rate  # noqa: E402
from gatt.io.machine import REFERENCE_WORK_SECONDS  # noqa: E402
from gatt.io.processes import TreeTimeout, running  # noqa: E402
from gatt.model.embedded import FOLDER as EMBEDDED_FOLDER  # noqa: E402
from gatt.model.embedded import greedy_replies, read_record, ship, weights_sha256  # noqa: E402
from gatt.training.trainer import TrainConfig  # noqa: E402
from recipes import train_gatt  # noqa: E402
from recipes.demo import DemoConfig, load_config, main, stages  # noqa: E402
from recipes.stages import Stage, fingerprint, run_stage  # noqa: E402
from recipes.variety_curve import distinct_values, markdown, pooled  # noqa: E402
from recipes.variety_curve import main as variety_curve  # noqa: E402

# The `main` each stage command runs: `python -m MODULE ARGS` or `python SCRIPT ARGS`.
STAGE_MAINS = {
    "data_gen": lambda args: data_gen.__main__.main(args),
    "gatt.eval.evaluate": lambda args: gatt.eval.evaluate.main(args),
    "gatt.model.pretrained": lambda args: gatt.model.pretrained.main(args),
    str(ROOT / "recipes" / "train_gatt.py"): lambda args: train_gatt.main(),  # reads sys.argv
}


def in_process_stage(command, env, started, key, before, every=0.0, timeout_s=0.0, cwd=None) -> tuple[int, float]:
    """`recipes.stages.run_stage`'s contract (exit code, seconds with `before`, the started stamp), the stage's command run
    by its `main` in this process: a process would spend seconds on imports and on loading the language detector,
    most of each stage of these tiny demos. Stages as processes run in README's demo-smoke command
    (tests/test_readme.py) and the heartbeat test."""
    python, *args = command
    assert python == sys.executable, command
    target, args = (args[1], args[2:]) if args[0] == "-m" else (args[0], args[1:])
    begin = time.perf_counter()
    started.write_text(f"{key} {before}")
    threads, argv, cwd, path = torch.get_num_threads(), sys.argv, os.getcwd(), list(sys.path)
    AcceleratorState._reset_state(reset_partial_state=True)  # each stage is a new process: a new Accelerate state
    GradientState._reset_state()
    try:
        with mock.patch.dict(os.environ, env, clear=True):
            os.chdir(ROOT)
            sys.argv = [target, *args]
            sys.path[:0] = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]  # as at a start
            STAGE_MAINS[target](args)
        returncode = 0
    except SystemExit as exit_:
        returncode = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    finally:
        torch.set_num_threads(threads)
        sys.argv, sys.path[:] = argv, path
        os.chdir(cwd)
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    seconds = round(before + time.perf_counter() - begin, 1)
    started.write_text(f"{key} {seconds}")
    return returncode, seconds


def smoke_config(tmp_path: Path, name: str = "demo_smoke.yaml") -> Path:
    """A demo config with its training stages under plain python (README's demo-smoke command runs them under
    `accelerate launch`)."""
    config = yaml.safe_load((ROOT / "recipes" / "configs" / name).read_text())
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**config, "launcher": "python"}))
    return path


def test_demo_runs_every_stage_then_skips_what_is_done(tmp_path, capsys, monkeypatch):
    """Two GAtt rounds: round 2's teacher is round 1's model, its data carries its round, its student learns from both."""
    monkeypatch.setattr(recipes.stages, "run_stage", in_process_stage)
    config = smoke_config(tmp_path)
    out = tmp_path / "demo"
    demo = ["--config", str(config), f"out={out}", "rounds=2"]
    report = main(demo)
    printed = capsys.readouterr().out
    paired = {"paired", "paired_heldout", "paired_heldout_family"}  # every stratum is rolled out
    assert set(report) == {"settings", "base", "gatt-r1", "gatt-r2", "base+repeat", "followable", *paired, "rounds"}
    for name in ("base", "gatt-r1", "gatt-r2", "base+repeat"):
        assert list(report[name]["per_turn"]) == [str(t) for t in range(1, 7)]
    for path in (
        "data/base/base.jsonl",
        "round-1/data/gatt/gatt.jsonl",
        "round-1/gatt/final/config.json",
        "round-2/data/gatt/gatt.summary.json",
        "round-2/gatt/final/config.json",
        "report/report.json",
        "report/report.md",
        "report/adherence.png",
        "report/attention.png",
    ):
        assert (out / path).stat().st_size > 0, path
    round_1, round_2 = out / "round-1", out / "round-2"
    settings = [
        json.loads((r / "data" / "gatt" / "gatt.shards" / "settings.json").read_text()) for r in (round_1, round_2)
    ]
    assert [s["teacher"] for s in settings] == [str(EMBEDDED_FOLDER), str(round_1 / "gatt" / "final")]
    assert [s["config"]["round"] for s in settings] == [1, 2]
    for r, folder in ((1, round_1), (2, round_2)):
        records = [json.loads(line) for line in (folder / "data" / "gatt" / "gatt.jsonl").read_text().splitlines()]
        assert all(record["meta"]["round"] == r for record in records)
    trained = [yaml.safe_load((r / "gatt" / "config.yaml").read_text()) for r in (round_1, round_2)]
    assert [t["model"] for t in trained] == [str(EMBEDDED_FOLDER)] * 2  # each round's student: from the shipped model
    assert not (out / "base").exists()
    assert trained[0]["train_file"] == str(round_1 / "data" / "gatt" / "gatt.jsonl")
    assert trained[1]["train_file"] == [str(r / "data" / "gatt" / "gatt.jsonl") for r in (round_1, round_2)]
    assert [(r["round"], r["student"]) for r in report["rounds"]] == [(1, "gatt-r1"), (2, "gatt-r2")]
    summaries = [json.loads((r / "data" / "gatt" / "gatt.summary.json").read_text()) for r in (round_1, round_2)]
    for entry, summary in zip(report["rounds"], summaries):
        assert entry["teacher_pass_rate_per_family"] == summary["pass_rate_per_family"]
        assert entry["per_turn"] == report[entry["student"]]["per_turn"]
    assert json.loads((out / "report" / "report.json").read_text())["rounds"] == report["rounds"]
    assert "## GAtt rounds" in (out / "report" / "report.md").read_text()
    timings = json.loads((out / "timings.json").read_text())
    stage_names = ["base-data", "gatt-data", "gatt-model", "gatt-data-2", "gatt-model-2", "report"]
    assert list(timings["stage_seconds"]) == stage_names
    seconds = timings["stage_seconds"]
    assert [e["seconds"] for e in report["rounds"]] == [
        round(seconds[f"gatt-data{s}"] + seconds[f"gatt-model{s}"], 1) for s in ("", "-2")
    ]
    machine = timings["machine"]  # the calibration that makes wall times from two machines comparable
    assert timings["total_seconds_at_reference_speed"] == round(
        sum(seconds.values()) * REFERENCE_WORK_SECONDS / machine["work_seconds"], 1
    )  # converted by the project's own kind of work, the matmul reading beside it
    assert machine["fp32_matmul_gflops"] > 0 and machine["threads"] >= 1 and machine["cpu"] and machine["torch"]
    assert machine["fp32_matmul_gflops"] == max(machine["fp32_matmul_gflops_start_end"])  # the faster of two readings
    assert machine["work_seconds"] == min(machine["work_seconds_start_end"]) > 0
    assert "| Turn | base | base+repeat | gatt-r1 | gatt-r2 |" in printed
    # Same inputs: every stage is skipped. A changed GAtt stage reruns it and what follows, not what precedes.
    main(demo)
    assert capsys.readouterr().out.count("up to date, skipped") == 6
    again = json.loads((out / "timings.json").read_text())  # each stage's time is the one it took when it was made
    assert again["stage_seconds"] == timings["stage_seconds"] and again["made_by_an_earlier_run"] == stage_names
    assert again["machine"] == timings["machine"]  # the calibration of the run that made the stages, not of this one
    # A report-only change reruns the report; its finished columns (their models unchanged) are read, not rolled out.
    rollouts = sorted((out / "report" / "rollouts").glob("*.jsonl"))
    made = {path: path.stat().st_mtime_ns for path in rollouts}
    main([*demo, "eval.relevance_numerics=bf16"])
    printed = capsys.readouterr().out
    assert printed.count("up to date, skipped") == 5 and "[6/6 report] running" in printed
    assert len(rollouts) == 4 and {path: path.stat().st_mtime_ns for path in rollouts} == made
    overrides = ["train.gatt.max_steps=3"]
    main([*demo, *overrides])
    printed = capsys.readouterr().out
    assert printed.count("up to date, skipped") == 2 and "[3/6 gatt-model] running" in printed
    assert "[4/6 gatt-data-2] running" in printed  # round 1's model changed: round 2's teacher did
    assert json.loads((round_2 / "gatt" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
    # A stage made again with the same command gives a new result: the stages after it run again too.
    (out / "stamps" / "gatt-model-2.done").unlink()
    main([*demo, *overrides])
    printed = capsys.readouterr().out
    assert printed.count("up to date, skipped") == 4 and "[6/6 report] running" in printed

    # The variety curve: GAtt-side stages on the same chat model, one value per family, the GAtt model alone.
    def curve(axis: str, k: str, folder: Path) -> list[dict]:
        """One curve over K = k and all (the demo run), read at turn 6."""
        return variety_curve(
            [axis, k, "all", "--turn", "6", "--config", str(config), "--demo-run", str(out), "--out", str(folder)]
        )

    points = curve("--values", "1", tmp_path / "curve")
    variety = tmp_path / "curve" / "1"
    assert [p["values_per_family"] for p in points] == ["1", "all"] and set(points[0]["distinct_values"].values()) == {
        1
    }
    # K = all is the demo run's own GAtt data and model
    assert points[1]["distinct_values"] == distinct_values(out / "round-1" / "data" / "gatt" / "gatt.jsonl")
    assert set(points[0]["held-out values"]) == {"adherence", "n", "ci95"}
    assert json.loads((tmp_path / "curve" / "variety.json").read_text())["points"] == points
    assert (tmp_path / "curve" / "variety.png").stat().st_size > 0
    assert set(json.loads((variety / "report" / "report.json").read_text())) == {
        "settings",
        "gatt",
        "rounds",
    }  # no base+repeat
    assert list(json.loads((variety / "timings.json").read_text())["stage_seconds"]) == [
        "base-data",
        "gatt-data",
        "gatt-model",
        "report",
    ]
    assert yaml.safe_load((variety / "round-1" / "gatt" / "config.yaml").read_text())["model"] == str(EMBEDDED_FOLDER)
    # The families curve: the same stages with the train values of 3 families in the GAtt data.
    families = tmp_path / "families"
    points = curve("--families", "3", families)
    assert [p["trained_families"] for p in points] == ["3", "all"]
    trained = points[0]["distinct_values"]
    assert len(trained) <= 3 and not set(trained) & set(HELDOUT_FAMILIES)  # held-out families never in GAtt data
    assert set(points[1]["held-out families"]) == {"adherence", "n", "ci95"}
    assert json.loads((families / "families.json").read_text())["points"] == points
    assert (families / "families.png").stat().st_size > 0
    assert "\n| 3 (" in (families / "families.md").read_text()
    with pytest.raises(SystemExit):  # one axis at a time
        variety_curve(["--families", "3", "--values", "1"])


def test_a_curve_point_pools_its_seeds_replies_at_every_turn():
    def seed_point(passed_2: int, passed_20: int) -> dict:
        per_turn = {"2": rate(passed_2, 64), "20": rate(passed_20, 64)}
        return {
            "trained_families": "5",
            "distinct_values": {"animal": 3, "hobby": 4},
            "tier: behaviours": per_turn["20"],
            "per_turn": {"tier: behaviours": per_turn},
        }

    point = pooled([seed_point(60, 20), seed_point(62, 0), seed_point(64, 10)])
    assert point["tier: behaviours"] == rate(30, 192)  # turn 20: 20 + 0 + 10 of 3 x 64
    assert point["per_turn"]["tier: behaviours"] == {"2": rate(186, 192), "20": rate(30, 192)}
    assert len(point["seeds"]) == 3 and point["distinct_values"] == {"animal": 3, "hobby": 4}
    text = markdown([point], "families", "20", [0, 1, 2])
    assert "| 5 (2 families, 7 values) | 15.6% [11.2–21.4] (n=192) |" in text
    assert "| 5 | 96.9% [93.4–98.6] (n=192) | 15.6% [11.2–21.4] (n=192) |" in text


def test_base_model_trains_the_chat_model_from_scratch_and_packages_it_with_its_record(tmp_path, monkeypatch):
    """make base-model's wiring (rebuild_base, rounds 0) at toy size: data, tokenizer, training, the base model's
    report and the packaged folder that make ship-base-model puts in the package."""
    monkeypatch.setattr(recipes.stages, "run_stage", in_process_stage)
    out = tmp_path / "base-model"
    report = main(["--config", str(smoke_config(tmp_path)), f"out={out}", "rebuild_base=true", "rounds=0"])
    assert set(report) == {"settings", "base", "base+repeat", "followable", "rounds"} and report["rounds"] == []
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings["stage_seconds"]) == ["base-data", "base-model", "report"]
    packaged = out / "embedded"
    record = read_record(packaged)
    assert record["weights_sha256"] == weights_sha256(packaged) and record["data_seed"] == 0
    assert record["train_config"]["max_steps"] == 12 and record["train_config"]["output_dir"] == str(out / "base")
    assert record["report"]["reminded_pass_rate_per_family"] == {
        f: v["overall"] for f, v in report["base+repeat"]["per_family"].items()
    }
    assert record["report"]["base_per_turn"] == report["base"]["per_turn"]
    assert record["greedy_replies"]["tokens"] == greedy_replies(packaged)
    assert record["parameters"] > 0 and record["machine"]["fp32_matmul_gflops"] > 0
    model_files = [p.name for p in (out / "base" / "final").iterdir()]
    assert sorted(p.name for p in packaged.iterdir()) == sorted([*model_files, "record.json"])
    # Shipped elsewhere (not over the package's own model), it is the packaged folder, byte for byte.
    ship(packaged, into=tmp_path / "shipped")
    assert {p.name: p.read_bytes() for p in (tmp_path / "shipped").iterdir()} == {
        p.name: p.read_bytes() for p in packaged.iterdir()
    }
    # With rebuild_base, make demo's GAtt starts from the model it trained, not from the shipped one.
    plan = {s.name: s for s in stages(DemoConfig(out=str(out), rebuild_base=True))}
    assert list(plan) == ["base-data", "base-model", "gatt-data", "gatt-model", "report"]
    assert plan["gatt-model"].settings["model"] == plan["gatt-data"].settings["teacher"] == str(out / "base" / "final")


def test_a_resumed_stage_counts_the_seconds_of_its_interrupted_attempts(tmp_path):
    """The started stamp records the seconds so far while the stage runs, so a killed attempt's time still counts."""
    started, seen = tmp_path / "gatt-data.started", tmp_path / "seen"
    watch = f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(seen)!r}).write_text(pathlib.Path({str(started)!r}).read_text()); raise SystemExit(3)"
    code, first = run_stage([sys.executable, "-c", watch], dict(os.environ), started, "KEY", before=100.0, every=0.1)
    mid_run = seen.read_text().split()  # what a kill at that moment would have left
    assert code == 3 and mid_run[0] == "KEY" and 100.0 < float(mid_run[1]) <= first  # a heartbeat after the start
    assert started.read_text() == f"KEY {first}" and first >= 100.5
    code, total = run_stage(
        [sys.executable, "-c", "import time; time.sleep(0.2)"], dict(os.environ), started, "KEY", first
    )
    assert code == 0 and total >= first + 0.2 and started.read_text() == f"KEY {total}"


def test_a_stage_past_its_timeout_is_killed_with_every_process_it_started(tmp_path):
    # Like a launcher: the stage starts a rank in a session of its own, which waits forever.
    rank = "import os, subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], env={**os.environ, 'RANK': '0'}, start_new_session=True).wait()"
    with pytest.raises(TreeTimeout, match=r"still running after 1 s, killed: .*rank 0 \(pid") as error:
        run_stage(
            [sys.executable, "-c", rank], dict(os.environ), tmp_path / "s.started", "KEY", 0.0, every=0.2, timeout_s=1
        )
    pids = [int(p) for p in re.findall(r"pid (\d+)", str(error.value))]
    assert len(pids) == 2 and not any(running(pid) for pid in pids)


def test_a_stage_made_by_another_python_is_up_to_date_and_any_other_change_is_not(monkeypatch):
    """Stages carried from another machine (a GPU's run finished here) keep their stamps: the interpreter's path is
    not an input of a stage's result; its arguments and the stage before are."""
    keys = {}
    for python in ("/opt/gpu/venv/bin/python3", "/home/me/.venv/bin/python"):
        monkeypatch.setattr(sys, "executable", python)
        plan = stages(DemoConfig(out="runs/x"))
        keys[python] = [fingerprint(stage, "UP 1", ROOT) for stage in plan]
        assert plan[1].command[0] == python
    assert keys["/opt/gpu/venv/bin/python3"] == keys["/home/me/.venv/bin/python"]
    stage = stages(DemoConfig(out="runs/x"))[1]
    assert fingerprint(stage, "UP 2", ROOT) != keys["/home/me/.venv/bin/python"][1]
    other = Stage(stage.name, [*stage.command, "--seed", "1"], stage.output, stage.resumable)
    assert fingerprint(other, "UP 1", ROOT) != keys["/home/me/.venv/bin/python"][1]
    setting = dataclasses.replace(stage, settings={**stage.settings, "max_turns": 5})  # a setting of its YAML
    assert fingerprint(setting, "UP 1", ROOT) != keys["/home/me/.venv/bin/python"][1]


def test_each_stage_reads_its_section_of_the_demo_config(tmp_path):
    """A setting goes from the demo config to its stage's config as a YAML value, no command-line string between:
    each stage's command parses the file the demo wrote for it into the settings its section gave."""
    smoke, tiny = ROOT / "recipes" / "configs" / "demo_smoke.yaml", ROOT / "recipes" / "configs" / "gatt_tiny.yaml"
    keys = ["data.gatt.max_turns=7", "data.gatt.device=cuda", "eval.device=cpu", "train.gatt.max_steps=9", "seed=3"]
    plan = {s.name: s for s in stages(load_config(smoke, [f"out={tmp_path}", *keys]))}
    for stage in plan.values():
        stage.write_config()
        assert stage.command[-2:] == ["--config", str(tmp_path / "configs" / f"{stage.name}.yaml")]
    _, (synthesis, files, teacher) = data_gen.__main__.parse(["gatt", "--config", str(plan["gatt-data"].config)])
    assert (synthesis.max_turns, synthesis.num_dialogues, synthesis.seed, synthesis.round) == (7, 12, 3, 1)
    assert synthesis.shard_size == teacher.batch_size == 16  # a shard: one teacher batch, unless data.gatt says
    assert (teacher.device, teacher.teacher, files.out) == (
        "cuda",
        str(EMBEDDED_FOLDER),
        tmp_path / "round-1" / "data" / "gatt",
    )
    report = gatt.eval.evaluate.parse_config(gatt.eval.evaluate.EvalConfig, ["--config", str(plan["report"].config)])
    assert (report.device, report.turns, report.seed, report.repeat_instruction) == ("cpu", 6, 3, ["base"])
    assert report.model == [f"base={EMBEDDED_FOLDER}", f"gatt={tmp_path / 'round-1' / 'gatt' / 'final'}"]
    trained = TrainConfig.from_dict(yaml.safe_load(plan["gatt-model"].config.read_text()))
    assert (trained.max_steps, trained.batch_size, trained.seed) == (9, 4, 3)  # the section's, over gatt_tiny.yaml's
    section = yaml.safe_load(smoke.read_text())["train"]["gatt"]
    assert (trained.lora_targets, trained.learning_rate) == (section["lora_targets"], section["learning_rate"])
    recipe = yaml.safe_load((ROOT / "recipes" / "configs" / "demo.yaml").read_text())["train"]["gatt"]
    sizes = {"max_steps"}  # the smoke run's own
    assert {k: v for k, v in recipe.items() if k not in sizes}.items() <= section.items()  # make demo's GAtt recipe
    assert (trained.replay_ratio, trained.warmup_steps) == (
        section["replay_ratio"],
        yaml.safe_load(tiny.read_text())["warmup_steps"],
    )
    assert trained.replay_file == str(tmp_path / "data" / "base" / "base.jsonl")


def test_a_key_of_the_flat_demo_configs_is_refused_naming_its_new_place():
    smoke = ["--config", str(ROOT / "recipes" / "configs" / "demo_smoke.yaml")]
    for old, new in (
        ("gatt_max_turns=5", "gatt_max_turns -> data.gatt.max_turns"),
        ("teacher_batch_size=5", "teacher_batch_size -> data.gatt.batch_size"),
        ("eval_turns=5", "eval_turns -> eval.turns"),
        ("gatt_overrides=[max_steps=3]", "gatt_overrides -> train.gatt (its keys)"),
        ("repetition_penalty=1.2", "repetition_penalty -> data.gatt.repetition_penalty and eval.repetition_penalty"),
    ):
        with pytest.raises(SystemExit, match=f"^error: .*demo_smoke.yaml: keys moved .*{re.escape(new)}"):
            main([*smoke, old])
    for key, error in (
        ("data.gatt.max_turn=5", "data.gatt: unknown key(s) max_turn; the keys are config, strict_gate, "),
        ("data.gatt.teacher=oracle", "data.gatt: unknown key(s) teacher; teacher set by the recipe itself"),
        ("train.gatt.output_dir=x", "train.gatt: unknown key(s) output_dir; output_dir set by the recipe itself"),
        ("data.extra.x=1", "data must be a mapping with the sections base, gatt, replay"),
    ):
        with pytest.raises(SystemExit, match=f"^error: {re.escape(error)}"):
            main([*smoke, key])


def test_rounds_continue_trains_each_round_from_the_last_model_on_its_own_data():
    out = Path("runs/x")
    plan = {stage.name: stage.settings for stage in stages(DemoConfig(out=str(out), rounds=3, rounds_continue=True))}
    for r, previous in ((2, out / "round-1" / "gatt" / "final"), (3, out / "round-2" / "gatt" / "final")):
        assert plan[f"gatt-model-{r}"]["model"] == str(previous)
        assert plan[f"gatt-model-{r}"]["train_file"] == str(out / f"round-{r}" / "data" / "gatt" / "gatt.jsonl")
    assert plan["gatt-model"]["model"] == str(EMBEDDED_FOLDER)  # round 1 starts from the shipped chat model


def test_any_turn_trains_gatt_and_gatt_any_and_reports_every_kind(tmp_path, monkeypatch):
    """make any-turn's wiring: today's GAtt model and one trained on every dialogue kind, from the same chat model;
    the report rolls out every kind with base, base+repeat, gatt and gatt-any."""
    monkeypatch.setattr(recipes.stages, "run_stage", in_process_stage)
    out = tmp_path / "any"
    kinds = "[first, late, replace, revoke, add]"
    argv = ["--config", str(smoke_config(tmp_path)), f"out={out}", "any_turn.data.num_dialogues=10"]
    report = main([*argv, f"eval.kinds={kinds}", "eval.strata=[train]", "eval.dialogues=5"])
    assert {"base", "base+repeat", "gatt", "gatt-any"} <= set(report)
    for name in ("base", "base+repeat", "gatt", "gatt-any"):
        assert set(report[name]["per_kind"]) <= set(KINDS) and "late" in report[name]["per_kind"]
        assert all(
            set(v) == {"adherence", "n", "ci95"} for k in report[name]["per_kind"].values() for v in k["after"].values()
        )
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings["stage_seconds"]) == [
        "base-data",
        "gatt-data",
        "gatt-model",
        "gatt-any-data",
        "gatt-any-model",
        "report",
    ]
    records = [json.loads(line) for line in (out / "any" / "data" / "gatt" / "gatt.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} - {"first"}  # other kinds than the paper's
    trained = yaml.safe_load((out / "any" / "gatt" / "config.yaml").read_text())
    assert trained["model"] == str(EMBEDDED_FOLDER) and trained["train_file"] == str(
        out / "any" / "data" / "gatt" / "gatt.jsonl"
    )
    assert (out / "report" / "kinds.png").stat().st_size > 0
    assert "## Instructions at any turn" in (out / "report" / "report.md").read_text()


def test_demo_refuses_an_unknown_key_naming_it():
    with pytest.raises(SystemExit, match="^error: .*unknown key\\(s\\) gatt_dialgues"):
        main(["--config", str(ROOT / "recipes" / "configs" / "demo_smoke.yaml"), "gatt_dialgues=5"])


USER_CHECKS = "def says_something(reply, n=1):\n    return len(reply.split()) >= n\n"
USER_CONSTRAINTS = {
    "constraints": [
        {
            "name": "gardener",
            "instruction": "You are passionate about gardening.",
            "short": "Passion: gardening",
            "family": "persona",
            "value": "gardening",
            "split": "train",
            "checks": [],
            "probes": [
                {
                    "question": "What are you passionate about?",
                    "checks": [{"type": "python", "function": "smoke_checks:says_something"}],
                }
            ],
        },
        {
            "name": "chatty",
            "instruction": "Answer warmly.",
            "short": "Tone: warm",
            "family": "tone",
            "value": "warm",
            "split": "train",
            "checks": [{"type": "python", "function": "smoke_checks:says_something", "args": {"n": 2}}],
        },
        {
            "name": "french",
            "instruction": "Always answer in French.",
            "short": "Language: French",
            "family": "language",
            "value": "French",
            "split": "heldout",
            "checks": [{"type": "language", "code": "fr"}],
        },
    ]
}
USER_TURNS = [
    "What is the capital of France?",
    "How do bees make honey?",
    "Why is the sky blue?",
    "What do cats like to eat?",
    "How does a bicycle work?",
    "What is rain made of?",
]


def test_smollm2_demo_runs_every_stage_on_a_users_own_files(tmp_path, monkeypatch, smollm2):
    """make demo-smollm2's wiring on the real model: the user's constraints (a probe-only persona, their own python
    checks) and a .txt of their messages reach every stage, and every stage makes its output."""
    monkeypatch.setattr(recipes.stages, "run_stage", in_process_stage)
    monkeypatch.setattr(
        gatt.model.pretrained, "load_smollm2", lambda: smollm2
    )  # the export stage: the suite's one load
    code = tmp_path / "code"
    code.mkdir()
    (code / "smoke_checks.py").write_text(USER_CHECKS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]))
    constraints = tmp_path / "constraints.yaml"
    constraints.write_text(yaml.safe_dump(USER_CONSTRAINTS))
    turns = tmp_path / "turns.txt"
    turns.write_text("\n".join(USER_TURNS) + "\n")
    out = tmp_path / "smollm2"
    report = main(
        [
            "--config",
            str(smoke_config(tmp_path, "demo_smollm2_smoke.yaml")),
            f"out={out}",
            f"constraints={constraints}",
            f"user_turns={turns}",
        ]
    )
    # the user's file has trained values and a held-out family, no held-out value of a trained family
    assert set(report) == {
        "settings",
        "base",
        "gatt",
        "base+repeat",
        "followable",
        "paired",
        "paired_heldout_family",
        "rounds",
    }
    for name in ("base", "gatt", "base+repeat"):
        assert list(report[name]["per_turn"]) == ["1", "2", "3"]
        assert {"checks_only", "answer_gate", "no_regression"} <= set(report[name])
    assert set(report["base"]["per_family"]) <= {"persona", "tone", "language"}
    gate = report["settings"]["answer_gate"]  # eval_strict_gate: the report judged by the strict gate
    assert (
        gate["relevance"].startswith("on-topic checks and likelihood contrast")
        and gate["near_copies_with_a_new_topic_word"] == "repeats"
    )
    for path in (
        "base/final/model.safetensors",
        "round-1/data/gatt/gatt.summary.json",
        "data/replay/replay.jsonl",
        "round-1/gatt/final/model.safetensors",
        "report/report.md",
        "report/adherence.png",
        "report/attention.png",
    ):
        assert (out / path).stat().st_size > 0, path
    assert not (out / "round-1" / "gatt" / "final" / "adapter_config.json").exists()  # LoRA merged into the weights
    replay = [json.loads(line) for line in (out / "data" / "replay" / "replay.jsonl").read_text().splitlines()]
    assert all(r["instruction"] is None and r["messages"][0]["content"] in USER_TURNS for r in replay)
    summary = json.loads((out / "round-1" / "data" / "gatt" / "gatt.summary.json").read_text())
    assert set(summary["pass_rate_per_family"]) <= {"persona", "tone"}  # held-out values never enter GAtt data
    settings = json.loads((out / "round-1" / "data" / "gatt" / "gatt.shards" / "settings.json").read_text())
    assert settings["config"]["strict_gate"] is True  # teacher_strict_gate reached the teacher's gate
    assert settings["config"]["demonstration"] is True  # teacher_demonstration: kept for a resumed run
    assert isinstance(
        json.loads((out / "round-1" / "data" / "gatt" / "gatt.shards" / "demonstrations.json").read_text()), dict
    )
    transcripts = (out / "report" / "transcripts.jsonl").read_text()
    assert any(t in transcripts for t in USER_TURNS)  # the report asked the user's messages
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings["stage_seconds"]) == ["base-model", "gatt-data", "replay-data", "gatt-model", "report"]


def test_a_demo_config_names_a_built_in_instruction_set(tmp_path):
    """`constraints: ifeval,ifbench` with `heldout_families: ['ifbench:*']` reaches the data and report stages as is,
    and the committed SmolLM2 config's constraint file loads (its checks are the benchmarks')."""
    config = DemoConfig(
        out=str(tmp_path),
        base_model="smollm2",
        data={"replay": {"num_dialogues": 4}},
        constraints="ifeval,ifbench",
        heldout_families=["ifbench:*"],
    )
    plan = {s.name: s.settings for s in stages(config)}
    for name in ("gatt-data", "report"):
        assert plan[name]["constraints"] == "ifeval,ifbench" and plan[name]["heldout_families"] == ["ifbench:*"]
    committed = yaml.safe_load((ROOT / "recipes" / "configs" / "smollm2_ifeval.yaml").read_text())
    chosen = load_constraints(ROOT / committed["constraints"])
    assert {c.checks[0].type for c in chosen} == {"ifeval", "ifbench"}
    assert all(c.split == "heldout" for c in chosen if c.checks[0].type == "ifbench")  # never in the GAtt data
