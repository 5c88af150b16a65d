"""SmolLM2-135M-Instruct on this machine: rollouts, the teacher and a report's relevance scorer, each side by side.

Every row runs on the real model (`gatt.model.pretrained.load_smollm2`, converted to the library's model), on
the demo's report inputs: its constraints (recipes/data/smollm2_constraints.yaml) and the built-in
held-out user turns, N dialogues x T turns, probes every 6th turn.

- `smollm2_rollout_tokens_per_s`: the report's rollouts (greedy, repetition penalty 1.2, the attention
  probe on: what `make demo-smollm2`'s report stage runs), all N dialogues in one batch, in three modes
  one after another: `before`, the path before stopped rows left the decoding batch (`shrink=False`:
  every row decodes until the longest reply ends; `baseline`), `exact` (today's fp32 path: `shrink`), and
  the fastest mode (`value`: `--numerics bf16`, gatt/model/numerics.py: bf16 weights and activations, the
  attention and its KV cache fp32). New tokens/s (each reply re-tokenised),
  `ratio` value / baseline (goal >= 2), `ceiling_share`: the value over this machine's GEMM ceiling for
  this model in the mode's dtype (GFLOP/s measured now / 2 x the Linear weights per token), `exact`: its
  rate, ratio and the share of its greedy replies identical to `before`'s (goal 1.0), `agreement`: the
  share of bf16's greedy replies identical to the exact path's, and `adherence_max_diff_points`: the
  largest per-turn difference in gated adherence between the two (checks and answer gate, trained and
  held-out values; goal within 2 points).
- `smollm2_report_scorer_share`: the relevance scorer's share of a report's wall time (the exact rollouts
  above plus the answer gate over their transcripts, judged as replies to a user's own messages: no
  topic-word checks, so every chat reply's relevance is judged), goal <= 15%. Three contrast
  scorers judge the same replies: `before` (each question and reply through the model whole), the
  library's (each question's prompt encoded once, its replies scored on that cache) and the
  same in bf16 (`--relevance-numerics bf16`); each with its share, seconds, and agreement with the
  library's exact scorer (identical verdicts, largest and mean contrast difference in nats). `judges`: each
  `--relevance-judge` (contrast: the library's scorer; embedding: all-MiniLM-L6-v2, the contrast for replies not
  in English; both) with its share and the share of its verdicts equal to the contrast's; `value` is the share of
  the strict gate's judge (`judge`).
- `smollm2_rollout_vs_hf_generate`: ours (exact, batched, KV reuse; greedy without penalty or probe, so
  that `generate()` writes the same replies) over `generate()` per turn on the re-encoded history
  (`gatt.eval.rollout.reference_rollout`) on the first R of the same dialogues (theirs takes about a
  minute a dialogue); turns/s, goal >= 3, the replies of those R dialogues identical on both sides.
- `smollm2_rollout_vs_hf_generate_batched`: ours against what a user would run instead: `generate()` batched per
  turn over all N dialogues (left-padded) on Hugging Face's own `LlamaForCausalLM` (SDPA, holding
  the same weights), re-encoding each history or carrying the batch's cache across turns (on CUDA also a static cache,
  compiled by generate()); greedy, no penalty, every decoding parameter explicit; ours with the attention probe
  on over the fastest, goal >= 2.5 (`ratio_probe_off` without the probe), identical replies per side, and
  `ceiling_share_at_most`: ours' tokens/s (at most M a turn) over the fp32 GEMM ceiling. At full size the
  baseline carries its cache only: re-encoding was 2.5x slower than carrying at 32 dialogues x 8 turns (`--quick`
  runs both), and its cost grows with the square of the turns (about 50 minutes at 64 x 20 on 2 CPU cores).
- `smollm2_teacher_vs_hf_generate_batched`: the teacher row below against the faster of two batches a user would
  write over each batch of B dialogues (left-padded): one `generate(num_return_sequences=k)` per turn re-encoding
  each history (`--quick` only: at full size its prefill of B*k rows of up to ~2,000 tokens a turn takes about 2 hours
  a batch on 2 CPU cores, measured over its first 4 turns), and one `generate()` per turn over the B*k rows
  carrying the batch's KV cache (`bench_teacher.CarriedGenerateTurn`); goal >= 2.5. Each batch runs on every side
  back to back, ours first (about 15 minutes a batch at full size, the carried cache about 60), its seconds and the GEMM rate before it kept in
  results/progress/smollm2_teacher_batched.json at full size (committed: the row spans sessions), so that a stopped
  run resumes at the next batch. Run it alone: a second process on the 2 cores slows a side by half.
- `smollm2_teacher_vs_hf_generate`: our batched teacher (`ModelTeacher`, k = 4 candidates per turn,
  dialogues in batches of B, one batch's 20 turns after another) vs a `generate(num_return_sequences=4)`
  call per dialogue and turn on the first R' dialogues; every candidate exactly M tokens on both sides (as
  in bench_teacher.py); turns/s, goal >= 4. `top_p_ms`: one top-p step on a batch's logits, ours
  (`NucleusWarper`) and Hugging Face's `TopPLogitsWarper`.

Full size: N = 64 dialogues x T = 20 turns. On 2 CPU cores the rollout and scorer rows took 48 minutes;
the generate row about 8 and the teacher row about 60 (ours alone about 50: 4 batches of 16 dialogues x 4
candidates; all 64 at once ran a 24 GB machine out of memory);
`--quick`: N = 8 x T = 4, a few minutes.

  python benchmarks/bench_smollm2.py [--quick]
"""

