"""GAtt followed by GRPO on the checks (gatt/training/grpo.py, recipes/grpo_gatt.py): the prompts, the reward and a run."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from data_gen.eval_set import training_turns  # noqa: E402
from gatt.data.check_types import Check  # noqa: E402
from gatt.eval.gate import GateConfig  # noqa: E402
from gatt.eval.inputs import load_eval_turns  # noqa: E402
from gatt.model.embedded import model_path  # noqa: E402
from gatt.training import grpo  # noqa: E402
from gatt.training.grpo import (  # noqa: E402
    ChecksAndGateReward,
    GRPOGattConfig,
    prompt_dialogues,
    prompt_records,
    reward_gate,
)
from recipes.demo import load_config, stages  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def fake_transcripts(dialogues):
    """A transcript per dialogue whose reply at turn t says which turn it is."""
    return [
        {"id": d.id, "turns": [{"user": turn.user, "reply": f"reply {t}"} for t, turn in enumerate(d.turns, start=1)]}
        for d in dialogues
    ]


def test_prompts_cut_the_start_models_dialogues_with_the_instruction_in_turn_one_only():
    config = GRPOGattConfig(
        model="embedded", output_dir="unused", prompt_dialogues=6, prompt_turns=8, prompts_per_dialogue=3
    )
    turns = training_turns()
    dialogues = prompt_dialogues(config, turns)
    assert {d.stratum for d in dialogues} == {"train"} and all(d.constraint.split == "train" for d in dialogues)
    held_out = {t.text for t in load_eval_turns()}  # the report's messages are never a prompt's
    assert not held_out & {turn.user for d in dialogues for turn in d.turns}
    records = prompt_records(fake_transcripts(dialogues), dialogues, config)
    assert len(records) == 6 * 3
    by_dialogue: dict[str, list[int]] = {}
    for record in records:
        by_dialogue.setdefault(record["dialogue"], []).append(record["turn"])
    assert all(len(set(cuts)) == 3 and all(2 <= t <= 8 for t in cuts) for cuts in by_dialogue.values())
    dialogue = {d.id: d for d in dialogues}[records[0]["dialogue"]]
    record, t = records[0], records[0]["turn"]
    messages = record["prompt"]
    assert messages[0] == {"role": "system", "content": dialogue.instruction}
    assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * (t - 1) + ["user"]
    assert [m["content"] for m in messages[2::2]] == [f"reply {i}" for i in range(1, t)]
    assert messages[-1]["content"] == dialogue.turns[t - 1].user == record["user"]
    assert all(dialogue.instruction not in m["content"] for m in messages[1:])  # given once, in turn one
    assert json.loads(record["checks"]) == [c.to_dict() for c in dialogue.turns[t - 1].checks]
    assert [e["reply"] for e in json.loads(record["earlier"])] == [f"reply {i}" for i in range(1, t)]


def reward_inputs(reply, checks, earlier=(), user="How do bees make honey?"):
    on_topic = [Check("contains_any", {"words": ["bees", "honey"]}).to_dict()]
    return {
        "prompts": [[]],
        "completions": [[{"role": "assistant", "content": reply}]],
        "checks": [json.dumps([c.to_dict() for c in checks])],
        "on_topic": [json.dumps(on_topic)],
        "earlier": [json.dumps([{"user": u, "reply": r, "kind": "chat", "on_topic": on_topic} for u, r in earlier])],
        "user": [user],
        "kind": ["chat"],
        "instruction": ["End every reply with 'Cheers!'"],
    }


def test_the_reward_is_the_share_of_checks_passed_and_nothing_for_a_reply_the_gate_fails():
    reward = ChecksAndGateReward(GateConfig())
    cheers = Check("endswith", {"text": "Cheers!"})
    caps = Check("all_caps", {})
    answer = "Bees gather nectar, store it in wax cells and fan it with their wings until it becomes honey. Cheers!"
    logged = {}
    assert reward(**reward_inputs(answer, [cheers]), log_metric=logged.__setitem__) == [1.0]
    assert logged == {"checks": 1.0, "real_answer": 1.0, "words": 19.0}
    assert reward(**reward_inputs(answer, [cheers, caps])) == [0.5]
    off_topic = "I like trains and the colour blue very much, they are nice. Cheers!"  # passes its check
    assert reward(**reward_inputs(off_topic, [cheers])) == [0.0]
    assert reward(**reward_inputs("Cheers!", [cheers])) == [0.0]  # no answer: only the sign-off
    repeat = reward_inputs(answer, [cheers], earlier=[("Tell me about honey bees.", answer)])
    assert reward(**repeat, log_metric=logged.__setitem__) == [0.0]  # a copy of an earlier reply
    assert logged["checks"] == 1.0 and logged["real_answer"] == 0.0


def test_the_reward_gives_nothing_for_a_frame_reused_with_the_topic_swapped():
    """The 40 replies of the SmolLM2 GRPO demonstration that readers labelled (results/grpo/smollm2/audit_labels.jsonl),
    each with the two turns before it: the reward's gate fails every reply they called a repeat or a template (an
    earlier reply's frame with the topic word swapped: "The way airplanes can be so lifelike..." after "The way
    islands can be so beautiful..."), and rewards real answers far more often than non-answers."""
    rows = [json.loads(line) for line in (ROOT / "results/grpo/smollm2/audit_labels.jsonl").read_text().splitlines()]
    reward = ChecksAndGateReward(reward_gate(GRPOGattConfig(model="m", output_dir="o", strict_gate=True)))
    earned = reward(
        prompts=[[]] * len(rows),
        completions=[r["reply"] for r in rows],
        checks=["[]"] * len(rows),
        on_topic=["[]"] * len(rows),
        earlier=[
            json.dumps([{"user": u, "reply": e, "kind": "chat", "on_topic": []} for u, e in r["earlier"]]) for r in rows
        ],
        user=[r["user"] for r in rows],
        kind=["chat"] * len(rows),
        instruction=[r["instruction"] for r in rows],
    )
    reused = [e for r, e in zip(rows, earned, strict=True) if r["why"] in ("repeat", "template")]
    answers = [e for r, e in zip(rows, earned, strict=True) if r["label"] == "answer"]
    not_answers = [e for r, e in zip(rows, earned, strict=True) if r["label"] != "answer"]
    assert len(reused) == 20 and set(reused) == {0.0}
    assert sum(answers) / len(answers) > sum(not_answers) / len(not_answers) + 0.5


