"""One turn of a test dialogue, whatever decodes it: the rollout's settings (`RolloutConfig`), the user message with the
instruction placed as the dialogue asks, the prompt the chat template renders, the reply's scores (checks, probes,
attention), and the transcript a finished dialogue leaves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gatt.data.collator import Placement, append_instruction, place_instruction
from gatt.eval.plan import EvalDialogue, PlannedTurn
from gatt.model.sampling import MAX_NEW_TOKENS, SAMPLER_DEFAULTS


@dataclass(frozen=True)
class RolloutConfig:
    """How test dialogues are rolled out: decoding, the instruction's placement, the probes and the decoder.

    Attributes:
        max_new_tokens: a reply's length limit in tokens.
        batch_size: dialogues rolled out together.
        do_sample: sample the replies (default False: greedy).
        temperature: sampling temperature.
        top_p: nucleus sampling mass.
        seed: sampling seed.
        repetition_penalty: Hugging Face's repetition penalty over the reply being written; 1.0: off.
        no_repeat_ngram_size: no n-gram of this size twice in one reply; 0: off.
        placement: where turn one gives the instruction.
        repeat_instruction: the upper bound: the instruction appended to every user turn instead.
        measure_attention: record each reply's share of attention on the instruction's tokens.
        split_softmax: strength with which every head's attention on the instruction is boosted
            (gatt/model/split_softmax.py); None: off.
        shrink: stopped rows leave the decoding batch, holes compacted each turn (False: the older path).
        decoder: one of DECODERS: growing, static, graphs or compiled (`gatt.model.generation.decoder_options`),
            engine (ChatBatch's choice for the device), generate (`generate_rollout`, its cache carried); auto:
            `batch_decoder` chooses.
    """

    max_new_tokens: int = MAX_NEW_TOKENS
    batch_size: int = 32  # dialogues rolled out together
    do_sample: bool = False  # greedy by default
    temperature: float = SAMPLER_DEFAULTS["temperature"]
    top_p: float = SAMPLER_DEFAULTS["top_p"]
    seed: int = 0  # sampling seed
    repetition_penalty: float = SAMPLER_DEFAULTS["repetition_penalty"]  # over the reply being written; 1.0: off
    no_repeat_ngram_size: int = SAMPLER_DEFAULTS["no_repeat_ngram_size"]  # no n-gram twice in one reply; 0: off
    placement: Placement = "system"  # where turn one gives the instruction
    repeat_instruction: bool = False  # the upper bound: the instruction appended to every user turn instead
    measure_attention: bool = False
    split_softmax: float | None = (
        None  # strength: boost every head's attention on the instruction (gatt/model/split_softmax.py)
    )
    shrink: bool = True  # stopped rows leave the decoding batch, holes compacted each turn (False: the older path)
    # one of DECODERS: growing | static | graphs | compiled (gatt.model.generation.decoder_options), engine (ChatBatch's
    # choice for the device), generate (`generate_rollout`, its cache carried); auto: `batch_decoder`
    decoder: str = "auto"


@dataclass
class RolloutRow:
    """One dialogue under way: its history as the model sees it and its transcript so far."""

    dialogue: EvalDialogue
    messages: list[dict[str, str]] = field(default_factory=list)  # user/assistant history (no instruction)
    turns: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None

    def add(self, number: int, turn: PlannedTurn, user: str, reply: str, attention: list[list[float]] | None) -> None:
        """Add a scored turn to the transcript and its exchange to the history.

        Args:
            number: The turn's number (1-based).
            turn: The planned turn.
            user: The user message as sent (its instruction placed).
            reply: The model's reply.
            attention: The reply's attention shares on the instruction, (layers, heads), or None.
        """
        self.turns.append(score_turn(number, turn, user, reply, attention))
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


def context_length(model: PreTrainedModel) -> int:
    """The model's context length in tokens.

    Args:
        model: the model under test.

    Returns:
        Its config's `max_position_embeddings`, or 2048 where the config gives none.
    """
    return getattr(model.config, "max_position_embeddings", None) or 2048


def user_message(dialogue: EvalDialogue, turn: PlannedTurn, config: RolloutConfig) -> str:
    """The user message as the model sees it.

    With the instructions in force appended (NAME+repeat), or with the words of the event the turn gives (an
    instruction given late, changed or withdrawn), or as planned. A dialogue built without events keeps its turn-one
    instruction throughout.

    Args:
        dialogue: the dialogue the turn belongs to.
        turn: the planned turn.
        config: the rollout's settings (`repeat_instruction` appends the instructions in force).

    Returns:
        The user message's text.
    """
    if config.repeat_instruction:
        state = turn.state if dialogue.events else dialogue.instruction
        return append_instruction(turn.user, state) if state else turn.user
    return append_instruction(turn.user, turn.event) if turn.event else turn.user


def render(
    tokenizer: PreTrainedTokenizerBase, dialogue: EvalDialogue, messages: list[dict[str, str]], config: RolloutConfig
) -> tuple[list[int], list[int]]:
    """Token ids of the history ready for the next reply, and the indices of the instruction's tokens in it.

    Args:
        tokenizer: the model's tokenizer, with a chat template.
        dialogue: the dialogue; its instruction is placed as `config.placement` says (none with
            `config.repeat_instruction`).
        messages: the user/assistant history (no instruction), ending in the user message to answer.
        config: the rollout's settings.

    Returns:
        (token ids, indices of the tokens that overlap the instruction's first occurrence: turn one); the indices
        are empty for a dialogue without an instruction.
    """
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
    number: int, turn: PlannedTurn, user: str, reply: str, attention: list[list[float]] | None
) -> dict[str, Any]:
    """The transcript entry of one turn: the reply and every check's result (the answer gate comes after: judge.py).

    Args:
        number: the turn's number (from 1).
        turn: the planned turn, with its checks.
        user: the user message as the model saw it.
        reply: the model's reply.
        attention: (layers, heads) shares of the reply's attention on the instruction's tokens, or None.

    Returns:
        The entry: turn, kind, user, reply, checks (type, passed), checks_passed, since, old_followed, on_topic and
        the attention on the instruction (over the network, per layer, per head; None without `attention`).
    """
    checks = [{"type": c.type, "passed": c.passes(reply)} for c in turn.checks]
    per_layer = None if not attention else [sum(heads) / len(heads) for heads in attention]
    return {
        "turn": number,
        "kind": turn.kind,
        "user": user,
        "reply": reply,
        "checks": checks,
        "checks_passed": all(c["passed"] for c in checks) if checks else None,
        "since": turn.since,
        "old_followed": all(c.passes(reply) for c in turn.old_checks) if turn.old_checks else None,
        "on_topic": all(c.passes(reply) for c in turn.on_topic) if turn.on_topic else None,
        "attention_on_instruction": None if per_layer is None else sum(per_layer) / len(per_layer),
        "attention_per_layer": per_layer,
        "attention_per_head": None if not attention else [[round(share, 6) for share in heads] for heads in attention],
    }


def transcript(row: RolloutRow) -> dict[str, Any]:
    """The transcript of one rolled-out dialogue.

    Args:
        row: the dialogue under way, its turns written.

    Returns:
        The dialogue's id, stratum, tier (where it has one), kind, events, constraint, instruction, stop reason and
        turns.
    """
    d = row.dialogue
    constraint = d.constraint
    return {
        "id": d.id,
        "stratum": d.stratum,
        **({"tier": d.tier} if d.tier else {}),
        "kind": d.kind,
        "events": [{"turn": e.turn, "kind": e.action, "text": e.text} for e in d.events],
        "constraint": None
        if constraint is None
        else {
            "name": constraint.name,
            "family": constraint.family,
            "value": constraint.value,
            "split": constraint.split,
        },
        "instruction": d.instruction,
        "stop_reason": row.stop_reason,
        "turns": row.turns,
    }


def next_prompts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[RolloutRow],
    t: int,
    config: RolloutConfig,
    bar: tqdm,
) -> tuple[dict[int, list[int]], dict[int, list[int]], dict[int, str]]:
    """Turn `t` of every row still under way: its rendered prompt, its instruction's token indices, its user message.

    A row out of turns, or whose prompt and reply would pass the context, stops here (its `stop_reason` set to
    "turns" or "context").

    Args:
        model: the model under test (for its context length).
        tokenizer: the model's tokenizer.
        rows: the dialogues under way.
        t: the turn's index (from 0).
        config: the rollout's settings.
        bar: the progress bar, advanced by the turns a row stopped for the context skips.

    Returns:
        (prompts, instruction token indices, user messages), each by row index.
    """
    prompts, marked, users = {}, {}, {}
    for i, row in enumerate(rows):
        if row.stop_reason is not None:
            continue
        if t >= len(row.dialogue.turns):
            row.stop_reason = "turns"
            continue
        users[i] = user_message(row.dialogue, row.dialogue.turns[t], config)
        ids, span = render(tokenizer, row.dialogue, [*row.messages, {"role": "user", "content": users[i]}], config)
        if len(ids) + config.max_new_tokens > context_length(model):
            row.stop_reason = "context"
            bar.update(len(row.dialogue.turns) - t)
            continue
        prompts[i], marked[i] = ids, span
    return prompts, marked, users
