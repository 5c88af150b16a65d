"""The training loop and recipe: config contract, metrics, checkpoints, resume after SIGKILL, 2 processes, LoRA."""

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_gen.__main__ import main as data_gen_main
from gatt.io import processes
from gatt.io.processes import ProcessTree
from gatt.training.trainer import TrainConfig, Trainer, batch_indices, load_config, read_records, train

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "recipes" / "configs" / "smoke.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data")
    data_gen_main(
        ["gatt", "--teacher", "oracle", "--num-dialogues", "64", "--max-turns", "8", "--seed", "0", "--out", str(out)]
    )
    return out / "gatt.jsonl"


def smoke_config(data: Path, out: Path, **overrides) -> TrainConfig:
    return load_config(SMOKE, [f"train_file={data}", f"output_dir={out}", *(f"{k}={v}" for k, v in overrides.items())])


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run_recipe(
    log: Path, *args: str, env: dict | None = None, launcher: list[str] | None = None, rank_logs: Path | None = None
) -> ProcessTree:
    """The recipe as a process tree, its output in `log` (killed whole, naming what was stuck, on a timeout)."""
    command = [*(launcher or [sys.executable]), str(ROOT / "recipes" / "train_gatt.py"), *args]
    return ProcessTree(command, log, env={**os.environ, **(env or {})}, cwd=ROOT, rank_logs=rank_logs)


def finish(tree: ProcessTree, timeout_s: float = 300) -> str:
    """Its output, once it has exited successfully."""
    returncode = tree.wait(timeout_s)
    assert returncode == 0, tree.output()
    return tree.output()


def test_config_refuses_unknown_keys_and_names_them(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(SMOKE.read_text()), "learning_rte": 1e-3, "epochs": 2}))
    with pytest.raises(
        ValueError,
        match=r"bad\.yaml: unknown key\(s\) epochs, learning_rte; valid keys: output_dir, train_file, max_steps, num_epochs",
    ):
        load_config(bad)
    with pytest.raises(ValueError, match="missing required key"):
        TrainConfig.from_dict({"output_dir": "x", "max_steps": 1})
    with pytest.raises(ValueError, match="exactly one of `model`"):
        load_config(SMOKE, ["model=some/dir"])
    with pytest.raises(ValueError, match="key=value"):
        load_config(SMOKE, ["max_steps"])
    config = load_config(SMOKE, ["max_steps=7", "packing=false", "lora_targets=[q_proj]"])
    assert (config.max_steps, config.packing, config.lora_targets) == (7, False, ["q_proj"])
    process = run_recipe(tmp_path / "bad.log", "--config", str(bad))
    assert process.wait(timeout_s=120) != 0 and "unknown key(s) epochs, learning_rte" in process.output()


