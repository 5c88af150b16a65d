"""Command line of the dialogue generator: `gatt-data` (`python -m data_gen` is the same command).

  gatt-data base --num-dialogues N --seed S --out DIR
      the toy world's base SFT corpus (instructions local to their turn) -> DIR/base.jsonl
  gatt-data gatt --teacher (oracle|MODEL_DIR) --num-dialogues N --min-turns A --max-turns B
                  --samples-per-turn K --seed S --out DIR [--user-turns FILE|DIR] [--constraints FILE.yaml]
      GAtt dialogues by context distillation with rejection sampling -> DIR/gatt.jsonl (resumable)
  gatt-data replay --teacher MODEL_DIR --num-dialogues N --min-turns A --max-turns B --out DIR [--user-turns FILE]
      the teacher's own answers to dialogues without instruction, gated -> DIR/replay.jsonl (resumable):
      replay data that keeps a fine-tune from forgetting how the model answers
  gatt-data pass-rate --teacher (oracle|MODEL_DIR) --out FILE.json [--constraints FILE.yaml] [--user-turns FILE]
      each constraint's one-turn pass rate with the instruction in view (checks; checks and gate; best of k) and
      why its rejected replies were rejected: FILE.json, and on stderr a table per constraint, then per family
  gatt-data eval-set --out DIR [--seed S]
      the built-in evaluation set -> DIR/constraints.yaml, DIR/user_turns.jsonl (the copy in
      gatt/eval/builtin is regenerated with --out gatt/eval/builtin)

The base and gatt outputs load with `datasets.load_dataset("json", data_files=...)`.

gatt and replay split their dialogues across processes: `torchrun --nproc_per_node N -m data_gen gatt ...`
(or `accelerate launch -m data_gen gatt ...`) writes the same bytes as one process, each process making
its share of the shards (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from data_gen.constraints import HELDOUT_FAMILIES, catalogue, limit_families, limit_values
from data_gen.eval_set import write_eval_set
from data_gen.pass_rate import PassRateConfig, demonstrations, format_pass_rates, measure_pass_rates
from data_gen.synthesis import SynthesisConfig, synthesize
from data_gen.teacher import TeacherConfig, build_teacher, teacher_decoding
from data_gen.toy_world import base_corpus
from data_gen.user_turns import UserTurn, load_user_turns, split_user_turns
from gatt.data.checks import (
    CONSTRAINTS_HELP,
    Constraint,
    dump_constraints,
    hold_out_families,
    load_constraints,
    matching_families,
)
from gatt.data.events import SHORT_PROB, SHORT_PROB_HELP
from gatt.io.cli import command_name, exit_on_bad_input
from gatt.io.config import REQUIRED, add_config_arguments, arg, config_keys, config_parser, configs_from
from gatt.io.distributed import end_job, process_state
from gatt.io.files import atomic_path, write_json

_HELDOUT_HELP = (
    "families kept out of GAtt data (every value held out): of the built-in catalogue (default: "
    f"{', '.join(HELDOUT_FAMILIES)}; the base corpus still teaches them) or of --constraints (default: none); a shell "
    "pattern holds out every family it matches (ifbench:*)"
)


@dataclass(kw_only=True)
class BaseCorpusConfig:
    """`data_gen base`: the toy world's base SFT corpus."""

    num_dialogues: int = arg(REQUIRED, "dialogues to generate")
    seed: int = arg(0, "same seed and inputs -> byte-identical output")
    out: Path = arg(REQUIRED, "output folder")
    short_prob: float = arg(SHORT_PROB, SHORT_PROB_HELP)
    heldout_families: list[str] | None = arg(None, _HELDOUT_HELP, nargs="*", metavar="FAMILY")
    max_turns: int = arg(
        12, "longest dialogue with local instructions or none (system-prompt dialogues have 1-2 turns)"
    )


