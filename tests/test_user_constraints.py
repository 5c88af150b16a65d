"""Constraints as users write them: personas scored on their probes alone, and the user's own `python` checks,
through synthesis and the report (in this process and in others)."""

import json
import multiprocessing
import os
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from data_gen.__main__ import main as data_gen_main
from data_gen.synthesis import SynthesisConfig, synthesize
from data_gen.teacher import TurnRequest
from data_gen.user_turns import split_user_turns
from gatt.data.check_types import Check, CheckError
from gatt.data.checks import load_constraints
from gatt.eval.evaluate import main as evaluate_main
from gatt.io import processes
from gatt.model.modeling import GattConfig, GattForCausalLM
from gatt.model.tokenizer import train_tokenizer

CHECKS_MODULE = textwrap.dedent("""
    def mentions(reply, word):
        return word.lower() in reply.lower()

    def long_enough(reply, n=3):
        return len(reply.split()) >= n

    def boom(reply):
        raise RuntimeError("kaputt")

    def not_a_bool(reply):
        return "yes"
""")
PERSONA = {
    "name": "curie",
    "instruction": "Act as Marie Curie in this conversation.",
    "short": "Persona: Marie Curie",
    "family": "persona",
    "value": "Marie Curie",
    "checks": [],
    "probes": [{"question": "Who are you?", "checks": [{"type": "contains_any", "words": ["Curie"]}]}],
}
TENNIS = {
    "name": "tennis",
    "instruction": "You love tennis.",
    "short": "Hobby: tennis",
    "family": "hobby",
    "value": "tennis",
    "checks": [{"type": "python", "function": "user_checks_mod:mentions", "args": {"word": "tennis"}}],
}


