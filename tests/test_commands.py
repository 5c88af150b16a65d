"""The installed commands (`[project.scripts]`: gatt-data, gatt-train, gatt-eval, gatt-demo) print their help from any
folder, and the forms they replace (`python -m data_gen`, `python recipes/train_gatt.py`, `python -m gatt.eval.evaluate`,
`python recipes/demo.py`) still do."""

import importlib
import os
import sys
import tomllib
from pathlib import Path

import pytest

from gatt.io import processes
from gatt.io.cli import command_name

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENTRY_POINTS = {
    "gatt-data": "data_gen.__main__:main",
    "gatt-train": "recipes.train_gatt:main",
    "gatt-eval": "gatt.eval.evaluate:cli",
    "gatt-demo": "recipes.demo:cli",
}
# What each command's help must say: its name in the usage line, and what a user runs it for.
INSTALLED_HELP = {
    "gatt-data": ["usage: gatt-data", "base", "gatt", "replay", "pass-rate", "eval-set", "gatt-data gatt --teacher"],
    "gatt-train": [
        "usage: gatt-train",
        "--resume",
        "--max-steps",
        "accelerate launch -m recipes.train_gatt --config",
        f"accelerate launch {ROOT / 'recipes' / 'train_gatt.py'} --config",
    ],
    "gatt-eval": ["usage: gatt-eval", "--model NAME=DIR", "--repeat-instruction", "example: gatt-eval --model"],
    "gatt-demo": ["usage: gatt-demo", "--config", "data.gatt", "gatt-demo --config recipes/configs/demo.yaml"],
}
# The forms the installed commands replace, run from the checkout's root: each still prints its help.
OLD_FORMS = {
    "python -m data_gen": (["-m", "data_gen"], ["usage: python -m data_gen", "replay", "eval-set"]),
    "python recipes/train_gatt.py": (["recipes/train_gatt.py"], ["usage: train_gatt.py", "--resume"]),
    "python -m gatt.eval.evaluate": (
        ["-m", "gatt.eval.evaluate"],
        ["usage: python -m gatt.eval.evaluate", "--model NAME=DIR"],
    ),
    "python recipes/demo.py": (["recipes/demo.py"], ["usage: demo.py", "data.gatt"]),
}


def help_text(command: list[str], log: Path, cwd: Path) -> str:
    """`COMMAND --help`'s output, in a process without PYTHONPATH (the packages come from the installation)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = processes.run([*command, "--help"], log, timeout_s=300, env=env, cwd=cwd)
    assert result.returncode == 0, result.output[-3000:]
    return result.output


def test_pyproject_installs_the_four_commands() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == ENTRY_POINTS
    for name, target in scripts.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target
        assert (BIN / name).is_file(), f"{BIN / name}: not installed (make install)"


@pytest.mark.parametrize("name", list(INSTALLED_HELP))
def test_an_installed_command_prints_its_help_from_any_folder(name: str, tmp_path: Path) -> None:
    output = help_text([str(BIN / name)], tmp_path / "help.log", cwd=tmp_path)
    missing = [text for text in INSTALLED_HELP[name] if text not in output]
    assert not missing, f"{name} --help lacks {missing}:\n{output}"


@pytest.mark.parametrize("name", list(OLD_FORMS))
def test_the_old_form_of_a_command_still_prints_its_help(name: str, tmp_path: Path) -> None:
    argv, expected = OLD_FORMS[name]
    output = help_text([sys.executable, *argv], tmp_path / "help.log", cwd=ROOT)
    missing = [text for text in expected if text not in output]
    assert not missing, f"{name} --help lacks {missing}:\n{output}"


def test_a_usage_line_names_the_command_as_it_was_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(BIN / "gatt-data"), "--help"])
    assert command_name("python -m data_gen") == "gatt-data"
    monkeypatch.setattr(sys, "argv", [str(ROOT / "data_gen" / "__main__.py"), "--help"])
    assert command_name("python -m data_gen") == "python -m data_gen"
