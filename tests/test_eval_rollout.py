"""Rollouts with KV reuse across turns against re-encoding the history, the attention probe, the eval CLI."""

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from gatt.data.check_types import Check
from gatt.data.checks import Constraint, Probe
from gatt.eval.evaluate import main as evaluate_main
from gatt.eval.inputs import EvalTurn
from gatt.eval.plan import EvalDialogue, PlannedTurn, plan_dialogues, stratify
from gatt.eval.rollout import GENERATE_AT_MOST, batch_decoder, generate_rollout, reference_rollout, rollout
from gatt.eval.turns import RolloutConfig, render
from gatt.model.modeling import GattConfig, GattForCausalLM
from gatt.model.tokenizer import train_tokenizer

TEXTS = [f"Tell me about topic {i}. The weather is nice and tennis is fun, {i * 7} times." for i in range(300)]
TENNIS = Check("contains_any", {"words": ["tennis"]})
CONSTRAINTS = [
    Constraint(
        "hobby-tennis",
        "You enjoy tennis.",
        "Hobby: tennis",
        (TENNIS,),
        (Probe("What is your favorite hobby?", (TENNIS,)),),
        "hobby",
        "tennis",
        "train",
    ),
    Constraint(
        "hobby-chess",
        "You enjoy chess.",
        "Hobby: chess",
        (Check("contains_any", {"words": ["chess"]}),),
        (),
        "hobby",
        "chess",
        "heldout",
    ),
    Constraint(
        "caps", "Answer in capital letters.", "Format: caps", (Check("all_caps", {}),), (), "caps", "caps", "heldout"
    ),
]
POOL = [EvalTurn(t, (Check("contains_any", {"words": [t.split(".")[0][-2:]]}),)) for t in TEXTS[:60]]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=400)


def tiny_config(tokenizer, **overrides) -> dict:
    return {
        **dict(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        **overrides,
    }


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    return GattForCausalLM(GattConfig(**tiny_config(tokenizer))).eval()


@pytest.fixture(scope="module")
def plan():
    return plan_dialogues(CONSTRAINTS, POOL, dialogues=6, turns=7, seed=0, no_instruction=2)


def replies(transcripts):
    return [[turn["reply"] for turn in t["turns"]] for t in transcripts]


def test_plan_balances_strata_and_places_probes(plan):
    assert [d.stratum for d in plan] == [
        "train",
        "heldout_value",
        "train",
        "heldout_family",
        "train",
        "heldout_value",
        "none",
        "none",
    ]
    assert {k: [c.name for c in v] for k, v in stratify(CONSTRAINTS).items()} == {
        "train": ["hobby-tennis"],
        "heldout_value": ["hobby-chess"],
        "heldout_family": ["caps"],
    }
    tennis = plan[0]
    assert [t.kind for t in tennis.turns] == ["chat", "probe", "chat", "chat", "chat", "probe", "chat"]
    assert tennis.turns[1].user == "What is your favorite hobby?" and tennis.instruction in (
        "You enjoy tennis.",
        "Hobby: tennis",
    )
    assert all(t.kind == "chat" for t in plan[1].turns)  # a family without probes gets none
    assert all(not t.checks and t.on_topic for t in plan[-1].turns) and plan[-1].instruction is None
    assert plan == plan_dialogues(CONSTRAINTS, POOL, dialogues=6, turns=7, seed=0, no_instruction=2)
    assert plan != plan_dialogues(CONSTRAINTS, POOL, dialogues=6, turns=7, seed=1, no_instruction=2)


@pytest.mark.parametrize("batch_size,decoder", [(8, "growing"), (3, "growing"), (8, "static")])
def test_kv_reuse_gives_the_replies_of_reencoding_the_history(model, tokenizer, plan, batch_size, decoder):
    config = RolloutConfig(max_new_tokens=12, batch_size=batch_size, decoder=decoder)
    fast = rollout(model, tokenizer, plan, config, progress=False)
    slow = reference_rollout(model, tokenizer, plan, config, progress=False)
    assert replies(fast) == replies(slow)
    assert fast == slow  # every check result and stop reason too
    assert [t["id"] for t in fast] == [d.id for d in plan] and all(len(t["turns"]) == 7 for t in fast)


def test_kv_reuse_masks_tokens_the_template_renders_differently(model, tokenizer, plan, tmp_path):
    # This template upper-cases earlier replies: the model's own reply tokens in the cache no longer match
    # the rendered history, so they must be masked out and the rendered tokens fed instead.
    tokenizer.save_pretrained(tmp_path)
    upper = AutoTokenizer.from_pretrained(tmp_path)
    upper.chat_template = tokenizer.chat_template.replace(
        "generation -%}{{- message['content']", "generation -%}{{- (message['content'] | upper)"
    )
    assert upper.chat_template != tokenizer.chat_template
    config = RolloutConfig(max_new_tokens=12, batch_size=8, decoder="engine")
    fast, slow = (
        rollout(model, upper, plan, config, progress=False),
        reference_rollout(model, upper, plan, config, progress=False),
    )
    assert replies(fast) == replies(slow)
    assert replies(fast) != replies(rollout(model, tokenizer, plan, config, progress=False))


def test_hugging_face_llama_rolls_out_the_same(model, tokenizer, plan):
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**tiny_config(tokenizer))).eval()
    llama.load_state_dict(model.state_dict())
    config = RolloutConfig(max_new_tokens=12, decoder="engine")
    assert replies(rollout(llama, tokenizer, plan, config, progress=False)) == replies(
        rollout(model, tokenizer, plan, config, progress=False)
    )


