"""Every command line reports bad input the same way: one `error: ...` line naming what is at fault, exit 1, no traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BAD_INPUTS = {
    "evaluate: a missing model": (
        ["-m", "gatt.evaluate", "--model", "a=missing_dir", "--out", "{tmp}/report"],
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
        "--teacher {tmp}: not a model folder ('oracle' is the toy world's responder): it has no config.json, "
        "no model weights (model.safetensors or pytorch_model.bin), no tokenizer files",
    ),
    "evaluate: a model folder with no model": (
        ["-m", "gatt.evaluate", "--model", "a={tmp}", "--out", "{tmp}/report"],
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


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_one_error_line(name: str, tmp_path: Path) -> None:
    argv, expected = BAD_INPUTS[name]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATT_TRACEBACK": ""}
    result = subprocess.run(
        [sys.executable, *(a.format(tmp=tmp_path) for a in argv)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected.format(tmp=tmp_path) in last, result.stderr
    assert not any(p.name.startswith(("report", "data", "smoke")) for p in tmp_path.iterdir())  # nothing written
