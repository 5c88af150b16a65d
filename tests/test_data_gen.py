"""data_gen: catalogue, toy world, base corpus, GAtt synthesis (oracle and model teachers), CLI, resume."""

import itertools
import json
import random
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from data_gen.__main__ import main
from data_gen.constraints import (
    FAMILIES,
    HELDOUT_FAMILIES,
    ConstraintSampler,
    catalogue,
    conflict,
    instruction_text,
    limit_families,
    limit_values,
)
from data_gen.synthesis import SynthesisConfig, _Dialogue, synthesize_shard
from data_gen.teacher import TurnRequest
from data_gen.toy_world import ToyResponder, base_corpus
from data_gen.user_turns import UserTurn, all_user_turns, split_user_turns
from gatt.data.check_types import Check
from gatt.data.checks import Constraint, passes_all, reply_checks
from gatt.io.processes import ProcessTree

ROOT = Path(__file__).resolve().parents[1]


def gatt_args(out: Path, *extra: str, n: int = 40, seed: int = 0) -> list[str]:
    return [
        "gatt",
        "--teacher",
        "oracle",
        "--num-dialogues",
        str(n),
        "--min-turns",
        "2",
        "--max-turns",
        "12",
        "--samples-per-turn",
        "2",
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--shard-size",
        "8",
        *extra,
    ]


