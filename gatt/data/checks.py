"""The constraints and probes built on the programmatic checks (gatt/data/check_types.py), and their YAML files."""

import fnmatch
import random
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gatt.data import constraint_sets
from gatt.data.check_types import BENCHMARK_CHECKS, Check
from gatt.data.check_types import CHECK_TYPES as CHECK_TYPES  # re-exported: the names gatt.data.checks had before
from gatt.data.check_types import CheckError as CheckError
from gatt.data.check_types import resolve_function as resolve_function
from gatt.data.language import detect_language as detect_language
from gatt.io.files import atomic_path

# The --constraints flag's help, wherever a constraint file is read.
CONSTRAINTS_HELP = (
    "a constraint YAML with split tags, or a built-in instruction set: ifeval, ifbench or ifeval,ifbench "
    "(docs/data.md; default: the built-in catalogue)"
)
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


# A constraint's own wordings of instruction events (`changes`: gatt/data/events.py), by the event they word.
WORDINGS = ("late", "replace", "revoke", "add")
SLOTS = {"late": {"instruction"}, "replace": {"instruction", "old"}, "revoke": {"old"}, "add": {"instruction"}}


def check_wordings(spec: object, where: str) -> dict[str, tuple[str, ...]]:
    """`{late|replace|revoke|add: [wording, ...]}` validated: non-empty strings using only their slots.

    A late or add wording may use `{instruction}`, a replace wording `{instruction}` and `{old}`, a revoke
    wording `{old}`.

    Args:
        spec: The wordings as read: a mapping of event (late, replace, revoke, add) to a list of wordings.
        where: Where they were read, the start of every error message.

    Returns:
        The wordings by event, each list as a tuple.

    Raises:
        ValueError: When `spec` is not a mapping, has an unknown key, maps a key to anything but a non-empty list
            of non-empty strings, or has a wording that is not a valid format string or uses a slot its event lacks.
    """
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


@dataclass(frozen=True)
class Probe:
    """An attribute question asked late in a dialogue, with the checks its answer must pass."""

    question: str
    checks: tuple[Check, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", tuple(self.checks))

    def to_dict(self) -> dict[str, Any]:
        """The YAML/JSON form of this probe.

        Returns:
            {"question": ..., "checks": [...]}, each check in its own YAML/JSON form.
        """
        return {"question": self.question, "checks": [check.to_dict() for check in self.checks]}

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "probe") -> "Probe":
        """Build a probe from its YAML/JSON form.

        Args:
            spec: The YAML/JSON form, {"question": ..., "checks": [...]}.
            where: Where it was read (default "probe"): the start of error messages.

        Returns:
            The probe.

        Raises:
            ValueError: When it is malformed (not a mapping, an unknown key, no question, no non-empty list of valid
                checks); the message starts with `where`.
        """
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
    # (gatt/data/events.py; {late|replace|revoke|add: [...]}); an event without one uses gatt/data/events.yaml's.
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
        """The constraint-file entry form, with family, value and split.

        Returns:
            The entry: name, instruction, short, checks, family, value and split, plus probes, paraphrases and
            changes where the constraint has them.
        """
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
        """This constraint with its full instruction drawn from `instruction` and its paraphrases.

        Args:
            rng: The random source of the draw.

        Returns:
            This constraint itself when it has no paraphrases, else a copy with the drawn instruction.
        """
        if not self.paraphrases:
            return self
        return replace(self, instruction=rng.choice((self.instruction, *self.paraphrases)))

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], where: str = "constraint") -> "Constraint":
        """Build a constraint from its file entry.

        Args:
            spec: The file entry (docs/data.md, "Formats").
            where: Where it was read (default "constraint"): the start of error messages, followed by the name.

        Returns:
            The constraint.

        Raises:
            ValueError: When the entry is malformed; the message starts with `where` and the name.
        """
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
    """One result per check: transcripts record why a reply failed.

    Args:
        reply: The assistant reply.
        checks: The checks to run.

    Returns:
        One dict per check, in order: {"type": ..., **args, "passed": bool}.
    """
    return [{**check.to_dict(), "passed": check.passes(reply)} for check in checks]


