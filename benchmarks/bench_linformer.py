"""Linformer against full attention: peak memory and time of one forward + backward, non-causal.

- `linformer_memory_vs_full`: ``linformer_attention(q, k, v, E, F)`` (k = 256 projected keys, E and F
  (256, 4096) learned, so their gradients count) against full attention as the Linformer paper's baseline
  computes it: softmax(Q K^T / sqrt(D)) V with the (B, H, T, T) weights materialised (our explicit path,
  ``masked_attention(q, k, v, return_weights=True)``, not causal), at T = 1024, 2048 and 4096 (--quick:
  4096 only). Ratio: full attention's peak memory over Linformer's at T = 4096. Goal >= 4. Time: the
  median of interleaved rounds after a warm-up, in the result's `ms_by_length`.

Full attention's memory is quadratic only when it materialises the weights. The fused kernel
(``F.scaled_dot_product_attention``, recorded beside the others as `sdpa`) computes the same exact
attention without the (T, T) weights, so its peak also grows linearly in T and is close to Linformer's:
Linformer's memory advantage is over the materialising baseline, while its time advantage (O(T k) instead
of O(T^2) work) holds against both. Linformer is approximate, not causal (E mixes every position, so a
query sees projections of later tokens), and meant for encoders and cross-attention. `linformer_explicit`
is Linformer through the explicit path (its (T, k) weights materialised) for an apples-to-apples reading.

Peak memory is measured as in bench_attention.py: on CPU the largest running total of the allocations
minus frees that ``torch.profiler`` reports, on CUDA ``torch.cuda.max_memory_allocated``, above the inputs.

  python benchmarks/bench_linformer.py [--quick] [--device cuda]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from bench_attention import MIB, Attention, make_inputs, peak_bytes, timed
from bench_common import comparison, interleaved, main, median
from torch import Tensor

from gatt.model.attention import linformer_attention, masked_attention

SHAPE = {"batch": 1, "heads": 8, "head_dim": 64}  # B, H, D: T=4096 full attention holds (1, 8, 4096, 4096) fp32 weights
PROJECTED = 256  # k
LENGTH = 4096  # n: E and F are (k, n); the headline length
LENGTHS = (1024, 2048, 4096)


def candidates(projections: tuple[Tensor, Tensor]) -> dict[str, Attention]:
    """Every side, non-causal; Linformer's E and F (k, n) are learned leaves, sliced to T inside."""
    e_proj, f_proj = projections
    return {
        "full": lambda q, k, v: masked_attention(q, k, v, return_weights=True)[0],
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "linformer": lambda q, k, v: linformer_attention(q, k, v, e_proj, f_proj)[0],
        "linformer_explicit": lambda q, k, v: linformer_attention(q, k, v, e_proj, f_proj, return_weights=True)[0],
    }


def run(quick: bool, device: str) -> dict[str, dict[str, Any]]:
    torch.manual_seed(0)
    lengths = [LENGTH] if quick else list(LENGTHS)
    repeats = 3 if quick else 5
    projections = tuple(
        (torch.randn(PROJECTED, LENGTH, device=device) * LENGTH**-0.5).requires_grad_(True) for _ in range(2)
    )
    sides = candidates(projections)
    peaks: dict[int, dict[str, float]] = {}
    ms: dict[int, dict[str, float]] = {}
    for length in lengths:
        qkv, grad = make_inputs(length, device, SHAPE)
        peaks[length] = {}
        for name, fn in sides.items():
            for p in projections:
                p.grad = None  # E's and F's gradients are allocated inside the measured pass, as in training
            peaks[length][name] = peak_bytes(fn, qkv, grad) / MIB
        seconds = interleaved({name: timed(fn, qkv, grad) for name, fn in sides.items()}, repeats=repeats)
        ms[length] = {name: 1e3 * median(s) for name, s in seconds.items()}
        del qkv, grad
    at = peaks[LENGTH]
    settings = {
        **SHAPE,
        "k": PROJECTED,
        "n": LENGTH,
        "length": LENGTH,
        "causal": False,
        "dtype": "float32",
        "pass": "forward + backward",
        "repeats": repeats,
        "device": device,
    }
    memory = comparison(
        at["linformer"],
        at["full"],
        unit="peak MiB",
        goal=4.0,
        higher_is_better=False,
        settings=settings,
        peak_mib_by_length={str(t): {k: round(v, 1) for k, v in p.items()} for t, p in peaks.items()},
        ms_by_length={str(t): {k: round(v, 1) for k, v in m.items()} for t, m in ms.items()},
        time_ratio_full_over_linformer={str(t): round(m["full"] / m["linformer"], 2) for t, m in ms.items()},
    )
    return {"linformer_memory_vs_full": memory}


if __name__ == "__main__":
    main(run, __doc__)
