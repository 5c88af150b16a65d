"""What every benchmark of `benchmarks/run.py` shares: interleaved timing and the form of a result.

Rules (issue 16): warm up, repeat, take the median, interleave the two sides (the order rotates each
round, so machine noise hits both alike). A result is one comparison, ours vs theirs:

    {"ratio": ours / theirs (higher is better), "ours": figure, "theirs": figure, "unit": "...",
     "goal": minimum ratio, "met": bool, "settings": {...}, ...extra}
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
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


__all__ = ["Round", "comparison", "interleaved", "main", "median"]
