"""gatt/io/config.py: a stage's dataclass is its command line and its YAML config, each default written once; and
every gatt.eval.evaluate command the recipes, the README, the docs and the Makefile write parses into EvalConfig."""

import re
import shlex
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import yaml

from data_gen.__main__ import build_parser as data_gen_parser
from data_gen.__main__ import parse as data_gen_parse
from data_gen.synthesis import SynthesisConfig
from data_gen.teacher import TeacherConfig
from gatt.eval.eval_config import EvalConfig
from gatt.eval.evaluate import build_parser
from gatt.io.config import REQUIRED, arg, config_parser, dataclass_from_dict, parse_config
from gatt.training.grpo import GRPOGattConfig
from gatt.training.trainer import TrainConfig

ROOT = Path(__file__).parents[1]


@dataclass
class Toy:
    out: Path = arg(REQUIRED, "output folder")
    turns: int = arg(24, "turns per dialogue")
    rate: float | None = arg(None, "a rate (default: the model's)")
    names: list[str] = arg([], "names, repeatable", action="append", metavar="NAME")
    families: list[str] = arg(["a", "b"], "families", nargs="*")
    sample: bool = arg(False, "sample")
    mode: str = arg("fast", "how", choices=["fast", "exact"])


def test_each_field_is_a_flag_with_its_default_in_the_help() -> None:
    text = config_parser(Toy).format_help()
    for flag in ("--out", "--turns", "--rate", "--names", "--families", "--sample", "--mode", "--config"):
        assert flag in text
    assert "turns per dialogue (default: 24)" in text and "families (default: a b)" in text
    assert "(default: the model's)" in text and "(default: None)" not in text
    assert "(default: 0)" not in text  # a switch's False is not shown ...
    train = config_parser(TrainConfig).format_help()
    assert "(default: 0)" in train and "clipping norm (default: 1.0)" in train  # ... a number equal to it is


def test_defaults_then_the_file_then_the_command_line(tmp_path: Path) -> None:
    assert parse_config(Toy, ["--out", "x"]) == Toy(out=Path("x"))
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump({"out": "from-file", "turns": 30, "families": [], "mode": "exact"}))
    config = parse_config(Toy, ["--config", str(file), "--turns", "12", "--names", "p", "--names", "q", "--sample"])
    assert config == Toy(out=Path("from-file"), turns=12, names=["p", "q"], families=[], sample=True, mode="exact")
    assert parse_config(Toy, ["--out", "x", "--families"]).families == []  # a list flag given no values
    assert Toy(out=Path("x")).families is not Toy(out=Path("y")).families  # each config its own list


def test_bad_input_names_the_file_key_or_flag(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump({"out": "x", "turn": 3}))
    with pytest.raises(ValueError, match=r"--config .*c\.yaml: unknown key\(s\) turn; the keys are out, turns"):
        parse_config(Toy, ["--config", str(file)])
    with pytest.raises(
        ValueError, match=r"missing required key\(s\) out; give --out on the command line, or out in a --config file"
    ):
        parse_config(Toy, [])
    with pytest.raises(FileNotFoundError, match="config file not found: .*nowhere.yaml"):
        parse_config(Toy, ["--config", str(tmp_path / "nowhere.yaml")])
    with pytest.raises(SystemExit):
        parse_config(Toy, ["--out", "x", "--mode", "slow"])  # argparse refuses a value outside the choices


def test_an_unknown_key_is_reported_where_it_was_given(tmp_path: Path) -> None:
    """A training config's unknown key, in the YAML file or as a key=value override, names the file or the command
    line (an override used to be reported as if the file held it)."""
    from gatt.training.trainer import load_config

    good = ROOT / "recipes" / "configs" / "smoke.yaml"
    with pytest.raises(ValueError, match=r"^the command line: unknown key\(s\) nosuch; valid keys: output_dir"):
        load_config(good, ["max_steps=3", "nosuch=1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text() + "bogus: 1\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: unknown key\(s\) bogus; valid keys"):
        load_config(bad, ["max_steps=3"])
    assert load_config(good, ["max_steps=3"]).max_steps == 3


def test_a_config_files_value_outside_its_fields_choices_is_refused_naming_the_key(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump({"out": "x", "mode": "slow"}))
    with pytest.raises(ValueError, match=r"--config .*c\.yaml: mode must be one of fast, exact, got 'slow'"):
        parse_config(Toy, ["--config", str(file)])
    train = {"model": "embedded", "max_steps": 1, "output_dir": "o", "train_file": "t.jsonl"}
    with pytest.raises(ValueError, match=r"train\.yaml: distill_view must be one of reminded, near, both, got 'far'"):
        TrainConfig.from_dict({**train, "distill_view": "far"}, "train.yaml")
    with pytest.raises(ValueError, match=r"kinds must be one of .*, got 'sideways'"):  # a list: each element
        dataclass_from_dict(EvalConfig, {"model": ["a=b"], "out": "o", "kinds": ["first", "sideways"]})
    assert TrainConfig.from_dict({**train, "distill_view": "near"}).distill_view == "near"
    assert (
        dataclass_from_dict(EvalConfig, {"model": ["a=b"], "out": "o", "relevance_judge": None}).relevance_judge is None
    )


def test_eval_config_from_a_yaml_file_equals_the_same_command_line(tmp_path: Path) -> None:
    argv = ["--model", "base=embedded", "--model", "gatt=runs/g", "--out", "runs/r", "--turns", "30"]
    argv += ["--kinds", "first", "late", "--repeat-instruction", "--split-softmax", "base:0.5", "--no-attention"]
    from_flags = parse_config(EvalConfig, argv, build_parser())
    file = tmp_path / "eval.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "model": ["base=embedded", "gatt=runs/g"],
                "out": "runs/r",
                "turns": 30,
                "kinds": ["first", "late"],
                "repeat_instruction": [],
                "split_softmax": ["base:0.5"],
                "no_attention": True,
            }
        )
    )
    assert parse_config(EvalConfig, ["--config", str(file)], build_parser()) == from_flags
    assert from_flags.repeat_instruction == [] and from_flags.heldout_families == [] and from_flags.dialogues == 64
    assert dataclass_from_dict(EvalConfig, {"model": ["a=b"], "out": "o"}).repeat_instruction is None  # not given: none


