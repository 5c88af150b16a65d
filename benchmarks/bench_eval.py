"""Evaluation rollouts: batched with KV reuse across turns vs `generate()` per turn on the re-encoded history.

Both sides roll out the same planned dialogues (the built-in constraints and held-out user turns,
probes every 4th turn) with the same model, greedily, in one process:

- ours:   `gatt.eval.rollout.rollout`, a batch of dialogues in lockstep, one KV cache per dialogue kept
          across turns (each turn feeds only its new tokens);
- theirs: `gatt.eval.rollout.reference_rollout`, Hugging Face `generate()` per turn on the full
          re-encoded history, one dialogue at a time.

A round is one batch of dialogues rolled out over all T turns by a side (chat template, generation,
decoding, the checks of every turn); the batches take turns, so the full run (N=32 dialogues x T=24
turns, M=32 new tokens at most, batches of 16, i.e. `gatt.eval.evaluate --batch-size 16`: 2 batches) is done
twice by each side, the two sides interleaved round by round, after an untimed warm-up (ours over every
dialogue: the language checks load their models on first use; theirs on 2 dialogues x 3 turns). Batches
of 16 rather than the evaluation's default 32 fit 4 rounds a side in the budget (on 2 CPU cores they
are also a little faster per turn: fewer padding holes in the cache). Every round's replies must be
identical between the two sides (an AssertionError names the first dialogue and turn that differ).
`rollout_vs_hf_generate`: turns/s of ours over theirs (median round), goal >= 3; theirs runs one dialogue at a
time, which no user would do with 32 dialogues, so:

`rollout_vs_hf_generate_batched`: ours over what a user would run, `generate()` batched per turn over all N
dialogues (left-padded) on Hugging Face's own `LlamaForCausalLM` (SDPA) holding the same weights, re-encoding
each history or carrying the batch's cache across turns (and on CUDA a static cache): ours with the attention
probe on (the report's setting; `ratio_probe_off` without) over the fastest of them, goal >= 2.5
(bench_common.rollout_vs_batched_generate). The full run takes about
3 minutes on 2 otherwise idle CPU cores; `--quick` (N=8, T=8, one batch of 8, 3 rounds) about 30 s.

The model is a randomly initialised GattForCausalLM of the embedded base model's size (hidden 128,
4 layers, 4/2 heads) with a BPE tokenizer trained on the toy world's base corpus; random weights
rarely emit the end-of-turn token, so nearly every reply runs to M tokens on both sides.

  python benchmarks/bench_eval.py [--quick] [--device cuda]
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from bench_common import comparison, interleaved, main, median, rollout_vs_batched_generate
from transformers import LlamaConfig, LlamaForCausalLM

from data_gen.constraints import catalogue
from data_gen.toy_world import base_corpus
from data_gen.user_turns import split_user_turns
from gatt.data.checks import detect_language
from gatt.eval.inputs import load_eval_constraints, load_eval_turns
from gatt.eval.plan import plan_dialogues
from gatt.eval.rollout import reference_rollout, rollout
from gatt.eval.turns import RolloutConfig
from gatt.model.modeling import GattConfig, GattForCausalLM
from gatt.model.tokenizer import train_tokenizer

# (dialogues N, turns T, max new tokens M, dialogues per batch = per round, timed rounds per side)
FULL = {"dialogues": 32, "turns": 24, "max_new_tokens": 32, "batch_size": 16, "repeats": 4}
QUICK = {"dialogues": 8, "turns": 8, "max_new_tokens": 32, "batch_size": 8, "repeats": 3}
SIDES = {"ours": rollout, "theirs": reference_rollout}


def build_model(device: str) -> tuple[GattForCausalLM, Any]:
    corpus = base_corpus(2000, seed=0, catalogue=catalogue(), user_pool=split_user_turns()[0])
    tokenizer = train_tokenizer((m["content"] for r in corpus for m in r["messages"]), vocab_size=2048)
    config = GattConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return GattForCausalLM(config).to(device).eval(), tokenizer


def first_difference(ours: Sequence[dict], theirs: Sequence[dict]) -> str | None:
    """Where two sides' transcripts of the same dialogues first give different replies, or None."""
    for a, b in zip(ours, theirs, strict=True):
        if len(a["turns"]) != len(b["turns"]):
            return f"dialogue {a['id']}: {len(a['turns'])} turns (ours) vs {len(b['turns'])} (theirs)"
        for x, y in zip(a["turns"], b["turns"]):
            if x["reply"] != y["reply"]:
                return f"dialogue {a['id']}, turn {x['turn']}: {x['reply']!r} (ours) vs {y['reply']!r} (theirs)"
    return None


def replace_turns(transcript: dict, turns: int) -> dict:
    return {**transcript, "turns": transcript["turns"][:turns]}


def identical_share(ours: Sequence[dict], theirs: Sequence[dict]) -> float:
    pairs = [(x["reply"], y["reply"]) for a, b in zip(ours, theirs) for x, y in zip(a["turns"], b["turns"])]
    return sum(x == y for x, y in pairs) / max(len(pairs), 1)


