"""The training loop: GAtt (or plain SFT) fine-tuning with Accelerate.

`TrainConfig` lists every knob; a YAML config mirrors it field for field and unknown keys are refused.
One optimizer step consumes `batch_size` records (a global batch), split into
`gradient_accumulation_steps` micro-batches and across processes. The loss of a step is the sum of
the token losses over the whole global batch divided by its supervised-token count, so 1 process and
N processes follow the same trajectory. The batch order is a pure function of (seed, step), which is
the data position a checkpoint needs: a resumed run continues exactly where the killed one was.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
import weakref
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

import gatt  # noqa: F401  (registers the "gatt" model type and attention)
from gatt.data.collator import IGNORE_INDEX, GAttCollator
from gatt.io.distributed import check_launch, last_reference_in_python, on_cpu
from gatt.io.files import atomic_path, write_text
from gatt.model.modeling import GattForCausalLM
from gatt.model.numerics import resolve_auto
from gatt.training.building import (
    build_model,
    build_tokenizer,
    learning_rate_schedule,
    load_start_model,
)
from gatt.training.distill import hidden_distance, layer_outputs
from gatt.training.train_config import TrainConfig, check_input_files, load_config, read_records, split_records

logger = logging.getLogger(__name__)


@dataclass
class TrainState:
    """What a checkpoint adds to the model, optimizer, scheduler and RNG states: the step."""

    step: int = 0

    def state_dict(self) -> dict[str, int]:
        """The step, as a checkpoint saves it.

        Returns:
            {"step": the step}.
        """
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the step from a checkpoint.

        Args:
            state: What `state_dict` returned.
        """
        self.step = state["step"]


TEACHER_KEYS = ("teacher_input_ids", "teacher_attention_mask", "teacher_position_ids", "distill_index")


