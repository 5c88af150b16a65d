"""Causal self-attention, forward + backward: our fast path vs PyTorch SDPA called directly (speed), and
Hugging Face's eager attention vs ours (peak memory).

- `attention_vs_sdpa`: ``masked_attention(q, k, v, is_causal=True)`` (the library's fast path) against
  ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, at T=2048: the median of interleaved
  forward + backward passes (a fixed random output gradient), after a warm-up. Ratio: SDPA's time over
  ours (ours / theirs speed). Goal >= 0.95: our wrapper (validation, mask logic) costs nothing that shows.
- `attention_memory_vs_eager`: transformers' Llama `eager_attention_forward` (the attention most
  Hugging Face models fall back to, and the one that returns weights) against our fast path: peak
  memory of one forward + backward at T=2048, inputs and the additive causal mask excluded, the
  q/k/v gradients included. Ratio: eager's peak over ours. Goal >= 4: ours never materialises (T, T).
  The full run adds the peaks at T=512 and 1024 (and our explicit path, which returns the weights as
  eager does), so a reader sees linear growth on the fast path and quadratic growth on the others.

Peak memory on CPU is the largest running total of the allocations minus frees that the allocator reports
to ``torch.profiler`` (``profile_memory=True``); on CUDA, ``torch.cuda.max_memory_allocated`` above the
inputs.

  python benchmarks/bench_attention.py [--quick] [--device cuda]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from bench_common import comparison, interleaved, main, median
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from transformers.models.llama.modeling_llama import eager_attention_forward

from gatt.model.attention import masked_attention

Attention = Callable[[Tensor, Tensor, Tensor], Tensor]
MIB = 2**20
SHAPE = {"batch": 4, "heads": 8, "head_dim": 64}  # B, H, D: a 512-wide model's attention
LENGTH = 2048


def eager(length: int, device: str) -> Attention:
    """Hugging Face eager attention with the additive causal mask its models build (made once, outside timing)."""
    mask = torch.full((length, length), torch.finfo(torch.float32).min, device=device).triu(1)[
        None, None
    ]  # (1, 1, T, T)
    module = SimpleNamespace(num_key_value_groups=1, training=True)
    return lambda q, k, v: eager_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)[0]


def candidates(length: int, device: str) -> dict[str, Attention]:
    return {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "fast": lambda q, k, v: masked_attention(q, k, v, is_causal=True)[0],
        "explicit": lambda q, k, v: masked_attention(q, k, v, is_causal=True, return_weights=True)[0],
        "eager": eager(length, device),
    }


def make_inputs(length: int, device: str, sizes: dict[str, int] = SHAPE) -> tuple[list[Tensor], Tensor]:
    """q, k, v (B, H, T, D) leaves with requires_grad, and a fixed output gradient (B, H, T, D)."""
    shape = (sizes["batch"], sizes["heads"], length, sizes["head_dim"])
    qkv = [torch.randn(shape, device=device, requires_grad=True) for _ in range(3)]
    return qkv, torch.randn(shape, device=device)


def forward_backward(fn: Attention, qkv: list[Tensor], grad: Tensor) -> None:
    for t in qkv:
        t.grad = None
    out = fn(*qkv)
    if out.shape != grad.shape:  # eager returns (B, T, H, D)
        out = out.transpose(1, 2)
    out.backward(grad)


def timed(fn: Attention, qkv: list[Tensor], grad: Tensor) -> Callable[[], float]:
    def round_() -> float:
        if qkv[0].is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        forward_backward(fn, qkv, grad)
        if qkv[0].is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    return round_


def peak_bytes(fn: Attention, qkv: list[Tensor], grad: Tensor) -> int:
    """Peak bytes allocated on top of what existed before one forward + backward."""
    for t in qkv:
        t.grad = None  # freed before measuring: a free inside the window would lower the running total
    if qkv[0].is_cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        forward_backward(fn, qkv, grad)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        forward_backward(fn, qkv, grad)
    # The raw allocator records, in time order: FunctionEvent lumps them into the enclosing op instead.
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    running = peak = 0
    for event in sorted(records, key=lambda e: e.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def run(quick: bool, device: str) -> dict[str, dict[str, Any]]:
    torch.manual_seed(0)
    settings = {**SHAPE, "length": LENGTH, "dtype": "float32", "pass": "forward + backward", "device": device}
    sides = candidates(LENGTH, device)
    qkv, grad = make_inputs(LENGTH, device)
    repeats = 5 if quick else 11
    seconds = interleaved({name: timed(sides[name], qkv, grad) for name in ("fast", "sdpa")}, repeats=repeats)
    fast_ms, sdpa_ms = 1e3 * median(seconds["fast"]), 1e3 * median(seconds["sdpa"])
    speed = comparison(
        1e3 / fast_ms,
        1e3 / sdpa_ms,
        unit="passes/s",
        goal=0.95,
        settings={**settings, "repeats": repeats},
        ms={"ours": fast_ms, "theirs": sdpa_ms},
    )

    peaks: dict[int, dict[str, float]] = {}
    for length in [LENGTH] if quick else [512, 1024, LENGTH]:
        qkv, grad = make_inputs(length, device)
        sides = candidates(length, device)
        peaks[length] = {name: peak_bytes(fn, qkv, grad) / MIB for name, fn in sides.items()}
    at = peaks[LENGTH]
    memory = comparison(
        at["fast"],
        at["eager"],
        unit="peak MiB",
        goal=4.0,
        higher_is_better=False,
        settings=settings,
        peak_mib_by_length={str(t): {k: round(v, 1) for k, v in p.items()} for t, p in peaks.items()},
    )
    return {"attention_vs_sdpa": speed, "attention_memory_vs_eager": memory}


if __name__ == "__main__":
    main(run, __doc__)
