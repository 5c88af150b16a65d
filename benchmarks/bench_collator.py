"""GAtt training layouts: one pass per dialogue (`mode="all"` + packing) vs one example per reply
(`mode="expand"`, the paper's recipe applied to every turn), on the same records and supervised tokens.

On oracle GAtt dialogues of 20 turns and the same model (the embedded base model's size, the same random
init each round), each round trains one pass over the records (collation, forward, backward, optimizer
step), the layouts interleaved:

- "all+pack":   every reply of a dialogue supervised in one example, several dialogues packed per row (ours);
- "expand+pad": one example per assistant turn, each cut after its turn, padded (theirs);
- "all+pad":    one example per dialogue, padded (what packing adds, reported alongside).

Every layout trains on exactly the same supervised tokens (asserted). `one_pass_vs_expand`: supervised
tokens/s of all+pack over expand+pad, goal >= 5.

  python benchmarks/bench_collator.py [--quick] [--device cuda]
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from bench_common import comparison, interleaved, main, median

from data_gen.constraints import catalogue
from data_gen.synthesis import SynthesisConfig, synthesize
from data_gen.teacher import OracleTeacher
from data_gen.user_turns import split_user_turns
from gatt import GattConfig, GattForCausalLM
from gatt.data.collator import IGNORE_INDEX, GAttCollator
from gatt.model.tokenizer import train_tokenizer

LAYOUTS = {"all+pack": ("all", True), "expand+pad": ("expand", False), "all+pad": ("all", False)}
WORK = Path("runs/bench/collator")


def make_records(dialogues: int, min_turns: int, max_turns: int, out: Path) -> list[dict]:
    """Oracle GAtt dialogues of min_turns to max_turns turns."""
    shutil.rmtree(out, ignore_errors=True)  # synthesis resumes into a folder: start clean
    constraints = [c for c in catalogue() if c.split == "train"]
    config = SynthesisConfig(
        num_dialogues=dialogues, min_turns=min_turns, max_turns=max_turns, samples_per_turn=1, probe_prob=0.0
    )
    synthesize(out, config, OracleTeacher(constraints), constraints, split_user_turns()[0])
    return [json.loads(line) for line in (out / "gatt.jsonl").read_text().splitlines()]


def one_pass(
    records: list[dict], collator: GAttCollator, model: GattForCausalLM, initial: dict, batch: int
) -> dict[str, int]:
    """Train one pass over the records from `initial` weights; returns the supervised tokens and token slots."""
    model.load_state_dict(initial)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    device = next(model.parameters()).device
    supervised = slots = 0
    for i in range(0, len(records), batch):
        inputs = collator(records[i : i + batch])
        # Expand makes many examples per record: train them in rows of at most `batch` examples each step.
        for r in range(0, inputs["input_ids"].shape[0], batch):
            rows = {k: v[r : r + batch].to(device) for k, v in inputs.items()}
            count = int((rows["labels"][:, 1:] != IGNORE_INDEX).sum())
            loss = model(**rows, use_cache=False, num_items_in_batch=torch.tensor(float(count), device=device)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            supervised += count
            slots += rows["input_ids"].numel()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"supervised_tokens": supervised, "token_slots": slots}


def run(quick: bool, device: str) -> dict[str, dict[str, Any]]:
    dialogues, turns, batch, repeats = (4, 20, 8, 1) if quick else (8, 20, 8, 3)
    records = make_records(dialogues, turns, turns, WORK)
    texts = [m["content"] for r in records for m in r["messages"]] + [r["instruction"] for r in records]
    tokenizer = train_tokenizer(texts, vocab_size=2048, model_max_length=2048)
    config = GattConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = GattForCausalLM(config).to(device).train()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    counts: dict[str, dict[str, int]] = {}

    def side(name: str):
        mode, packing = LAYOUTS[name]
        collator = GAttCollator(tokenizer, mode=mode, max_length=2048, packing=packing)

        def round_() -> None:
            counts[name] = one_pass(records, collator, model, initial, batch)

        return round_

    warm = records[:1]  # a warm-up round on one record per layout: kernels and allocator, not the timed work
    for mode, packing in LAYOUTS.values():
        one_pass(warm, GAttCollator(tokenizer, mode=mode, max_length=2048, packing=packing), model, initial, batch)
    seconds = interleaved({name: side(name) for name in LAYOUTS}, repeats=repeats, warmup=0)
    tokens = {c["supervised_tokens"] for c in counts.values()}
    assert len(tokens) == 1, f"layouts must train on the same supervised tokens, got {counts}"
    supervised = tokens.pop()
    rate = {name: supervised / median(seconds[name]) for name in LAYOUTS}
    settings = {
        "dialogues": dialogues,
        "turns": turns,
        "rows_per_step": batch,
        "repeats": repeats,
        "supervised_tokens": supervised,
        "model": "embedded size (hidden 128, 4 layers), random init",
        "device": device,
    }
    result = comparison(
        rate["all+pack"],
        rate["expand+pad"],
        unit="supervised tokens/s",
        goal=5.0,
        settings=settings,
        seconds={name: median(seconds[name]) for name in LAYOUTS},
        all_pad_tokens_per_s=rate["all+pad"],
        supervised_share_of_slots={
            name: counts[name]["supervised_tokens"] / counts[name]["token_slots"] for name in LAYOUTS
        },
    )
    return {"one_pass_vs_expand": result}


if __name__ == "__main__":
    main(run, __doc__)
