"""Programmatic checks of assistant replies, the constraints and probes built on them, and their YAML files."""

import copy
import fnmatch
import functools
import importlib
import os
import random
import re
import string
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gatt.data import constraint_sets
from gatt.data.language import detect_language, known_language_codes
from gatt.io.cli import BadInput
from gatt.io.files import atomic_path

if TYPE_CHECKING:
    pass

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
# The --constraints flag's help, wherever a constraint file is read.
CONSTRAINTS_HELP = (
    "a constraint YAML with split tags, or a built-in instruction set: ifeval, ifbench or ifeval,ifbench "
    "(docs/data.md; default: the built-in catalogue)"
)
_FUNCTION_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
SPLITS = ("train", "heldout")
_CONSTRAINT_KEYS = (
    "name",
    "instruction",
    "short",
    "checks",
    "probes",
    "family",
    "value",
    "split",
    "paraphrases",
    "changes",
)
_PROBE_KEYS = ("question", "checks")


class CheckError(BadInput):
    """A user's `python` check failed to run (could not be imported in this process, raised, or returned no bool)."""


@functools.cache
def resolve_function(spec: str) -> Callable[..., Any]:
    """The callable named "package.module:name", imported as `python -m` would (the current directory too)."""
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


# A constraint's own wordings of instruction events (`changes`: gatt/data/events.py), by the event they word.
WORDINGS = ("late", "replace", "revoke", "add")
SLOTS = {"late": {"instruction"}, "replace": {"instruction", "old"}, "revoke": {"old"}, "add": {"instruction"}}


