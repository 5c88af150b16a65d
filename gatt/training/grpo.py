"""Past the teacher: reinforcement learning on the checks with TRL's `GRPOTrainer`, in the GAtt setting.

GAtt distils the reminded model, so it keeps at best what the reminded model does. Here the model learns from a
verifier instead (RL with verifiable rewards, as IFBench's IF-RLVR):

* **Prompts** are multi-turn dialogue prefixes with the instruction given once, in turn one (the GAtt setting): the
  start model rolls out dialogues of the train split's constraints (`gatt.eval.rollout`, greedy, its own replies),
  and each dialogue is cut at `prompts_per_dialogue` distinct turns drawn from 2..`prompt_turns`. A prompt is the
  history before that turn and the turn's user message; the completion is the model's reply.
* **The reward** of a reply is the share of the checks of the instructions in force that it passes, times the answer
  gate's verdict: a reply that is not a real answer (empty, a loop, a repeat, off topic, an echo, a template, word
  salad) earns 0 whatever its checks say. Relevance is judged by the embedding judge (all-MiniLM-L6-v2,
  `gatt.eval.embedding`) and topic words, never by the model being trained, so the policy cannot move its own judge.
* **Training** is TRL's GRPO (group-relative advantages over `num_generations` completions a prompt; completions from
  TRL's own `generate()`), with the GAtt recipe's chat template, LoRA and mixed precision; checkpoints every
  `save_steps`, resumed by `--resume`; `output_dir/final` is a merged, `from_pretrained`-loadable model.

`grpo.json` in `output_dir` records the run: steps, seconds per step, the share of it spent generating, the reward,
check and gate curves.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import TrainerCallback, TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from trl import GRPOConfig, GRPOTrainer

from gatt.data.check_types import Check
from gatt.data.checks import Constraint, hold_out_families, load_constraints
from gatt.eval.cache import weight_files
from gatt.eval.gate import AnswerGate, GateConfig, GateItem, GateTurn, gate_flags, relevance_embedder
from gatt.eval.inputs import EvalTurn, load_eval_constraints
from gatt.eval.non_answers import words
from gatt.eval.plan import EvalDialogue, plan_dialogues
from gatt.eval.rollout import rollout
from gatt.eval.turns import RolloutConfig
from gatt.io.config import REQUIRED, arg
from gatt.io.files import atomic_path, write_json, write_text
from gatt.model.chat_model import load_chat_model
from gatt.model.embedded import model_path
from gatt.model.numerics import resolve_auto
from gatt.model.sampling import MAX_NEW_TOKENS, SAMPLER_DEFAULTS
from gatt.training.building import lora_config

PROMPTS = "prompts"  # output_dir/prompts/: prompts.jsonl and settings.json, kept when only GRPO's own knobs change
SUMMARY = "grpo.json"


@dataclass
class GRPOGattConfig(gate_flags(relevance_judge=False)):
    """Every knob of a GRPO run on the checks; recipes/configs/grpo_gatt.yaml mirrors it."""

    model: str = arg(REQUIRED, "the model to start from: a GAtt model's folder (or any chat model; `embedded`)")
    output_dir: str = arg(REQUIRED, "where prompts/, checkpoints, grpo.json and the final model go")
    seed: int = arg(0, "prompt draws, sampling and data order")
    # the prompts
    constraints: str = arg("", "a constraints YAML with split tags; its train split is trained (default: built-in)")
    heldout_families: list[str] = arg([], "families held out whole (never in a prompt)", nargs="*")
    user_turns: str = arg(
        "",
        "the prompts' user messages, a file as gatt.eval.evaluate takes (default: data_gen's built-in training ones)",
    )
    prompt_dialogues: int = arg(64, "dialogues the start model rolls out for the prompts")
    prompt_turns: int = arg(20, "each dialogue's turns: prompts are cut at turns 2..prompt_turns")
    prompts_per_dialogue: int = arg(4, "distinct turns each dialogue is cut at")
    probe_every: int = arg(4, "an attribute probe every N turns from turn 2 (probe-only families)")
    rollout_batch_size: int = arg(64, "dialogues rolled out together for the prompts")
    max_new_tokens: int = arg(MAX_NEW_TOKENS, "tokens a reply may have: the rollouts' and every completion's")
    repetition_penalty: float = arg(
        SAMPLER_DEFAULTS["repetition_penalty"],
        "over the reply being written, in the rollouts and completions; 1.0: off",
    )
    # GRPO (TRL's GRPOConfig)
    num_generations: int = arg(4, "completions sampled per prompt: the group its advantages are relative to")
    batch_size: int = arg(16, "completions per optimizer step (batch_size / num_generations prompts)")
    gradient_accumulation_steps: int = arg(1, "micro-batches per optimizer step (batch_size must divide by it)")
    max_steps: int = arg(50, "optimizer steps")
    learning_rate: float = arg(5e-5, "peak learning rate (linear decay)")
    warmup_steps: int = arg(0, "linear warm-up steps")
    beta: float = arg(0.0, "KL coefficient against the start model (0: no reference model, TRL's default)")
    temperature: float = arg(SAMPLER_DEFAULTS["temperature"], "sampling temperature of the completions")
    top_p: float = arg(SAMPLER_DEFAULTS["top_p"], "nucleus sampling of the completions")
    max_grad_norm: float = arg(1.0, "gradient clipping norm")
    gradient_checkpointing: bool = arg(
        False, "recompute activations in the backward pass (TRL's default: less memory, a third more compute)"
    )
    mixed_precision: str = arg(
        "auto", "no, bf16, or auto (bf16 where the CPU or GPU has fast bf16 arithmetic)", choices=["no", "bf16", "auto"]
    )
    # LoRA (lora_r = 0: full fine-tune)
    lora_r: int = arg(16, "LoRA rank; 0: full fine-tune")
    lora_alpha: int = arg(32, "LoRA alpha")
    lora_dropout: float = arg(0.0, "LoRA dropout")
    lora_targets: list[str] = arg(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "modules LoRA adapts", nargs="+"
    )
    # bookkeeping
    save_steps: int = arg(10, "a checkpoint every N steps (a killed run resumes from the newest)")
    logging_steps: int = arg(1, "a metrics.jsonl line every N steps")

    def validate(self, source: str = "config") -> None:
        """Refuse inconsistent settings, naming the keys.

        Args:
            source: Where the settings were read, named in errors (default "config").

        Raises:
            ValueError: When batch_size does not divide by gradient_accumulation_steps or by num_generations,
                num_generations is below 2, prompt_turns is below 2, prompts_per_dialogue is below 1 or above
                prompt_turns - 1, or one of prompt_dialogues, max_steps, max_new_tokens and save_steps is below 1.
        """
        problems = []
        if self.batch_size % self.gradient_accumulation_steps:
            problems.append("batch_size must divide by gradient_accumulation_steps")
        if self.num_generations < 2 or self.batch_size % self.num_generations:
            problems.append("num_generations must be >= 2 and divide batch_size (a group's rewards are compared)")
        if self.prompt_turns < 2 or self.prompts_per_dialogue < 1:
            problems.append("prompt_turns must be >= 2 and prompts_per_dialogue >= 1")
        if self.prompts_per_dialogue > self.prompt_turns - 1:
            problems.append(f"prompts_per_dialogue must be at most prompt_turns - 1 = {self.prompt_turns - 1}")
        if min(self.prompt_dialogues, self.max_steps, self.max_new_tokens, self.save_steps) < 1:
            problems.append("prompt_dialogues, max_steps, max_new_tokens and save_steps must be >= 1")
        if problems:
            raise ValueError(f"{source}: {'; '.join(problems)}")

    @property
    def prompt_settings(self) -> dict[str, Any]:
        """What the prompts depend on besides the start model's weights.

        Prompts made with other settings are made again.
        """
        keys = ("model", "seed", "constraints", "heldout_families", "user_turns", "prompt_dialogues", "prompt_turns")
        keys += ("prompts_per_dialogue", "probe_every", "max_new_tokens", "repetition_penalty")
        return {key: getattr(self, key) for key in keys}


def train_constraints(config: GRPOGattConfig) -> list[Constraint]:
    """The constraints whose train split the prompts are drawn from (held-out families moved to the held-out split).

    Args:
        config: The run's config: its `constraints` file (default the built-in ones) and `heldout_families`.

    Returns:
        Every constraint, with its split.
    """
    constraints = load_constraints(config.constraints) if config.constraints else load_eval_constraints()
    if config.heldout_families:
        constraints = hold_out_families(constraints, config.heldout_families, config.constraints or "built-in")
    return constraints


def prompt_dialogues(config: GRPOGattConfig, turns: Sequence[EvalTurn]) -> list[EvalDialogue]:
    """The dialogues the start model rolls out: trained values only, the instruction in turn one, full or short.

    Args:
        config: The run's config: `prompt_dialogues` dialogues of `prompt_turns` turns, drawn with `seed`, a probe
            every `probe_every` turns.
        turns: The user messages the dialogues' turns are drawn from.

    Returns:
        The planned dialogues (`plan_dialogues`).
    """
    return plan_dialogues(
        train_constraints(config),
        turns,
        dialogues=config.prompt_dialogues,
        turns=config.prompt_turns,
        seed=config.seed,
        probe_every=config.probe_every,
        strata=("train",),
    )


def prompt_records(
    transcripts: Sequence[dict[str, Any]], dialogues: Sequence[EvalDialogue], config: GRPOGattConfig
) -> list[dict[str, Any]]:
    """Each dialogue cut at `prompts_per_dialogue` distinct turns in 2..`prompt_turns` (its own rollout before the cut).

    A cut needs every turn before it, so a dialogue whose rollout stopped early is cut only within it; the cuts are
    drawn with `config.seed` and the dialogue's id.

    Args:
        transcripts: The start model's rollouts of `dialogues`.
        dialogues: The planned dialogues, by id.
        config: The run's config (`prompts_per_dialogue`, `prompt_turns`, `seed`).

    Returns:
        One record a cut: `prompt` (chat messages, the instruction in the system message of turn one), the
        dialogue's id, turn, family and instruction, and what the reward needs: the turn's kind and user message, its
        checks and on-topic checks, and the earlier turns (with their on-topic checks), the last three as JSON strings
        (a dataset column holds one type).
    """
    by_id = {d.id: d for d in dialogues}
    records = []
    for transcript in transcripts:
        dialogue, done = by_id[transcript["id"]], transcript["turns"]
        rng = random.Random(f"{config.seed}-{dialogue.id}-cuts")
        candidates = range(2, min(config.prompt_turns, len(done) + 1) + 1)  # a cut needs every turn before it
        for t in sorted(rng.sample(candidates, min(config.prompts_per_dialogue, len(candidates)))):
            planned, history = dialogue.turns[t - 1], done[: t - 1]
            messages = [{"role": "system", "content": dialogue.instruction or ""}]
            for turn in history:
                messages += [{"role": "user", "content": turn["user"]}, {"role": "assistant", "content": turn["reply"]}]
            messages.append({"role": "user", "content": planned.user})
            earlier = [
                {"user": p.user, "reply": turn["reply"], "kind": p.kind, "on_topic": [c.to_dict() for c in p.on_topic]}
                for p, turn in zip(dialogue.turns, history, strict=False)
            ]
            records.append(
                {
                    "prompt": messages,
                    "dialogue": dialogue.id,
                    "turn": t,
                    "family": dialogue.constraint.family if dialogue.constraint else "",
                    "instruction": dialogue.instruction or "",
                    "kind": planned.kind,
                    "user": planned.user,
                    "checks": json.dumps([c.to_dict() for c in planned.checks]),
                    "on_topic": json.dumps([c.to_dict() for c in planned.on_topic]),
                    "earlier": json.dumps(earlier),
                }
            )
    return records


def reward_gate(config: GRPOGattConfig) -> GateConfig:
    """The reward's answer gate: the report's (strict for a real chat model), relevance judged by the embedding judge.

    The embedding judge judges relevance wherever a judge is asked, so no verdict comes from the model being trained.

    Args:
        config: The run's config (`strict_gate`).

    Returns:
        The gate's config.
    """
    return (GateConfig.strict() if config.strict_gate else GateConfig()).judged_by("embedding")


def _checks(spec: str) -> tuple[Check, ...]:
    return tuple(Check.from_dict(c) for c in json.loads(spec))


class ChecksAndGateReward:
    """GRPO's reward: the share of the turn's checks a reply passes, 0 for a reply the answer gate fails.

    Called by TRL with the batch's prompts, completions and dataset columns; it also logs the batch's share of replies
    that pass every check (`checks`), of real answers (`real_answer`) and their mean length in words (`words`).
    """

    __name__ = "checks_and_gate"

    def __init__(self, gate: GateConfig, device: str = "cpu") -> None:
        """Build the answer gate, with its embedding judge where `gate` uses one.

        Args:
            gate: The gate's config (`reward_gate`).
            device: The device of the embedding judge's model (default "cpu").
        """
        self.gate = AnswerGate(gate, embedder=relevance_embedder(gate, device))

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        *,
        checks: Sequence[str],
        on_topic: Sequence[str],
        earlier: Sequence[str],
        user: Sequence[str],
        kind: Sequence[str],
        instruction: Sequence[str],
        log_metric: Any = None,
        **_: Any,
    ) -> list[float]:
        """The rewards of a batch of completions, one a completion.

        Args:
            prompts: The batch's prompts (unused: the dataset columns carry what the reward needs).
            completions: The completions: texts, or chat messages whose last one is the reply.
            checks: Each prompt's turn checks, as JSON.
            on_topic: Each prompt's on-topic checks, as JSON.
            earlier: Each prompt's earlier turns, as JSON.
            user: Each prompt's user message.
            kind: Each prompt's turn kind ("chat" or "probe").
            instruction: Each prompt's instruction.
            log_metric: TRL's callable that logs a named metric, or None: nothing logged.

        Returns:
            Each reply's share of passed checks (1.0 without checks), or 0.0 where the gate fails it.
        """
        replies = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        items = [
            GateItem(
                GateTurn(user[i], reply, kind[i], _checks(on_topic[i])),
                tuple(
                    GateTurn(e["user"], e["reply"], e["kind"], _checks(json.dumps(e["on_topic"])))
                    for e in json.loads(earlier[i])
                ),
                (),
                instruction[i],
            )
            for i, reply in enumerate(replies)
        ]
        verdicts = self.gate.judge(items)
        passes = [[c.passes(reply) for c in _checks(spec)] for reply, spec in zip(replies, checks, strict=True)]
        shares = [sum(p) / len(p) if p else 1.0 for p in passes]
        if log_metric is not None:
            log_metric("checks", sum(all(p) for p in passes) / len(passes))
            log_metric("real_answer", sum(v.passed for v in verdicts) / len(verdicts))
            log_metric("words", sum(len(words(reply)) for reply in replies) / len(replies))
        return [share if verdict.passed else 0.0 for share, verdict in zip(shares, verdicts, strict=True)]


def make_prompts(config: GRPOGattConfig, turns: Sequence[EvalTurn], *, progress: bool = True) -> list[dict[str, Any]]:
    """The prompt records of `output_dir/prompts/prompts.jsonl`, made where needed.

    The file is read where it was made with these settings and the same start model's weight files, else the
    dialogues are rolled out and the file written whole. The settings (`prompt_settings` and the weight files) are
    written to `output_dir/prompts/settings.json`.

    Args:
        config: The run's config.
        turns: The user messages the dialogues' turns are drawn from.
        progress: Show the rollout's progress bar (default True).

    Returns:
        The prompt records (`prompt_records`).
    """
    folder = Path(config.output_dir) / PROMPTS
    path, settings_path = folder / "prompts.jsonl", folder / "settings.json"
    start = model_path(config.model)
    settings = json.loads(json.dumps({**config.prompt_settings, "weights": weight_files(start)}))
    if path.exists() and settings_path.exists() and json.loads(settings_path.read_text()) == settings:
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    dialogues = prompt_dialogues(config, turns)
    model, tokenizer = load_chat_model(start)
    rollout_config = RolloutConfig(
        max_new_tokens=config.max_new_tokens,
        batch_size=config.rollout_batch_size,
        repetition_penalty=config.repetition_penalty,
    )
    records = prompt_records(rollout(model, tokenizer, dialogues, rollout_config, progress=progress), dialogues, config)
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    write_json(settings_path, settings)
    return records


def summarize(log_history: Sequence[dict[str, Any]], seconds: float, generation_seconds: float) -> dict[str, Any]:
    """The run's record (grpo.json's curves and timing).

    Per logged step the reward, the logged shares and the step's seconds, and the share of this attempt's `seconds`
    that went into generating completions.

    Args:
        log_history: The trainer's log entries (TRL's `step_time` is the step's seconds, generation included; kept in
            the checkpoints, so a resumed run's curve is whole).
        seconds: This attempt's training time.
        generation_seconds: This attempt's time generating completions.

    Returns:
        `{"steps", "seconds_per_step", "seconds_this_attempt", "generation_share", "curve"}`: `curve` has one point
        per entry with a reward; `seconds_per_step` (None without step times) is the mean `step_time`; the share is
        None without `seconds`.
    """
    keys = ("reward", "reward_std", "frac_reward_zero_std", "checks", "real_answer", "words", "step_time")
    curve = [
        {"step": e["step"], **{key: round(e[key], 4) for key in keys if key in e}} for e in log_history if "reward" in e
    ]
    times = [point["step_time"] for point in curve if "step_time" in point]
    return {
        "steps": curve[-1]["step"] if curve else 0,
        "seconds_per_step": round(sum(times) / len(times), 2) if times else None,
        "seconds_this_attempt": round(seconds, 1),
        "generation_share": round(generation_seconds / seconds, 3) if seconds else None,
        "curve": curve,
    }


def grpo_arguments(config: GRPOGattConfig, checkpoints: Path, *, bf16: bool, device: str) -> GRPOConfig:
    """TRL's `GRPOConfig` for a run of `config`.

    Args:
        config: The run's config.
        checkpoints: Where TRL writes its checkpoints.
        bf16: Whether to train in bf16 mixed precision.
        device: "cuda" or "cpu".

    Returns:
        The arguments of `GRPOTrainer`: a linear schedule, TRL's sampling from the config's sampler settings, one
        checkpoint every `save_steps`, no reporting.
    """
    return GRPOConfig(
        output_dir=str(checkpoints),
        seed=config.seed,
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps,
        lr_scheduler_type="linear",
        max_grad_norm=config.max_grad_norm,
        gradient_checkpointing=config.gradient_checkpointing,
        per_device_train_batch_size=config.batch_size // config.gradient_accumulation_steps,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_generations=config.num_generations,
        max_completion_length=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        repetition_penalty=config.repetition_penalty,
        beta=config.beta,
        bf16=bf16,
        use_cpu=device == "cpu",
        save_steps=config.save_steps,
        save_strategy="steps",
        logging_steps=config.logging_steps,
        report_to="none",
        remove_unused_columns=False,
        disable_tqdm=False,
    )


def train_grpo(config: GRPOGattConfig, turns: Sequence[EvalTurn], *, resume: bool = False) -> dict[str, Any]:
    """Make the prompts, run TRL's GRPO from `config.model` and save `output_dir/final` with `grpo.json`.

    A run whose newest checkpoint already reached `max_steps` takes no more steps; it only saves.

    Args:
        config: The run's config.
        turns: The user messages of the prompts' dialogues.
        resume: Resume from the newest checkpoint in `output_dir/checkpoints` (default False).

    Returns:
        The summary written to grpo.json: `settings`, `prompts` (their count), `mixed_precision` and `summarize`'s
        record; {} on every process but the main one.

    Raises:
        ValueError: When the config's settings are inconsistent (`GRPOGattConfig.validate`).
    """
    config.validate()
    out = Path(config.output_dir)
    records = make_prompts(config, turns)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = resolve_auto(config.mixed_precision, device, "bf16", "no", "mixed_precision") == "bf16"
    model, tokenizer = load_chat_model(model_path(config.model), device=device)
    args = grpo_arguments(config, out / "checkpoints", bf16=bf16, device=device)
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[ChecksAndGateReward(reward_gate(config), device)],
        args=args,
        train_dataset=datasets.Dataset.from_list(records),
        processing_class=tokenizer,
        peft_config=lora_config(config) if config.lora_r > 0 else None,
    )
    checkpoints = sorted((out / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    checkpoint = checkpoints[-1] if resume and checkpoints else None
    state = TrainerState.load_from_json(str(checkpoint / TRAINER_STATE_NAME)) if checkpoint else None
    start = time.perf_counter()
    if state and state.global_step >= config.max_steps:
        # A finished run (killed while saving `final`, or whose steps ran elsewhere): train() would take one more step.
        trainer._load_from_checkpoint(str(checkpoint))
        trainer.state = state
    else:
        trainer.add_callback(MetricsFile(out / "metrics.jsonl", state.global_step if state else 0))
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    seconds = time.perf_counter() - start
    if not trainer.accelerator.is_main_process:
        return {}
    final = trainer.accelerator.unwrap_model(trainer.model)
    final = final.merge_and_unload() if config.lora_r > 0 else final
    with atomic_path(out / "final") as folder:
        final.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    summary = {
        "settings": asdict(config),
        "prompts": len(records),
        "mixed_precision": "bf16" if bf16 else "no",
        **summarize(trainer.state.log_history, seconds, trainer.generation_seconds),
    }
    write_json(out / SUMMARY, summary)
    return summary


class TimedGRPOTrainer(GRPOTrainer):
    """TRL's GRPO, timing its completions' generation (`generation_seconds`) to set against the whole step."""

    generation_seconds = 0.0

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.generation_seconds += time.perf_counter() - start


class MetricsFile(TrainerCallback):
    """Each log line of the run into a JSONL file; a resumed run keeps the lines up to its checkpoint's step."""

    def __init__(self, path: Path, resumed_at: int) -> None:
        """Start the file, keeping its lines up to `resumed_at`.

        Args:
            path: The JSONL file (metrics.jsonl).
            resumed_at: The step the run resumes from; 0: a fresh run, the file starts empty.
        """
        self.path = path
        kept = path.read_text().splitlines() if resumed_at and path.exists() else []
        write_text(path, "".join(line + "\n" for line in kept if line and json.loads(line)["step"] <= resumed_at))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        """Append the logs as one line with the step, on the main process only.

        Args:
            args: The trainer's arguments (unused).
            state: The trainer's state: its `global_step` and whether this is the main process.
            control: The trainer's control (unused).
            logs: The logged values (None or empty: nothing written).
        """
        if logs and state.is_world_process_zero:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": state.global_step, **logs}) + "\n")
