"""Where a decoding step's time goes: one report turn at batch 160, each decoder, under the profiler.

  python benchmarks/profile_decode.py --device cuda --out results/gpu_profile.json          (make gpu-check's stage)
  python benchmarks/profile_decode.py --device cpu --model tiny --dialogues 16 --out OUT.json   (its code on a CPU)

The report's first turn of `--dialogues` dialogues (the demo's constraints and held-out user turns, the
instruction in the system message, the attention probe on, greedy, `--max-new-tokens`), written by each decoder
of `gatt.model.generation.ChatBatch` in turn (`--decoders`): `growing` (the cache grows, stopped rows leave), then on a
CPU `static` (preallocated cache and mask, gatt/model/static_decode.py), on CUDA `graphs` (that static step recorded as a
CUDA graph a reply and replayed); `static` on CUDA and `compiled` (torch.compile's "reduce-overhead", whose compile
takes about 39 s) when named. Each decoder writes the turn once to warm up (kernels, a compiled graph), then `--repeats` times,
timed: the median ms per decoding step (the turn's decoding time, CUDA events around it, over its steps). Then a
turn of `--profile-tokens` new tokens under `torch.profiler`, its decoding only: the kernels (CUDA) or operators
(CPU) a step launches, and the SDPA backend they reveal; and the same turn with every host synchronisation counted (`torch.cuda.set_sync_debug_mode("warn")` on CUDA; on a CPU, reads of
tensor data to the host and tensors made from host data, as tests/test_generation.py counts them). The replies
of every decoder are compared with the first's (`identical_replies`; growing by default).

Model: `smollm2` (SmolLM2-135M-Instruct, fp32 weights or `--numerics bf16`: bf16 weights and, on a GPU, a bf16
KV cache), `embedded` (the shipped chat model) or `tiny` (a random model of the embedded model's shape, for a CPU
dry run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]

from gatt.eval.inputs import load_eval_constraints, load_eval_turns  # noqa: E402
from gatt.eval.plan import plan_dialogues  # noqa: E402
from gatt.eval.turns import RolloutConfig, render, user_message  # noqa: E402
from gatt.io.files import write_text  # noqa: E402
from gatt.model.generation import DECODERS, ChatBatch, decoder_options  # noqa: E402
from gatt.model.numerics import for_inference  # noqa: E402
from gatt.model.sampling import Sampler  # noqa: E402

CONSTRAINTS = ROOT / "recipes" / "data" / "smollm2_constraints.yaml"
# SDPA's backends, by the name of the operator (CPU, CUDA) or kernel (CUDA) they run
BACKENDS = {
    "flash": ("_scaled_dot_product_flash_attention", "flash_fwd", "flash_attn"),
    "efficient": ("_scaled_dot_product_efficient_attention", "fmha", "efficient_attention"),
    "cudnn": ("_scaled_dot_product_cudnn_attention", "cudnn"),
    "math": ("_scaled_dot_product_attention_math",),
}


def load(name: str, device: str, numerics: str) -> tuple[Any, Any]:
    if name == "smollm2":
        from gatt.model.pretrained import load_smollm2

        model, tokenizer = load_smollm2()
    else:
        model, tokenizer = embedded(random=name == "tiny")
    return for_inference(model.to(device).eval(), numerics), tokenizer


def embedded(random: bool) -> tuple[Any, Any]:
    """The shipped chat model and its tokenizer; `random`: a randomly initialised model of its shape."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gatt.model.embedded import FOLDER
    from gatt.model.modeling import GattConfig, GattForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    if random:
        torch.manual_seed(0)
        return GattForCausalLM(GattConfig.from_pretrained(FOLDER)), tokenizer
    return AutoModelForCausalLM.from_pretrained(FOLDER), tokenizer


