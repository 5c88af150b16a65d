"""Tests for data_gen/data/topic_facts.yaml: one everyday fact per topic and language for the toy world's replies."""

import itertools
import re
from pathlib import Path

import pytest
import yaml

from data_gen.constraints import FIGURES, HOBBIES, LANGUAGES
from data_gen.user_turns import LANGUAGE_CODES, TOPIC_KEYWORDS, TOPICS
from gatt.checks import Check, detect_language

FACTS_PATH = Path(__file__).resolve().parents[1] / "data_gen" / "data" / "topic_facts.yaml"
CODES = ("en", "fr", "es", "de", "it", "pt", "nl")
# Words no fact may contain: they would make a reply look as if it followed a hobby, figure or language
# constraint that it was never given.
RESERVED_WORDS = (
    list(HOBBIES)
    + [name for full, names in FIGURES.items() for name in (full, *names)]
    + [name for english, (_code, native) in LANGUAGES.items() for name in (english, native)]
    + ["English", "hobby"]
)
CASES = [(topic, code) for topic in TOPICS for code in CODES]


def _load() -> dict:
    with FACTS_PATH.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


FACTS = _load()["facts"]


def _label(topic: str, code: str) -> str:
    phrase = TOPICS[topic][code]
    return phrase[0].upper() + phrase[1:]


def _word_sets(text: str) -> tuple[set[str], set[str]]:
    """The text's lower-case words, punctuation ignored, two ways: split at every non-word character
    ("l'eau" -> "l", "eau") and split on whitespace keeping inner apostrophes and hyphens ("l'eau")."""
    lower = text.lower()
    fine = set(re.findall(r"\w+", lower))
    coarse = {re.sub(r"[^\w'’-]", "", token).strip("'’-") for token in lower.split()} - {""}
    return fine, coarse


# --- rule 1: the file's shape -------------------------------------------------------------------

def test_file_starts_with_a_comment():
    assert FACTS_PATH.read_text(encoding="utf-8").startswith("#")


def test_shape_topics_and_languages():
    data = _load()
    assert list(data) == ["facts"]
    assert CODES == LANGUAGE_CODES
    assert list(FACTS) == list(TOPICS)  # exactly TOPICS' keys, in TOPICS' order
    for topic, by_code in FACTS.items():
        assert isinstance(by_code, dict), topic
        assert tuple(by_code) == CODES, topic
        for code, fact in by_code.items():
            assert isinstance(fact, str) and fact.strip() == fact and fact, (topic, code)


# --- rule 2: one sentence of 6-10 words ---------------------------------------------------------

@pytest.mark.parametrize(("topic", "code"), CASES)
def test_one_short_sentence(topic, code):
    fact = FACTS[topic][code]
    assert fact.endswith("."), fact
    assert not re.search(r"[.!?]", fact[:-1]), fact
    assert 6 <= len(fact.split()) <= 10, fact
    assert not re.search(r"\d", fact), fact
    assert fact[0].isupper(), fact


# --- rule 3: detected as its language, alone and after its label -------------------------------

@pytest.mark.parametrize(("topic", "code"), CASES)
def test_detected_language(topic, code):
    fact = FACTS[topic][code]
    labelled = f"{_label(topic, code)}: {fact}"
    assert detect_language(labelled) == code, labelled
    assert detect_language(fact) == code, fact


# --- rule 4: no other topic, hobby, figure or language named ------------------------------------

@pytest.mark.parametrize("topic", list(TOPICS))
def test_no_foreign_keywords(topic):
    others = [word for other in TOPICS if other != topic for code in CODES for word in TOPIC_KEYWORDS[other][code]]
    forbidden = RESERVED_WORDS + others
    check = Check("contains_any", {"words": forbidden})
    for code in CODES:
        fact = FACTS[topic][code]
        if check.passes(fact):
            hits = [word for word in forbidden if Check("contains_any", {"words": [word]}).passes(fact)]
            pytest.fail(f"{topic}/{code} names {hits}: {fact}")


# --- rule 5: all different, and facts of different topics share at most 3 words ----------------

def test_all_facts_distinct():
    every = [fact for by_code in FACTS.values() for fact in by_code.values()]
    assert len(every) == len(set(every)) == len(TOPICS) * len(CODES)


@pytest.mark.parametrize("code", CODES)
def test_facts_of_different_topics_vary(code):
    words = {topic: _word_sets(FACTS[topic][code]) for topic in TOPICS}
    too_close = []
    for a, b in itertools.combinations(TOPICS, 2):
        for way in range(2):
            common = words[a][way] & words[b][way]
            if len(common) > 3:
                too_close.append((a, b, sorted(common)))
    assert not too_close, too_close
