"""Benchmark evaluation rollouts: batched with KV reuse across turns vs `generate()` per turn on the re-encoded history.

Both candidates roll out the same N planned dialogues of T turns (the built-in constraints and held-out
user turns, probes every 4th turn) with the same model, greedily, in one process:

- "kv-reuse":  `gatt.eval.rollout.rollout`, all N dialogues in one batch, one KV cache per dialogue kept
               across turns (each turn feeds only its new tokens);
- "reference": `gatt.eval.rollout.reference_rollout`, Hugging Face `generate()` per turn on the full
               re-encoded history, one dialogue at a time.

The model is a randomly initialised GattForCausalLM of the embedded base model's size (hidden 128,
4 layers, 4/2 heads) with a BPE tokenizer trained on the toy world's base corpus; random weights
rarely emit the end-of-turn token, so nearly every reply runs to M tokens on both sides. Measured: wall
time, turns/s, and the share of replies that are identical between the two (goal: all). Goal: kv-reuse
>= 3x faster. Defaults (N=32, T=24, M=32) take a few minutes on 2 CPU cores.

Usage: python benchmarks/bench_eval.py [--dialogues 32] [--turns 24] [--max-new-tokens 32] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from data_gen.constraints import catalogue
from data_gen.toy_world import base_corpus
from data_gen.user_turns import split_user_turns
from gatt.checks import detect_language
from gatt.eval.inputs import load_eval_constraints, load_eval_turns
from gatt.eval.plan import plan_dialogues
from gatt.eval.rollout import RolloutConfig, reference_rollout, rollout
from gatt.modeling import GattConfig, GattForCausalLM
from gatt.tokenizer import train_tokenizer


def build_model(device: str) -> tuple[GattForCausalLM, object]:
    corpus = base_corpus(2000, seed=0, catalogue=catalogue(), user_pool=split_user_turns()[0])
    tokenizer = train_tokenizer((m["content"] for r in corpus for m in r["messages"]), vocab_size=2048)
    config = GattConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return GattForCausalLM(config).to(device).eval(), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\nUsage")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialogues", type=int, default=32, help="N dialogues (default: 32)")
    parser.add_argument("--turns", type=int, default=24, help="T turns per dialogue (default: 24)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="M: reply length limit (default: 32)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_eval.json"), help="JSON results path")
    args = parser.parse_args()

    model, tokenizer = build_model(args.device)
    plan = plan_dialogues(load_eval_constraints(), load_eval_turns(), dialogues=args.dialogues, turns=args.turns, seed=0)
    config = RolloutConfig(max_new_tokens=args.max_new_tokens, batch_size=args.dialogues)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {device}, fp32, random model ({params / 1e6:.2f}M params), "
          f"N={args.dialogues} dialogues x T={args.turns} turns, M={args.max_new_tokens}")
    # warm-up: kernels, and the language detector's models (loaded once per process, ~10 s, by the first language check)
    rollout(model, tokenizer, plan[:2], RolloutConfig(max_new_tokens=4), progress=False)
    detect_language("warm-up")
    results, transcripts = {}, {}
    for name, run in (("kv-reuse", rollout), ("reference", reference_rollout)):
        start = time.perf_counter()
        transcripts[name] = run(model, tokenizer, plan, config, progress=False)
        seconds = time.perf_counter() - start
        turns = sum(len(t["turns"]) for t in transcripts[name])
        results[name] = {"seconds": seconds, "turns": turns, "turns_per_s": turns / seconds}
        print(f"{name:>10}: {seconds:7.1f} s  {turns} turns  {turns / seconds:7.2f} turns/s")
    pairs = [(a["reply"], b["reply"]) for x, y in zip(transcripts["kv-reuse"], transcripts["reference"])
             for a, b in zip(x["turns"], y["turns"])]
    same = sum(a == b for a, b in pairs) / len(pairs)
    speedup = results["reference"]["seconds"] / results["kv-reuse"]["seconds"]
    print(f"identical replies: {100 * same:.1f}% of {len(pairs)}")
    print(f"speedup kv-reuse / reference: {speedup:.2f}x (goal >= 3x: {'met' if speedup >= 3 else 'NOT met'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "torch": torch.__version__,
               "device": device, "params": params, "results": results, "identical_replies": same, "speedup": speedup}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
