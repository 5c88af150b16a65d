"""The constraint catalogue: the toy world's instruction space, built from data_gen/data/catalogue.yaml.

The space is wide on purpose: GAtt should teach one skill, "keep doing what the system message says", and a
small model learns a skill only from many instances of it. So the catalogue has families of four kinds (copy
a string, a form, a language, a persona), each a rule with values drawn from a pool; the paper's families
(hobby, language, public figure) are three of them. Every constraint has a full instruction, paraphrases, a
shortened form ("Always answer in French." / "Language: French"), checks for every reply given under it, and
attribute probes. The families and their pools are data (catalogue.yaml); this module reads them, checks
them and builds the constraints; `data_gen.toy_world` obeys them through each family's `reply` rule.

Each family's values are split into train and held-out values with a fixed seed, and whole families
(HELDOUT_FAMILIES, of every kind) are held out: neither ever appears in GAtt data, only in the base SFT
corpus as a chat model would see them, so the evaluation measures whether GAtt's persistence transfers.
"""

from __future__ import annotations

import itertools
import random
import string
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from data_gen import builtin_data
from data_gen.builtin_data import DataFileError
from gatt.data.check_types import Check
from gatt.data.checks import Constraint, Probe, split_values
from gatt.data.events import (
    SHORT_PROB,
    instruction_text,  # noqa: F401  (data_gen's name for it)
)
from gatt.data.events import conflict as _gatt_conflict

KINDS = ("copy", "form", "language", "persona")
# What a family's `reply` rule may say (catalogue.yaml's header explains each).
REPLY_KEYS = (
    "language",
    "line",
    "line_first",
    "answer",
    "replace",
    "structure",
    "words",
    "prefix",
    "suffix",
    "case",
    "wrap",
)
STRUCTURES = ("first", "numbered", "bulleted")
CASES = ("upper", "lower", "title")
_FAMILY_KEYS = (
    "family",
    "kind",
    "values",
    "value",
    "instruction",
    "paraphrases",
    "short",
    "slot",
    "conflicts",
    "reply",
    "checks",
    "probes",
    "probe_checks",
)
_REQUIRED = ("family", "kind", "instruction", "short", "slot", "reply", "checks", "probes")


@dataclass(frozen=True)
class ReplyRule:
    """How the scripted responder obeys a family (catalogue.yaml `reply`); templates are filled per value."""

    language: bool = False
    line: str = ""
    line_first: bool = False
    answer: str = ""
    replace: Mapping[str, str] = field(default_factory=dict)
    structure: str = ""
    words: str = ""  # a template of the word limit ("{n}"): the reply cut to its first n words
    prefix: str = ""
    suffix: str = ""
    case: str = ""
    wrap: tuple[str, str] | None = None


@dataclass(frozen=True)
class Family:
    """One rule of the instruction space: its kind, values (each with its attributes) and how it is obeyed."""

    name: str
    kind: str
    values: Mapping[str, Mapping[str, Any]]  # value -> its attributes, in pool order
    slot: str
    conflicts: frozenset[str]
    reply: ReplyRule
    spec: Mapping[str, Any]  # the catalogue entry, whose templates build each value's constraint

    def constraint(self, value: str, attributes: Mapping[str, Any]) -> Constraint:
        """The constraint of one value: every template of the entry filled with it.

        Args:
            value: The value, one of `values`.
            attributes: The value's attributes, filled into the templates beside it.

        Returns:
            The constraint, named `family:value`.

        Raises:
            DataFileError: When a template cannot be filled or a check is malformed.
        """
        spec, where = self.spec, f"{_catalogue_file()}: family {self.name!r}"
        fill = {"value": value, **attributes}
        checks = tuple(_checks(spec["checks"], fill, f"{where} checks"))
        probe_checks = (
            _checks(spec["probe_checks"], fill, f"{where} probe_checks") if "probe_checks" in spec else checks
        )
        return Constraint(
            name=f"{self.name}:{value}",
            instruction=_fill(spec["instruction"], fill, where),
            short=_fill(spec["short"], fill, where),
            paraphrases=tuple(_fill(text, fill, where) for text in spec.get("paraphrases", [])),
            checks=checks,
            probes=tuple(Probe(question, tuple(probe_checks)) for question in spec["probes"]),
            family=self.name,
            value=value,
        )


def _catalogue_file() -> str:
    return str(builtin_data.DATA_DIR / "catalogue.yaml")


