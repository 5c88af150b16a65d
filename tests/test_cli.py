"""Every command line reports bad input the same way: one `error: ...` line naming what is at fault, exit 1, no traceback."""

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gatt.io import processes

ROOT = Path(__file__).resolve().parents[1]

BAD_INPUTS = {
    "evaluate: a missing model": (
        ["-m", "gatt.eval.evaluate", "--model", "a=missing_dir", "--out", "{tmp}/report"],
        "--model a=missing_dir: no such model folder",
    ),
    "data_gen gatt: a missing teacher": (
        ["-m", "data_gen", "gatt", "--teacher", "missing_dir", "--num-dialogues", "2", "--out", "{tmp}/data"],
        "--teacher missing_dir: no such model folder",
    ),
    "data_gen gatt: a missing constraints file": (
        [
            "-m",
            "data_gen",
            "gatt",
            "--teacher",
            "oracle",
            "--num-dialogues",
            "2",
            "--constraints",
            "{tmp}/nope.yaml",
            "--out",
            "{tmp}/data",
        ],
        "nope.yaml",
    ),
    "train_gatt: the smoke config before its data": (
        [
            "recipes/train_gatt.py",
            "--config",
            "recipes/configs/smoke.yaml",
            "output_dir={tmp}/smoke",
            "train_file={tmp}/smoke-data/gatt.jsonl",
        ],
        "train_file: {tmp}/smoke-data/gatt.jsonl does not exist; make it first, e.g. "
        "`python -m data_gen gatt --teacher oracle --out {tmp}/smoke-data`",
    ),
    "train_gatt: an unknown key": (
        ["recipes/train_gatt.py", "--config", "recipes/configs/smoke.yaml", "max_stepz=3"],
        "max_stepz",
    ),
    "demo: a missing config": (["recipes/demo.py", "--config", "{tmp}/nope.yaml"], "nope.yaml"),
    # A folder that holds no model: every stage that loads one names the folder and what it lacks, the same way.
    "data_gen gatt: a teacher folder with no model": (
        ["-m", "data_gen", "gatt", "--teacher", "{tmp}", "--num-dialogues", "2", "--out", "{tmp}/data"],
        "--teacher {tmp}: not a model folder ('oracle' is the toy world's responder, 'embedded' the shipped chat model): "
        "it has no config.json, "
        "no model weights (model.safetensors or pytorch_model.bin), no tokenizer files",
    ),
    "evaluate: a model folder with no model": (
        ["-m", "gatt.eval.evaluate", "--model", "a={tmp}", "--out", "{tmp}/report"],
        "--model a={tmp}: not a model folder: it has no config.json, no model weights",
    ),
    "train_gatt: a model folder with no model": (
        [
            "recipes/train_gatt.py",
            "--config",
            "recipes/configs/smoke.yaml",
            "output_dir={tmp}/smoke",
            "model={tmp}",
            "model_config=null",
            "tokenizer_vocab_size=0",
        ],
        "model {tmp}: not a model folder: it has no config.json, no model weights",
    ),
}


def entry_point(argv: list[str]) -> tuple[Callable[[], object], list[str]]:
    """The `main` that `python ARGV` runs, and the sys.argv it sees (a `-m` module's, or a recipe script's)."""
    if argv[0] == "-m":
        module = importlib.import_module(f"{argv[1]}.__main__" if argv[1] == "data_gen" else argv[1])
        return module.main, [argv[1], *argv[2:]]
    assert argv[0].startswith("recipes/"), argv[0]  # a recipe script: a module of the recipes package
    return importlib.import_module(f"recipes.{Path(argv[0]).stem}").main, argv


def exit_message(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """`python ARGV`'s main run in this process from the repository root: the message it exits with (sys.exit(message):
    Python prints it to stderr and exits with status 1). An exception other than SystemExit (a traceback) fails the
    test."""
    main, sys_argv = entry_point(argv)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("GATT_TRACEBACK", "")
    monkeypatch.setattr(sys, "argv", sys_argv)
    with pytest.raises(SystemExit) as exit_:
        main()
    return str(exit_.value.code)


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_one_error_line(name: str, tmp_path: Path, monkeypatch) -> None:
    """Each command's `main`, as `python ARGV` calls it, in this process (a process costs seconds of imports; the
    next test runs whole commands): it exits with the one `error: ...` message, and writes nothing."""
    argv, expected = BAD_INPUTS[name]
    argv = [a.format(tmp=tmp_path) for a in argv]
    message = exit_message(argv, monkeypatch)
    assert message.startswith("error: ") and "\n" not in message, message
    assert expected.format(tmp=tmp_path) in message, message
    assert not any(p.name.startswith(("report", "data", "smoke")) for p in tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("name", ["evaluate: a missing model", "train_gatt: an unknown key"])
def test_a_command_with_bad_input_prints_one_line_and_exits_1(name: str, tmp_path: Path) -> None:
    """Whole commands, as a user runs them: the message is the last line of stderr, the exit status 1."""
    argv, expected = BAD_INPUTS[name]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATT_TRACEBACK": ""}
    command = [sys.executable, *(a.format(tmp=tmp_path) for a in argv)]
    result = processes.run(command, tmp_path / "logs" / "run.log", timeout_s=300, env=env, cwd=ROOT, split_errors=True)
    assert result.returncode == 1, result.errors
    assert "Traceback" not in result.errors
    last = result.errors.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected.format(tmp=tmp_path) in last, result.errors