def _evaluate_commands() -> list[list[str]]:
    """The gatt.eval.evaluate command lines of README.md, docs/ and the Makefile (continuation lines joined)."""
    texts = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]
    commands = []
    for path in texts:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            if "-m gatt.eval.evaluate " in line and "--" in line:
                words = shlex.split(line.split("-m gatt.eval.evaluate ", 1)[1].split("`")[0].split("  #")[0])
                commands.append([w for w in words if not re.fullmatch(r"[|&;>].*", w)])
    return commands


def test_every_flag_the_pages_show_parses() -> None:
    commands = _evaluate_commands()
    assert len(commands) >= 5
    flags = {option for action in build_parser()._actions for option in action.option_strings}
    shown = {word.split("=")[0] for command in commands for word in command if word.startswith("--")}
    assert shown and shown <= flags, sorted(shown - flags)
    assert {f"--{f.name.replace('_', '-')}" for f in fields(EvalConfig)} <= flags


def test_data_gen_gatt_from_a_yaml_file_equals_the_same_command_line(tmp_path: Path) -> None:
    argv = ["gatt", "--teacher", "embedded", "--num-dialogues", "8", "--max-turns", "30", "--out", "runs/d"]
    argv += ["--kinds", "first", "late", "--heldout-families", "--temperature", "0.5", "--strict-gate"]
    name, (synthesis, files, teacher) = data_gen_parse(argv)
    assert name == "gatt" and synthesis == SynthesisConfig(
        num_dialogues=8, max_turns=30, kinds=("first", "late"), strict_gate=True
    )
    assert teacher == TeacherConfig(teacher="embedded", temperature=0.5) and files.heldout_families == []
    file = tmp_path / "gatt.yaml"
    keys = {"teacher": "embedded", "num_dialogues": 8, "max_turns": 30, "out": "runs/d", "kinds": ["first", "late"]}
    file.write_text(yaml.safe_dump({**keys, "heldout_families": [], "temperature": 0.5, "strict_gate": True}))
    assert data_gen_parse(["gatt", "--config", str(file)]) == (name, (synthesis, files, teacher))
    file.write_text(yaml.safe_dump({**keys, "round": 2}))  # replay takes no --round
    with pytest.raises(ValueError, match=r"unknown key\(s\) kinds, round; the keys are num_dialogues"):
        data_gen_parse(["replay", "--config", str(file)])


def test_every_data_gen_flag_of_the_old_parsers_is_kept() -> None:
    """The flags each subcommand had before its parser was made from configs (a flag is the docs' contract), and
    those added since (--relevance-judge, --value-swaps)."""
    before = {
        "base": "num-dialogues seed out short-prob heldout-families max-turns",
        "gatt": "num-dialogues seed out short-prob heldout-families min-turns max-turns samples-per-turn redraws "
        "user-turns on-error shard-size strict-repeats strict-gate relevance-judge teacher temperature top-p repetition-penalty "
        "no-repeat-ngram-size max-new-tokens batch-size device teacher-dtype teacher-numerics teacher-device-map "
        "constraints round demonstration kinds values-per-family trained-families value-swaps",
        "replay": "num-dialogues seed out short-prob heldout-families min-turns max-turns samples-per-turn redraws "
        "user-turns on-error shard-size strict-repeats strict-gate relevance-judge teacher temperature top-p repetition-penalty "
        "no-repeat-ngram-size max-new-tokens batch-size device teacher-dtype teacher-numerics teacher-device-map",
        "pass-rate": "out constraints values-per-family prompts samples seed strict-gate relevance-judge demonstration "
        "without-instruction user-turns on-error teacher temperature top-p repetition-penalty no-repeat-ngram-size "
        "max-new-tokens batch-size device teacher-dtype teacher-numerics teacher-device-map",
        "constraints": "out constraints families heldout-families",
        "eval-set": "out seed",
    }
    subparsers = data_gen_parser()._subparsers._group_actions[0].choices
    for name, flags in before.items():
        now = {o for a in subparsers[name]._actions for o in a.option_strings} - {"-h", "--help", "--config"}
        assert now == {f"--{flag}" for flag in flags.split()}, name


