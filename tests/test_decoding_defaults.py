"""Decoding defaults as `generate()` has them: a sampler flag not given is read from the model folder's
generation_config.json (data_gen: the teacher's; gatt.eval.evaluate: the first --model's), else the built-in default;
the SmolLM2 export writes the measured repetition penalty into its folder."""

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import gatt.model.pretrained
from data_gen.__main__ import build_parser as data_gen_parser
from data_gen.__main__ import parse as data_gen_parse
from data_gen.teacher import build_teacher, teacher_decoding
from gatt.eval.eval_config import EvalConfig
from gatt.eval.evaluate import build_parser as evaluate_parser
from gatt.eval.evaluate import parse_models, report_decoding
from gatt.io.config import parse_config
from gatt.model.embedded import model_path
from gatt.model.pretrained import SMOLLM2_REPETITION_PENALTY, export_smollm2, write_generation_config
from gatt.model.sampling import BUILT_IN, FLAG_GIVEN, SAMPLER_DEFAULTS


def copy_embedded(folder: Path, repetition_penalty: float | None) -> Path:
    """The shipped model's folder, copied; with `repetition_penalty` set in its generation_config.json."""
    shutil.copytree(model_path("embedded"), folder)
    if repetition_penalty is not None:
        write_generation_config(folder, repetition_penalty)
    else:
        (folder / "generation_config.json").unlink()
    return folder


@pytest.fixture
def penalised(tmp_path) -> Path:
    return copy_embedded(tmp_path / "penalised", 1.3)


@pytest.fixture
def bare(tmp_path) -> Path:
    return copy_embedded(tmp_path / "bare", None)


def data_gen_args(command: str, teacher: str, *flags: str):
    """The command's teacher config, as its command line gives it."""
    extra = ["--num-dialogues", "1"] if command != "pass-rate" else []
    _, configs = data_gen_parse([command, "--teacher", teacher, "--out", "x", *extra, *flags])
    return configs[-1]


@pytest.mark.parametrize("command", ["gatt", "replay", "pass-rate"])
def test_the_teacher_folders_generation_config_sets_a_flag_not_given(command, penalised, bare):
    decoding, sources = teacher_decoding(data_gen_args(command, str(penalised)))
    assert decoding == {**SAMPLER_DEFAULTS, "repetition_penalty": 1.3}
    assert sources["repetition_penalty"] == str(penalised / "generation_config.json")
    assert sources["temperature"] == BUILT_IN  # the file does not set it
    decoding, sources = teacher_decoding(data_gen_args(command, str(penalised), "--repetition-penalty", "1.1"))
    assert (decoding["repetition_penalty"], sources["repetition_penalty"]) == (1.1, FLAG_GIVEN)
    assert teacher_decoding(data_gen_args(command, str(bare)))[0] == SAMPLER_DEFAULTS
    # Names resolve as the teacher does: `embedded` is the shipped folder (no sampler settings in its file).
    assert teacher_decoding(data_gen_args(command, "embedded"))[0] == SAMPLER_DEFAULTS
    assert teacher_decoding(data_gen_args(command, "oracle", "--temperature", "0.5"))[0]["temperature"] == 0.5


def test_the_model_teacher_samples_with_the_resolved_penalty(penalised):
    teacher = build_teacher(data_gen_args("gatt", str(penalised), "--device", "cpu"), [])
    [processor] = teacher.sampler.processors
    assert processor.penalty == 1.3


def evaluate_args(*argv: str):
    args = parse_config(EvalConfig, [*argv, "--out", "x"], evaluate_parser())
    return args, parse_models(args.model)


def test_the_report_decodes_every_model_as_the_first_models_generation_config(penalised, bare, capsys):
    decoding, sources = report_decoding(*evaluate_args("--model", f"base={penalised}", "--model", f"other={bare}"))
    assert decoding == {**SAMPLER_DEFAULTS, "repetition_penalty": 1.3}
    assert sources["repetition_penalty"] == str(penalised / "generation_config.json")
    flagged = evaluate_args("--model", f"base={penalised}", "--repetition-penalty", "1.0")
    assert report_decoding(*flagged)[0]["repetition_penalty"] == 1.0
    # The first model's folder has no file: the built-in defaults for all, and the other model's 1.3 is named.
    decoding, sources = report_decoding(*evaluate_args("--model", f"base={bare}", "--model", f"other={penalised}"))
    assert decoding == SAMPLER_DEFAULTS and set(sources.values()) == {BUILT_IN}
    assert "--model other's generation_config.json sets repetition_penalty 1.3" in capsys.readouterr().err


def test_every_sampler_flags_help_says_where_its_default_comes_from():
    for parser, folder in [
        (data_gen_parser()._subparsers._group_actions[0].choices["gatt"], "the --teacher folder's"),
        (evaluate_parser(), "the first --model's"),
    ]:
        helps = {a.dest: a.help for a in parser._actions if a.dest in SAMPLER_DEFAULTS}
        assert set(helps) == set(SAMPLER_DEFAULTS)
        for key, built_in in SAMPLER_DEFAULTS.items():
            assert helps[key].endswith(f"(default: {folder} generation_config.json, else {built_in})")


def test_the_smollm2_export_writes_the_measured_repetition_penalty(tmp_path, monkeypatch):
    shipped = Path(model_path("embedded"))
    # The export path on a stand-in model (the shipped one): SmolLM2's own load is the slow part, not what is tested.
    stand_in = (AutoModelForCausalLM.from_pretrained(shipped), AutoTokenizer.from_pretrained(shipped))
    monkeypatch.setattr(gatt.model.pretrained, "load_smollm2", lambda: stand_in)
    out = export_smollm2(tmp_path / "smollm2")
    written = json.loads((out / "generation_config.json").read_text())
    before = json.loads((shipped / "generation_config.json").read_text())
    assert written["repetition_penalty"] == SMOLLM2_REPETITION_PENALTY == 1.2
    assert {k: written[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")} == {
        k: before[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
    }  # the other fields kept
    assert not list(tmp_path.glob(".*"))  # written whole, then renamed
    args = data_gen_args("gatt", str(out))
    assert teacher_decoding(args)[0]["repetition_penalty"] == 1.2  # what every command then decodes with
