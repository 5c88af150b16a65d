"""Training at scale: FSDP2 and DeepSpeed Accelerate configs, and gradient accumulation equal to a larger batch.

Tolerances. Every run is fp32 with one OpenMP thread. Runs that should agree differ only in the order in
which float32 sums are taken (rows packed differently, gradients all-reduced or reduce-scattered across
processes instead of summed in one): ~1e-7 relative per sum. Measured here: losses within 1e-6 over the
steps compared, gradients within 3e-8, final weights within 1e-7. The tolerance is 1e-5, ten times the
largest of those, and a wrong normalisation (mean of per-micro-batch means) misses it by far (asserted
below: > 1e-4 on the loss and on the gradients).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from data_gen.__main__ import main as data_gen_main
from gatt.data.collator import IGNORE_INDEX
from gatt.io import processes
from gatt.training.trainer import TrainConfig, Trainer, load_config

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "recipes" / "configs" / "smoke.yaml"
RECIPE = ROOT / "recipes" / "train_gatt.py"
ACCELERATE_CONFIGS = ROOT / "recipes" / "accelerate"
CPU_ONE_THREAD = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
TOLERANCE = 1e-5

# Accelerate 1.15 never selects FSDP on CPU: with ACCELERATE_USE_CPU=1 and the FSDP config, `accelerate launch`
# starts the processes with ACCELERATE_USE_FSDP=true, but AcceleratorState turns FSDP on only for GPU-like
# distributed types, so it runs DDP (MULTI_CPU) without a word. torch's FSDP2 itself runs on CPU with gloo, so
# this wrapper puts Accelerate back on the FSDP plugin the launcher configured (from the FSDP_* variables), then
# runs the recipe unchanged. It prints what Accelerate had chosen.
FORCE_FSDP_ON_CPU = """
import runpy, sys
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
import gatt.training.trainer


class FSDPOnCPU(Accelerator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.is_main_process:
            print(f"accelerate chose {self.distributed_type.value}", flush=True)
        if self.distributed_type != DistributedType.FSDP:
            # AcceleratorState() copies PartialState's fields on every call: set both.
            self.state.distributed_type = PartialState().distributed_type = DistributedType.FSDP
            self.state.fsdp_plugin = FullyShardedDataParallelPlugin()


gatt.training.trainer.Accelerator = FSDPOnCPU
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data")
    data_gen_main(
        ["gatt", "--teacher", "oracle", "--num-dialogues", "64", "--max-turns", "8", "--seed", "0", "--out", str(out)]
    )
    return out / "gatt.jsonl"


def recipe_args(data: Path, out: Path, **overrides: object) -> list[str]:
    """The smoke recipe's command-line arguments: 4 steps, no eval, `key=value` overrides."""
    values = {"train_file": data, "output_dir": out, "max_steps": 4, "save_every": 0, "eval_every": 0, **overrides}
    return [str(RECIPE), "--config", str(SMOKE), *(f"{k}={v}" for k, v in values.items())]


def run(command: list[str], log: Path, env: dict[str, str] = CPU_ONE_THREAD, rank_logs: Path | None = None) -> str:
    """Run to completion on CPU with one thread per process, as a process tree (killed whole on a timeout, naming the
    stuck rank); its output (failing the test with it if it fails)."""
    done = processes.run(command, log, timeout_s=300, env={**os.environ, **env}, cwd=ROOT, rank_logs=rank_logs)
    assert done.returncode == 0, done.output
    return done.output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_same_trajectory(one: Path, other: Path) -> None:
    a, b = read_metrics(one), read_metrics(other)
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3, 4]
    assert [m["supervised_tokens"] for m in a] == [m["supervised_tokens"] for m in b]  # the same records each step
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], abs=TOLERANCE), (x, y)


