"""Fixtures shared by the whole suite, and its last lines.

- SmolLM2-135M-Instruct, loaded once from its GGUF file (transformers parses the file for ~10 s a load): as
  transformers' own Llama, and converted to the library's model (sharing its weights) with its tokenizer.
- Under pytest-xdist (`make test` runs `-n auto`), each worker gets its share of the CPUs for torch and for the
  processes its tests start (OMP_NUM_THREADS), so that two workers do not each run two threads on two cores.
- The suite ends by printing the machine it ran on and its time at the project's reference speed, so that suite
  times from different machines compare: converted by the project's own kind of work (`gatt.io.machine.work_seconds`),
  with the fp32 matmul reading beside it. With GATT_SUITE_RECORD=FILE (`make test` sets it) the same goes to FILE as
  JSON, the record results/test_suite.json is copied from.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerBase

from gatt.io.files import write_json
from gatt.io.machine import (
    REFERENCE_WORK_SECONDS,
    available_cpus,
    machine_calibration,
    matmul_gflops,
    seconds_at_reference,
)
from gatt.model.modeling import GattForCausalLM


@pytest.fixture(scope="session")
def smollm2_llama() -> LlamaForCausalLM:
    """SmolLM2-135M-Instruct from PyPI's GGUF file, de-quantised, as transformers' `LlamaForCausalLM` (eval mode)."""
    from gatt.model.pretrained import SMOLLM2_GGUF, smollm2_dir

    return AutoModelForCausalLM.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF).eval()


@pytest.fixture(scope="session")
def smollm2(smollm2_llama: LlamaForCausalLM) -> tuple[GattForCausalLM, PreTrainedTokenizerBase]:
    """What `gatt.model.pretrained.load_smollm2()` returns, without parsing the file again: the library's model converted
    from `smollm2_llama` (its weights shared: do not train it) and the tokenizer read from the GGUF file."""
    from gatt.model.pretrained import SMOLLM2_GGUF, smollm2_dir

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
    return GattForCausalLM.from_llama(smollm2_llama).eval(), tokenizer


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, available_cpus() // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[STARTED] = time.perf_counter()


STARTED = pytest.StashKey[float]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seconds = time.perf_counter() - config.stash.get(STARTED, time.perf_counter())
    calibration = machine_calibration(available_cpus(), seconds=2.0)
    # bf16 small: without bf16 instructions it crawls
    bf16 = matmul_gflops(torch.bfloat16, size=256, seconds=0.5, threads=calibration["threads"])
    at_reference = seconds_at_reference(seconds, calibration)
    work, fp32 = calibration["work_seconds"], calibration["fp32_matmul_gflops"]
    terminalreporter.write_sep("=", "machine calibration")
    terminalreporter.write_line(
        f"{calibration['cpu']}, {calibration['threads']} CPUs: the project's work {work} s (reference "
        f"{REFERENCE_WORK_SECONDS} s), fp32 {fp32} GFLOP/s, bf16 {bf16} GFLOP/s (torch {torch.__version__}, "
        f"{torch.backends.cpu.get_cpu_capability()})"
    )
    if record := os.environ.get("GATT_SUITE_RECORD"):
        summary = {
            "exit_status": int(exitstatus),
            "seconds": round(seconds, 1),
            "seconds_at_reference_speed": at_reference,
        }
        write_json(record, {**summary, "machine": calibration})
    terminalreporter.write_line(
        f"suite: {seconds:.0f} s here = {at_reference:.0f} s ({at_reference / 60:.1f} min) at the reference speed "
        f"(work {work} s, fp32 {fp32} GFLOP/s)"
    )
