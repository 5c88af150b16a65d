"""Command line of the dialogue generator.

  python -m data_gen base --num-dialogues N --seed S --out DIR
      the toy world's base SFT corpus (instructions local to their turn) -> DIR/base.jsonl
  python -m data_gen gatt --teacher (oracle|MODEL_DIR) --num-dialogues N --min-turns A --max-turns B
                          --samples-per-turn K --seed S --out DIR [--user-turns FILE|DIR] [--constraints FILE.yaml]
      GAtt dialogues by context distillation with rejection sampling -> DIR/gatt.jsonl (resumable)
  python -m data_gen replay --teacher MODEL_DIR --num-dialogues N --min-turns A --max-turns B --out DIR [--user-turns FILE]
      the teacher's own answers to dialogues without instruction, gated -> DIR/replay.jsonl (resumable):
      replay data that keeps a fine-tune from forgetting how the model answers
  python -m data_gen pass-rate --teacher (oracle|MODEL_DIR) --out FILE.json [--constraints FILE.yaml] [--user-turns FILE]
      each constraint's one-turn pass rate with the instruction in view (checks; checks and gate; best of k):
      FILE.json, and on stderr a table per constraint, then per family
  python -m data_gen eval-set --out DIR [--seed S]
      the built-in evaluation set -> DIR/constraints.yaml, DIR/user_turns.jsonl (the copy in
      gatt/eval/builtin is regenerated with --out gatt/eval/builtin)

The base and gatt outputs load with `datasets.load_dataset("json", data_files=...)`.

gatt and replay split their dialogues across processes: `torchrun --nproc_per_node N -m data_gen gatt ...`
(or `accelerate launch -m data_gen gatt ...`) writes the same bytes as one process, each process making
its share of the shards (README, "Scaling out": the measured throughput).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from functools import partial
from pathlib import Path

from tqdm.auto import tqdm

from data_gen.constraints import HELDOUT_FAMILIES, catalogue, limit_families, limit_values
from data_gen.eval_set import write_eval_set
from data_gen.pass_rate import PassRateConfig, demonstrations, format_pass_rates, measure_pass_rates
from data_gen.synthesis import SynthesisConfig, synthesize
from data_gen.teacher import ModelTeacher, OracleTeacher, Teacher
from data_gen.toy_world import base_corpus
from data_gen.user_turns import UserTurn, load_user_turns, split_user_turns
from gatt.chat_model import TORCH_DTYPES
from gatt.checks import (
    CONSTRAINTS_HELP,
    Constraint,
    dump_constraints,
    hold_out_families,
    load_constraints,
    matching_families,
)
from gatt.cli import exit_on_bad_input
from gatt.distributed import end_job, process_state
from gatt.embedded import model_path
from gatt.events import add_kinds_argument
from gatt.files import atomic_path, write_json
from gatt.generation import add_sampler_arguments, sampler_settings
from gatt.model_folder import check_model_folder
from gatt.numerics import NUMERICS


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-dialogues", type=int, required=True, help="dialogues to generate")
    parser.add_argument("--seed", type=int, default=0, help="same seed and inputs -> byte-identical output")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--short-prob", type=float, default=0.5, help="chance of the shortened instruction form")
    parser.add_argument(
        "--heldout-families",
        nargs="*",
        default=None,
        metavar="FAMILY",
        help="families kept out of GAtt data (every value held out): of the built-in catalogue (default: "
        f"{', '.join(HELDOUT_FAMILIES)}; "
        "the base corpus still teaches them) or of --constraints (default: none); a shell pattern holds out every "
        "family it matches (ifbench:*)",
    )


def _dialogues(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--min-turns", type=int, default=2, help="shortest dialogue kept")
    parser.add_argument("--max-turns", type=int, default=24, help="longest dialogue drawn")
    parser.add_argument("--samples-per-turn", type=int, default=4, help="candidates per turn (k) for rejection")
    parser.add_argument(
        "--redraws",
        type=int,
        default=2,
        help="other user messages tried at a turn whose k candidates all fail, before the dialogue ends there",
    )
    _user_turns(parser)
    parser.add_argument("--shard-size", type=int, default=64, help="dialogues per resumable shard")
    parser.add_argument(
        "--strict-repeats",
        action="store_true",
        help="reject a near copy of an earlier reply even where its topic word changed (the gate "
        "lets such template answers pass); a real model's teacher needs it, or the fine-tuned "
        "model learns to repeat itself",
    )
    _strict_gate(parser)


def _strict_gate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--strict-gate",
        action="store_true",
        help="the answer gate for a real chat model (gatt.evaluate --strict-gate): --strict-repeats, "
        "and a reply to a turn with topic words must pass the likelihood contrast too",
    )


def _user_turns(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--user-turns", type=Path, help="your dialogues (JSONL/Parquet/datasets folder) or a .txt of messages"
    )
    parser.add_argument(
        "--on-error", choices=["raise", "skip"], default="raise", help="bad input dialogues: stop, or count and skip"
    )


def _teacher(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--teacher",
        required=True,
        help="'oracle' (the toy world's responder), 'embedded' (the shipped chat model) or a causal LM directory",
    )
    add_sampler_arguments(parser, "the --teacher folder's")  # a model teacher's decoding
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32, help="prompts per teacher generate() call")
    parser.add_argument(
        "--device",
        help="teacher device, e.g. cuda, cuda:1, cpu (default: this process's GPU under "
        "torchrun/accelerate launch, else cuda if available, else cpu)",
    )
    parser.add_argument(
        "--teacher-dtype",
        choices=sorted(TORCH_DTYPES),
        default=None,
        help="load the teacher in this dtype (bf16 halves its memory; default: transformers' default)",
    )
    parser.add_argument(
        "--teacher-numerics",
        choices=NUMERICS,
        default="exact",
        help="exact (fp32, default); bf16 (faster on a CPU with bf16 instructions); or int8: the teacher's "
        "Linear layers dynamically quantised, CPU only. The fast modes draw other candidates "
        "(gatt/numerics.py; int8 does not pay on SmolLM2-135M); auto: bf16 where the device has fast bf16 "
        "arithmetic, else exact",
    )
    parser.add_argument(
        "--teacher-device-map",
        metavar="MAP",
        help="spread a teacher too large for one device over the visible GPUs (e.g. auto, balanced); "
        "run one process per machine with it, or give each process its own CUDA_VISIBLE_DEVICES",
    )


def build_parser() -> argparse.ArgumentParser:
    """The `base`, `gatt` and `eval-set` subcommands."""
    parser = argparse.ArgumentParser(
        prog="python -m data_gen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    base = commands.add_parser("base", help="write the toy world's base SFT corpus")
    _common(base)
    base.add_argument(
        "--max-turns",
        type=int,
        default=12,
        help="longest dialogue with local instructions or none (system-prompt dialogues have 1-2 turns)",
    )
    gatt = commands.add_parser("gatt", help="write GAtt dialogues by context distillation")
    _common(gatt)
    _dialogues(gatt)
    _teacher(gatt)
    gatt.add_argument("--constraints", type=Path, help=CONSTRAINTS_HELP)
    gatt.add_argument(
        "--round",
        type=int,
        default=1,
        metavar="R",
        help="expert-iteration round, written into each record's meta; a round after the first draws "
        "other dialogues than round 1 from the same seed (recipes/demo.py `rounds`)",
    )
    gatt.add_argument(
        "--demonstration",
        action="store_true",
        help="open the teacher's prompt with one exchange of each constraint whose reply passed the checks "
        "and the gate in a separate draw (richer context distillation: the record keeps only the "
        "dialogue); kept in DIR/gatt.shards/demonstrations.json for a resumed run",
    )
    add_kinds_argument(
        gatt,
        "drawn alike",
        "The teacher sees the instructions in force appended to every user turn; a reply after a withdrawal must "
        "not follow the old instruction. Records carry `kind` and `events`; the wordings are gatt/events.yaml's "
        "or a constraint's own (`changes` in its entry)",
    )
    gatt.add_argument(
        "--values-per-family",
        type=int,
        metavar="K",
        help="use at most K train values of each family (a fixed-seed draw): the data-variety knob "
        "(default: every train value)",
    )
    gatt.add_argument(
        "--trained-families",
        type=int,
        metavar="K",
        help="use the train values of at most K families (a fixed-seed draw, a larger K keeps a superset): the "
        "families curve's knob, how transfer to held-out families grows with the families trained (default: all)",
    )
    replay = commands.add_parser(
        "replay",
        help="write the teacher's own gated answers to dialogues without instruction (replay data)",
        description="Dialogues without an instruction, each reply the teacher's own answer that passes the answer "
        "gate (best of --samples-per-turn). Mixed into a GAtt fine-tune (replay_file=...), they keep the model "
        "answering as it did. Writes DIR/replay.jsonl and DIR/replay.summary.json; resumes like `gatt`.",
    )
    _common(replay)
    _dialogues(replay)
    _teacher(replay)
    pass_rate = commands.add_parser(
        "pass-rate",
        help="measure each constraint's one-turn pass rate with the instruction in view",
        description="For each constraint, --prompts user turns (a probe-only persona: its probe questions) with the "
        "instruction appended, --samples candidates each: the share passing the checks, the checks and the answer "
        "gate, and the share of prompts where one of the k passes both (what best-of-k rejection keeps). "
        "Writes FILE.json (settings, per_constraint, per_family). Prints on stderr a markdown table with one row "
        "per constraint (name, family, split, prompts, candidates, and the JSON's checks, checks_and_gate and "
        "best_of_k as percentages), then the per-family table (left out when no constraint names a family: "
        "all are 'custom'), and on stdout the per-family figures as JSON. The progress bar counts prompts and "
        "steps as each constraint's candidates are written.",
    )
    pass_rate.add_argument("--out", type=Path, required=True, help="output JSON file")
    pass_rate.add_argument("--constraints", type=Path, help=CONSTRAINTS_HELP)
    pass_rate.add_argument(
        "--values-per-family",
        type=int,
        metavar="K",
        help="measure at most K values of each family, a fixed-seed draw (default: every value): a set with many "
        "parameter draws per type (ifeval, ifbench) is measured per type at a fraction of the cost",
    )
    pass_rate.add_argument("--prompts", type=int, default=8, help="user turns per constraint")
    pass_rate.add_argument("--samples", type=int, default=2, help="candidates per prompt (k)")
    pass_rate.add_argument("--seed", type=int, default=0)
    _strict_gate(pass_rate)
    pass_rate.add_argument(
        "--demonstration",
        action="store_true",
        help="precede each prompt with one exchange of the same constraint whose reply passed the "
        "checks and the gate in a separate draw: does a richer teacher context raise the rate?",
    )
    pass_rate.add_argument(
        "--without-instruction",
        action="store_true",
        help="also sample every prompt without the instruction: how often a reply passes the checks anyway (the "
        "room GAtt has; a column of its own, `without_instruction` in the JSON)",
    )
    _user_turns(pass_rate)
    _teacher(pass_rate)
    export = commands.add_parser(
        "constraints",
        help="write a constraint file: a set's constraints, some of its families, some held out",
        description="Write FILE.yaml with the constraints of --constraints (a file, a built-in set such as "
        "ifeval,ifbench, or the catalogue), only the families matching --families, with --heldout-families held "
        "out: the file a run names, to read and to edit (e.g. the types a model follows when reminded, chosen "
        "from `pass-rate`).",
    )
    export.add_argument("--out", type=Path, required=True, help="output YAML file")
    export.add_argument("--constraints", type=Path, help=CONSTRAINTS_HELP)
    export.add_argument(
        "--families", nargs="+", metavar="FAMILY", help="keep these families, shell patterns too (default: all)"
    )
    export.add_argument(
        "--heldout-families",
        nargs="*",
        default=None,
        metavar="FAMILY",
        help="families held out as a whole (every value split heldout), shell patterns too",
    )
    eval_set = commands.add_parser(
        "eval-set",
        help="write the built-in evaluation set (constraints with splits, held-out user turns)",
        description="Write DIR/constraints.yaml (the catalogue, each constraint tagged train or heldout) and "
        "DIR/user_turns.jsonl (the held-out user turns with on-topic checks), the files gatt's evaluation "
        "uses by default. Regenerate the shipped copy with --out gatt/eval/builtin.",
    )
    eval_set.add_argument("--out", type=Path, required=True, help="output folder")
    eval_set.add_argument(
        "--seed", type=int, default=0, help="catalogue and user-turn split seed (the shipped set uses 0)"
    )
    return parser


def run_base(args: argparse.Namespace) -> dict:
    """Write DIR/base.jsonl atomically and return its summary."""
    constraints = catalogue() if args.heldout_families is None else catalogue(heldout_families=args.heldout_families)
    train_turns, _ = split_user_turns()
    args.out.mkdir(parents=True, exist_ok=True)
    kinds, turns = Counter(), 0
    with atomic_path(args.out / "base.jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
        records = base_corpus(
            args.num_dialogues,
            args.seed,
            constraints,
            train_turns,
            short_prob=args.short_prob,
            max_turns=args.max_turns,
        )
        for record in tqdm(records, total=args.num_dialogues, desc="base corpus", unit="dialogue"):
            kinds[record["kind"]] += 1
            turns += sum(m["role"] == "assistant" for m in record["messages"])
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return {
        "records": args.num_dialogues,
        "kinds": dict(sorted(kinds.items())),
        "assistant_turns": turns,
        "path": str(args.out / "base.jsonl"),
    }


def teacher_decoding(args: argparse.Namespace) -> tuple[dict[str, float | int], dict[str, str]]:
    """The teacher's sampler settings (each flag given, else the teacher folder's generation_config.json, else the
    built-in default: the oracle has no folder) and where each came from."""
    return sampler_settings(vars(args), None if args.teacher == "oracle" else model_path(args.teacher))


def make_teacher(args: argparse.Namespace, constraints: list[Constraint]) -> Teacher:
    if args.teacher == "oracle":
        return OracleTeacher(constraints)
    teacher = model_path(args.teacher)
    check_model_folder(
        teacher, "--teacher", hint=" ('oracle' is the toy world's responder, 'embedded' the shipped chat model)"
    )
    decoding, _ = teacher_decoding(args)
    return ModelTeacher(
        teacher,
        **decoding,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.teacher_dtype,
        device_map=args.teacher_device_map,
        numerics=args.teacher_numerics,
    )


def _constraints(args: argparse.Namespace) -> list[Constraint]:
    families = getattr(args, "heldout_families", None)
    if args.constraints:
        constraints = load_constraints(args.constraints)
        return hold_out_families(constraints, families, str(args.constraints)) if families else constraints
    return catalogue() if families is None else catalogue(heldout_families=families)


def _user_pool(args: argparse.Namespace) -> list[UserTurn]:
    return load_user_turns(args.user_turns, on_error=args.on_error) if args.user_turns else split_user_turns()[0]


def run_gatt(args: argparse.Namespace) -> dict:
    """Write DIR/gatt.jsonl, or DIR/replay.jsonl without constraints (resuming), and return its summary."""
    name = args.command
    constraints = (
        [] if name == "replay" else [c for c in _constraints(args) if c.split == "train"]
    )  # held-out values never enter GAtt data
    if getattr(args, "values_per_family", None) is not None:
        constraints = limit_values(constraints, args.values_per_family, seed=args.seed)
    if getattr(args, "trained_families", None) is not None:
        constraints = limit_families(constraints, args.trained_families, seed=args.seed)
    if name == "replay" and args.teacher == "oracle":
        raise ValueError("replay data are a model's own answers: --teacher must be a model directory")
    teacher = make_teacher(args, constraints)
    config = SynthesisConfig(
        num_dialogues=args.num_dialogues,
        min_turns=args.min_turns,
        max_turns=args.max_turns,
        samples_per_turn=args.samples_per_turn,
        redraws=args.redraws,
        seed=args.seed,
        short_prob=args.short_prob,
        shard_size=args.shard_size,
        strict_repeats=args.strict_repeats,
        strict_gate=args.strict_gate,
        demonstration=getattr(args, "demonstration", False),
        round=getattr(args, "round", 1),
        kinds=tuple(dict.fromkeys(getattr(args, "kinds", ["first"]))),
    )
    pool = _user_pool(args)
    demonstrate = partial(
        demonstrations,
        teacher,
        [c for c in constraints if c.split == "train"],
        pool,
        PassRateConfig(prompts=8, samples=args.samples_per_turn, seed=args.seed, strict_gate=args.strict_gate),
    )
    summary = synthesize(args.out, config, teacher, constraints, pool, name=name, demonstrate=demonstrate)
    return {**summary, "path": str(args.out / f"{name}.jsonl")}


def run_pass_rate(args: argparse.Namespace) -> dict:
    """Write the pass-rate JSON atomically, print its per-constraint and per-family tables (stderr), return the
    per-family figures."""
    constraints = _constraints(args)
    if args.values_per_family is not None:
        constraints = limit_values(constraints, args.values_per_family, seed=args.seed)
    config = PassRateConfig(
        prompts=args.prompts,
        samples=args.samples,
        seed=args.seed,
        strict_gate=args.strict_gate,
        demonstration=args.demonstration,
        without_instruction=args.without_instruction,
    )
    result = measure_pass_rates(make_teacher(args, constraints), constraints, _user_pool(args), config)
    decoding, sources = teacher_decoding(args)
    result["settings"].update(
        constraints=str(args.constraints or "built-in"),
        max_new_tokens=args.max_new_tokens,
        **decoding,  # the values used, and where each came from
        decoding_sources=sources,
    )
    write_json(args.out, result)
    print(format_pass_rates(result), file=sys.stderr)
    return result["per_family"]


def run_constraints(args: argparse.Namespace) -> dict:
    """Write the chosen constraints to args.out (atomically) and return their counts per split."""
    constraints = _constraints(args)
    if args.families:
        kept = matching_families(constraints, args.families, "--families")
        constraints = [c for c in constraints if c.family in kept]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    dump_constraints(constraints, args.out)
    return {
        "constraints": len(constraints),
        "families": len({c.family for c in constraints}),
        "heldout": sum(c.split == "heldout" for c in constraints),
        "out": str(args.out),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse, run, print the summary; input errors exit with a one-line message."""
    args = build_parser().parse_args(argv)
    with exit_on_bad_input():
        if args.command == "eval-set":
            summary = write_eval_set(args.out, seed=args.seed)
        elif args.command == "pass-rate":
            summary = run_pass_rate(args)
        elif args.command == "constraints":
            summary = run_constraints(args)
        else:
            summary = run_base(args) if args.command == "base" else run_gatt(args)
    if process_state().is_main_process:  # under a launcher, one summary for the job
        print(json.dumps(summary, indent=2))
    end_job()


if __name__ == "__main__":
    main()
