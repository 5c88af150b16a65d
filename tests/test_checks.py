"""Tests for reply checks, constraints and probes, and the constraint-file loader."""

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from gatt.data import checks as checks_module
from gatt.data.check_types import CHECK_TYPES, Check
from gatt.data.checks import (
    Constraint,
    Probe,
    check_reply,
    detect_language,
    dump_constraints,
    load_constraints,
    passes_all,
)

FRENCH = "Je pense que le tennis est un sport magnifique pour tout le monde."
SPANISH = "Creo que el tenis es un deporte maravilloso para todas las personas."
GERMAN = "Ich glaube, dass Tennis ein wunderbarer Sport für alle Menschen ist."
ENGLISH = "I think that tennis is a wonderful sport for everyone to enjoy."

# The constraint-file example of docs/data.md ("Formats"), as the page prints it: the documented format loads.
DOCS_EXAMPLE = re.search(
    r"\*\*A constraint file\*\*.*?```yaml\n(.*?)```", (Path(__file__).parents[1] / "docs" / "data.md").read_text(), re.S
).group(1)


def check(type_: str, **args: object) -> Check:
    return Check.from_dict({"type": type_, **args})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "constraints.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# --- check behaviour -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [(FRENCH, "fr"), (SPANISH, "es"), (GERMAN, "de"), (ENGLISH, "en"), (FRENCH.upper(), "fr")],
)
def test_detect_language(text: str, code: str) -> None:
    assert detect_language(text) == code


def test_language_check() -> None:
    french = check("language", code="fr")
    assert french.passes(FRENCH)
    assert french.passes("  " + FRENCH.upper() + "\n")
    for other in (SPANISH, GERMAN, ENGLISH):
        assert not french.passes(other)
    assert check("language", code="en").passes(ENGLISH)
    assert not french.passes("")
    assert not french.passes("   \n")
    assert detect_language("") is None


def test_regex() -> None:
    one_line = check("regex", pattern=r"^\S.*\d{4}$")
    assert one_line.passes("  It happened in 1815 ")
    assert not one_line.passes("It happened long ago")


def test_startswith_endswith() -> None:
    assert check("startswith", text="Ahoy").passes("\n Ahoy, matey!")
    assert not check("startswith", text="Ahoy").passes("ahoy, matey!")  # case-sensitive
    assert check("endswith", text="— Napoleon").passes("Victory is ours. — Napoleon\n")
    assert not check("endswith", text="— Napoleon").passes("— Napoleon says hi")


def test_contains_any_is_whole_word_and_case_insensitive() -> None:
    tennis = check("contains_any", words=["tennis", "ice cream"])
    assert tennis.passes("I love Tennis!")
    assert tennis.passes("TENNIS, of course.")
    assert tennis.passes("Some ICE  Cream please")  # a phrase matches across any whitespace
    assert not tennis.passes("I bought a tennisball.")
    assert not tennis.passes("Nothing here.")
    assert not tennis.passes("ice-cold cream")
    assert check("contains_any", words=["C++"]).passes("I write c++ daily")


def test_not_contains() -> None:
    no_ai = check("not_contains", words=["AI", "language model"])
    assert no_ai.passes("I am the Emperor of the French.")
    assert no_ai.passes("Said the maid, plainly.")  # "ai" inside a word is not the word
    assert not no_ai.passes("As an ai, I cannot.")
    assert not no_ai.passes("I am a Language Model.")


def test_all_caps() -> None:
    caps = check("all_caps")
    assert caps.passes("HELLO, WORLD! 42 TIMES.")
    assert caps.passes("ÇA VA TRÈS BIEN.")
    assert not caps.passes("HELLO, World!")
    assert not caps.passes("123")
    assert not caps.passes("?!")
    assert not caps.passes("")


def test_word_counts() -> None:
    assert check("max_words", n=3).passes(" one two  three ")
    assert not check("max_words", n=3).passes("one two three four")
    assert check("min_words", n=4).passes("one two three four")
    assert not check("min_words", n=4).passes("one two three")


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("Hi there. How are you? Fine!", 3),
        ("Wait... what", 2),
        ("No punctuation here", 1),
        ("Really?! Yes.", 2),
        ("", 0),
    ],
)
def test_max_sentences(text: str, count: int) -> None:
    assert check("max_sentences", n=count if count else 1).passes(text)
    if count > 1:
        assert not check("max_sentences", n=count - 1).passes(text)


def test_check_reply_and_passes_all() -> None:
    checks = [check("language", code="fr"), check("max_words", n=5)]
    results = check_reply(FRENCH, checks)
    assert results == [
        {"type": "language", "code": "fr", "passed": True},
        {"type": "max_words", "n": 5, "passed": False},
    ]
    assert not passes_all(FRENCH, checks)
    assert passes_all(FRENCH, checks[:1])
    assert passes_all("anything", [])