def test_the_reward_never_asks_the_model_being_trained_whether_a_reply_is_on_topic():
    for strict in (False, True):
        gate = reward_gate(GRPOGattConfig(model="m", output_dir="o", strict_gate=strict))
        assert not gate.uses_contrast and gate.judge_for(False) == "embedding"
        assert gate.relevance_both == strict and gate.judge_for(True) == ("embedding" if strict else None)


def test_prompts_are_rolled_out_once_and_again_only_for_other_settings_or_weights(tmp_path, monkeypatch):
    model = tmp_path / "model"
    shutil.copytree(model_path("embedded"), model)
    config = GRPOGattConfig(
        model=str(model), output_dir=str(tmp_path / "grpo"), prompt_dialogues=2, prompt_turns=3, prompts_per_dialogue=1
    )
    rolled = []
    monkeypatch.setattr(
        grpo, "rollout", lambda model, tok, dialogues, *a, **k: rolled.append(1) or fake_transcripts(dialogues)
    )
    first = grpo.make_prompts(config, training_turns(), progress=False)
    assert len(first) == 2 and len(rolled) == 1
    tuned = replace(config, learning_rate=1e-6, max_steps=9, gradient_accumulation_steps=2)  # GRPO's own knobs
    assert grpo.make_prompts(tuned, training_turns(), progress=False) == first and len(rolled) == 1
    grpo.make_prompts(replace(config, prompt_turns=4), training_turns(), progress=False)
    assert len(rolled) == 2
    weights = model / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # a new start model
    grpo.make_prompts(replace(config, prompt_turns=4), training_turns(), progress=False)
    assert len(rolled) == 3


