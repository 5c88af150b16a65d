"""Files written whole: to a hidden temporary name beside the target, renamed onto it once complete.

A reader, or a run resumed after a kill, then finds a file (or folder) whole or not at all, and a write that
fails leaves the target as it was and nothing half-written beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary name beside `path`, unique to this write, that replaces `path` once the block completes.

    The name is unique because several processes may write one file at once. The block writes a file or a folder
    there, which then replaces `path` (a folder at `path` is removed first). A failing block removes it.

    Args:
        path: The file or folder to write; its parent folder is created if missing.

    Yields:
        The temporary path, in the same folder as `path` (one file system), for the block to write.
    """
    path, tmp = _beside(path)
    try:
        yield tmp
        if tmp.is_dir() and path.is_dir():
            shutil.rmtree(path)  # a folder cannot be renamed onto a folder that holds files
        os.replace(tmp, path)
    finally:
        _remove(tmp)


@contextmanager
def first_write(path: str | Path) -> Iterator[Path]:
    """A temporary name beside `path` for a file or folder that several processes may write alike (the same content):
    the first complete one is renamed onto `path` and stays; a later one finds `path` there and is dropped. A reader
    never sees `path` half-written or removed (`atomic_path` would replace a folder: rmtree, then rename).

    Args:
        path: The file or folder to write.

    Yields:
        The temporary path the block writes.

    Raises:
        OSError: When the rename fails and no other process's write is in its place.
    """
    path, tmp = _beside(path)
    try:
        yield tmp
        if not path.exists():
            try:
                os.replace(tmp, path)
            except OSError:
                if not path.exists():
                    raise  # not another process's write that won the race
    finally:
        _remove(tmp)


def _beside(path: str | Path) -> tuple[Path, Path]:
    """`path` (its folder made) and a temporary name beside it, unique to this write (several processes may write one
    file at once) and in the same folder, so on the same file system: the rename onto `path` is atomic."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _remove(tmp: Path) -> None:
    """The temporary file or folder, where a write left it (failed, or dropped by `first_write`)."""
    if tmp.is_dir():
        shutil.rmtree(tmp)
    else:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """`text` into `path` (UTF-8), written whole.

    Args:
        path: The file to write; its parent folder is created if missing.
        text: What the file holds.
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: str | Path, data: bytes) -> None:
    """`data` into `path`, written whole.

    Args:
        path: The file to write; its parent folder is created if missing.
        data: What the file holds.
    """
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | Path, payload: Any) -> None:
    """`payload` as indented JSON (non-ASCII kept) into `path`, written whole.

    Args:
        path: The file to write; its parent folder is created if missing.
        payload: A JSON-serialisable value; the file ends with a newline.
    """
    write_text(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