def _fill(template: Any, fill: Mapping[str, Any], where: str) -> Any:
    """A template with {value} and the value's attributes filled in; a lone placeholder of an attribute that is not
    text is that attribute itself ("{names}": the list, "{n}": the number)."""
    if isinstance(template, list):
        return [item for part in template for item in _as_list(_fill(part, fill, where))]
    if not isinstance(template, str):
        return template
    if template.startswith("{") and template.endswith("}") and isinstance(fill.get(template[1:-1]), list | int):
        attribute = fill[template[1:-1]]
        return list(attribute) if isinstance(attribute, list) else attribute
    try:
        return template.format(**fill)
    except (KeyError, IndexError, ValueError) as error:
        raise DataFileError(
            f"{where}: template {template!r} cannot be filled ({error!r}); has {sorted(fill)}"
        ) from None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _checks(specs: Any, fill: Mapping[str, Any], where: str) -> list[Check]:
    if not isinstance(specs, list):
        raise DataFileError(f"{where}: expected a list of checks, got {specs!r}")
    out = []
    for index, spec in enumerate(specs):
        filled = {key: _fill(item, fill, f"{where}[{index}]") for key, item in dict(spec).items()}
        try:
            out.append(Check.from_dict(filled, f"{where}[{index}]"))
        except ValueError as error:
            raise DataFileError(str(error)) from None
    return out


def _pool_values(name: str, spec: Any) -> list[tuple[str, dict[str, Any]]]:
    """A pool's values, each with its attributes: a list, a mapping value -> attributes, or a seeded generator."""
    where = f"{_catalogue_file()}: pools.{name}"
    if isinstance(spec, list) and spec and all(isinstance(v, str | int) for v in spec):
        values = [(str(v), {}) for v in spec]
    elif isinstance(spec, dict) and "product" in spec:
        parts, fmt = spec["product"], spec.get("format")
        if not (isinstance(parts, list) and all(isinstance(p, list) and p for p in parts) and isinstance(fmt, str)):
            raise DataFileError(f"{where}: a product needs `product: [[...], ...]` and a `format`, got {spec!r}")
        values = [(fmt.format(*combo), {}) for combo in itertools.product(*parts)]
    elif isinstance(spec, dict) and "generate" in spec:
        values = [(v, {}) for v in _generate(spec, where)]
    elif isinstance(spec, dict) and spec and all(isinstance(a, dict) for a in spec.values()):
        values = [(str(v), dict(attributes)) for v, attributes in spec.items()]
    else:
        raise DataFileError(f"{where}: expected a list, a mapping of values to attributes or a generator, got {spec!r}")
    names = [v for v, _ in values]
    if len(set(names)) != len(names):
        raise DataFileError(f"{where}: values repeat: {sorted({v for v in names if names.count(v) > 1})}")
    return values


def _generate(spec: Mapping[str, Any], where: str) -> list[str]:
    """Distinct procedural values: codes (two capitals and two digits, KX47) or numbers, from a seeded draw."""
    kind, count, rng = spec["generate"], spec.get("count"), random.Random(spec.get("seed", 0))
    if not isinstance(count, int) or count < 1:
        raise DataFileError(f"{where}: `count` must be a positive integer, got {count!r}")
    if kind == "number":
        low, high = spec.get("low", 0), spec.get("high", 99)
        if high - low + 1 < count:
            raise DataFileError(f"{where}: {count} distinct numbers do not fit in {low}..{high}")
        return [str(n) for n in rng.sample(range(low, high + 1), count)]
    if kind == "code":
        out: list[str] = []
        while len(out) < count:
            code = "".join(rng.choices(string.ascii_uppercase, k=2) + rng.choices(string.digits, k=2))
            if code not in out:
                out.append(code)
        return out
    raise DataFileError(f"{where}: unknown generator {kind!r}; expected code or number")


def _reply_rule(spec: Any, where: str, lines: Mapping[str, Any]) -> ReplyRule:
    if not isinstance(spec, dict):
        raise DataFileError(f"{where}: expected a mapping, got {spec!r}")
    if unknown := [key for key in spec if key not in REPLY_KEYS]:
        raise DataFileError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(REPLY_KEYS)}")
    for key in ("line", "answer"):
        if key in spec and spec[key] not in lines:
            raise DataFileError(f"{where}.{key}: no line {spec[key]!r} in toy_world.yaml; lines: {', '.join(lines)}")
    if spec.get("structure", "") not in ("", *STRUCTURES):
        raise DataFileError(f"{where}.structure: expected one of {', '.join(STRUCTURES)}, got {spec['structure']!r}")
    if spec.get("case", "") not in ("", *CASES):
        raise DataFileError(f"{where}.case: expected one of {', '.join(CASES)}, got {spec['case']!r}")
    if not isinstance(spec.get("words", ""), str):
        raise DataFileError(
            f"{where}.words: expected a template of a word count ('{{n}}' or '5'), got {spec['words']!r}"
        )
    wrap = spec.get("wrap")
    if wrap is not None and not (isinstance(wrap, list) and len(wrap) == 2 and all(isinstance(w, str) for w in wrap)):
        raise DataFileError(f"{where}.wrap: expected [left, right], got {wrap!r}")
    replacements = spec.get("replace", {})
    if not isinstance(replacements, dict) or not all(isinstance(k, str) and k for k in replacements):
        raise DataFileError(f"{where}.replace: expected a mapping of text to text, got {replacements!r}")
    return ReplyRule(**{**spec, "wrap": tuple(wrap) if wrap else None})


