"""TRL's side of `train_vs_trl` (benchmarks/bench_train.py): `trl.SFTTrainer` with `assistant_only_loss=True` on
the rows our trainer draws, in its order, and the worker thread that runs its own `train()` a round at a time.

The settings, the training template that marks SmolLM2's replies for TRL, and the check that TRL's prepared rows
(token ids and supervised tokens) are our collator's, record by record, are bench_train.py's docstring's.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase, TrainerCallback

from gatt.data.collator import IGNORE_INDEX, GAttCollator
from gatt.training.building import build_model, lora_config
from gatt.training.trainer import TrainConfig, batch_indices

TRL_SETTINGS = ("padding_free", "padded", "bfd")
SAME_RECORDS = ("padding_free", "padded")  # the settings that train our records at every step (eligible as theirs)
TRL_NOTES = {
    "padding_free": "padding_free=True: the batch flattened into one row, position_ids restarting per dialogue, no "
    "attention mask; correct: GattForCausalLM attends within each dialogue's segment",
    "padded": "rows padded to the batch's longest with an attention mask; correct on any model",
    "bfd": "packing=True, packing_strategy='bfd': dialogues best-fit packed into rows of max_length before training "
    "(padding-free rows); correct likewise; it packs across steps, so its steps train other records and token "
    "counts than ours: timed and recorded, not eligible as theirs",
}

# Where SmolLM2's ChatML template writes a message, and the same with the reply and its <|im_end|> marked for
# `return_assistant_tokens_mask`: the text rendered is the same character for character (and TRL's token ids and
# labels are checked equal to our collator's on every record, `check_same_examples`).
CHATML_MESSAGE = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
CHATML_MESSAGE_MARKED = (
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
)


def training_template(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """A chat template with `{% generation %}` marks rendering the same text as the tokenizer's; None if it has them."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if has_generation_markers(template):
        return None
    if CHATML_MESSAGE in template:
        return template.replace(CHATML_MESSAGE, CHATML_MESSAGE_MARKED)
    return get_training_chat_template(tokenizer)  # TRL's own, for the templates it knows (raises otherwise)


