"""gatt.model.folder: a path that holds no model is refused in one line that names what it lacks."""

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from gatt.model.folder import check_model_folder
from tests.test_modeling import tiny_llama


def test_a_saved_model_and_its_tokenizer_pass_and_load(tmp_path: Path) -> None:
    tiny_llama().save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=r"it has no tokenizer files \(tokenizer.json or tokenizer.model\); save_pretrained"
    ):
        check_model_folder(tmp_path, "--teacher")
    check_model_folder(tmp_path, "model", tokenizer=False)  # a tokenizer given elsewhere
    PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    ).save_pretrained(tmp_path)
    check_model_folder(tmp_path, "--teacher")
    assert (
        AutoModelForCausalLM.from_pretrained(tmp_path) is not None
        and AutoTokenizer.from_pretrained(tmp_path) is not None
    )


def test_each_missing_part_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(
        ValueError, match=rf"^model {tmp_path}: not a model folder: it has no model weights .*, no tokenizer"
    ):
        check_model_folder(tmp_path, "model")
    with pytest.raises(ValueError, match=r"--model base=.*: not a model folder \(hint\): it has no model weights"):
        check_model_folder(tmp_path, "--model base=", hint=" (hint)")


def test_missing_paths_and_gguf_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=rf"^--teacher {tmp_path}/nope: no such model folder$"):
        check_model_folder(tmp_path / "nope", "--teacher")
    with pytest.raises(FileNotFoundError, match="no such .gguf file"):
        check_model_folder(tmp_path / "model.gguf", "model")
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    check_model_folder(tmp_path / "model.gguf", "model")
    (tmp_path / "weights.txt").write_text("")
    with pytest.raises(ValueError, match="not a model folder or a .gguf file"):
        check_model_folder(tmp_path / "weights.txt", "model")
