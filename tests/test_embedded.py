"""The embedded chat model shipped in the package: it loads by name wherever a model folder is taken, its files are
the ones its record describes (weights' hash, greedy replies), and `make base-model`'s config is the recorded one."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_gen.__main__ import main as data_gen_main
from data_gen.constraints import FAMILIES
from gatt.eval.evaluate import parse_models
from gatt.io.config import yaml_values
from gatt.model.embedded import (
    EMBEDDED,
    FOLDER,
    MAX_WEIGHT_BYTES,
    greedy_replies,
    model_path,
    package,
    read_record,
    weights_sha256,
)
from gatt.model.modeling import GattForCausalLM
from gatt.training.trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[1]

from recipes.demo import load_config as load_demo_config  # noqa: E402
from recipes.demo import section, stages  # noqa: E402


@pytest.fixture(scope="module")
def record() -> dict:
    return read_record()


def test_the_shipped_files_are_the_ones_the_record_describes(record):
    assert weights_sha256(FOLDER) == record["weights_sha256"]
    assert (FOLDER / "model.safetensors").stat().st_size == record["weights_bytes"] <= MAX_WEIGHT_BYTES
    # fp32 on the CPU, greedy: the replies the model gave when it was packaged, token for token.
    assert greedy_replies(FOLDER) == record["greedy_replies"]["tokens"]
    model = AutoModelForCausalLM.from_pretrained(model_path(EMBEDDED))
    assert isinstance(model, GattForCausalLM) and model.num_parameters() == record["parameters"]
    tokenizer = AutoTokenizer.from_pretrained(model_path(EMBEDDED))
    assert tokenizer.chat_template and len(tokenizer) == model.config.vocab_size


def test_make_base_models_config_is_the_recorded_one(record):
    config = load_demo_config(ROOT / "recipes" / "configs" / "base_model.yaml")
    plan = {stage.name: stage.settings for stage in stages(config)}
    # The record holds the demo config (its stage sections) and the training config the model was made with. It was
    # made into another folder (`out`) from a copy of the training config make base-model names: where it wrote and
    # that file's path are set aside here, and the training config it resolved to is compared whole, its paths moved.
    made = dict(record["demo_config"])
    ours = yaml_values(dataclasses.asdict(config))

    def read(data: dict) -> dict:  # the data sections as they run: each `config: FILE` read, the section's keys over it
        return {name: section(dataclasses.replace(config, data=data), f"data.{name}") for name in data}

    ours["data"], made["data"] = read(config.data), read(made["data"])
    # Keys added since the model was made are at their defaults, which make it as before.
    added = {f.name: f.default for f in dataclasses.fields(config) if f.name not in made}
    assert all(ours[key] == value for key, value in added.items())
    assert {**ours, "out": made["out"], "train": made["train"]} == {**made, **added}
    assert plan["base-data"]["num_dialogues"] == made["data"]["base"]["num_dialogues"]
    assert all(plan["report"][key] == value for key, value in made["eval"].items())
    train = dataclasses.asdict(TrainConfig.from_dict(plan["base-model"]))
    recorded = {
        key: value.replace(made["out"], config.out, 1) if isinstance(value, str) else value
        for key, value in record["train_config"].items()
    }
    added = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name not in recorded}
    assert train == {**recorded, **added} and train["padding_free"]
    assert record["data_seed"] == config.seed
    assert record["command"].startswith("python recipes/demo.py --config recipes/configs/base_model.yaml")
    # What the record says of the model's report is what make base-model measured.
    reminded = record["report"]["reminded_pass_rate_per_family"]
    assert set(reminded) == set(FAMILIES)  # every family of the catalogue, held-out ones included
    assert all(0 <= v["adherence"] <= 1 and v["n"] > 0 for v in reminded.values())


def test_every_place_that_takes_a_model_folder_takes_the_name(tmp_path):
    assert model_path(EMBEDDED) == str(FOLDER) and model_path("runs/x") == "runs/x"
    assert parse_models(["base=embedded"]) == {"base": str(FOLDER)}
    smoke = yaml.safe_load((ROOT / "recipes" / "configs" / "smoke.yaml").read_text())
    values = {**smoke, "model": EMBEDDED, "model_config": None, "tokenizer_vocab_size": 0}
    assert TrainConfig.from_dict(values).model == str(FOLDER)
    data_gen_main(
        ["gatt", "--teacher", EMBEDDED, "--num-dialogues", "2", "--max-turns", "2", "--max-new-tokens", "8"]
        + ["--out", str(tmp_path)]
    )
    settings = json.loads((tmp_path / "gatt.shards" / "settings.json").read_text())
    assert settings["teacher"] == str(FOLDER)


def test_packaging_that_fails_leaves_no_folder_behind(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for path in FOLDER.iterdir():
        if path.name not in ("tokenizer.json", "record.json"):
            (model / path.name).write_bytes(path.read_bytes())
    with pytest.raises(ValueError):  # no tokenizer: transformers cannot load one for the greedy replies
        package(model, tmp_path / "embedded", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