def assert_same_weights(one: Path, other: Path) -> None:
    a, b = (
        AutoModelForCausalLM.from_pretrained(one).state_dict(),
        AutoModelForCausalLM.from_pretrained(other).state_dict(),
    )
    assert a.keys() == b.keys()
    diffs = {k: float((a[k] - b[k]).abs().max()) for k in a}
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory) -> Path:
    """The reference run: one process, no accumulation (the whole batch of 8 in one micro-batch)."""
    out = tmp_path_factory.mktemp("one")
    run([sys.executable, *recipe_args(data, out, gradient_accumulation_steps=1)], out / "run.log")
    return out


# -- FSDP -----------------------------------------------------------------------------------------


def test_fsdp_config_parses_to_fsdp2_full_shard_wrapping_either_decoder_layer(monkeypatch):
    """The config as `accelerate launch` reads it: the FSDP_* variables it exports, and the plugin they build."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import CPUOffloadPolicy, StateDictType
    from transformers import LlamaConfig, LlamaForCausalLM

    from gatt.model.modeling import GattConfig, GattForCausalLM

    args = launch_command_parser().parse_args(
        ["--config_file", str(ACCELERATE_CONFIGS / "fsdp.yaml"), "--num_processes", "2", str(RECIPE)]
    )
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    for key, value in env.items():
        if key.startswith("FSDP_"):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True  # FSDP2's full shard
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT and not isinstance(
        plugin.cpu_offload, CPUOffloadPolicy
    )
    # No class named: both models' `_no_split_modules` decide, so one file serves the library's model and HF Llama.
    sizes = {
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    for model, layer in [
        (GattForCausalLM(GattConfig(**sizes)), "GattDecoderLayer"),
        (LlamaForCausalLM(LlamaConfig(**sizes)), "LlamaDecoderLayer"),
    ]:
        wrap = fsdp2_prepare_auto_wrap_policy(plugin, model)
        assert [type(m).__name__ for m in model.modules() if wrap(m)] == [layer, layer]


def test_fsdp2_on_two_cpu_processes_follows_the_one_process_trajectory_and_saves_the_full_model(
    data, one_process, tmp_path
):
    driver = tmp_path / "force_fsdp_on_cpu.py"
    driver.write_text(FORCE_FSDP_ON_CPU)
    out = tmp_path / "fsdp"
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ACCELERATE_CONFIGS / "fsdp.yaml"),
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
    ]
    output = run(
        [*launcher, str(driver), *recipe_args(data, out, gradient_accumulation_steps=2, save_every=2)],
        tmp_path / "run.log",
    )
    # What the config alone gets on CPU: MULTI_CPU (DDP) with accelerate 1.15, see FORCE_FSDP_ON_CPU; a later
    # Accelerate that picks FSDP itself leaves the wrapper nothing to do.
    assert "accelerate chose MULTI_CPU" in output or "accelerate chose FSDP" in output
    # It really sharded: the step-2 checkpoint is a SHARDED_STATE_DICT, one file per process.
    shards = sorted(p.name for p in (out / "checkpoints" / "step-0000002" / "pytorch_model_fsdp_0").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    assert_same_trajectory(one_process, out)
    # save_final gathered the shards: a plain from_pretrained directory with the one-process run's weights.
    assert_same_weights(one_process / "final", out / "final")


# -- DeepSpeed (documented only: deepspeed is not installed) --------------------------------------


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_configs_name_their_zero_stage_and_agree_with_the_trainer(stage):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    config = load_config_from_file(str(ACCELERATE_CONFIGS / f"deepspeed_zero{stage}.yaml"))
    assert isinstance(config, ClusterConfig) and config.distributed_type == DistributedType.DEEPSPEED
    ds = config.deepspeed_config
    assert ds["zero_stage"] == stage
    # DeepSpeed divides the loss by its own accumulation count in backward(): it must not accumulate on top of
    # the trainer (which divides by the global supervised-token count and is held to 1 micro-batch under DeepSpeed).
    assert ds["gradient_accumulation_steps"] == 1
    # DeepSpeed clips inside its step (the trainer's clip_grad_norm_ only reads the norm): the trainer's default.
    assert ds["gradient_clipping"] == TrainConfig.max_grad_norm == 1.0
    plugin = DeepSpeedPlugin(**ds)  # the plugin Accelerate builds from these keys (no deepspeed import needed)
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == stage
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 1
    # No dataloader is prepared, so the micro-batch size stays "auto" and the trainer fills it in.
    assert plugin.is_auto("train_micro_batch_size_per_gpu")
    # ZeRO-3 shards the weights: output_dir/final needs them gathered (Accelerator.get_state_dict).
    assert plugin.deepspeed_config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] == (stage == 3)


# -- gradient accumulation -------------------------------------------------------------------------


def first_step(trainer: Trainer) -> tuple[dict[str, float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Step 0's metrics, gradients (kept: zero_grad disabled) and updated parameters."""
    trainer.optimizer.zero_grad = lambda set_to_none=True: None
    metrics = trainer.train_step(0)
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()}
    return metrics, grads, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.fixture