def without_teacher(
    batch: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """The model's inputs, and the teacher view's tensors where the collator made them (GAttCollator teacher_view).

    Args:
        batch: A collated batch, with the teacher view's tensors (TEACHER_KEYS) where the collator made them.

    Returns:
        The batch without the teacher keys and the teacher view's tensors; the batch itself and None when it has no
        teacher view.
    """
    if TEACHER_KEYS[0] not in batch:
        return batch, None
    return {k: v for k, v in batch.items() if k not in TEACHER_KEYS}, {k: batch[k] for k in TEACHER_KEYS if k in batch}


def batch_indices(num_records: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The records of optimizer step `step`: epochs of seeded permutations, concatenated.

    A pure function of (seed, step): a resumed run draws the batches the killed one would have.

    Args:
        num_records: How many training records there are.
        batch_size: Records per optimizer step (the global batch).
        seed: The run's seed; each epoch's permutation is seeded by it and the epoch's number.
        step: The optimizer step, from 0.

    Returns:
        The step's `batch_size` record indices (an epoch may end within them).
    """
    start = step * batch_size
    out: list[int] = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), num_records)
        order = torch.randperm(num_records, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
        out += order[offset : offset + batch_size - len(out)]
    return out


EPOCHS_WARNING = 10  # past this many passes over the data a small run memorises it


def sized_to_data(config: TrainConfig, records: int, replay: int, acc: Accelerator) -> TrainConfig:
    """The config with max_steps set (from num_epochs where that is given), after printing the plan.

    The plan: records (replay among them), epochs and steps; a warning past EPOCHS_WARNING epochs.

    Args:
        config: The run's config.
        records: How many training records there are, replay included.
        replay: How many of them are replay records.
        acc: The accelerator, which prints the plan.

    Returns:
        A copy of `config` whose `max_steps` is set, to `ceil(num_epochs x records / batch_size)` when it was 0.
    """
    steps = config.max_steps or math.ceil(config.num_epochs * records / config.batch_size)
    epochs = steps * config.batch_size / records
    mix = f" ({replay} of them replay)" if replay else ""
    acc.print(
        f"training on {records} records{mix}: {steps} steps of {config.batch_size} records = {epochs:.1f} epochs"
        + (f" (num_epochs={config.num_epochs:g})" if config.num_epochs else "")
    )
    if epochs > EPOCHS_WARNING:
        logger.warning(
            "%.0f epochs over %d records: a run this long memorises its data (TRL's default is 3 epochs); set "
            "num_epochs, lower max_steps or generate more dialogues",
            epochs,
            records,
        )
    return dataclasses.replace(config, max_steps=steps)


class Trainer:
    """Holds the run's pieces; `train()` runs (or resumes) it to `max_steps`.

    Args:
        config: The run's config; the records that do not fit `max_length` are left out (with a warning).

    Raises:
        FileNotFoundError: When a data file or model folder the config names is missing.
        ValueError: When no training record fits `max_length`, or the launch cannot run the settings (merge_lora
            over sharded weights, a batch_size that does not split over processes and micro-batches, accumulation
            under DeepSpeed).
    """

    def __init__(self, config: TrainConfig) -> None:
        check_input_files(config)  # before any set-up: a missing file is named at once
        self.config = config
        self.out = Path(config.output_dir)
        precision = {}
        if config.mixed_precision is not None:
            device = "cpu" if on_cpu() or not torch.cuda.is_available() else "cuda"
            precision["mixed_precision"] = resolve_auto(config.mixed_precision, device, "bf16", "no", "mixed_precision")
        self.accelerator = Accelerator(cpu=on_cpu(), log_with="tensorboard", project_dir=str(self.out), **precision)
        check_launch(self.accelerator.num_processes)
        set_seed(config.seed)
        self._check_layout(config)
        self.train_records, self.eval_records, replayed = split_records(config)
        if config.recovery_share:
            copies = sum("recovery" in record.get("meta", {}) for record in self.train_records)
            self.accelerator.print(f"{copies} recovery copies among the training records (gatt/data/recovery.py)")
        self.tokenizer = build_tokenizer(config, self.train_records, self.out / "tokenizer")
        self.collator = GAttCollator(
            self.tokenizer,
            mode=config.mode,
            instruction_placement=config.instruction_placement,
            max_length=config.max_length,
            packing=config.packing,
            padding_free=config.padding_free,
            teacher_view=config.distill_weight > 0,
            teacher_rendering=config.distill_view,
        )
        fitting = [r for r in self.train_records if self.collator.fits(r)]
        if not fitting:
            raise ValueError(f"{config.train_file}: no record fits max_length={config.max_length}; raise max_length")
        if len(fitting) < len(self.train_records):  # else a process could draw a micro-batch with nothing to train on
            logger.warning(
                "%d of %d training records do not fit max_length=%d: left out",
                len(self.train_records) - len(fitting),
                len(self.train_records),
                config.max_length,
            )
        self.train_records = fitting
        self.config = config = sized_to_data(config, len(fitting), replay=replayed, acc=self.accelerator)
        model = build_model(config, self.tokenizer)
        decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=config.learning_rate,
        )
        scheduler = learning_rate_schedule(config, optimizer)
        # The scheduler stays unprepared: Accelerate would step it once per process for every optimizer step.
        # Our model computes the training loss without the full (B, T, V) logits; others get the stock call.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.loss_kwargs = {"skip_logits": True} if isinstance(base, GattForCausalLM) else {}
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.teacher = None  # the frozen start model that read the reminded dialogues (distill_weight > 0)
        if config.distill_weight > 0:
            self.teacher = load_start_model(config).requires_grad_(False).eval().to(self.accelerator.device)
        self.scheduler = scheduler
        self.state = TrainState()
        self.accelerator.register_for_checkpointing(self.scheduler, self.state)

    def _check_layout(self, config: TrainConfig) -> None:
        """Refuse settings the launch cannot run: merging LoRA over shards, a batch that does not split over the
        processes and micro-batches, accumulation under DeepSpeed (whose micro-batch size is set here)."""
        world = self.accelerator.num_processes
        if self._sharded() and config.lora_r > 0 and config.merge_lora:
            # merge_and_unload would run on one process's shards: save the adapter, merge it after training.
            raise ValueError(
                f"merge_lora=true is not supported under {self.accelerator.distributed_type.value}: set "
                "merge_lora=false (the adapter is saved; merge it afterwards with peft's merge_and_unload)"
            )
        if config.batch_size % (config.gradient_accumulation_steps * world):
            raise ValueError(
                f"batch_size ({config.batch_size}) must be divisible by gradient_accumulation_steps x processes "
                f"({config.gradient_accumulation_steps} x {world})"
            )
        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            # Accelerate steps the DeepSpeed engine inside every backward() unless accelerator.accumulate() is in use;
            # train_step accumulates with no_sync instead, so k micro-batches would be k optimizer steps.
            if config.gradient_accumulation_steps != 1:
                raise ValueError(
                    "gradient_accumulation_steps must be 1 under DeepSpeed (raise batch_size instead), got "
                    f"{config.gradient_accumulation_steps}"
                )
            # No dataloader is prepared, so Accelerate cannot infer DeepSpeed's micro-batch size: give it (bookkeeping only).
            self.accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = (
                config.batch_size // world
            )

    # -- one step ------------------------------------------------------------------------------

    def _micro_batches(self, step: int) -> list[dict[str, torch.Tensor]]:
        """This process's micro-batches of the step's global batch."""
        config, acc = self.config, self.accelerator
        indices = batch_indices(len(self.train_records), config.batch_size, config.seed, step)
        micro = config.batch_size // config.gradient_accumulation_steps
        batches = []
        for m in range(config.gradient_accumulation_steps):
            chunk = indices[m * micro : (m + 1) * micro][acc.process_index :: acc.num_processes]
            batches.append(
                {k: v.to(acc.device) for k, v in self.collator([self.train_records[i] for i in chunk]).items()}
            )
        return batches

    def _global_count(self, value: float) -> torch.Tensor:
        return self.accelerator.reduce(torch.tensor(float(value), device=self.accelerator.device), reduction="sum")

    def train_step(self, step: int) -> dict[str, float]:
        """One optimizer step over the global batch.

        Args:
            step: The optimizer step, from 0, which picks the global batch (`batch_indices`).

        Returns:
            The step's metrics: `loss` (mean over supervised tokens), `supervised_tokens`, `grad_norm`, and
            `distill` (the hidden-state term, mean over processes) when distilling.
        """
        batches = self._micro_batches(step)
        local_tokens = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
        global_tokens = self._global_count(local_tokens)
        world = self.accelerator.num_processes
        step_loss = torch.zeros((), device=self.accelerator.device)
        step_distill = torch.zeros((), device=self.accelerator.device)
        self.model.train()
        for i, batch in enumerate(batches):
            batch, teacher_batch = without_teacher(batch)
            sync = i == len(batches) - 1
            context = self.accelerator.no_sync(self.model) if not sync else nullcontext()
            states = layer_outputs(self.model) if self.teacher is not None else nullcontext([])
            with context, self.accelerator.autocast(), states as student:
                # Sum over tokens / global count; DDP averages gradients over processes, hence x world.
                loss = self.model(**batch, num_items_in_batch=global_tokens, use_cache=False, **self.loss_kwargs).loss
                loss = loss * world
                if self.teacher is not None and teacher_batch is not None and len(teacher_batch["distill_index"]):
                    distill = self._distill(student, teacher_batch) / len(batches)
                    step_distill += distill.detach()
                    loss = loss + self.config.distill_weight * distill
                self.accelerator.backward(loss)
            step_loss += loss.detach() / world
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = {
            "loss": float(self._global_count(step_loss.item())),
            "supervised_tokens": int(global_tokens),
            "grad_norm": float(grad_norm),
        }
        if self.teacher is not None:  # the hidden-state term, mean over processes (it is in `loss` too)
            metrics["distill"] = float(self._global_count(step_distill.item())) / world
        return metrics

    def _distill(self, student: list[torch.Tensor], teacher_batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The hidden-state distance of this micro-batch's paired positions (gatt/training/distill.py)."""
        assert self.teacher is not None
        # Packed views (the collator packs them when it packs the student's rows) or padded rows; the LM head runs on
        # one position only: the distance reads the decoder layers' outputs.
        layout = (
            {"position_ids": teacher_batch["teacher_position_ids"]}
            if "teacher_position_ids" in teacher_batch
            else {"attention_mask": teacher_batch["teacher_attention_mask"]}
        )
        with torch.no_grad(), layer_outputs(self.teacher) as teacher:
            self.teacher(input_ids=teacher_batch["teacher_input_ids"], use_cache=False, logits_to_keep=1, **layout)
        return hidden_distance(student, teacher, teacher_batch["distill_index"])

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean token loss on the held-out records (this process's share, reduced over processes).

        Returns:
            The loss summed over every process's supervised tokens, divided by their count.
        """
        self.model.eval()
        acc, total, tokens = self.accelerator, 0.0, 0
        mine = self.eval_records[acc.process_index :: acc.num_processes]
        for start in range(0, len(mine), self.config.batch_size):
            collated = self.collator(mine[start : start + self.config.batch_size])
            batch = {k: v.to(acc.device) for k, v in without_teacher(collated)[0].items()}
            n = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            with acc.autocast():
                total += float(self.model(**batch, use_cache=False, **self.loss_kwargs).loss) * n
            tokens += n
        return float(self._global_count(total) / self._global_count(tokens).clamp(min=1))

    # -- the loop ------------------------------------------------------------------------------

    def train(self, resume: bool = False) -> dict[str, Any]:
        """Run to max_steps, resuming from the newest checkpoint when asked.

        Writes config.yaml and metrics.jsonl under `output_dir`, a checkpoint every `save_every` steps, then the final
        model (`save_final`), and ends the job (`close`).

        Args:
            resume: Whether to resume from the newest checkpoint (`latest_checkpoint`), where there is one.

        Returns:
            The last step's metrics (step, loss, supervised_tokens, grad_norm, lr, elapsed_s; eval_loss and distill
            where computed); {} when no step was left to run.
        """
        config, acc = self.config, self.accelerator
        checkpoint = latest_checkpoint(self.out) if resume else None
        if checkpoint is not None:
            acc.load_state(str(checkpoint))
            acc.print(f"resumed from {checkpoint} at step {self.state.step}")
        metrics_path = self.out / "metrics.jsonl"
        if acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            _truncate_metrics(metrics_path, self.state.step)
            write_text(self.out / "config.yaml", yaml.safe_dump(dataclasses.asdict(config), sort_keys=False))
        acc.init_trackers("gatt")
        progress = tqdm(total=config.max_steps, initial=self.state.step, desc="train", disable=not acc.is_main_process)
        last: dict[str, Any] = {}
        started = time.perf_counter()
        while self.state.step < config.max_steps:
            result = self.train_step(self.state.step)
            self.state.step += 1
            step = self.state.step
            last = {
                "step": step,
                **result,
                "lr": self.scheduler.get_last_lr()[0],
                "elapsed_s": round(time.perf_counter() - started, 3),
            }
            if config.eval_every and self.eval_records and (step % config.eval_every == 0 or step == config.max_steps):
                last["eval_loss"] = self.evaluate()
            if step % config.log_every == 0 or step == config.max_steps or "eval_loss" in last:
                self._log(metrics_path, last)
            progress.update(1)
            progress.set_postfix(loss=f"{result['loss']:.4f}")
            if config.save_every and step % config.save_every == 0 and step < config.max_steps:
                self.save_checkpoint(step)
        progress.close()
        self.save_final()
        self.close()
        return last

    def close(self) -> None:
        """End the job: every process waits for the others, drops the wrapped model, then leaves the process group.

        The order is what makes teardown safe. DDP's reducer holds a reference to the process group; if the group is
        destroyed first, the reducer holds the last one, and freeing the model later (with the GIL held) runs gloo's
        destructor, which joins worker threads that may need the GIL to free a tensor: a deadlock, seen in CI on a
        rank that had already written `final/` (native stack: `~Reducer` -> `~ProcessGroupGloo` -> `thread::join`,
        a gloo thread in `gil_scoped_acquire`). Dropped first, while the group is still registered, the model frees
        no group; the group is then destroyed with its last reference held in Python (`last_reference_in_python`).
        """
        acc = self.accelerator
        # Every process waits for process 0 to write the final model before the group goes.
        acc.wait_for_everyone()
        if acc.num_processes > 1:
            # Only DDP's reducer holds the group; FSDP2 keeps its modules in torch's own registry, so they may stay.
            ddp = weakref.ref(self.model) if isinstance(self.model, DistributedDataParallel) else None
            del self.model, self.optimizer
            acc.free_memory()  # Accelerate's own references (its model and optimizer lists), then gc.collect()
            if ddp is not None and ddp() is not None:
                raise RuntimeError("the DDP model outlived the trainer's references: its reducer would free the group")
        with last_reference_in_python():
            acc.end_training()  # trackers finished, the group destroyed

    def _log(self, path: Path, metrics: dict[str, Any]) -> None:
        self.accelerator.log({k: v for k, v in metrics.items() if k != "step"}, step=metrics["step"])
        if self.accelerator.is_main_process:
            with path.open("a") as f:
                f.write(json.dumps(metrics) + "\n")

    def save_checkpoint(self, step: int) -> None:
        """Accelerate's save_state into a temporary folder, renamed into place; old checkpoints pruned.

        The folder's name is fixed, not `gatt.io.files.atomic_path`'s unique one: every rank writes into it. The newest
        `keep_checkpoints` checkpoints are kept.

        Args:
            step: The step saved, in the folder's name: `output_dir/checkpoints/step-NNNNNNN`.
        """
        acc = self.accelerator
        final = self.out / "checkpoints" / f"step-{step:07d}"
        tmp = final.with_name(final.name + ".tmp")
        acc.wait_for_everyone()
        if acc.is_main_process and tmp.exists():
            shutil.rmtree(tmp)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))
        acc.wait_for_everyone()
        if acc.is_main_process:
            os.replace(tmp, final)
            for old in sorted(final.parent.glob("step-???????"))[: -self.config.keep_checkpoints]:
                shutil.rmtree(old)
        acc.wait_for_everyone()

    def _sharded(self) -> bool:
        """Whether the weights are split across processes (FSDP, DeepSpeed ZeRO-3): no process holds the whole model."""
        acc = self.accelerator
        if acc.distributed_type == DistributedType.DEEPSPEED:
            return acc.state.deepspeed_plugin.zero_stage == 3
        return acc.distributed_type == DistributedType.FSDP

    def save_final(self) -> None:
        """`output_dir/final`: a from_pretrained-loadable model (LoRA merged, or adapter + base) and tokenizer."""
        acc = self.accelerator
        acc.wait_for_everyone()
        # Sharded weights are gathered into one full state dict on the main process: a collective, so every
        # process joins before the others return. (Checkpoints stay in the plugin's own, possibly sharded, format.)
        state_dict = acc.get_state_dict(self.model) if self._sharded() else None
        if not acc.is_main_process:
            return
        model = acc.unwrap_model(self.model)
        if self.config.lora_r > 0 and self.config.merge_lora:
            model = model.merge_and_unload()
        with atomic_path(self.out / "final") as final:  # whole or not at all: a stage that sees it may use it
            model.save_pretrained(final, state_dict=state_dict)
            self.tokenizer.save_pretrained(final)


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint (incomplete ones keep their .tmp name).

    Args:
        output_dir: The run's output folder.

    Returns:
        The newest `checkpoints/step-NNNNNNN` folder, or None when there is none.
    """
    found = sorted((output_dir / "checkpoints").glob("step-???????"))
    return found[-1] if found else None


def _truncate_metrics(path: Path, step: int) -> None:
    """Forget metrics logged after the checkpoint a run resumes from (they will be logged again)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    write_text(path, "".join(line + "\n" for line in kept))


def train(config: TrainConfig, resume: bool = False) -> dict[str, Any]:
    """Build the trainer from `config` and run it.

    Args:
        config: The run's config.
        resume: Whether to resume from the newest checkpoint in `output_dir`.

    Returns:
        The last step's metrics (`Trainer.train`).
    """
    return Trainer(config).train(resume=resume)


__all__ = [
    "TrainConfig",
    "Trainer",
    "batch_indices",
    "load_config",
    "read_records",
    "train",
]