def check_identical(ours: Sequence[dict], theirs: Sequence[dict]) -> float:
    """The share of identical replies, which must be all of them (AssertionError naming the first difference)."""
    difference = first_difference(ours, theirs)
    if difference is not None:
        raise AssertionError(
            f"greedy replies differ ({100 * identical_share(ours, theirs):.1f}% identical); first: {difference}"
        )
    return identical_share(ours, theirs)


def run(quick: bool, device: str) -> dict[str, dict[str, Any]]:
    size = QUICK if quick else FULL
    model, tokenizer = build_model(device)
    plan = plan_dialogues(
        load_eval_constraints(), load_eval_turns(), dialogues=size["dialogues"], turns=size["turns"], seed=0
    )
    batch = size["batch_size"]
    batches = [plan[i : i + batch] for i in range(0, len(plan), batch)]
    config = RolloutConfig(max_new_tokens=size["max_new_tokens"], batch_size=batch, decoder="engine")

    # Warm-up, untimed: kernels and the allocator on both sides, and the language detector (lingua loads its models
    # lazily, per script and text length, on first use: seconds each). Ours over every dialogue, so that every model
    # the checks of these replies need is loaded (both sides write the same replies); theirs on 2 short dialogues.
    detect_language("warm-up")
    warm = rollout(model, tokenizer, plan, config, progress=False)
    short = [replace(d, turns=d.turns[:3]) for d in plan[:2]]
    check_identical(
        [replace_turns(t, 3) for t in warm[:2]], reference_rollout(model, tokenizer, short, config, progress=False)
    )

    transcripts: dict[str, list[list[dict]]] = {name: [] for name in SIDES}  # per side: each round's transcripts
    turns: dict[str, list[int]] = {name: [] for name in SIDES}
    cpu: dict[str, list[float]] = {name: [] for name in SIDES}  # CPU seconds of each round

    def side(name: str):
        def round_() -> float:
            dialogues = batches[len(transcripts[name]) % len(batches)]  # the batches in turn
            start, cpu_start = time.perf_counter(), time.process_time()
            out = SIDES[name](model, tokenizer, dialogues, config, progress=False)
            seconds = time.perf_counter() - start
            cpu[name].append(time.process_time() - cpu_start)
            transcripts[name].append(out)
            turns[name].append(sum(len(t["turns"]) for t in out))
            if len(transcripts["ours"]) == len(transcripts["theirs"]):  # both sides have done this round: compare now
                check_identical(transcripts["ours"][-1], transcripts["theirs"][-1])
            return seconds

        return round_

    seconds = interleaved({name: side(name) for name in SIDES}, repeats=size["repeats"], warmup=0)
    assert turns["ours"] == turns["theirs"]
    every = {name: [t for round_ in transcripts[name] for t in round_] for name in SIDES}
    rate = {name: median([t / s for t, s in zip(turns[name], seconds[name])]) for name in SIDES}
    threads = torch.get_num_threads()
    settings = {
        "dialogues": size["dialogues"],
        "turns": size["turns"],
        "max_new_tokens": size["max_new_tokens"],
        "dialogues_per_batch": batch,
        "round": f"one batch of {batch} dialogues x {size['turns']} turns per side",
        "repeats": size["repeats"],
        "warmup": "ours over every dialogue, theirs over 2 dialogues x 3 turns",
        "greedy": True,
        "model": "GattForCausalLM, random init (hidden 128, 4 layers, 4/2 heads, vocab 2048)",
        "params": sum(p.numel() for p in model.parameters()),
        "device": device,
        "threads": threads,
    }
    result = comparison(
        rate["ours"],
        rate["theirs"],
        unit="turns/s",
        goal=3.0,
        settings=settings,
        identical_replies=identical_share(every["ours"], every["theirs"]),
        turns_per_round=turns["ours"],
        seconds={name: [round(s, 3) for s in seconds[name]] for name in SIDES},
        # CPU time the process got / (wall x threads), per side: well below 1 means other processes competed
        cpu_share={name: round(sum(cpu[name]) / (sum(seconds[name]) * threads), 3) for name in SIDES}
        if device == "cpu"
        else None,
    )
    llama = hugging_face_llama(model)
    batched = rollout_vs_batched_generate(
        model, llama, tokenizer, plan, config, goal=2.5, settings={**settings, "turns": size["turns"]}
    )
    return {"rollout_vs_hf_generate": result, "rollout_vs_hf_generate_batched": batched}


def hugging_face_llama(model: GattForCausalLM) -> LlamaForCausalLM:
    """Hugging Face's own Llama (SDPA attention) holding `model`'s weights: the library's model is Llama's layout."""
    config = LlamaConfig(**{k: v for k, v in model.config.to_dict().items() if k in LlamaConfig().to_dict()})
    config._attn_implementation = "sdpa"
    llama = LlamaForCausalLM(config).to(model.device).eval()
    llama.load_state_dict(model.state_dict())
    return llama


if __name__ == "__main__":
    main(run, __doc__)