def _family(spec: Mapping[str, Any], pools: Mapping[str, Any], lines: Mapping[str, Any]) -> Family:
    name = spec["family"]
    where = f"{_catalogue_file()}: family {name!r}"
    if unknown := [key for key in spec if key not in _FAMILY_KEYS]:
        raise DataFileError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(_FAMILY_KEYS)}")
    if missing := [key for key in _REQUIRED if key not in spec]:
        raise DataFileError(f"{where}: missing {', '.join(missing)}")
    if ("values" in spec) == ("value" in spec):
        raise DataFileError(f"{where}: needs either `values` (a pool's name) or one `value`")
    if spec["kind"] not in KINDS:
        raise DataFileError(f"{where}: kind must be one of {', '.join(KINDS)}, got {spec['kind']!r}")
    if not isinstance(spec["probes"], list) or not all(isinstance(q, str) and q for q in spec["probes"]):
        raise DataFileError(f"{where}: probes must be a list of questions, got {spec['probes']!r}")
    if "values" in spec:
        if spec["values"] not in pools:
            raise DataFileError(f"{where}: no pool {spec['values']!r}; pools: {', '.join(pools)}")
        values = _pool_values(spec["values"], pools[spec["values"]])
    else:
        values = [(str(spec["value"]), {})]
    phrases = builtin_data.language_phrases()
    for value, attributes in values:
        if "code" in attributes and attributes["code"] not in phrases:
            raise DataFileError(
                f"{where}: value {value!r}: code {attributes['code']!r} is none of the toy world's languages "
                f"({', '.join(phrases)})"
            )
    # A language value ({code}) carries its phrases (greeting, thanks, ...) as attributes too.
    values = [(v, {**phrases.get(a.get("code", ""), {}), **a}) for v, a in values]
    conflicts = spec.get("conflicts", [])
    if not isinstance(conflicts, list) or not all(isinstance(c, str) for c in conflicts):
        raise DataFileError(f"{where}: conflicts must be a list of slots or families, got {conflicts!r}")
    return Family(
        name=name,
        kind=spec["kind"],
        values=dict(values),
        slot=str(spec["slot"]),
        conflicts=frozenset(conflicts),
        reply=_reply_rule(spec["reply"], f"{where}: reply", lines),
        spec=spec,
    )


def load_families() -> dict[str, Family]:
    """The catalogue's families by name, in file order.

    Returns:
        {family name: Family}.

    Raises:
        DataFileError: When a family is malformed or defined twice, naming the family and key at fault.
    """
    pools, lines = builtin_data.pools(), builtin_data.lines()
    families: dict[str, Family] = {}
    for spec in builtin_data.family_specs():
        if spec["family"] in families:
            raise DataFileError(f"{_catalogue_file()}: family {spec['family']!r} is defined twice")
        families[spec["family"]] = _family(spec, pools, lines)
    return families


FAMILY_RULES: dict[str, Family] = load_families()
FAMILIES: tuple[str, ...] = tuple(FAMILY_RULES)
# The held-out tiers of catalogue.yaml `heldout_tiers` (its comment says what each measures): the tier's name -> its
# families, the kind tier ("kind") as every family of its kind.
TIERS = ("wordings", "behaviours", "kind")


