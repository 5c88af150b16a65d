"""The programmatic checks of one reply (`Check`): each check type and its arguments (`CHECK_TYPES`), validated when a
check is built so that a bad one is named at load time, and how each type judges a reply (a language, a pattern, an
opening or ending, words, caps, length, a user's Python function, IFEval's and IFBench's own checkers)."""

import copy
import functools
import importlib
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatt.data import constraint_sets
from gatt.data.language import detect_language, known_language_codes
from gatt.io.cli import BadInput

CHECK_TYPES: dict[str, tuple[str, ...]] = {
    "language": ("code",),
    "regex": ("pattern",),
    "startswith": ("text",),
    "endswith": ("text",),
    "contains_any": ("words",),
    "not_contains": ("words",),
    "all_caps": (),
    "max_words": ("n",),
    "min_words": ("n",),
    "max_sentences": ("n",),
    "python": ("function",),
    "ifeval": ("id",),  # IFEval's own checker of one instruction type (gatt/data/constraint_sets.py)
    "ifbench": ("id",),  # IFBench's
}


OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {"python": ("args",), "ifeval": ("kwargs",), "ifbench": ("kwargs",)}


BENCHMARK_CHECKS = ("ifeval", "ifbench")


_FUNCTION_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class CheckError(BadInput):
    """A user's `python` check failed to run (could not be imported in this process, raised, or returned no bool)."""


@functools.cache
def resolve_function(spec: str) -> Callable[..., Any]:
    """The callable named "package.module:name", imported as `python -m` would (the current directory too).

    Args:
        spec: The function's name, "package.module:name"; the name may be dotted (an attribute of an attribute).

    Returns:
        The callable (cached: each spec is resolved once per process).

    Raises:
        ModuleNotFoundError: When the module cannot be imported, from the current directory either.
        AttributeError: When the module has no such attribute.
        TypeError: When the object named is not callable.
    """
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        # `python script.py` and `accelerate launch` put the script's folder on sys.path, not the current one.
        if os.getcwd() in sys.path:
            raise
        sys.path.append(os.getcwd())
        module = importlib.import_module(module_name)
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is a {type(target).__name__}, not a function")
    return target


@functools.cache
def _words_regex(words: tuple[str, ...]) -> re.Pattern[str]:
    # Look-arounds instead of \b so words that start or end with punctuation ("C++") still match whole.
    alternatives = (r"\s+".join(re.escape(part) for part in word.split()) for word in words)
    return re.compile("|".join(rf"(?<!\w){alt}(?!\w)" for alt in alternatives), re.IGNORECASE)


def _count_sentences(text: str) -> int:
    return sum(1 for piece in re.split(r"[.!?]+", text) if piece.strip())


def _field_problem(key: str, value: Any) -> str | None:
    """What is wrong with one check field's value, or None if it is fine."""
    if key == "code" and (not isinstance(value, str) or value not in known_language_codes()):
        known = ", ".join(sorted(known_language_codes()))
        return f"must be a lower-case ISO 639-1 code known to the detector, got {value!r}; known: {known}"
    if key in ("pattern", "text") and (not isinstance(value, str) or not value):
        return f"must be a non-empty string, got {value!r}"
    if key == "pattern":
        try:
            re.compile(value)
        except re.error as exc:
            return f"is not a valid regular expression ({exc}): {value!r}"
    words_problem = f"must be a non-empty list of non-empty strings, got {value!r}"
    if key == "words" and not (isinstance(value, list | tuple) and value):
        return words_problem
    if key == "words" and not all(isinstance(word, str) and word.strip() for word in value):
        return words_problem
    # bool is an int subclass; `n: true` in YAML is a mistake, not 1.
    if key == "n" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        return f"must be a positive integer, got {value!r}"
    if key == "function":
        if not isinstance(value, str) or not _FUNCTION_SPEC.match(value):
            return f'must be "package.module:name", got {value!r}'
        try:
            resolve_function(value)
        except Exception as exc:  # noqa: BLE001  (whatever the import raises, the user needs its text)
            return f"{value!r} cannot be imported: {type(exc).__name__}: {exc}"
    if key == "args" and not (isinstance(value, Mapping) and all(isinstance(k, str) for k in value)):
        return f"must be a mapping of keyword arguments, got {value!r}"
    return None


