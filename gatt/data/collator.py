"""The GAtt collator: the instruction only in the first turn, loss only on the supervised replies.

A record (docs/data.md, "Formats") holds clean `messages` and the instruction apart. The collator renders it
with the tokenizer's chat template, putting the instruction (full or short, per `use_short`) exactly
once: in the system message (Llama 2's choice, the default) or in front of the first user message.
Labels are -100 everywhere except the supervised assistant replies and their end-of-turn token:

- `mode="last"` (the paper): only the final reply; every earlier token, replies included, is -100;
- `mode="all"`: every reply whose `sampled_with_instruction` is true, in one pass;
- `mode="expand"`: one example per reply, cut after it and trained only on it (the reference for `all`).

With `teacher_view=True` a GAtt record's example also carries the dialogue as the context-distillation teacher read
it and the pairs of positions, one in each rendering, that predict the same supervised reply token: what
`TrainConfig.distill_weight` matches the start model's hidden states at. `teacher_rendering` says which rendering:
"reminded" (the instruction appended to every user message, `data_gen`'s reminded prompt; one view of the whole
dialogue) or "near" (one view per supervised reply: the instruction placed as turn one places it, then that reply's
user message and the reply, so the teacher reads the same instruction in the same place, one turn back) or "both"
(the near views beside the reminded one). Records with later events, plain SFT records, and examples cut to fit have
no view.

Records without `sampled_with_instruction` (plain SFT data such as the base corpus) count every
reply as sampled, so `mode="all"` trains on all of them.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
Mode = Literal["last", "all", "expand"]
Placement = Literal["system", "first_user"]
Rendering = Literal["reminded", "near", "both"]
RENDERINGS: tuple[str, ...] = get_args(Rendering)


@dataclass
class Example:
    """One tokenized training example: token ids and labels of equal length; with a teacher view, each teacher
    rendering's ids with the (student position, teacher position) pairs that predict the same reply token."""

    input_ids: list[int]
    labels: list[int]
    teacher_views: list[tuple[list[int], list[tuple[int, int]]]] = field(default_factory=list)