from __future__ import annotations

import copy
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from bench_common import comparison, main, rollout_vs_batched_generate
from bench_eval import check_identical, hugging_face_llama, identical_share
from bench_teacher import (
    SAMPLING,
    CarriedGenerateTurn,
    Turn,
    batched_generate_turn,
    draw,
    generate_turn,
    no_end_of_turn,
)
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import TopPLogitsWarper

from data_gen.synthesis import SynthesisConfig, _Dialogue
from data_gen.teacher import ModelTeacher
from gatt.data.checks import detect_language
from gatt.eval.embedding import SentenceEmbedder, sentence_embedder
from gatt.eval.gate import AnswerGate, GateConfig, RelevanceScorer
from gatt.eval.inputs import load_eval_constraints, load_eval_turns
from gatt.eval.judge import apply_gate
from gatt.eval.plan import EvalDialogue, plan_dialogues
from gatt.eval.rollout import reference_rollout, rollout
from gatt.eval.turns import RolloutConfig
from gatt.io.files import write_json
from gatt.io.machine import cpu_name, matmul_gflops
from gatt.model.numerics import bf16_is_native, for_inference
from gatt.model.sampling import NucleusWarper

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "recipes" / "data" / "smollm2_constraints.yaml"
# the full-size batched teacher row's finished batch pairs: a stopped run resumes there (delete it to start over)
TEACHER_PROGRESS = ROOT / "results" / "progress" / "smollm2_teacher_batched.json"
FULL = {
    "dialogues": 64,
    "turns": 20,
    "max_new_tokens": 64,
    "reference_dialogues": 2,
    "teacher_batch": 16,
    "teacher_reference_dialogues": 1,
    "k": 4,
    "generate_caches": ("carry",),
}
QUICK = {
    "dialogues": 8,
    "turns": 4,
    "max_new_tokens": 32,
    "reference_dialogues": 1,
    "teacher_batch": 8,
    "teacher_reference_dialogues": 1,
    "k": 4,
    "generate_caches": ("none", "carry"),
}
REPORT = {"repetition_penalty": 1.2, "measure_attention": True}  # the demo's report decoding, the probe on
Loader = Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]]


def load_model() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from gatt.model.pretrained import load_smollm2

    return load_smollm2()


