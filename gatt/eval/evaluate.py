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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

import gatt  # noqa: F401  (registers the "gatt" attention and the library's model with transformers)
from gatt.data.checks import CONSTRAINTS_HELP, hold_out_families, matching_families
from gatt.data.events import KINDS, SHORT_PROB, SHORT_PROB_HELP, kinds_help
from gatt.eval.cache import RolloutCache, fingerprint
from gatt.eval.embedding import EMBEDDING_JUDGE
from gatt.eval.gate import (
    AnswerGate,
    GateConfig,
    RelevanceScorer,
    gate_flags,
    relevance_embedder,
)
from gatt.eval.inputs import load_eval_constraints, load_eval_turns
from gatt.eval.judge import apply_gate
from gatt.eval.plan import STRATA, EvalDialogue, plan_dialogues
from gatt.eval.report import NOT_MODELS, build_report, summary_tables, write_report
from gatt.eval.rollout import DECODERS, GENERATE_AT_MOST, RolloutConfig, distributed_rollout
from gatt.eval.scoring import REPEAT_SUFFIX, SPLIT_SUFFIX
from gatt.io.cli import command_name, exit_on_bad_input
from gatt.io.config import REQUIRED, arg, config_parser, parse_config
from gatt.io.distributed import end_job, process_state
from gatt.io.machine import package_versions
from gatt.model.chat_model import load_chat_model
from gatt.model.embedded import model_path
from gatt.model.folder import check_model_folder
from gatt.model.numerics import NUMERICS, Numerics, resolve_auto
from gatt.model.sampling import FLAG_GIVEN, MAX_NEW_TOKENS, folder_sampler_settings, sampler_flags, sampler_settings


def say(message: str) -> None:
    """A progress line on stderr, once for the job."""
    if process_state().is_main_process:
        print(message, file=sys.stderr)


def parse_models(specs: list[str]) -> dict[str, str]:
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

    Raises:
        ValueError: an entry without a name or families, or a tier named twice.
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


SAMPLING_ONLY = ("temperature", "top_p")  # used by --sample only


def report_decoding(args: EvalConfig, models: dict[str, str]) -> tuple[dict[str, float | int], dict[str, str]]:
    """The sampler settings every model is rolled out with: each flag given, else the first --model's
    generation_config.json's, else the built-in default; and where each came from. Another model whose folder
    sets a value that differs is named on stderr (its column still decodes as the others)."""
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

    `split`: split-softmax strengths per model; one strength is the column NAME+split, several are
    NAME+split@STRENGTH each (`split_column`). `cache`: finished columns are read from it and written to
    it (gatt/eval/cache.py), so an interrupted report resumes."""
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
    second rollout of the same prompts."""
    instructed = [d for d in dialogues if d.instructed]
    say(f"[eval] {column}: {len(instructed)} dialogues with an instruction")
    rolled = iter(distributed_rollout(model, tokenizer, instructed, config, process_state()) if instructed else [])
    ids = {d.id for d in instructed}
    return [{"model": column, **next(rolled)} if t["id"] in ids else {**t, "model": column} for t in own]


def split_column(name: str, strength: float, strengths: list[float]) -> str:
    """NAME+split for a model's only strength, NAME+split@STRENGTH when there are several."""
    return name + SPLIT_SUFFIX + ("" if len(strengths) == 1 else f"@{strength:g}")


def parse_split(specs: list[str], models: dict[str, str]) -> dict[str, list[float]]:
    """`--split-softmax NAME:STRENGTH[,STRENGTH...]` -> {NAME: [strengths]}, each strength in [0, 1]."""
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


def needs_relevance_model(dialogues: list[EvalDialogue]) -> bool:
    """Whether some chat turn has no on-topic checks, so a relevance judge decides whether a reply is on its topic."""
    return any(turn.kind == "chat" and not turn.on_topic for d in dialogues for turn in d.turns)


def has_topic_words(dialogues: list[EvalDialogue]) -> bool:
    """Whether some chat turn has on-topic checks (which the strict gate judges by a relevance judge too)."""
    return any(turn.kind == "chat" and turn.on_topic for d in dialogues for turn in d.turns)


