"""The stages a real chat model adds: one-turn pass rates (what a teacher can produce) and replay data (the model's
own gated answers without an instruction)."""

import json
from collections import Counter

import pytest

from data_gen.__main__ import main
from data_gen.pass_rate import PassRateConfig, format_pass_rates, measure_pass_rates
from data_gen.synthesis import SynthesisConfig, synthesize
from data_gen.teacher import ModelTeacher, TurnRequest
from data_gen.user_turns import UserTurn, split_user_turns
from gatt.data.check_types import Check
from gatt.data.checks import Constraint, Probe
from gatt.data.collator import GAttCollator
from gatt.eval.gate import REASONS
from gatt.model.tokenizer import train_tokenizer

POOL = [UserTurn("Tell me about owls.", "owls"), UserTurn("What do you know about volcanoes?", "volcanoes")]
OK = Constraint("ok", "Open with ok.", "Opening: ok", (Check("regex", {"pattern": "^ok"}),), family="opening")
NEVER = Constraint("zz", "Open with zz.", "Opening: zz", (Check("regex", {"pattern": "^zz"}),), family="never")
PERSONA = Constraint(
    "curie",
    "Act as Marie Curie.",
    "Persona: Curie",
    (),
    family="persona",
    probes=(Probe("Who are you?", (Check("contains_any", {"words": ["Curie"]}),)),),
)


class HalfTeacher:
    """k candidates: the first obeys and names the topic, the second obeys and is off topic, the rest disobey."""

    name = "half"
    scorer = None

    def __init__(self) -> None:
        self.requests: list[TurnRequest] = []

    def sample(self, requests: list[TurnRequest], k: int) -> list[list[str]]:
        self.requests += requests
        out = []
        for r in requests:
            if r.turn.topic is None:  # a probe
                out.append(["I am Marie Curie.", "I am an assistant."][:k])
            else:
                out.append([f"ok, {r.turn.text} Remarkable.", "ok, nice weather.", "no."][:k])
        return out

    def seed(self, seed: int) -> None:
        pass


def test_pass_rates_count_checks_gate_and_best_of_k_per_constraint_and_family():
    teacher = HalfTeacher()
    result = measure_pass_rates(teacher, [OK, NEVER, PERSONA], POOL, PassRateConfig(prompts=4, samples=3))
    ok, never, persona = (result["per_constraint"][n] for n in ("ok", "zz", "curie"))
    assert ok == {
        "family": "opening",
        "split": "train",
        "candidates": 12,
        "checks": pytest.approx(8 / 12, abs=1e-4),
        "checks_and_gate": pytest.approx(4 / 12, abs=1e-4),
        "prompts": 4,
        "best_of_k": 1.0,
        # Why: "no." fails the check (4 prompts, so 4 times); "ok, nice weather." passes it and is off topic.
        "rejected": 8,
        "rejection_reasons": {"off_topic": 4, "regex": 4},
        "rejection_example": {
            "reason": "off_topic",
            "user": ok["rejection_example"]["user"],
            "reply": "ok, nice weather.",
        },
    }
    assert ok["rejection_example"]["user"] in [t.text for t in POOL]
    assert (never["checks"], never["checks_and_gate"], never["best_of_k"]) == (0.0, 0.0, 0.0)
    assert (never["rejected"], never["rejection_reasons"]) == (12, {"regex": 12})  # the checks: the gate never judged
    assert never["rejection_example"]["reply"].startswith("ok, ")  # the HalfTeacher's first reply: checked first
    assert persona["rejection_reasons"] == {"contains_any": 4}
    assert persona["rejection_example"] == {
        "reason": "contains_any",
        "user": "Who are you?",
        "reply": "I am an assistant.",
    }
    # A persona without per-reply checks is asked its probes, and judged by the probes' checks.
    assert (persona["candidates"], persona["checks"], persona["best_of_k"]) == (8, 0.5, 1.0)
    assert all(r.turn.text == "Who are you?" for r in teacher.requests if r.constraints[0] is PERSONA)
    # The instruction is appended to the user turn, its short form for half the prompts.
    texts = [r.messages[0]["content"] for r in teacher.requests if r.constraints[0] is OK]
    assert sum(t.endswith(OK.instruction) for t in texts) == 2 == sum(t.endswith(OK.short) for t in texts)
    assert list(result["per_family"]) == ["never", "opening", "persona"]
    assert result["per_family"]["opening"]["rejection_reasons"] == {"off_topic": 4, "regex": 4}
    printed = format_pass_rates(result)
    assert "| opening | 12 | 67% | 33% | 100% | off_topic 4, regex 4 |" in printed
    assert table_rows(printed, "constraint")[0][-1] == "off_topic 4, regex 4"
    examples = table_rows(printed, "constraint | commonest reason")
    assert examples[0][:2] == ["ok", "off_topic"] and examples[0][3] == "ok, nice weather."
    assert [row[:2] for row in examples] == [["ok", "off_topic"], ["zz", "regex"], ["curie", "contains_any"]]