class HostTraffic(TorchDispatchMode):
    """On a CPU: reads of tensor data to the host (`item`, `bool`; `tolist` counted by the caller) and tensors made
    from host data (`torch.tensor(list)`, indexing by a list): what would each be a round trip on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.lift_fresh.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def first_turn(model: Any, tokenizer: Any, dialogues: int) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """The report's first turn: each dialogue's prompt and its instruction's token indices."""
    plan = plan_dialogues(load_eval_constraints(CONSTRAINTS), load_eval_turns(), dialogues=dialogues, turns=1, seed=0)
    config = RolloutConfig()
    prompts, marked = {}, {}
    for i, dialogue in enumerate(plan[:dialogues]):
        user = user_message(dialogue, dialogue.turns[0], config)
        prompts[i], marked[i] = render(tokenizer, dialogue, [{"role": "user", "content": user}], config)
    return prompts, marked


class Turn:
    """One decoder writing the turn: a fresh ChatBatch each time, its decoding timed apart from the prompt."""

    def __init__(self, model: Any, tokenizer: Any, decoder: str, max_new_tokens: int, prompts, marked) -> None:
        self.model, self.tokenizer, self.prompts, self.marked = model, tokenizer, prompts, marked
        self.options, self.max_new_tokens = decoder_options(model, decoder), max_new_tokens
        self.around_decode: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext  # e.g. a counter

    def __call__(self) -> tuple[dict[int, str], float, int]:
        """(replies, seconds of decoding, decoding steps)."""
        chat = ChatBatch(
            self.model,
            self.tokenizer,
            Sampler(do_sample=False, repetition_penalty=1.2),
            max_new_tokens=self.max_new_tokens,
            measure_attention=True,
            **self.options,
        )
        decode, timing = chat._decode, {}

        def timed_decode(logits):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2)) if cuda() else (None, None)
            begin = time.perf_counter()
            if start is not None:
                start.record()
            with self.around_decode():
                out = decode(logits)
            if end is not None:
                end.record()
                torch.cuda.synchronize()
                timing["seconds"] = start.elapsed_time(end) / 1000
            else:
                timing["seconds"] = time.perf_counter() - begin
            timing["steps"] = max(len(tokens) for tokens in out[0]) - 1  # forward passes after the prompt's
            return out

        chat._decode = timed_decode
        out = chat.generate(self.prompts, marked=self.marked)
        return {key: c[0].text for key, c in out.items()}, timing["seconds"], max(timing["steps"], 1)


def cuda() -> bool:
    return torch.cuda.is_available()


def backend(names: Counter) -> str:
    found = [name for name, marks in BACKENDS.items() if any(mark in op for op in names for mark in marks)]
    return "+".join(found) if found else "none seen"


