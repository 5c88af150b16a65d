"""data_gen.builtin_data: the YAML files in data_gen/data/ load into the types and order the modules use, ship
as package data, and a missing or misshapen file fails naming the file and the key.

(Per-topic language and keyword coverage: tests/test_user_turns.py; the shipped eval set, byte-identical to
a fresh export of this data: tests/test_eval_inputs.py::test_shipped_eval_set_matches_the_export.)
"""

import fnmatch
import re
import shutil
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from data_gen import builtin_data, constraints, toy_world, user_turns
from data_gen.builtin_data import DataFileError, read_data_file

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data_gen" / "data"
TOY_LINES = ("GENERIC_REPLY", "ASSISTANT_LINE", "HELP_LINE", "QUESTION")


def _is_texts(value: object) -> bool:
    return isinstance(value, tuple) and bool(value) and all(isinstance(item, str) and item for item in value)


def test_user_turn_data_types() -> None:
    assert user_turns.LANGUAGE_CODES == ("en", "fr", "es", "de", "it", "pt", "nl")
    assert list(user_turns.TOPICS)[:3] == ["ocean", "music", "coffee"]  # file order, which the split follows
    assert list(user_turns.TOPIC_KEYWORDS) == list(user_turns.TOPICS)
    assert all(_is_texts(words) for table in user_turns.TOPIC_KEYWORDS.values() for words in table.values())
    assert _is_texts(user_turns.PHRASINGS) and all("{topic}" in p for p in user_turns.PHRASINGS)


def test_catalogue_data_types() -> None:
    rules = constraints.FAMILY_RULES
    assert len(rules) >= 30 and {rule.kind for rule in rules.values()} == set(constraints.KINDS)
    assert list(rules["hobby"].values)[:2] == ["tennis", "golf"]  # file order, which the sampler follows
    assert rules["hobby"].values["tennis"] == {"icon": "🎾"}
    assert constraints.LANGUAGES["French"] == ("fr", "français")
    # The responder answers in the catalogue's languages and English: all of them are toy-world languages.
    assert {code for code, _ in constraints.LANGUAGES.values()} | {"en"} <= set(user_turns.LANGUAGE_CODES)
    # A language value carries its phrases; a figure its names.
    assert rules["greet_in"].values["French"] == {
        "greeting": "Bonjour !",
        "thanks": "Merci !",
        "farewell": "Au revoir !",
        "welcome": "Bienvenue !",
        "cheers": "Santé !",
        "code": "fr",
        "native": "français",
    }
    assert rules["figure"].values["Napoleon"] == {"names": ["Napoleon", "Napoléon"]}
    # Procedural pools: every combination of a product, a seeded draw of codes and numbers.
    sign_offs = list(rules["signoff"].values)
    assert len(sign_offs) == len(set(sign_offs)) == 120 and sign_offs[0] == "Warm wishes!"
    codes = list(rules["code"].values)
    assert len(set(codes)) == 40 and all(re.fullmatch(r"[A-Z]{2}\d{2}", code) for code in codes)
    assert codes == list(constraints.load_families()["code"].values)  # the same seed, the same draw


def test_toy_world_data_types() -> None:
    assert tuple(toy_world.TOPIC_REPLIES) == user_turns.LANGUAGE_CODES
    assert all(_is_texts(t) and all("{T}" in x for x in t) for t in toy_world.TOPIC_REPLIES.values())
    for name in TOY_LINES:
        table = getattr(toy_world, name)
        assert tuple(table) == user_turns.LANGUAGE_CODES, name
        assert all(isinstance(line, str) and line for line in table.values()), name
    for name, table in toy_world.LINES.items():
        assert tuple(table) == user_turns.LANGUAGE_CODES, name
    # every line a family names exists (checked when the catalogue loads), and every hobby has its own icon
    icons = [attributes["icon"] for attributes in constraints.FAMILY_RULES["hobby"].values.values()]
    assert len(set(icons)) == len(icons)
    assert _is_texts(toy_world.EMOJI)


def test_readers_return_fresh_objects() -> None:
    # The module constants are mutable dicts: a caller's change must not leak into a later read.
    topics = builtin_data.topics()
    topics["ocean"]["en"] = "changed"
    assert builtin_data.topics()["ocean"]["en"] == "the ocean" == user_turns.TOPICS["ocean"]["en"]


def test_data_files_are_package_data() -> None:
    assert sorted(p.name for p in DATA.iterdir()) == sorted(builtin_data.SECTIONS)
    # A non-editable install ships only what package-data lists.
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["data_gen"]
    for name in builtin_data.SECTIONS:
        assert any(fnmatch.fnmatch(f"data/{name}", g) for g in globs), name


# --- a missing or misshapen file: an error naming the file and the key ---------------------------