def judge(
    transcripts: list[dict[str, Any]],
    dialogues: list[EvalDialogue],
    *,
    relevance_model: str | None,
    others: int,
    seed: int,
    device: str | None = None,
    numerics: Numerics | str = "exact",
    gate: GateConfig = GateConfig(),
) -> None:
    """Apply the answer gate to every transcript, loading the relevance judges `gate` names only where a turn needs
    them: the likelihood contrast's chat model `relevance_model` (in `numerics`), the embedding model."""
    models = gate.models(has_topic_words(dialogues), needs_relevance_model(dialogues))
    scorer = None
    if "contrast" in models and relevance_model is not None:
        model, tokenizer = load_chat_model(relevance_model, device=device, numerics=numerics)
        scorer = RelevanceScorer(model, tokenizer, progress=True)
    embedder = relevance_embedder(gate, device or process_state().device) if "embedding" in models else None
    apply_gate(transcripts, dialogues, AnswerGate(gate, scorer, embedder), seed=seed, others=others)


@dataclass(kw_only=True)
class EvalConfig(sampler_flags("the first --model's"), gate_flags()):
    """The report's settings (`python -m gatt.eval.evaluate`): each field is a flag (`--field-name`) and a key of a
    `--config FILE.yaml`. One decoding for every model, so the columns compare models, not decodings: the sampler
    settings not given are the first --model's."""

    model: list[str] = arg(
        REQUIRED,
        "a model under test: a chat-model directory (or .gguf file; `embedded`: the shipped chat model); repeat for "
        "several",
        action="append",
        metavar="NAME=DIR",
    )
    out: Path = arg(REQUIRED, "output folder")
    turns: int = arg(24, "turns per dialogue")
    dialogues: int = arg(64, "dialogues with an instruction")
    no_instruction_dialogues: int | None = arg(
        None, "dialogues without instruction, for the no-regression score (default: dialogues / 4)"
    )
    seed: int = arg(0, "dialogue plan and sampling seed; same seed -> same report")
    constraints: Path | None = arg(None, CONSTRAINTS_HELP)
    user_turns: Path | None = arg(
        None,
        "user messages: .txt (one a line), .jsonl ({'content', 'checks'} or 'messages'), .parquet or a datasets "
        "folder (default: the built-in held-out pool)",
    )
    heldout_families: list[str] = arg(
        [],
        "families held out as a whole (every value split heldout): reported with the held-out family, not with the "
        "trained values (e.g. those the GAtt data left out: data_gen --heldout-families); a shell pattern holds out "
        "every family it matches (ifbench:*)",
        nargs="*",
        metavar="FAMILY",
    )
    heldout_tiers: list[str] = arg(
        [],
        "held-out families in named tiers, TIER=FAMILY,FAMILY (e.g. behaviours=brevity,lowercase): each tier's "
        "families are held out as a whole, and each tier gets as many dialogues as the trained values, with its "
        "per-turn table, paired differences and per-family rows in the report (report.json `tiers`, "
        "MODEL.tier_per_turn, `paired_tiers`; tiers.png)",
        nargs="*",
        metavar="TIER=FAMILIES",
    )
    kinds: list[str] = arg(
        ["first"],
        kinds_help(
            "dealt in turn",
            "A change comes at a turn from 2 to 11 of 30, so 19 turns follow it. report.json gives "
            "MODEL.per_kind.KIND.after[d] by d, the turns since the instruction or the change, and for replace and "
            "revoke old_followed[d]; the per-turn tables are those of `first`",
        ),
        nargs="+",
        choices=KINDS,
        metavar="KIND",
    )
    strata: list[str] = arg(
        list(STRATA),
        "which constraints the dialogues with an instruction test: train (values GAtt trained on), heldout_value, "
        "heldout_family (default: all three, half on train)",
        nargs="+",
        choices=STRATA,
        metavar="STRATUM",
    )
    repeat_instruction: list[str] | None = arg(
        None,
        "also evaluate the upper bound with the instruction appended to every user turn, as NAME+repeat, for the "
        "named models (no names: all)",
        nargs="*",
        metavar="NAME",
    )
    paired_baseline: list[str] = arg(
        [],
        "also pair every other model against this --model, per turn over the same dialogues (report.json `paired`, "
        "'A - NAME'), e.g. one fine-tune against another; repeatable",
        action="append",
        metavar="NAME",
    )
    split_softmax: list[str] = arg(
        [],
        "also evaluate NAME with split-softmax (Li et al. 2024: every head's attention on the instruction boosted at "
        "inference, no fine-tuning) as NAME+split; STRENGTH in [0, 1], 0: no change; several comma-separated "
        "strengths give NAME+split@STRENGTH columns",
        action="append",
        metavar="NAME:STRENGTH",
    )
    placement: str = arg("system", "where turn one gives the instruction", choices=["system", "first_user"])
    probe_every: int = arg(4, "a probe every N turns from turn 2; 0: none")
    short_prob: float = arg(SHORT_PROB, SHORT_PROB_HELP)
    max_new_tokens: int = arg(MAX_NEW_TOKENS, "reply length limit")
    batch_size: int = arg(32, "dialogues rolled out together")
    sample: bool = arg(False, "sample (seeded) instead of greedy decoding")
    no_attention: bool = arg(False, "skip the attention-to-instruction probe")
    decoder: str = arg(
        "auto",
        "how replies are decoded: growing (a KV cache that grows, stopped rows leave the batch: fastest on a CPU), "
        "static (preallocated cache and mask), graphs (static, the step recorded as a CUDA graph a reply and replayed), "
        "compiled (static, torch.compile reduce-overhead: fused kernels after a compile of about 39 s per reply width); "
        "generate (Hugging Face generate() over the batch, its cache carried across turns; greedy, no penalty, no "
        "probe); engine: graphs on a GPU for the library's model, else growing; auto: generate for a batch of at most "
        f"{GENERATE_AT_MOST} dialogue-turns on a CPU in fp32 where it writes the same replies (there the engine is under 1.2x "
        "generate()), else engine. Greedy replies are the same up to float rounding",
        choices=DECODERS,
    )
    numerics: str = arg(
        "exact",
        "how the models under test compute their replies: exact (fp32); bf16 (weights and activations, attention in "
        "fp32: faster rollouts on a CPU with bf16 instructions, slower on one without); int8 (dynamic quantisation "
        "of the Linear layers, CPU only). The fast modes write other replies (gatt/model/numerics.py, docs/evaluation.md). "
        "auto: bf16 where the device has fast bf16 arithmetic, else exact (the choice is printed)",
        choices=NUMERICS,
    )
    relevance_numerics: str = arg(
        "exact",
        "how the relevance scorer computes its likelihoods; bf16 scores about 3x faster on a CPU with bf16 "
        "instructions, contrasts a few tenths of a nat apart (SmolLM2: 99.5%% of verdicts identical); auto: bf16 "
        "where the device has fast bf16 arithmetic (bf16 instructions, a GPU that supports it), else exact",
        choices=NUMERICS,
    )
    relevance_model: str | None = arg(
        None,
        "chat model whose likelihoods judge whether a reply answers a user turn that has no on-topic checks "
        "(default: the first --model; 'none': do not judge those turns' topic)",
        metavar="DIR",
    )
    relevance_others: int = arg(3, "other questions each reply is contrasted with in the relevance test")
    device: str | None = arg(
        None,
        "cpu, cuda, ... (default: this process's GPU under torchrun/accelerate launch, else cuda if available, "
        "else cpu)",
    )


