"""The instruction sets the field measures with, IFEval and IFBench, as constraint sets.

`--constraints ifeval` (or `ifbench`, or `ifeval,ifbench`) wherever a constraint file is read gives one
constraint per instruction type and parameter draw: its instruction is the text the benchmark's own
description builder writes, its check the benchmark's own checker (strict: the reply as it is), from the
maintained package `if-verifiable` (Apache-2.0). A user's YAML names one the same way:
`{type: ifeval, id: "punctuation:no_comma", kwargs: {}}`.

Each type's parameters are drawn `VALUES_PER_TYPE` times with fixed seeds (duplicates dropped) and a quarter
of the draws are held out (split `heldout`), so the report measures trained types on parameters the GAtt
data never showed. Families are the types, prefixed by the set: `ifeval:punctuation:no_comma`.

Nothing is downloaded: where a checker needs nltk data (punkt, stopwords, a tagger), which no PyPI package in
the lock ships, its type is unavailable; so is a type whose text needs the user's own prompt (a request to
repeat, a reference text) and IFBench's `custom` group, tasks with a question of their own rather than a
standing instruction. `unavailable(name)` gives every such type with its reason.
"""

from __future__ import annotations

import functools
import importlib
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from unittest import mock

SETS = ("ifeval", "ifbench")
VALUES_PER_TYPE = 8  # parameter draws per type; the distinct ones become its values
HELDOUT_FRACTION = 0.25
SEED = 0
# Replies of the shapes the checkers branch on (sentences, paragraphs, bullets, markdown dividers, JSON), to find
# the types whose checker needs data the machine may not have.
_PROBE_REPLIES = (
    "Hello there. This is a test, of things! Another sentence here?\n\nA second paragraph with more words.",
    "* one\n* two\n***\nP.S. the end",
    '{"answer": "yes"}',
    "ok",
)


@contextmanager
def _no_downloads() -> Iterator[None]:
    # if-verifiable's IFBench module calls nltk.download() when it is imported: the project downloads nothing at
    # run time, so the call is answered "not downloaded" and the types that need that data are unavailable.
    import nltk

    with mock.patch.object(nltk, "download", lambda *args, **kwargs: False):
        yield


@functools.cache
def registry(name: str) -> Mapping[str, type]:
    """The benchmark's instruction classes by type id (if-verifiable's INSTRUCTION_DICT).

    Imported once per set, downloading nothing, with langdetect seeded so that IFEval's language checks give the
    same verdict on every run.

    Args:
        name: The instruction set, `ifeval` or `ifbench`.

    Returns:
        The instruction classes by type id.

    Raises:
        ValueError: When `name` is not a built-in set.
    """
    if name not in SETS:
        raise ValueError(f"unknown instruction set {name!r}; built-in sets: {', '.join(SETS)}")
    import langdetect

    langdetect.DetectorFactory.seed = 0  # IFEval's language checks: the same verdict on every run
    with _no_downloads():
        module = importlib.import_module(f"if_verifiable.{name}.instructions_registry")
    return module.INSTRUCTION_DICT


@functools.cache
def _conflicts(name: str) -> frozenset[frozenset[str]]:
    module = importlib.import_module(f"if_verifiable.{name}.instructions_registry")
    table = getattr(module, "INSTRUCTION_CONFLICTS", {})
    return frozenset(frozenset((f"{name}:{a}", f"{name}:{b}")) for a, others in table.items() for b in others if a != b)


def conflict(family_a: str, family_b: str) -> bool:
    """Whether the benchmark says two of its types cannot hold together (IFEval's INSTRUCTION_CONFLICTS).

    Args:
        family_a: A constraint family, `SET:TYPE` (e.g. `ifeval:punctuation:no_comma`).
        family_b: Another constraint family.

    Returns:
        True if both are families of the same built-in set and its conflict table pairs them; False otherwise,
        families of different sets or of no built-in set included.
    """
    name = family_a.partition(":")[0]
    if name not in SETS or family_b.partition(":")[0] != name:
        return False
    registry(name)
    return frozenset((family_a, family_b)) in _conflicts(name)


def _instance(name: str, type_id: str) -> Any:
    return registry(name)[type_id](type_id)


@contextmanager
def _seeded(seed: object) -> Iterator[None]:
    # The builders draw from the global `random`: a fixed seed inside, the caller's state restored after.
    state = random.getstate()
    try:
        random.seed(seed)
        yield
    finally:
        random.setstate(state)


def _draw(name: str, type_id: str, index: int) -> tuple[str, dict[str, Any]]:
    """(description, kwargs) of the builder's own random draw number `index`, from a fixed seed."""
    with _seeded(f"{name}:{type_id}:{SEED}:{index}"):
        instance = _instance(name, type_id)
        description = instance.build_description()
        return description, dict(instance.get_instruction_args() or {})


def _kept(name: str, type_id: str, kwargs: Mapping[str, Any]) -> bool:
    """Whether the builder keeps these parameters, drawing nothing when given them. A builder may draw an
    impossible one (IFEval's paragraph n+1 of n) and replace it at random when it is given back: a check built from
    it would not be the instruction's."""
    with _seeded(0):
        before = random.getstate()
        _instance(name, type_id).build_description(**kwargs)
        return random.getstate() == before


