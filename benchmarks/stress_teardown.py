"""Teardown of multi-process jobs under stress: does any run hang?

The test suite's multi-process tests (the two-process training, synthesis and evaluation tests) run `--repeat`
times each, one pytest process per round, every round a process tree killed whole at `--timeout`. A test that
hung (a launcher still running at its own timeout: the test fails naming the stuck rank) or a round that
outlived `--timeout` counts as a hang; the counts per test are printed, and written as JSON with `--out`.

  python benchmarks/stress_teardown.py --repeat 10 --out results/stress_teardown.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from run import write_json  # noqa: E402  (benchmarks/run.py)

from gatt.io import processes  # noqa: E402
from gatt.io.machine import machine_calibration  # noqa: E402

MULTI_PROCESS_TESTS = [
    "tests/test_train_scale.py::test_two_processes_accumulating_4_follow_one_process_without_accumulation",
    "tests/test_train.py::test_two_processes_follow_the_one_process_trajectory",
    "tests/test_distributed.py::test_oracle_synthesis_on_two_processes_writes_the_one_process_bytes",
    "tests/test_distributed.py::test_model_teacher_synthesis_on_two_processes_writes_the_one_process_bytes",
    "tests/test_distributed.py::test_evaluation_on_two_processes_writes_the_one_process_report",
]
HANG_MARKERS = ("still running after", "TreeTimeout", "TreeLeftovers", "Timeout")


def stress_tests(repeat: int, timeout_s: float, work: Path) -> dict[str, Any]:
    """Every multi-process test `repeat` times; per test: passed, failed, hung."""
    counts = {test: {"passed": 0, "failed": 0, "hung": 0} for test in MULTI_PROCESS_TESTS}
    rounds = []
    for r in range(repeat):
        junit = work / f"round-{r}.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        begin = time.perf_counter()
        try:
            processes.run([*command, *MULTI_PROCESS_TESTS], work / f"round-{r}.log", timeout_s, cwd=ROOT)
        except (processes.TreeTimeout, processes.TreeLeftovers) as error:
            print(f"round {r + 1}: {error}", flush=True)
            for test in MULTI_PROCESS_TESTS:
                counts[test]["hung"] += 1
            rounds.append({"round": r + 1, "seconds": round(time.perf_counter() - begin, 1), "hung": "the round"})
            continue
        outcome = outcomes(junit)
        for test in MULTI_PROCESS_TESTS:
            counts[test][outcome.get(test, "failed")] += 1
        seconds = round(time.perf_counter() - begin, 1)
        rounds.append({"round": r + 1, "seconds": seconds, **{t.split("::")[1]: outcome.get(t) for t in outcome}})
        print(f"round {r + 1}/{repeat}: {seconds} s, {sorted(outcome.values())}", flush=True)
    return {"tests": counts, "rounds": rounds}


def outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome in a JUnit XML report: passed, failed, or hung (failed by a process tree's timeout)."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is None:
            found[test] = "passed" if case.find("skipped") is None else "failed"
        else:
            text = (problem.get("message") or "") + (problem.text or "")
            found[test] = "hung" if any(marker in text for marker in HANG_MARKERS) else "failed"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=10, help="runs of each test")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds a round may take")
    parser.add_argument("--out", type=Path, default=None, help="write the counts here as JSON")
    args = parser.parse_args()
    calibration = machine_calibration()
    with tempfile.TemporaryDirectory(prefix="stress-") as tmp:
        counts = stress_tests(args.repeat, args.timeout, Path(tmp))
    report = {"repeat": args.repeat, **counts, "hangs": sum(c["hung"] for c in counts["tests"].values())}
    report["machine"] = calibration
    print(json.dumps(report, indent=2))
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
