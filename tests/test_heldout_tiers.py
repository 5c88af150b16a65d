"""The held-out tiers declared in data_gen/data/catalogue.yaml: what each tier holds is what it says it measures."""

import pytest

from data_gen.builtin_data import DataFileError
from data_gen.constraints import (
    FAMILIES,
    FAMILY_RULES,
    HELDOUT_TIERS,
    check_signature,
    load_heldout_tiers,
    tier_violations,
)


def test_the_declared_tiers_measure_what_they_say() -> None:
    assert tier_violations(HELDOUT_TIERS) == []
    behaviours = HELDOUT_TIERS["behaviours"]
    assert len(behaviours) >= 8 and {"brevity", "lowercase", "bullets"} <= set(behaviours)
    assert len({kind for name in behaviours for kind, _ in check_signature(name)}) >= 2  # of at least two kinds
    kind = FAMILY_RULES[HELDOUT_TIERS["kind"][0]].kind
    assert HELDOUT_TIERS["kind"] == tuple(name for name in FAMILIES if FAMILY_RULES[name].kind == kind)
    held = [name for names in HELDOUT_TIERS.values() for name in names]
    assert len(held) == len(set(held)) and len(FAMILIES) - len(held) >= 20  # a GAtt data set still wide


def test_a_behaviour_a_trained_family_shares_is_caught() -> None:
    """hobby's check (contains_any {value}) is every trained persona's: held out as a behaviour, it is a wording."""
    tiers = {**HELDOUT_TIERS, "behaviours": (*HELDOUT_TIERS["behaviours"], "hobby")}
    (line,) = tier_violations(tiers)
    sharer = line.removeprefix("behaviours: hobby has the checks of trained family ")
    assert sharer in FAMILIES and check_signature(sharer) == check_signature("hobby")
    # wordlimit (max_words) held out as a wording: no trained family checks a word count, so it is a behaviour
    tiers = {**HELDOUT_TIERS, "wordings": (*HELDOUT_TIERS["wordings"], "wordlimit")}
    assert tier_violations(tiers) == [
        "wordings: wordlimit's check type is no trained family's: a behaviour, not a wording"
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"wordings": ["city"], "behaviours": ["brevity"]}, "expected the keys wordings, behaviours, kind"),
        (
            {"wordings": ["city"], "behaviours": ["nosuch"], "kind": "language"},
            r"behaviours: unknown families \['nosuch'\]",
        ),
        ({"wordings": ["city"], "behaviours": ["brevity"], "kind": "dance"}, "kind: expected one of"),
        (
            {"wordings": ["farewell_in"], "behaviours": ["brevity"], "kind": "language"},
            r"families in two tiers: \['farewell_in'\]",
        ),
        ({"wordings": [], "behaviours": ["brevity"], "kind": "language"}, "wordings: expected a non-empty list"),
    ],
)
def test_a_bad_tiers_section_is_refused_by_key(spec: dict, message: str) -> None:
    with pytest.raises(DataFileError, match=f"catalogue.yaml: heldout_tiers: {message}"):
        load_heldout_tiers(spec, "catalogue.yaml: heldout_tiers")