@pytest.fixture
def checks_module(tmp_path, monkeypatch) -> Path:
    """A module of the user's own check functions, importable as `user_checks_mod` (in this process and in children)."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "user_checks_mod.py").write_text(CHECKS_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    sys.modules.pop("user_checks_mod", None)
    return folder


def write_constraints(path: Path, *entries: dict) -> Path:
    path.write_text(yaml.safe_dump({"constraints": list(entries)}, sort_keys=False))
    return path


class PersonaTeacher:
    """Answers a user turn about its topic (a new fact each turn); the first candidate at a probe forgets the persona."""

    name = "persona-script"
    scorer = None

    def sample(self, requests: list[TurnRequest], k: int) -> list[list[str]]:
        out = []
        for r in requests:
            turn = len(r.messages) // 2
            if r.turn.topic is None:  # a probe
                out.append(["I am a helpful assistant.", "I am Marie Curie, the chemist."][:k])
            else:
                reply = f"About {r.turn.topic.replace('_', ' ')}: fact number {turn} of my notes, tennis {turn}."
                out.append([reply.replace("tennis", "golf"), reply][:k])
        return out

    def seed(self, seed: int) -> None:
        pass


# --- personas: probes only -------------------------------------------------------------------------------


def test_a_persona_with_probes_and_no_checks_loads_and_a_constraint_with_neither_is_refused(tmp_path):
    [persona] = load_constraints(write_constraints(tmp_path / "p.yaml", PERSONA))
    assert persona.checks == () and persona.probes[0].question == "Who are you?"
    with pytest.raises(
        ValueError, match=r"constraints\[0\] 'curie': needs a non-empty 'checks' list, 'probes', or both"
    ):
        load_constraints(write_constraints(tmp_path / "bad.yaml", {**PERSONA, "probes": []}))


def test_synthesis_asks_a_personas_probes_and_rejects_by_their_checks(tmp_path):
    [persona] = load_constraints(write_constraints(tmp_path / "p.yaml", PERSONA))
    config = SynthesisConfig(num_dialogues=6, min_turns=4, max_turns=6, samples_per_turn=2, probe_prob=0.4, seed=1)
    summary = synthesize(tmp_path / "out", config, PersonaTeacher(), [persona], split_user_turns()[0])
    records = [json.loads(line) for line in (tmp_path / "out" / "gatt.jsonl").read_text().splitlines()]
    assert summary["records"] == 6 and summary["gate_rejected_candidates"] == 0
    probes = [
        (m, a)
        for r in records
        for m, a in zip(r["messages"][::2], r["messages"][1::2])
        if m["content"] == "Who are you?"
    ]
    chats = sum(len(r["messages"]) // 2 for r in records) - len(probes)
    assert probes and all(a["content"] == "I am Marie Curie, the chemist." for _, a in probes)
    # A probe's first candidate fails its check; a chat turn has no persona check, so its first candidate is kept.
    assert summary["rejected_candidates"] == len(probes) and chats > 0


# --- the user's own python checks --------------------------------------------------------------------------


def test_a_python_check_calls_the_users_function_with_the_reply_and_args(checks_module):
    check = Check.from_dict({"type": "python", "function": "user_checks_mod:mentions", "args": {"word": "tennis"}})
    assert check.passes("I played TENNIS today.") and not check.passes("I played golf.")
    assert check.to_dict() == {"type": "python", "function": "user_checks_mod:mentions", "args": {"word": "tennis"}}
    assert Check.from_dict({"type": "python", "function": "user_checks_mod:long_enough"}).passes("one two three")


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("no_such_module_xyz:f", r"'no_such_module_xyz:f' cannot be imported: ModuleNotFoundError"),
        ("user_checks_mod:missing", r"'user_checks_mod:missing' cannot be imported: AttributeError"),
        ("user_checks_mod", r'must be "package.module:name"'),
    ],
)
def test_a_python_check_that_cannot_be_imported_is_refused_naming_the_constraint_and_function(
    checks_module, tmp_path, function, message
):
    entry = {**TENNIS, "checks": [{"type": "python", "function": function}]}
    with pytest.raises(ValueError, match=r"constraints\[0\] 'tennis' checks\[0\]: field 'function' " + message):
        load_constraints(write_constraints(tmp_path / "c.yaml", entry))


def test_a_python_check_that_raises_or_returns_no_bool_names_the_constraint_and_function(checks_module, tmp_path):
    entry = {
        **TENNIS,
        "checks": [{"type": "python", "function": "user_checks_mod:boom"}],
        "probes": [{"question": "Hobby?", "checks": [{"type": "python", "function": "user_checks_mod:not_a_bool"}]}],
    }
    [constraint] = load_constraints(write_constraints(tmp_path / "c.yaml", entry))
    with pytest.raises(
        CheckError, match=r"'tennis' checks\[0\]: python check 'user_checks_mod:boom' raised RuntimeError: kaputt"
    ):
        constraint.checks[0].passes("hi")
    with pytest.raises(
        CheckError, match=r"'tennis' probes\[0\].checks\[0\]: python check 'user_checks_mod:not_a_bool' returned str"
    ):
        constraint.probes[0].checks[0].passes("hi")
    # A check built in code names its constraint too.
    from gatt.data.checks import Constraint

    made = Constraint("mine", "Say hi.", "hi", (Check("python", {"function": "user_checks_mod:boom"}),))
    with pytest.raises(CheckError, match=r"^constraint 'mine': python check 'user_checks_mod:boom' raised"):
        made.checks[0].passes("hi")


def test_a_python_check_rejects_candidates_in_synthesis(checks_module, tmp_path):
    [tennis] = load_constraints(write_constraints(tmp_path / "c.yaml", TENNIS))
    config = SynthesisConfig(num_dialogues=4, min_turns=3, max_turns=5, samples_per_turn=2, probe_prob=0.0)
    summary = synthesize(tmp_path / "out", config, PersonaTeacher(), [tennis], split_user_turns()[0])
    records = [json.loads(line) for line in (tmp_path / "out" / "gatt.jsonl").read_text().splitlines()]
    replies = [m["content"] for r in records for m in r["messages"][1::2]]
    assert summary["records"] == 4 and replies and all("tennis" in reply for reply in replies)
    assert summary["rejected_candidates"] == len(replies)  # every first candidate said golf
    assert records[0]["constraints"][0]["checks"] == TENNIS["checks"]


def test_a_python_check_that_raises_stops_synthesis_with_one_line_naming_it(checks_module, tmp_path):
    entry = {**TENNIS, "checks": [{"type": "python", "function": "user_checks_mod:boom"}]}
    path = write_constraints(tmp_path / "c.yaml", entry)
    with pytest.raises(
        SystemExit, match=r"^error: .*'tennis' checks\[0\]: python check 'user_checks_mod:boom' raised RuntimeError"
    ):
        data_gen_main(
            [
                "gatt",
                "--teacher",
                "oracle",
                "--num-dialogues",
                "2",
                "--out",
                str(tmp_path / "o"),
                "--constraints",
                str(path),
            ]
        )


def _passes_in_child(check: Check) -> list[bool]:
    return [check.passes("tennis every day"), check.passes("golf")]


def test_a_python_check_is_imported_by_name_in_a_spawned_process(checks_module):
    check = Check.from_dict({"type": "python", "function": "user_checks_mod:mentions", "args": {"word": "tennis"}})
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        # a child stuck past the timeout fails the test; leaving the block terminates it
        assert pool.apply_async(_passes_in_child, (check,)).get(timeout=120) == [True, False]


# --- the report: a persona and a python check through `python -m gatt.eval.evaluate` ------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    texts = [f"Tell me about topic {i}. Tennis, golf and Marie Curie, {i * 7} times." for i in range(200)]
    tokenizer = train_tokenizer(texts, vocab_size=400)
    config = GattConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model")
    GattForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def eval_args(model_dir: Path, constraints: Path, out: Path) -> list[str]:
    turns = out.parent / "turns.txt"
    turns.write_text("\n".join(f"Question number {i} about tennis and chemistry?" for i in range(12)) + "\n")
    return [
        "--model",
        f"base={model_dir}",
        "--turns",
        "6",
        "--dialogues",
        "4",
        "--no-instruction-dialogues",
        "1",
        "--max-new-tokens",
        "8",
        "--constraints",
        str(constraints),
        "--user-turns",
        str(turns),
        "--out",
        str(out),
        "--no-attention",
    ]


def test_the_report_scores_a_persona_on_probes_alone_and_runs_python_checks(checks_module, model_dir, tmp_path):
    constraints = write_constraints(tmp_path / "c.yaml", PERSONA, TENNIS)
    report = evaluate_main(eval_args(model_dir, constraints, tmp_path / "out"))
    transcripts = [json.loads(line) for line in (tmp_path / "out" / "transcripts.jsonl").read_text().splitlines()]
    persona = [t for t in transcripts if t["constraint"] and t["constraint"]["name"] == "curie"]
    tennis = [t for t in transcripts if t["constraint"] and t["constraint"]["name"] == "tennis"]
    assert persona and tennis
    kinds = Counter((turn["kind"], turn["passed"] is None) for t in persona for turn in t["turns"])
    assert kinds[("chat", True)] > 0 and kinds[("probe", False)] > 0 and kinds[("chat", False)] == 0
    probe_turns = [turn for t in persona for turn in t["turns"] if turn["kind"] == "probe"]
    assert report["base"]["per_family"]["persona"]["overall"]["n"] == len(probe_turns)
    for turn in (turn for t in tennis for turn in t["turns"] if turn["kind"] == "chat"):
        assert turn["checks"] == [{"type": "python", "passed": "tennis" in turn["reply"].lower()}]
        assert turn["passed"] == (turn["checks_passed"] and turn["gate"]["passed"])
    # Every reply has the gate's verdict; these user turns have no on-topic checks, so relevance was measured.
    assert all(
        turn["gate"]["relevance"] is not None
        for t in transcripts
        for turn in t["turns"]
        if turn["kind"] == "chat" and turn["reply"].strip()
    )


def test_the_report_stops_with_one_line_naming_a_python_check_that_raises(checks_module, model_dir, tmp_path):
    constraints = write_constraints(
        tmp_path / "c.yaml", {**TENNIS, "checks": [{"type": "python", "function": "user_checks_mod:boom"}]}
    )
    with pytest.raises(SystemExit, match=r"^error: .*'tennis' checks\[0\]: python check 'user_checks_mod:boom' raised"):
        evaluate_main(eval_args(model_dir, constraints, tmp_path / "out"))


def test_the_report_and_synthesis_refuse_a_python_check_that_cannot_be_imported(checks_module, model_dir, tmp_path):
    constraints = write_constraints(
        tmp_path / "c.yaml", {**TENNIS, "checks": [{"type": "python", "function": "nowhere_mod:f"}]}
    )
    expected = r"constraints\[0\] 'tennis' checks\[0\]: field 'function' 'nowhere_mod:f' cannot be imported"
    with pytest.raises(SystemExit, match=expected):
        evaluate_main(eval_args(model_dir, constraints, tmp_path / "out"))
    with pytest.raises(SystemExit, match=expected):
        data_gen_main(
            [
                "gatt",
                "--teacher",
                "oracle",
                "--num-dialogues",
                "2",
                "--out",
                str(tmp_path / "o"),
                "--constraints",
                str(constraints),
            ]
        )


def test_each_stage_imports_the_check_in_its_own_process(checks_module, model_dir, tmp_path):
    constraints = write_constraints(
        tmp_path / "c.yaml",
        {**TENNIS, "checks": [{"type": "python", "function": "user_checks_mod:long_enough", "args": {"n": 2}}]},
    )
    # The module is found from the working directory, as `python -m` finds it, with no PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [
        sys.executable,
        "-m",
        "data_gen",
        "gatt",
        "--teacher",
        "oracle",
        "--num-dialogues",
        "2",
        "--min-turns",
        "2",
        "--max-turns",
        "3",
        "--out",
        str(tmp_path / "data"),
        "--constraints",
        str(constraints),
    ]
    done = processes.run(run, tmp_path / "data.log", timeout_s=300, env=env, cwd=checks_module, split_errors=True)
    assert done.returncode == 0, done.errors[-2000:]
    assert json.loads(done.output)["records"] == 2
    run = [sys.executable, "-m", "gatt.eval.evaluate", *eval_args(model_dir, constraints, tmp_path / "report")]
    done = processes.run(run, tmp_path / "report.log", timeout_s=300, env=env, cwd=checks_module, split_errors=True)
    assert done.returncode == 0, done.errors[-2000:]
    checks = [
        c
        for line in (tmp_path / "report" / "transcripts.jsonl").read_text().splitlines()
        for turn in json.loads(line)["turns"]
        for c in turn["checks"]
    ]
    assert any(c["type"] == "python" for c in checks)