def check_wordings(spec: object, where: str) -> dict[str, tuple[str, ...]]:
    """`{late|replace|revoke|add: [wording, ...]}` validated: non-empty strings using only their slots."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: expected a mapping of {', '.join(WORDINGS)} to lists of wordings, got {spec!r}")
    out = {}
    for key, texts in spec.items():
        if key not in WORDINGS:
            raise ValueError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(WORDINGS)}")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise ValueError(f"{where}.{key}: must be a non-empty list of non-empty strings, got {texts!r}")
        for text in texts:
            try:
                slots = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
            except ValueError as exc:
                raise ValueError(f"{where}.{key}: {text!r} is not a valid wording ({exc})") from None
            if unknown := slots - SLOTS[key]:
                allowed = ", ".join("{" + s + "}" for s in sorted(SLOTS[key]))
                raise ValueError(f"{where}.{key}: {text!r} uses {sorted(unknown)}; a {key} wording may use {allowed}")
        out[key] = tuple(texts)
    return out


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
        """Whether the reply satisfies this check."""
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
        """The YAML/JSON form: {"type": ..., **args}."""
        return {"type": self.type, **copy.deepcopy(dict(self.args))}

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "check") -> "Check":
        """Build a check from its YAML/JSON form; ValueError starting with `where` if it is malformed."""
        if not isinstance(spec, Mapping) or "type" not in spec:
            raise ValueError(f"{where}: expected a mapping with a 'type' key, got {spec!r}")
        args = {key: value for key, value in spec.items() if key != "type"}
        return cls(type=spec["type"], args=args, origin=where)


@dataclass(frozen=True)
class Probe:
    """An attribute question asked late in a dialogue, with the checks its answer must pass."""

    question: str
    checks: tuple[Check, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", tuple(self.checks))

    def to_dict(self) -> dict[str, Any]:
        """The YAML/JSON form: {"question": ..., "checks": [...]}."""
        return {"question": self.question, "checks": [check.to_dict() for check in self.checks]}

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "probe") -> "Probe":
        """Build a probe from its YAML/JSON form; ValueError starting with `where` if it is malformed."""
        _require_mapping(spec, _PROBE_KEYS, where)
        question = _require_text(spec, "question", where)
        checks = _parse_checks(spec, where, f"{where}.checks")
        if not checks:
            raise ValueError(f"{where}: 'checks' must be a non-empty list: a probe is scored by its checks")
        return cls(question=question, checks=checks)


CUSTOM_FAMILY = "custom"  # the family of a constraint given without a `family` key


@dataclass(frozen=True)
class Constraint:
    """An instruction that must hold for a whole dialogue, with the checks a reply under it must pass.

    A persona ("Act as Marie Curie.") may have no per-reply checks (`checks: []`) and only probes: it is
    then scored on its probe turns alone. `paraphrases` are other wordings of the full instruction: data
    generation draws one of them or `instruction` per dialogue, so a model learns the meaning, not a sentence.
    """

    name: str
    instruction: str
    short: str
    checks: tuple[Check, ...]
    probes: tuple[Probe, ...] = ()
    family: str = CUSTOM_FAMILY
    value: str = ""
    split: str = "train"
    paraphrases: tuple[str, ...] = ()
    # Its own wordings of the events that give it late, replace another by it, withdraw it or add it
    # (gatt/data/events.py; {late|replace|revoke|add: [...]}); an event without one uses gatt/events.yaml's.
    changes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Lists would make equal constraints compare unequal to loaded ones.
        # Checks built in code learn which constraint they belong to, so a failing python check names it.
        where = f"constraint {self.name!r}"
        object.__setattr__(self, "checks", tuple(_with_origin(c, where) for c in self.checks))
        probes = tuple(
            Probe(p.question, tuple(_with_origin(c, f"{where} probe {p.question!r}") for c in p.checks))
            for p in self.probes
        )
        object.__setattr__(self, "probes", probes)
        object.__setattr__(self, "paraphrases", tuple(self.paraphrases))
        object.__setattr__(self, "changes", {action: tuple(texts) for action, texts in self.changes.items()})
        if not self.checks and not self.probes:
            raise ValueError(
                f"{where}: needs checks, probes, or both (a persona without checks is scored on its probes)"
            )

    def to_dict(self) -> dict[str, Any]:
        """The constraint-file entry form, with family, value and split."""
        out: dict[str, Any] = {
            "name": self.name,
            "instruction": self.instruction,
            "short": self.short,
            "checks": [check.to_dict() for check in self.checks],
        }
        if self.probes:
            out["probes"] = [probe.to_dict() for probe in self.probes]
        out.update(family=self.family, value=self.value, split=self.split)
        if self.paraphrases:
            out["paraphrases"] = list(self.paraphrases)
        if self.changes:
            out["changes"] = {action: list(texts) for action, texts in self.changes.items()}
        return out

    def phrased(self, rng: random.Random) -> "Constraint":
        """This constraint with its full instruction drawn from `instruction` and its paraphrases."""
        if not self.paraphrases:
            return self
        return replace(self, instruction=rng.choice((self.instruction, *self.paraphrases)))

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "constraint") -> "Constraint":
        """Build a constraint from its file entry; ValueError starting with `where` and the name if malformed."""
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {spec!r}")
        name = _require_text(spec, "name", where)
        where = f"{where} {name!r}"
        _require_mapping(spec, _CONSTRAINT_KEYS, where)
        probes = spec.get("probes", [])
        if not isinstance(probes, list):
            raise ValueError(f"{where}: 'probes' must be a list, got {probes!r}")
        split = spec.get("split", "train")
        if split not in SPLITS:
            raise ValueError(f"{where}: 'split' must be one of {', '.join(SPLITS)}, got {split!r}")
        value = spec.get("value", "")
        if not isinstance(value, str):
            raise ValueError(f"{where}: 'value' must be a string, got {value!r}")
        checks = _parse_checks(spec, where, f"{where} checks")
        paraphrases = spec.get("paraphrases", [])
        if not isinstance(paraphrases, list) or not all(isinstance(t, str) and t.strip() for t in paraphrases):
            raise ValueError(f"{where}: 'paraphrases' must be a list of non-empty strings, got {paraphrases!r}")
        if not checks and not probes:
            raise ValueError(
                f"{where}: needs a non-empty 'checks' list, 'probes', or both "
                "(a persona with `checks: []` is scored on its probes)"
            )
        changes = check_wordings(spec.get("changes", {}), f"{where} changes")
        return cls(
            name=name,
            instruction=_require_text(spec, "instruction", where),
            short=_require_text(spec, "short", where),
            checks=checks,
            probes=tuple(Probe.from_dict(p, f"{where} probes[{k}]") for k, p in enumerate(probes)),
            family=_require_text(spec, "family", where) if "family" in spec else CUSTOM_FAMILY,
            value=value,
            split=split,
            paraphrases=tuple(paraphrases),
            changes=changes,
        )


def _with_origin(check: Check, origin: str) -> Check:
    return check if check.origin else replace(check, origin=origin)


def _require_mapping(spec: Any, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {spec!r}")
    for key in spec:
        if key not in allowed:
            raise ValueError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(allowed)}")


def _require_text(spec: Mapping[str, Any], key: str, where: str) -> str:
    value = spec.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


def _parse_checks(spec: Mapping[str, Any], where: str, prefix: str) -> tuple[Check, ...]:
    checks = spec.get("checks", [])
    if not isinstance(checks, list):
        raise ValueError(f"{where}: 'checks' must be a list of checks, got {checks!r}")
    return tuple(Check.from_dict(check, f"{prefix}[{j}]") for j, check in enumerate(checks))


def check_reply(reply: str, checks: Iterable[Check]) -> list[dict[str, Any]]:
    """One result per check, {"type": ..., **args, "passed": bool}: transcripts record why a reply failed."""
    return [{**check.to_dict(), "passed": check.passes(reply)} for check in checks]


def reply_checks(constraints: Sequence[Constraint], user_message: str) -> list[Check]:
    """Every constraint's reply checks, plus a probe's own checks when the user message asks one."""
    checks = [check for c in constraints for check in c.checks]
    for c in constraints:
        checks += [check for probe in c.probes if probe.question == user_message for check in probe.checks]
    return checks


def passes_all(reply: str, checks: Iterable[Check]) -> bool:
    """Whether the reply passes every check (True for no checks)."""
    return all(check.passes(reply) for check in checks)


def split_values(values: Sequence[str], heldout_fraction: float, seed: int) -> set[str]:
    """The held-out values of one family: a fixed-seed draw of round(fraction * n), none for single values."""
    if len(values) < 2:
        return set()
    count = max(1, round(heldout_fraction * len(values)))
    return set(random.Random(seed).sample(sorted(values), count))


def matching_families(
    constraints: Sequence[Constraint], patterns: Sequence[str], where: str, purpose: str = ""
) -> set[str]:
    """The families of `constraints` that the names or shell patterns (`ifbench:*`) match; ValueError starting
    with `where` for one that matches none ("no constraint of family F{purpose}; families: ...")."""
    known = {c.family for c in constraints}
    if unknown := [p for p in patterns if not fnmatch.filter(known, p)]:
        raise ValueError(
            f"{where}: no constraint of family {', '.join(map(repr, unknown))}{purpose}; "
            f"families: {', '.join(sorted(known))}"
        )
    return {f for pattern in patterns for f in fnmatch.filter(known, pattern)}


def hold_out_families(
    constraints: Sequence[Constraint], families: Sequence[str], source: str = "constraints"
) -> list[Constraint]:
    """The constraints with every value of `families` held out (split `heldout`): kept out of the GAtt data and
    reported as held-out families, e.g. a family the teacher cannot write (SmolLM2's languages: docs/smollm2.md).
    A family may be a shell pattern: `ifbench:*` holds out every IFBench type."""
    held = matching_families(constraints, families, source, " to hold out")
    return [replace(c, split="heldout") if c.family in held else c for c in constraints]


def _benchmark_constraints(name: str) -> list[Constraint]:
    """A benchmark set's constraints (gatt/data/constraint_sets.py): one per type and distinct parameter draw, its
    instruction and short form the builder's text, its family `SET:TYPE`, a fixed-seed quarter of a type's values
    held out."""
    by_type: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for type_id, value, text, kwargs in constraint_sets.draws(name):
        by_type.setdefault(type_id, []).append((value, text, kwargs))
    out = []
    for type_id, values in by_type.items():
        family = f"{name}:{type_id}"
        heldout = split_values(
            [value for value, _, _ in values], constraint_sets.HELDOUT_FRACTION, constraint_sets.SEED
        )
        for value, text, kwargs in values:
            out.append(
                Constraint(
                    name=f"{family} ({value})" if value else family,
                    instruction=text,
                    short=text,  # the benchmark writes one text; it is the short form too
                    checks=(Check(name, {"id": type_id, "kwargs": kwargs}),),
                    family=family,
                    value=value,
                    split="heldout" if value in heldout else "train",
                )
            )
    return out


def load_constraints(path: str | Path) -> list[Constraint]:
    """Read a constraint file (YAML: a top-level `constraints` list of entries, see docs/data.md, "Formats"), or the
    built-in instruction sets it names where no such file exists: `ifeval`, `ifbench` or `ifeval,ifbench`
    (gatt/data/constraint_sets.py)."""
    path = Path(path)
    names = str(path).split(",")
    if not path.exists() and all(name in BENCHMARK_CHECKS for name in names):
        return [c for name in dict.fromkeys(names) for c in _benchmark_constraints(name)]
    if not path.is_file():
        sets = ", ".join(BENCHMARK_CHECKS)
        raise FileNotFoundError(
            f"constraint file not found: {path} (built-in sets: {sets}, or several: ifeval,ifbench)"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("constraints"), list):
        raise ValueError(f"{path}: expected a mapping with a 'constraints' list at the top level")
    if set(data) != {"constraints"}:
        extra = ", ".join(repr(key) for key in data if key != "constraints")
        raise ValueError(f"{path}: unknown top-level key(s) {extra}; only 'constraints' is read")

    constraints: list[Constraint] = []
    first_index: dict[str, int] = {}
    for i, spec in enumerate(data["constraints"]):
        constraint = Constraint.from_dict(spec, f"{path}: constraints[{i}]")
        if constraint.name in first_index:
            raise ValueError(
                f"{path}: constraints[{i}] {constraint.name!r}: duplicate name, "
                f"already used by constraints[{first_index[constraint.name]}]"
            )
        first_index[constraint.name] = i
        constraints.append(constraint)
    return constraints


def dump_constraints(constraints: Iterable[Constraint], path: str | Path) -> None:
    """Write constraints in the file format of `load_constraints`, atomically (temporary file, then rename)."""
    path = Path(path)
    entries = [constraint.to_dict() for constraint in constraints]
    names = [entry["name"] for entry in entries]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"cannot write {path}: duplicate constraint names {duplicates} would not load back")

    with atomic_path(path) as tmp, open(tmp, "x", encoding="utf-8") as f:
        yaml.safe_dump({"constraints": entries}, f, sort_keys=False, allow_unicode=True, width=100)
