"""Reading dialogues in the Hugging Face `messages` format: JSONL, Parquet or a `datasets` folder.

Every record is validated ([system?] user, assistant, user, ...; non-empty string contents), and a
bad one is reported with its file and line (JSONL) or row (Parquet, `datasets`), so a user can fix it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

DIALOGUE_FORMATS = (
    '.jsonl (one {"messages": [...]} object per line), .parquet (a `messages` column), '
    "or a folder written by datasets' save_to_disk (a `messages` column)"
)
TEXT_FORMAT = ".txt (one message per line)"
ROLES = ("system", "user", "assistant")
OnError = Literal["raise", "skip"]
Messages = list[dict[str, str]]


def validate_messages(messages: object) -> None:
    """Raise ValueError saying what is wrong unless `messages` is [system?] user, assistant, user, ...

    Args:
        messages: the record's `messages` value: a list of {role, content} objects with non-empty string contents.

    Raises:
        ValueError: when `messages` is not a non-empty list of such objects, a role is unknown, a system message is
            not the first, user and assistant do not alternate, a content is not a string or is empty, or a system
            message is all there is.
    """
    if not isinstance(messages, list):
        kind = type(messages).__name__
        raise ValueError(f"'messages' must be a list of {{'role', 'content'}} objects, got {kind}")
    if not messages:
        raise ValueError("'messages' is empty")
    expected = "user"
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            kind = type(message).__name__
            raise ValueError(f"{where}: expected an object with 'role' and 'content', got {kind}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"{where}: missing '{key}'")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise ValueError(f"{where}: unknown role {role!r} (allowed: {', '.join(ROLES)})")
        if role == "system":
            if index != 0:
                raise ValueError(f"{where}: role 'system' is only allowed as the first message")
        elif role != expected:
            raise ValueError(
                f"{where}: role {role!r} where {expected!r} was expected (roles must alternate user/assistant)"
            )
        else:
            expected = "assistant" if role == "user" else "user"
        if not isinstance(content, str):
            raise ValueError(f"{where}: content must be a string, got {type(content).__name__}")
        if not content.strip():
            raise ValueError(f"{where}: content is empty")
    if len(messages) == 1 and messages[0]["role"] == "system":
        raise ValueError("'messages' holds only a system message; a user message must follow it")


def parse_messages(location: str, messages: object) -> Messages:
    """Validated {role, content} messages.

    Args:
        location: where the record is (a file and line or row), put in front of an error.
        messages: the record's `messages` value.

    Returns:
        The messages with only their `role` and `content` keys, as strings.

    Raises:
        ValueError: starting with `location`, when the messages are malformed (`validate_messages`).
    """
    try:
        validate_messages(messages)
    except ValueError as exc:
        raise ValueError(f"{location}: {exc}") from None
    # Arrow stores messages as structs with every key any row used; keep only the two that count.
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]  # type: ignore[union-attr]


def user_texts(messages: Messages) -> list[str]:
    """The contents of a dialogue's user messages, in order.

    Args:
        messages: the dialogue's messages.

    Returns:
        The user messages' contents.
    """
    return [m["content"] for m in messages if m["role"] == "user"]


def jsonl_records(path: Path) -> Iterator[tuple[str, dict[str, Any] | ValueError]]:
    """("file:line", object) for each non-blank line of a JSONL file.

    Args:
        path: the JSONL file.

    Yields:
        ("file:line", the line's JSON object), or ("file:line", a located ValueError) for a line that is not a JSON
        object.
    """
    # Errors are yielded, not raised, so each caller applies its own on_error policy to every bad line.
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            location = f"{path}:{line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                yield location, ValueError(f"{location}: invalid JSON: {exc.msg} (column {exc.colno})")
                continue
            if isinstance(record, dict):
                yield location, record
            else:
                yield location, ValueError(f"{location}: expected a JSON object, got {type(record).__name__}")


def _messages_from_jsonl(path: Path) -> Iterator[tuple[str, object]]:
    for location, record in jsonl_records(path):
        if isinstance(record, dict) and "messages" not in record:
            fields = ", ".join(record) or "none"
            record = ValueError(f"{location}: record has no 'messages' field (fields: {fields})")
        yield location, record if isinstance(record, ValueError) else record["messages"]


def _messages_from_parquet(path: Path) -> Iterator[tuple[str, object]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        columns = pq.read_schema(path).names
        if "messages" not in columns:
            raise ValueError(f"{path}: no 'messages' column (columns: {', '.join(columns) or 'none'})")
        messages = pq.read_table(path, columns=["messages"]).column("messages").to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path}: not a readable Parquet file: {exc}") from exc
    # Rows are numbered from 0, as `dataset[i]` counts them.
    for row, value in enumerate(messages):
        yield f"{path}: row {row}", value


def _messages_from_dataset_folder(path: Path) -> Iterator[tuple[str, object]]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise ValueError(f"{path}: folder is not a dataset saved with save_to_disk ({exc})") from exc
    if isinstance(loaded, datasets.DatasetDict):
        parts = [(f"{path} [split {name}]", split) for name, split in loaded.items()]
    else:
        parts = [(str(path), loaded)]
    for label, dataset in parts:
        if "messages" not in dataset.column_names:
            columns = ", ".join(dataset.column_names) or "none"
            raise ValueError(f"{label}: no 'messages' column (columns: {columns})")
        for row, record in enumerate(dataset.select_columns(["messages"])):
            yield f"{label}: row {row}", record["messages"]


def unsupported(path: Path, accepted: str) -> ValueError:
    """The error for a file whose extension no reader accepts, listing the accepted ones.

    Args:
        path: the file.
        accepted: the accepted formats, in words.

    Returns:
        The ValueError to raise.
    """
    suffix = path.suffix or "(no extension)"
    return ValueError(f"{path}: unsupported file type {suffix!r}; accepted: {accepted}")


def _raw_messages(path: Path) -> Iterable[tuple[str, object]]:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        return _messages_from_dataset_folder(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _messages_from_jsonl(path)
    if suffix == ".parquet":
        return _messages_from_parquet(path)
    raise unsupported(path, DIALOGUE_FORMATS)


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def load_dialogues(path: str | Path, *, on_error: OnError = "raise") -> tuple[list[Messages], int]:
    """Dialogues from JSONL, Parquet or a `datasets` folder.

    Args:
        path: a .jsonl file, a .parquet file or a folder written by datasets' save_to_disk.
        on_error: "raise" on the first malformed dialogue, or "skip" it.

    Returns:
        (dialogues, number skipped).

    Raises:
        FileNotFoundError: when `path` does not exist.
        ValueError: when `on_error` is unknown, the file type is unsupported or unreadable, or (with "raise") a
            dialogue is malformed.
    """
    _check_on_error(on_error)
    dialogues: list[Messages] = []
    skipped = 0
    for location, messages in _raw_messages(Path(path)):
        try:
            if isinstance(messages, ValueError):
                raise messages
            dialogues.append(parse_messages(location, messages))
        except ValueError:
            if on_error == "raise":
                raise
            skipped += 1
    return dialogues, skipped


def unique_texts(texts: Iterable[str]) -> list[str]:
    """Stripped, non-blank texts, duplicates dropped (the first kept), in order.

    Args:
        texts: the texts.

    Returns:
        The texts kept.
    """
    # Surrounding whitespace is an artefact of the file, not part of the message.
    return list(dict.fromkeys(text.strip() for text in texts if text.strip()))


def load_user_texts(path: str | Path, *, on_error: OnError = "raise") -> list[str]:
    """User messages of a dialogue file or a .txt file (one a line), in order, stripped and deduplicated.

    Args:
        path: a .txt file, or a dialogue file or folder (`load_dialogues`).
        on_error: "raise" on the first malformed dialogue, or "skip" it (the number skipped is logged).

    Returns:
        The user messages.

    Raises:
        FileNotFoundError: when `path` does not exist.
        ValueError: when `on_error` is unknown, the file type is unsupported, a dialogue is malformed (with
            "raise"), or no user turns are found.
    """
    _check_on_error(on_error)
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".txt":
        texts = unique_texts(path.read_text(encoding="utf-8").splitlines())
    elif path.is_file() and path.suffix.lower() not in (".jsonl", ".parquet"):
        raise unsupported(path, f"{TEXT_FORMAT}, {DIALOGUE_FORMATS}")
    else:
        dialogues, skipped = load_dialogues(path, on_error=on_error)
        if skipped:
            logger.warning("%s: skipped %d malformed dialogue(s)", path, skipped)
        texts = unique_texts(text for dialogue in dialogues for text in user_texts(dialogue))
    if not texts:
        raise ValueError(f"{path}: no user turns found")
    return texts
