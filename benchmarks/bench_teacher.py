"""Benchmark GAtt teacher sampling on CPU: batched across dialogues vs one dialogue at a time.

Both candidates run the same synthesis with the same `ModelTeacher` (one loaded model) on the same
N dialogues of exactly T user turns each, k candidates per turn, in one process:

- "batched":    dialogues advance in lockstep; each turn is one `teacher.sample` call holding every
                dialogue's request (batch_size=N, so one left-padded `generate()` of N*k rows);
- "sequential": one dialogue at a time, one request per call (batch_size=1, `generate()` of k rows).

To make the work identical whatever the model writes, every generation is forced to exactly M new
tokens (`min_new_tokens = max_new_tokens`, set on the model's generation config by the benchmark) and
the first candidate is always kept (no checks: a random model fails them), appended as the reply so
histories grow as in real synthesis. torch is seeded identically before each candidate. The teacher is
a randomly initialised GattForCausalLM about the size of the project's embedded base model (hidden
256, 4 layers, 8/4 heads, vocab 2048): random weights change nothing in the timing.

Measured: wall time of the whole synthesis (chat templating, generate, decoding) -> dialogues/s and
turns/s; also prompt tokens, left-padding tokens and generated tokens, counted at `generate()`.
Goal: batched >= 4x sequential in dialogues/s. Defaults: N=32 dialogues, T=8 turns, k=4, M=32.

Usage: python benchmarks/bench_teacher.py [--dialogues 32] [--turns 8] [--k 4] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

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


class FixedLengthTeacher(ModelTeacher):
    """ModelTeacher whose every generation has exactly max_new_tokens new tokens; counts tokens per call."""

    def __init__(self, model_dir: Path, **kwargs: Any) -> None:
        super().__init__(model_dir, **kwargs)
        self.model.generation_config.min_new_tokens = self.max_new_tokens  # end-of-turn suppressed until M
        self.counts: Counter = Counter()
        generate = self.model.generate

        def counting_generate(**batch: Any) -> torch.Tensor:
            output = generate(**batch)
            mask, rows = batch["attention_mask"], output.shape[0]
            self.counts.update(calls=1, rows=rows, prompt_tokens=int(mask.sum()), padded_tokens=int((mask == 0).sum()),
                               generated_tokens=rows * (output.shape[1] - mask.shape[1]))
            return output

        self.model.generate = counting_generate  # instance attribute: this teacher only


def draw(config: SynthesisConfig) -> list[_Dialogue]:
    """The N fixed-length dialogues (fresh objects: a run appends replies to them)."""
    constraints = [c for c in catalogue() if c.split == "train"]
    sampler, pool = ConstraintSampler(constraints, short_prob=config.short_prob), split_user_turns()[0]
    return [draw_dialogue(i, config, sampler, pool) for i in range(config.num_dialogues)]


def run_batched(teacher: FixedLengthTeacher, dialogues: list[_Dialogue], k: int) -> None:
    teacher.batch_size = len(dialogues)
    for _ in range(len(dialogues[0].turns)):  # every dialogue has T turns
        for dialogue, candidates in zip(dialogues, teacher.sample([d.request() for d in dialogues], k)):
            dialogue.replies.append(candidates[0])  # accept the first candidate, unchecked


def run_sequential(teacher: FixedLengthTeacher, dialogues: list[_Dialogue], k: int) -> None:
    teacher.batch_size = 1
    for dialogue in dialogues:
        for _ in dialogue.turns:
            dialogue.replies.append(teacher.sample([dialogue.request()], k)[0][0])


CANDIDATES = {"batched": run_batched, "sequential": run_sequential}


def measure(name: str, teacher: FixedLengthTeacher, config: SynthesisConfig, seed: int) -> dict[str, float]:
    dialogues = draw(config)
    teacher.counts.clear()
    torch.manual_seed(seed)
    start = time.perf_counter()
    CANDIDATES[name](teacher, dialogues, config.samples_per_turn)
    seconds = time.perf_counter() - start
    turns = sum(len(d.replies) for d in dialogues)
    assert turns == config.num_dialogues * config.max_turns, f"{name}: {turns} turns done"
    c = teacher.counts
    return {"seconds": seconds, "dialogues_per_s": len(dialogues) / seconds, "turns_per_s": turns / seconds,
            "generate_calls": c["calls"], "generated_tokens": c["generated_tokens"],
            "prompt_tokens": c["prompt_tokens"], "padded_tokens": c["padded_tokens"],
            "padding_fraction": c["padded_tokens"] / (c["prompt_tokens"] + c["padded_tokens"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dialogues", type=int, default=32, help="N dialogues (same N for both candidates)")
    parser.add_argument("--turns", type=int, default=8, help="T user turns per dialogue (fixed)")
    parser.add_argument("--k", type=int, default=4, help="candidates sampled per turn")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="M: exact new tokens per candidate")
    parser.add_argument("--seed", type=int, default=0, help="dialogue draws and torch sampling seed")
    parser.add_argument("--model-dir", type=Path, default=Path("runs/bench/teacher-model"), help="teacher (built if absent)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_teacher.json"), help="JSON results path")
    args = parser.parse_args()

    config = SynthesisConfig(num_dialogues=args.dialogues, min_turns=args.turns, max_turns=args.turns,
                             samples_per_turn=args.k, seed=args.seed)
    teacher = FixedLengthTeacher(build_teacher_dir(args.model_dir), max_new_tokens=args.max_new_tokens)
    params = sum(p.numel() for p in teacher.model.parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 CPU; random teacher, {params / 1e6:.2f}M "
          f"params; N={args.dialogues} dialogues x T={args.turns} turns, k={args.k}, M={args.max_new_tokens} new tokens")
    run_batched(teacher, draw(SynthesisConfig(num_dialogues=2, min_turns=1, max_turns=1)), args.k)  # warm-up
    results = {name: measure(name, teacher, config, args.seed) for name in CANDIDATES}
    for name, r in results.items():
        print(f"{name:>10}: {r['seconds']:7.1f} s  {r['dialogues_per_s']:7.3f} dialogues/s  {r['turns_per_s']:7.2f} "
              f"turns/s  {r['generate_calls']} generate() calls  {r['generated_tokens']} generated tokens  "
              f"{r['prompt_tokens']} prompt tokens  padding {100 * r['padding_fraction']:.1f}%")
    speedup = results["batched"]["dialogues_per_s"] / results["sequential"]["dialogues_per_s"]
    print(f"speedup batched / sequential: {speedup:.2f}x (goal >= 4x: {'met' if speedup >= 4 else 'NOT met'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "torch": torch.__version__, "threads": torch.get_num_threads(), "params": params,
               "results": results, "speedup": speedup}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
