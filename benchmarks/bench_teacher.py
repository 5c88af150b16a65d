"""Benchmark GAtt teacher sampling: batched across dialogues vs one dialogue at a time.

Both candidates run the same synthesis with a `ModelTeacher` (k candidates per turn, each prompt
encoded once, each dialogue's KV cache kept from turn to turn) on the same N dialogues of exactly T
user turns, in one process:

- "batched":    each turn is one `teacher.sample` call holding every dialogue's request (batch_size=N:
                one `ChatBatch` of N*k rows);
- "sequential": one request per call (batch_size=1: N batches of k rows).

The candidates alternate turn by turn (order flipping), so machine noise hits both alike; each has its
own teacher, seeded identically. For identical work whatever the model writes, every generation makes
exactly M new tokens (the benchmark turns the end-of-turn token off) and the first candidate is always
kept unchecked (a random model fails the checks), appended as the reply so histories grow as in real
synthesis. The teacher is a randomly initialised GattForCausalLM about the size of the project's
embedded base model (hidden 256, 4 layers, 8/4 heads, vocab 2048, ~3.7M params): random weights change
nothing in the timing.

Measured: wall time of each candidate's synthesis (chat template, generation, decode) -> dialogues/s,
turns/s; "CPU share" is the CPU time the process got / (wall x threads): well below 1 means other
processes competed (small batches then slow far more than big ones, inflating the ratio). Goal:
batched >= 4x sequential in dialogues/s. Defaults (N=32, T=8, k=4, M=32) take a minute or two on 2 cores.

Usage: python benchmarks/bench_teacher.py [--dialogues 32] [--turns 8] [--k 4] [--max-new-tokens 32] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import gatt.generation
from data_gen.constraints import ConstraintSampler, catalogue
from data_gen.synthesis import SynthesisConfig, _Dialogue, draw_dialogue
from data_gen.teacher import ModelTeacher
from data_gen.toy_world import base_corpus
from data_gen.user_turns import split_user_turns
from gatt.modeling import GattConfig, GattForCausalLM
from gatt.tokenizer import train_tokenizer


def build_teacher_dir(path: Path) -> Path:
    """A tokenizer trained on the toy base corpus and a random GattForCausalLM, saved once and reused."""
    if (path / "config.json").exists():
        return path
    corpus = base_corpus(2000, seed=0, catalogue=catalogue(), user_pool=split_user_turns()[0])
    tok = train_tokenizer((m["content"] for r in corpus for m in r["messages"]), vocab_size=2048)
    config = GattConfig(
        vocab_size=len(tok), hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    GattForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def draw(config: SynthesisConfig) -> list[_Dialogue]:
    """The N fixed-length dialogues (fresh objects: a run appends replies to them)."""
    constraints = [c for c in catalogue() if c.split == "train"]
    sampler, pool = ConstraintSampler(constraints, short_prob=config.short_prob), split_user_turns()[0]
    return [draw_dialogue(i, config, sampler, pool) for i in range(config.num_dialogues)]


def batched_turn(teacher: ModelTeacher, dialogues: list[_Dialogue], k: int) -> None:
    """One turn of every dialogue in one `sample` call (batch_size=N)."""
    teacher.batch_size = len(dialogues)
    for dialogue, candidates in zip(dialogues, teacher.sample([d.request() for d in dialogues], k)):
        dialogue.replies.append(candidates[0])  # accept the first candidate, unchecked


def sequential_turn(teacher: ModelTeacher, dialogues: list[_Dialogue], k: int) -> None:
    """One turn of every dialogue, one `sample` call per dialogue (batch_size=1)."""
    teacher.batch_size = 1
    for dialogue in dialogues:
        dialogue.replies.append(teacher.sample([dialogue.request()], k)[0][0])


CANDIDATES = {"batched": batched_turn, "sequential": sequential_turn}


def measure(teachers: dict[str, ModelTeacher], config: SynthesisConfig, seed: int) -> dict[str, dict[str, float]]:
    """Both candidates' synthesis, interleaved turn by turn (order alternating), each with its own teacher."""
    dialogues = {name: draw(config) for name in CANDIDATES}
    for teacher in teachers.values():
        teacher.seed(seed)  # identical seeding for each candidate
    seconds, cpu_seconds = dict.fromkeys(CANDIDATES, 0.0), dict.fromkeys(CANDIDATES, 0.0)
    for turn in range(config.max_turns):
        for name in list(CANDIDATES)[:: 1 if turn % 2 == 0 else -1]:
            start, cpu_start = time.perf_counter(), time.process_time()
            CANDIDATES[name](teachers[name], dialogues[name], config.samples_per_turn)
            seconds[name] += time.perf_counter() - start
            cpu_seconds[name] += time.process_time() - cpu_start
    turns = config.num_dialogues * config.max_turns
    assert all(sum(len(d.replies) for d in ds) == turns for ds in dialogues.values()), "a turn went unanswered"
    return {name: {"seconds": seconds[name], "dialogues_per_s": config.num_dialogues / seconds[name],
                   "turns_per_s": turns / seconds[name],
                   # CPU time this process got / (wall x threads): well below 1 means other processes competed
                   "cpu_share": cpu_seconds[name] / (seconds[name] * torch.get_num_threads())}
            for name in CANDIDATES}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring's layout as written, and each option's default."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\nUsage")[0], formatter_class=HelpFormatter)
    parser.add_argument("--dialogues", type=int, default=32, help="N dialogues (same N for both candidates)")
    parser.add_argument("--turns", type=int, default=8, help="T user turns per dialogue (fixed)")
    parser.add_argument("--k", type=int, default=4, help="candidates sampled per turn")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="M: exact new tokens per candidate")
    parser.add_argument("--seed", type=int, default=0, help="dialogue draws and torch sampling seed")
    parser.add_argument("--model-dir", type=Path, default=Path("runs/bench/teacher-model"), help="teacher (built if absent)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_teacher.json"), help="JSON results path")
    parser.add_argument("--device", default="cpu", help="teacher device (cpu, cuda)")
    args = parser.parse_args()

    config = SynthesisConfig(num_dialogues=args.dialogues, min_turns=args.turns, max_turns=args.turns,
                             samples_per_turn=args.k, seed=args.seed)
    gatt.generation.stop_token_ids = lambda model, tokenizer: set()  # no end-of-turn: every reply is M tokens
    model_dir = build_teacher_dir(args.model_dir)
    teachers = {name: ModelTeacher(model_dir, max_new_tokens=args.max_new_tokens, device=args.device) for name in CANDIDATES}
    teacher = teachers["batched"]
    params = sum(p.numel() for p in teacher.model.parameters())
    device = torch.cuda.get_device_name() if teacher.device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {device}, fp32, random teacher ({params / 1e6:.2f}M "
          f"params), N={args.dialogues} dialogues x T={args.turns} turns, k={args.k}, M={args.max_new_tokens} new tokens")
    batched_turn(teacher, draw(SynthesisConfig(num_dialogues=2, min_turns=1, max_turns=1)), args.k)  # warm-up
    results = measure(teachers, config, args.seed)
    for name, r in results.items():
        print(f"{name:>10}: {r['seconds']:7.1f} s  {r['dialogues_per_s']:7.3f} dialogues/s  {r['turns_per_s']:7.2f} "
              f"turns/s  CPU share {r['cpu_share']:.2f}")
    speedup = results["batched"]["dialogues_per_s"] / results["sequential"]["dialogues_per_s"]
    print(f"speedup batched / sequential: {speedup:.2f}x (goal >= 4x: {'met' if speedup >= 4 else 'NOT met'})")
    if teacher.device.type == "cpu" and min(r["cpu_share"] for r in results.values()) < 0.9:
        print("warning: other processes took CPU during the run (CPU share < 0.9); the ratio is unreliable, rerun")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "torch": torch.__version__, "device": device, "params": params,
               "results": results, "speedup": speedup}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
