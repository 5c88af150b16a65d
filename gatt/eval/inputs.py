"""What the evaluation runs on: constraints with their split tags, and held-out user turns with on-topic checks.

Both default to the built-in files in `builtin/` (exported by `python -m data_gen eval-set`); a user
may pass their own constraint YAML and a file of user turns:

* `.txt`: one message per line;
* `.jsonl`: `{"content": "...", "checks": [...], "topic": "..."}` lines (checks and topic optional,
  extra fields ignored; a dialogue asks about each topic once) or
  Hugging Face `{"messages": [...]}` dialogues, whose user turns are used without checks;
* `.parquet` or a `datasets.save_to_disk` folder of `messages` dialogues.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatt.data.check_types import Check
from gatt.data.checks import Constraint, load_constraints
from gatt.data.dialogues import (
    TEXT_FORMAT,
    jsonl_records,
    load_user_texts,
    parse_messages,
    unsupported,
    user_texts,
)

BUILTIN_DIR = Path(__file__).parent / "builtin"
TURN_FORMATS = (
    f'{TEXT_FORMAT}, .jsonl (one {{"content": ..., "checks": [...]}} or {{"messages": [...]}} object '
    "per line), .parquet or a folder written by datasets' save_to_disk (a `messages` column)"
)


@dataclass(frozen=True)
class EvalTurn:
    """A held-out user message, with checks that a reply on the user's topic passes (none: not scored)."""

    text: str
    checks: tuple[Check, ...] = ()
    topic: str | None = None  # a dialogue asks about each topic once, so no earlier answer is ever the right one

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", tuple(self.checks))


def load_eval_constraints(path: str | Path | None = None) -> list[Constraint]:
    """Constraints to evaluate, with their train/heldout split.

    Args:
        path: A constraint YAML file (default None: the built-in catalogue, `builtin/constraints.yaml`).

    Returns:
        The constraints, each with its split tag.
    """
    return load_constraints(BUILTIN_DIR / "constraints.yaml" if path is None else path)


def _turns_from_record(location: str, record: dict[str, Any]) -> list[EvalTurn]:
    if "messages" in record:
        return [EvalTurn(text) for text in user_texts(parse_messages(location, record["messages"]))]
    if "content" not in record:
        fields = ", ".join(record) or "none"
        raise ValueError(f"{location}: record has neither 'content' nor 'messages' (fields: {fields})")
    content, checks, topic = record["content"], record.get("checks", []), record.get("topic")
    if not isinstance(content, str):
        raise ValueError(f"{location}: 'content' must be a string, got {type(content).__name__}")
    if not content.strip():
        raise ValueError(f"{location}: 'content' is empty")
    if not isinstance(checks, list):
        raise ValueError(f"{location}: 'checks' must be a list of checks, got {type(checks).__name__}")
    if topic is not None and not isinstance(topic, str):
        raise ValueError(f"{location}: 'topic' must be a string, got {type(topic).__name__}")
    checks = tuple(Check.from_dict(c, f"{location}: checks[{j}]") for j, c in enumerate(checks))
    return [EvalTurn(content, checks, topic)]


def _turns_from_jsonl(path: Path) -> list[EvalTurn]:
    turns: list[EvalTurn] = []
    for location, record in jsonl_records(path):
        if isinstance(record, ValueError):
            raise record
        turns.extend(_turns_from_record(location, record))
    return turns


def load_eval_turns(path: str | Path | None = None) -> list[EvalTurn]:
    """Held-out user turns, texts stripped and deduplicated (first kept).

    Args:
        path: A file of user turns (`.txt`, `.jsonl`, `.parquet`) or a `datasets.save_to_disk` folder, as the module
            docstring describes (default None: the built-in pool, `builtin/user_turns.jsonl`).

    Returns:
        The turns in file order, each text once, with the checks and topic its first record gives (none for `.txt`,
        `.parquet`, a folder or `messages` dialogues).

    Raises:
        FileNotFoundError: When `path` does not exist.
        ValueError: When the file type is not supported, a `.jsonl` record is malformed, or no user turn is found.
    """
    path = BUILTIN_DIR / "user_turns.jsonl" if path is None else Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    suffix = path.suffix.lower()
    if path.is_file() and suffix == ".jsonl":
        turns = _turns_from_jsonl(path)
    elif path.is_dir() or suffix in (".txt", ".parquet"):
        turns = [EvalTurn(text) for text in load_user_texts(path)]
    else:
        raise unsupported(path, TURN_FORMATS)
    unique: dict[str, EvalTurn] = {}
    for turn in turns:
        text = turn.text.strip()
        if text:
            unique.setdefault(text, EvalTurn(text, turn.checks, turn.topic))
    if not unique:
        raise ValueError(f"{path}: no user turns found")
    return list(unique.values())