@dataclass(kw_only=True)
class DataFiles:
    """Where `data_gen gatt`, `replay` and `pass-rate` read their constraints and user turns and write their output."""

    out: Path = arg(REQUIRED, "output folder (pass-rate: output JSON file)")
    constraints: Path | None = arg(None, CONSTRAINTS_HELP)
    heldout_families: list[str] | None = arg(None, _HELDOUT_HELP, nargs="*", metavar="FAMILY")
    user_turns: Path | None = arg(None, "your dialogues (JSONL/Parquet/datasets folder) or a .txt of messages")
    on_error: str = arg("raise", "bad input dialogues: stop, or count and skip", choices=["raise", "skip"])
    values_per_family: int | None = arg(
        None,
        "use at most K train values of each family (a fixed-seed draw): the data-variety knob; in pass-rate, a set "
        "with many parameter draws per type (ifeval, ifbench) measured per type at a fraction of the cost (default: "
        "every value)",
        metavar="K",
    )
    trained_families: int | None = arg(
        None,
        "use the train values of at most K families (a fixed-seed draw, a larger K keeps a superset): the families "
        "curve's knob, how transfer to held-out families grows with the families trained (default: all)",
        metavar="K",
    )


@dataclass(kw_only=True)
class ExportConfig:
    """`data_gen constraints`: a constraint file written out."""

    out: Path = arg(REQUIRED, "output YAML file")
    constraints: Path | None = arg(None, CONSTRAINTS_HELP)
    families: list[str] | None = arg(
        None, "keep these families, shell patterns too (default: all)", nargs="+", metavar="FAMILY"
    )
    heldout_families: list[str] | None = arg(
        None,
        "families held out as a whole (every value split heldout), shell patterns too",
        nargs="*",
        metavar="FAMILY",
    )


@dataclass(kw_only=True)
class EvalSetConfig:
    """`data_gen eval-set`: the built-in evaluation set."""

    out: Path = arg(REQUIRED, "output folder")
    seed: int = arg(0, "catalogue and user-turn split seed (the shipped set uses 0)")


@dataclass(frozen=True)
class Command:
    """A subcommand: its help, and the configs its flags fill (with the fields each leaves out)."""

    help: str
    configs: tuple[tuple[type, tuple[str, ...]], ...]
    description: str | None = None


NOT_IN_REPLAY = ("round", "demonstration", "kinds", "value_swaps")
COMMANDS = {
    "base": Command("write the toy world's base SFT corpus", ((BaseCorpusConfig, ()),)),
    "gatt": Command(
        "write GAtt dialogues by context distillation",
        ((SynthesisConfig, ()), (DataFiles, ()), (TeacherConfig, ())),
    ),
    "replay": Command(
        "write the teacher's own gated answers to dialogues without instruction (replay data)",
        (
            (SynthesisConfig, NOT_IN_REPLAY),
            (DataFiles, ("constraints", "values_per_family", "trained_families")),
            (TeacherConfig, ()),
        ),
        "Dialogues without an instruction, each reply the teacher's own answer that passes the answer gate (best of "
        "--samples-per-turn). Mixed into a GAtt fine-tune (replay_file=...), they keep the model answering as it did. "
        "Writes DIR/replay.jsonl and DIR/replay.summary.json; resumes like `gatt`.",
    ),
    "pass-rate": Command(
        "measure each constraint's one-turn pass rate with the instruction in view",
        ((PassRateConfig, ()), (DataFiles, ("heldout_families", "trained_families")), (TeacherConfig, ())),
        "For each constraint, --prompts user turns (a probe-only persona: its probe questions) with the instruction "
        "appended, --samples candidates each: the share passing the checks, the checks and the answer gate, and the "
        "share of prompts where one of the k passes both (what best-of-k rejection keeps), and why the others were "
        "rejected: the first instruction check a reply fails (its type: language, startswith, ...) or the answer "
        "gate's reasons (off_topic, repeat, template, salad, echo, loop, empty). Writes FILE.json (settings, "
        "per_constraint with rejected, rejection_reasons and rejection_example, per_family with rejected and "
        "rejection_reasons). Prints on stderr a markdown table with one row per constraint (name, family, split, "
        "prompts, candidates, the JSON's checks, checks_and_gate and best_of_k as percentages, and the rejection "
        "reasons with counts), a table of one rejected reply for each constraint's commonest reason, then the "
        "per-family table (left out when no constraint names a family: all are 'custom'), and on stdout the "
        "per-family figures as JSON. The progress bar counts prompts and steps as each "
        "constraint's candidates are written.",
    ),
    "constraints": Command(
        "write a constraint file: a set's constraints, some of its families, some held out",
        ((ExportConfig, ()),),
        "Write FILE.yaml with the constraints of --constraints (a file, a built-in set such as ifeval,ifbench, or the "
        "catalogue), only the families matching --families, with --heldout-families held out: the file a run names, "
        "to read and to edit (e.g. the types a model follows when reminded, chosen from `pass-rate`).",
    ),
    "eval-set": Command(
        "write the built-in evaluation set (constraints with splits, held-out user turns)",
        ((EvalSetConfig, ()),),
        "Write DIR/constraints.yaml (the catalogue, each constraint tagged train or heldout) and DIR/user_turns.jsonl "
        "(the held-out user turns with on-topic checks), the files gatt's evaluation uses by default. Regenerate the "
        "shipped copy with --out gatt/eval/builtin.",
    ),
}