def reply_checks(constraints: Sequence[Constraint], user_message: str) -> list[Check]:
    """Every constraint's reply checks, plus a probe's own checks when the user message asks one.

    Args:
        constraints: The constraints in force.
        user_message: The user message the reply answers; a probe whose question is this text adds its checks.

    Returns:
        The constraints' reply checks in order, then the checks of the probes asked.
    """
    checks = [check for c in constraints for check in c.checks]
    for c in constraints:
        checks += [check for probe in c.probes if probe.question == user_message for check in probe.checks]
    return checks


def passes_all(reply: str, checks: Iterable[Check]) -> bool:
    """Whether the reply passes every check.

    Args:
        reply: The assistant reply.
        checks: The checks to run.

    Returns:
        True if every check passes (True for no checks).
    """
    return all(check.passes(reply) for check in checks)


def split_values(values: Sequence[str], heldout_fraction: float, seed: int) -> set[str]:
    """The held-out values of one family: a fixed-seed draw of round(fraction * n), none for single values.

    Args:
        values: The family's values.
        heldout_fraction: The fraction of the values to hold out; at least one is held out.
        seed: The seed of the draw.

    Returns:
        The held-out values (empty for fewer than two values).
    """
    if len(values) < 2:
        return set()
    count = max(1, round(heldout_fraction * len(values)))
    return set(random.Random(seed).sample(sorted(values), count))


def matching_families(
    constraints: Sequence[Constraint], patterns: Sequence[str], where: str, purpose: str = ""
) -> set[str]:
    """The families of `constraints` that the names or shell patterns (`ifbench:*`) match.

    Args:
        constraints: The constraints whose families are matched.
        patterns: Family names or shell patterns.
        where: The start of the error message.
        purpose: Text put after the family in the error message (default ""; e.g. " to hold out").

    Returns:
        The families matched.

    Raises:
        ValueError: For a name or pattern that matches no family; the message starts with `where`
            ("no constraint of family F{purpose}; families: ...").
    """
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
    """The constraints with every value of `families` held out (split `heldout`).

    A held-out family is kept out of the GAtt data and reported as a held-out family, e.g. a family the teacher
    cannot write (SmolLM2's languages: docs/smollm2.md).

    Args:
        constraints: The constraints.
        families: The families to hold out; a family may be a shell pattern: `ifbench:*` holds out every IFBench
            type.
        source: Where the families were given, the start of the error message (default "constraints").

    Returns:
        The constraints in order, those of a family held out with split `heldout`, the others unchanged.

    Raises:
        ValueError: When a family or pattern matches no constraint's family.
    """
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
    """Read a constraint file, or the built-in instruction sets it names where no such file exists.

    Args:
        path: A constraint file (YAML: a top-level `constraints` list of entries, see docs/data.md, "Formats"), or
            built-in instruction sets: `ifeval`, `ifbench` or `ifeval,ifbench` (gatt/data/constraint_sets.py).

    Returns:
        The constraints, in the file's order.

    Raises:
        FileNotFoundError: When there is no such file and the path names no built-in sets.
        ValueError: When the file is not valid YAML, has no top-level `constraints` list or other top-level keys,
            has a malformed entry, or two entries share a name.
    """
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
    """Write constraints in the file format of `load_constraints`, atomically (temporary file, then rename).

    Args:
        constraints: The constraints to write.
        path: The file to write.

    Raises:
        ValueError: When two constraints share a name: the file would not load back.
    """
    path = Path(path)
    entries = [constraint.to_dict() for constraint in constraints]
    names = [entry["name"] for entry in entries]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"cannot write {path}: duplicate constraint names {duplicates} would not load back")

    with atomic_path(path) as tmp, open(tmp, "x", encoding="utf-8") as f:
        yaml.safe_dump({"constraints": entries}, f, sort_keys=False, allow_unicode=True, width=100)
