"""Benchmark causal self-attention on CPU: direct SDPA vs gatt's fast path vs its explicit path.

For each sequence length T it measures, in one process and side by side:

- "sdpa":     ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` called directly;
- "fast":     ``masked_attention(q, k, v, is_causal=True)`` (the library's SDPA path);
- "explicit": ``masked_attention(q, k, v, is_causal=True, return_weights=True)`` (materialises (T, T)).

Time: the median over ``--repeats`` of one forward + backward (a fixed random output gradient),
measured with ``time.perf_counter`` after one warm-up call each; the candidates run round-robin
within each repeat (their order rotating) so machine noise hits all of them alike.
Peak memory: the largest running total of the CPU allocations minus frees that the allocator reports
to ``torch.profiler`` (``profile_memory=True``) during one forward + backward, inputs excluded and
the q/k/v gradients included.

Goals: fast speed vs SDPA (sdpa_time / fast_time) >= 0.95x; peak memory growing ~linearly in T for
"fast" (x2 from T to 2T) while "explicit" grows ~quadratically (x4), its peak at least the
B*H*T*T*4 bytes of the fp32 weights.

Usage: python benchmarks/bench_attention.py [--lengths 512 1024 2048] [--repeats 5] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from gatt.attention import masked_attention

Attention = Callable[[Tensor, Tensor, Tensor], Tensor]
CANDIDATES: dict[str, Attention] = {
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "fast": lambda q, k, v: masked_attention(q, k, v, is_causal=True)[0],
    "explicit": lambda q, k, v: masked_attention(q, k, v, is_causal=True, return_weights=True)[0],
}
MIB = 2**20


def make_inputs(batch: int, heads: int, length: int, head_dim: int) -> tuple[list[Tensor], Tensor]:
    """q, k, v (B, H, T, D) leaves with requires_grad, and a fixed output gradient."""
    qkv = [torch.randn(batch, heads, length, head_dim, requires_grad=True) for _ in range(3)]
    return qkv, torch.randn(batch, heads, length, head_dim)


def step(fn: Attention, qkv: list[Tensor], grad: Tensor) -> float:
    """One forward + backward from fresh gradients; returns its wall time in seconds."""
    for t in qkv:
        t.grad = None
    start = time.perf_counter()
    fn(*qkv).backward(grad)
    return time.perf_counter() - start


def peak_memory(fn: Attention, qkv: list[Tensor], grad: Tensor) -> int:
    """Peak bytes allocated on top of what existed before one forward + backward, via the profiler."""
    for t in qkv:
        t.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*qkv).backward(grad)
    # The raw allocator records, in time order: FunctionEvent lumps them into the enclosing op instead.
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    running = peak = 0
    for event in sorted(records, key=lambda e: e.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def bench_length(length: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Time and peak memory of every candidate at one sequence length."""
    qkv, grad = make_inputs(args.batch, args.heads, length, args.head_dim)
    names = list(CANDIDATES)
    warmup = {name: step(CANDIDATES[name], qkv, grad) for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order each repeat
            times[name].append(step(CANDIDATES[name], qkv, grad))
    return {
        name: {
            "ms": 1e3 * statistics.median(times[name]),
            "ms_min": 1e3 * min(times[name]),
            "ms_warmup": 1e3 * warmup[name],
            "peak_mib": peak_memory(CANDIDATES[name], qkv, grad) / MIB,
        }
        for name in names
    }


def print_table(results: dict[int, dict[str, dict[str, float]]]) -> None:
    """ms per fwd+bwd, fast speed vs SDPA, peak MiB and peak growth from the previous (shorter) T."""
    names = list(CANDIDATES)
    header = ["T"] + [f"{n} ms" for n in names] + ["fast vs SDPA"] + [f"{n} MiB" for n in names]
    header += [f"{n} grow" for n in names]
    rows, prev = [], None
    for length, res in results.items():
        row = [str(length)] + [f"{res[n]['ms']:.1f}" for n in names]
        row.append(f"{res['sdpa']['ms'] / res['fast']['ms']:.3f}x")
        row += [f"{res[n]['peak_mib']:.1f}" for n in names]
        row += [f"{res[n]['peak_mib'] / prev[n]['peak_mib']:.2f}x" if prev else "-" for n in names]
        rows.append(row)
        prev = res
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(cell.rjust(w) for cell, w in zip(r, widths)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048], help="sequence lengths T")
    parser.add_argument("--repeats", type=int, default=5, help="timed fwd+bwd per candidate (median reported)")
    parser.add_argument("--batch", type=int, default=4, help="batch size B")
    parser.add_argument("--heads", type=int, default=8, help="attention heads H")
    parser.add_argument("--head-dim", type=int, default=64, help="head dimension D")
    parser.add_argument("--out", type=Path, default=Path("runs/bench/attention.json"), help="JSON results path")
    args = parser.parse_args()

    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 CPU, B={args.batch} H={args.heads} "
          f"D={args.head_dim}, median of {args.repeats}")
    results = {}
    for length in args.lengths:
        results[length] = bench_length(length, args)
        weights_mib = args.batch * args.heads * length * length * 4 / MIB
        if results[length]["explicit"]["peak_mib"] < weights_mib:
            print(f"warning: explicit peak at T={length} is below the {weights_mib:.0f} MiB of its weights")
    print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    payload = {"config": config, "torch": torch.__version__, "threads": torch.get_num_threads(), "results": results}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
