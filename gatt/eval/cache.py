"""Finished rollouts kept on disk, so an interrupted report resumes at the first column it had not finished.

A real model's report rolls out several columns (`base`, `base+repeat`, `gatt-r1`, ...) for an hour or
more each on a CPU. Each finished column is written to `<out>/rollouts/<column>.jsonl` (whole, then
renamed), its first line a fingerprint of everything its replies depend on: the model's weight files
(path, size, modification time), the dialogue plan, the rollout settings, the numerics and the device.
A later run with the same fingerprint reads the column instead of rolling it out again; any change
rolls it out anew and replaces the file.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gatt.eval.plan import EvalDialogue
from gatt.eval.turns import RolloutConfig
from gatt.io.files import write_text

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def weight_files(path: str | Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of a model's weight files: the file itself, or those in its folder.

    Args:
        path: A model's weight file, or its folder (whose `.safetensors`, `.bin`, `.gguf` and `.pt` files count).

    Returns:
        One (file name, size in bytes, modification time in ns) tuple per weight file, sorted by path.
    """
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.glob("*") if p.suffix in WEIGHT_SUFFIXES)
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def fingerprint(
    model_path: str | Path, column: str, dialogues: Sequence[EvalDialogue], config: RolloutConfig, **settings: Any
) -> str:
    """A hash of what a column's replies depend on.

    Args:
        model_path: The model's weight file or folder (its weight files' names, sizes and modification times count).
        column: The column's name (`base`, `gatt-r1`, ...).
        dialogues: The dialogue plan (each dialogue's repr counts).
        config: The rollout settings.
        **settings: Anything else the replies depend on (the numerics, the device), JSON-serialisable or str()-able.

    Returns:
        The SHA-256 hex digest of all of it.
    """
    key = {
        "column": column,
        "weights": weight_files(model_path),
        "rollout": asdict(config),
        "dialogues": [repr(d) for d in dialogues],
        **settings,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


class RolloutCache:
    """Columns of transcripts under `folder`, each valid for one fingerprint; `folder=None` keeps nothing.

    Args:
        folder: Where the columns are kept (`<out>/rollouts`); None keeps nothing.
        write: Whether this process writes columns (only the main process writes under torchrun).
    """

    def __init__(self, folder: str | Path | None, *, write: bool = True) -> None:
        self.folder = None if folder is None else Path(folder)
        self.write = write  # only the main process writes under torchrun

    def _path(self, column: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{column}.jsonl"

    def load(self, column: str, key: str) -> list[dict[str, Any]] | None:
        """The column's transcripts if a finished rollout with this fingerprint is on disk.

        Args:
            column: The column's name.
            key: The column's fingerprint (`fingerprint`).

        Returns:
            The transcripts, or None when the folder is None, the column has no file, or the file holds another
            fingerprint.
        """
        if self.folder is None or not self._path(column).exists():
            return None
        header, *lines = self._path(column).read_text(encoding="utf-8").splitlines()
        if json.loads(header).get("fingerprint") != key:
            return None
        return [json.loads(line) for line in lines]

    def column(self, column: str, key: str, rollout: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The column read from disk if finished with this fingerprint, else `rollout()`, then kept.

        Args:
            column: The column's name.
            key: The column's fingerprint (`fingerprint`).
            rollout: Rolls the column out when it is not on disk.

        Returns:
            The column's transcripts.
        """
        cached = self.load(column, key)
        if cached is not None:
            if self.write:
                print(f"[eval] {column}: finished rollouts read from {self.folder}", file=sys.stderr)
            return cached
        transcripts = rollout()
        self.store(column, key, transcripts)
        return transcripts

    def store(self, column: str, key: str, transcripts: list[dict[str, Any]]) -> None:
        """Keep a finished column for the next run (written whole, then renamed).

        Nothing is written when the folder is None or this process does not write.

        Args:
            column: The column's name; the file is `<folder>/<column>.jsonl`.
            key: The column's fingerprint, written on the file's first line.
            transcripts: The column's transcripts, one JSON line each.
        """
        if self.folder is None or not self.write:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"fingerprint": key, "column": column})]
        lines += [json.dumps(t, ensure_ascii=False) for t in transcripts]
        write_text(self._path(column), "\n".join(lines) + "\n")
