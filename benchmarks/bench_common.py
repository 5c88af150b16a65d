"""What every benchmark of `benchmarks/run.py` shares: interleaved timing and the form of a result.

Rules (docs/benchmarks.md): warm up, repeat, take the median, interleave the two sides (the order rotates each
round, so machine noise hits both alike). A result is one comparison, ours vs theirs:

    {"ratio": ours / theirs (higher is better), "ours": figure, "theirs": figure, "unit": "...",
     "goal": minimum ratio, "met": bool, "settings": {...}, ...extra}
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

# A side of a comparison: one timed round. It returns the seconds it measured itself (to leave set-up out
# of the timing), or None to be timed whole.
Round = Callable[[], float | None]


def interleaved(sides: dict[str, Round], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of `repeats` rounds of every side, after `warmup` untimed rounds each, the order rotating."""
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            measured = sides[name]()
            seconds[name].append(measured if measured is not None else time.perf_counter() - start)
    return seconds


def median(values: list[float]) -> float:
    return statistics.median(values)


def rollout_vs_batched_generate(
    model: Any,
    llama: Any,
    tokenizer: Any,
    plan: list[Any],
    config: Any,
    *,
    goal: float,
    settings: dict[str, Any],
    caches: Sequence[str] = ("none", "carry"),
    static_cache_len: int = 4096,
) -> dict[str, Any]:
    """Our rollouts (`gatt.eval.rollout.rollout`, all of `plan` in one batch, the attention probe off and on) vs the
    batched `generate()` a user would run (`generate_rollout`: every dialogue in one call per turn, left-padded) on
    `llama`, Hugging Face's own model with the same weights: re-encoding each history, carrying the batch's cache
    across turns (`caches`), and on CUDA a static cache too (which generate() compiles there: `static_cache_len`
    columns, sized once, so that it compiles its step once). Greedy, every decoding parameter the same; each side
    warmed up on two dialogues (the static cache on all of them: its compiled step is for one batch size), then one
    timed run each. The ratio is ours (probe on:
    the report's setting) over the fastest baseline; `identical_replies` per baseline, against ours."""
    from dataclasses import replace

    import torch

    from gatt.eval.rollout import generate_rollout, rollout

    config = replace(config, batch_size=len(plan), decoder="engine")  # every dialogue in one batch; ours: the engine
    caches = [*caches, *(["static"] if llama.device.type == "cuda" else [])]
    sides: dict[str, Callable[[list[Any]], list[dict]]] = {
        "ours_probe_off": lambda dialogues: rollout(model, tokenizer, dialogues, config, progress=False),
        "ours": lambda dialogues: rollout(
            model, tokenizer, dialogues, replace(config, measure_attention=True), progress=False
        ),
        **{
            f"generate_{cache}": (
                lambda dialogues, cache=cache: generate_rollout(
                    llama, tokenizer, dialogues, config, cache=cache, static_cache_len=static_cache_len, progress=False
                )
            )
            for cache in caches
        },
    }
    transcripts, seconds = {}, {}
    for name, side in sides.items():
        side(plan if name == "generate_static" else plan[:2])  # warm-up: kernels, allocator, a compiled step
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        transcripts[name] = side(plan)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - start
    turns = sum(len(t["turns"]) for t in transcripts["ours"])
    rate = {name: sum(len(t["turns"]) for t in transcripts[name]) / seconds[name] for name in sides}
    best = max((name for name in sides if name.startswith("generate_")), key=rate.__getitem__)

    def identical(a: list[dict], b: list[dict]) -> float:
        pairs = [(x["reply"], y["reply"]) for u, v in zip(a, b) for x, y in zip(u["turns"], v["turns"])]
        return round(sum(x == y for x, y in pairs) / max(len(pairs), 1), 4)

    return comparison(
        rate["ours"],
        rate[best],
        unit="turns/s",
        goal=goal,
        settings={
            **settings,
            "dialogues": len(plan),
            "dialogues_per_batch": len(plan),
            "greedy": True,
            "repetition_penalty": config.repetition_penalty,
            "max_new_tokens": config.max_new_tokens,
            "theirs": f"generate() batched per turn over every dialogue, left-padded, cache {best[len('generate_') :]!r} "
            "(the fastest of " + ", ".join(caches) + ")",
            "hugging_face_model": f"{type(llama).__name__} ({llama.config._attn_implementation})",
            **({"static_cache_len": static_cache_len} if "static" in caches else {}),
        },
        best_baseline=best,
        turns=turns,
        turns_per_s={name: round(r, 3) for name, r in rate.items()},
        ratio_probe_off=round(rate["ours_probe_off"] / rate[best], 4),
        ratios={name: round(rate["ours"] / rate[name], 4) for name in sides if name.startswith("generate_")},
        identical_replies={name: identical(transcripts["ours"], transcripts[name]) for name in sides if name != "ours"},
        seconds={name: round(s, 2) for name, s in seconds.items()},
    )


def comparison(
    ours: float,
    theirs: float,
    *,
    unit: str,
    goal: float,
    settings: dict[str, Any],
    higher_is_better: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """One benchmark's result. `ours`/`theirs` are raw figures in `unit`; the ratio is ours' speed over theirs
    (for a figure where lower is better, such as seconds or bytes, theirs / ours)."""
    ratio = ours / theirs if higher_is_better else theirs / ours
    return {
        "ratio": round(ratio, 4),
        "ours": ours,
        "theirs": theirs,
        "unit": unit,
        "higher_is_better": higher_is_better,
        "goal": goal,
        "met": ratio >= goal,
        "settings": settings,
        **extra,
    }


def main(run: Callable[[bool, str], dict[str, dict[str, Any]]], doc: str) -> None:
    """A benchmark module on its own: `python benchmarks/bench_X.py [--quick] [--device cuda]` prints its results."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the sizes of `benchmarks/run.py --quick`")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where models run")
    args = parser.parse_args()
    print(json.dumps(run(args.quick, args.device), indent=2))


__all__ = ["Round", "comparison", "interleaved", "main", "median", "rollout_vs_batched_generate"]