@pytest.mark.parametrize("cache", ["none", "carry", "static"])
def test_batched_generate_writes_the_replies_of_the_engine(model, tokenizer, plan, cache):
    """The baseline a user would run (one generate() per turn over every dialogue, left-padded, on Hugging Face's
    own Llama with the same weights): the engine's replies, whether the history is re-encoded, its cache carried
    from turn to turn (rows of different lengths: masked gaps), or re-encoded into a static cache."""
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**tiny_config(tokenizer))).eval()
    llama.load_state_dict(model.state_dict())
    llama.generation_config.repetition_penalty = 1.3  # a folder's setting that generate() must not apply unasked
    config = RolloutConfig(max_new_tokens=12, batch_size=8, decoder="engine")
    ours = rollout(model, tokenizer, plan, config, progress=False)
    sized = {"static_cache_len": 1024} if cache == "static" else {}  # one cache for every turn, as on a GPU
    theirs = generate_rollout(llama, tokenizer, plan, config, cache=cache, progress=False, **sized)
    assert replies(theirs) == replies(ours)
    assert theirs == ours  # every check result and stop reason too
    assert len({len(t["reply"]) for d in ours for t in d["turns"]}) > 3  # replies of different lengths


def test_auto_rolls_small_greedy_batches_out_with_generate(model, tokenizer, plan, monkeypatch):
    """Where the engine does not beat generate() by 1.2x (a CPU batch of at most GENERATE_AT_MOST dialogue-turns),
    auto hands the batch to generate_rollout, which writes the engine's transcripts; elsewhere the engine decodes."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(len(args[2]))
        return generate_rollout(*args, **kwargs)

    monkeypatch.setattr("gatt.eval.rollout.generate_rollout", counted)
    config = RolloutConfig(max_new_tokens=12, batch_size=3)
    batches = [len(plan[i : i + 3]) for i in range(0, len(plan), 3)]  # 3, 3, 2 dialogues x 7 turns
    assert len(plan) * 7 <= GENERATE_AT_MOST and batches == [3, 3, 2]
    auto = rollout(model, tokenizer, plan, config, progress=False)
    assert calls == batches
    assert auto == rollout(model, tokenizer, plan, replace(config, decoder="engine"), progress=False)
    assert calls == batches  # the engine: no generate() call

    large = plan * (GENERATE_AT_MOST // (len(plan) * 7) + 1)  # more dialogue-turns than the threshold
    assert batch_decoder(model, config, plan) == "generate" and batch_decoder(model, config, large) == "auto"
    for other in (
        {"measure_attention": True},
        {"repetition_penalty": 1.2},
        {"no_repeat_ngram_size": 3},
        {"do_sample": True},
        {"split_softmax": 2.0},
    ):  # decoding that generate() would write other replies under, or cannot measure: the engine
        assert batch_decoder(model, replace(config, **other), plan) == "auto"
    bf16 = SimpleNamespace(device=model.device, dtype=torch.bfloat16)  # a fast numerics mode: not where it was measured
    assert batch_decoder(bf16, config, plan) == "auto"
    assert batch_decoder(model, replace(config, decoder="generate"), large) == "generate"
    assert batch_decoder(model, replace(config, decoder="static"), plan) == "static"
    with pytest.raises(ValueError, match="only without the attention probe"):
        batch_decoder(model, replace(config, decoder="generate", measure_attention=True), plan)
    with pytest.raises(ValueError, match="decoder must be one of"):
        batch_decoder(model, replace(config, decoder="fast"), plan)


def test_batched_generate_refuses_what_it_does_not_measure(model, tokenizer, plan):
    with pytest.raises(ValueError, match="greedy baseline"):
        generate_rollout(model, tokenizer, plan, RolloutConfig(measure_attention=True), progress=False)
    with pytest.raises(ValueError, match="cache must be"):
        generate_rollout(model, tokenizer, plan, cache="dynamic", progress=False)


def test_context_limit_stops_the_dialogue_like_reencoding(tokenizer):
    torch.manual_seed(1)
    short = GattForCausalLM(GattConfig(**tiny_config(tokenizer, max_position_embeddings=160))).eval()
    plan = plan_dialogues(CONSTRAINTS, POOL, dialogues=3, turns=12, seed=0)
    config = RolloutConfig(max_new_tokens=16, decoder="engine")
    fast, slow = (
        rollout(short, tokenizer, plan, config, progress=False),
        reference_rollout(short, tokenizer, plan, config, progress=False),
    )
    assert fast == slow
    assert {t["stop_reason"] for t in fast} == {"context"} and all(1 <= len(t["turns"]) < 12 for t in fast)


def test_repeat_instruction_appends_it_to_every_user_turn(model, tokenizer, plan):
    config = RolloutConfig(max_new_tokens=8, repeat_instruction=True, decoder="engine")
    fast = rollout(model, tokenizer, plan[:2], config, progress=False)
    assert all(turn["user"].endswith(" " + plan[0].instruction) for turn in fast[0]["turns"])
    assert fast == reference_rollout(model, tokenizer, plan[:2], config, progress=False)


def test_sampling_is_seeded(model, tokenizer, plan):
    def sample(seed):
        return replies(
            rollout(
                model, tokenizer, plan[:3], RolloutConfig(max_new_tokens=8, do_sample=True, seed=seed), progress=False
            )
        )

    assert sample(0) == sample(0) and sample(0) != sample(1)


def test_attention_share_equals_a_direct_computation_from_the_weights(model, tokenizer, plan):
    config = RolloutConfig(max_new_tokens=10, measure_attention=True)
    dialogue = plan[0]
    [measured] = rollout(model, tokenizer, [dialogue], config, progress=False)
    history: list[dict[str, str]] = []
    for turn in measured["turns"][:3]:
        prompt, span = render(tokenizer, dialogue, [*history, {"role": "user", "content": turn["user"]}], config)
        assert tokenizer.decode(prompt[span[0] : span[-1] + 1]).strip() == dialogue.instruction
        generated = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=10,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(prompt) :]
        assert tokenizer.decode(generated, skip_special_tokens=True).strip() == turn["reply"]
        # queries: each reply token that the model read (all but the last one generated)
        sequence = torch.cat([torch.tensor(prompt), generated[:-1]])[None]
        with torch.no_grad():
            weights = model(sequence, output_attentions=True).attentions  # layers x (1, H, T, T)
        queries = slice(len(prompt), sequence.shape[1])
        heads = [w[0, :, queries][:, :, span].sum(-1).mean(-1).tolist() for w in weights]  # per head: mean over queries
        assert turn["attention_per_head"] == [pytest.approx(h, abs=1e-5) for h in heads]
        direct = [sum(h) / len(h) for h in heads]
        assert turn["attention_per_layer"] == pytest.approx(direct, abs=1e-5)
        assert turn["attention_on_instruction"] == pytest.approx(sum(direct) / len(direct), abs=1e-5)
        history += [{"role": "user", "content": turn["user"]}, {"role": "assistant", "content": turn["reply"]}]


def test_scoring_of_a_transcript_turn(model, tokenizer):
    dialogue = EvalDialogue(
        "e-1",
        "train",
        CONSTRAINTS[0],
        "Hobby: tennis",
        (PlannedTurn("chat", TEXTS[0], (TENNIS,), (Check("contains_any", {"words": ["weather"]}),)),),
    )
    [t] = rollout(model, tokenizer, [dialogue], RolloutConfig(max_new_tokens=4), progress=False)
    reply = t["turns"][0]["reply"]
    assert t["turns"][0]["checks_passed"] is ("tennis" in reply.lower()) and t["turns"][0]["on_topic"] is (
        "weather" in reply.lower()
    )
    assert t["constraint"] == {"name": "hobby-tennis", "family": "hobby", "value": "tennis", "split": "train"}


@pytest.fixture(scope="module")
def model_dir(model, tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def eval_inputs(tmp_path_factory) -> tuple[Path, Path]:
    path = tmp_path_factory.mktemp("inputs")
    constraints = path / "constraints.yaml"
    constraints.write_text(yaml.safe_dump({"constraints": [c.to_dict() for c in CONSTRAINTS]}))
    turns = path / "turns.txt"
    turns.write_text("\n".join(TEXTS[:40]) + "\n")
    return constraints, turns


def run_cli(model_dir: Path, inputs: tuple[Path, Path], out: Path, *extra: str) -> dict:
    return evaluate_main(
        [
            "--model",
            f"base={model_dir}",
            "--model",
            f"other={model_dir}",
            "--turns",
            "6",
            "--dialogues",
            "4",
            "--seed",
            "3",
            "--out",
            str(out),
            "--constraints",
            str(inputs[0]),
            "--user-turns",
            str(inputs[1]),
            "--max-new-tokens",
            "6",
            *extra,
        ]
    )


def test_cli_writes_the_report_and_is_deterministic(model_dir, eval_inputs, tmp_path):
    report = run_cli(model_dir, eval_inputs, tmp_path / "a", "--repeat-instruction", "base")
    paired = {"paired", "paired_heldout", "paired_heldout_family"}  # every stratum was rolled out
    assert set(report) == {"settings", "base", "other", "base+repeat", "followable", *paired}
    assert list(report["paired"]) == ["other - base", "other - base+repeat"]
    same = report["paired"]["other - base"]  # the same model on the same dialogues: no difference at all
    assert same and all(d["difference"] == 0 and d["ci95"] == [0, 0] for d in same.values())
    for name in ("base", "other", "base+repeat"):
        per_turn = report[name]["per_turn"]
        assert list(per_turn) == [str(t) for t in range(1, 7)]
        assert all(set(v) == {"adherence", "n", "ci95"} for v in per_turn.values())
        assert {"heldout_per_turn", "per_family", "attention_on_instruction", "no_regression"} <= set(report[name])
    assert report["base"]["per_turn"] == report["other"]["per_turn"]  # the same model, the same dialogues
    assert len(report["base"]["attention_on_instruction"]) == 6
    heads = report["base"]["attention_on_instruction_max_head"]
    assert list(heads) == [str(t) for t in range(1, 7)]
    assert all(
        heads[t] >= report["base"]["attention_on_instruction"][t] for t in heads
    )  # a maximum is at least the mean
    for name in ("report.json", "report.md", "adherence.png", "attention.png", "transcripts.jsonl"):
        assert (tmp_path / "a" / name).stat().st_size > 0
    lines = [json.loads(line) for line in (tmp_path / "a" / "transcripts.jsonl").read_text().splitlines()]
    assert len(lines) == 3 * (4 + 1) and {line["model"] for line in lines} == {"base", "other", "base+repeat"}
    base = {line["id"]: line for line in lines if line["model"] == "base"}
    for line in (line for line in lines if line["model"] == "base+repeat"):
        if line["instruction"] is None:  # nothing to repeat: base's own transcript, not a second rollout
            assert {**line, "model": "base"} == base[line["id"]]
        else:
            assert all(turn["user"].endswith(" " + line["instruction"]) for turn in line["turns"])
    run_cli(model_dir, eval_inputs, tmp_path / "b", "--repeat-instruction", "base")
    assert (tmp_path / "a" / "report.json").read_bytes() == (tmp_path / "b" / "report.json").read_bytes()


def test_cli_rolls_out_every_dialogue_kind_and_scores_it_by_turns_since_its_event(model_dir, eval_inputs, tmp_path):
    kinds = ["first", "late", "replace", "revoke", "add"]
    report = run_cli(
        model_dir, eval_inputs, tmp_path, "--repeat-instruction", "base", "--kinds", *kinds, "--dialogues", "10"
    )
    assert report["settings"]["kinds"] == kinds
    lines = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
    for name in ("base", "other", "base+repeat"):
        # the test file's train stratum is one hobby: no value to change to, nothing to add (those stay `first`)
        assert set(report[name]["per_kind"]) == {"first", "late", "revoke"}
        revoke = report[name]["per_kind"]["revoke"]
        assert set(revoke) == {"dialogues", "after", "old_followed", "old_followed_per_family", "pooled_ds"}
        assert set(revoke["old_followed_per_family"]) == {"hobby"}  # the old instruction's family
        assert report[name]["per_kind"]["late"]["after"]["0"]["n"] == 1
    late = {line["model"]: line for line in lines if line["kind"] == "late"}
    (event,) = late["base"]["events"]
    turn = event["turn"]
    for number, (plain, repeated) in enumerate(zip(late["base"]["turns"], late["base+repeat"]["turns"]), start=1):
        assert plain["since"] == repeated["since"] == (number - turn if number >= turn else None)
        assert plain["user"].endswith(" " + event["text"]) == (number == turn)  # the model sees the event once
        if number < turn:
            assert repeated["user"] == plain["user"]
        elif number > turn:  # NAME+repeat: the instruction in force, the words the late event gave it in
            state = repeated["user"].removeprefix(plain["user"] + " ")
            assert state != repeated["user"] and event["text"].endswith(" " + state)
        assert (plain["checks_passed"] is None) == (number < turn)  # nothing in force before it is given
    assert (tmp_path / "kinds.png").stat().st_size > 0
    assert "### late: given in a later turn; adherence" in (tmp_path / "report.md").read_text()


def test_cli_scores_the_ifeval_set_by_the_benchmarks_own_metrics_beside_the_gated_ones(
    model_dir, eval_inputs, tmp_path
) -> None:
    """`--constraints ifeval,ifbench` with IFBench held out: IFEval's held-out parameters and IFBench's types are
    rolled out, and report.json gives each model's ifeval.per_turn and ifbench.per_turn from the transcripts."""
    sets = ("--constraints", "ifeval,ifbench", "--heldout-families", "ifbench:*")
    strata = ("--strata", "heldout_value", "heldout_family", "--no-attention", "--relevance-model", "none")
    report = run_cli(model_dir, eval_inputs, tmp_path, *sets, *strata, "--repeat-instruction", "base")
    # the paired differences of the strata rolled out (none on trained values: none was)
    assert "paired" not in report
    for key in ("paired_heldout", "paired_heldout_family"):
        assert list(report[key]) == ["other - base", "other - base+repeat"]
        assert all(d["difference"] == 0 for d in report[key]["other - base"].values())  # the same model
    lines = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
    base = [line for line in lines if line["model"] == "base" and line["constraint"] is not None]
    assert {line["constraint"]["family"].split(":")[0] for line in base} == {"ifeval", "ifbench"}
    for name, stratum in (("ifeval", "heldout_value"), ("ifbench", "heldout_family")):
        mine = [line for line in base if line["constraint"]["family"].startswith(name + ":")]
        assert {line["stratum"] for line in mine} == {stratum}
        per_turn = report["base"][name]["per_turn"]
        assert set(per_turn) == {str(t) for t in range(1, 7)}
        for t, scores in per_turn.items():
            verdicts = [line["turns"][int(t) - 1]["checks"][0]["passed"] for line in mine]
            assert scores["n"] == len(mine)
            assert scores["prompt_strict"] == scores["instruction_strict"] == round(sum(verdicts) / len(mine), 6)
    markdown = (tmp_path / "report.md").read_text()
    assert "## IFEval's own metrics" in markdown and "## Paired differences on held-out families" in markdown


