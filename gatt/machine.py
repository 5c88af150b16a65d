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
    """The CPUs this process may run on (the affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    return names[0] if names else platform.processor() or platform.machine()


TRACKED_PACKAGES = ("torch", "transformers", "peft", "accelerate", "datasets", "trl")


def package_versions() -> dict[str, str | None]:
    """The installed versions of the packages a result depends on (None: not installed): a result's `versions`."""
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# The speed the project's time goals are stated at: a 2-core machine's fp32 matmul, GFLOP/s. A wall time scales to
# it as wall x measured GFLOP/s / REFERENCE_GFLOPS, so runs on faster and slower machines compare.
REFERENCE_GFLOPS = 150.0


def matmul_gflops(
    dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 1.0, threads: int | None = None
) -> float:
    """GFLOP/s of size^3 matrix products in `dtype` (median over `seconds`) on `threads` threads (default: torch's
    now). torch's thread count is left as it was: a reading must not change what runs after it in the process."""
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


def machine_calibration(threads: int | None = None, size: int = 1024, seconds: float = 1.0) -> dict[str, Any]:
    """This machine's speed now: fp32 matrix products (`matmul_gflops`) on `threads` threads (default: every
    available CPU), with the CPU, the thread count, the torch version and the versions of every package a
    result depends on (`versions`)."""
    threads = threads or available_cpus()
    return {
        "fp32_matmul_gflops": matmul_gflops(torch.float32, size, seconds, threads),
        "threads": threads,
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "versions": package_versions(),
    }


__all__ = [
    "REFERENCE_GFLOPS",
    "TRACKED_PACKAGES",
    "available_cpus",
    "cpu_name",
    "machine_calibration",
    "matmul_gflops",
    "package_versions",
]
