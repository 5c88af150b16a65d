"""Instruction adherence over 20+ turns: `gatt-eval --model NAME=DIR ... --out DIR` (`python -m gatt.eval.evaluate` is
the same command).

Each test dialogue gives one instruction in turn one (the system message by default), then user turns
from a held-out pool; the model under test writes every reply, and every reply is checked against the
instruction's programmatic checks (probe turns ask an attribute question of its family instead) and
the answer gate (a real answer: not empty, no loop, no repeat of an earlier reply, on the user's topic;
see gatt/eval/gate.py). User turns without on-topic checks are judged on topic by a likelihood contrast
under --relevance-model. The same dialogues are rolled out with every model; NAME+repeat (the
instruction in every user turn) and NAME+split (split-softmax: attention on the instruction boosted at
inference, no fine-tuning) are the same model given the instruction otherwise. Writes report.json,
report.md, adherence.png, attention.png and transcripts.jsonl, and prints the table in the form of the
Llama 2 paper's Table 30 (checks and gate; the checks alone are under `checks_only`).

`torchrun --nproc_per_node N -m gatt.eval.evaluate ...` (or `accelerate launch -m gatt.eval.evaluate ...`) deals the
rollout batches across N processes, each on its own device; process 0 judges and writes the report, the
same report.json as one process.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

import gatt  # noqa: F401  (registers the "gatt" attention and the library's model with transformers)
from gatt.data.checks import hold_out_families, matching_families
from gatt.eval.cache import RolloutCache, fingerprint
from gatt.eval.embedding import EMBEDDING_JUDGE
from gatt.eval.eval_config import SAMPLING_ONLY, EvalConfig
from gatt.eval.gate import (
    GateConfig,
)
from gatt.eval.inputs import load_eval_constraints, load_eval_turns
from gatt.eval.judge import judge, needs_relevance_model
from gatt.eval.plan import STRATA, EvalDialogue, plan_dialogues
from gatt.eval.report import NOT_MODELS, build_report, summary_tables, write_report
from gatt.eval.rollout import distributed_rollout
from gatt.eval.scoring import REPEAT_SUFFIX, SPLIT_SUFFIX
from gatt.eval.turns import RolloutConfig
from gatt.io.cli import command_name, exit_on_bad_input
from gatt.io.config import config_parser, parse_config
from gatt.io.distributed import end_job, process_state
from gatt.io.machine import package_versions
from gatt.model.chat_model import load_chat_model
from gatt.model.embedded import model_path
from gatt.model.folder import check_model_folder
from gatt.model.numerics import resolve_auto
from gatt.model.sampling import FLAG_GIVEN, folder_sampler_settings, sampler_settings


def say(message: str) -> None:
    """A progress line on stderr, once for the job (by the main process only).

    Args:
        message: The line.
    """
    if process_state().is_main_process:
        print(message, file=sys.stderr)


def parse_models(specs: list[str]) -> dict[str, str]:
    """--model's NAME=DIR entries as {name: model folder}, in the order given.

    Args:
        specs: The NAME=DIR entries; DIR `embedded` stands for the shipped chat model (`model_path`).

    Returns:
        {name: path}, each path checked to be a model folder.

    Raises:
        ValueError: When an entry is not NAME=DIR, or a name is used twice or reserved (a report key, NOT_MODELS).
    """
    models: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--model expects NAME=DIR, got {spec!r}")
        if name in models or name in NOT_MODELS:
            raise ValueError(f"--model name {name!r} is used twice or reserved")
        path = model_path(path)
        check_model_folder(path, f"--model {name}=")
        models[name] = path
    return models


def parse_tiers(specs: list[str]) -> dict[str, list[str]]:
    """--heldout-tiers' TIER=FAMILY,FAMILY entries as {tier: families}, in the order given.

    Args:
        specs: The TIER=FAMILY,FAMILY entries.

    Returns:
        {tier: its families (or patterns), as given}.

    Raises:
        ValueError: An entry without a name or families, or a tier named twice.
    """
    tiers: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, families = spec.partition("=")
        members = [f.strip() for f in families.split(",") if f.strip()]
        if not sep or not name or not members:
            raise ValueError(f"--heldout-tiers expects TIER=FAMILY,FAMILY, got {spec!r}")
        if name in tiers:
            raise ValueError(f"--heldout-tiers names the tier {name!r} twice")
        tiers[name] = members
    return tiers


def report_decoding(args: EvalConfig, models: dict[str, str]) -> tuple[dict[str, float | int], dict[str, str]]:
    """The sampler settings every model is rolled out with, and where each came from.

    Another model whose folder sets a value that differs is named on stderr (its column still decodes as the others).

    Args:
        args: The report's settings; the sampler flags given.
        models: {name: model folder}; the first one's generation_config.json fills the flags not given.

    Returns:
        (settings, sources): each setting the flag given, else the first --model's generation_config.json's, else
        the built-in default; and {setting: where it came from}.
    """
    first, *others = models.items()
    decoding, sources = sampler_settings(dataclasses.asdict(args), first[1])
    for name, path in others:
        own = folder_sampler_settings(path)
        differ = [
            f"{key} {own[key]}"
            for key in decoding
            if key in own
            and own[key] != decoding[key]
            and sources[key] != FLAG_GIVEN
            and (args.sample or key not in SAMPLING_ONLY)
        ]
        if differ:
            say(
                f"[eval] note: --model {name}'s generation_config.json sets {', '.join(differ)}; every model "
                f"decodes as --model {first[0]}'s (give the flag to choose)"
            )
    return decoding, sources


def evaluate(
    models: dict[str, str],
    dialogues: list[EvalDialogue],
    config: RolloutConfig,
    *,
    repeat: list[str],
    split: dict[str, list[float]] | None = None,
    device: str | None = None,
    numerics: str = "exact",
    cache: RolloutCache | None = None,
) -> list[dict[str, Any]]:
    """Every model's transcripts, plus NAME+repeat for the models in `repeat` and NAME+split for those in `split`.

    Each model is loaded at first use: not at all when every column of it was read from the cache.

    Args:
        models: {name: model folder}, rolled out in order.
        dialogues: The planned dialogues, the same for every model.
        config: The rollout settings; a variant column changes only how the instruction is given.
        repeat: The models also rolled out with the instruction in every user turn (NAME+repeat).
        split: Split-softmax strengths per model; one strength is the column NAME+split, several are
            NAME+split@STRENGTH each (`split_column`).
        device: The device the models are loaded on (None: `load_chat_model`'s default).
        numerics: The models' numeric mode (gatt/model/numerics.py; default "exact").
        cache: Finished columns are read from it and written to it (gatt/eval/cache.py), so an interrupted report
            resumes (None: no cache).

    Returns:
        The transcripts of every column, each with its `model`: per model its own column, then its variants.
    """
    split = split or {}
    state = process_state()
    cache = cache or RolloutCache(None)
    transcripts: list[dict[str, Any]] = []
    for name, path in models.items():
        attention = config.measure_attention or name in split
        # loaded at first use: not at all when every column of this model was read from the cache
        model_and_tokenizer = functools.cache(
            functools.partial(load_chat_model, path, attention=attention, device=device, numerics=numerics)
        )

        # key, own_rollout and the lambdas below are called within this iteration (cache.column calls its
        # rollout at once), so they never see a later iteration's loop values: ruff's B023 does not apply.
        def key(column: str, column_config: RolloutConfig) -> str:
            return fingerprint(path, column, dialogues, column_config, numerics=numerics, device=device)  # noqa: B023

        def own_rollout() -> list[dict[str, Any]]:
            say(f"[eval] {name}: {len(dialogues)} dialogues x {max(len(d.turns) for d in dialogues)} turns")  # noqa: B023
            return [{"model": name, **t} for t in distributed_rollout(*model_and_tokenizer(), dialogues, config, state)]  # noqa: B023

        own = cache.column(name, key(name, config), own_rollout)
        transcripts += own
        variants = [(name + REPEAT_SUFFIX, replace(config, repeat_instruction=True))] if name in repeat else []
        variants += [
            (split_column(name, strength, split[name]), replace(config, split_softmax=strength))
            for strength in split.get(name, [])
        ]
        for column, column_config in variants:
            transcripts += cache.column(
                column,
                key(column, column_config),
                lambda: variant(column, *model_and_tokenizer(), own, dialogues, column_config),  # noqa: B023
            )
        model_and_tokenizer.cache_clear()
    return transcripts


def variant(
    column: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    own: list[dict[str, Any]],
    dialogues: list[EvalDialogue],
    config: RolloutConfig,
) -> list[dict[str, Any]]:
    """A model's transcripts under another way of giving the instruction (repeated, boosted), as `column`.

    A dialogue without instruction is the same either way: it gets the model's own transcript, not a
    second rollout of the same prompts.

    Args:
        column: The variant column's name (NAME+repeat, NAME+split...).
        model: The model.
        tokenizer: Its tokenizer.
        own: The model's own transcripts, one per dialogue.
        dialogues: The planned dialogues.
        config: The rollout settings of the variant.

    Returns:
        One transcript per transcript of `own`, in its order, each with `model` set to `column`.
    """
    instructed = [d for d in dialogues if d.instructed]
    say(f"[eval] {column}: {len(instructed)} dialogues with an instruction")
    rolled = iter(distributed_rollout(model, tokenizer, instructed, config, process_state()) if instructed else [])
    ids = {d.id for d in instructed}
    return [{"model": column, **next(rolled)} if t["id"] in ids else {**t, "model": column} for t in own]


def split_column(name: str, strength: float, strengths: list[float]) -> str:
    """The column name of one split-softmax strength of a model.

    Args:
        name: The model's name.
        strength: The strength.
        strengths: All the model's strengths.

    Returns:
        NAME+split for a model's only strength, NAME+split@STRENGTH when there are several.
    """
    return name + SPLIT_SUFFIX + ("" if len(strengths) == 1 else f"@{strength:g}")


def parse_split(specs: list[str], models: dict[str, str]) -> dict[str, list[float]]:
    """--split-softmax's NAME:STRENGTH[,STRENGTH...] entries as {NAME: [strengths]}.

    Args:
        specs: The entries.
        models: {name: model folder}; NAME must be one of them.

    Returns:
        {NAME: [strengths]}, each strength in [0, 1].

    Raises:
        ValueError: When NAME is no --model, a strength is not a number in [0, 1], strengths repeat, or a model is
            named twice.
    """
    split: dict[str, list[float]] = {}
    for spec in specs:
        name, sep, values = spec.rpartition(":")
        if not sep or name not in models:
            raise ValueError(f"--split-softmax expects NAME:STRENGTH with NAME a --model, got {spec!r}")
        try:
            strengths = [float(v) for v in values.split(",")]
        except ValueError:
            raise ValueError(f"--split-softmax {spec}: strengths must be numbers in [0, 1]") from None
        if any(not 0.0 <= s <= 1.0 for s in strengths) or len(set(strengths)) != len(strengths):
            raise ValueError(f"--split-softmax {spec}: strengths must be distinct numbers in [0, 1]")
        if name in split:
            raise ValueError(f"--split-softmax names {name!r} twice; give its strengths once, comma-separated")
        split[name] = strengths
    return split


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser: one flag per EvalConfig field, the module's docstring as its description.

    Returns:
        The parser.
    """
    prog = command_name("python -m gatt.eval.evaluate")
    return config_parser(
        EvalConfig,
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"example: {prog} --model base=embedded --model gatt=runs/demo/round-1/gatt/final "
        "--turns 30 --dialogues 64 --seed 0 --out runs/demo/report --repeat-instruction base --split-softmax base:0.5",
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse, evaluate, write the report; bad input exits with one `error: ...` line.

    Args:
        argv: The command-line arguments (None: sys.argv's).

    Returns:
        The report (`run`); {} on a process other than 0 of a launch.
    """
    parser = build_parser()
    with exit_on_bad_input():
        report = run(parse_config(EvalConfig, argv, parser))
    end_job()
    return report


def cli() -> None:
    """`gatt-eval`: `main()` with no return value (an installed command exits with the value its function returns)."""
    main()


def _repeated(args: EvalConfig, models: dict[str, str]) -> list[str]:
    """The models reminded of the instruction every turn (--repeat-instruction; given bare: every model), after
    checking that it and --paired-baseline name only --model columns (`run`'s Raises)."""
    repeat = list(models) if args.repeat_instruction == [] else (args.repeat_instruction or [])
    if unknown := sorted(set(repeat) - set(models)):
        raise ValueError(f"--repeat-instruction names no --model: {', '.join(unknown)}")
    if unknown := sorted(set(args.paired_baseline) - set(models)):
        raise ValueError(f"--paired-baseline names no --model: {', '.join(unknown)}")
    return repeat


def run(args: EvalConfig) -> dict[str, Any]:
    """The report of `args`: plan the dialogues, roll every model out on them, judge the replies, write the report.

    Process 0 writes the report; the other processes of a launch return {} once their share is rolled out.

    Args:
        args: The report's settings.

    Returns:
        The report (`build_report`), as written to report.json; {} on the other processes.

    Raises:
        ValueError: When --repeat-instruction or --paired-baseline names no --model, or a --model or
            --split-softmax entry is refused.
    """
    models = parse_models(args.model)
    repeat = _repeated(args, models)
    split = parse_split(args.split_softmax, models)
    decoding, decoding_sources = report_decoding(args, models)
    tiers, dialogues = plan(args)
    config = RolloutConfig(
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        do_sample=args.sample,
        seed=args.seed,
        placement=args.placement,
        **decoding,
        measure_attention=not args.no_attention,
        decoder=args.decoder,
    )
    relevance_model = next(iter(models.values())) if args.relevance_model is None else args.relevance_model
    relevance_model = None if relevance_model == "none" else relevance_model
    if relevance_model is not None:
        check_model_folder(relevance_model, "--relevance-model")
    # `auto` resolved once, before the rollouts' fingerprints: a cached column is reused only in the mode it was made in
    device = args.device or process_state().device
    args = replace(
        args,
        numerics=resolve_auto(args.numerics, device, "bf16", "exact", "--numerics"),
        relevance_numerics=resolve_auto(args.relevance_numerics, device, "bf16", "exact", "--relevance-numerics"),
    )
    cache = RolloutCache(Path(args.out) / "rollouts", write=process_state().is_main_process)
    transcripts = evaluate(
        models, dialogues, config, repeat=repeat, split=split, device=args.device, numerics=args.numerics, cache=cache
    )
    if not process_state().is_main_process:
        return {}  # every process rolled out its share and has every transcript; process 0 judges and reports
    gate = GateConfig.strict() if args.strict_gate else GateConfig()
    gate = gate if args.relevance_judge is None else gate.judged_by(args.relevance_judge)
    judge(
        transcripts,
        dialogues,
        relevance_model=relevance_model,
        others=args.relevance_others,
        seed=args.seed,
        device=args.device,
        numerics=args.relevance_numerics,
        gate=gate,
    )
    settings = {
        "models": models,
        "repeat_instruction": repeat,
        **({"paired_baselines": args.paired_baseline} if args.paired_baseline else {}),
        **({"split_softmax": split} if split else {}),
        **plan_settings(args, tiers),
        # the values used (temperature and top-p only when sampling), and where each came from
        **{key: value for key, value in decoding.items() if args.sample or key not in SAMPLING_ONLY},
        "decoding_sources": {key: s for key, s in decoding_sources.items() if args.sample or key not in SAMPLING_ONLY},
        "answer_gate": gate_settings(gate, relevance_model, args.relevance_others, needs_relevance_model(dialogues)),
        "versions": package_versions(),
    }
    report = build_report(transcripts, settings, args.paired_baseline)
    write_report(report, transcripts, args.out)
    print(summary_tables(report))
    print(f"wrote {args.out}/report.json, report.md, adherence.png, attention.png, transcripts.jsonl")
    return report


def no_instruction_dialogues(args: EvalConfig) -> int:
    """The number of dialogues without an instruction.

    Args:
        args: The report's settings.

    Returns:
        --no-instruction-dialogues, else a quarter of --dialogues.
    """
    return args.dialogues // 4 if args.no_instruction_dialogues is None else args.no_instruction_dialogues


def plan(args: EvalConfig) -> tuple[dict[str, list[str]], list[EvalDialogue]]:
    """The held-out tiers and the report's dialogues.

    Args:
        args: The report's settings: the constraints, user turns, held-out families and tiers, and the plan's sizes.

    Returns:
        (tiers, dialogues): the held-out tiers' families by tier (a pattern matches several; in constraint order),
        and the report's dialogues, the held-out families and tiers kept out of the trained strata.
    """
    constraints = load_eval_constraints(args.constraints)
    source = str(args.constraints or "built-in constraints")
    tiers: dict[str, list[str]] = {}
    for tier, patterns in parse_tiers(args.heldout_tiers).items():
        matched = matching_families(constraints, patterns, f"{source}: --heldout-tiers {tier}")
        tiers[tier] = list(dict.fromkeys(c.family for c in constraints if c.family in matched))
    if held := [*args.heldout_families, *(family for families in tiers.values() for family in families)]:
        constraints = hold_out_families(constraints, held, source)
    dialogues = plan_dialogues(
        constraints,
        load_eval_turns(args.user_turns),
        dialogues=args.dialogues,
        turns=args.turns,
        seed=args.seed,
        no_instruction=no_instruction_dialogues(args),
        short_prob=args.short_prob,
        probe_every=args.probe_every,
        kinds=list(dict.fromkeys(args.kinds)),
        strata=args.strata,
        tiers=tiers,
    )
    return tiers, dialogues


def plan_settings(args: EvalConfig, tiers: dict[str, list[str]]) -> dict[str, Any]:
    """report.json's settings of the dialogues and their decoding.

    Args:
        args: The report's settings.
        tiers: The held-out tiers' families by tier (`plan`).

    Returns:
        The settings, a setting at its default left out where the report has always left it out.
    """
    return {
        "turns": args.turns,
        "dialogues": args.dialogues,
        "no_instruction_dialogues": no_instruction_dialogues(args),
        "seed": args.seed,
        "constraints": str(args.constraints or "built-in"),
        **({"kinds": args.kinds} if args.kinds != ["first"] else {}),
        **({"strata": args.strata} if sorted(args.strata) != sorted(STRATA) else {}),
        **({"heldout_families": args.heldout_families} if args.heldout_families else {}),
        **({"heldout_tiers": tiers} if tiers else {}),
        "user_turns": str(args.user_turns or "built-in held-out pool"),
        "placement": args.placement,
        "probe_every": args.probe_every,
        "short_prob": args.short_prob,
        "max_new_tokens": args.max_new_tokens,
        "decoding": "sample" if args.sample else "greedy",
        **({"decoder": args.decoder} if args.decoder != "auto" else {}),
        **({"numerics": args.numerics} if args.numerics != "exact" else {}),
        **({"relevance_numerics": args.relevance_numerics} if args.relevance_numerics != "exact" else {}),
    }


def gate_settings(
    gate: GateConfig, relevance_model: str | None, others: int, judges_without_topic_words: bool
) -> dict[str, Any]:
    """report.json's `answer_gate`: the gate's thresholds and, in words, what judges a reply's relevance.

    Args:
        gate: The answer gate's settings.
        relevance_model: The likelihood contrast's chat model (None: none).
        others: The other questions each reply is contrasted with.
        judges_without_topic_words: Whether the report has turns without on-topic checks, whose judge is described
            too.

    Returns:
        The gate's repeat and loop thresholds, `relevance` (what judges a reply's relevance with the turn's on-topic
        checks, and without them), the judges' names where the embedding model is used, and
        `near_copies_with_a_new_topic_word` where a topic change does not exempt a near copy.
    """
    contrast = (
        f"likelihood contrast under {relevance_model} with {others} other questions "
        f"(>= {gate.relevance_sum} nats and >= {gate.relevance_mean} nats/token)"
    )
    not_english = "the contrast" if gate.not_english_judge == "contrast" else "the same (it scores low)"
    embedding = f"similarity under all-MiniLM-L6-v2 (>= {gate.embedding_min}; a reply not in English: {not_english})"

    def described(judge: str | None) -> str | None:
        parts = [
            *([contrast] if judge in ("contrast", "both") and relevance_model else []),
            *([embedding] if judge in ("embedding", "both") else []),
        ]
        return " and ".join(parts) or None

    without = described(gate.judge_for(False)) if judges_without_topic_words else None
    with_topic_words = described(gate.judge_for(True))
    return {
        "repeat_share": gate.repeat_share,
        "loop_distinct": gate.loop_distinct,
        "relevance": (
            f"on-topic checks and {with_topic_words}" if gate.relevance_both and with_topic_words else "on-topic checks"
        )
        + f"; without them {without or 'not judged'}",
        **(
            {
                "relevance_judge": gate.relevance_judge,
                "topic_words_judge": gate.topic_words_judge,
                "embedding_judge": EMBEDDING_JUDGE,
            }
            if gate.uses_embedding
            else {}
        ),
        **({} if gate.topic_change_exempts else {"near_copies_with_a_new_topic_word": "repeats"}),
    }


if __name__ == "__main__":
    main()
