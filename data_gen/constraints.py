"""The constraint catalogue: the paper's families (hobby, language, public figure) plus format families.

Every constraint has a full instruction and a shortened form ("Always answer in French." /
"Language: French"), checks for every reply given under it, and attribute probes. The values of each
family are split into train and held-out sets with a fixed seed: held-out values (and whole held-out
families) never appear in GAtt data, only in the base SFT corpus as local instructions, so the
evaluation can measure whether GAtt's persistence transfers.

The families' values (hobbies, languages, figures, sign-off words) are data, in data_gen/data/catalogue.yaml
(read by `data_gen.builtin_data`); this module builds the constraints from them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from data_gen import builtin_data
from gatt.checks import Check, Constraint, Probe, split_values
from gatt.events import conflict, instruction_text  # noqa: F401  (instruction_text: data_gen's name for it)

FAMILIES = ("hobby", "language", "figure", "caps", "signoff", "brevity")

# The families' values (data_gen/data/catalogue.yaml), in file order: catalogue() keeps it.
HOBBIES: tuple[str, ...] = builtin_data.hobbies()
# English name -> (ISO 639-1 code, the language's own name).
LANGUAGES: dict[str, tuple[str, str]] = builtin_data.languages()
# Full name -> the names a reply may use for them.
FIGURES: dict[str, tuple[str, ...]] = builtin_data.figures()
# Sign-offs drawn procedurally (an adjective and a noun: "Warm wishes!"), 120 of them: GAtt data that shows
# many sign-offs teaches "end with the one the system message names", not a list to recall.
SIGN_OFF_WORDS: tuple[tuple[str, ...], tuple[str, ...]] = builtin_data.sign_off_words()
SIGN_OFFS = tuple(f"{adjective} {noun}!" for adjective in SIGN_OFF_WORDS[0] for noun in SIGN_OFF_WORDS[1])


def _hobby(value: str) -> Constraint:
    mentions = Check("contains_any", {"words": [value]})
    return Constraint(
        name=f"hobby:{value}",
        instruction=f"You enjoy {value}, and you mention it in every answer.",
        short=f"Hobby: {value}",
        paraphrases=(
            f"Your favorite hobby is {value}. Bring it up in each reply.",
            f"You are a big fan of {value}: talk about it whenever you answer.",
        ),
        checks=(mentions,),
        probes=(
            Probe("What is your favorite hobby?", (mentions,)),
            Probe("What do you do in your free time?", (mentions,)),
        ),
        family="hobby",
        value=value,
    )


def _language(value: str) -> Constraint:
    code, native = LANGUAGES[value]
    names = Check("contains_any", {"words": [value, native]})
    return Constraint(
        name=f"language:{value}",
        instruction=f"Always answer in {value}.",
        short=f"Language: {value}",
        paraphrases=(f"Reply only in {value}, whatever language I write in.", f"From now on, speak {value}."),
        checks=(Check("language", {"code": code}),),
        probes=(Probe("Which language do you speak?", (names,)), Probe("What language are we using?", (names,))),
        family="language",
        value=value,
    )


def _figure(value: str) -> Constraint:
    names = Check("contains_any", {"words": list(FIGURES[value])})
    return Constraint(
        name=f"figure:{value}",
        instruction=f"Act as {value}, and say who you are in every answer.",
        short=f"Figure: {value}",
        paraphrases=(
            f"You are {value}. Introduce yourself in each reply.",
            f"Pretend to be {value} and give your name every time you answer.",
        ),
        checks=(names,),
        probes=(Probe("Who are you?", (names,)), Probe("What is your name?", (names,))),
        family="figure",
        value=value,
    )


def _caps() -> Constraint:
    caps = Check("all_caps", {})
    return Constraint(
        name="caps:all caps",
        instruction="Always answer in capital letters.",
        short="Format: all caps",
        paraphrases=("Write every reply in upper case.", "Use capital letters only in your answers."),
        checks=(caps,),
        probes=(Probe("Say something about yourself.", (caps,)),),
        family="caps",
        value="all caps",
    )


def _signoff(value: str) -> Constraint:
    ends = Check("endswith", {"text": value})
    return Constraint(
        name=f"signoff:{value}",
        instruction=f'End every answer with "{value}"',
        short=f"Sign-off: {value}",
        paraphrases=(f'Finish each reply with "{value}"', f'Sign off every message with "{value}"'),
        checks=(ends,),
        probes=(Probe("How do you end your messages?", (ends,)),),
        family="signoff",
        value=value,
    )


def _brevity() -> Constraint:
    one = Check("max_sentences", {"n": 1})
    return Constraint(
        name="brevity:one sentence",
        instruction="Answer in one sentence only.",
        short="Format: one sentence",
        paraphrases=("Keep every reply to a single sentence.", "Reply with just one sentence."),
        checks=(one,),
        probes=(Probe("Describe your day.", (one,)),),
        family="brevity",
        value="one sentence",
    )


def catalogue(
    *, heldout_fraction: float = 0.25, seed: int = 0, heldout_families: Sequence[str] = ("brevity",)
) -> list[Constraint]:
    """Every catalogue constraint, tagged split="train" or "heldout" (held-out values and whole held-out families)."""
    unknown = set(heldout_families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown held-out families {sorted(unknown)}; expected some of {', '.join(FAMILIES)}")
    by_family = {
        "hobby": [_hobby(v) for v in HOBBIES],
        "language": [_language(v) for v in LANGUAGES],
        "figure": [_figure(v) for v in FIGURES],
        "caps": [_caps()],
        "signoff": [_signoff(v) for v in SIGN_OFFS],
        "brevity": [_brevity()],
    }
    constraints = []
    for family, members in by_family.items():
        heldout = split_values([c.value for c in members], heldout_fraction, seed + FAMILIES.index(family))
        for constraint in members:
            is_heldout = family in heldout_families or constraint.value in heldout
            constraints.append(replace(constraint, split="heldout" if is_heldout else "train"))
    return constraints


def limit_values(constraints: Sequence[Constraint], per_family: int, seed: int = 0) -> list[Constraint]:
    """At most `per_family` values of each family, in the input order: the variety knob of GAtt data, to
    measure how held-out adherence grows with the number of distinct values seen. Each family's values are
    shuffled with a fixed seed and the first `per_family` kept, so a larger K keeps a superset."""
    if per_family < 1:
        raise ValueError(f"values per family must be >= 1, got {per_family}")
    kept: set[str] = set()
    for family in sorted({c.family for c in constraints}):
        names = sorted(c.name for c in constraints if c.family == family)
        random.Random(f"{seed}-{family}").shuffle(names)
        kept |= set(names[:per_family])
    return [c for c in constraints if c.name in kept]


@dataclass
class ConstraintSampler:
    """Draws 1 to `max_combined` non-contradictory constraints (one per family) and the instruction form.

    The first constraint is drawn uniformly over all values (a family with 22 hobbies is drawn 22 times
    as often as all caps) or, with `by_family`, over families first and then over the family's values."""

    constraints: Sequence[Constraint]
    short_prob: float = 0.5
    max_combined: int = 3
    combine_prob: float = 0.3  # chance of adding each further constraint, so single constraints dominate
    by_family: bool = False

    def __post_init__(self) -> None:
        if not self.constraints:
            raise ValueError("ConstraintSampler needs at least one constraint")
        if not 0.0 <= self.short_prob <= 1.0:
            raise ValueError(f"short_prob must be in [0, 1], got {self.short_prob}")

    def sample(self, rng: random.Random) -> tuple[list[Constraint], bool]:
        """(constraints, use_short) for one dialogue; each constraint in one of its wordings (`Constraint.phrased`)."""
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
