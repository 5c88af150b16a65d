"""Roll test dialogues out turn by turn with the model under test writing every reply.

`rollout` runs a batch of dialogues in lockstep and keeps one KV cache for the whole dialogue: each
turn feeds only the tokens that are new since the last one (the end of the previous reply, the next
user message, the assistant header), never the history again. Rows of the batch differ in length, so
the cache has holes: columns masked out (attention mask 0) that no query sees, and each row's
`position_ids` count its real tokens only. When the chat template renders the history differently from
the tokens the model produced (a reply re-tokenised differently, a template that strips text), the
diverging cached tokens become holes too and the canonical ones are fed instead, so every turn sees
exactly what re-encoding the rendered history would give. `reference_rollout` is that re-encoding
done with Hugging Face `generate()`, one dialogue at a time: the reference for tests and benchmarks.

The attention probe (`measure_attention=True`, needs a model whose attention returns its weights: the
library's, or a Hugging Face one loaded with `attn_implementation="gatt"`) records, for each reply,
the share of attention its tokens put on the instruction's tokens, per layer, averaged over heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import TemperatureLogitsWarper, TopPLogitsWarper

from gatt.collator import Placement, append_instruction, place_instruction
from gatt.eval.plan import EvalDialogue, PlannedTurn


@dataclass(frozen=True)
class RolloutConfig:
    max_new_tokens: int = 64
    batch_size: int = 32  # dialogues rolled out together
    do_sample: bool = False  # greedy by default
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0  # sampling seed
    placement: Placement = "system"  # where turn one gives the instruction
    repeat_instruction: bool = False  # the upper bound: the instruction appended to every user turn instead
    measure_attention: bool = False


@dataclass
class _Row:
    """One dialogue's state in a batch: its history and which cache columns hold which tokens."""

    dialogue: EvalDialogue
    messages: list[dict[str, str]] = field(default_factory=list)  # user/assistant history (no instruction)
    fed: list[int] = field(default_factory=list)  # token ids in the cache, in order
    columns: list[int] = field(default_factory=list)  # the cache column of each fed token
    instruction_columns: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Tokens that end a reply: the generation config's end-of-sequence ids and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def user_message(dialogue: EvalDialogue, turn: PlannedTurn, config: RolloutConfig) -> str:
    if config.repeat_instruction and dialogue.instruction:
        return append_instruction(turn.user, dialogue.instruction)
    return turn.user


def render(
    tokenizer: PreTrainedTokenizerBase, dialogue: EvalDialogue, messages: list[dict[str, str]], config: RolloutConfig
) -> tuple[list[int], list[int]]:
    """Token ids of the history ready for the next reply, and the indices of the instruction's tokens in it."""
    instruction = None if config.repeat_instruction else dialogue.instruction
    chat = place_instruction(messages, instruction, config.placement)
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=bool(dialogue.instruction))
    if not dialogue.instruction:
        return list(encoded["input_ids"]), []
    start = text.find(dialogue.instruction)  # its first occurrence: turn one
    end = start + len(dialogue.instruction)
    span = [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if a < end and b > start and start >= 0]
    return list(encoded["input_ids"]), span


def score_turn(
    number: int, turn: PlannedTurn, user: str, reply: str, attention: list[float] | None
) -> dict[str, Any]:
    """The transcript entry of one turn: the reply and every check's result."""
    checks = [{"type": c.type, "passed": c.passes(reply)} for c in turn.checks]
    return {
        "turn": number,
        "kind": turn.kind,
        "user": user,
        "reply": reply,
        "checks": checks,
        "passed": all(c["passed"] for c in checks) if checks else None,
        "on_topic": all(c.passes(reply) for c in turn.on_topic) if turn.on_topic else None,
        "attention_on_instruction": sum(attention) / len(attention) if attention else None,
        "attention_per_layer": attention,
    }


def transcript(row: _Row) -> dict[str, Any]:
    d = row.dialogue
    constraint = d.constraint
    return {
        "id": d.id,
        "stratum": d.stratum,
        "constraint": None
        if constraint is None
        else {"name": constraint.name, "family": constraint.family, "value": constraint.value, "split": constraint.split},
        "instruction": d.instruction,
        "stop_reason": row.stop_reason,
        "turns": row.turns,
    }


