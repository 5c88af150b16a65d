"""gatt.io.machine: a result's machine record carries the versions it ran with, and every committed one does."""

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from gatt.io.machine import (
    REFERENCE_WORK_SECONDS,
    TRACKED_PACKAGES,
    machine_calibration,
    package_versions,
    seconds_at_reference,
    work_seconds,
)

RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_versions_are_the_installed_ones() -> None:
    versions = package_versions()
    assert (
        list(versions) == list(TRACKED_PACKAGES) == ["torch", "transformers", "peft", "accelerate", "datasets", "trl"]
    )
    assert versions["torch"] == metadata.version("torch") and versions["torch"].startswith(
        torch.__version__.split("+")[0]
    )
    assert versions["transformers"] == metadata.version("transformers")


def test_the_calibration_carries_the_versions() -> None:
    record = machine_calibration(threads=1, size=64, seconds=0.01)
    assert record["versions"] == package_versions() and record["fp32_matmul_gflops"] > 0


def test_a_reading_leaves_torchs_thread_count_as_it_found_it() -> None:
    """The demo reads the calibration in its own process; a reading that kept its threads would oversubscribe the
    cores of whatever runs after it there (a test worker with its share of the CPUs ran 2-4x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        record = machine_calibration(threads=2, size=64, seconds=0.01)
        assert record["threads"] == 2 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def machine_records(value: Any) -> list[dict[str, Any]]:
    """Every mapping that holds a machine record (a `machine` key, or a top-level torch + device)."""
    found = []
    if isinstance(value, dict):
        if "machine" in value:
            found.append(value["machine"] if isinstance(value["machine"], dict) else value)
        for item in value.values():
            found += machine_records(item)
    elif isinstance(value, list):
        for item in value:
            found += machine_records(item)
    return found


def test_every_committed_machine_record_names_its_versions() -> None:
    checked = 0
    for path in sorted(RESULTS.rglob("*.json")):
        payload = json.loads(path.read_text())
        records = machine_records(payload) + ([payload] if {"torch", "device"} <= set(payload) else [])
        for record in records:
            assert list(record.get("versions", {})) == list(TRACKED_PACKAGES), path
            assert record["versions"]["torch"], path
            checked += 1
    assert checked >= 10


def test_the_work_reading_leaves_threads_and_random_state_as_it_found_them() -> None:
    """The project's own kind of work, timed: a positive reading, and nothing of the process changed by it (the demo
    reads it in its own process before its stages draw anything)."""
    threads = torch.get_num_threads()
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    seconds = work_seconds(threads=1, seconds=0.01)
    assert seconds > 0 and torch.get_num_threads() == threads
    assert torch.equal(torch.rand(3), expected)


def test_times_convert_by_the_work_reading() -> None:
    """A machine that takes twice the reference's time for the project's work converts its wall time to half."""
    assert seconds_at_reference(100.0, {"work_seconds": 2 * REFERENCE_WORK_SECONDS}) == 50.0
    assert seconds_at_reference(100.0, {"work_seconds": REFERENCE_WORK_SECONDS / 4}) == 400.0
    record = machine_calibration(threads=1, size=64, seconds=0.01)
    assert record["work_seconds"] > 0 and record["fp32_matmul_gflops"] > 0  # both readings, side by side