def trl_rows(collator: GAttCollator, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What TRL trains on: the conversation our collator renders (instruction in the system message of turn one)."""
    return [{"messages": collator.chat(r)} for r in records]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _Pause(TrainerCallback):
    """Hands control back to the benchmark before the first step and after every `steps`-th step."""

    def __init__(self, side: TrlSide) -> None:
        self.side = side

    def on_train_begin(self, args, state, control, **kwargs):
        self.side.pause()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.side.steps == 0:
            sync(self.side.device)
            self.side.seconds = time.perf_counter() - self.side.start
            self.side.pause()


class TrlSide:
    """TRL's own `trainer.train()` in a worker thread, paused between rounds; a round resumes it for `steps` steps.

    The timed span runs from the resume to the end of the round's last step: TRL's data loading, forward,
    backward, clipping, optimizer and scheduler steps and its callbacks, nothing of the set-up.
    """

    def __init__(self, trainer: Any, steps: int, device: str) -> None:
        self.trainer, self.steps, self.device = trainer, steps, device
        self.tokens: list[int] = []
        self.start = self.seconds = 0.0
        self.count = 0
        self.error: BaseException | None = None
        self.done = False  # train() has returned
        self.finishing = False  # no more rounds: run to the end without pausing
        self.threads = torch.get_num_threads()
        self._resume, self._paused = threading.Semaphore(0), threading.Semaphore(0)
        trainer.add_callback(_Pause(self))
        inner = trainer.training_step

        def training_step(model, inputs, num_items_in_batch=None):  # counts the supervised tokens it trains on
            self.count += int((inputs["labels"][..., 1:] != IGNORE_INDEX).sum())
            return inner(model, inputs, num_items_in_batch)

        trainer.training_step = training_step
        self._thread = threading.Thread(target=self._work, name="trl-train", daemon=True)
        self._thread.start()
        self._wait()  # paused at on_train_begin: optimizer, scheduler and dataloader built

    def _work(self) -> None:
        torch.set_num_threads(self.threads)  # the worker thread uses the main thread's intra-op threads
        self.worker_threads = torch.get_num_threads()
        try:
            self.trainer.train()
        except BaseException as error:  # handed to the main thread
            self.error = error
        finally:
            self.done = True
            self._paused.release()

    def pause(self) -> None:
        """In the worker: hand control back, wait for the next round."""
        if self.finishing:
            return
        self._paused.release()
        self._resume.acquire()
        self.count = 0
        self.start = time.perf_counter()

    def _wait(self) -> None:
        self._paused.acquire()
        if self.error is not None:
            raise RuntimeError(f"TRL's training stopped: {self.error!r}") from self.error
        if self.done:
            raise RuntimeError("TRL's train() ended before the round's steps")

    def __call__(self) -> float:
        self._resume.release()
        self._wait()
        self.tokens.append(self.count)
        return self.seconds

    def finish(self) -> None:
        """Let train() run to its end (after the last round) without pausing again."""
        self.finishing = True
        self._resume.release()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"TRL's training stopped: {self.error!r}") from self.error


def trl_trainer(
    steps: int,
    batch: int,
    max_length: int,
    setting: str,
    work: Path,
    config: TrainConfig,
    collator: GAttCollator,
    records: list[dict[str, Any]],
    device: str,
) -> Any:
    """SFTTrainer for one candidate setting on the rows our trainer draws, in its order (`config`: our run's): `steps`
    optimizer steps of `batch` records each, rows of at most `max_length` tokens.

    The model is built as ours is (`gatt.training.trainer.build_model`), without LoRA: TRL wraps it from `peft_config`.
    The caller copies our initial weights into it.
    """
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model)  # its own copy: TRL edits the template
    template = training_template(tokenizer)
    template_path = None
    if template is not None:
        template_path = work / "training_template.jinja"
        template_path.write_text(template)
    # The records of every step of our run, in order (ours draws step s's records with batch_indices(seed, s)).
    order = [i for s in range(steps) for i in batch_indices(len(records), batch, config.seed, s)]
    ordered = [records[i] for i in order]
    extra: dict[str, Any] = {}
    if setting == "padded":
        extra = {"max_length": max_length, "train_sampling_strategy": "sequential"}
    elif setting == "padding_free":  # TRL refuses max_length without packing here; every record fits (checked)
        extra = {"padding_free": True, "max_length": None, "train_sampling_strategy": "sequential"}
    elif (
        setting == "bfd"
    ):  # rows of max_length packed from the whole run's records; the run's rows spread over its steps
        extra = {"packing": True, "packing_strategy": "bfd", "max_length": max_length}
        batch = math.ceil(bfd_rows(collator, ordered, max_length) / steps)
    else:
        raise ValueError(f"unknown TRL setting {setting!r}")
    args = SFTConfig(
        output_dir=str(work / f"trl-{setting}"),
        max_steps=steps,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": config.min_lr_ratio},
        warmup_steps=config.warmup_steps,
        max_grad_norm=config.max_grad_norm,
        seed=config.seed,
        assistant_only_loss=True,
        chat_template_path=str(template_path) if template_path else None,
        activation_checkpointing=False,
        bf16=device == "cuda",
        use_cpu=device == "cpu",
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=device == "cuda",
        **extra,
    )
    model = build_model(dataclasses.replace(config, lora_r=0), collator.tokenizer)
    peft_config = lora_config(config) if config.lora_r > 0 else None
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(trl_rows(collator, ordered)),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    assert not trainer.args.activation_checkpointing
    if setting == "bfd":
        assert math.ceil(len(trainer.train_dataset) / batch) <= steps, "bfd: TRL packed other rows"
    else:
        check_same_examples(trainer.train_dataset, collator, ordered)
    return trainer


def bfd_rows(collator: GAttCollator, records: list[dict[str, Any]], max_length: int) -> int:
    """How many rows TRL's best-fit-decreasing packing makes of these records (its own packer, on our token ids)."""
    from datasets import Dataset
    from trl.data_utils import pack_dataset

    ids = [collator.examples(r)[0].input_ids for r in records]
    return len(pack_dataset(Dataset.from_dict({"input_ids": ids}), max_length, "bfd"))


def check_same_examples(dataset: Any, collator: GAttCollator, records: list[dict[str, Any]]) -> None:
    """TRL's tokenised rows are ours: the same input ids and the same supervised tokens, record by record."""
    assert len(dataset) == len(records)
    seen: set[str] = set()
    for row, record in zip(dataset, records):
        if record["id"] in seen:
            continue
        seen.add(record["id"])
        (example,) = collator.examples(record)
        assert row["input_ids"] == example.input_ids, f"{record['id']}: TRL renders other token ids"
        assert row["labels"] == example.labels, f"{record['id']}: TRL supervises other tokens"