@pytest.fixture
def data_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of data_gen/data/ that the readers use instead, for the test to break."""
    copy = tmp_path / "data"
    shutil.copytree(DATA, copy)
    monkeypatch.setattr(builtin_data, "DATA_DIR", copy)
    builtin_data._file.cache_clear()
    builtin_data.language_codes.cache_clear()
    yield copy
    builtin_data._file.cache_clear()  # the next read, after monkeypatch's undo, is of the real files
    builtin_data.language_codes.cache_clear()


BROKEN: list[tuple[str, str, str, Callable[[], object], str]] = [
    (
        "topics.yaml",
        "    nl: koffie\n",
        "",
        builtin_data.topics,
        "topics.yaml: topics.coffee: expected the keys en, fr, es, de, it, pt, nl in this order, got en, fr, es, de, it, pt",
    ),
    (
        "topics.yaml",
        "    fr: le café\n",
        "    fr: no\n",
        builtin_data.topics,
        "topics.yaml: topics.coffee.fr: expected a non-empty string, got False",
    ),
    (
        "topics.yaml",
        "  coffee:\n",
        "  music:\n",
        builtin_data.topics,
        "topics.yaml: not valid YAML: .*duplicate key 'music'",
    ),
    (
        "topic_keywords.yaml",
        "    de: [Kaffee, Kaffees]\n",
        "    de: Kaffee\n",
        builtin_data.topic_keywords,
        "topic_keywords.yaml: keywords.coffee.de: expected a non-empty list of strings, got 'Kaffee'",
    ),
    (
        "topic_keywords.yaml",
        "  coffee:\n",
        "  kaffee:\n",
        builtin_data.topic_keywords,
        "topic_keywords.yaml: keywords: expected the keys ocean, music, coffee, ",
    ),
    (
        "phrasings.yaml",
        "- Tell me about {topic}.\n",
        "- 42\n",
        builtin_data.phrasings,
        r"phrasings.yaml: phrasings\[0\]: expected a non-empty string, got 42",
    ),
    (
        "catalogue.yaml",
        "pools:\n",
        "poolz:\n",
        builtin_data.pools,
        "catalogue.yaml: expected the keys pools, families, heldout_tiers in this order, got poolz, families, heldout_tiers",
    ),
    (
        "catalogue.yaml",
        "  values: professions\n",
        "  values: jobs\n",
        constraints.load_families,
        "catalogue.yaml: family 'profession': no pool 'jobs'; pools: hobbies, ",
    ),
    (
        "catalogue.yaml",
        "  reply: {case: upper}\n",
        "  reply: {case: shouting}\n",
        constraints.load_families,
        "catalogue.yaml: family 'caps': reply.case: expected one of upper, lower, title, got 'shouting'",
    ),
    (
        "catalogue.yaml",
        "  reply: {words: '{n}'}\n",
        "  reply: {words: 5}\n",
        constraints.load_families,
        r"catalogue.yaml: family 'wordlimit': reply.words: expected a template of a word count",
    ),
    (
        "catalogue.yaml",
        "  reply: {line: pet}\n",
        "  reply: {line: pet, colour: red}\n",
        constraints.load_families,
        r"catalogue.yaml: family 'pet': reply: unknown key\(s\) \['colour'\]",
    ),
    (
        "catalogue.yaml",
        "  checks: [{type: contains_any, words: ['{value}']}]\n  probes: ['What is your favorite color?']\n",
        "  checks: [{type: contains_any, words: ['{colour}']}]\n  probes: ['What is your favorite color?']\n",
        lambda: constraints.load_families()["color"].constraint("red", {}),
        r"catalogue.yaml: family 'color' checks\[0\]: template '\{colour\}' cannot be filled",
    ),
    (
        "catalogue.yaml",
        "    French: {code: fr,",
        "    French: {code: xx,",
        constraints.load_families,
        "catalogue.yaml: family 'language': value 'French': code 'xx' is none of the toy world's languages",
    ),
    (
        "catalogue.yaml",
        "  codes: {generate: code, count: 40, seed: 11}\n",
        "  codes: {generate: code, count: 0, seed: 11}\n",
        constraints.load_families,
        "catalogue.yaml: pools.codes: `count` must be a positive integer, got 0",
    ),
    (
        "catalogue.yaml",
        "  kind: persona\n  values: pets\n",
        "  kind: animal\n  values: pets\n",
        constraints.load_families,
        "catalogue.yaml: family 'pet': kind must be one of copy, form, language, persona, got 'animal'",
    ),
    (
        "toy_world.yaml",
        "\nhelp_line:\n",
        "\nhelp_line:\n  xx: {}\n",
        lambda: builtin_data.toy_line("help_line"),
        "toy_world.yaml: help_line: expected the keys en, .* got xx, en, ",
    ),
    (
        "toy_world.yaml",
        "  nl: {greeting: Hoi!, thanks: Dank je!, farewell: Tot ziens!, welcome: Welkom!, cheers: Proost!}\n",
        "  nl: {greeting: Hoi!, farewell: Tot ziens!, welcome: Welkom!, cheers: Proost!}\n",
        builtin_data.language_phrases,
        "toy_world.yaml: language_phrases.nl: expected the keys greeting, thanks, farewell, welcome, cheers in this order",
    ),
    (
        "toy_world.yaml",
        "emoji: [",
        "emoji: [[",
        builtin_data.emoji,
        "toy_world.yaml: not valid YAML",
    ),
]


@pytest.mark.parametrize(("name", "old", "new", "read", "message"), BROKEN, ids=[f"{b[0]}:{b[4][:40]}" for b in BROKEN])
def test_a_broken_file_names_the_file_and_key(
    data_copy: Path, name: str, old: str, new: str, read: Callable[[], object], message: str
) -> None:
    path = data_copy / name
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(DataFileError, match=re.escape(str(data_copy)) + "/" + message):
        read()


def test_a_missing_file_is_named(data_copy: Path) -> None:
    (data_copy / "phrasings.yaml").unlink()
    with pytest.raises(
        DataFileError, match=re.escape(str(data_copy / "phrasings.yaml")) + ": built-in data file not found"
    ):
        builtin_data.phrasings()


def test_an_empty_file_is_not_a_mapping(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    with pytest.raises(DataFileError, match="empty.yaml: expected a non-empty mapping, got None"):
        read_data_file(tmp_path / "empty.yaml", ("a",))