class _Sampler:
    """Greedy, or temperature + top-p sampling from a seeded generator."""

    def __init__(self, config: RolloutConfig, device: torch.device) -> None:
        self.do_sample = config.do_sample
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(config.temperature), TopPLogitsWarper(config.top_p)])
        self.generator = torch.Generator(device=device).manual_seed(config.seed)

    def __call__(self, logits: Tensor) -> Tensor:  # (B, V) -> (B,)
        if not self.do_sample:
            return logits.argmax(-1)
        scores = self.warpers(None, logits.float())
        return torch.multinomial(scores.softmax(-1), 1, generator=self.generator)[:, 0]


@torch.no_grad()
def rollout(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dialogues: Sequence[EvalDialogue],
    config: RolloutConfig = RolloutConfig(),
    *,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Transcripts of `dialogues` (same order), batched across dialogues, with the KV cache reused across turns."""
    if not tokenizer.chat_template:
        raise ValueError(f"{getattr(tokenizer, 'name_or_path', 'the tokenizer')} has no chat template: the evaluation needs a chat model")
    model.eval()
    sampler = _Sampler(config, model.device)
    stops = stop_token_ids(model, tokenizer)
    transcripts: list[dict[str, Any]] = []
    total = sum(len(d.turns) for d in dialogues)
    with tqdm(total=total, desc="rollout", unit="turn", disable=not progress) as bar:
        for start in range(0, len(dialogues), config.batch_size):
            rows = [_Row(d) for d in dialogues[start : start + config.batch_size]]
            _rollout_batch(model, tokenizer, rows, config, sampler, stops, bar)
            transcripts += [transcript(row) for row in rows]
    return transcripts


def _rollout_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[_Row],
    config: RolloutConfig,
    sampler: _Sampler,
    stops: set[int],
    bar: tqdm,
) -> None:
    device = model.device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    context = getattr(model.config, "max_position_embeddings", None) or 2048
    cache = DynamicCache(config=model.config)
    mask = torch.zeros(len(rows), 0, dtype=torch.long, device=device)  # (B, columns): 1 = a real token
    active = list(rows)  # the rows in the cache, in cache order
    for t in range(max(len(r.dialogue.turns) for r in rows)):
        # -- the next prompt of every row still running; rows that are done leave the cache ------------------
        new_tokens: dict[int, list[int]] = {}
        for i, row in enumerate(active):
            if t >= len(row.dialogue.turns):
                row.stop_reason = "turns"
                continue
            turn = row.dialogue.turns[t]
            ids, span = render(tokenizer, row.dialogue, [*row.messages, {"role": "user", "content": user_message(row.dialogue, turn, config)}], config)
            if len(ids) + config.max_new_tokens > context:
                row.stop_reason = "context"
                bar.update(len(row.dialogue.turns) - t)
                continue
            same = _common_prefix(row.fed, ids)
            for column in row.columns[same:]:  # the template rendered something else here: mask it out
                mask[i, column] = 0
            del row.fed[same:], row.columns[same:]
            new_tokens[i] = ids[same:]
            if t == 0:
                row.instruction_columns = span  # indices into ids; made cache columns once fed below
        keep = sorted(new_tokens)
        if not keep:
            return
        if len(keep) < len(active):
            cache.batch_select_indices(torch.tensor(keep, device=device))
            mask = mask[keep]
            active = [active[i] for i in keep]
        segments = [new_tokens[i] for i in keep]

        # -- prefill: each row's new tokens end at the last column (left-padded with holes) -----------------
        width = max(len(s) for s in segments)
        base = mask.shape[1]
        input_ids = torch.full((len(active), width), pad, dtype=torch.long)
        position_ids = torch.zeros(len(active), width, dtype=torch.long)
        segment_mask = torch.zeros(len(active), width, dtype=torch.long)
        for i, (row, segment) in enumerate(zip(active, segments)):
            offset = width - len(segment)
            input_ids[i, offset:] = torch.tensor(segment)
            position_ids[i, offset:] = torch.arange(len(row.fed), len(row.fed) + len(segment))
            segment_mask[i, offset:] = 1
            if t == 0:
                row.instruction_columns = [base + offset + k for k in row.instruction_columns]
            row.columns += range(base + offset, base + width)
            row.fed += segment
        mask = torch.cat([mask, segment_mask.to(device)], dim=1)
        logits = model(
            input_ids=input_ids.to(device), attention_mask=mask, position_ids=position_ids.to(device),
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        ).logits[:, -1]  # (B, V)

        # -- decode: one token per row and step; finished rows feed holes ----------------------------------
        replies: list[list[int]] = [[] for _ in active]
        finished = [False] * len(active)
        attention: list[list[Tensor]] = [[] for _ in active]  # per row: (layers,) shares, one per reply token
        for step in range(config.max_new_tokens):
            tokens = sampler(logits).tolist()
            for i, token in enumerate(tokens):
                if not finished[i]:
                    replies[i].append(token)
                    finished[i] = token in stops
            if all(finished) or step == config.max_new_tokens - 1:
                break
            feeding = [not f for f in finished]
            column = mask.shape[1]
            for i, row in enumerate(active):
                if feeding[i]:
                    row.fed.append(tokens[i])
                    row.columns.append(column)
            mask = torch.cat([mask, torch.tensor(feeding, dtype=torch.long, device=device)[:, None]], dim=1)
            output = model(
                input_ids=torch.tensor([tok if f else pad for tok, f in zip(tokens, feeding)], device=device)[:, None],
                attention_mask=mask,
                position_ids=torch.tensor([len(r.fed) - 1 for r in active], device=device)[:, None],
                past_key_values=cache, use_cache=True, output_attentions=config.measure_attention,
            )
            logits = output.logits[:, -1]
            if config.measure_attention:
                shares = instruction_shares(output.attentions, [r.instruction_columns for r in active])  # (B, layers)
                for i in range(len(active)):
                    if feeding[i]:
                        attention[i].append(shares[i])

        # -- score the replies and extend the histories ------------------------------------------------------
        for i, row in enumerate(active):
            turn = row.dialogue.turns[t]
            content = replies[i][:-1] if replies[i] and replies[i][-1] in stops else replies[i]
            reply = tokenizer.decode(content, skip_special_tokens=True).strip()
            layers = torch.stack(attention[i]).mean(0).tolist() if attention[i] else None
            user = user_message(row.dialogue, turn, config)
            row.turns.append(score_turn(t + 1, turn, user, reply, layers))
            row.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        bar.update(len(active))
    for row in active:
        row.stop_reason = row.stop_reason or "turns"


def instruction_shares(attentions: Sequence[Tensor], columns: Sequence[Sequence[int]]) -> Tensor:
    """(B, layers): each row's attention mass on its instruction columns, last query, averaged over heads."""
    batch, keys = attentions[0].shape[0], attentions[0].shape[-1]
    on_instruction = torch.zeros(batch, keys, device=attentions[0].device)
    for i, cols in enumerate(columns):
        on_instruction[i, list(cols)] = 1.0
    # each layer's weights: (B, H, Tq, K) -> the last query's mass on the instruction, mean over heads
    return torch.stack([(w[:, :, -1].float() * on_instruction[:, None]).sum(-1).mean(1) for w in attentions], dim=1).cpu()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@torch.no_grad()
def reference_rollout(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dialogues: Sequence[EvalDialogue],
    config: RolloutConfig = RolloutConfig(),
    *,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """The same transcripts the slow way: Hugging Face `generate()` per turn on the re-encoded history, one dialogue at a time."""
    if config.do_sample or config.measure_attention:
        raise ValueError("reference_rollout is the greedy reference: no sampling, no attention probe")
    model.eval()
    stops = sorted(stop_token_ids(model, tokenizer))
    context = getattr(model.config, "max_position_embeddings", None) or 2048
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    transcripts = []
    with tqdm(total=sum(len(d.turns) for d in dialogues), desc="reference", unit="turn", disable=not progress) as bar:
        for dialogue in dialogues:
            row = _Row(dialogue)
            for t, turn in enumerate(dialogue.turns):
                user = user_message(dialogue, turn, config)
                ids, _ = render(tokenizer, dialogue, [*row.messages, {"role": "user", "content": user}], config)
                if len(ids) + config.max_new_tokens > context:
                    row.stop_reason = "context"
                    bar.update(len(dialogue.turns) - t)
                    break
                output = model.generate(
                    input_ids=torch.tensor([ids], device=model.device), attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
                    do_sample=False, max_new_tokens=config.max_new_tokens, eos_token_id=stops, pad_token_id=pad,
                )
                reply = tokenizer.decode(output[0, len(ids) :], skip_special_tokens=True).strip()
                row.turns.append(score_turn(t + 1, turn, user, reply, None))
                row.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
                bar.update(1)
            row.stop_reason = row.stop_reason or "turns"
            transcripts.append(transcript(row))
    return transcripts