def test_cli_pairs_one_fine_tune_against_another_and_rejects_an_unknown_baseline(
    model_dir, eval_inputs, tmp_path
) -> None:
    quick = ("--no-attention", "--relevance-model", "none")
    report = run_cli(model_dir, eval_inputs, tmp_path / "a", "--paired-baseline", "base", *quick)
    assert report["settings"]["paired_baselines"] == ["base"]
    assert list(report["paired"]) == ["other - base"]  # no reminded column: only the pair asked for
    assert all(d["difference"] == 0 for d in report["paired"]["other - base"].values())  # the same model
    with pytest.raises(SystemExit, match="--paired-baseline names no --model: nope"):
        run_cli(model_dir, eval_inputs, tmp_path / "b", "--paired-baseline", "nope", *quick)
    assert not (tmp_path / "b").exists()


def test_an_interrupted_report_resumes_from_its_finished_columns(model_dir, eval_inputs, tmp_path, monkeypatch):
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    args = ("--repeat-instruction", "base", "--no-attention", "--relevance-model", "none")  # no judge to load
    evaluate_main(
        [
            "--model",
            f"base={model}",
            "--turns",
            "4",
            "--dialogues",
            "4",
            "--seed",
            "3",
            "--out",
            str(tmp_path / "a"),
            "--constraints",
            str(eval_inputs[0]),
            "--user-turns",
            str(eval_inputs[1]),
            "--max-new-tokens",
            "6",
            *args,
        ]
    )
    assert sorted(p.name for p in (tmp_path / "a" / "rollouts").iterdir()) == ["base+repeat.jsonl", "base.jsonl"]
    first = (tmp_path / "a" / "report.json").read_bytes()
    (tmp_path / "a" / "report.json").unlink()  # as if killed before the report was written

    def no_model(*_, **__):
        raise AssertionError("a finished column was rolled out again")

    monkeypatch.setattr("gatt.eval.evaluate.load_chat_model", no_model)
    rerun = [
        "--model",
        f"base={model}",
        "--turns",
        "4",
        "--dialogues",
        "4",
        "--seed",
        "3",
        "--out",
        str(tmp_path / "a"),
        "--constraints",
        str(eval_inputs[0]),
        "--user-turns",
        str(eval_inputs[1]),
        "--max-new-tokens",
        "6",
        *args,
    ]
    evaluate_main(rerun)
    assert (tmp_path / "a" / "report.json").read_bytes() == first
    weights = next(model.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # the model was retrained
    with pytest.raises(AssertionError, match="rolled out again"):
        evaluate_main(rerun)
    with pytest.raises(AssertionError, match="rolled out again"):  # other settings: another plan, no stale column
        evaluate_main([*rerun[: -len(args)], "--seed", "4", *args])


def test_cli_refuses_bad_input(model_dir, eval_inputs, tmp_path):
    no_template = tmp_path / "no-template"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = None
    GattForCausalLM.from_pretrained(model_dir).save_pretrained(no_template)
    tokenizer.save_pretrained(no_template)
    (no_template / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(SystemExit, match="^error: .*no chat template"):
        run_cli(no_template, eval_inputs, tmp_path / "x")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"constraints": [{**CONSTRAINTS[0].to_dict(), "checks": [{"type": "rhymes"}]}]}))
    with pytest.raises(SystemExit, match="^error: .*(hobby-tennis|rhymes)"):
        run_cli(model_dir, (bad, eval_inputs[1]), tmp_path / "y")
    with pytest.raises(SystemExit, match="^error: --model expects NAME=DIR"):
        evaluate_main(["--model", str(model_dir), "--out", str(tmp_path / "z")])
    with pytest.raises(SystemExit, match="^error: --model a=missing_dir: no such model folder"):
        evaluate_main(["--model", "a=missing_dir", "--out", str(tmp_path / "z")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()  # nothing half-written


def test_cli_split_softmax_adds_the_boosted_column(model_dir, eval_inputs, tmp_path):
    report = run_cli(model_dir, eval_inputs, tmp_path / "s", "--split-softmax", "base:0.9")
    assert set(report) == {"settings", "base", "other", "base+split"}
    assert report["settings"]["split_softmax"] == {"base": [0.9]}
    lines = [json.loads(line) for line in (tmp_path / "s" / "transcripts.jsonl").read_text().splitlines()]
    base = {line["id"]: line for line in lines if line["model"] == "base"}
    boosted = [line for line in lines if line["model"] == "base+split"]
    assert len(boosted) == 4 + 1
    for line in boosted:
        if line["instruction"] is None:  # nothing to boost: base's own transcript
            assert {**line, "model": "base"} == base[line["id"]]
    # the boosted model puts more of its attention on the instruction than the same model without it
    for turn in ("2", "6"):
        assert report["base+split"]["attention_on_instruction"][turn] > report["base"]["attention_on_instruction"][turn]
    sweep = run_cli(model_dir, eval_inputs, tmp_path / "w", "--split-softmax", "other:0.2,0.6", "--no-attention")
    assert {"other+split@0.2", "other+split@0.6"} <= set(sweep)
    assert sweep["base"]["per_turn"] == report["base"]["per_turn"]


@pytest.mark.parametrize(
    "spec,message",
    [("nobody:0.5", "NAME a --model"), ("base:2", "in \\[0, 1\\]"), ("base:x", "numbers"), ("base", "NAME:STRENGTH")],
)
def test_cli_refuses_a_bad_split_softmax_spec(model_dir, eval_inputs, tmp_path, spec, message):
    with pytest.raises(SystemExit, match=f"^error: .*{message}"):
        run_cli(model_dir, eval_inputs, tmp_path / "bad", "--split-softmax", spec)
    assert not (tmp_path / "bad").exists()


def test_cli_numerics_int8_rolls_out_on_a_quantised_model(model_dir, eval_inputs, tmp_path):
    report = run_cli(model_dir, eval_inputs, tmp_path / "q", "--numerics", "int8")
    exact = run_cli(model_dir, eval_inputs, tmp_path / "e")
    assert report["settings"]["numerics"] == "int8" and "numerics" not in exact["settings"]
    assert report["settings"]["versions"]["transformers"] and set(report) == set(exact)
    transcripts = [json.loads(line) for line in (tmp_path / "q" / "transcripts.jsonl").read_text().splitlines()]
    assert {len(t["turns"]) for t in transcripts} == {
        len(t["turns"]) for t in map(json.loads, (tmp_path / "e" / "transcripts.jsonl").read_text().splitlines())
    }


def test_cli_relevance_numerics_bf16_scores_the_same_replies_in_bf16(model_dir, eval_inputs, tmp_path):
    """The user turns here carry no on-topic checks, so every chat reply's relevance is a likelihood contrast."""
    fast = run_cli(model_dir, eval_inputs, tmp_path / "b", "--relevance-numerics", "bf16", "--no-attention")
    exact = run_cli(model_dir, eval_inputs, tmp_path / "e", "--no-attention")
    assert fast["settings"]["relevance_numerics"] == "bf16" and "relevance_numerics" not in exact["settings"]

    def read(folder: str) -> list[dict]:
        return [json.loads(line) for line in (tmp_path / folder / "transcripts.jsonl").read_text().splitlines()]

    pairs = [
        (a, b)
        for ta, tb in zip(read("b"), read("e"))
        for a, b in zip(ta["turns"], tb["turns"])
        if b["gate"]["relevance"] is not None
    ]
    assert pairs and all(a["reply"] == b["reply"] for a, b in pairs)  # the rollouts stay exact
    differences = [abs(a["gate"]["relevance"] - b["gate"]["relevance"]) for a, b in pairs]
    assert 0 < max(differences) < 2.0  # bf16 rounding, not another scorer