def test_a_bad_config_is_refused_naming_what_is_wrong():
    with pytest.raises(ValueError, match="my.yaml: num_generations must be >= 2 and divide batch_size"):
        GRPOGattConfig(model="m", output_dir="o", batch_size=10, num_generations=4).validate("my.yaml")
    with pytest.raises(ValueError, match="prompts_per_dialogue must be at most prompt_turns - 1 = 3"):
        GRPOGattConfig(model="m", output_dir="o", prompt_turns=4, prompts_per_dialogue=4).validate()


def test_the_grpo_demos_train_gatt_then_grpo_from_it_and_report_gatt_grpo_beside_gatt(tmp_path):
    for name, start in (("grpo_embedded", "round-1"), ("grpo_smollm2", "round-1")):
        plan = {
            s.name: s for s in stages(load_config(ROOT / "recipes" / "configs" / f"{name}.yaml", [f"out={tmp_path}"]))
        }
        grpo = plan["grpo-model"]
        assert grpo.keep == "prompts"  # a change of GRPO's own knobs does not roll the prompts out again
        assert grpo.command[-4:-2] == [str(ROOT / "recipes" / "grpo_gatt.py"), "--resume"]
        assert grpo.settings["model"] == str(tmp_path / start / "gatt" / "final")
        assert grpo.settings["output_dir"] == str(tmp_path / "grpo")
        GRPOGattConfig(**grpo.settings).validate()  # every key of its section and of grpo_gatt.yaml is a field
        report = plan["report"].settings
        assert report["model"][-2:] == [
            f"gatt={tmp_path / start / 'gatt' / 'final'}",
            f"gatt+grpo={tmp_path / 'grpo' / 'final'}",
        ]
        assert report["paired_baseline"] == ["gatt"]
    with pytest.raises(ValueError, match=r"train.grpo: unknown key\(s\) lora; the keys are config, "):
        stages(load_config(ROOT / "recipes" / "configs" / "grpo_embedded.yaml", ["train.grpo.lora=3"]))


def tiny_grpo(tmp_path: Path, **settings) -> list[str]:
    """The command of a tiny full fine-tune GRPO run from the embedded model (`settings` over it) into tmp_path/grpo."""
    config = {"model": "embedded", "output_dir": str(tmp_path / "grpo"), "prompt_dialogues": 2, "prompt_turns": 3}
    config |= {"prompts_per_dialogue": 2, "max_new_tokens": 8, "batch_size": 4, "num_generations": 2}
    config |= {"lora_r": 0, "save_steps": 1, **settings}
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(config))
    return [sys.executable, str(ROOT / "recipes" / "grpo_gatt.py"), "--config", str(tmp_path / "grpo.yaml")]