def catalogue_without_language(folder: Path) -> tuple[str, str]:
    """`--constraints FILE`, FILE the built-in catalogue less its `language` family (written in `folder`): the
    process tests of the synthesis machinery (sharding, resuming) then never load the language detector, ~9 s and
    ~1 GB a process."""
    path = folder / "catalogue-without-language.yaml"
    main(["constraints", "--families", *sorted({c.family for c in catalogue()} - {"language"}), "--out", str(path)])
    return "--constraints", str(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def gatt_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("gatt")
    main(gatt_args(out, n=60))
    return out, read_jsonl(out / "gatt.jsonl")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("base")
    main(["base", "--num-dialogues", "1500", "--seed", "0", "--out", str(out)])
    return read_jsonl(out / "base.jsonl")


# --- catalogue -------------------------------------------------------------------------------


def test_shortened_form_rate_is_about_half():
    sampler, rng = ConstraintSampler(catalogue()), random.Random(0)
    rate = sum(sampler.sample(rng)[1] for _ in range(1000)) / 1000
    assert 0.4 <= rate <= 0.6


def test_combinations_hold_one_constraint_per_family_and_never_conflict():
    sampler, rng = ConstraintSampler(catalogue()), random.Random(1)
    sizes = Counter()
    for _ in range(1000):
        chosen, _ = sampler.sample(rng)
        families = [c.family for c in chosen]
        sizes[len(chosen)] += 1
        assert len(set(families)) == len(families)
        assert not any(conflict(a, b) for a in families for b in families if a != b)
    assert set(sizes) == {1, 2, 3}


def test_by_family_draws_the_first_family_uniformly_whatever_its_size():
    rng = random.Random(2)
    by_value, by_family = ConstraintSampler(catalogue()), ConstraintSampler(catalogue(), by_family=True)
    first = {s.by_family: Counter(s.sample(rng)[0][0].family for _ in range(6000)) for s in (by_value, by_family)}
    assert set(first[True]) == set(FAMILIES)
    for family, count in first[True].items():  # 22 hobbies and one all-caps rule are drawn alike
        assert abs(count / 6000 - 1 / len(FAMILIES)) < 0.02, (family, count)
    assert first[False]["hobby"] > 10 * first[False]["caps"]


def test_each_dialogue_draws_one_wording_of_each_instruction():
    sampler = ConstraintSampler(catalogue(), by_family=True)
    rng = random.Random(0)
    by_name = {c.name: c for c in catalogue()}
    seen: dict[str, set[str]] = {}
    for _ in range(3000):
        for drawn in sampler.sample(rng)[0]:
            canonical = by_name[drawn.name]
            assert drawn.instruction in (canonical.instruction, *canonical.paraphrases)
            assert replace(drawn, instruction=canonical.instruction) == canonical  # only the wording differs
            seen.setdefault(drawn.name, set()).add(drawn.instruction)
    assert seen["caps:all caps"] == {by_name["caps:all caps"].instruction, *by_name["caps:all caps"].paraphrases}


def test_values_per_family_keeps_a_fixed_draw_of_k_values_of_every_family():
    train = [c for c in catalogue() if c.split == "train"]
    two = limit_values(train, 2)
    counts = Counter(c.family for c in two)
    assert counts == {f: min(2, n) for f, n in Counter(c.family for c in train).items()}
    names = {c.name for c in two}
    assert two == limit_values(train, 2) and names <= {
        c.name for c in limit_values(train, 8)
    }  # more values: a superset
    with pytest.raises(ValueError, match="values per family must be >= 1"):
        limit_values(train, 0)


def test_every_family_has_full_short_forms_probes_and_a_fixed_heldout_split():
    constraints = catalogue()
    assert {c.family for c in constraints} == set(FAMILIES)
    for c in constraints:
        assert c.instruction and c.short and c.checks and c.probes and c.short != c.instruction
    by_family = {f: [c for c in constraints if c.family == f] for f in FAMILIES}
    for family in ("hobby", "figure", "signoff"):
        splits = Counter(c.split for c in by_family[family])
        assert splits["heldout"] >= 1 and splits["train"] > splits["heldout"]
    # The held-out tiers' families are held out whole by default, every value of them (language, brevity among them)
    assert "language" in HELDOUT_FAMILIES and "brevity" in HELDOUT_FAMILIES
    for family in FAMILIES:
        held_out_whole = all(c.split == "heldout" for c in by_family[family])
        assert held_out_whole == (family in HELDOUT_FAMILIES), family
    assert [c.split for c in catalogue()] == [c.split for c in constraints]  # fixed seed
    assert instruction_text(by_family["language"][:1], short=True) == "Language: French"
    with pytest.raises(ValueError, match="unknown held-out families"):
        catalogue(heldout_families=["weather"])


# --- toy world ---------------------------------------------------------------------------------


def test_oracle_replies_pass_their_checks_for_every_constraint_and_probe():
    constraints = catalogue()
    responder = ToyResponder(constraints)
    questions = dict.fromkeys(p.question for c in constraints for p in c.probes)
    turns = all_user_turns()[::97] + [UserTurn(question, None) for question in questions]
    for constraint in constraints:
        for turn in turns:
            reply = responder.reply(turn, [constraint])
            assert passes_all(reply, reply_checks([constraint], turn.text)), (constraint.name, turn.text, reply)


def test_oracle_obeys_every_pair_of_families_that_do_not_conflict():
    # The conflicts in catalogue.yaml are exactly what keeps a combined instruction satisfiable: every other
    # pair (first and last value of each, every language) passes both families' checks on chat and probe turns.
    by_family: dict[str, list] = {}
    for c in catalogue():
        by_family.setdefault(c.family, []).append(c)
    responder = ToyResponder(catalogue())
    chat = all_user_turns()[::211]
    pairs = 0
    for a, b in itertools.combinations(FAMILIES, 2):
        assert conflict(a, b) == conflict(b, a)
        if conflict(a, b):
            continue
        pairs += 1
        for first, second in ((by_family[a][0], by_family[b][0]), (by_family[a][-1], by_family[b][-1])):
            probes = [UserTurn(p.question, None) for p in (*first.probes, *second.probes)]
            for turn in (*chat, *probes):
                reply = responder.reply(turn, [first, second])
                assert passes_all(reply, reply_checks([first, second], turn.text)), (first.name, second.name, reply)
    assert pairs > 400  # most of the space combines
    assert conflict("brevity", "hobby") and conflict("caps", "signoff") and conflict("caps", "lowercase")


def test_trained_families_keeps_a_fixed_draw_of_k_families():
    train = [c for c in catalogue() if c.split == "train"]
    five = limit_families(train, 5)
    assert len({c.family for c in five}) == 5 and five == limit_families(train, 5)
    assert five == [c for c in train if c.family in {c.family for c in five}]  # every train value of each
    assert {c.name for c in five} <= {c.name for c in limit_families(train, 10)}  # more families: a superset
    assert limit_families(train, 100) == train
    with pytest.raises(ValueError, match="families must be >= 1"):
        limit_families(train, 0)


def test_oracle_stays_on_topic_and_answers_probes_by_default():
    responder = ToyResponder(catalogue())
    turn = next(t for t in all_user_turns() if t.topic == "volcanoes")
    assert responder.reply(turn).startswith("Volcanoes: ")
    assert (
        responder.reply(UserTurn("Who are you?", None))
        == "I am a helpful assistant. I am happy to help you with anything."
    )
    french = next(c for c in catalogue() if c.name == "language:French")
    figure = next(c for c in catalogue() if c.name == "figure:Napoleon")
    reply = responder.reply(turn, [french, figure])
    assert reply.startswith("Je suis Napoleon. Volcanoes : ")  # the user's words: the toy world copies, not translates


def test_a_word_limit_cuts_the_reply_to_its_first_words_and_keeps_the_final_punctuation():
    by_name = {c.name: c for c in catalogue()}
    responder = ToyResponder(catalogue())
    turn = next(t for t in all_user_turns() if t.topic == "volcanoes")
    four, exclaim = by_name["wordlimit:4"], by_name["exclaim:exclamation marks"]
    assert four.checks[0].type == "max_words" and four.checks[0].args["n"] == 4  # the pool's number, not text
    full = responder.reply(turn).split()
    assert responder.reply(turn, [four]) == " ".join(full[:4]).rstrip(",:;.!?") + "."
    assert responder.reply(turn, [four, exclaim]).endswith("!") and "." not in responder.reply(turn, [four, exclaim])
    eight = responder.reply(turn, [by_name["wordlimit:8"]]).split()
    assert eight[:7] == full[:7] and len(eight) == 8 and eight[7].rstrip(".") == full[7].rstrip(",:;.!?")


def test_each_hobby_is_followed_by_its_own_emoji_so_the_names_can_be_told_apart():
    responder = ToyResponder(catalogue())
    hobbies = [c for c in catalogue() if c.family == "hobby"]
    replies = {c.value: responder.reply(UserTurn("What is your favorite hobby?", None), [c]) for c in hobbies}
    assert replies["tennis"].startswith("My favorite hobby is tennis 🎾.")
    after = {reply.split(hobby, 1)[1].split()[0] for hobby, reply in replies.items()}
    assert len(after) == len(hobbies) == 22  # a distinct next token after every hobby name


# --- base corpus -------------------------------------------------------------------------------


def test_base_corpus_teaches_local_instructions_and_short_system_dialogues(base_run):
    kinds = Counter(r["kind"] for r in base_run)
    assert set(kinds) == {"local", "system", "plain"}
    for record in base_run:
        roles = [m["role"] for m in record["messages"]]
        body = roles[1:] if roles[0] == "system" else roles
        assert body == ["user", "assistant"] * (len(body) // 2) and body
        if record["kind"] == "system":
            assert roles[0] == "system" and len(body) // 2 <= 2
        else:
            assert roles[0] == "user"


def test_the_demo_base_corpus_teaches_every_value_and_every_wording_locally():
    # Held-out values and families (never in GAtt data) are taught here, as local instructions, as are the
    # paraphrases: every value in some wording, every wording of each family with some value.
    constraints = catalogue()
    records = base_corpus(20000, 0, constraints, split_user_turns()[0])  # the size make demo uses
    user_text = " ".join(
        m["content"] for r in records if r["kind"] == "local" for m in r["messages"] if m["role"] == "user"
    )
    taught: dict[str, set[int]] = {}
    for c in constraints:
        forms = (c.instruction, c.short, *c.paraphrases)
        seen = {i for i, form in enumerate(forms) if form in user_text}
        assert seen, (c.name, forms)
        taught.setdefault(c.family, set()).update(seen)
    assert all(len(seen) == 4 for seen in taught.values()), taught


# --- GAtt synthesis ----------------------------------------------------------------------------


def test_gatt_records_follow_the_format_and_keep_the_instruction_out_of_messages(gatt_run):
    out, records = gatt_run
    constraints = {c.name: c for c in catalogue()}
    heldout = {(c.family, c.value) for c in constraints.values() if c.split == "heldout"}
    assert len({r["id"] for r in records}) == len(records) > 0
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and len(roles) >= 4
        assert record["sampled_with_instruction"] == [True] * (len(roles) // 2)
        assert record["meta"] == {"teacher": "oracle", "seed": 0, "round": 1, "k": 2, "ended": "complete"}
        for constraint in record["constraints"]:
            assert (constraint["family"], constraint["value"]) not in heldout
            assert constraint["split"] == "train"
        for message in record["messages"]:
            assert record["instruction"] not in message["content"]
            assert record["instruction_short"] not in message["content"]
        # Every reply the oracle wrote passes the record's own checks.
        checks = [Check.from_dict(ch) for c in record["constraints"] for ch in c["checks"]]
        for message in record["messages"][1::2]:
            assert passes_all(message["content"], checks)


def test_a_later_round_draws_other_dialogues_and_records_its_round(gatt_run, tmp_path):
    out, first = gatt_run
    main([*gatt_args(tmp_path, n=60), "--round", "2"])
    second = read_jsonl(tmp_path / "gatt.jsonl")
    assert {r["meta"]["round"] for r in first} == {1} and {r["meta"]["round"] for r in second} == {2}
    assert [r["id"] for r in second] == [r["id"] for r in first]  # same indices, other draws
    drawn = lambda records: [(r["instruction"], r["messages"][0]["content"]) for r in records]  # noqa: E731
    assert sum(a == b for a, b in zip(drawn(first), drawn(second))) < len(first) // 4


def test_gatt_summary_and_datasets_loading(gatt_run):
    from datasets import load_dataset

    out, records = gatt_run
    summary = json.loads((out / "gatt.summary.json").read_text())
    assert summary["records"] == len(records) == 60 and summary["dropped"] == 0
    assert set(summary["yield_per_family"]) <= set(FAMILIES) - {"brevity"}
    assert sum(summary["turns"]["histogram"].values()) == len(records)
    dataset = load_dataset("json", data_files=str(out / "gatt.jsonl"), split="train")
    assert len(dataset) == len(records) and dataset[0]["messages"] == records[0]["messages"]


def test_same_seed_gives_byte_identical_output(tmp_path, gatt_run):
    out, _ = gatt_run
    main(gatt_args(tmp_path / "again", n=60))
    assert (tmp_path / "again" / "gatt.jsonl").read_bytes() == (out / "gatt.jsonl").read_bytes()
    main(gatt_args(tmp_path / "other", n=60, seed=1))
    assert (tmp_path / "other" / "gatt.jsonl").read_bytes() != (out / "gatt.jsonl").read_bytes()
    for run in ("b1", "b2"):
        main(["base", "--num-dialogues", "50", "--seed", "3", "--out", str(tmp_path / run)])
    assert (tmp_path / "b1" / "base.jsonl").read_bytes() == (tmp_path / "b2" / "base.jsonl").read_bytes()


def test_killed_generation_resumes_without_duplicates_or_losses(tmp_path):
    constraints = catalogue_without_language(tmp_path)
    command = [sys.executable, "-m", "data_gen", *gatt_args(tmp_path / "killed", *constraints, n=240)]
    process = ProcessTree(command, tmp_path / "killed.log", cwd=ROOT)
    shards = tmp_path / "killed" / "gatt.shards"
    deadline = time.time() + 120
    while len(list(shards.glob("shard-*.jsonl"))) < 3 and time.time() < deadline and process.process.poll() is None:
        time.sleep(0.05)
    process.kill()
    done = len(list(shards.glob("shard-*.jsonl")))
    assert 3 <= done < 30, "the run should have been killed part-way"
    assert not (tmp_path / "killed" / "gatt.jsonl").exists()
    main(gatt_args(tmp_path / "killed", *constraints, n=240))  # the same command resumes
    main(gatt_args(tmp_path / "whole", *constraints, n=240))
    resumed = (tmp_path / "killed" / "gatt.jsonl").read_bytes()
    assert resumed == (tmp_path / "whole" / "gatt.jsonl").read_bytes()
    ids = [r["id"] for r in read_jsonl(tmp_path / "killed" / "gatt.jsonl")]
    assert len(ids) == len(set(ids)) == 240


class ScriptedTeacher:
    """Answers "ok" until a dialogue's planned failure turn, then only failing candidates."""

    name = "scripted"
    scorer = None

    def __init__(self, fail_at: dict[int, int]) -> None:
        self.fail_at = fail_at

    def sample(self, requests: list[TurnRequest], k: int) -> list[list[str]]:
        out = []
        for request in requests:
            turn = sum(m["role"] == "assistant" for m in request.messages)
            dialogue = int(request.turn.text.split()[0])
            out.append(["bad"] * k if turn == self.fail_at.get(dialogue) else ["bad", f"ok, answer {turn}"][:k])
        return out


MUST_SAY_OK = Constraint("ok", "Say ok.", "ok", (Check("regex", {"pattern": "^ok"}),))


def test_a_turn_without_a_passing_candidate_ends_the_dialogue():
    dialogues = [_Dialogue(i, [MUST_SAY_OK], False, [UserTurn(f"{i} hi", None)] * 5, []) for i in range(3)]
    stats = Counter()
    config = SynthesisConfig(num_dialogues=3, samples_per_turn=2, redraws=0)
    synthesize_shard(dialogues, ScriptedTeacher({0: 3, 1: 1}), config, [], stats)
    assert [len(d.replies) for d in dialogues] == [3, 1, 5]  # cut at its first failing turn
    assert [d.ended for d in dialogues] == ["rejected", "rejected", "complete"]
    assert stats["rejected_turns"] == 2 and stats["candidates"] == 2 * (4 + 2 + 5)
    # Candidates looked at before a kept one, and both at each failing turn: (3 + 2) + (1 + 2) + 5.
    assert stats["rejected_candidates"] == 13


class RecordingBar:
    """A stand-in for tqdm: what it was made with, each update, and the postfix at that update."""

    made: list["RecordingBar"] = []

    def __init__(self, *args, **kwargs) -> None:
        self.kwargs, self.updates, self.postfix = kwargs, [], {}
        RecordingBar.made.append(self)

    def set_postfix(self, postfix=None, refresh=True, **kwargs) -> None:
        self.postfix = {**(postfix or {}), **kwargs}

    def update(self, n: int = 1) -> None:
        self.updates.append((n, dict(self.postfix)))

    def close(self) -> None:
        pass


def test_the_bar_steps_once_per_dialogue_as_it_ends_kept_or_dropped():
    dialogues = [_Dialogue(i, [MUST_SAY_OK], False, [UserTurn(f"{i} hi", None)] * 5, []) for i in range(3)]
    bar, tally = RecordingBar(), Counter()
    config = SynthesisConfig(num_dialogues=3, samples_per_turn=2, redraws=0)
    synthesize_shard(dialogues, ScriptedTeacher({0: 3, 1: 1}), config, [], Counter(), bar, tally)
    # Dialogue 1 ends at turn 2 with 1 reply (dropped: under min_turns 2), dialogue 0 at turn 4 with 3 (kept,
    # truncated), dialogue 2 completes turn 5: a step of one as each ends, not one step for the shard.
    assert [n for n, _ in bar.updates] == [1, 1, 1]
    assert [(p["turn"], p["active"], p["kept"], p["dropped"]) for _, p in bar.updates] == [
        (2, 2, 0, 1),
        (4, 1, 1, 1),
        (5, 0, 2, 1),
    ]
    assert tally == Counter(kept=2, dropped=1)


def test_the_synthesis_bar_counts_dialogues_as_they_end_and_resumed_shards_as_done(tmp_path, monkeypatch):
    monkeypatch.setattr("data_gen.synthesis.tqdm", RecordingBar)
    RecordingBar.made = []
    main(gatt_args(tmp_path / "run", n=20))  # shards of 8, 8 and 4
    whole = (tmp_path / "run" / "gatt.jsonl").read_bytes()
    summary = json.loads((tmp_path / "run" / "gatt.summary.json").read_text())
    (tmp_path / "run" / "gatt.shards" / "shard-00001.jsonl").unlink()  # as if killed while writing shard 1
    main(gatt_args(tmp_path / "run", n=20))
    assert (tmp_path / "run" / "gatt.jsonl").read_bytes() == whole
    first, resumed = RecordingBar.made
    assert first.kwargs["total"] == resumed.kwargs["total"] == 20
    assert first.kwargs["initial"] == 0 and [n for n, _ in first.updates] == [1] * 20
    assert resumed.kwargs["initial"] == 12 and [n for n, _ in resumed.updates] == [1] * 8  # shard 1 made again
    # The run's kept and dropped dialogues, those of resumed shards included.
    for bar in (first, resumed):
        assert (bar.postfix["kept"], bar.postfix["dropped"]) == (summary["records"], summary["dropped"])


class TopicTeacher:
    """Fails every candidate on user messages about one topic."""

    name = "topic"
    scorer = None

    def sample(self, requests: list[TurnRequest], k: int) -> list[list[str]]:
        return [["bad"] * k if r.turn.topic == "volcanoes" else [f"ok, {r.turn.text}"] * k for r in requests]


def test_a_failing_turn_is_redrawn_on_another_topic_before_the_dialogue_ends():
    pool = [UserTurn("Tell me about volcanoes.", "volcanoes"), UserTurn("Tell me about owls.", "owls")]
    turns = [pool[1], pool[0], pool[1]]
    config = SynthesisConfig(num_dialogues=2, samples_per_turn=2, redraws=1)
    dialogues = [_Dialogue(0, [MUST_SAY_OK], False, list(turns), [])]
    stats = Counter()
    synthesize_shard(dialogues, TopicTeacher(), config, pool, stats)
    assert dialogues[0].ended == "complete" and dialogues[0].replies == ["ok, Tell me about owls."] * 3
    assert [t.topic for t in dialogues[0].turns] == ["owls", "owls", "owls"]  # turn 2 asked again, on another topic
    assert stats["redrawn_turns"] == 1 and stats["rejected_turns"] == 0
    # Without redraws, or when every redraw fails too, the dialogue still ends at that turn.
    stuck = [_Dialogue(1, [MUST_SAY_OK], False, list(turns), [])]
    synthesize_shard(stuck, TopicTeacher(), config, pool[:1], Counter())
    assert stuck[0].ended == "rejected" and stuck[0].replies == ["ok, Tell me about owls."]


def tiny_teacher_dir(tmp_path: Path) -> Path:
    from gatt import GattConfig, GattForCausalLM
    from gatt.model.tokenizer import train_tokenizer

    tokenizer = train_tokenizer([t.text for t in all_user_turns()], vocab_size=400)
    config = GattConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    GattForCausalLM(config).save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    return tmp_path / "teacher"


def test_model_teacher_samples_k_candidates_and_rejection_drops_what_fails(tmp_path, capsys):
    teacher = tiny_teacher_dir(tmp_path)
    (tmp_path / "any.yaml").write_text(
        "constraints:\n  - {name: anything, instruction: Say anything., short: 'Say: anything', checks: [{type: regex, pattern: '(?s).*'}]}\n"
        "  - {name: never, instruction: Start with ZZZ., short: 'Start: ZZZ', family: never, checks: [{type: startswith, text: ZZZ}]}\n"
    )
    args = [
        "gatt",
        "--teacher",
        str(teacher),
        "--num-dialogues",
        "8",
        "--min-turns",
        "2",
        "--max-turns",
        "3",
        "--samples-per-turn",
        "2",
        "--max-new-tokens",
        "6",
        "--constraints",
        str(tmp_path / "any.yaml"),
    ]
    main([*args, "--out", str(tmp_path / "a")])
    summary = json.loads(capsys.readouterr().out)
    records = read_jsonl(tmp_path / "a" / "gatt.jsonl")
    # A random model never starts with ZZZ (the checks reject it) and never names the user's topic (the answer
    # gate rejects it: a random string is no answer): every dialogue fails turn 1 and its 2 redraws, and is dropped.
    never = sum("never" in r["families"] for r in read_jsonl(tmp_path / "a" / "gatt.shards" / "shard-00000.jsonl"))
    assert 0 < never < 8 and summary["dropped"] == 8 == summary["rejected_turns"] and records == []
    assert summary["candidates"] == 2 * 3 * 8 and summary["redrawn_turns"] == 2 * 8
    assert summary["gate_rejected_candidates"] == 2 * 3 * (8 - never)  # every candidate that passed the regex
    assert sum(summary["gate_failed"].values()) >= summary["gate_rejected_candidates"]
    main([*args, "--out", str(tmp_path / "b")])  # sampling is seeded per shard: same bytes again
    shard = Path("gatt.shards") / "shard-00000.jsonl"
    assert (tmp_path / "a" / shard).read_bytes() == (tmp_path / "b" / shard).read_bytes()


def test_model_teacher_keeps_each_dialogues_cache_and_matches_reencoding(tmp_path):
    from data_gen.teacher import ModelTeacher

    teacher_dir = tiny_teacher_dir(tmp_path)
    turns = [UserTurn(t.text, t.topic) for t in all_user_turns()[:12]]

    def run(keyed: bool) -> list[list[list[str]]]:
        # near-greedy sampling: the same draws pick the same tokens whether the history is cached or re-encoded
        teacher = ModelTeacher(teacher_dir, temperature=1e-4, max_new_tokens=8, batch_size=2)
        teacher.seed(0)
        histories = {d: [] for d in range(3)}
        out = []
        for t in range(4):
            requests = [
                TurnRequest(
                    [*h, {"role": "user", "content": turns[d + 3 * t].text}],
                    turns[d + 3 * t],
                    [],
                    key=str(d) if keyed else None,
                )
                for d, h in histories.items()
            ]
            candidates = teacher.sample(requests, 2)
            out.append(candidates)
            for (d, _), request, c in zip(histories.items(), requests, candidates):
                histories[d] = [*request.messages, {"role": "assistant", "content": c[t % 2]}]  # keep candidate t % 2
            if t == 1:
                histories.pop(1)  # a dialogue ends: its rows leave the cache
        return out

    cached, reencoded = run(keyed=True), run(keyed=False)
    assert cached == reencoded and [len(c) for c in cached] == [3, 3, 2, 2]


# --- bad input ---------------------------------------------------------------------------------


def test_bad_inputs_stop_with_a_message_naming_the_file_and_place(tmp_path, capsys):
    bad = tmp_path / "dialogues.jsonl"
    bad.write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
        '{"messages": [{"role": "assistant", "content": "first"}]}\n'
    )
    with pytest.raises(SystemExit, match=r"dialogues\.jsonl:2"):
        main(gatt_args(tmp_path / "out", "--user-turns", str(bad)))
    main(gatt_args(tmp_path / "skip", "--user-turns", str(bad), "--on-error", "skip", n=4))
    probes = {p.question for c in catalogue() for p in c.probes}
    user_turns = {m["content"] for r in read_jsonl(tmp_path / "skip" / "gatt.jsonl") for m in r["messages"][::2]}
    assert user_turns - probes == {"hi"}  # the good dialogue's user turn, between probe questions
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(
        "constraints:\n  - {name: fr, instruction: x, short: y, checks: [{type: langage, code: fr}]}\n"
    )
    with pytest.raises(SystemExit, match=r"c\.yaml: constraints\[0\] 'fr' checks\[0\]: unknown check type 'langage'"):
        main(gatt_args(tmp_path / "out2", "--constraints", str(yaml_file)))
    with pytest.raises(SystemExit, match="other settings"):  # resuming into a folder made with other settings
        main(gatt_args(tmp_path / "skip", n=5))