@functools.cache
def unavailable(name: str) -> dict[str, str]:
    """Type id -> why the set leaves it out (it needs the user's prompt, or nltk data, or is a task of its own).

    A type whose checker fails on a plain reply is left out too. Computed once per set.

    Args:
        name: The instruction set, `ifeval` or `ifbench`.

    Returns:
        The reason, by type id, for every type a constraint cannot use.

    Raises:
        ValueError: When `name` is not a built-in set.
    """
    out: dict[str, str] = {}
    for type_id in registry(name):
        if name == "ifbench" and type_id.startswith("custom:"):
            out[type_id] = "a task with a question of its own (IFBench's custom group), not a standing instruction"
            continue
        try:
            draws = [_draw(name, type_id, i) for i in range(VALUES_PER_TYPE)]
        except ValueError as exc:
            out[type_id] = f"its text needs the user's own prompt ({exc})"
            continue
        if reason := _checker_problem(name, type_id, [kwargs for _, kwargs in draws]):
            out[type_id] = reason
    return out


def _checker_problem(name: str, type_id: str, draws: Sequence[dict[str, Any]]) -> str | None:
    import nltk

    with mock.patch.object(nltk.data, "path", []):  # only what the lock installs, not data a user has locally
        for kwargs in draws:
            for reply in _PROBE_REPLIES:
                try:
                    _checker(name, type_id, _key(kwargs)).check_following(reply)
                except LookupError:
                    return "its checker needs nltk data that no PyPI package ships"
                except Exception as exc:  # noqa: BLE001  (any failure on a plain reply: the type cannot be scored)
                    return f"its checker fails on a plain reply ({type(exc).__name__}: {exc})"
    return None


def _key(kwargs: Mapping[str, Any]) -> str:
    return json.dumps(dict(kwargs), sort_keys=True)


@functools.cache
def _checker(name: str, type_id: str, kwargs_json: str) -> Any:
    instance = _instance(name, type_id)
    instance.build_description(**json.loads(kwargs_json))
    return instance


def available(name: str) -> list[str]:
    """The set's type ids that a constraint can use, in the benchmark's order.

    Args:
        name: The instruction set, `ifeval` or `ifbench`.

    Returns:
        The available type ids (those `unavailable` does not list).

    Raises:
        ValueError: When `name` is not a built-in set.
    """
    return [type_id for type_id in registry(name) if type_id not in unavailable(name)]


def check_problem(name: str, type_id: Any, kwargs: Any) -> str | None:
    """What is wrong with an `ifeval`/`ifbench` check's fields, or None.

    The fields must give an available type id, and exactly the keyword arguments its builder takes (a missing one
    would be drawn at random: the check would change), values the builder accepts and keeps as given.

    Args:
        name: The instruction set, `ifeval` or `ifbench` (the check's type).
        type_id: The check's `id` field, as read.
        kwargs: The check's `kwargs` field, as read.

    Returns:
        A message naming the field at fault and what is wrong, or None when the fields are fine.

    Raises:
        ValueError: When `name` is not a built-in set.
    """
    if not isinstance(type_id, str) or type_id not in registry(name):
        return f"field 'id' must be a {name} instruction type, got {type_id!r}; types: {', '.join(available(name))}"
    if type_id in unavailable(name):
        return f"{name} type {type_id!r} is unavailable: {unavailable(name)[type_id]}"
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        return f"field 'kwargs' must be a mapping of keyword arguments, got {kwargs!r}"
    expected = set(_instance(name, type_id).get_instruction_args_keys() or ())
    if set(kwargs) != expected:
        wanted = ", ".join(sorted(expected)) or "none"
        return f"{name} type {type_id!r} takes kwargs {wanted}; got {', '.join(sorted(kwargs)) or 'none'}"
    try:
        kept = _kept(name, type_id, kwargs)
    except Exception as exc:  # noqa: BLE001  (the builder's own validation, whatever it raises)
        return f"{name} type {type_id!r} refuses kwargs {dict(kwargs)!r}: {type(exc).__name__}: {exc}"
    if not kept:
        return f"{name} type {type_id!r} redraws kwargs {dict(kwargs)!r} at random: they cannot hold together"
    return None


def passes(name: str, type_id: str, kwargs: Mapping[str, Any], reply: str) -> bool:
    """The benchmark's strict verdict on the reply (an empty reply fails, as in if-verifiable).

    Args:
        name: The instruction set, `ifeval` or `ifbench`.
        type_id: The instruction type id.
        kwargs: The builder's keyword arguments, the check's parameters.
        reply: The reply, checked as it is.

    Returns:
        True if the reply is not blank and the benchmark's checker accepts it.
    """
    return bool(reply.strip()) and bool(_checker(name, type_id, _key(kwargs)).check_following(reply))


def _value(kwargs: Mapping[str, Any]) -> str:
    """The parameters as a constraint's value: "num_words=168, relation=less than" ("" without any)."""
    render = lambda v: ", ".join(map(str, v)) if isinstance(v, list | tuple) else str(v)  # noqa: E731
    return "; ".join(f"{k}={render(v)}" for k, v in sorted(kwargs.items()))


def draws(name: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The set's distinct parameter draws, `VALUES_PER_TYPE` draws a type, duplicates dropped.

    The draws come from fixed seeds; a draw the builder would not keep when given it back is dropped too.
    gatt.data.checks.load_constraints makes them constraints.

    Args:
        name: The instruction set, `ifeval` or `ifbench`.

    Returns:
        (type id, value, the builder's text, kwargs) for each available type and distinct value, in the benchmark's
        order; the value renders the parameters, e.g. "num_words=168; relation=less than" ("" without any).

    Raises:
        ValueError: When `name` is not a built-in set.
    """
    out = []
    for type_id in available(name):
        kept: dict[str, tuple[str, dict[str, Any]]] = {}  # value -> (the builder's text, kwargs)
        for i in range(VALUES_PER_TYPE):
            text, kwargs = _draw(name, type_id, i)
            if _kept(name, type_id, kwargs):
                kept.setdefault(_value(kwargs), (text, kwargs))
        out += [(type_id, value, text, kwargs) for value, (text, kwargs) in kept.items()]
    return out
