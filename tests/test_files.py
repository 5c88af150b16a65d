"""gatt/io/files.py: a file or folder is replaced whole, or left as it was with nothing half-written beside it."""

import json
from pathlib import Path

import pytest

from gatt.io.files import atomic_path, first_write, write_bytes, write_json, write_text


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    write_text(target, "first")
    write_text(target, "second, ü")
    assert target.read_text(encoding="utf-8") == "second, ü"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_a_failing_write_leaves_the_old_file_and_no_partial(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="killed"), atomic_path(target) as tmp:
        tmp.write_text("half a line")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_a_folder_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale.bin").write_bytes(b"x")
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
    assert [p.name for p in target.iterdir()] == ["config.json"]
    with pytest.raises(ValueError), atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "half.bin").write_bytes(b"y")
        raise ValueError("failed")
    assert [p.name for p in target.iterdir()] == ["config.json"] and [p.name for p in tmp_path.iterdir()] == ["model"]


def test_two_writes_of_one_file_get_their_own_temporary_names(tmp_path: Path) -> None:
    target = tmp_path / "settings.json"
    with atomic_path(target) as first, atomic_path(target) as second:
        assert first != second and first.parent == second.parent == tmp_path and first.name.startswith(".")
        first.write_text("outer")
        second.write_text("inner")
    assert target.read_text() == "outer" and [p.name for p in tmp_path.iterdir()] == ["settings.json"]  # last wins


def test_write_json_and_bytes(tmp_path: Path) -> None:
    write_json(tmp_path / "a.json", {"word": "français", "n": [1, 2]})
    assert (tmp_path / "a.json").read_text(encoding="utf-8") == json.dumps(
        {"word": "français", "n": [1, 2]}, indent=2, ensure_ascii=False
    ) + "\n"
    write_bytes(tmp_path / "b.png", b"\x89PNG")
    assert (tmp_path / "b.png").read_bytes() == b"\x89PNG"


def test_first_write_keeps_the_first_complete_folder_and_drops_a_later_one(tmp_path: Path) -> None:
    target = tmp_path / "tokenizer"
    with first_write(target) as folder:
        folder.mkdir()
        (folder / "a.json").write_text("first")
    with first_write(target) as folder:  # another process, done later: its copy is dropped, the first one untouched
        folder.mkdir()
        (folder / "a.json").write_text("second")
    assert (target / "a.json").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]  # no temporary left beside it


def test_first_write_leaves_nothing_when_the_block_fails(tmp_path: Path) -> None:
    target = tmp_path / "tokenizer"
    with pytest.raises(RuntimeError), first_write(target) as folder:
        folder.mkdir()
        raise RuntimeError("killed while writing")
    assert list(tmp_path.iterdir()) == []
