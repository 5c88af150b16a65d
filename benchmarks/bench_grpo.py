"""GRPO's completions: the project's engine vs the `generate()` call TRL's `GRPOTrainer` makes (gatt/training/grpo.py).

GRPO samples `num_generations` completions for each prompt every step; the recipe lets TRL generate them. What
that costs against the project's engine, on the same prompts, model, sampling and token budget, in one process:

- theirs: what TRL's GRPOTrainer runs (trl/trainer/grpo_trainer.py, `_generate_single_turn`): the chat template of
  each prompt, each prompt repeated `k` times, left-padded, one `model.generate(do_sample=True)` call;
- ours: `gatt.model.generation.ChatBatch.generate(prompts, k)`: each prompt encoded once, then `k` cache rows.

The prompts are GRPO's own (`gatt.training.grpo.prompt_records`): the shipped embedded chat model's rollouts of the built-in
train split, cut at turns 2..20, as `make grpo-embedded` draws them. Every completion is exactly M tokens on both
sides (the end-of-turn token does not stop a reply), so the work is the same whatever is sampled; a round is one
call over every prompt; the sides alternate after an untimed warm-up. `grpo_completions_vs_trl_generate`: new
tokens/s of ours over theirs (median round), goal >= 2 (what would make it worth plugging the engine into TRL).
Full: 16 prompts x k=4 x M=48, 5 rounds each; --quick: 8 prompts, 3 rounds.

  python benchmarks/bench_grpo.py [--quick] [--device cuda]
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from bench_common import comparison, interleaved, main, median
from bench_teacher import no_end_of_turn

from data_gen.eval_set import training_turns
from gatt.eval.rollout import rollout
from gatt.eval.turns import RolloutConfig
from gatt.model.chat_model import load_chat_model
from gatt.model.embedded import FOLDER
from gatt.model.generation import ChatBatch
from gatt.model.sampling import SAMPLER_DEFAULTS, Sampler
from gatt.training.grpo import GRPOGattConfig, prompt_dialogues, prompt_records

FULL = {"prompts": 16, "k": 4, "max_new_tokens": 48, "repeats": 5}
QUICK = {"prompts": 8, "k": 4, "max_new_tokens": 48, "repeats": 3}
SAMPLING = {key: SAMPLER_DEFAULTS[key] for key in ("temperature", "top_p")}


def grpo_prompts(model: Any, tokenizer: Any, n: int) -> list[list[int]]:
    """`n` GRPO prompts of the embedded model, rendered with its chat template (generation prompt added)."""
    with tempfile.TemporaryDirectory() as out:
        config = GRPOGattConfig(model="embedded", output_dir=out, prompt_dialogues=n // 4 or 1, prompts_per_dialogue=4)
        dialogues = prompt_dialogues(config, training_turns())
        transcripts = rollout(model, tokenizer, dialogues, RolloutConfig(max_new_tokens=48), progress=False)
        records = prompt_records(transcripts, dialogues, config)[:n]
    return [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
        for r in records
    ]


def theirs(model: Any, tokenizer: Any, prompts: list[list[int]], k: int, max_new_tokens: int) -> int:
    """TRL's call: every prompt k times, left-padded, one sampling `generate()`; the new tokens made."""
    rows = [ids for ids in prompts for _ in range(k)]
    width = max(len(ids) for ids in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :], attention_mask[i, width - len(ids) :] = torch.tensor(ids), 1
    out = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        do_sample=True,
        top_k=0,
        **SAMPLING,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
    )
    return (out.shape[1] - width) * len(rows)


def ours(model: Any, tokenizer: Any, prompts: list[list[int]], k: int, max_new_tokens: int) -> int:
    """The engine: each prompt encoded once, k candidates each; the new tokens made."""
    sampler = Sampler(do_sample=True, **SAMPLING, device=model.device)
    chat = ChatBatch(model, tokenizer, sampler, max_new_tokens=max_new_tokens)
    replies = chat.generate(dict(enumerate(prompts)), k=k)
    return sum(len(c.tokens) for candidates in replies.values() for c in candidates)


def run(quick: bool, device: str) -> dict[str, dict[str, Any]]:
    size = QUICK if quick else FULL
    k, m = size["k"], size["max_new_tokens"]
    model, tokenizer = load_chat_model(FOLDER, device=device)
    prompts = grpo_prompts(model, tokenizer, size["prompts"])
    tokens: dict[str, int] = {}

    def side(name: str, fn: Any) -> Any:
        def round_() -> None:
            with torch.no_grad(), no_end_of_turn():
                tokens[name] = fn(model, tokenizer, prompts, k, m)

        return round_

    seconds = interleaved({"ours": side("ours", ours), "theirs": side("theirs", theirs)}, repeats=size["repeats"])
    rate = {name: median([tokens[name] / s for s in seconds[name]]) for name in seconds}
    settings = {
        "prompts": len(prompts),
        "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
        "k": k,
        "max_new_tokens": m,
        "every_completion": "exactly max_new_tokens tokens",
        **SAMPLING,
        "model": "the shipped embedded chat model",
        "theirs": "TRL GRPOTrainer's generate(): each prompt repeated k times, left-padded, one call",
        "repeats": size["repeats"],
        "device": device,
        "threads": torch.get_num_threads(),
    }
    return {
        "grpo_completions_vs_trl_generate": comparison(
            round(rate["ours"], 1),
            round(rate["theirs"], 1),
            unit="new tokens/s",
            goal=2.0,
            settings=settings,
            seconds={name: [round(s, 3) for s in v] for name, v in seconds.items()},
        )
    }


if __name__ == "__main__":
    main(run, __doc__)