def command_keys(name: str) -> list[str]:
    """The settings subcommand `name` takes: its flags' names with underscores, the keys of its `--config` file.

    Args:
        name: A key of COMMANDS.

    Returns:
        The setting names, config by config.
    """
    return [key for cls, exclude in COMMANDS[name].configs for key in config_keys(cls, exclude)]


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per COMMANDS entry, its flags made from its configs' fields, each with `--config FILE.yaml`.

    Returns:
        The parser of `gatt-data`, the module docstring as its description.
    """
    parser = argparse.ArgumentParser(
        prog=command_name("python -m data_gen"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.description)
        config_parser(parser=sub)
        for cls, exclude in command.configs:
            add_config_arguments(sub, cls, exclude)
    return parser


def parse(argv: list[str] | None = None) -> tuple[str, tuple[Any, ...]]:
    """The subcommand `argv` names and its configs (`--config FILE.yaml` read first, the flags given over it).

    Args:
        argv: The command-line arguments (default None: sys.argv[1:]).

    Returns:
        (subcommand name, one config per class of its COMMANDS entry, in that order).
    """
    parser = build_parser()
    given = vars(parser.parse_args(argv))
    name = given.pop("command")
    sub = parser._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
    return name, configs_from([cls for cls, _ in COMMANDS[name].configs], given, sub)


def run_base(config: BaseCorpusConfig) -> dict:
    """Write DIR/base.jsonl atomically and return its summary.

    Args:
        config: The `base` subcommand's settings.

    Returns:
        The summary: "records", "kinds" (records per kind), "assistant_turns" and "path".
    """
    held = config.heldout_families
    constraints = catalogue() if held is None else catalogue(heldout_families=held)
    train_turns, _ = split_user_turns()
    config.out.mkdir(parents=True, exist_ok=True)
    kinds, turns = Counter(), 0
    with atomic_path(config.out / "base.jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
        records = base_corpus(
            config.num_dialogues,
            config.seed,
            constraints,
            train_turns,
            short_prob=config.short_prob,
            max_turns=config.max_turns,
        )
        for record in tqdm(records, total=config.num_dialogues, desc="base corpus", unit="dialogue"):
            kinds[record["kind"]] += 1
            turns += sum(m["role"] == "assistant" for m in record["messages"])
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return {
        "records": config.num_dialogues,
        "kinds": dict(sorted(kinds.items())),
        "assistant_turns": turns,
        "path": str(config.out / "base.jsonl"),
    }


def _constraints(files: DataFiles | ExportConfig) -> list[Constraint]:
    families = files.heldout_families
    if files.constraints:
        constraints = load_constraints(files.constraints)
        return hold_out_families(constraints, families, str(files.constraints)) if families else constraints
    return catalogue() if families is None else catalogue(heldout_families=families)


def _user_pool(files: DataFiles) -> list[UserTurn]:
    return load_user_turns(files.user_turns, on_error=files.on_error) if files.user_turns else split_user_turns()[0]


def run_gatt(name: str, config: SynthesisConfig, files: DataFiles, teacher_config: TeacherConfig) -> dict:
    """Write DIR/gatt.jsonl, or DIR/replay.jsonl without constraints (`name` replay), resuming; return its summary.

    Args:
        name: The subcommand, "gatt" or "replay".
        config: The synthesis settings.
        files: Where constraints and user turns are read and the output written.
        teacher_config: The teacher's settings.

    Returns:
        The synthesis summary with "path", the output file.

    Raises:
        ValueError: When `name` is "replay" and the teacher is the oracle.
    """
    constraints = (
        [] if name == "replay" else [c for c in _constraints(files) if c.split == "train"]
    )  # held-out values never enter GAtt data
    if files.values_per_family is not None:
        constraints = limit_values(constraints, files.values_per_family, seed=config.seed)
    if files.trained_families is not None:
        constraints = limit_families(constraints, files.trained_families, seed=config.seed)
    if name == "replay" and teacher_config.teacher == "oracle":
        raise ValueError("replay data are a model's own answers: --teacher must be a model directory")
    teacher = build_teacher(teacher_config, constraints)
    config = replace(config, kinds=tuple(dict.fromkeys(config.kinds)))
    pool = _user_pool(files)
    demonstrate = partial(
        demonstrations,
        teacher,
        [c for c in constraints if c.split == "train"],
        pool,
        PassRateConfig(
            prompts=8,
            samples=config.samples_per_turn,
            seed=config.seed,
            strict_gate=config.strict_gate,
            relevance_judge=config.relevance_judge,
        ),
    )
    summary = synthesize(files.out, config, teacher, constraints, pool, name=name, demonstrate=demonstrate)
    return {**summary, "path": str(files.out / f"{name}.jsonl")}


def run_pass_rate(config: PassRateConfig, files: DataFiles, teacher_config: TeacherConfig) -> dict:
    """Write the pass-rate JSON atomically, print its per-constraint and per-family tables (stderr), return the
    per-family figures.

    Args:
        config: The pass-rate settings.
        files: Where constraints and user turns are read, and `out`, the JSON file written.
        teacher_config: The teacher's settings.

    Returns:
        The result's "per_family" figures.
    """
    constraints = _constraints(files)
    if files.values_per_family is not None:
        constraints = limit_values(constraints, files.values_per_family, seed=config.seed)
    result = measure_pass_rates(build_teacher(teacher_config, constraints), constraints, _user_pool(files), config)
    decoding, sources = teacher_decoding(teacher_config)
    result["settings"].update(
        constraints=str(files.constraints or "built-in"),
        max_new_tokens=teacher_config.max_new_tokens,
        **decoding,  # the values used, and where each came from
        decoding_sources=sources,
    )
    write_json(files.out, result)
    print(format_pass_rates(result), file=sys.stderr)
    return result["per_family"]


def run_constraints(config: ExportConfig) -> dict:
    """Write the chosen constraints to config.out (atomically) and return their counts per split.

    Args:
        config: The `constraints` subcommand's settings.

    Returns:
        The counts: "constraints", "families", "heldout", and "out", the file written.
    """
    constraints = _constraints(config)
    if config.families:
        kept = matching_families(constraints, config.families, "--families")
        constraints = [c for c in constraints if c.family in kept]
    dump_constraints(constraints, config.out)
    return {
        "constraints": len(constraints),
        "families": len({c.family for c in constraints}),
        "heldout": sum(c.split == "heldout" for c in constraints),
        "out": str(config.out),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse, run, print the summary; input errors exit with a one-line message.

    Under a launcher only the main process prints the summary.

    Args:
        argv: The command-line arguments (default None: sys.argv[1:]).
    """
    with exit_on_bad_input():
        name, configs = parse(argv)
        if name == "eval-set":
            summary = write_eval_set(configs[0].out, seed=configs[0].seed)
        elif name == "pass-rate":
            summary = run_pass_rate(*configs)
        elif name == "constraints":
            summary = run_constraints(*configs)
        elif name == "base":
            summary = run_base(*configs)
        else:
            summary = run_gatt(name, *configs)
    if process_state().is_main_process:  # under a launcher, one summary for the job
        print(json.dumps(summary, indent=2))
    end_job()


if __name__ == "__main__":
    main()
