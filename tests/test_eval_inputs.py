"""gatt.eval.inputs: evaluation constraints and user turns (every input form, errors, built-ins) and their export."""

import fnmatch
import json
import re
import tomllib
from pathlib import Path

import datasets
import pytest

from data_gen.__main__ import main
from data_gen.constraints import FAMILIES, HELDOUT_FAMILIES, catalogue
from data_gen.eval_set import write_eval_set
from data_gen.toy_world import ToyResponder
from data_gen.user_turns import TOPICS, UserTurn, on_topic_check, split_user_turns
from gatt.data.check_types import Check
from gatt.data.checks import hold_out_families
from gatt.data.events import builtin_families
from gatt.eval.inputs import BUILTIN_DIR, EvalTurn, load_eval_constraints, load_eval_turns
from gatt.eval.plan import stratify

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "python -m data_gen eval-set --out gatt/eval/builtin"
DIALOGUES = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "How tall is Everest?"},
    ],
    [
        {"role": "user", "content": " Hello there\n"},
        {"role": "assistant", "content": "Hello again."},
        {"role": "user", "content": "Name a river."},
    ],
]
DIALOGUE_TEXTS = ["Hello there", "How tall is Everest?", "Name a river."]
MUSIC = {"type": "contains_any", "words": ["music"]}