def test_every_committed_demo_config_writes_stage_configs_that_their_commands_parse(tmp_path: Path) -> None:
    """Each stage of each demo config (recipes/demo.py writes its section as the stage's YAML) parses with its
    command's own parser, and the section's settings arrive."""

    from recipes.demo import load_config, section, stages

    demo_configs = [
        p for p in sorted((ROOT / "recipes" / "configs").glob("*.yaml")) if "out" in yaml.safe_load(p.read_text())
    ]
    assert len(demo_configs) >= 12
    for path in demo_configs:
        config = load_config(path, [f"out={tmp_path / path.stem}"])
        for stage in stages(config):
            stage.write_config()
            argv = stage.command[stage.command.index("--config") :] if stage.config else []
            if "gatt.eval.evaluate" in stage.command:
                parsed = parse_config(EvalConfig, argv, build_parser())
                assert parsed.turns == config.eval["turns"] and parsed.out == Path(config.out) / "report", path
            elif "data_gen" in stage.command:
                name, configs = data_gen_parse([stage.command[stage.command.index("data_gen") + 1], *argv])
                if name == "gatt":
                    assert configs[0].max_turns == section(config, "data.gatt")["max_turns"], path
            elif "recipes/grpo_gatt.py" in " ".join(stage.command):
                grpo = dataclass_from_dict(GRPOGattConfig, yaml.safe_load(stage.config.read_text()), str(stage.config))
                grpo.validate(str(stage.config))
                assert grpo.output_dir == str(stage.output), path
            elif stage.config:
                trained = TrainConfig.from_dict(yaml.safe_load(stage.config.read_text()), str(stage.config))
                assert trained.output_dir == str(stage.output), path


def test_a_data_section_reads_its_config_file_and_its_own_keys_override_it(tmp_path: Path) -> None:
    """A data section's `config: FILE` (relative to the checkout) holds its command's settings; the section's other
    keys win; a key the command does not take (or the recipe sets), in the file, is refused naming the section and the file."""
    from recipes.demo_config import load_config, section

    demo = ROOT / "recipes" / "configs" / "demo.yaml"
    shared = yaml.safe_load((ROOT / "recipes" / "configs" / "gatt_data.yaml").read_text())
    assert section(load_config(demo), "data.gatt") == shared
    changed = section(load_config(demo, ["data.gatt.num_dialogues=5"]), "data.gatt")
    assert changed == {**shared, "num_dialogues": 5}
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_dialogues: 4\nnum_turns: 3\n")
    with pytest.raises(ValueError, match=rf"data.gatt.config {re.escape(str(bad))}: unknown key\(s\) num_turns"):
        section(load_config(demo, [f"data.gatt.config={bad}"]), "data.gatt")  # an absolute path stays itself
    teacher = tmp_path / "teacher.yaml"
    teacher.write_text("teacher: other\n")  # set by the recipe itself, in the file too
    with pytest.raises(ValueError, match="teacher set by the recipe itself"):
        section(load_config(demo, [f"data.gatt.config={teacher}"]), "data.gatt")


def test_a_training_flag_equals_its_key_value_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """recipes/train_gatt.py: the YAML file, then key=value, then the flags; each field of TrainConfig is a flag."""
    import sys

    from recipes import train_gatt

    seen = []
    monkeypatch.setattr(train_gatt, "train", lambda config, resume: seen.append((config, resume)))
    smoke = str(ROOT / "recipes" / "configs" / "smoke.yaml")
    for argv in (
        [smoke, "max_steps=7", "packing=false", "lora_targets=[q_proj, v_proj]"],
        [smoke, "--max-steps", "7", "--no-packing", "--lora-targets", "q_proj", "v_proj"],
        [smoke, "max_steps=3", "--max-steps", "7", "--no-packing", "lora_targets=[q_proj, v_proj]"],
    ):
        monkeypatch.setattr(sys, "argv", ["train_gatt.py", "--config", *argv, "--resume"])
        train_gatt.main()
    assert [(c.max_steps, c.packing, c.lora_targets, r) for c, r in seen] == [
        (7, False, ["q_proj", "v_proj"], True)
    ] * 3
    assert seen[0][0] == seen[1][0] == seen[2][0]
    flags = {o for a in config_parser(TrainConfig)._actions for o in a.option_strings}
    assert {f"--{f.name.replace('_', '-')}" for f in fields(TrainConfig)} <= flags
