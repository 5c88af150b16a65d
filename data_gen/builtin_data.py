"""The toy world's built-in data, read from the YAML files in data_gen/data/ and checked for shape.

* `topics.yaml`: the languages and each topic's name in them (`data_gen.user_turns`);
* `topic_keywords.yaml`: the words that show a text is about each topic, per language (`data_gen.user_turns`);
* `phrasings.yaml`: the templates of the built-in user messages (`data_gen.user_turns`);
* `catalogue.yaml`: the instruction space, value pools and family rules (`data_gen.constraints`);
* `toy_world.yaml`: the scripted responder's sentences (`data_gen.toy_world`).

Each reader returns fresh objects of the types the modules always had (dicts in file order, tuples for
lists): seeded sampling follows that order. A missing, malformed or misshapen file raises
`DataFileError` naming the file and the key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
Convert = Callable[[Any, str], T]

DATA_DIR = resources.files("data_gen") / "data"
# Each file's top-level keys: all required, in this order, and no others.
SECTIONS = {
    "topics.yaml": ("languages", "topics"),
    "topic_keywords.yaml": ("keywords",),
    "phrasings.yaml": ("phrasings",),
    "catalogue.yaml": ("pools", "families", "heldout_tiers"),
    "toy_world.yaml": (
        "topic_replies",
        "generic_reply",
        "lines",
        "assistant_line",
        "question",
        "help_line",
        "language_phrases",
        "emoji",
    ),
}


class DataFileError(ValueError):
    """A built-in data file that is missing, not valid YAML, or has a key of the wrong shape."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, except that a key repeated in one mapping is an error, not a silent overwrite."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                break  # SafeLoader's own error names it
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_data_file(path: Traversable, sections: Sequence[str]) -> dict[str, Any]:
    """The top-level mapping of one YAML file, whose keys must be `sections`, in that order.

    A key repeated in one mapping is an error, not a silent overwrite.

    Args:
        path: The YAML file.
        sections: Its top-level keys: all required, in this order, and no others.

    Returns:
        The mapping, key -> its value as YAML reads it.

    Raises:
        DataFileError: When the file is missing, is not valid YAML, or its top level is not a non-empty mapping with
            exactly the keys `sections`, in that order.
    """
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except FileNotFoundError as error:
        raise DataFileError(f"{path}: built-in data file not found (a broken install?)") from error
    except yaml.YAMLError as error:
        raise DataFileError(f"{path}: not valid YAML: {error}") from error
    return _mapping(data, str(path), lambda value, _: value, sections)


@functools.cache
def _file(name: str) -> dict[str, Any]:
    return read_data_file(DATA_DIR / name, SECTIONS[name])