def test_a_demonstration_puts_a_passing_exchange_of_the_same_constraint_before_each_prompt():
    teacher = HalfTeacher()
    config = PassRateConfig(prompts=4, samples=3, demonstration=True)
    result = measure_pass_rates(teacher, [OK, NEVER, PERSONA], POOL, config)
    assert result["settings"]["demonstrated"] == ["curie", "ok"]  # "zz": no reply of the first draw passed
    measured = [r for r in teacher.requests if len(r.messages) == 3]  # demonstration, its reply, the prompt
    assert {r.constraints[0].name for r in measured} == {"ok", "curie"}
    for r in measured:
        demo_user, demo_reply, prompt = r.messages
        assert (demo_user["role"], demo_reply["role"], prompt["role"]) == ("user", "assistant", "user")
        # the first reply that passed checks and gate: the on-topic "ok, ..." (the off-topic one fails the gate)
        asked = next(t for t in [*POOL, UserTurn("Who are you?", None)] if demo_user["content"].startswith(t.text))
        expected = "I am Marie Curie." if r.constraints[0] is PERSONA else f"ok, {asked.text} Remarkable."
        assert demo_reply["content"] == expected
    never = [r for r in teacher.requests if r.constraints[0] is NEVER]
    assert never and all(len(r.messages) == 1 for r in never)  # measured without a demonstration
    assert result["per_constraint"]["ok"]["prompts"] == 4  # the first draw is not counted


def table_rows(text: str, first: str) -> list[list[str]]:
    """The cells of each row of the printed markdown table whose header starts with `first`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    rows = []
    for line in lines[start + 2 :]:  # past the header and its |---| line
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def percents(rates: dict) -> list[str]:
    return [f"{rates[key]:.0%}" for key in ("checks", "checks_and_gate", "best_of_k")]


def reasons_cell(rates: dict) -> str:
    """The "rejected for" cell the JSON's `rejection_reasons` should print as."""
    return ", ".join(f"{reason} {n}" for reason, n in rates["rejection_reasons"].items()) or "-"


def constraint_rows(result: dict) -> list[list[str]]:
    """The per-constraint rows the JSON says should be printed (without the column of checks without instruction)."""
    return [
        [name, r["family"], r["split"], str(r["prompts"]), str(r["candidates"]), *percents(r), reasons_cell(r)]
        for name, r in result["per_constraint"].items()
    ]


def test_pass_rate_command_writes_json_for_the_builtin_catalogue(tmp_path, capsys):
    main(["pass-rate", "--teacher", "oracle", "--prompts", "2", "--samples", "1", "--out", str(tmp_path / "p.json")])
    result = json.loads((tmp_path / "p.json").read_text())
    printed = capsys.readouterr()
    assert json.loads(printed.out) == result["per_family"]
    # The toy world's oracle obeys every constraint and names every topic.
    assert all(r["checks_and_gate"] == 1.0 for r in result["per_constraint"].values())
    assert result["settings"]["constraints"] == "built-in" and result["settings"]["repetition_penalty"] == 1.0
    # Printed: a row per constraint, then a row per family, each with the JSON's figures.
    rows = table_rows(printed.err, "constraint")
    assert rows == constraint_rows(result) and len(rows) == len(result["per_constraint"]) > 100
    assert all(row[3] == "2" and row[5:] == ["100%"] * 3 + ["-"] for row in rows)  # "-": nothing rejected
    families = table_rows(printed.err, "family")
    assert [[f, str(r["candidates"]), *percents(r), "-"] for f, r in result["per_family"].items()] == families
    assert all(r["rejected"] == 0 and r["rejection_example"] is None for r in result["per_constraint"].values())
    assert "| constraint | commonest reason |" not in printed.err  # no rejected reply to show