def fresh_accelerate(monkeypatch):
    """In-process Trainers in fp32 on a fresh Accelerate state: its singletons (and ACCELERATE_* variables) outlive the
    test that set them, and a mixed precision left by an earlier test in the suite gave bf16 gradients here (1.8e-4 off)."""
    from accelerate.state import AcceleratorState, GradientState

    for name in [name for name in os.environ if name.startswith("ACCELERATE_")]:
        monkeypatch.delenv(name)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_gradient_accumulation_equals_the_larger_batch(data, tmp_path, fresh_accelerate):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:

        def trainer(steps: int) -> Trainer:
            # max_grad_norm out of reach: the gradients compared are the raw ones.
            return Trainer(
                load_config(
                    SMOKE,
                    [
                        f"train_file={data}",
                        f"output_dir={tmp_path / str(steps)}",
                        "eval_every=0",
                        "save_every=0",
                        "batch_size=8",
                        f"gradient_accumulation_steps={steps}",
                        "max_grad_norm=1.0e9",
                    ],
                )
            )

        whole, accumulated, naive = trainer(1), trainer(4), trainer(4)
        metrics_1, grads_1, params_1 = first_step(whole)
        metrics_4, grads_4, params_4 = first_step(accumulated)
        assert metrics_4["supervised_tokens"] == metrics_1["supervised_tokens"]
        assert metrics_4["loss"] == pytest.approx(metrics_1["loss"], abs=TOLERANCE)
        assert max_diff(grads_1, grads_4) <= TOLERANCE
        assert max_diff(params_1, params_4) <= TOLERANCE

        # The test can fail: the 4 micro-batches hold different numbers of supervised tokens, so the naive
        # normalisation (each micro-batch's own token mean, averaged over the 4) is another loss and gradient.
        batches = naive._micro_batches(0)
        tokens = [int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches]
        assert len(set(tokens)) > 1, tokens
        naive.model.train()
        naive_loss = 0.0
        for batch in batches:
            loss = naive.model(**batch, use_cache=False, **naive.loss_kwargs).loss / len(batches)
            loss.backward()
            naive_loss += float(loss.detach())
        naive_grads = {n: p.grad for n, p in naive.model.named_parameters()}
        assert abs(naive_loss - metrics_1["loss"]) > 1e-4
        assert max_diff(grads_1, naive_grads) > 1e-4
    finally:
        torch.set_num_threads(threads)


def test_two_processes_accumulating_4_follow_one_process_without_accumulation(data, one_process, tmp_path):
    """DDP across 2 processes, 4 micro-batches of 1 record each per process, against 1 process with 1 micro-batch of 8.

    Plain torchrun, without ACCELERATE_USE_CPU: on a machine with no GPU the trainer still joins the processes
    into one job (Accelerate alone would see no backend and let each process train the whole batch)."""
    out, ranks = tmp_path / "two", tmp_path / "ranks"
    launcher = processes.torchrun(2, ranks, "--master_port", free_port())
    command = [*launcher, *recipe_args(data, out, gradient_accumulation_steps=4)]
    run(command, tmp_path / "run.log", env={"OMP_NUM_THREADS": "1"}, rank_logs=ranks)
    assert_same_trajectory(one_process, out)