def _write_lines(path: Path, records: list[object]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --- user turns: every input form ---------------------------------------------------------------


def test_txt_one_message_per_line(tmp_path: Path) -> None:
    path = tmp_path / "turns.txt"
    path.write_text("What is rain?\n\n   \n  Why is the sky blue?  \nWhat is rain?\n", encoding="utf-8")
    assert load_eval_turns(path) == [EvalTurn("What is rain?"), EvalTurn("Why is the sky blue?")]


def test_content_jsonl_with_optional_checks(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "turns.jsonl",
        [
            {"content": "Tell me about music.", "topic": "music", "checks": [MUSIC]},
            "",
            {"content": "Any plans today?"},
            {"content": " Tell me about music. ", "checks": []},  # a duplicate: the first one is kept
        ],
    )
    turns = load_eval_turns(str(path))
    assert turns == [EvalTurn("Tell me about music.", (Check.from_dict(MUSIC),), "music"), EvalTurn("Any plans today?")]
    assert turns[0].checks[0].passes("I love MUSIC.") and not turns[0].checks[0].passes("Musicals.")


def test_messages_jsonl_gives_user_turns_without_checks(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "chats.jsonl", [{"id": i, "messages": m} for i, m in enumerate(DIALOGUES)])
    assert load_eval_turns(path) == [EvalTurn(text) for text in DIALOGUE_TEXTS]


def test_jsonl_may_mix_both_line_forms(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "mixed.jsonl", [{"content": "Name a river.", "checks": [MUSIC]}, {"messages": DIALOGUES[1]}]
    )
    assert [(t.text, len(t.checks)) for t in load_eval_turns(path)] == [("Name a river.", 1), ("Hello there", 0)]


def test_parquet_and_datasets_folder(tmp_path: Path) -> None:
    dataset = datasets.Dataset.from_list([{"messages": m} for m in DIALOGUES])
    parquet, folder = tmp_path / "chats.parquet", tmp_path / "saved"
    dataset.to_parquet(str(parquet))
    dataset.save_to_disk(str(folder))
    for path in (parquet, folder):
        assert load_eval_turns(path) == [EvalTurn(text) for text in DIALOGUE_TEXTS], path


def test_eval_turn_is_frozen_with_tuple_checks() -> None:
    turn = EvalTurn("hi", [Check.from_dict(MUSIC)])  # type: ignore[arg-type]
    assert isinstance(turn.checks, tuple)
    with pytest.raises(AttributeError):
        turn.text = "bye"  # type: ignore[misc]


# --- user turns: errors name the file and the line or row ---------------------------------------

BAD_LINES = {
    "bad JSON": ('{"content": "hi",', "invalid JSON"),
    "not an object": ('["hi"]', "expected a JSON object, got list"),
    "missing content": ({"text": "hi"}, "record has neither 'content' nor 'messages' (fields: text)"),
    "non-string content": ({"content": 42}, "'content' must be a string, got int"),
    "empty content": ({"content": "  "}, "'content' is empty"),
    "checks not a list": ({"content": "hi", "checks": MUSIC}, "'checks' must be a list"),
    "unknown check type": ({"content": "hi", "checks": [MUSIC, {"type": "rhymes"}]}, "checks[1]: unknown check type"),
    "check missing field": ({"content": "hi", "checks": [{"type": "contains_any"}]}, "checks[0]: "),
    "check not a mapping": ({"content": "hi", "checks": ["music"]}, "checks[0]: expected a mapping"),
    "roles out of order": (
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
        "messages[1]: role 'user' where 'assistant' was expected",
    ),
    "unknown role": ({"messages": [{"role": "tool", "content": "a"}]}, "messages[0]: unknown role 'tool'"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path, case: str) -> None:
    bad, problem = BAD_LINES[case]
    path = _write_lines(tmp_path / "turns.jsonl", [{"content": "fine"}, "", bad])
    with pytest.raises(ValueError) as info:
        load_eval_turns(path)
    assert f"turns.jsonl:3: {problem}" in str(info.value)


def test_malformed_parquet_row_names_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "chats.parquet"
    bad = [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}]
    datasets.Dataset.from_list([{"messages": DIALOGUES[0]}, {"messages": bad}]).to_parquet(str(path))
    with pytest.raises(ValueError, match=re.escape("chats.parquet: row 1: messages[1]: content is empty")):
        load_eval_turns(path)


def test_empty_result_missing_file_and_unsupported_type(tmp_path: Path) -> None:
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"blank\.txt: no user turns found"):
        load_eval_turns(blank)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no user turns found"):
        load_eval_turns(empty)
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        load_eval_turns(tmp_path / "absent.jsonl")
    csv = tmp_path / "turns.csv"
    csv.write_text("content\nhi\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_eval_turns(csv)
    for part in ("turns.csv", "'.csv'", ".txt", ".jsonl", ".parquet", "save_to_disk"):
        assert part in str(info.value)


# --- constraints ---------------------------------------------------------------------------------


def test_builtin_constraints_have_both_splits_and_a_heldout_family() -> None:
    constraints = load_eval_constraints()
    assert constraints == catalogue()
    assert {c.split for c in constraints} == {"train", "heldout"}
    families = {c.family for c in constraints}
    assert families == set(FAMILIES) and len(families) >= 30
    # Whole families held out, at least one of every kind, `brevity` (the paper's example) among them.
    heldout = {c.family for c in constraints} - {c.family for c in constraints if c.split == "train"}
    assert heldout == set(HELDOUT_FAMILIES) and "brevity" in heldout and len(heldout) >= 6
    assert {builtin_families()[f]["kind"] for f in heldout} == {"copy", "form", "language", "persona"}
    # Held-out values inside trained families too, so both kinds of transfer are measured.
    assert any(c.split == "heldout" for c in constraints if c.family == "hobby")
    assert all(c.split == "heldout" for c in constraints if c.family == "language")  # the held-out kind, whole


def test_user_constraint_file_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "constraints:\n  - {name: shout, instruction: Shout., short: 'Caps', checks: [{type: all_caps}],"
        " split: heldout}\n",
        encoding="utf-8",
    )
    [shout] = load_eval_constraints(str(path))
    assert (shout.name, shout.split, shout.family) == ("shout", "heldout", "custom")
    bad = "constraints:\n  - {name: odd, instruction: x, short: y, checks: [{type: rhymes}]}\n"
    path.write_text(bad, encoding="utf-8")
    with pytest.raises(ValueError, match=r"mine\.yaml: constraints\[0\] 'odd'.*unknown check type"):
        load_eval_constraints(path)
    with pytest.raises(FileNotFoundError):
        load_eval_constraints(tmp_path / "absent.yaml")


def test_heldout_families_move_a_whole_family_out_of_the_trained_values(tmp_path: Path) -> None:
    smollm2 = ROOT / "recipes" / "data" / "smollm2_constraints.yaml"
    held = hold_out_families(load_eval_constraints(smollm2), ["language"], "smollm2_constraints.yaml")
    assert {c.split for c in held if c.family == "language"} == {"heldout"}
    strata = {name: {c.family for c in members} for name, members in stratify(held).items()}
    assert (
        strata["heldout_family"] == {"language", "persona"}
        and "language" not in strata["train"] | strata["heldout_value"]
    )
    with pytest.raises(
        ValueError, match=r"smollm2_constraints\.yaml: no constraint of family 'tone'.*families: figure"
    ):
        hold_out_families(held, ["tone"], "smollm2_constraints.yaml")
    args = [
        "gatt",
        "--teacher",
        "oracle",
        "--constraints",
        str(smollm2),
        "--heldout-families",
        "language",
        "hobby",
        "--num-dialogues",
        "12",
        "--max-turns",
        "3",
        "--seed",
        "0",
        "--out",
        str(tmp_path / "gatt"),
    ]
    main(args)
    summary = json.loads((tmp_path / "gatt" / "gatt.summary.json").read_text())
    assert set(summary["pass_rate_per_family"]) == {"figure", "wordlimit"}  # what the GAtt data was drawn from


