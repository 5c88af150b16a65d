"""The built-in instruction sets `ifeval` and `ifbench`: the benchmark's own texts and checkers (if-verifiable),
parameters drawn per type and held out in part, unavailable types refused, and nothing downloaded."""

import random
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from if_verifiable.common import evaluate_instructions

from data_gen.constraints import ConstraintSampler, conflict
from gatt.data import constraint_sets
from gatt.data.check_types import Check
from gatt.data.checks import hold_out_families, load_constraints

REPLIES = (
    "the weather is nice today and i like it",
    "The weather is nice today, and I like it.",
    "THE WEATHER IS NICE TODAY AND I LIKE IT.",
    '"The weather is nice today."',
    "<<Weather>>\n\nThe weather is nice.\n\nP.S. Take an umbrella.",
    '```json\n{"weather": "nice"}\n```',
    "* sun\n* rain\n* wind\n\n***\n\nSection 1\nIt is warm. Is it? Yes!",
    "My answer is yes.",
    "Le temps est beau aujourd'hui et je suis content de sortir.",
)


@pytest.mark.parametrize("name", constraint_sets.SETS)
def test_checks_agree_with_the_benchmarks_own_evaluation(name: str) -> None:
    """Our check's verdict is if-verifiable's strict verdict, for every constraint of the set and every reply."""
    instructions = constraint_sets.registry(name)
    verdicts = Counter()
    for constraint in load_constraints(name):
        [check] = constraint.checks
        for reply in REPLIES:
            [result], _ = evaluate_instructions(reply, [check.args["id"]], [check.args["kwargs"]], "", instructions)
            assert check.passes(reply) == result.strict_pass, (constraint.name, reply)
            verdicts[result.strict_pass] += 1
    assert verdicts[True] > 0 and verdicts[False] > 0  # the replies tell passing from failing


def test_constraints_carry_the_builders_text_and_drawn_parameters() -> None:
    constraints = load_constraints("ifeval")
    by_family = Counter(c.family for c in constraints)
    assert all(family.startswith("ifeval:") for family in by_family)
    assert by_family["ifeval:punctuation:no_comma"] == 1  # a type without parameters has one value
    assert by_family["ifeval:length_constraints:number_words"] > 1  # its word counts are drawn
    for c in constraints:
        [check] = c.checks
        assert check.type == "ifeval" and c.family == f"ifeval:{check.args['id']}"
        # the instruction is what the benchmark's builder writes for these parameters
        instance = constraint_sets.registry("ifeval")[check.args["id"]](check.args["id"])
        assert c.instruction == instance.build_description(**check.args["kwargs"])
    [comma] = [c for c in constraints if c.family == "ifeval:punctuation:no_comma"]
    assert comma.instruction == "In your entire response, refrain from the use of any commas."
    assert comma.checks[0].passes("No commas at all here.") and not comma.checks[0].passes("Yes, a comma.")


def test_the_draws_are_fixed_and_a_quarter_of_the_parameters_is_held_out() -> None:
    first = load_constraints("ifbench")
    random.seed(12345)  # the draws neither depend on nor change the caller's random state
    state = random.getstate()
    assert load_constraints("ifbench") == first
    assert random.getstate() == state
    families = {c.family for c in first}
    for family in families:
        values = [c for c in first if c.family == family]
        held = sum(c.split == "heldout" for c in values)
        assert held == (0 if len(values) < 2 else max(1, round(0.25 * len(values)))), family
        assert any(c.split == "train" for c in values)  # every type is trained on some parameters


def test_unavailable_types_are_left_out_with_their_reason() -> None:
    missing = constraint_sets.unavailable("ifeval")
    assert "nltk" in missing["length_constraints:number_sentences"]  # punkt is not on PyPI
    assert "prompt" in missing["combination:repeat_prompt"]
    assert all(key.startswith("custom:") for key in constraint_sets.unavailable("ifbench") if "task" in key)
    assert {c.checks[0].args["id"] for c in load_constraints("ifeval")}.isdisjoint(missing)
    with pytest.raises(ValueError, match="number_sentences' is unavailable: its checker needs nltk data"):
        Check.from_dict({"type": "ifeval", "id": "length_constraints:number_sentences", "kwargs": {}}, "mine")


