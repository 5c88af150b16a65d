"""Every benchmark, side by side with what a user would use instead, in one run: one table, one JSON.

  python benchmarks/run.py [--quick] [--device cpu|cuda] [--json OUT.json] [--only KEY ...]
  python benchmarks/run.py --markdown [results/benchmarks.json]   (docs/benchmarks.md's table, from the committed JSON)

Each benchmark compares ours with theirs in one process, on the same machine, model and data: warm-up,
repeats, the median, the two sides interleaved. A result's `ratio` is ours / theirs speed (higher is
better; for memory, their peak over ours) and `goal` the ratio to reach:

  train_vs_trl               our training loop vs trl.SFTTrainer (assistant-only loss), supervised tokens/s,
                             on the embedded model and on SmolLM2-135M with LoRA         goal >= 1.5
  one_pass_vs_expand         mode="all" + packing vs mode="expand" (one example per reply)  goal >= 5
  attention_vs_sdpa          our fast attention path vs torch SDPA, fwd+bwd at T=2048     goal >= 0.95
  attention_memory_vs_eager  Hugging Face eager attention's peak memory over ours         goal >= 4
  linformer_memory_vs_full   full attention's peak memory over Linformer's (k=256)        goal >= 4
  rollout_vs_hf_generate     batched KV-reuse rollouts vs generate() per turn, one dialogue
                             at a time                                                    goal >= 3
  rollout_vs_hf_generate_batched  the same vs generate() batched over every dialogue (left-padded,
                             re-encoded or its cache carried; HF's own Llama)             goal >= 2.5
  teacher_vs_hf_generate     our batched teacher vs a generate(num_return_sequences=k) loop,
                             one dialogue at a time                                       goal >= 4
  teacher_vs_hf_generate_batched  the same vs one generate() per turn over every dialogue  goal >= 2.5
  grpo_completions_vs_trl_generate  GRPO's k completions a prompt: our engine (each prompt encoded
                             once) vs the generate() call TRL's GRPOTrainer makes          goal >= 2
  (cuda) teacher_batched_vs_single  the teacher batched across dialogues vs one at a time  goal >= 4
  smollm2_rollout_tokens_per_s    SmolLM2 report rollouts, the fastest mode (bf16) vs the path before,
                                  new tokens/s, with the exact path's, GEMM-ceiling shares
                                  and bf16's agreement with exact                          goal >= 2
  smollm2_report_scorer_share     the relevance scorer's share of a report's wall time      goal <= 15%
  smollm2_rollout_vs_hf_generate  SmolLM2 rollouts vs generate() per turn                   goal >= 3
  smollm2_teacher_vs_hf_generate  SmolLM2 teacher, k = 4, vs a generate() loop              goal >= 4
  smollm2_rollout_vs_hf_generate_batched  SmolLM2 rollouts vs generate() batched (as above)  goal >= 2.5
  smollm2_teacher_vs_hf_generate_batched  SmolLM2 teacher vs generate() batched             goal >= 2.5

`--quick` takes under 10 minutes on 2 CPU cores; the full run about 30 minutes plus the SmolLM2 rows (64
dialogues x 20 turns on the real model: bench_smollm2.py, estimated at an hour). The JSON holds every result under
its key, with the machine it ran on (CPU, cores, threads, device, torch, an fp32 matmul calibration).
`--only KEY ... --json OUT.json` with an existing OUT.json merges: the keys run replace theirs, each
carrying its own machine record and `quick` flag, and every other key stays.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch  # noqa: E402

from gatt.io.cli import exit_on_bad_input  # noqa: E402
from gatt.io.files import write_json  # noqa: E402
from gatt.io.machine import available_cpus, machine_calibration  # noqa: E402

# key -> the module whose run(quick, device) returns it, in the order they run
BENCHMARKS: dict[str, str] = {
    "train_vs_trl": "bench_train",
    "one_pass_vs_expand": "bench_collator",
    "attention_vs_sdpa": "bench_attention",
    "attention_memory_vs_eager": "bench_attention",
    "linformer_memory_vs_full": "bench_linformer",
    "rollout_vs_hf_generate": "bench_eval",
    "rollout_vs_hf_generate_batched": "bench_eval",
    "teacher_vs_hf_generate": "bench_teacher",
    "teacher_vs_hf_generate_batched": "bench_teacher",
    "grpo_completions_vs_trl_generate": "bench_grpo",
    "smollm2_rollout_tokens_per_s": "bench_smollm2",
    "smollm2_report_scorer_share": "bench_smollm2",
    "smollm2_rollout_vs_hf_generate": "bench_smollm2",
    "smollm2_teacher_vs_hf_generate": "bench_smollm2",
    "smollm2_rollout_vs_hf_generate_batched": "bench_smollm2",
    "smollm2_teacher_vs_hf_generate_batched": "bench_smollm2",
}
GPU_ONLY = {"teacher_batched_vs_single": "bench_teacher"}
# SmolLM2's bf16/int8 rollouts and its scorer's share measure CPU numerics; its rows against generate() run anywhere.
CPU_ONLY = {"smollm2_rollout_tokens_per_s", "smollm2_report_scorer_share"}
LABELS = {
    "train_vs_trl": "training loop vs TRL SFTTrainer",
    "one_pass_vs_expand": 'mode="all" + packing vs one example per reply',
    "attention_vs_sdpa": "fast attention vs torch SDPA (T=2048)",
    "attention_memory_vs_eager": "peak memory: HF eager attention / ours (T=2048)",
    "linformer_memory_vs_full": "peak memory: full attention / Linformer k=256 (T=4096, not causal)",
    "rollout_vs_hf_generate": "eval rollouts vs generate() per turn, one dialogue at a time",
    "rollout_vs_hf_generate_batched": "eval rollouts vs generate() batched over the dialogues",
    "teacher_vs_hf_generate": "batched teacher vs generate() loop, one dialogue at a time",
    "teacher_vs_hf_generate_batched": "batched teacher vs generate() batched over the dialogues",
    "teacher_batched_vs_single": "teacher batched vs one dialogue at a time",
    "grpo_completions_vs_trl_generate": "GRPO's k completions a prompt vs TRL GRPOTrainer's generate()",
    "smollm2_rollout_tokens_per_s": "SmolLM2 report rollouts: bf16 vs the path before",
    "smollm2_report_scorer_share": "SmolLM2 report: the relevance scorer's share",
    "smollm2_rollout_vs_hf_generate": "SmolLM2 rollouts vs generate() per turn, one dialogue at a time",
    "smollm2_teacher_vs_hf_generate": "SmolLM2 teacher (k=4) vs generate() loop, one dialogue at a time",
    "smollm2_rollout_vs_hf_generate_batched": "SmolLM2 rollouts vs generate() batched over the dialogues",
    "smollm2_teacher_vs_hf_generate_batched": "SmolLM2 teacher (k=4) vs generate() batched over the dialogues",
}
COMMITTED = Path("results/benchmarks.json")


def machine(device: str) -> dict[str, Any]:
    """Where the figures come from: the CPU and its speed now, the cores, the device."""
    record = {**machine_calibration(), "cores": available_cpus(), "python": platform.python_version(), "device": device}
    if device == "cuda":
        record["gpu"] = torch.cuda.get_device_name()
    return record


def run(
    keys: list[str], quick: bool, device: str, save: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Run the modules behind `keys` (each once, in order); returns the JSON payload. `save` gets the payload after
    each module, so a run killed at a time budget (make gpu-check) keeps the rows it finished."""
    payload: dict[str, Any] = {"machine": machine(device), "quick": quick, "seconds": {}}
    modules = list(dict.fromkeys(BENCHMARKS.get(key) or GPU_ONLY[key] for key in keys))
    for name in modules:
        print(f"== {name} ({', '.join(k for k in keys if (BENCHMARKS.get(k) or GPU_ONLY.get(k)) == name)})", flush=True)
        start = time.perf_counter()
        module = importlib.import_module(name)
        wanted = (
            {"only": [k for k in keys if BENCHMARKS.get(k) == name]}
            if "only" in inspect.signature(module.run).parameters
            else {}
        )
        results = module.run(quick, device, **wanted)  # a module that can run some of its rows runs only those
        payload["seconds"][name] = round(time.perf_counter() - start, 1)
        payload.update({key: value for key, value in results.items() if key in keys})
        if save is not None:
            save(payload)
    return payload


def figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def side(result: dict[str, Any], which: str) -> str:
    """A side's raw figure; per-model figures (train_vs_trl) as `model: figure` pairs."""
    value = result[which]
    if isinstance(value, dict):
        return ", ".join(f"{model}: {figure(v)}" for model, v in value.items())
    return figure(value)


def table_rows(payload: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key in [*BENCHMARKS, *GPU_ONLY]:
        if key in payload:
            r = payload[key]
            met = "met" if r["met"] else "MISSED"
            if "ratio" not in r:  # a share to stay under (smollm2_report_scorer_share)
                rows.append(
                    [
                        key,
                        LABELS[key],
                        f"{r['value']:.1%}",
                        "-",
                        r["unit"],
                        f"{r['value']:.1%}",
                        "",
                        f"<= {r['goal']:.0%}",
                        met,
                    ]
                )
                continue
            # the headline ratio; a per-model benchmark (its headline the lowest) lists each model's beside it
            per_model = ", ".join(f"{model}: {m['ratio']:.2f}x" for model, m in r.get("per_model", {}).items())
            rows.append(
                [
                    key,
                    LABELS[key],
                    side(r, "ours"),
                    side(r, "theirs"),
                    r["unit"],
                    f"{r['ratio']:.2f}x",
                    f"({per_model})" if per_model else "",
                    f">= {r['goal']:g}x",
                    met,
                ]
            )
    return rows


def print_table(payload: dict[str, Any]) -> None:
    header = ["benchmark", "what", "ours", "theirs", "unit", "ratio", "goal", ""]
    rows = [header, *([*row[:5], f"{row[5]} {row[6]}".rstrip(), *row[7:]] for row in table_rows(payload))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def markdown(payload: dict[str, Any], gpu: dict[str, Any] | None = None) -> str:
    """The benchmarks page's table (docs/benchmarks.md): one row per benchmark, the ratio against its goal; a GPU column where a GPU run exists."""
    m = payload["machine"]
    cpu = f"{m['cores']} CPU cores ({m['cpu']}, {m['fp32_matmul_gflops']} GFLOP/s fp32)"
    header = ["benchmark", "compared", "ours", "theirs", "unit", f"ratio, {cpu}", "goal"]
    if gpu:
        header.append(f"ratio, {gpu['machine'].get('gpu', 'GPU')}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, label, ours, theirs, unit, ratio, per_model, goal, met in table_rows(payload):
        cells = [
            f"`{key}`",
            label,
            ours,
            theirs,
            unit,
            f"**{ratio}** ({met}) {per_model}".rstrip(),
            goal.replace(">=", "≥"),
        ]
        if gpu:
            cells.append(f"{gpu[key]['ratio']:.2f}x" if key in gpu else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def merge_into(earlier: dict[str, Any], payload: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """An --only run's `keys` merged into the `earlier` results file's content: each new result carries the machine
    and `quick` of its own run (the file's top-level record stays that of the run that made the other keys)."""
    merged = json.loads(json.dumps(earlier))  # a copy: each save merges into the file as it was before the run
    for key in keys:
        merged[key] = {**payload[key], "machine": payload["machine"], "quick": payload["quick"]}
    merged.setdefault("seconds", {}).update(payload["seconds"])
    return merged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/run.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, fewer repeats: under 10 minutes on 2 CPU cores"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where models run (default: cpu)")
    parser.add_argument(
        "--json",
        type=Path,
        metavar="OUT.json",
        help="write every result, with the machine, to this file (with --only, merged into an existing one)",
    )
    parser.add_argument("--only", nargs="+", metavar="KEY", help="run only these benchmarks (keys above)")
    parser.add_argument(
        "--markdown",
        nargs="?",
        const=COMMITTED,
        type=Path,
        metavar="JSON",
        help=f"print the benchmarks page's table from a results file (default {COMMITTED}; its _gpu twin adds a column)",
    )
    args = parser.parse_args(argv)
    with exit_on_bad_input():
        if args.markdown:
            if not args.markdown.is_file():
                raise FileNotFoundError(
                    f"{args.markdown}: no such results file (python benchmarks/run.py --json {args.markdown})"
                )
            gpu_path = args.markdown.with_name(args.markdown.stem + "_gpu.json")
            gpu = json.loads(gpu_path.read_text()) if gpu_path.is_file() else None
            print(markdown(json.loads(args.markdown.read_text()), gpu), end="")
            return
        keys = args.only or (
            [*BENCHMARKS] if args.device == "cpu" else [*(k for k in BENCHMARKS if k not in CPU_ONLY), *GPU_ONLY]
        )
        unknown = [k for k in keys if k not in BENCHMARKS and k not in GPU_ONLY]
        if unknown:
            raise ValueError(
                f"--only: unknown benchmark(s) {', '.join(unknown)}; valid: {', '.join([*BENCHMARKS, *GPU_ONLY])}"
            )
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device here")
        if args.device == "cuda" and any(k in CPU_ONLY for k in keys):
            raise ValueError(f"--only: {', '.join(k for k in keys if k in CPU_ONLY)} runs on the CPU (--device cpu)")
        if args.device == "cpu" and any(k in GPU_ONLY for k in keys):
            raise ValueError(f"--only: {', '.join(k for k in keys if k in GPU_ONLY)} needs --device cuda")
        base = json.loads(args.json.read_text()) if args.json and args.only and args.json.is_file() else None

        def save(payload: dict[str, Any]) -> None:
            done = [key for key in keys if key in payload]
            write_json(args.json, merge_into(base, payload, done) if base is not None else payload)

        payload = run(keys, args.quick, args.device, save if args.json else None)
        print()
        print_table(payload)
        if args.json:
            print(f"wrote {args.json}")


if __name__ == "__main__":
    torch.set_num_threads(available_cpus())  # every CPU, as the machine record says, whatever OMP_NUM_THREADS is
    main()
