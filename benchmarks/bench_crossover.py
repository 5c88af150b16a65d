"""Where the engine stops beating generate(): rollouts by size, the engine against batched `generate()`.

`gatt.eval.rollout.rollout` decodes on the project's engine (`ChatBatch`), except where `auto` hands a batch to
Hugging Face `generate()` (`batch_decoder`: on a CPU, greedy without penalty or probe, at most
`GENERATE_AT_MOST` dialogue-turns a batch). This measures the sizes that threshold rests on: for each size
(dialogues x turns, all in one batch), greedy, no penalty, the attention probe off, every reply compared:

- engine: `rollout` with `decoder="engine"` (the engine, whatever the size);
- generate: `generate_rollout(cache="carry")`, one generate() call per turn over the batch, left-padded, its cache
  carried across turns, on Hugging Face's own `LlamaForCausalLM` (SDPA) with the same weights (the baseline a user
  would run) and on the model itself (what `auto` runs);
- the ratio: engine turns/s over the faster generate(), and what `auto` chooses at that size.

Each side is warmed up on two dialogues, then `--repeats` interleaved timed runs (medians). One machine, alone:

    python benchmarks/bench_crossover.py --model smollm2 --json results/crossover_smollm2.json
    python benchmarks/bench_crossover.py --model embedded --sizes 8x2,8x8,32x2,32x8,64x12 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from bench_eval import hugging_face_llama
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gatt.eval.inputs import load_eval_constraints, load_eval_turns
from gatt.eval.plan import EvalDialogue, plan_dialogues
from gatt.eval.rollout import GENERATE_AT_MOST, batch_decoder, generate_rollout, rollout
from gatt.eval.turns import RolloutConfig
from gatt.io.files import write_json
from gatt.io.machine import machine_calibration, matmul_gflops

Side = Callable[[list[EvalDialogue]], list[dict]]


def load(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Any]:
    """The model, its tokenizer and the constraints its report uses."""
    if name == "smollm2":
        from bench_smollm2 import CONSTRAINTS, load_model

        model, tokenizer = load_model()
        return model, tokenizer, load_eval_constraints(CONSTRAINTS)
    from gatt.model.chat_model import load_chat_model
    from gatt.model.embedded import model_path

    model, tokenizer = load_chat_model(model_path("embedded"))
    return model, tokenizer, load_eval_constraints()


def parse_sizes(text: str) -> list[tuple[int, int]]:
    try:
        sizes = [tuple(int(n) for n in size.split("x")) for size in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(len(s) != 2 or min(s) < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"--sizes expects DIALOGUESxTURNS,... (e.g. 8x8,32x2), got {text!r}")
    return sizes  # type: ignore[return-value]


def replies(transcripts: list[dict]) -> list[str]:
    return [turn["reply"] for t in transcripts for turn in t["turns"]]


def measure(
    model: PreTrainedModel,
    llama: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: list[EvalDialogue],
    config: RolloutConfig,
    repeats: int,
) -> dict[str, Any]:
    """One size: each side's median seconds, the ratio and the identical-reply shares (`llama`: Hugging Face's Llama
    holding `model`'s weights)."""
    sides: dict[str, Side] = {
        "engine": lambda p: rollout(model, tokenizer, p, replace(config, decoder="engine"), progress=False),
        "generate_hugging_face": lambda p: generate_rollout(llama, tokenizer, p, config, cache="carry", progress=False),
        "generate_model": lambda p: generate_rollout(model, tokenizer, p, config, cache="carry", progress=False),
    }
    for side in sides.values():
        side(plan[:2])  # warm-up: kernels, the allocator, the language detector's models
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    transcripts: dict[str, list[dict]] = {}
    names = list(sides)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # the order rotates: noise hits all alike
            start = time.perf_counter()
            transcripts[name] = sides[name](plan)
            seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    generate = min(("generate_hugging_face", "generate_model"), key=median.__getitem__)
    engine = replies(transcripts["engine"])
    return {
        "dialogues": len(plan),
        "turns": max(len(d.turns) for d in plan),
        "dialogue_turns": len(plan) * max(len(d.turns) for d in plan),
        "seconds": {name: round(s, 4) for name, s in median.items()},
        "runs": {name: [round(x, 4) for x in s] for name, s in seconds.items()},
        "ratio": round(median[generate] / median["engine"], 3),
        "faster_generate": generate,
        "auto_chooses": "generate" if batch_decoder(model, config, plan) == "generate" else "engine",
        "identical_replies": {
            name: round(sum(a == b for a, b in zip(engine, replies(t))) / len(engine), 4)
            for name, t in transcripts.items()
            if name != "engine"
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["smollm2", "embedded"], default="smollm2", help="the model rolled out")
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes("8x8,32x2,32x4,32x8"),
        help="DIALOGUESxTURNS,... each one batch",
    )
    parser.add_argument("--max-new-tokens", type=int, default=48, help="the reply length cap")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each side at each size (medians)")
    parser.add_argument("--json", help="write the result here (with the machine's calibration)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer, constraints = load(args.model)
    model.eval()
    llama = hugging_face_llama(model)
    result: dict[str, Any] = {
        "model": args.model,
        "machine": machine_calibration(torch.get_num_threads()),
        "settings": {
            "max_new_tokens": args.max_new_tokens,
            "greedy": True,
            "repetition_penalty": 1.0,
            "attention_probe": False,
            "repeats": args.repeats,
            "generate_at_most": GENERATE_AT_MOST,
        },
        "sizes": [],
    }
    for dialogues, turns in tqdm(args.sizes, desc="sizes", unit="size"):
        plan = plan_dialogues(constraints, load_eval_turns(), dialogues=dialogues, turns=turns, seed=0, probe_every=6)
        config = RolloutConfig(max_new_tokens=args.max_new_tokens, batch_size=dialogues)
        row = measure(model, llama, tokenizer, plan, config, args.repeats)
        result["sizes"].append(row)
        tqdm.write(
            f"{dialogues:>3} x {turns:<3} ({row['dialogue_turns']:>4} dialogue-turns): engine {row['seconds']['engine']:7.2f} s, "
            f"{row['faster_generate']} {row['seconds'][row['faster_generate']]:7.2f} s, {row['ratio']:.2f}x; "
            f"auto: {row['auto_chooses']}; identical {row['identical_replies']}"
        )
    result["machine"]["fp32_matmul_gflops_end"] = round(matmul_gflops(), 1)
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
