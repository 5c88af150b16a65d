"""The README's own-model commands ("With your own model") as a new user runs them, each stage timed.

SmolLM2-135M-Instruct exported fresh, then with a folder of inputs of your own (`constraints.yaml`,
`data_messages.jsonl` for the data commands, `report_messages.jsonl` for the report):

  export       python -m gatt.model.pretrained --out OUT/smollm2
  pass-rate    python -m data_gen pass-rate --teacher OUT/smollm2 --prompts 4 --samples 2 --strict-gate ...
  gatt-data    python -m data_gen gatt --teacher OUT/smollm2 --num-dialogues 32 --max-turns 6 --samples-per-turn 4
               --strict-gate ...
  replay-data  python -m data_gen replay --teacher OUT/smollm2 --num-dialogues 32 --max-turns 6 --samples-per-turn 2
               --strict-gate ...
  train        accelerate launch recipes/train_gatt.py --config recipes/configs/lora_gatt.yaml model=OUT/smollm2
               train_file=OUT/data/gatt.jsonl replay_file=OUT/replay/replay.jsonl output_dir=OUT/gatt
  report       python -m gatt.eval.evaluate --model base=OUT/smollm2 --model gatt=OUT/gatt/final --repeat-instruction base
               --turns 12 --dialogues 24 --no-instruction-dialogues 16 --strict-gate --out OUT/report

(`--constraints` and `--user-turns` on each data command and the report; `--relevance-judge` on each where given.)
A stage whose output exists is skipped, so a stopped walk resumes at the stage it was in (the data commands and
the report resume inside the stage too). Writes OUT/timings.json: each stage's seconds and command, the four
README commands' total, and the machine's fp32 GEMM rate before and after each run of this script (the total at the
reference speed by their mean).

  python benchmarks/own_model_walk.py --inputs benchmarks/data/fresh_audit --out runs/own-walk-fresh
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gatt.eval.gate import RELEVANCE_JUDGES
from gatt.io.files import write_json
from gatt.io.machine import machine_calibration, seconds_at_reference

ROOT = Path(__file__).resolve().parents[1]
README_STAGES = ("gatt-data", "replay-data", "train", "report")  # the four commands the README prints


def stages(inputs: Path, out: Path, judge: str | None) -> dict[str, tuple[list[str], Path]]:
    """Each stage's command and the file that says it is done."""
    python = sys.executable
    model = str(out / "smollm2")
    mine = ["--constraints", str(inputs / "constraints.yaml")]
    data = [*mine, "--user-turns", str(inputs / "data_messages.jsonl")]
    gate = ["--strict-gate", *(["--relevance-judge", judge] if judge else [])]
    teacher = ["--teacher", model, "--max-turns", "6"]
    return {
        "export": ([python, "-m", "gatt.model.pretrained", "--out", model], out / "smollm2" / "config.json"),
        "pass-rate": (
            [python, "-m", "data_gen", "pass-rate", "--teacher", model, "--prompts", "4", "--samples", "2", *gate,
             *data, "--out", str(out / "pass_rate.json")],
            out / "pass_rate.json",
        ),
        "gatt-data": (
            [python, "-m", "data_gen", "gatt", *teacher, "--num-dialogues", "32", "--samples-per-turn", "4", *gate,
             *data, "--out", str(out / "data")],
            out / "data" / "gatt.summary.json",
        ),
        "replay-data": (
            [python, "-m", "data_gen", "replay", *teacher, "--num-dialogues", "32", "--samples-per-turn", "2", *gate,
             "--user-turns", str(inputs / "data_messages.jsonl"), "--out", str(out / "replay")],
            out / "replay" / "replay.summary.json",
        ),
        "train": (
            [str(Path(python).parent / "accelerate"), "launch", str(ROOT / "recipes" / "train_gatt.py"), "--config",
             str(ROOT / "recipes" / "configs" / "lora_gatt.yaml"), f"model={model}",
             f"train_file={out / 'data' / 'gatt.jsonl'}", f"replay_file={out / 'replay' / 'replay.jsonl'}",
             f"output_dir={out / 'gatt'}"],
            out / "gatt" / "final" / "config.json",
        ),
        "report": (
            [python, "-m", "gatt.eval.evaluate", "--model", f"base={model}", "--model", f"gatt={out / 'gatt' / 'final'}",
             "--repeat-instruction", "base", "--turns", "12", "--dialogues", "24", "--no-instruction-dialogues", "16",
             *gate, *mine, "--user-turns", str(inputs / "report_messages.jsonl"), "--out", str(out / "report")],
            out / "report" / "report.json",
        ),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=Path, required=True, help="folder with constraints.yaml and the messages")
    parser.add_argument("--out", type=Path, required=True, help="the walk's folder (resumed if it exists)")
    parser.add_argument("--relevance-judge", choices=RELEVANCE_JUDGES, help="passed to every stage that gates")
    parser.add_argument("--only", nargs="+", metavar="STAGE", help="run only these stages (the others as they are)")
    args = parser.parse_args(argv)
    for name in ("constraints.yaml", "data_messages.jsonl", "report_messages.jsonl"):
        if not (args.inputs / name).is_file():
            raise SystemExit(f"own_model_walk: {args.inputs / name}: missing")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {"steps": {}, "commands": {}}
    timings.setdefault("calibrations", []).append(machine_calibration())
    for name, (command, done) in stages(args.inputs, args.out, args.relevance_judge).items():
        if done.exists() or (args.only and name not in args.only):
            continue
        print(f"== {name}: {shlex.join(command)}", flush=True)
        start = time.perf_counter()
        with open(args.out / f"{name}.log", "a") as log:
            subprocess.run(command, check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        timings["steps"][name] = round(time.perf_counter() - start, 1)
        timings["commands"][name] = shlex.join(command)
        write_json(path, timings)
    timings["calibrations"].append(machine_calibration())
    if all(name in timings["steps"] for name in README_STAGES):
        seconds = sum(timings["steps"][name] for name in README_STAGES)
        work = statistics.mean(c["work_seconds"] for c in timings["calibrations"] if "work_seconds" in c)
        timings["readme_commands_seconds"] = round(seconds, 1)
        timings["readme_commands_seconds_at_reference"] = seconds_at_reference(seconds, {"work_seconds": work})
    write_json(path, timings)
    print(json.dumps(timings["steps"], indent=2))


if __name__ == "__main__":
    main()