def _validated_args(check_type: str, args: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(check_type, str) or check_type not in CHECK_TYPES:
        expected = ", ".join(sorted(CHECK_TYPES))
        raise ValueError(f"{where}: unknown check type {check_type!r}; expected one of {expected}")
    required = CHECK_TYPES[check_type]
    for key in args:
        if key not in required + OPTIONAL_FIELDS.get(check_type, ()):
            allowed = ", ".join(required + OPTIONAL_FIELDS.get(check_type, ())) or "none"
            raise ValueError(f"{where}: unknown field {key!r} for check type {check_type!r}; allowed: {allowed}")
    for key in required:
        if key not in args:
            raise ValueError(f"{where}: check type {check_type!r} needs field {key!r}")
    if check_type in BENCHMARK_CHECKS:
        args = {**args, "kwargs": args.get("kwargs", {})}
        if problem := constraint_sets.check_problem(check_type, args["id"], args["kwargs"]):
            raise ValueError(f"{where}: {problem}")
    for key in args:
        problem = _field_problem(key, args[key])
        if problem:
            raise ValueError(f"{where}: field {key!r} {problem}")
    # A private copy: the caller's lists must not change a frozen check behind its back.
    out = copy.deepcopy(dict(args))
    if "words" in out:
        out["words"] = list(out["words"])
    return out


@dataclass(frozen=True)
class Check:
    """One programmatic test of a reply, e.g. Check("language", {"code": "fr"}).

    A `python` check calls a user's function, `Check("python", {"function": "pkg.mod:name", "args": {...}})`:
    `name(reply, **args)` must return a bool. It is imported by name in every process that runs it.
    """

    type: str
    args: Mapping[str, Any] = field(default_factory=dict)
    origin: str = field(default="", compare=False, repr=False)  # where it was defined, for error messages

    def __post_init__(self) -> None:
        # Validate here too, so a Check built in code cannot fail later inside `passes`.
        where = self.origin or f"check {self.type!r}"
        object.__setattr__(self, "args", _validated_args(self.type, self.args, where))

    def passes(self, reply: str) -> bool:
        """Whether the reply satisfies this check.

        Args:
            reply: The assistant reply; stripped of surrounding whitespace first, except for a `python` check,
                whose function gets it as given.

        Returns:
            True if the reply passes.

        Raises:
            CheckError: When a `python` check's function or a benchmark's checker raises, or a `python` check's
                function returns no bool.
        """
        text = reply.strip()
        args = self.args
        match self.type:
            case "language":
                return bool(text) and detect_language(text) == args["code"]
            case "regex":
                return re.search(args["pattern"], text) is not None
            case "startswith":
                return text.startswith(args["text"])
            case "endswith":
                return text.endswith(args["text"])
            case "contains_any":
                return _words_regex(tuple(args["words"])).search(text) is not None
            case "not_contains":
                return _words_regex(tuple(args["words"])).search(text) is None
            case "all_caps":
                return any(char.isupper() or char.islower() for char in text) and text == text.upper()
            case "max_words":
                return len(text.split()) <= args["n"]
            case "min_words":
                return len(text.split()) >= args["n"]
            case "max_sentences":
                return _count_sentences(text) <= args["n"]
            case "python":
                return self._call(reply)
            case "ifeval" | "ifbench":
                return self._benchmark(text)
        raise AssertionError(f"unhandled check type {self.type!r}")  # CHECK_TYPES and this match disagree

    def _call(self, reply: str) -> bool:
        function = self.args["function"]
        where = self.origin or "check"
        try:
            result = resolve_function(function)(reply, **self.args.get("args", {}))
        except Exception as exc:  # noqa: BLE001  (a user's function: report whatever it raised, and where)
            raise CheckError(f"{where}: python check {function!r} raised {type(exc).__name__}: {exc}") from exc
        if type(result).__name__ not in ("bool", "bool_"):  # Python's or numpy's
            raise CheckError(f"{where}: python check {function!r} returned {type(result).__name__}, not a bool")
        return bool(result)

    def _benchmark(self, text: str) -> bool:
        try:
            return constraint_sets.passes(self.type, self.args["id"], self.args["kwargs"], text)
        except Exception as exc:  # noqa: BLE001  (the benchmark's checker: report whatever it raised, and where)
            where = self.origin or "check"
            raise CheckError(
                f"{where}: {self.type} checker {self.args['id']!r} raised {type(exc).__name__}: {exc}"
            ) from exc

    def to_dict(self) -> dict[str, Any]:
        """The YAML/JSON form of this check.

        Returns:
            {"type": ..., **args}, the arguments deep-copied.
        """
        return {"type": self.type, **copy.deepcopy(dict(self.args))}

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "check") -> "Check":
        """Build a check from its YAML/JSON form.

        Args:
            spec: The YAML/JSON form, {"type": ..., **args}.
            where: Where it was read (default "check"): the start of error messages, kept as the check's origin.

        Returns:
            The check.

        Raises:
            ValueError: When it is malformed (not a mapping with a "type" key, an unknown type, a missing, unknown
                or invalid field); the message starts with `where`.
        """
        if not isinstance(spec, Mapping) or "type" not in spec:
            raise ValueError(f"{where}: expected a mapping with a 'type' key, got {spec!r}")
        args = {key: value for key, value in spec.items() if key != "type"}
        return cls(type=spec["type"], args=args, origin=where)