def load_heldout_tiers(spec: Any = None, where: str = "") -> dict[str, tuple[str, ...]]:
    """The held-out tiers: tier -> its families, in catalogue order.

    Args:
        spec: a `heldout_tiers` mapping (default: catalogue.yaml's): `wordings` and `behaviours` lists of families,
            `kind` one of KINDS.
        where: where `spec` comes from, for errors (default: catalogue.yaml's section).

    Returns:
        {"wordings": (...), "behaviours": (...), "kind": (every family of that kind)}.

    Raises:
        DataFileError: a missing or unknown key, an unknown family or kind, or a family in two tiers.
    """
    if spec is None:
        spec, where = builtin_data.heldout_tiers()
    if not isinstance(spec, dict) or set(spec) != set(TIERS):
        raise DataFileError(f"{where}: expected the keys {', '.join(TIERS)}, got {spec!r}")
    if spec["kind"] not in KINDS:
        raise DataFileError(f"{where}: kind: expected one of {', '.join(KINDS)}, got {spec['kind']!r}")
    tiers = {"kind": tuple(name for name, family in FAMILY_RULES.items() if family.kind == spec["kind"])}
    for tier in ("wordings", "behaviours"):
        names = spec[tier]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise DataFileError(f"{where}: {tier}: expected a non-empty list of families, got {names!r}")
        unknown = sorted(set(names) - set(FAMILIES))
        if unknown:
            raise DataFileError(f"{where}: {tier}: unknown families {unknown}")
        tiers[tier] = tuple(name for name in FAMILIES if name in names)
    named = [name for tier in TIERS for name in tiers[tier]]
    twice = sorted({name for name in named if named.count(name) > 1})
    if twice:
        raise DataFileError(f"{where}: families in two tiers: {twice}")
    return {tier: tiers[tier] for tier in TIERS}


HELDOUT_TIERS: dict[str, tuple[str, ...]] = load_heldout_tiers()
# Whole families GAtt data never shows by default (the paper's zero-shot case): every held-out tier's.
HELDOUT_FAMILIES: tuple[str, ...] = tuple(name for names in HELDOUT_TIERS.values() for name in names)


def check_signature(name: str) -> tuple[tuple[str, str], ...]:
    """A family's checks as written in catalogue.yaml (type and templated parameters).

    Two families with one signature ask the same behaviour of a reply, with other values.

    Args:
        name: The family.

    Returns:
        (check type, repr of the check's sorted items) per check, sorted.
    """
    spec = next(spec for spec in builtin_data.family_specs() if spec["family"] == name)
    return tuple(sorted((check["type"], repr(sorted(check.items()))) for check in spec["checks"]))


def tier_violations(tiers: Mapping[str, Sequence[str]]) -> list[str]:
    """What makes a tier selection measure something else than it says, one line each.

    Args:
        tiers: Tier -> its families (`load_heldout_tiers`); a family in no tier is trained.

    Returns:
        One line per problem: a held-out behaviour whose checks a trained family (in no tier) has, or a held-out
        wording whose check type no trained family has; [] where there is none.
    """
    held = {name for names in tiers.values() for name in names}
    trained = [name for name in FAMILIES if name not in held]
    signatures = {check_signature(name): name for name in trained}
    trained_types = {kind for name in trained for kind, _ in check_signature(name)}
    problems = [
        f"behaviours: {name} has the checks of trained family {signatures[check_signature(name)]}"
        for name in tiers["behaviours"]
        if check_signature(name) in signatures
    ]
    problems += [
        f"wordings: {name}'s check type is no trained family's: a behaviour, not a wording"
        for name in tiers["wordings"]
        if not {kind for kind, _ in check_signature(name)} <= trained_types
    ]
    return problems


# English name -> (ISO 639-1 code, the language's own name): the toy world's languages besides English.
LANGUAGES: dict[str, tuple[str, str]] = {
    value: (attributes["code"], attributes["native"]) for value, attributes in FAMILY_RULES["language"].values.items()
}


def _takes(family: Family, other: Family) -> bool:
    """Whether `family` lists `other` (its name, its slot, or `line` for a family with a line) as a conflict."""
    return bool({other.name, other.slot, *(("line",) if other.reply.line else ())} & family.conflicts)


def conflict(family_a: str, family_b: str) -> bool:
    """Whether two families cannot hold together.

    Args:
        family_a: A family's name.
        family_b: Another family's name.

    Returns:
        For two catalogue families, whether they are different and share a slot or list each other; otherwise
        whether gatt.data.events knows the pair (a benchmark's conflicting types).
    """
    a, b = FAMILY_RULES.get(family_a), FAMILY_RULES.get(family_b)
    if a is not None and b is not None:
        return a.name != b.name and (a.slot == b.slot or _takes(a, b) or _takes(b, a))
    return _gatt_conflict(family_a, family_b)


def family_table() -> dict[str, dict[str, Any]]:
    """The families' kinds and conflicts: what gatt reads (gatt/eval/builtin/families.yaml).

    Returns:
        Family -> {kind, conflicts: the families it never holds with}.
    """
    return {
        name: {"kind": family.kind, "conflicts": [other for other in FAMILIES if conflict(name, other)]}
        for name, family in FAMILY_RULES.items()
    }