def _section(name: str, key: str) -> tuple[Any, str]:
    return _file(name)[key], f"{DATA_DIR / name}: {key}"


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise DataFileError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _texts(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise DataFileError(f"{where}: expected a non-empty list of strings, got {value!r}")
    return tuple(_text(item, f"{where}[{i}]") for i, item in enumerate(value))


def _mapping(value: Any, where: str, convert: Convert[T], keys: Sequence[str] | None = None) -> dict[str, T]:
    """`value`, a mapping of string keys (exactly `keys`, in that order, when given), with each value converted."""
    if not isinstance(value, dict) or not value:
        raise DataFileError(f"{where}: expected a non-empty mapping, got {value!r}")
    if keys is not None and list(value) != list(keys):
        raise DataFileError(
            f"{where}: expected the keys {', '.join(keys)} in this order, got {', '.join(map(str, value))}"
        )
    for key in value:
        if not isinstance(key, str):
            raise DataFileError(f"{where}: expected string keys, got {key!r}")
    return {key: convert(item, f"{where}.{key}") for key, item in value.items()}


def _per_language(convert: Convert[T]) -> Convert[dict[str, T]]:
    """A converter of a mapping with every language of topics.yaml, in its order."""
    return lambda value, where: _mapping(value, where, convert, language_codes())


@functools.cache
def language_codes() -> tuple[str, ...]:
    """The ISO 639-1 codes of the toy world's languages (user_turns.LANGUAGE_CODES).

    Returns:
        The codes, in the order of topics.yaml's `languages`.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _texts(*_section("topics.yaml", "languages"))


def topics() -> dict[str, dict[str, str]]:
    """Topic -> language -> the topic as written in running text (user_turns.TOPICS).

    Returns:
        The mapping, in file order, with every language of topics.yaml for each topic.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _mapping(*_section("topics.yaml", "topics"), _per_language(_text))


def topic_keywords() -> dict[str, dict[str, tuple[str, ...]]]:
    """Topic (those of topics(), in order) -> language -> its keywords (user_turns.TOPIC_KEYWORDS).

    Returns:
        The mapping, with every language of topics.yaml for each topic.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _mapping(*_section("topic_keywords.yaml", "keywords"), _per_language(_texts), tuple(topics()))


def phrasings() -> tuple[str, ...]:
    """The English message templates, each with a {topic} slot (user_turns.PHRASINGS).

    Returns:
        The templates, in file order.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _texts(*_section("phrasings.yaml", "phrasings"))


def pools() -> dict[str, Any]:
    """Pool name -> its YAML form: a list, a mapping of values to attributes, or a generator (constraints.py).

    Returns:
        The mapping, in file order; the pools are not validated here.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _mapping(*_section("catalogue.yaml", "pools"), lambda value, _: value)


def heldout_tiers() -> tuple[Any, str]:
    """catalogue.yaml's `heldout_tiers` as written, with where it is (validated in data_gen.constraints).

    Returns:
        (value, where): the section as YAML reads it, and "FILE: heldout_tiers" for error messages.

    Raises:
        DataFileError: When catalogue.yaml is missing or malformed.
    """
    return _section("catalogue.yaml", "heldout_tiers")


def family_specs() -> tuple[dict[str, Any], ...]:
    """The families' YAML entries, in file order (validated field by field in data_gen.constraints).

    Returns:
        The entries, each a mapping with a `family` name.

    Raises:
        DataFileError: When catalogue.yaml is missing or malformed, `families` is not a non-empty list, or an entry
            is not a mapping with a `family` name.
    """
    value, where = _section("catalogue.yaml", "families")
    if not isinstance(value, list) or not value:
        raise DataFileError(f"{where}: expected a non-empty list of families, got {value!r}")
    for index, entry in enumerate(value):
        if not isinstance(entry, dict) or not isinstance(entry.get("family"), str):
            raise DataFileError(f"{where}[{index}]: expected a mapping with a `family` name, got {entry!r}")
    return tuple(value)


def topic_replies() -> dict[str, tuple[str, ...]]:
    """Language -> the responder's templates about a topic {T} (toy_world.TOPIC_REPLIES).

    Returns:
        The mapping, with every language of topics.yaml, in its order.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _per_language(_texts)(*_section("toy_world.yaml", "topic_replies"))


def toy_line(key: str) -> dict[str, str]:
    """Language -> one of the responder's sentences in toy_world.yaml (generic_reply, assistant_line, ...).

    Args:
        key: The sentence's top-level key in toy_world.yaml.

    Returns:
        The mapping, with every language of topics.yaml, in its order.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _per_language(_text)(*_section("toy_world.yaml", key))


def lines() -> dict[str, dict[str, str]]:
    """Line name -> language -> the sentence a family's rule adds ({value} and its attributes fill it).

    Returns:
        The mapping, in file order, with every language of topics.yaml for each line.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _mapping(*_section("toy_world.yaml", "lines"), _per_language(_text))


def language_phrases() -> dict[str, dict[str, str]]:
    """Language code (every toy-world language but English) -> its phrases.

    Returns:
        The mapping; each language's phrases ({greeting, thanks, ...}) have the first language's keys, which every
        language has, in that order.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    codes = tuple(code for code in language_codes() if code != "en")
    value, where = _section("toy_world.yaml", "language_phrases")
    first = value.get(codes[0]) if isinstance(value, dict) else None
    keys = list(first) if isinstance(first, dict) else None
    return _mapping(value, where, lambda v, w: _mapping(v, w, _text, keys), codes)


def emoji() -> tuple[str, ...]:
    """What the `emoji` family ends a reply with.

    Returns:
        The emoji, in file order.

    Raises:
        DataFileError: When the file is missing or malformed, or the section has the wrong shape.
    """
    return _texts(*_section("toy_world.yaml", "emoji"))