def test_a_users_yaml_names_a_type_and_its_kwargs(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            constraints:
              - name: no commas
                instruction: "Never use a comma."
                short: "No commas"
                checks: [{type: ifeval, id: "punctuation:no_comma", kwargs: {}}]
              - name: short
                instruction: "Answer in fewer than 20 words."
                short: "Under 20 words"
                checks: [{type: ifeval, id: "length_constraints:number_words",
                          kwargs: {num_words: 20, relation: "less than"}}]
            """
        ),
        encoding="utf-8",
    )
    commas, short = load_constraints(path)
    assert commas.checks[0].passes("Fine.") and not commas.checks[0].passes("Well, no.")
    assert short.checks[0].passes("A short reply.") and not short.checks[0].passes("word " * 25)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "ifeval", "id": "punctuation:no_commas"}, "field 'id' must be a ifeval instruction type"),
        ({"type": "ifeval", "id": "length_constraints:number_words", "kwargs": {}}, "takes kwargs num_words, relation"),
        (
            {"type": "ifeval", "id": "length_constraints:number_words", "kwargs": {"num_words": 5, "relation": "near"}},
            "refuses kwargs",
        ),
        ({"type": "ifbench", "id": "custom:multiples"}, "is unavailable: a task with a question of its own"),
        (  # paragraph 3 of 2: IFEval's builder would draw another paragraph at random
            {
                "type": "ifeval",
                "id": "length_constraints:nth_paragraph_first_word",
                "kwargs": {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "so"},
            },
            "redraws kwargs",
        ),
        ({"type": "ifeval", "id": "punctuation:no_comma", "kwargs": [1]}, "'kwargs' must be a mapping"),
    ],
)
def test_bad_benchmark_checks_are_refused_with_the_entry_named(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^my.yaml: constraints\\[0\\]: .*{message}"):
        Check.from_dict(spec, "my.yaml: constraints[0]")


def test_several_sets_and_held_out_patterns() -> None:
    both = load_constraints("ifeval,ifbench")
    assert (
        len({c.name for c in both}) == len(both) == len(load_constraints("ifeval")) + len(load_constraints("ifbench"))
    )
    held = hold_out_families(both, ["ifbench:*", "ifeval:punctuation:no_comma"])
    assert all(c.split == "heldout" for c in held if c.family.startswith("ifbench:"))
    assert any(c.split == "train" for c in held if c.family.startswith("ifeval:"))
    with pytest.raises(ValueError, match="no constraint of family 'ifbrench:\\*'"):
        hold_out_families(both, ["ifbrench:*"])
    with pytest.raises(FileNotFoundError, match="built-in sets: ifeval, ifbench"):
        load_constraints("ifevl")


def test_combined_draws_respect_the_benchmarks_conflicts() -> None:
    assert conflict("ifeval:change_case:english_capital", "ifeval:change_case:english_lowercase")
    assert not conflict("ifeval:punctuation:no_comma", "ifeval:startend:quotation")
    sampler = ConstraintSampler(load_constraints("ifeval"), max_combined=3, combine_prob=1.0)
    rng = random.Random(0)
    for _ in range(300):
        families = [c.family for c in sampler.sample(rng)[0]]
        assert not any(conflict(a, b) for a in families for b in families if a != b)


def test_nothing_is_downloaded() -> None:
    """Loading both sets and checking a reply never reaches nltk's downloader or the network."""
    script = textwrap.dedent(
        """\
        import socket, nltk, nltk.downloader
        def refuse(*args, **kwargs):
            raise AssertionError("a download was attempted")
        socket.socket.connect = refuse
        nltk.downloader.Downloader.download = refuse
        from gatt.data.checks import load_constraints
        for c in load_constraints("ifeval,ifbench"):
            c.checks[0].passes("A plain reply. It has two sentences.")
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_the_constraints_command_writes_the_chosen_types_with_a_set_held_out(tmp_path: Path) -> None:
    from data_gen.__main__ import main

    out = tmp_path / "chosen.yaml"
    families = ["ifeval:punctuation:no_comma", "ifeval:length_constraints:*", "ifbench:format:no*"]
    main(
        [
            "constraints",
            "--constraints",
            "ifeval,ifbench",
            "--families",
            *families,
            "--heldout-families",
            "ifbench:*",
            "--out",
            str(out),
        ]
    )
    written = load_constraints(out)
    expected = [
        c
        for c in hold_out_families(load_constraints("ifeval,ifbench"), ["ifbench:*"])
        if c.family == families[0] or c.family.startswith(("ifeval:length_constraints:", "ifbench:format:no"))
    ]
    assert written == expected and len({c.family for c in written}) >= 4
    assert all(c.split == "heldout" for c in written if c.family.startswith("ifbench:"))
    with pytest.raises(SystemExit, match="--families: no constraint of family 'ifeval:nope'"):
        main(["constraints", "--constraints", "ifeval", "--families", "ifeval:nope", "--out", str(tmp_path / "x.yaml")])
    assert not (tmp_path / "x.yaml").exists()