def catalogue(
    *, heldout_fraction: float = 0.25, seed: int = 0, heldout_families: Sequence[str] = HELDOUT_FAMILIES
) -> list[Constraint]:
    """Every catalogue constraint, tagged split="train" or "heldout" (held-out values and whole held-out families).

    Args:
        heldout_fraction: The share of each family's values held out (default 0.25).
        seed: The seed of the value split, combined with each family's name.
        heldout_families: The families held out whole (default HELDOUT_FAMILIES).

    Returns:
        The constraints, family by family in catalogue order.

    Raises:
        ValueError: When `heldout_families` names a family the catalogue does not have.
    """
    unknown = set(heldout_families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown held-out families {sorted(unknown)}; expected some of {', '.join(FAMILIES)}")
    constraints = []
    for name, family in FAMILY_RULES.items():
        heldout = split_values(list(family.values), heldout_fraction, seed + zlib.crc32(name.encode()))
        for value, attributes in family.values.items():
            split = "heldout" if name in heldout_families or value in heldout else "train"
            constraints.append(replace(family.constraint(value, attributes), split=split))
    return constraints


def limit_values(constraints: Sequence[Constraint], per_family: int, seed: int = 0) -> list[Constraint]:
    """At most `per_family` values of each family, in the input order.

    The variety knob of GAtt data, to measure how held-out adherence grows with the number of distinct values seen.

    Args:
        constraints: The constraints to choose from.
        per_family: The most values kept per family (K). Each family's values are shuffled with a fixed seed and
            the first `per_family` kept, so a larger K keeps a superset.
        seed: The shuffle's seed.

    Returns:
        The kept constraints, in the input order.

    Raises:
        ValueError: When `per_family` is below 1.
    """
    if per_family < 1:
        raise ValueError(f"values per family must be >= 1, got {per_family}")
    kept: set[str] = set()
    for family in sorted({c.family for c in constraints}):
        names = sorted(c.name for c in constraints if c.family == family)
        random.Random(f"{seed}-{family}").shuffle(names)
        kept |= set(names[:per_family])
    return [c for c in constraints if c.name in kept]


def limit_families(constraints: Sequence[Constraint], count: int, seed: int = 0) -> list[Constraint]:
    """The constraints of at most `count` families, in the input order.

    The families curve's knob (how held-out-family adherence grows with the number of trained families).

    Args:
        constraints: The constraints to choose from.
        count: The most families kept. The families are shuffled with a fixed seed and the first `count` kept, so a
            larger count keeps a superset.
        seed: The shuffle's seed.

    Returns:
        The kept families' constraints, in the input order.

    Raises:
        ValueError: When `count` is below 1.
    """
    if count < 1:
        raise ValueError(f"families must be >= 1, got {count}")
    families = sorted({c.family for c in constraints})
    random.Random(f"{seed}-families").shuffle(families)
    kept = set(families[:count])
    return [c for c in constraints if c.family in kept]


@dataclass
class ConstraintSampler:
    """Draws 1 to `max_combined` non-contradictory constraints (one per family) and the instruction form.

    The first constraint is drawn uniformly over all values (a family with 22 hobbies is drawn 22 times
    as often as all caps) or, with `by_family`, over families first and then over the family's values."""

    constraints: Sequence[Constraint]
    short_prob: float = SHORT_PROB
    max_combined: int = 3
    combine_prob: float = 0.3  # chance of adding each further constraint, so single constraints dominate
    by_family: bool = False

    def __post_init__(self) -> None:
        if not self.constraints:
            raise ValueError("ConstraintSampler needs at least one constraint")
        if not 0.0 <= self.short_prob <= 1.0:
            raise ValueError(f"short_prob must be in [0, 1], got {self.short_prob}")

    def sample(self, rng: random.Random) -> tuple[list[Constraint], bool]:
        """The constraints and instruction form of one dialogue.

        Args:
            rng: The random source.

        Returns:
            (constraints, use_short): each constraint in one of its wordings (`Constraint.phrased`); use_short True
            with probability `short_prob`.
        """
        families = sorted({c.family for c in self.constraints})
        if self.by_family:
            family = rng.choice(families)
            chosen = [rng.choice([c for c in self.constraints if c.family == family])]
        else:
            chosen = [rng.choice(self.constraints)]
        while len(chosen) < self.max_combined and rng.random() < self.combine_prob:
            taken = {c.family for c in chosen}
            allowed = [f for f in families if f not in taken and not any(conflict(f, t) for t in taken)]
            if not allowed:
                break
            family = rng.choice(allowed)
            chosen.append(rng.choice([c for c in self.constraints if c.family == family]))
        return [c.phrased(rng) for c in chosen], rng.random() < self.short_prob
