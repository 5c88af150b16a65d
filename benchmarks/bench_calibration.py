"""Does a time converted to the reference machine mean the same on two machines? One job, two machines, two readings.

  python benchmarks/bench_calibration.py                    # make demo's recipe on all CPUs and on one
  python benchmarks/bench_calibration.py --cpu-sets 0,1 0 --config recipes/configs/demo_smoke.yaml

The job is a demo recipe (default: make demo's), run whole once per CPU set under `taskset` (a machine with fewer
cores), each run in its own folder under runs/calibration/. Its timings.json holds the wall time and the machine's
two readings, taken in the job's own process: the project's own kind of work (`gatt.io.machine.work_seconds`, what
times convert by) and an fp32 matmul (the earlier reference). Converted right, the same job reads the same time at
the reference on every machine: the script prints each conversion and how far the runs disagree (largest / smallest
converted time), and adds its rows to results/calibration.json, keyed by CPU and core count, so a run on another
machine kind (an Intel Xeon beside an AMD EPYC) joins the same table. A finished run is read, not run again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gatt.io.files import write_json
from gatt.io.machine import REFERENCE_GFLOPS, seconds_at_reference

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "results" / "calibration.json"


def run_job(config: str, cpus: str, out: Path) -> dict[str, Any]:
    """Run the demo recipe `config` on the CPUs `cpus` (taskset's list) into `out`; its timings.json."""
    command = ["taskset", "-c", cpus, sys.executable, "recipes/demo.py", "--config", config, f"out={out}"]
    subprocess.run(command, check=True, cwd=ROOT)
    return json.loads((out / "timings.json").read_text())


def row(timings: dict[str, Any], config: str) -> dict[str, Any]:
    """One machine's conversions of the job's wall time: by the work reading and by the matmul reading."""
    machine, wall = timings["machine"], timings["total_seconds"]
    return {
        "job": config,
        "cpu": machine["cpu"],
        "cores": machine["threads"],
        "wall_seconds": wall,
        "work_seconds": machine["work_seconds"],
        "fp32_matmul_gflops": machine["fp32_matmul_gflops"],
        "at_reference_by_work": seconds_at_reference(wall, machine),
        "at_reference_by_matmul": round(wall * machine["fp32_matmul_gflops"] / REFERENCE_GFLOPS, 1),
    }


def spread(rows: list[dict[str, Any]], key: str) -> float:
    """Largest / smallest of `key` over `rows`: 1.0 where every machine reads the same time."""
    values = [r[key] for r in rows]
    return round(max(values) / min(values), 3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="recipes/configs/demo.yaml", help="the demo recipe run as the job")
    parser.add_argument("--cpu-sets", nargs="+", default=["0,1", "0"], help="taskset CPU lists, one run each")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "calibration", help="the runs' folders")
    parser.add_argument("--result", type=Path, default=RESULT, help="the JSON the rows are added to")
    args = parser.parse_args(argv)
    name = Path(args.config).stem
    result = json.loads(args.result.read_text()) if args.result.exists() else {"rows": {}}
    for cpus in args.cpu_sets:
        folder = args.out / f"{name}-cpus-{cpus.replace(',', '-')}"
        entry = row(run_job(args.config, cpus, folder), args.config)
        result["rows"][f"{name} | {entry['cpu']} x{entry['cores']}"] = entry
    rows = [r for r in result["rows"].values() if r["job"] == args.config]
    result.setdefault("spread", {})[args.config] = {
        "by_work": spread(rows, "at_reference_by_work"),
        "by_matmul": spread(rows, "at_reference_by_matmul"),
        "wall": spread(rows, "wall_seconds"),
    }
    write_json(args.result, result)
    print("| machine | wall s | work s | fp32 GFLOP/s | at the reference, by work | by matmul |")
    print("|---|---|---|---|---|---|")
    for key, r in result["rows"].items():
        if r["job"] == args.config:
            print(
                f"| {key} | {r['wall_seconds']} | {r['work_seconds']} | {r['fp32_matmul_gflops']} | "
                f"{r['at_reference_by_work']} | {r['at_reference_by_matmul']} |"
            )
    print(f"spread (largest / smallest): {result['spread'][args.config]}")
    return result


if __name__ == "__main__":
    main()