class Bar:
    """A stand-in for tqdm that records what the bar was told."""

    made: list["Bar"] = []

    def __init__(self, *args, **kwargs) -> None:
        self.kwargs, self.updates = kwargs, []
        Bar.made.append(self)

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int = 1) -> None:
        self.updates.append(n)

    def set_postfix(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def test_pass_rate_prints_a_row_per_constraint_with_the_jsons_figures_and_steps_per_constraint(
    tmp_path, capsys, monkeypatch
):
    # A constraint file without families, measured on the shipped chat model at toy size.
    (tmp_path / "mine.yaml").write_text(
        "constraints:\n"
        "  - {name: anything, instruction: Answer., short: 'Answer', checks: [{type: regex, pattern: '(?s).*'}]}\n"
        "  - {name: never, instruction: Start with ZZZ., short: 'Start: ZZZ', checks: [{type: startswith, text: ZZZ}]}\n"
        "  - {name: curie, instruction: Act as Marie Curie., short: 'Persona: Curie', checks: [],\n"
        "     probes: [{question: 'Who are you?', checks: [{type: contains_any, words: [Curie]}]}]}\n"
    )
    monkeypatch.setattr("data_gen.pass_rate.tqdm", Bar)
    Bar.made = []
    out = tmp_path / "p.json"
    main(
        [
            "pass-rate",
            "--teacher",
            "embedded",
            "--constraints",
            str(tmp_path / "mine.yaml"),
            "--prompts",
            "2",
            "--samples",
            "2",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    printed = capsys.readouterr()
    (bar,) = Bar.made
    assert bar.kwargs["total"] == 6 and bar.updates == [2, 2, 2]  # a step per constraint, not one for the run
    rows = table_rows(printed.err, "constraint")
    assert rows == constraint_rows(result)  # one row per constraint, in the file's order, with the JSON's figures
    assert [row[:5] for row in rows] == [[name, "custom", "train", "2", "4"] for name in ("anything", "never", "curie")]
    assert rows[0][5] == "100%" and rows[1][5:8] == ["0%"] * 3  # every reply matches '.*'; none starts with ZZZ
    assert rows[1][8] == "startswith 4"  # and says so
    assert "\n| family |" not in printed.err  # no family given: the per-constraint table says it all
    assert json.loads(printed.out) == result["per_family"] and list(result["per_family"]) == ["custom"]


def test_pass_rate_says_why_the_small_models_replies_were_rejected(tmp_path, capsys, monkeypatch):
    # The shipped chat model at toy size, asked questions without topic words and cut at 3 tokens: the gate judges
    # relevance by the teacher's likelihood contrast (a 3-token reply carries little of it), and no reply starts
    # with ZZZ.
    (tmp_path / "mine.yaml").write_text(
        "constraints:\n"
        "  - {name: anything, instruction: Answer., short: 'Answer', checks: [{type: regex, pattern: '(?s).*'}]}\n"
        "  - {name: never, instruction: Start with ZZZ., short: 'Start: ZZZ', checks: [{type: startswith, text: ZZZ}]}\n"
    )
    (tmp_path / "turns.txt").write_text(
        "Can you help me plan a trip to Lisbon next spring?\nWhat should I cook for dinner tonight?\n"
        "How do I fix a flat bicycle tyre?\nWhy is the sky blue?\n"
    )
    written: dict[str, list[str]] = {}  # each constraint's candidates, as the teacher wrote them
    sample = ModelTeacher.sample

    def recording(self, requests, k):
        out = sample(self, requests, k)
        for request, candidates in zip(requests, out):
            written.setdefault(request.constraints[0].name, []).extend(candidates)
        return out

    monkeypatch.setattr(ModelTeacher, "sample", recording)
    out = tmp_path / "p.json"
    args = ["--constraints", str(tmp_path / "mine.yaml"), "--user-turns", str(tmp_path / "turns.txt")]
    args += ["--prompts", "4", "--samples", "2", "--max-new-tokens", "3", "--device", "cpu", "--out", str(out)]
    main(["pass-rate", "--teacher", "embedded", *args])
    result = json.loads(out.read_text())
    printed = capsys.readouterr().err
    anything, never = result["per_constraint"]["anything"], result["per_constraint"]["never"]
    # Nothing starts with ZZZ: every candidate is rejected by the check, and the gate judged none of them.
    assert never["rejected"] == never["candidates"] == len(written["never"]) == 8
    assert never["rejection_reasons"] == {"startswith": 8}
    assert never["rejection_example"]["reason"] == "startswith"
    assert never["rejection_example"]["reply"] == written["never"][0]  # the first one rejected
    assert never["rejection_example"]["user"] in (tmp_path / "turns.txt").read_text().splitlines()
    # Every reply matches '.*': what is rejected, the gate rejected, each reply for one reason at least.
    assert anything["checks"] == 1.0 and anything["checks_and_gate"] < 1.0
    gated = round(anything["checks_and_gate"] * anything["candidates"])
    assert anything["rejected"] == anything["candidates"] - gated > 0
    assert set(anything["rejection_reasons"]) <= set(REASONS) and "off_topic" in anything["rejection_reasons"]
    assert sum(anything["rejection_reasons"].values()) >= anything["rejected"]
    example = anything["rejection_example"]
    assert example["reason"] == next(iter(anything["rejection_reasons"])) and example["reply"] in written["anything"]
    # A family's reasons are its constraints' summed, commonest first.
    family = result["per_family"]["custom"]["rejection_reasons"]
    assert family == Counter(anything["rejection_reasons"]) + Counter(never["rejection_reasons"])
    assert list(family.values()) == sorted(family.values(), reverse=True)
    assert result["per_family"]["custom"]["rejected"] == anything["rejected"] + never["rejected"]
    # Printed: the reasons ending each row, then each constraint's commonest reason with its example.
    assert table_rows(printed, "constraint") == constraint_rows(result)
    examples = table_rows(printed, "constraint | commonest reason")
    assert examples == [
        [
            name,
            r["rejection_example"]["reason"],
            r["rejection_example"]["user"],
            " ".join(r["rejection_example"]["reply"].split()),
        ]
        for name, r in result["per_constraint"].items()
    ]


def test_pass_rate_measures_every_ifeval_type_on_one_drawn_value_each(tmp_path, capsys):
    from gatt.data.constraint_sets import available

    out = tmp_path / "p.json"
    args = ["--constraints", "ifeval", "--values-per-family", "1", "--prompts", "1", "--samples", "1"]
    args += ["--without-instruction", "--max-new-tokens", "4", "--device", "cpu"]
    main(["pass-rate", "--teacher", "embedded", *args, "--out", str(out)])
    result = json.loads(out.read_text())
    assert list(result["per_family"]) == sorted(f"ifeval:{t}" for t in available("ifeval"))
    assert len(result["per_constraint"]) == len(result["per_family"])  # one parameter draw of each type
    assert all(r["prompts"] == 1 and r["candidates"] == 1 for r in result["per_constraint"].values())
    assert result["settings"]["constraints"] == "ifeval" and result["settings"]["without_instruction"]
    rows = table_rows(capsys.readouterr().err, "constraint")
    # and, before the reasons, a column of the checks without instruction
    assert [row[:-2] + row[-1:] for row in rows] == constraint_rows(result)
    bare = [r["without_instruction"] for r in result["per_constraint"].values()]
    assert [row[-2] for row in rows] == [f"{b['checks']:.0%}" for b in bare]
    assert all(b["checks_and_gate"] <= b["checks"] <= 1 for b in bare)


def test_replay_dialogues_carry_no_instruction_and_train_as_plain_sft(tmp_path):
    teacher = HalfTeacher()
    config = SynthesisConfig(num_dialogues=4, min_turns=2, max_turns=3, samples_per_turn=2, shard_size=2)
    summary = synthesize(tmp_path, config, teacher, [], POOL, name="replay")
    records = [json.loads(line) for line in (tmp_path / "replay.jsonl").read_text().splitlines()]
    assert summary["records"] == len(records) == 4 and (tmp_path / "replay.summary.json").exists()
    assert not (tmp_path / "gatt.jsonl").exists()
    # The teacher saw the bare user messages; the kept reply is the on-topic one.
    assert {r.messages[-1]["content"] for r in teacher.requests} <= {t.text for t in POOL}
    for record in records:
        assert record["instruction"] is None and record["constraints"] == []
        assert all(
            m["content"].startswith("ok, ") and "Remarkable" in m["content"]
            for m in record["messages"]
            if m["role"] == "assistant"
        )
    assert summary["gate_failed"]["off_topic"] >= 1 and summary["pass_rate_per_family"] == {}
    tokenizer = train_tokenizer([m["content"] for r in records for m in r["messages"]], vocab_size=300)
    (example,) = GAttCollator(tokenizer, mode="all").examples(records[0])
    assert sum(label != -100 for label in example.labels) > 0  # every reply is supervised, no system message
    assert "system" not in tokenizer.decode(example.input_ids)


def test_replay_needs_a_model_teacher(tmp_path):
    with pytest.raises(SystemExit, match="--teacher must be a model directory"):
        main(["replay", "--teacher", "oracle", "--num-dialogues", "2", "--out", str(tmp_path)])


def test_a_demonstration_opens_the_teachers_prompt_and_stays_out_of_the_records(tmp_path):
    train, _ = split_user_turns()
    demo = [
        {"role": "user", "content": "Tell me about owls. Opening: ok"},
        {"role": "assistant", "content": "ok, owls hoot."},
    ]
    config = SynthesisConfig(
        num_dialogues=4, min_turns=2, max_turns=3, samples_per_turn=3, shard_size=2, demonstration=True
    )
    teacher = HalfTeacher()
    synthesize(tmp_path, config, teacher, [OK], train, demonstrate=lambda: {"ok": demo})
    assert teacher.requests and all(r.messages[:2] == demo and len(r.messages) % 2 == 1 for r in teacher.requests)
    records = [json.loads(line) for line in (tmp_path / "gatt.jsonl").read_text().splitlines()]
    assert records and all("owls hoot" not in m["content"] for r in records for m in r["messages"])
    assert json.loads((tmp_path / "gatt.shards" / "demonstrations.json").read_text()) == {"ok": demo}
    # Resumed: the kept demonstrations are used; nothing is drawn again.
    (tmp_path / "gatt.shards" / "shard-00001.jsonl").unlink()
    again = HalfTeacher()
    synthesize(tmp_path, config, again, [OK], train, demonstrate=None)
    assert again.requests and all(r.messages[:2] == demo for r in again.requests)


def test_gatt_summary_gives_the_teachers_pass_rate_per_family(tmp_path):
    train, _ = split_user_turns()
    config = SynthesisConfig(num_dialogues=6, min_turns=2, max_turns=3, samples_per_turn=3)
    summary = synthesize(tmp_path / "ok", config, HalfTeacher(), [OK], train)
    # Per turn: 3 candidates, 2 pass the check and 1 of those is on topic.
    assert summary["pass_rate_per_family"] == {"opening": pytest.approx(1 / 3, abs=1e-4)}
    assert summary["yield_per_family"] == {"opening": 1.0}
    # and why the other two were rejected: "no." fails the check, "ok, nice weather." the gate (off topic)
    third = summary["candidates"] // 3
    assert summary["rejection_reasons"] == {"opening": {"off_topic": third, "regex": third}}
    assert summary["gate_failed"]["off_topic"] == third  # the gate's own count, over every family
    summary = synthesize(tmp_path / "never", config, HalfTeacher(), [NEVER], train)
    assert summary["pass_rate_per_family"] == {"never": 0.0} and summary["records"] == 0
    assert summary["rejection_reasons"] == {"never": {"regex": summary["candidates"]}}  # the gate judged none