def test_num_epochs_sizes_the_run_to_the_data_and_past_ten_epochs_it_warns(data, tmp_path, caplog, capsys):
    with pytest.raises(ValueError, match="exactly one of max_steps"):
        smoke_config(data, tmp_path / "both", num_epochs=3)
    with pytest.raises(ValueError, match="exactly one of max_steps"):
        smoke_config(data, tmp_path / "neither", max_steps=0)
    trainer = Trainer(smoke_config(data, tmp_path / "epochs", max_steps=0, num_epochs=3, batch_size=8, eval_every=0))
    records = len(trainer.train_records)
    assert trainer.config.max_steps == -(-3 * records // 8) and trainer.config.num_epochs == 3
    assert f"training on {records} records: {trainer.config.max_steps} steps of 8 records" in capsys.readouterr().out
    assert "memorises" not in caplog.text
    Trainer(smoke_config(data, tmp_path / "long", max_steps=11 * records // 8 + 1, batch_size=8, eval_every=0))
    assert "epochs over" in caplog.text and "memorises its data" in caplog.text


def test_mixed_precision_auto_picks_bf16_only_where_the_machine_has_fast_bf16(data, tmp_path, capsys):
    from accelerate.state import AcceleratorState

    from gatt.model.numerics import bf16_is_fast

    expected = "bf16" if bf16_is_fast("cpu") else "no"
    AcceleratorState._reset_state(True)  # one precision per process: Accelerate keeps the first one it was given
    try:
        trainer = Trainer(smoke_config(data, tmp_path / "auto", mixed_precision="auto", eval_every=0))
        assert trainer.accelerator.mixed_precision == expected
        assert f"mixed_precision: auto -> {expected}" in capsys.readouterr().err
    finally:
        AcceleratorState._reset_state(True)
    with pytest.raises(ValueError, match="mixed_precision must be one of no, bf16, fp16, auto, got 'fp8'"):
        smoke_config(data, tmp_path / "bad", mixed_precision="fp8")


def test_train_file_may_list_several_files_one_of_them_empty_but_not_all(data, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    trainer = Trainer(
        smoke_config(data, tmp_path / "run", train_file=f"[{empty}, {data}, {data}]", eval_every=0, max_length=4096)
    )
    assert len(trainer.train_records) == 2 * len(read_records(data))  # the union, in order, each file's records
    with pytest.raises(ValueError, match=f"train_file: no records in {empty}, {empty}"):
        Trainer(smoke_config(data, tmp_path / "none", train_file=f"[{empty}, {empty}]"))
    with pytest.raises(ValueError, match="train_file must be a path or a non-empty list"):
        smoke_config(data, tmp_path / "x", train_file="[]")
    with pytest.raises(FileNotFoundError, match="train_file: .*missing.jsonl does not exist"):
        Trainer(smoke_config(data, tmp_path / "y", train_file=f"[{data}, {tmp_path / 'missing.jsonl'}]"))


def test_replay_adds_its_share_of_records_from_the_replay_file(data, tmp_path):
    with pytest.raises(ValueError, match="replay needs both"):
        smoke_config(data, tmp_path / "x", replay_ratio=0.5)
    replay = tmp_path / "base.jsonl"
    data_gen_main(["base", "--num-dialogues", "100", "--seed", "0", "--out", str(tmp_path)])
    trainer = Trainer(
        smoke_config(data, tmp_path / "run", replay_file=replay, replay_ratio=0.5, eval_every=0, max_length=4096)
    )
    ids = [r["id"] for r in trainer.train_records]
    gatt_ids = {r["id"] for r in read_records(data)}
    assert len(ids) == len(set(ids)) == len(gatt_ids) + 32  # 64 GAtt dialogues + round(0.5 x 64) replayed
    assert sum(i in gatt_ids for i in ids) == len(gatt_ids)
    assert {i for i in ids if i not in gatt_ids} <= {r["id"] for r in read_records(replay)}
    # At 512 tokens some dialogues cannot fit even with middle turns dropped: they are left out before training,
    # so no process ever draws a micro-batch with nothing to learn from.
    short = Trainer(smoke_config(data, tmp_path / "short", replay_file=replay, replay_ratio=0.5, eval_every=0))
    kept = {r["id"] for r in short.train_records}
    assert kept == {r["id"] for r in trainer.train_records if short.collator.fits(r)} and len(kept) < len(ids)


def test_lr_restarts_return_the_learning_rate_to_its_peak_each_cycle(data, tmp_path):
    def rates(**overrides) -> list[float]:
        scheduler = Trainer(smoke_config(data, tmp_path / f"run{len(overrides)}", eval_every=0, **overrides)).scheduler
        lrs = []
        for _ in range(20):
            lrs.append(scheduler.get_last_lr()[0])
            scheduler.optimizer.step()
            scheduler.step()
        return lrs

    plain, restarted = rates(), rates(lr_restarts=1)  # warmup 2 steps, then 18 steps: one cosine or two of 9
    assert plain[2] == restarted[2] == pytest.approx(3e-3)
    assert plain[10] > 1e-3 and plain[19] >= 3e-4 - 1e-9  # one cosine down to min_lr_ratio (0.1) of the peak
    assert restarted[10] < 1e-4 and restarted[11] == pytest.approx(3e-3) and restarted[19] < 2e-4
    with pytest.raises(ValueError, match="lr_restarts must be >= 0"):
        smoke_config(data, tmp_path / "bad", lr_restarts=-1)


def test_a_rewarmed_run_is_a_run_resumed_on_a_longer_schedule(data, tmp_path):
    """`lr_rewarm_step` + `lr_first_horizon` (make base-model's schedule) = a run stopped at that step and resumed
    with a larger max_steps: same learning rates, same weights."""
    small = {"eval_every": 0, "batch_size": 4, "save_every": 3, "warmup_steps": 1}
    first = smoke_config(data, tmp_path / "resumed", max_steps=6, **small)
    train(first)  # cosine over 6 steps, checkpoint at step 3
    shutil.rmtree(tmp_path / "resumed" / "final")
    resumed = train(smoke_config(data, tmp_path / "resumed", max_steps=9, **small), resume=True)
    rewarmed = train(
        smoke_config(data, tmp_path / "rewarmed", max_steps=9, lr_first_horizon=6, lr_rewarm_step=3, **small)
    )
    assert [m["lr"] for m in read_metrics(tmp_path / "rewarmed")][3:] == pytest.approx(
        [m["lr"] for m in read_metrics(tmp_path / "resumed")][3:]
    )
    assert rewarmed["loss"] == pytest.approx(resumed["loss"], rel=1e-5)
    weights = [
        AutoModelForCausalLM.from_pretrained(tmp_path / run / "final").state_dict() for run in ("resumed", "rewarmed")
    ]
    assert all(torch.allclose(weights[0][k], weights[1][k], atol=1e-6) for k in weights[0])
    with pytest.raises(ValueError, match="lr_rewarm_step <= lr_first_horizon <= max_steps"):
        smoke_config(data, tmp_path / "bad", max_steps=9, lr_first_horizon=12, lr_rewarm_step=3)


def test_batch_order_is_a_function_of_seed_and_step():
    assert batch_indices(10, 4, 0, 2) == batch_indices(10, 4, 0, 2)
    epoch = [i for step in range(5) for i in batch_indices(10, 4, 0, step)][:10]
    assert sorted(epoch) == list(range(10))  # each epoch is a permutation
    assert batch_indices(10, 4, 1, 0) != batch_indices(10, 4, 0, 0)


def test_smoke_recipe_trains_logs_checkpoints_and_saves_a_loadable_model(data, tmp_path):
    start = time.perf_counter()
    last = train(smoke_config(data, tmp_path / "run"))
    assert time.perf_counter() - start < 60  # the smoke config is meant to take well under a minute
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == list(range(1, 21))
    assert all({"step", "loss", "lr", "supervised_tokens"} <= set(m) for m in metrics)
    assert all(m["supervised_tokens"] > 0 for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 1.0  # it learns
    assert "eval_loss" in metrics[9] and "eval_loss" in last
    assert metrics[1]["lr"] == pytest.approx(3e-3) and metrics[-1]["lr"] < metrics[5]["lr"]  # warmup, then cosine decay
    assert (tmp_path / "run" / "checkpoints" / "step-0000010").is_dir()
    assert list((tmp_path / "run" / "gatt").rglob("events.out.tfevents*"))  # TensorBoard
    final = tmp_path / "run" / "final"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(final), AutoTokenizer.from_pretrained(final)
    assert type(model).__name__ == "GattForCausalLM" and tokenizer.chat_template


def test_killed_run_resumes_to_the_same_final_loss(data, tmp_path):
    one_thread = {"OMP_NUM_THREADS": "1"}  # the same reduction order in every run, so losses compare to 1e-5
    args = ["--config", str(SMOKE), f"train_file={data}", "save_every=5"]
    finish(run_recipe(tmp_path / "whole.log", *args, f"output_dir={tmp_path / 'whole'}", env=one_thread))
    args.append(f"output_dir={tmp_path / 'killed'}")
    process = run_recipe(tmp_path / "killed.log", *args, env=one_thread)
    checkpoint = tmp_path / "killed" / "checkpoints" / "step-0000010"
    deadline = time.time() + 120
    while not checkpoint.exists() and time.time() < deadline and process.process.poll() is None:
        time.sleep(0.02)
    process.kill()
    assert checkpoint.exists() and not (tmp_path / "killed" / "final").exists(), "killed after step 10, before the end"
    output = finish(run_recipe(tmp_path / "resumed.log", *args, "--resume", env=one_thread))
    assert "resumed from" in output
    metrics = read_metrics(tmp_path / "killed")
    assert [m["step"] for m in metrics] == list(range(1, 21))  # no step logged twice, none lost
    assert metrics[-1]["loss"] == pytest.approx(read_metrics(tmp_path / "whole")[-1]["loss"], abs=1e-5)


def test_two_processes_follow_the_one_process_trajectory(data, tmp_path):
    args = [
        "--config",
        str(SMOKE),
        f"train_file={data}",
        "max_steps=6",
        "save_every=0",
        "eval_every=0",
        "gradient_accumulation_steps=2",
    ]
    env = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    finish(run_recipe(tmp_path / "one.log", *args, f"output_dir={tmp_path / 'one'}", env=env))
    ranks = tmp_path / "ranks"
    launcher = processes.torchrun(2, ranks, "--standalone")
    finish(
        run_recipe(
            tmp_path / "two.log", *args, f"output_dir={tmp_path / 'two'}", env=env, launcher=launcher, rank_logs=ranks
        )
    )
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["supervised_tokens"] for m in one] == [m["supervised_tokens"] for m in two]
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)


@pytest.fixture(scope="module")
def base_dir(data, tmp_path_factory) -> Path:
    """A small trained model directory to fine-tune."""
    out = tmp_path_factory.mktemp("base")
    train(smoke_config(data, out, max_steps=2, save_every=0, eval_every=0))
    return out / "final"


@pytest.mark.parametrize("merge", [True, False])
def test_lora_fine_tune_saves_a_merged_model_or_an_adapter(data, base_dir, tmp_path, merge):
    config = load_config(
        SMOKE,
        [
            f"train_file={data}",
            f"output_dir={tmp_path}",
            "model_config=null",
            f"model={base_dir}",
            "tokenizer_vocab_size=0",
            "max_steps=3",
            "save_every=0",
            "eval_every=0",
            "lora_r=4",
            f"merge_lora={str(merge).lower()}",
        ],
    )
    train(config)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    if merge:
        tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
        assert not (tmp_path / "final" / "adapter_config.json").exists()
    else:
        from peft import AutoPeftModelForCausalLM

        adapter = json.loads((tmp_path / "final" / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str(base_dir) and adapter["r"] == 4
        tuned = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "final").merge_and_unload()
    tuned_q = tuned.model.layers[0].self_attn.q_proj.weight
    assert not torch.allclose(tuned_q, base.model.layers[0].self_attn.q_proj.weight)  # the adapter moved q_proj
    torch.testing.assert_close(tuned.model.layers[0].mlp.up_proj.weight, base.model.layers[0].mlp.up_proj.weight)


def test_any_hugging_face_causal_lm_directory_trains(data, base_dir, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    llama.save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    config = load_config(
        SMOKE,
        [
            f"train_file={data}",
            f"output_dir={tmp_path / 'out'}",
            "model_config=null",
            f"model={tmp_path / 'llama'}",
            "tokenizer_vocab_size=0",
            "max_steps=3",
            "save_every=0",
            "eval_every=0",
        ],
    )
    train(config)
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final")).__name__ == "LlamaForCausalLM"
    assert len(read_metrics(tmp_path / "out")) == 3


def test_distill_weight_adds_the_hidden_state_distance_to_the_start_model_reading_the_reminded_dialogue(
    data, base_dir, tmp_path
):
    """Step 1's loss is the replies' loss plus distill_weight x the hidden-state distance (gatt/training/distill.py), which is
    nonzero where the student reads the instruction once and the teacher after every user message, and zero where
    there is no instruction to place (both read the same tokens, with the same weights)."""

    def step_one(train_file: Path, out: Path, weight: float, *extra: str) -> dict:
        overrides = [f"train_file={train_file}", f"output_dir={out}", "model_config=null", f"model={base_dir}"]
        overrides += ["tokenizer_vocab_size=0", "max_steps=1", "save_every=0", "eval_every=0", "mode=all", *extra]
        train(load_config(SMOKE, [*overrides, f"distill_weight={weight}"]))
        return read_metrics(out)[0]

    plain, distilled = step_one(data, tmp_path / "plain", 0.0), step_one(data, tmp_path / "distilled", 0.5)
    assert "distill" not in plain and distilled["distill"] > 0.01
    assert distilled["supervised_tokens"] == plain["supervised_tokens"]
    assert distilled["loss"] == pytest.approx(plain["loss"] + 0.5 * distilled["distill"], rel=1e-4)
    # the teacher's views packed into rows as the student's are (smoke.yaml packs) read as one padded row each
    padded = step_one(data, tmp_path / "padded", 0.5, "packing=false")
    assert padded["distill"] == pytest.approx(distilled["distill"], rel=1e-4)
    # padding_free (make demo's): the student's batch in one flat row, the same loss and the same distance
    flat = step_one(data, tmp_path / "flat", 0.5, "padding_free=true")
    assert flat["supervised_tokens"] == distilled["supervised_tokens"]
    assert flat["distill"] == pytest.approx(distilled["distill"], rel=1e-4)
    assert flat["loss"] == pytest.approx(distilled["loss"], rel=1e-4)
    # distill_view=near: the teacher reads each supervised reply one turn after the instruction, a different target
    near = step_one(data, tmp_path / "near", 0.5, "distill_view=near")
    assert near["supervised_tokens"] == plain["supervised_tokens"] and near["distill"] > 0.01
    # (Step 1 on the CPU is deterministic: had the view been ignored, the two distances would be equal to the bit.
    # With this barely trained start model the two targets are close: 2.9e-5 apart, relative, on this data.)
    assert near["distill"] != distilled["distill"]
    assert near["loss"] == pytest.approx(plain["loss"] + 0.5 * near["distill"], rel=1e-4)
    records = [{**r, "instruction": "", "instruction_short": ""} for r in read_records(data)]
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert step_one(bare, tmp_path / "bare", 0.5)["distill"] < 1e-6


def test_distill_weight_needs_a_start_model(data, tmp_path):
    with pytest.raises(ValueError, match="distill_weight must be >= 0 and needs `model`"):
        smoke_config(data, tmp_path, distill_weight=1.0)