class GAttCollator:
    """Callable on a list of records; returns `input_ids`, `labels` and `attention_mask` (or packed `position_ids`)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        mode: Mode = "last",
        instruction_placement: Placement = "system",
        max_length: int = 2048,
        packing: bool = False,
        padding_free: bool = False,
        teacher_view: bool = False,
        teacher_rendering: Rendering = "reminded",
    ) -> None:
        """Check the settings and read the chat template.

        Args:
            tokenizer: The tokenizer; its chat template renders the dialogues, its pad token (else its end-of-sequence
                token) pads them.
            mode: Which replies are supervised: "last" (the paper: only the final reply), "all" (every reply
                sampled with the instruction, in one pass) or "expand" (one example per such reply).
            instruction_placement: Where the turn-one instruction goes: "system" (the default; "first_user", with a
                warning, where the template has no system role) or "first_user".
            max_length: Longest example in tokens: middle turns are dropped (oldest first) until one fits, and packed
                rows hold at most this many.
            packing: Pack examples into first-fit rows with `position_ids` restarting for each, instead of padded
                rows with an `attention_mask`.
            padding_free: Pack the whole batch into one row, without padding; needs `packing`.
            teacher_view: Add the context-distillation teacher's rendering and the position pairs to GAtt examples.
            teacher_rendering: The teacher's rendering: "reminded", "near" or "both" (see the module docstring).

        Raises:
            ValueError: When `mode`, `instruction_placement` or `teacher_rendering` is unknown, the tokenizer has no
                chat template, or `padding_free` is set without `packing`.
        """
        if mode not in ("last", "all", "expand"):
            raise ValueError(f"mode must be 'last', 'all' or 'expand', got {mode!r}")
        if instruction_placement not in ("system", "first_user"):
            raise ValueError(f"instruction_placement must be 'system' or 'first_user', got {instruction_placement!r}")
        if not tokenizer.chat_template:
            raise ValueError("the tokenizer has no chat template: GAttCollator renders dialogues with it")
        if teacher_rendering not in RENDERINGS:
            raise ValueError(f"teacher_rendering must be one of {', '.join(RENDERINGS)}, got {teacher_rendering!r}")
        if padding_free and not packing:
            raise ValueError("padding_free packs a batch into one row: it needs packing=True")
        self.tokenizer, self.mode, self.max_length, self.packing = tokenizer, mode, max_length, packing
        self.padding_free, self.teacher_view, self.teacher_rendering = padding_free, teacher_view, teacher_rendering
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if instruction_placement == "system" and not supports_system(tokenizer):
            logger.warning(
                "the chat template has no system role: the instruction goes in front of the first user message"
            )
            instruction_placement = "first_user"
        self.instruction_placement = instruction_placement
        self.uses_generation_marks = bool(re.search(r"\{%-?\s*generation\s*-?%\}", tokenizer.chat_template))
        self.stats: Counter = Counter()  # examples, dropped_turns, skipped_examples, supervised_tokens

    # -- rendering -----------------------------------------------------------------------------

    def chat(self, record: dict[str, Any]) -> list[dict[str, str]]:
        """The dialogue as the model sees it: the turn-one instruction exactly once, in the first turn, and each
        later event (an instruction given late, changed, added or withdrawn) only in the user turn that gives it.

        Args:
            record: A record (docs/data.md, "Formats").

        Returns:
            A copy of its messages with the instructions placed.

        Raises:
            ValueError: When an event's turn comes after the record's last user turn.
        """
        messages = place_instruction(record["messages"], record_instruction(record), self.instruction_placement)
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        for event in later_events(record):
            turn = event["turn"]
            if turn > len(users):
                raise ValueError(f"record {record.get('id', '?')}: an event at turn {turn}, after its last user turn")
            message = messages[users[turn - 1]]
            message["content"] = append_instruction(message["content"], event["text"])
        return messages

    def tokenize(self, messages: list[dict[str, str]]) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of the rendered dialogue and the token span [start, end) of each assistant reply.

        Templates with `{% generation %}` marks give the spans themselves; for the others they come from rendering
        the dialogue's prefixes.

        Args:
            messages: The chat, as `chat` gives it.

        Returns:
            (token ids, one [start, end) span per assistant reply, in order; a span covers the reply and its
            end-of-turn token).

        Raises:
            ValueError: When a template without generation marks does not render dialogue prefixes as prefixes.
        """
        if self.uses_generation_marks:
            encoded = self.tokenizer.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            return list(encoded["input_ids"]), _runs(encoded["assistant_masks"])
        return self._tokenize_by_prefixes(messages)

    def _tokenize_by_prefixes(self, messages: list[dict[str, str]]) -> tuple[list[int], list[tuple[int, int]]]:
        """Templates without generation marks: a reply's characters lie between the render of the
        dialogue before it (with the generation prompt) and the render that includes it."""
        render = self.tokenizer.apply_chat_template
        full = render(messages, tokenize=False)
        char_spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = len(render(messages[:i], tokenize=False, add_generation_prompt=True))
            end = len(render(messages[: i + 1], tokenize=False))
            if not full.startswith(render(messages[: i + 1], tokenize=False)):
                raise ValueError(
                    "the chat template does not render dialogue prefixes as prefixes; add {% generation %} marks"
                )
            end = start + len(full[start:end].rstrip())  # the reply and its end-of-turn token, not the newline after
            char_spans.append((start, end))
        encoded = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoded["offset_mapping"]
        spans = []
        for start, end in char_spans:
            inside = [t for t, (a, b) in enumerate(offsets) if a >= start and b <= end and b > a]
            spans.append((inside[0], inside[-1] + 1) if inside else (0, 0))
        return list(encoded["input_ids"]), spans

    # -- examples ------------------------------------------------------------------------------

    def examples(self, record: dict[str, Any]) -> list[Example]:
        """The training examples of one record (one, or one per reply with mode="expand").

        An example that does not fit in max_length even with its middle turns dropped is skipped (and counted).

        Args:
            record: A record (docs/data.md, "Formats").

        Returns:
            The examples, possibly none.

        Raises:
            ValueError: When the record has no assistant reply, its `sampled_with_instruction` does not have one
                entry per reply, an event comes after its last user turn, or a reply tokenizes differently in the
                teacher's rendering.
        """
        messages, targets = self._targets(record)
        out = []
        for supervised in targets:
            example = self._fit(messages, supervised, record)
            if example is not None:
                out.append(example)
        return out

    def fits(self, record: dict[str, Any]) -> bool:
        """Whether at least one example of the record fits in max_length (stops at the first that does).

        A dry run: `stats` count nothing of it.

        Args:
            record: A record (docs/data.md, "Formats").

        Returns:
            True where some example fits.

        Raises:
            ValueError: As `examples` raises for a malformed record.
        """
        messages, targets = self._targets(record)
        counted = self.stats.copy()
        found = any(self._fit(messages, supervised, record, view=False) is not None for supervised in targets)
        self.stats = counted  # a dry run: it counts nothing
        return found

    def _targets(self, record: dict[str, Any]) -> tuple[list[dict[str, str]], list[list[int]]]:
        """The rendered chat and, per example, the indices of the replies it supervises."""
        messages = self.chat(record)
        num_replies = sum(m["role"] == "assistant" for m in messages)
        if num_replies == 0:
            raise ValueError(f"record {record.get('id', '?')}: no assistant reply to train on")
        sampled = record.get("sampled_with_instruction")
        if sampled is None:  # plain SFT data: every reply counts as sampled
            sampled = [True] * num_replies
        if len(sampled) != num_replies:
            raise ValueError(
                f"record {record.get('id', '?')}: sampled_with_instruction has {len(sampled)} entries "
                f"for {num_replies} assistant replies"
            )
        if self.mode == "last":
            targets = [[num_replies - 1]]
        elif self.mode == "all":
            targets = [[i for i in range(num_replies) if sampled[i]]]
        else:
            targets = [[i] for i in range(num_replies) if sampled[i]]
        return messages, targets

    def _fit(
        self, messages: list[dict[str, str]], supervised: list[int], record: dict[str, Any], view: bool = True
    ) -> Example | None:
        """Cut after the last supervised reply; drop whole middle turns (oldest first) until it fits; with `view` (and
        `teacher_view`), add the teacher's rendering where the dialogue was not cut.

        Turn k is (user message, reply k). Turn 0 holds the instruction, a turn that gives a later event holds
        its words, and supervised turns are the targets: none of them is ever dropped.
        """
        if not supervised:
            return None
        replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        messages = messages[: replies[supervised[-1]] + 1]
        keep = list(supervised)
        given = [event["turn"] - 1 for event in later_events(record)]  # turns that give an event: kept too
        cut = False
        while True:
            ids, spans = self.tokenize(messages)
            if len(ids) <= self.max_length:
                break
            droppable = [k for k in range(1, len(spans)) if k not in keep and k not in given]
            if not droppable:
                self.stats["skipped_examples"] += 1
                logger.debug("record %s does not fit in %d tokens: skipped", record.get("id", "?"), self.max_length)
                return None
            reply = [i for i, m in enumerate(messages) if m["role"] == "assistant"][droppable[0]]
            messages = messages[: reply - 1] + messages[reply + 1 :]
            keep = [k - 1 if k > droppable[0] else k for k in keep]
            given = [k - 1 if k > droppable[0] else k for k in given]
            self.stats["dropped_turns"] += 1
            cut = True
        labels = [IGNORE_INDEX] * len(ids)
        for k in keep:
            start, end = spans[k]
            labels[start:end] = ids[start:end]
        self.stats["examples"] += 1
        example = Example(ids, labels)
        if self.teacher_view and view and not cut:
            self._add_teacher_view(example, record, spans, keep)
        return example

    def _add_teacher_view(
        self, example: Example, record: dict[str, Any], spans: list[tuple[int, int]], keep: list[int]
    ) -> None:
        """The teacher's renderings of the example's dialogue (as many replies as it has spans) and the position pairs."""
        if "sampled_with_instruction" not in record or later_events(record):
            return
        instruction = record_instruction(record)
        system = [m for m in record["messages"] if m["role"] == "system"]
        turns, user = [], None  # (user message, reply) per reply of the record
        for message in record["messages"]:
            if message["role"] == "user":
                user = message
            elif message["role"] == "assistant" and user is not None:
                turns.append((user, message))
        turns = turns[: len(spans)]
        if len(turns) != len(spans):
            return
        views = []
        # reminded: the whole dialogue, the instruction after every user message
        if self.teacher_rendering in ("reminded", "both"):
            reminded = [
                {**m, "content": append_instruction(m["content"], instruction)} if instruction and m is pair[0] else m
                for pair in turns
                for m in pair
            ]
            views.append(([*system, *reminded], keep, keep))
        if self.teacher_rendering in ("near", "both"):  # one view per supervised reply: the instruction one turn back
            views += [
                (place_instruction([*system, *turns[k]], instruction, self.instruction_placement), [k], [0])
                for k in keep
            ]
        for messages, mine, theirs in views:
            teacher_ids, teacher_spans = self.tokenize(messages)
            if len(teacher_ids) > self.max_length or len(teacher_spans) != sum(
                m["role"] == "assistant" for m in messages
            ):
                self.stats["no_teacher_view"] += 1
                example.teacher_views = []
                return
            pairs = []
            for k, j in zip(mine, theirs, strict=True):
                (a, b), (c, d) = spans[k], teacher_spans[j]
                if example.input_ids[a:b] != teacher_ids[c:d]:
                    raise ValueError(
                        f"record {record.get('id', '?')}: reply {k + 1} tokenizes differently for the teacher"
                    )
                pairs += zip(range(a - 1, b - 1), range(c - 1, d - 1), strict=True)  # the positions that predict it
            example.teacher_views.append((teacher_ids, pairs))

    # -- batching ------------------------------------------------------------------------------

    def __call__(self, records: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Collate records into a padded (or packed) batch."""
        examples = [e for r in records for e in self.examples(r)]
        if not examples:
            raise ValueError("no example in this batch fits max_length; raise max_length or shorten the dialogues")
        self.stats["supervised_tokens"] += sum(sum(t != IGNORE_INDEX for t in e.labels) for e in examples)
        return self._pack(examples) if self.packing else self._pad(examples)

    def _pad(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        width = max(len(e.input_ids) for e in examples)
        input_ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
        for row, e in enumerate(examples):  # right padding: every example starts at position 0
            input_ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids)
            labels[row, : len(e.labels)] = torch.tensor(e.labels)
            attention_mask[row, : len(e.input_ids)] = 1
        batch = {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
        return self._with_teacher(batch, examples, [row * width for row in range(len(examples))])

    def _rows(self, lengths: list[int]) -> list[list[int]]:
        """First-fit rows of at most max_length, as indices into `lengths` (padding_free: all in one row)."""
        if self.padding_free:
            return [list(range(len(lengths)))]
        rows: list[list[int]] = []
        filled: list[int] = []
        for i, n in enumerate(lengths):
            r = next((r for r, used in enumerate(filled) if used + n <= self.max_length), None)
            if r is None:
                rows.append([i])
                filled.append(n)
            else:
                rows[r].append(i)
                filled[r] += n
        return rows

    @staticmethod
    def _packed_positions(rows: list[list[int]], lengths: list[int], width: int) -> torch.Tensor:
        """(rows, width) position ids restarting at 0 for each segment, trailing padding its own segment."""
        position_ids = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            offset = 0
            for i in row:
                position_ids[r, offset : offset + lengths[i]] = torch.arange(lengths[i])
                offset += lengths[i]
            position_ids[r, offset:] = torch.arange(width - offset)
        return position_ids

    def _pack(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """First-fit rows of at most max_length (padding_free: every example in one row, no padding at all);
        positions restart at 0 for each example (its segment)."""
        lengths = [len(e.input_ids) for e in examples]
        rows = self._rows(lengths)
        width = max(sum(lengths[i] for i in row) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        starts = [0] * len(examples)  # each example's first token's index in the flattened (rows x width) batch
        for r, row in enumerate(rows):
            offset = 0
            for i in row:
                e, n = examples[i], lengths[i]
                starts[i] = r * width + offset
                input_ids[r, offset : offset + n] = torch.tensor(e.input_ids)
                labels[r, offset : offset + n] = torch.tensor(e.labels)
                labels[r, offset] = IGNORE_INDEX  # never predict a dialogue's first token from the previous one
                offset += n
        batch = {"input_ids": input_ids, "labels": labels, "position_ids": self._packed_positions(rows, lengths, width)}
        return self._with_teacher(batch, examples, starts)

    def _with_teacher(
        self, batch: dict[str, torch.Tensor], examples: list[Example], starts: list[int]
    ) -> dict[str, torch.Tensor]:
        """With teacher views: `teacher_input_ids` (B', T'), laid out as the student's batch is (packed into
        first-fit rows with `teacher_position_ids`, or one right-padded row per view with `teacher_attention_mask`),
        and `distill_index` (N, 2): flat indices into the student's and the teacher's (rows x width) batch of the N
        positions that predict the same reply token."""
        if not self.teacher_view:
            return batch
        views = [
            (ids, pairs, start) for e, start in zip(examples, starts, strict=True) for ids, pairs in e.teacher_views
        ]
        lengths = [len(ids) for ids, _, _ in views]
        rows = self._rows(lengths) if self.packing and views else [[i] for i in range(len(views))]
        width = max((sum(lengths[i] for i in row) for row in rows), default=1)
        teacher_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        index = []
        for r, row in enumerate(rows):
            offset = 0
            for i in row:
                (ids, pairs, start), n = views[i], lengths[i]
                teacher_ids[r, offset : offset + n] = torch.tensor(ids)
                index += [(start + mine, r * width + offset + theirs) for mine, theirs in pairs]
                offset += n
        layout = (
            {"teacher_position_ids": self._packed_positions(rows, lengths, width)}
            if self.packing
            else {"teacher_attention_mask": (torch.arange(width) < torch.tensor(lengths)[:, None]).long()}
        )
        return {
            **batch,
            "teacher_input_ids": teacher_ids,
            **layout,
            "distill_index": torch.tensor(index, dtype=torch.long).reshape(-1, 2),
        }


def place_instruction(
    messages: Sequence[dict[str, str]], instruction: str | None, placement: Placement
) -> list[dict[str, str]]:
    """A copy of `messages` with the instruction given once, in turn one: the system message or the first user one.

    Args:
        messages: The chat messages (not changed).
        instruction: The instruction; None or "" leaves the copy as it is.
        placement: "system" (in front of an existing system message's text, or as a new system message) or
            "first_user" (in front of the first user message's text), on a line of its own.

    Returns:
        The copy, each message a new dict.
    """
    messages = [dict(m) for m in messages]
    if not instruction:
        return messages
    if placement == "system":
        if messages and messages[0]["role"] == "system":  # keep one system message: the instruction leads it
            messages[0]["content"] = f"{instruction}\n{messages[0]['content']}"
            return messages
        return [{"role": "system", "content": instruction}, *messages]
    first = next(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[first]["content"] = f"{instruction}\n{messages[first]['content']}"
    return messages


def later_events(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's events after turn one (gatt/data/events.py: an instruction given late, replaced, added or
    withdrawn).

    A turn-one instruction is the record's `instruction`.

    Args:
        record: A record, with or without `events`.

    Returns:
        The events with turn > 1, each `{"turn", "kind", "constraints", "text"}`; [] where there are none.
    """
    return [event for event in record.get("events") or [] if event["turn"] > 1]


def record_instruction(record: dict[str, Any]) -> str | None:
    """A GAtt record's turn-one instruction: the short form where `use_short` says so.

    Args:
        record: A record.

    Returns:
        Its `instruction_short` or `instruction`, or None where it has none.
    """
    return record.get("instruction_short" if record.get("use_short") else "instruction")


def append_instruction(user_text: str, instruction: str) -> str:
    """A user message with the instruction appended: how synthesis (and the eval's upper bound) repeats it every turn.

    Args:
        user_text: The user message.
        instruction: The instruction.

    Returns:
        The message, a space, then the instruction.
    """
    return f"{user_text} {instruction}"


def supports_system(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the template renders a system message (some raise, some drop it).

    Args:
        tokenizer: The tokenizer whose chat template is probed.

    Returns:
        True where a system message's text appears in the render.
    """
    probe = "\u2063system-probe\u2063"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": probe}, {"role": "user", "content": "hi"}], tokenize=False
        )
    except Exception:  # templates signal "no system role" by raising their own errors
        return False
    return probe in text


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of ones: one per assistant reply, in order."""
    spans, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    return spans