def test_grpo_trains_from_the_embedded_model_and_resumes_from_its_checkpoint(tmp_path):
    out = tmp_path / "grpo"
    command = tiny_grpo(tmp_path, max_steps=2)
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
    summary = json.loads((out / "grpo.json").read_text())
    assert summary["steps"] == 2 and summary["prompts"] == 4 and len(summary["curve"]) == 2
    assert 0 < summary["generation_share"] < 1 and summary["seconds_per_step"] > 0
    assert all(0.0 <= point["reward"] <= 1.0 and 0.0 <= point["real_answer"] <= 1.0 for point in summary["curve"])
    assert (out / "final" / "config.json").exists() and (out / "checkpoints" / "checkpoint-2").exists()
    prompts = (out / "prompts" / "prompts.jsonl").read_text()
    subprocess.run([*command, "--resume", "max_steps=3"], check=True, capture_output=True, cwd=ROOT)
    assert (out / "prompts" / "prompts.jsonl").read_text() == prompts  # made once
    resumed = json.loads((out / "grpo.json").read_text())
    assert resumed["steps"] == 3 and resumed["curve"][:2] == summary["curve"]  # steps 1 and 2 were not redone
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[:3] == [1, 2, 2] and steps.count(3) >= 1  # step 2's summary line, then the resumed step 3
    # A finished run resumed (its steps ran elsewhere, or it was killed while saving final) takes no further step.
    trained = load_file(out / "final" / "model.safetensors")
    shutil.rmtree(out / "final")
    subprocess.run([*command, "--resume", "max_steps=3"], check=True, capture_output=True, cwd=ROOT)
    again = json.loads((out / "grpo.json").read_text())
    resaved = load_file(out / "final" / "model.safetensors")  # step 3's weights, read from its checkpoint
    assert resaved.keys() == trained.keys() and all(torch.equal(resaved[k], trained[k]) for k in trained)
    assert again["steps"] == 3 and again["curve"] == resumed["curve"] and (out / "final" / "config.json").exists()
    assert sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == [f"checkpoint-{i}" for i in (1, 2, 3)]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == steps


def test_a_kl_term_on_a_full_fine_tune_builds_the_reference_model_from_the_start_model(tmp_path):
    """beta > 0 without LoRA: TRL loads a reference copy of the start model (it read `config.auto_map`, which
    GattConfig lacked, and crashed); the run trains and logs the KL against it."""
    subprocess.run(tiny_grpo(tmp_path, beta=0.04, max_steps=1), check=True, capture_output=True, cwd=ROOT)
    logged = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["step"] == 1 and logged[0]["kl"] == 0.0  # step 1's policy is the reference model itself


def test_the_audit_counts_real_answers_length_and_on_topic_share_and_draws_replies_blind(tmp_path):
    import grpo_audit

    def turn(n, reply, passed, on_topic=None, kind="chat"):
        gate = {"passed": passed, "failed": [] if passed else ["off_topic"]}
        return {"turn": n, "kind": kind, "user": f"q{n}", "reply": reply, "gate": gate, "on_topic": on_topic}

    transcripts = [
        {"model": "gatt+grpo", "id": "e-1", "stratum": "train", "instruction": "Be brief.",
         "turns": [turn(1, "one two", True), turn(2, "three", False), turn(3, "a b c d", True, kind="probe")]},
        {"model": "gatt+grpo", "id": "e-2", "stratum": "none", "instruction": None,
         "turns": [turn(1, "five six seven", True, True), turn(2, "eight", False, False)]},
    ]  # fmt: skip
    (tmp_path / "transcripts.jsonl").write_text("".join(json.dumps(t) + "\n" for t in transcripts))
    audit = grpo_audit.main([str(tmp_path), "--draw", "5", "--out", str(tmp_path / "draw.jsonl")])
    figures = audit["models"]["gatt+grpo"]
    assert figures["real_answer_instructed"]["share"] == 0.5 and figures["real_answer_no_instruction"]["n"] == 2
    assert figures["on_topic_no_instruction"]["share"] == 0.5 and figures["mean_words"] == 7 / 4  # chat replies only
    rows = [json.loads(line) for line in (tmp_path / "draw.jsonl").read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == ["e-1-t1", "e-1-t2"]  # instructed chat replies, no probe
    assert all("gate" not in row and "passed" not in row for row in rows)  # the readers see no verdict
    second = next(row for row in rows if row["id"] == "e-1-t2")
    assert second["earlier"] == [["q1", "one two"]] and second["instruction"] == "Be brief."
    for row in rows:
        row["label"] = "answer"
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    readers = grpo_audit.main([str(tmp_path), "--labels", str(tmp_path / "labels.jsonl")])["readers"]
    assert readers["real_answers"]["share"] == 1.0 and readers["gate_agreement"]["share"] == 0.5
    assert readers["gate_pass_precision"]["share"] == 1.0