def test_check_dict_round_trip_and_copies() -> None:
    spec = {"type": "contains_any", "words": ["tennis"]}
    made = Check.from_dict(spec)
    assert made == Check("contains_any", {"words": ["tennis"]})
    assert made.to_dict() == spec
    made.to_dict()["words"].append("golf")  # the returned dict is a copy
    spec["words"].append("golf")  # and so is the stored one
    assert made.args == {"words": ["tennis"]}


def test_every_check_type_is_implemented() -> None:
    samples = {"code": "fr", "pattern": "x", "text": "x", "words": ["x"], "n": 1, "function": "builtins:bool"}
    type_ids = {"ifeval": "punctuation:no_comma", "ifbench": "format:no_whitespace"}  # `id` names the benchmark's type
    for type_, fields in CHECK_TYPES.items():
        made = check(type_, **{key: type_ids[type_] if key == "id" else samples[key] for key in fields})
        assert isinstance(made.passes("Bonjour tout le monde, je suis là."), bool)


# --- validation of single checks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "langage", "code": "fr"}, "unknown check type 'langage'; expected one of all_caps, contains_any"),
        ({"code": "fr"}, "'type'"),
        ({"type": ["language"], "code": "fr"}, "unknown check type ['language']"),
        ("language", "expected a mapping"),
        ({"type": "language"}, "needs field 'code'"),
        ({"type": "language", "code": "fr", "lang": "fr"}, "unknown field 'lang'"),
        ({"type": "all_caps", "n": 1}, "unknown field 'n'"),
        ({"type": "language", "code": "french"}, "ISO 639-1"),
        ({"type": "language", "code": "FR"}, "lower-case"),
        ({"type": "language", "code": "xx"}, "ISO 639-1"),
        ({"type": "regex", "pattern": "(unclosed"}, "not a valid regular expression"),
        ({"type": "regex", "pattern": 5}, "'pattern'"),
        ({"type": "startswith", "text": ""}, "'text'"),
        ({"type": "contains_any", "words": "tennis"}, "'words'"),
        ({"type": "contains_any", "words": []}, "'words'"),
        ({"type": "not_contains", "words": ["ok", " "]}, "'words'"),
        ({"type": "max_words", "n": 0}, "positive integer"),
        ({"type": "max_words", "n": "3"}, "positive integer"),
        ({"type": "max_words", "n": 2.5}, "positive integer"),
        ({"type": "max_sentences", "n": True}, "positive integer"),
    ],
)
def test_check_from_dict_refuses(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match="^my where: ") as info:
        Check.from_dict(spec, where="my where")  # type: ignore[arg-type]
    assert message in str(info.value)


def test_check_built_in_code_is_validated() -> None:
    with pytest.raises(ValueError, match="needs field 'pattern'"):
        Check("regex")


# --- constraint files ------------------------------------------------------------------------------


def test_the_documented_example_loads(tmp_path: Path) -> None:
    [french] = load_constraints(write(tmp_path, DOCS_EXAMPLE))
    assert french == Constraint(
        name="french",
        instruction="Always answer in French.",
        short="Language: French",
        checks=(Check("language", {"code": "fr"}),),
        probes=(Probe("Which language do you speak?", (Check("contains_any", {"words": ["French", "français"]}),)),),
    )
    assert (french.family, french.value, french.split) == ("custom", "", "train")
    assert passes_all("Je parle français, bien sûr.", french.probes[0].checks)


def test_dump_load_round_trip(tmp_path: Path) -> None:
    constraints = load_constraints(write(tmp_path, DOCS_EXAMPLE)) + [
        Constraint(
            name="figure:Napoléon",
            instruction="Always act as Napoléon from now.",
            short="Figure: Napoléon",
            checks=[Check("not_contains", {"words": ["language model"]}), Check("max_sentences", {"n": 3})],
            family="figure",
            value="Napoléon",
            split="heldout",
            paraphrases=("You are Napoléon.", "Speak as Napoléon would."),
        )
    ]
    path = tmp_path / "out" / "dumped.yaml"
    path.parent.mkdir()
    dump_constraints(constraints, path)
    assert load_constraints(path) == constraints
    assert yaml.safe_load(path.read_text(encoding="utf-8"))["constraints"][1]["family"] == "figure"
    assert load_constraints(path)[1].paraphrases == ("You are Napoléon.", "Speak as Napoléon would.")
    assert sorted(p.name for p in path.parent.iterdir()) == ["dumped.yaml"]