def profile(turn: Turn) -> dict[str, Any]:
    """Kernels (CUDA) or operators (CPU) per decoding step, its decoding alone under the profiler."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda() else [])
    prof = torch.profiler.profile(activities=activities)
    turn.around_decode = lambda: prof
    try:
        _, _, steps = turn()
    finally:
        turn.around_decode = contextlib.nullcontext
    events = prof.events()
    kernels = Counter(e.name for e in events if cuda() and e.device_type == torch.autograd.DeviceType.CUDA)
    operators = Counter(e.name for e in events if e.name.startswith("aten::"))
    return {
        "kernels_per_step" if cuda() else "operators_per_step": round(
            sum((kernels if cuda() else operators).values()) / steps, 1
        ),
        "sdpa_backend": backend(kernels + operators),
    }


def host_syncs(turn: Turn) -> float:
    """Host synchronisations per decoding step: those of the decoding loop and the turn's end (the probe's read,
    the cache compacted), over its steps; the prompt's forward pass left out."""
    count = [0]

    @contextlib.contextmanager
    def counting() -> Iterator[None]:
        if cuda():
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    yield
            finally:
                torch.cuda.set_sync_debug_mode("default")
            count[0] += sum("synchroniz" in str(w.message) for w in caught)
            return
        traffic, tolist = HostTraffic(), torch.Tensor.tolist

        def counted(tensor):
            traffic.count += 1
            return tolist(tensor)

        torch.Tensor.tolist = counted  # type: ignore[method-assign]
        try:
            with traffic:
                yield
        finally:
            torch.Tensor.tolist = tolist  # type: ignore[method-assign]
            count[0] += traffic.count

    turn.around_decode = counting
    try:
        _, _, steps = turn()
    finally:
        turn.around_decode = contextlib.nullcontext
    return round(count[0] / steps, 2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    model, tokenizer = load(args.model, args.device, args.numerics)
    prompts, marked = first_turn(model, tokenizer, args.dialogues)
    decoders = args.decoders or ["growing", "graphs" if args.device == "cuda" else "static"]
    rows: dict[str, dict[str, Any]] = {}
    replies: dict[str, dict[int, str]] = {}
    for decoder in decoders:
        turn = Turn(model, tokenizer, decoder, args.max_new_tokens, prompts, marked)
        short = Turn(model, tokenizer, decoder, min(args.profile_tokens, args.max_new_tokens), prompts, marked)
        turn()  # warm-up: kernels, the allocator, a compiled graph
        timings = [turn() for _ in range(args.repeats)]
        replies[decoder] = timings[0][0]
        per_step = [1000 * seconds / steps for _, seconds, steps in timings]
        rows[decoder] = {
            "ms_per_step": round(statistics.median(per_step), 3),
            "ms_per_step_runs": [round(ms, 3) for ms in per_step],
            "steps": timings[0][2],
            **profile(short),
            "host_syncs_per_step": host_syncs(short),
            "identical_replies": round(
                sum(replies[decoder][k] == replies[decoders[0]][k] for k in prompts) / len(prompts), 4
            ),
        }
        if decoder == "compiled":  # steps torch.compile ran without a CUDA graph (a mutated input, a CPU tensor, ...)
            rows[decoder]["cudagraph_skips"] = int(torch._dynamo.utils.counters["inductor"]["cudagraph_skips"])
        print(f"{decoder}: {rows[decoder]}", flush=True)
    fastest = min(rows, key=lambda d: rows[d]["ms_per_step"])
    return {
        "settings": {
            "model": args.model,
            "numerics": args.numerics,
            "dialogues": len(prompts),
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "profiled_tokens": min(args.profile_tokens, args.max_new_tokens),
            "turn": "the report's first turn, the attention probe on, greedy, repetition penalty 1.2",
            "device": args.device,
            "gpu": torch.cuda.get_device_name() if cuda() else None,
            "torch": torch.__version__,
        },
        "decoders": rows,
        "fastest": fastest,
        "goal_ms_per_step": 10.0,
        "met": rows[fastest]["ms_per_step"] <= 10.0,
        "graphed_over_eager": round(rows["growing"]["ms_per_step"] / rows["graphs"]["ms_per_step"], 3)
        if {"growing", "graphs"} <= rows.keys()
        else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--model", choices=["smollm2", "embedded", "tiny"], default="smollm2")
    parser.add_argument("--numerics", choices=["exact", "bf16"], default="bf16", help="default: bf16")
    parser.add_argument("--dialogues", type=int, default=160, help="the batch (default: 160, a report's)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="timed turns per decoder (the median is kept)")
    parser.add_argument(
        "--profile-tokens", type=int, default=8, help="new tokens of the profiled turns (default: 8; a trace is slow)"
    )
    parser.add_argument(
        "--decoders",
        nargs="+",
        choices=[d for d in DECODERS if d != "auto"],
        help="default: growing, and graphs on CUDA or static on a CPU",
    )
    parser.add_argument("--out", type=Path, required=True, help="the JSON written (whole, then renamed)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not cuda():
        sys.exit("error: --device cuda: no CUDA device here (--device cpu --model tiny runs the code)")
    result = run(args)
    write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