# --- built-in user turns: held out and on topic -------------------------------------------------


def test_builtin_turns_are_the_heldout_pool_with_checks() -> None:
    turns = load_eval_turns()
    train, heldout = split_user_turns()
    assert [t.text for t in turns] == [t.text for t in heldout]
    assert not {t.text for t in turns} & {t.text for t in train}
    assert all(t.checks == (on_topic_check(h.topic),) for t, h in zip(turns, heldout))
    assert len({t.text for t in turns}) == len(turns) >= 200


def test_toy_replies_pass_their_on_topic_check() -> None:
    constraints = catalogue()
    responder = ToyResponder(constraints)
    views = [(), *[(c,) for c in constraints]]  # no constraint, every language, every other single constraint
    for loaded, heldout in zip(load_eval_turns(), split_user_turns()[1]):
        turn, (check,) = UserTurn(loaded.text, heldout.topic), loaded.checks
        for view in views:
            reply = responder.reply(turn, view)
            assert check.passes(reply), (turn.text, [c.name for c in view], reply)


def test_replies_about_another_topic_fail_the_check() -> None:
    constraints = catalogue()
    responder = ToyResponder(constraints)
    languages = [(), *[(c,) for c in constraints if c.family == "language"]]
    ocean = on_topic_check("ocean")
    assert not ocean.passes(responder.reply(UserTurn("Tell me about volcanoes.", "volcanoes")))
    assert ocean.passes(responder.reply(UserTurn("Tell me about the ocean.", "ocean"), languages[3]))
    # Stronger: in every language, no topic's reply passes another topic's check.
    for topic in TOPICS:
        replies = {
            other: [responder.reply(UserTurn(f"Tell me about {other}.", other), v) for v in languages]
            for other in TOPICS
        }
        check = on_topic_check(topic)
        for other, texts in replies.items():
            assert all(check.passes(r) == (other == topic) for r in texts), (topic, other)


# --- export: byte-identical to the shipped copy, CLI, packaging ----------------------------------


def test_shipped_eval_set_matches_the_export(tmp_path: Path) -> None:
    summary = write_eval_set(tmp_path)
    names = ["constraints.yaml", "families.yaml", "user_turns.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # no temp files left
    for name in names:
        assert (tmp_path / name).read_bytes() == (BUILTIN_DIR / name).read_bytes(), (
            f"gatt/eval/builtin/{name} is out of date with data_gen; regenerate with `{REGENERATE}`"
        )
    assert summary["user_turns"] == len(load_eval_turns()) and summary["constraints"] == len(catalogue())


def test_cli_eval_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["eval-set", "--out", str(tmp_path / "set"), "--seed", "1"])
    summary = json.loads(capsys.readouterr().out)
    constraints = load_eval_constraints(tmp_path / "set" / "constraints.yaml")
    assert summary["heldout_constraints"] == sum(c.split == "heldout" for c in constraints)
    assert summary["user_turns"] == len(load_eval_turns(tmp_path / "set" / "user_turns.jsonl"))
    with pytest.raises(SystemExit) as exit_info:
        main(["eval-set", "--help"])
    assert exit_info.value.code == 0 and "gatt/eval/builtin" in capsys.readouterr().out


def test_builtin_files_are_package_data() -> None:
    # A non-editable install ships only what package-data lists.
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gatt.eval"]
    for path in BUILTIN_DIR.iterdir():
        assert any(fnmatch.fnmatch(f"builtin/{path.name}", g) for g in globs), path.name


def test_a_planned_dialogue_asks_about_each_topic_once() -> None:
    import random

    from gatt.eval.plan import draw_turns

    pool = load_eval_turns()  # 280 held-out messages, 5 on each of 56 topics
    for seed in range(5):
        turns = draw_turns(random.Random(seed), pool, 40)
        assert len({t.text for t in turns}) == 40 and len({t.topic for t in turns}) == 40
    # More turns than topics: every topic first, then the remaining messages, still no message twice.
    turns = draw_turns(random.Random(0), pool, 60)
    assert len({t.text for t in turns}) == 60 and len({t.topic for t in turns}) == 56
    untagged = [EvalTurn(f"message {i}") for i in range(10)]
    assert len({t.text for t in draw_turns(random.Random(0), untagged, 10)}) == 10
    assert len(draw_turns(random.Random(0), untagged, 12)) == 12  # a small pool: drawn with replacement