def test_error_names_file_index_and_entry(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        constraints:
          - {name: caps, instruction: "Answer in capitals.", short: "Caps", checks: [{type: all_caps}]}
          - {name: brief, instruction: "Be brief.", short: "Brief", checks: [{type: max_words, n: 20}]}
          - name: french
            instruction: "Always answer in French."
            short: "Language: French"
            checks: [{type: langage, code: fr}]
        """,
    )
    with pytest.raises(ValueError) as info:
        load_constraints(path)
    message = str(info.value)
    assert message.startswith(f"{path}: constraints[2] 'french' checks[0]: unknown check type 'langage'")
    assert "expected one of " + ", ".join(sorted(CHECK_TYPES)) in message


ENTRY = 'name: french\n    instruction: "Always answer in French."\n    short: "Language: French"\n'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("checks: [{type: language}]", "constraints[0] 'french' checks[0]: check type 'language' needs field 'code'"),
        ("checks: [{type: language, code: fr, strict: true}]", "unknown field 'strict'"),
        ("checks: [{type: regex, pattern: '[a-'}]", "checks[0]: field 'pattern' is not a valid regular expression"),
        ("checks: [{type: max_words, n: -3}]", "field 'n' must be a positive integer"),
        ("checks: []", "'french': needs a non-empty 'checks' list, 'probes', or both"),
        ("probes: [{question: 'Who are you?', checks: []}]", "'french' probes[0]: 'checks' must be a non-empty list"),
        ("checks: [{type: all_caps}]\n    colour: blue", "'french': unknown key 'colour'"),
        ("checks: [{type: all_caps}]\n    split: test", "'split' must be one of train, heldout"),
        (
            "checks: [{type: all_caps}]\n    paraphrases: 'Parle français.'",
            "'paraphrases' must be a list of non-empty strings",
        ),
        ("checks: [{type: all_caps}]\n    paraphrases: ['']", "'paraphrases' must be a list of non-empty strings"),
        (
            "checks: [{type: all_caps}]\n    probes: [{question: 'Hobby?', checks: [{type: max_words}]}]",
            "'french' probes[0].checks[0]: check type 'max_words' needs field 'n'",
        ),
        ("checks: [{type: all_caps}]\n    probes: [{question: '', checks: [{type: all_caps}]}]", "'question'"),
    ],
)
def test_bad_entries_are_refused(tmp_path: Path, body: str, message: str) -> None:
    path = write(tmp_path, "constraints:\n  - " + ENTRY + "    " + body + "\n")
    with pytest.raises(ValueError, match=f"^{path}: constraints\\[0\\]") as info:
        load_constraints(path)
    assert message in str(info.value)


def test_missing_name_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "constraints:\n  - {instruction: x, short: x, checks: [{type: all_caps}]}\n")
    with pytest.raises(ValueError, match=r"constraints\[0\]: 'name' must be a non-empty string"):
        load_constraints(path)


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    entry = "  - {name: caps, instruction: Shout., short: Caps, checks: [{type: all_caps}]}\n"
    path = write(tmp_path, "constraints:\n" + entry + entry)
    with pytest.raises(ValueError, match=r"constraints\[1\] 'caps': duplicate name, already used by constraints\[0\]"):
        load_constraints(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("constraints: [{name: x\n", "not valid YAML"),
        ("- {name: x}\n", "expected a mapping with a 'constraints' list"),
        ("constraints:\n", "expected a mapping with a 'constraints' list"),
        ("", "expected a mapping with a 'constraints' list"),
        ("constraints: []\nextra: 1\n", "unknown top-level key(s) 'extra'"),
    ],
)
def test_bad_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        load_constraints(path)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_constraints(path)


def test_dump_refuses_duplicate_names(tmp_path: Path) -> None:
    [french] = load_constraints(write(tmp_path, DOCS_EXAMPLE))
    with pytest.raises(ValueError, match="duplicate"):
        dump_constraints([french, french], tmp_path / "dup.yaml")
    assert not (tmp_path / "dup.yaml").exists()


@pytest.mark.parametrize("existing", [True, False])
def test_failed_dump_leaves_no_half_written_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool
) -> None:
    source = write(tmp_path, DOCS_EXAMPLE)
    constraints = load_constraints(source) * 3
    constraints = [Constraint(**{**vars(c), "name": f"c{i}"}) for i, c in enumerate(constraints)]
    target = tmp_path / "target.yaml"
    if existing:
        target.write_text("old content\n", encoding="utf-8")
    before = sorted(p.name for p in tmp_path.iterdir())

    # A failure while building the entries: to_dict raises on the second constraint.
    real_to_dict = Constraint.to_dict

    def failing_to_dict(self: Constraint) -> dict:
        if self.name == "c1":
            raise RuntimeError("boom")
        return real_to_dict(self)

    monkeypatch.setattr(Constraint, "to_dict", failing_to_dict)
    with pytest.raises(RuntimeError, match="boom"):
        dump_constraints(constraints, target)
    monkeypatch.undo()

    # A failure in the middle of writing: part of the YAML is already in the temporary file.
    def failing_safe_dump(data: object, stream, **kwargs: object) -> None:  # type: ignore[no-untyped-def]
        stream.write("constraints:\n  - name: c0\n")
        raise OSError("disk full")

    monkeypatch.setattr(checks_module.yaml, "safe_dump", failing_safe_dump)
    with pytest.raises(OSError, match="disk full"):
        dump_constraints(constraints, target)

    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if existing:
        assert target.read_text(encoding="utf-8") == "old content\n"
    else:
        assert not target.exists()
