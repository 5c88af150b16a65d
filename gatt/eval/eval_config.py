"""The report's settings (`EvalConfig`): every flag of `python -m gatt.eval.evaluate`, each a field, and a key of its
`--config FILE.yaml`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gatt.data.checks import CONSTRAINTS_HELP
from gatt.data.events import KINDS, SHORT_PROB, SHORT_PROB_HELP, kinds_help
from gatt.eval.gate import (
    gate_flags,
)
from gatt.eval.plan import STRATA
from gatt.eval.rollout import DECODERS, GENERATE_AT_MOST
from gatt.io.config import REQUIRED, arg
from gatt.model.numerics import NUMERICS
from gatt.model.sampling import MAX_NEW_TOKENS, sampler_flags

SAMPLING_ONLY = ("temperature", "top_p")  # used by --sample only


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
            "revoke old_followed[d] and old_followed_per_family[family]; the per-turn tables are those of `first`",
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
