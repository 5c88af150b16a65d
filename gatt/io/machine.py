"""The machine a timing came from: CPU, threads, device and a speed calibration, so that wall times and
throughputs from two machines can be compared (the same training step has run 3x slower on one 2-core
VM than on another)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def available_cpus() -> int:
    """The CPUs this process may run on (the affinity mask where the OS has one).

    Returns:
        The number of CPUs: the affinity mask's, else `os.cpu_count()`, else 1.
    """
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux).

    Returns:
        The first "model name" of /proc/cpuinfo, else `platform.processor()` or `platform.machine()`.
    """
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    return names[0] if names else platform.processor() or platform.machine()


TRACKED_PACKAGES = ("torch", "transformers", "peft", "accelerate", "datasets", "trl")


def package_versions() -> dict[str, str | None]:
    """The installed versions of the packages a result depends on: a result's `versions`.

    Returns:
        The version of each package of TRACKED_PACKAGES, by name (None: not installed).
    """
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# The speed the project's time goals are stated at. The project's own kind of work (a ~1M-parameter model's training
# and decoding steps: small matrices, overhead-bound) is read by `work_seconds`: how long this machine takes for a fixed
# amount of it. A wall time converts to the reference machine as wall x REFERENCE_WORK_SECONDS / work_seconds. A
# matmul reading does not convert such work: a 2-core Intel Xeon reads 1.6x a 2-core AMD EPYC's fp32 GFLOP/s and runs
# `make demo` in about the same wall time. The reference machine is where the earlier reference of 150 fp32 GFLOP/s put
# it, so the time goals keep their meaning: on a 2-core AMD EPYC (AVX-512) the two conversions agree (make demo's run
# there read 3.96 s and 196 GFLOP/s: 3.96 x 196 / 150 = 5.2 s). REFERENCE_GFLOPS stays as the matmul reading's
# reference, recorded beside it.
REFERENCE_WORK_SECONDS = 5.2
REFERENCE_GFLOPS = 150.0

# The calibration's work: the embedded chat model's shape (gatt/embedded_model/config.json) at random weights, written
# here rather than read from the folder, so that a re-made chat model leaves readings from before and after comparable.
WORK_MODEL = {
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "tie_word_embeddings": True,
}
WORK_TRAIN_SHAPE = (8, 256)  # (B, T) of a training step
WORK_DECODE_SHAPE = (16, 64, 16)  # (B, prompt tokens, new tokens) of a greedy decode
WORK_UNITS = 20  # work_seconds is the time of this many units: a training step and a greedy decode each


def matmul_gflops(
    dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 1.0, threads: int | None = None
) -> float:
    """GFLOP/s of size^3 matrix products in `dtype` (median over `seconds`) on `threads` threads.

    torch's thread count is left as it was: a reading must not change what runs after it in the process.

    Args:
        dtype: The matrices' dtype (default float32).
        size: The size of the square matrices (default 1024).
        seconds: How long to keep timing products, after three to warm up (default 1.0).
        threads: CPU threads for torch during the reading (default None: torch's now).

    Returns:
        2 size^3 / the median product's seconds, in GFLOP/s, rounded to 0.1.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        for _ in range(3):
            a @ b  # warm-up
        times: list[float] = []
        while sum(times) < seconds:
            begin = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - begin)
    finally:
        torch.set_num_threads(before)
    return round(2 * size**3 / statistics.median(times) / 1e9, 1)


def work_seconds(threads: int | None = None, seconds: float = 2.0) -> float:
    """Seconds this machine takes for a fixed amount of the project's own kind of work: WORK_UNITS units, each an
    AdamW step of the embedded model's shape on a (8, 256) batch and a greedy decode of 16 tokens for 16 prompts of
    64 tokens with a KV cache, on `threads` threads (default: torch's now). Like `matmul_gflops`, it times units for
    about `seconds` (at least three, after three to warm up) and takes the median unit, so a busy machine reads slow
    but never takes long to read. torch's thread count and random state are left as they were.

    Args:
        threads: CPU threads for torch during the reading.
        seconds: how long to keep timing units.

    Returns:
        The median unit's seconds x WORK_UNITS, rounded to 0.01 s.
    """
    from gatt.model.modeling import GattConfig, GattForCausalLM  # the model imports this module's neighbours

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = GattForCausalLM(GattConfig(**WORK_MODEL))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            batch = torch.randint(3, WORK_MODEL["vocab_size"], WORK_TRAIN_SHAPE)  # (B, T)
            rows, prompt_tokens, new_tokens = WORK_DECODE_SHAPE
            prompts = torch.randint(3, WORK_MODEL["vocab_size"], (rows, prompt_tokens))  # (B, T)

            def unit() -> float:
                begin = time.perf_counter()
                model.train()
                model(input_ids=batch, labels=batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                model.eval()
                with torch.no_grad():
                    model.generate(
                        prompts,
                        attention_mask=torch.ones_like(prompts),
                        max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens,
                        do_sample=False,
                        pad_token_id=0,
                    )
                return time.perf_counter() - begin

            for _ in range(3):
                unit()  # warm-up: the first units run slow (allocations, caches)
            times: list[float] = []
            while len(times) < 3 or sum(times) < seconds:
                times.append(unit())
    finally:
        torch.set_num_threads(before)
    return round(statistics.median(times) * WORK_UNITS, 2)


def seconds_at_reference(seconds: float, calibration: dict[str, Any]) -> float:
    """Wall time converted to the reference machine by the project's own kind of work.

    Args:
        seconds: Seconds of wall time on the machine of `calibration`.
        calibration: A `machine_calibration` record of that machine.

    Returns:
        seconds x REFERENCE_WORK_SECONDS / its `work_seconds`, rounded to 0.1 s.
    """
    return round(seconds * REFERENCE_WORK_SECONDS / calibration["work_seconds"], 1)


def machine_calibration(threads: int | None = None, size: int = 1024, seconds: float = 1.0) -> dict[str, Any]:
    """This machine's speed now: the project's own kind of work (`work_seconds`, what times convert by) and fp32
    matrix products (`matmul_gflops`, beside it) on `threads` threads (default: every available CPU), with the CPU,
    the thread count, the torch version and the versions of every package a result depends on (`versions`).

    Args:
        threads: CPU threads for the readings (default: every available CPU).
        size: the matmul reading's matrix size.
        seconds: the matmul reading's duration; the work reading takes twice as long.

    Returns:
        A record with `work_seconds`, `fp32_matmul_gflops`, `threads`, `cpu`, `torch` and `versions`.
    """
    threads = threads or available_cpus()
    return {
        "work_seconds": work_seconds(threads, 2 * seconds),
        "fp32_matmul_gflops": matmul_gflops(torch.float32, size, seconds, threads),
        "threads": threads,
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "versions": package_versions(),
    }


__all__ = [
    "REFERENCE_GFLOPS",
    "REFERENCE_WORK_SECONDS",
    "TRACKED_PACKAGES",
    "available_cpus",
    "cpu_name",
    "machine_calibration",
    "matmul_gflops",
    "package_versions",
    "seconds_at_reference",
    "work_seconds",
    "WORK_UNITS",
]