def build_parser() -> argparse.ArgumentParser:
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
    """Parse, evaluate, write the report; bad input exits with one `error: ...` line."""
    parser = build_parser()
    with exit_on_bad_input():
        report = run(parse_config(EvalConfig, argv, parser))
    end_job()
    return report


def cli() -> None:
    """`gatt-eval`: `main()` with no return value (an installed command exits with the value its function returns)."""
    main()


def run(args: EvalConfig) -> dict[str, Any]:
    """The report of `args`: plan the dialogues, roll every model out on them, judge the replies, write the report
    (process 0; the other processes of a launch return {} once their share is rolled out)."""
    models = parse_models(args.model)
    repeat = list(models) if args.repeat_instruction == [] else (args.repeat_instruction or [])
    unknown = sorted(set(repeat) - set(models))
    if unknown:
        raise ValueError(f"--repeat-instruction names no --model: {', '.join(unknown)}")
    if unknown := sorted(set(args.paired_baseline) - set(models)):
        raise ValueError(f"--paired-baseline names no --model: {', '.join(unknown)}")
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
    """The dialogues without an instruction: --no-instruction-dialogues, else a quarter of --dialogues."""
    return args.dialogues // 4 if args.no_instruction_dialogues is None else args.no_instruction_dialogues


def plan(args: EvalConfig) -> tuple[dict[str, list[str]], list[EvalDialogue]]:
    """The held-out tiers' families by tier (a pattern matches several; in constraint order) and the report's
    dialogues, the held-out families and tiers kept out of the trained strata."""
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
    """report.json's settings of the dialogues and their decoding (a setting at its default left out where the
    report has always left it out)."""
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
    """report.json's `answer_gate`: the gate's thresholds and, in words, what judges a reply's relevance (with the
    turn's on-topic checks, and without them where the report has such turns: `judges_without_topic_words`)."""
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