def reply_tokens(tokenizer: PreTrainedTokenizerBase, transcripts: Sequence[dict]) -> int:
    """New tokens written, counted by re-tokenising each reply (the same count for both sides)."""
    replies = [turn["reply"] for t in transcripts for turn in t["turns"]]
    return sum(len(ids) for ids in tokenizer(replies, add_special_tokens=False)["input_ids"]) if replies else 0


def gemm_ceiling(model: PreTrainedModel, dtype: torch.dtype) -> tuple[float, float]:
    """(GFLOP/s of `dtype` GEMM measured now, the tokens/s that bounds for this model: 2 x its Linear weights per token)."""
    gflops = matmul_gflops(dtype)
    flops_per_token = 2 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return gflops, gflops * 1e9 / flops_per_token


def timed(run: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """`run(*args, **kwargs)` and its wall seconds (a GPU's queued work finished)."""
    start = time.perf_counter()
    out = run(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


class OnePassScorer(RelevanceScorer):
    """The scorer before prompts were shared, as it was: each (question, reply) pair through the model whole, in
    batches of similar lengths, logits only from the shortest prompt's last token on (the reference the
    shared-prompt scorer is timed and checked against)."""

    @torch.no_grad()
    def _score(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, int]]:
        rows = [
            (self._prompt(q), self.tokenizer(r, add_special_tokens=False)["input_ids"][: self.max_reply_tokens])
            for q, r in pairs
        ]
        order = sorted((i for i in range(len(rows)) if rows[i][1]), key=lambda i: len(rows[i][0]) + len(rows[i][1]))
        out: list[tuple[float, int]] = [(0.0, 0)] * len(rows)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            width = max(len(rows[i][0]) + len(rows[i][1]) for i in batch)
            ids = torch.full((len(batch), width), self._pad, dtype=torch.long)  # (B, T), right-padded
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for b, i in enumerate(batch):
                sequence = rows[i][0] + rows[i][1]
                ids[b, : len(sequence)], mask[b, : len(sequence)] = torch.tensor(sequence), 1
            first = min(len(rows[i][0]) for i in batch) - 1
            logits = self.model(
                input_ids=ids, attention_mask=mask, logits_to_keep=torch.arange(first, width - 1)
            ).logits
            logp = (
                logits.float().log_softmax(-1).gather(-1, ids[:, first + 1 :, None])[..., 0]
            )  # (B, P): log p of each next token
            for b, i in enumerate(batch):
                prompt, target = rows[i]
                begin = len(prompt) - 1 - first
                out[i] = (float(logp[b, begin : begin + len(target)].sum()), len(target))
        return out


def adherence_per_turn(transcripts: Sequence[dict]) -> dict[int, float]:
    """Gated adherence (checks and gate) per turn, over the replies that have checks (`passed` not None)."""
    by_turn: dict[int, list[bool]] = {}
    for t in transcripts:
        for turn in t["turns"]:
            if turn.get("passed") is not None:
                by_turn.setdefault(turn["turn"], []).append(bool(turn["passed"]))
    return {n: sum(v) / len(v) for n, v in sorted(by_turn.items())}


def gate_verdicts(
    transcripts: Sequence[dict],
    plan: list[EvalDialogue],
    scorer: RelevanceScorer,
    judge: str = "contrast",
    embedder: SentenceEmbedder | None = None,
) -> tuple[list[dict], float]:
    """The gate's verdict (relevance judged by `judge`) on every reply of (a copy of) `transcripts`, and the seconds
    judging took, with nothing cached (the language detector's cache cleared)."""
    judged = copy.deepcopy(list(transcripts))
    detect_language.cache_clear()
    gate = AnswerGate(GateConfig().judged_by(judge), scorer, embedder)
    _, seconds = timed(apply_gate, judged, plan, gate)
    return [turn["gate"] for t in judged for turn in t["turns"]], seconds


def rollout_rows(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: list[EvalDialogue],
    size: dict[str, Any],
    numerics: bool = True,
) -> dict[str, dict[str, Any]]:
    """The report rollouts in three modes (all dialogues in one batch each), the gate over them, the scorer's share.
    Without `numerics`, the scorer's share alone: the exact rollouts and each judge, no `before` or bf16 mode or
    scorer (about half the time)."""
    config = RolloutConfig(max_new_tokens=size["max_new_tokens"], batch_size=len(plan), **REPORT)
    modes = {"exact": (model, config)}
    if numerics:
        modes = {
            "before": (model, replace(config, shrink=False)),
            **modes,
            "bf16": (for_inference(copy.deepcopy(model), "bf16"), config),
        }
    for side, side_config in modes.values():
        rollout(side, tokenizer, plan[:1], side_config, progress=False)  # warm-up: kernels, lingua's models
    transcripts, seconds = {}, {}
    for name, (side, side_config) in modes.items():
        transcripts[name], seconds[name] = timed(rollout, side, tokenizer, plan, side_config, progress=False)
    del modes
    tokens = {name: reply_tokens(tokenizer, transcripts[name]) for name in transcripts}
    rate = {name: tokens[name] / seconds[name] for name in transcripts}

    gate = AnswerGate(GateConfig(), RelevanceScorer(model, tokenizer))
    for name in transcripts:
        apply_gate(transcripts[name], plan, gate)
    # The scorer's share: the same replies judged as replies to a user's own messages, which carry no topic-word
    # check, so the gate judges relevance by the likelihood contrast (the built-in turns never need it). Each scorer
    # starts with nothing cached.
    own_messages = [replace(d, turns=tuple(replace(t, on_topic=()) for t in d.turns)) for d in plan]
    scorers: dict[str, RelevanceScorer] = {"exact": RelevanceScorer(model, tokenizer)}
    if numerics:
        scorers = {
            "before": OnePassScorer(model, tokenizer),
            **scorers,
            "bf16": RelevanceScorer(for_inference(copy.deepcopy(model), "bf16"), tokenizer),
        }
    verdicts, judge_seconds = {}, {}
    for name, scorer in scorers.items():
        verdicts[name], judge_seconds[name] = gate_verdicts(transcripts["exact"], own_messages, scorer)
    embedder = sentence_embedder()  # loaded before the clock starts, as the scorers' model is
    for judge in ("embedding", "both"):  # each with a fresh contrast scorer, for the replies not in English
        verdicts[judge], judge_seconds[judge] = gate_verdicts(
            transcripts["exact"], own_messages, RelevanceScorer(model, tokenizer), judge, embedder
        )
    settings = {
        "dialogues": len(plan),
        "turns": size["turns"],
        "max_new_tokens": size["max_new_tokens"],
        "dialogues_per_batch": len(plan),
        **REPORT,
        "greedy": True,
        "constraints": CONSTRAINTS.name,
        "user_turns": "built-in held-out pool",
        "order": ", ".join(transcripts) + ", one after another",
        "bf16_is_native": bf16_is_native(),
        "threads": torch.get_num_threads(),
    }
    share = {name: judge_seconds[name] / (seconds["exact"] + judge_seconds[name]) for name in judge_seconds}
    relevance = {name: [v["relevance"] for v in verdicts[name] if v["relevance"] is not None] for name in verdicts}
    # each judge's share (the contrast is the library's exact scorer), and the share of its verdicts that the
    # contrast's equal; the row's value is the strict gate's judge of messages without topic words
    judges = {
        judge: {
            "share": round(share[name], 4),
            "seconds": round(judge_seconds[name], 6),
            "verdicts_identical_to_contrast": round(
                sum(a["failed"] == b["failed"] for a, b in zip(verdicts["exact"], verdicts[name]))
                / max(len(verdicts["exact"]), 1),
                4,
            ),
        }
        for judge, name in (("contrast", "exact"), ("embedding", "embedding"), ("both", "both"))
    }
    default = GateConfig.strict().relevance_judge
    scorer_row = {
        "value": judges[default]["share"],
        "unit": "share of wall time",
        "higher_is_better": False,
        "goal": 0.15,
        "met": judges[default]["share"] <= 0.15,
        "judge": default,
        "judges": judges,
        "settings": settings,
        "replies_scored": len(relevance["exact"]),
        "seconds": {"rollouts": round(seconds["exact"], 6), "answer_gate": round(judge_seconds["exact"], 6)},
    }
    if not numerics:
        return {"smollm2_report_scorer_share": scorer_row}

    def against_exact(name: str) -> dict[str, float]:
        """How `name`'s verdicts and contrasts compare with the exact scorer's, and its share of the report."""
        same = sum(a["failed"] == b["failed"] for a, b in zip(verdicts["exact"], verdicts[name]))
        diffs = [abs(a - b) for a, b in zip(relevance["exact"], relevance[name])]
        return {
            "share": round(share[name], 4),
            "seconds": round(judge_seconds[name], 6),
            "verdicts_identical": round(same / max(len(verdicts["exact"]), 1), 4),
            "relevance_max_abs_diff": round(max(diffs, default=0.0), 4),
            "relevance_mean_abs_diff": round(sum(diffs) / max(len(diffs), 1), 4),
        }

    scorer_row["before"] = against_exact("before")
    scorer_row["bf16"] = against_exact("bf16")
    scorer_row["ratio_over_before"] = round(judge_seconds["before"] / judge_seconds["exact"], 3)
    adherence = {name: adherence_per_turn(transcripts[name]) for name in ("exact", "bf16")}
    fp32_gflops, fp32_ceiling = gemm_ceiling(model, torch.float32)
    bf16_gflops, bf16_ceiling = gemm_ceiling(model, torch.bfloat16)
    rollout_row = comparison(
        rate["bf16"],
        rate["before"],
        unit="tokens/s",
        goal=2.0,
        settings=settings,
        value=round(rate["bf16"], 2),
        baseline=round(rate["before"], 2),
        mode="bf16",
        ceiling_share=round(rate["bf16"] / bf16_ceiling, 3),
        ceiling_tokens_per_s=round(bf16_ceiling, 1),
        bf16_matmul_gflops=bf16_gflops,
        fp32_matmul_gflops=fp32_gflops,
        baseline_ceiling_share=round(rate["before"] / fp32_ceiling, 3),
        fp32_ceiling_tokens_per_s=round(fp32_ceiling, 1),
        exact={
            "tokens_per_s": round(rate["exact"], 2),
            "ratio": round(rate["exact"] / rate["before"], 3),
            "ceiling_share": round(rate["exact"] / fp32_ceiling, 3),
            "identical_to_before": round(identical_share(transcripts["exact"], transcripts["before"]), 4),
        },
        agreement=round(identical_share(transcripts["bf16"], transcripts["exact"]), 4),
        adherence_per_turn=adherence,
        adherence_max_diff_points=round(
            100
            * max(
                (abs(adherence["exact"][n] - adherence["bf16"].get(n, 0.0)) for n in adherence["exact"]), default=0.0
            ),
            1,
        ),
        adherence_mean={name: round(sum(v.values()) / len(v), 4) if v else None for name, v in adherence.items()},
        tokens=tokens,
        seconds={name: round(s, 6) for name, s in seconds.items()},
    )
    return {"smollm2_rollout_tokens_per_s": rollout_row, "smollm2_report_scorer_share": scorer_row}


def generate_row(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, plan: list[EvalDialogue], size: dict[str, Any]
) -> dict[str, Any]:
    """Ours over all dialogues (one batch) vs generate() per turn on the first R, greedy, identical replies."""
    config = RolloutConfig(max_new_tokens=size["max_new_tokens"], batch_size=len(plan), decoder="engine")
    subset = plan[: size["reference_dialogues"]]
    ours, ours_seconds = timed(rollout, model, tokenizer, plan, config, progress=False)
    theirs, theirs_seconds = timed(reference_rollout, model, tokenizer, subset, config, progress=False)
    check_identical(ours[: len(subset)], theirs)
    rate = {
        "ours": sum(len(t["turns"]) for t in ours) / ours_seconds,
        "theirs": sum(len(t["turns"]) for t in theirs) / theirs_seconds,
    }
    return comparison(
        rate["ours"],
        rate["theirs"],
        unit="turns/s",
        goal=3.0,
        settings={
            "dialogues": {"ours": len(plan), "theirs": len(subset)},
            "turns": size["turns"],
            "max_new_tokens": size["max_new_tokens"],
            "greedy": True,
            "repetition_penalty": 1.0,
            "measure_attention": False,
            "theirs": "reference_rollout: generate() per turn on the re-encoded history, one dialogue at a time",
        },
        identical_replies=identical_share(ours[: len(subset)], theirs),
        seconds={"ours": round(ours_seconds, 1), "theirs": round(theirs_seconds, 1)},
    )


def batched_generate_row(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, plan: list[EvalDialogue], size: dict[str, Any]
) -> dict[str, Any]:
    """Ours over `generate()` batched per turn over all N dialogues (bench_common.rollout_vs_batched_generate), on
    Hugging Face's Llama; with our rollouts' share of the fp32 GEMM ceiling."""
    config = RolloutConfig(max_new_tokens=size["max_new_tokens"], batch_size=len(plan), decoder="engine")
    llama = hugging_face_llama(model)
    row = rollout_vs_batched_generate(
        model,
        llama,
        tokenizer,
        plan,
        config,
        goal=2.5,
        settings={"turns": size["turns"], "probe_every": 6},
        caches=size["generate_caches"],
    )
    _, ceiling = gemm_ceiling(model, torch.float32)
    tokens_per_turn = size["max_new_tokens"]  # an upper bound: the share below is at most this
    row["ceiling_share_at_most"] = round(row["turns_per_s"]["ours"] * tokens_per_turn / ceiling, 3)
    row["fp32_ceiling_tokens_per_s"] = round(ceiling, 1)
    return row


def top_p_ms(model: PreTrainedModel, size: dict[str, Any]) -> dict[str, float]:
    """Milliseconds of one top-p step on a teacher batch's logits (B = batch x k rows of the vocabulary): ours
    (`NucleusWarper`, top-k) and Hugging Face's `TopPLogitsWarper` (a full sort), medians of 20 calls."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(size["teacher_batch"] * size["k"], model.config.vocab_size, generator=generator) * 3 / 0.7
    out = {}
    for name, warper in (
        ("ours", NucleusWarper(SAMPLING["top_p"])),
        ("hugging_face", TopPLogitsWarper(SAMPLING["top_p"])),
    ):
        times = [timed(warper, None, scores)[1] for _ in range(21)][1:]
        out[name] = round(1000 * sorted(times)[len(times) // 2], 2)
    return out


def teacher_row(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    size: dict[str, Any],
    device: str = "cpu",
    batched: bool = False,
    progress: Path | None = None,
) -> dict[str, Any]:
    """Our batched teacher over N dialogues vs generate(num_return_sequences=k) per turn: per dialogue on the first
    R', or (`batched`) over each batch of B dialogues at once, left-padded, on all N.

    Both sides synthesise one batch of B dialogues after another (the caches of all 64 dialogues x 4 candidates at
    20 turns at once ran a 24 GB machine out of memory), each batch from its own seed. Batched, each batch runs on
    both sides back to back, ours first, with the machine's CPU and fp32 GEMM rate recorded before it (a row that
    spans sessions may span machines: each batch's ratio is its own machine's); with `progress`
    (a JSON file), each finished batch pair is kept there and a run of the same settings that was stopped resumes at
    the next batch (the full-size row takes hours on 2 CPU cores)."""
    config = SynthesisConfig(
        num_dialogues=size["dialogues"],
        min_turns=size["turns"],
        max_turns=size["turns"],
        samples_per_turn=size["k"],
        seed=0,
    )
    with tempfile.TemporaryDirectory() as tmp, no_end_of_turn():
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        teacher = ModelTeacher(
            tmp, max_new_tokens=size["max_new_tokens"], device=device, batch_size=size["teacher_batch"], **SAMPLING
        )

    def synthesise(side: ModelTeacher, turn: Turn, dialogues: list[_Dialogue], seed: int, desc: str) -> float:
        """Wall seconds of every turn of `dialogues`, from `seed` (a progress bar over the turns: `desc`)."""
        side.seed(seed)
        torch.manual_seed(seed)  # generate() draws from torch's global generator
        start = time.perf_counter()
        for _ in tqdm(range(config.max_turns), desc=desc, unit="turn", mininterval=30):
            turn(side, dialogues, config.samples_per_turn)
        if side.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def ours_turn(teacher: ModelTeacher, dialogues: list[_Dialogue], k: int) -> None:
        for dialogue, candidates in zip(dialogues, teacher.sample([d.request() for d in dialogues], k)):
            dialogue.replies.append(candidates[0])  # the first candidate, unchecked (as bench_teacher.py)

    batch = size["teacher_batch"]
    starts = range(0, config.num_dialogues, batch)
    with no_end_of_turn():
        if batched:  # theirs on Hugging Face's own Llama holding the same weights, each cache of `generate_caches`
            theirs = copy.copy(teacher)
            theirs.model = hugging_face_llama(teacher.model)
            baselines: dict[str, Turn] = {
                f"generate_{cache}": {"none": batched_generate_turn, "carry": CarriedGenerateTurn()}[cache]
                for cache in size["generate_caches"]
            }
            state = {"settings": {**size, "device": device}, "batches": []}
            state = json.loads(json.dumps(state))  # as the file holds it (tuples as lists)
            if progress is not None and progress.exists():
                kept = json.loads(progress.read_text())
                if kept.get("settings") == state["settings"]:
                    state = kept
            drawn = {side: draw(config) for side in ("ours", *baselines)}  # each side appends replies to its own
            for first in starts[len(state["batches"]) :]:
                dialogues = {side: drawn[side][first : first + batch] for side in drawn}
                gflops = matmul_gflops(torch.float32)
                seed = config.seed + first
                seconds = {"ours": synthesise(teacher, ours_turn, dialogues["ours"], seed, f"ours {first}")}
                for name, turn in baselines.items():
                    seconds[name] = synthesise(theirs, turn, dialogues[name], seed, f"{name} {first}")
                state["batches"].append(
                    {"first": first, "cpu": cpu_name(), "fp32_matmul_gflops": round(gflops, 1), **seconds}
                )
                if progress is not None:
                    write_json(progress, state)
            totals = {side: sum(b[side] for b in state["batches"]) for side in ("ours", *baselines)}
            best = min(baselines, key=totals.__getitem__)  # the fastest baseline
            seconds = {**totals, "theirs": totals[best]}
            theirs_dialogues = config.num_dialogues
        else:
            dialogues = draw(config)
            seconds = {
                "ours": sum(
                    synthesise(teacher, ours_turn, dialogues[first : first + batch], config.seed + first, "ours")
                    for first in starts
                ),
                "theirs": synthesise(
                    teacher, generate_turn, draw(config)[: size["teacher_reference_dialogues"]], config.seed, "theirs"
                ),
            }
            theirs_dialogues = size["teacher_reference_dialogues"]
    extra = {"batches": state["batches"], "best_baseline": best} if batched else {}
    return comparison(
        config.num_dialogues * config.max_turns / seconds["ours"],
        theirs_dialogues * config.max_turns / seconds["theirs"],
        unit="turns/s",
        goal=2.5 if batched else 4.0,
        top_p_ms=top_p_ms(model, size),
        settings={
            "dialogues": {"ours": config.num_dialogues, "theirs": theirs_dialogues},
            "turns": config.max_turns,
            "k": config.samples_per_turn,
            "max_new_tokens": size["max_new_tokens"],
            "every_candidate": "exactly max_new_tokens tokens",
            **SAMPLING,
            "dialogues_per_batch": batch,
            "theirs": (
                "model.generate(do_sample=True, top_k=0, min_new_tokens=max_new_tokens) per turn over a batch of B "
                f"dialogues, left-padded, cache {best[len('generate_') :]!r} (the fastest of "
                f"{', '.join(size['generate_caches'])}: none re-encodes each history with num_return_sequences=k, "
                "carry feeds the B*k rows only what is new, the batch's KV cache kept from turn to turn)"
                if batched
                else "model.generate(num_return_sequences=k, do_sample=True, top_k=0, "
                "min_new_tokens=max_new_tokens) per dialogue and turn"
            ),
        },
        seconds={side: round(value, 1) for side, value in seconds.items()},
        **extra,
    )


ROWS = (
    "smollm2_rollout_tokens_per_s",
    "smollm2_report_scorer_share",
    "smollm2_rollout_vs_hf_generate",
    "smollm2_teacher_vs_hf_generate",
    "smollm2_rollout_vs_hf_generate_batched",
    "smollm2_teacher_vs_hf_generate_batched",
)
CPU_ROWS = ROWS[:2]  # bf16 and int8 against the exact path on the CPU, and the CPU scorer's share


def run(quick: bool, device: str, load: Loader = load_model, only: Sequence[str] = ROWS) -> dict[str, dict[str, Any]]:
    """The rows in `only` (default all; the rollout and scorer rows come from one measurement). On a GPU, the rows
    against generate(); the rollout and scorer rows measure CPU numerics (bf16, int8) and run on the CPU only."""
    if device != "cpu" and set(only) & set(CPU_ROWS):
        raise ValueError(f"bench_smollm2: {', '.join(sorted(set(only) & set(CPU_ROWS)))} measure the CPU paths")
    size = QUICK if quick else FULL
    model, tokenizer = load()
    model.to(device).eval()
    plan = plan_dialogues(
        load_eval_constraints(CONSTRAINTS),
        load_eval_turns(),
        dialogues=size["dialogues"],
        turns=size["turns"],
        seed=0,
        probe_every=6,
    )
    results: dict[str, dict[str, Any]] = {}
    if {"smollm2_rollout_tokens_per_s", "smollm2_report_scorer_share"} & set(only):
        results.update(rollout_rows(model, tokenizer, plan, size, numerics="smollm2_rollout_tokens_per_s" in only))
    if "smollm2_rollout_vs_hf_generate" in only:
        results["smollm2_rollout_vs_hf_generate"] = generate_row(model, tokenizer, plan, size)
    if "smollm2_teacher_vs_hf_generate" in only:
        results["smollm2_teacher_vs_hf_generate"] = teacher_row(model, tokenizer, size, device)
    if "smollm2_rollout_vs_hf_generate_batched" in only:
        results["smollm2_rollout_vs_hf_generate_batched"] = batched_generate_row(model, tokenizer, plan, size)
    if "smollm2_teacher_vs_hf_generate_batched" in only:
        results["smollm2_teacher_vs_hf_generate_batched"] = teacher_row(
            model, tokenizer, size, device, batched=True, progress=None if quick else TEACHER_PROGRESS
        )
    name = "SmolLM2-135M-Instruct as GattForCausalLM, fp32" if load is load_model else type(model).__name__
    for result in results.values():
        result["settings"]["model"] = name
    return results


if __name__ == "__main__":
    main(run, __doc__)
