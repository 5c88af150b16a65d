"""Roll test dialogues out turn by turn with the model under test writing every reply.

`rollout` runs a batch of dialogues in lockstep on a `gatt.model.generation.ChatBatch`: one KV cache per
dialogue kept across turns, so a history is never re-encoded (see that module for how rows of
different lengths and re-tokenised replies are handled). `reference_rollout` re-encodes the rendered
history with Hugging Face `generate()` each turn, one dialogue at a time: the reference for tests and
benchmarks. With `measure_attention`, each reply records the share of attention its tokens put on the
instruction's tokens, per (layer, head), and its means per layer and over the network. With
`split_softmax`, every layer boosts its attention on the instruction's tokens as the replies are written.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from accelerate import PartialState
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gatt.data.collator import Placement, append_instruction, place_instruction
from gatt.eval.plan import EvalDialogue, PlannedTurn
from gatt.io.distributed import gather_items, my_items
from gatt.model.generation import DECODERS as CHAT_BATCH_DECODERS
from gatt.model.generation import ChatBatch, decoder_options, left_padded, new_tokens, stop_token_ids
from gatt.model.sampling import MAX_NEW_TOKENS, SAMPLER_DEFAULTS, Sampler


@dataclass(frozen=True)
class RolloutConfig:
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
class _Rollout:
    """One dialogue under way: its history as the model sees it and its transcript so far."""

    dialogue: EvalDialogue
    messages: list[dict[str, str]] = field(default_factory=list)  # user/assistant history (no instruction)
    turns: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None

    def add(self, number: int, turn: PlannedTurn, user: str, reply: str, attention: list[list[float]] | None) -> None:
        self.turns.append(score_turn(number, turn, user, reply, attention))
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


def context_length(model: PreTrainedModel) -> int:
    return getattr(model.config, "max_position_embeddings", None) or 2048


def user_message(dialogue: EvalDialogue, turn: PlannedTurn, config: RolloutConfig) -> str:
    """The user message as the model sees it: with the instructions in force appended (NAME+repeat), or with the
    words of the event the turn gives (an instruction given late, changed or withdrawn), or as planned. A dialogue
    built without events keeps its turn-one instruction throughout."""
    if config.repeat_instruction:
        state = turn.state if dialogue.events else dialogue.instruction
        return append_instruction(turn.user, state) if state else turn.user
    return append_instruction(turn.user, turn.event) if turn.event else turn.user


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
    number: int, turn: PlannedTurn, user: str, reply: str, attention: list[list[float]] | None
) -> dict[str, Any]:
    """The transcript entry of one turn: the reply and every check's result (the answer gate comes after: judge.py).

    `attention`: (layers, heads) shares of the reply's attention on the instruction's tokens, or None."""
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


def transcript(row: _Rollout) -> dict[str, Any]:
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
    rows: Sequence[_Rollout],
    t: int,
    config: RolloutConfig,
    bar: tqdm,
) -> tuple[dict[int, list[int]], dict[int, list[int]], dict[int, str]]:
    """Turn `t` of every row still under way: its rendered prompt, its instruction's token indices and its user
    message, by row index. A row out of turns, or whose prompt and reply would pass the context, stops here."""
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


# The most dialogue-turns (dialogues x turns) a batch may have for `auto` to roll it out with Hugging Face
# `generate()` instead of the engine. Measured on 2 CPUs (benchmarks/bench_crossover.py, results/crossover_*.json,
# docs/benchmarks.md), SmolLM2-135M greedy without the probe: the engine 0.98x batched generate() carrying its cache at
# 8 x 8 and 0.99x at 32 x 2, 1.12x at 32 x 4 (128), 1.27x at 32 x 8 (256). A step's arithmetic is the same on both
# sides; the engine's edge (its packed cache, the rows it drops) grows with the turns.
GENERATE_AT_MOST = 128
# What `RolloutConfig.decoder` (and the eval CLI's --decoder) takes: ChatBatch's decoders, `engine` (ChatBatch's own
# choice for the device, at every size) and `generate` (`generate_rollout`, its cache carried)
DECODERS = ("auto", "engine", *(d for d in CHAT_BATCH_DECODERS if d != "auto"), "generate")


def beyond_generate(config: RolloutConfig) -> str | None:
    """What of `config` the greedy `generate()` paths (`generate_rollout`, `reference_rollout`) cannot do (None:
    nothing)."""
    if config.do_sample:
        return "sampling (its random draws differ)"
    if config.measure_attention:
        return "the attention probe (generate() gives no attention without eager attention)"
    if config.split_softmax is not None:
        return "split-softmax"
    return None


def generate_mismatch(config: RolloutConfig) -> str | None:
    """Why `generate_rollout` would not write `rollout`'s replies under `config` (None: it writes the same ones)."""
    if (why := beyond_generate(config)) is not None:
        return why
    if config.repetition_penalty != 1.0 or config.no_repeat_ngram_size:
        return "a repetition penalty or n-gram rule (generate() counts the prompt's tokens too)"
    return None


def batch_decoder(model: PreTrainedModel, config: RolloutConfig, batch: Sequence[EvalDialogue]) -> str:
    """What rolls `batch` out: `generate`, or one of ChatBatch's decoders (`decoder_options`' names, auto included).

    auto is `generate` where the engine does not beat generate() by 1.2x (on a CPU in fp32, a batch of at most
    GENERATE_AT_MOST dialogue-turns) and generate() writes the same replies (`generate_mismatch`), else the engine's
    own choice for the device; `engine` is that choice at every size."""
    if config.decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {config.decoder!r}")
    if config.decoder == "generate":
        if (why := generate_mismatch(config)) is not None:
            raise ValueError(f"decoder generate writes the engine's replies only without {why}: use decoder auto")
        return "generate"
    small = len(batch) * max((len(d.turns) for d in batch), default=0) <= GENERATE_AT_MOST
    exact = model.device.type == "cpu" and model.dtype == torch.float32  # where the same replies were measured
    if config.decoder == "auto" and exact and small and generate_mismatch(config) is None:
        return "generate"
    return "auto" if config.decoder == "engine" else config.decoder


@torch.no_grad()
def rollout(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dialogues: Sequence[EvalDialogue],
    config: RolloutConfig = RolloutConfig(),
    *,
    progress: bool = True,
    batches: Collection[int] | None = None,
) -> list[dict[str, Any]]:
    """Transcripts of `dialogues` (same order), batched across dialogues, with the KV cache reused across turns.

    Each batch runs on the engine (`ChatBatch`) or, where `batch_decoder` says so, on `generate_rollout` (the same
    replies). `batches`: roll out only these batches (of `config.batch_size` dialogues, numbered from 0): a
    process's share."""
    if not tokenizer.chat_template:
        raise ValueError(
            f"{getattr(tokenizer, 'name_or_path', 'the tokenizer')} has no chat template: the evaluation needs a chat model"
        )
    model.eval()
    sampler = Sampler(
        do_sample=config.do_sample,
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
        repetition_penalty=config.repetition_penalty,
        no_repeat_ngram_size=config.no_repeat_ngram_size,
        device=model.device,
    )
    transcripts: list[dict[str, Any]] = []
    starts = [
        start for b, start in enumerate(range(0, len(dialogues), config.batch_size)) if batches is None or b in batches
    ]
    total = sum(len(d.turns) for start in starts for d in dialogues[start : start + config.batch_size])
    with tqdm(total=total, desc="rollout", unit="turn", disable=not progress) as bar:
        for start in starts:
            # Each batch samples from its own seed: its replies do not depend on which batches ran before it.
            sampler.generator.manual_seed(config.seed * 100_003 + start // config.batch_size)
            batch = dialogues[start : start + config.batch_size]
            decoder = batch_decoder(model, config, batch)
            if decoder == "generate":
                transcripts += generate_rollout(model, tokenizer, batch, config, cache="carry", progress=False)
                bar.update(sum(len(d.turns) for d in batch))
                continue
            rows = [_Rollout(d) for d in batch]
            chat = ChatBatch(
                model,
                tokenizer,
                sampler,
                max_new_tokens=config.max_new_tokens,
                measure_attention=config.measure_attention,
                split_softmax=config.split_softmax,
                shrink=config.shrink,
                **decoder_options(model, decoder),
            )
            for t in range(max(len(r.dialogue.turns) for r in rows)):
                prompts, marked, users = next_prompts(model, tokenizer, rows, t, config, bar)
                if not prompts:
                    break
                for i, [candidate] in chat.generate(prompts, marked=marked).items():
                    rows[i].add(t + 1, rows[i].dialogue.turns[t], users[i], candidate.text, candidate.attention)
                bar.update(len(prompts))
            for row in rows:
                row.stop_reason = row.stop_reason or "turns"
            transcripts += [transcript(row) for row in rows]
    return transcripts


def distributed_rollout(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dialogues: Sequence[EvalDialogue],
    config: RolloutConfig,
    state: PartialState,
) -> list[dict[str, Any]]:
    """`rollout` with the batches dealt across the job's processes; every process gets all transcripts, in order.

    A batch's replies depend only on its dialogues and seed, so the transcripts equal one process's."""
    size = config.batch_size
    batches = my_items(-(-len(dialogues) // size), state)
    indices = [i for b in batches for i in range(b * size, min((b + 1) * size, len(dialogues)))]
    own = rollout(model, tokenizer, dialogues, config, batches=set(batches), progress=state.is_local_main_process)
    return gather_items(dict(zip(indices, own)), state)


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
    if (why := beyond_generate(config)) is not None:
        raise ValueError(
            f"reference_rollout is the greedy reference: no sampling, no attention probe, no split-softmax (got {why})"
        )
    model.eval()
    stops = sorted(stop_token_ids(model, tokenizer))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    transcripts = []
    with tqdm(total=sum(len(d.turns) for d in dialogues), desc="reference", unit="turn", disable=not progress) as bar:
        for dialogue in dialogues:
            row = _Rollout(dialogue)
            for t, turn in enumerate(dialogue.turns):
                user = user_message(dialogue, turn, config)
                ids, _ = render(tokenizer, dialogue, [*row.messages, {"role": "user", "content": user}], config)
                if len(ids) + config.max_new_tokens > context_length(model):
                    row.stop_reason = "context"
                    bar.update(len(dialogue.turns) - t)
                    break
                output = model.generate(
                    input_ids=torch.tensor([ids], device=model.device),
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
                    do_sample=False,
                    max_new_tokens=config.max_new_tokens,
                    eos_token_id=stops,
                    pad_token_id=pad,
                )
                reply = tokenizer.decode(output[0, len(ids) :], skip_special_tokens=True).strip()
                row.add(t + 1, turn, user, reply, None)
                bar.update(1)
            row.stop_reason = row.stop_reason or "turns"
            transcripts.append(transcript(row))
    return transcripts


GenerateCache = Literal["none", "carry", "static"]


@torch.no_grad()
def generate_settings(
    config: RolloutConfig, stops: list[int], pad: int, cache: GenerateCache, static_cache_len: int | None
) -> dict[str, Any]:
    """generate()'s keyword arguments for `generate_rollout`: greedy, every decoding parameter given (none read from the
    model folder), stopping at `stops`, padding with `pad`; with `cache="static"`, a static cache (`static_cache_len`
    columns, or generate()'s own size). A config generate() cannot follow, or another cache, is refused."""
    if (why := beyond_generate(config)) is not None:
        raise ValueError(
            f"generate_rollout is the greedy baseline: no sampling, no attention probe, no split-softmax (got {why})"
        )
    if cache not in ("none", "carry", "static"):
        raise ValueError(f"cache must be 'none', 'carry' or 'static', got {cache!r}")
    return {
        "do_sample": False,
        "max_new_tokens": config.max_new_tokens,
        "min_new_tokens": 0,
        "eos_token_id": stops,
        "pad_token_id": pad,
        "repetition_penalty": config.repetition_penalty,
        "no_repeat_ngram_size": config.no_repeat_ngram_size,
        "temperature": None,
        "top_p": None,
        "top_k": None,
        "return_dict_in_generate": True,
        **({"cache_implementation": "static", "max_cache_len": static_cache_len} if cache == "static" else {}),
    }


def generate_rollout(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dialogues: Sequence[EvalDialogue],
    config: RolloutConfig = RolloutConfig(),
    *,
    cache: GenerateCache = "none",
    static_cache_len: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """The transcripts as a user of Hugging Face would write them: one `generate()` call per turn over all
    `dialogues` (left-padded), greedy, every decoding parameter passed (nothing read from the model folder's
    generation_config.json). The baseline `rollout` is measured against (benchmarks/bench_smollm2.py).

    `cache`: "none" re-encodes every history each turn; "carry" keeps the batch's KV cache from turn to turn
    (each row's cached tokens that its re-rendered history no longer starts with are masked out, and the new ones
    follow a masked gap: generate() takes any 0/1 attention mask and counts positions over the 1s); "static"
    re-encodes into `cache_implementation="static"` (the cache `torch.compile` needs on a GPU), `static_cache_len`
    columns long when given (sized once for the longest turn, generate() compiles its step once: sized per call, the
    cache grows and the step recompiles at each longer turn). The repetition penalty of `generate()` counts the
    prompt's tokens too (ours: the reply's only): with a penalty the replies differ, without one they are the same."""
    stops = sorted(stop_token_ids(model, tokenizer))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    decoding = generate_settings(config, stops, pad, cache, static_cache_len)
    model.eval()
    device = model.device
    rows = [_Rollout(d) for d in dialogues]
    fed: list[list[int]] = [[] for _ in rows]  # carry: each row's real tokens in the batch, in order
    columns: list[list[int]] = [[] for _ in rows]  # carry: the batch column of each
    sequences = torch.zeros(len(rows), 0, dtype=torch.long, device=device)  # carry: the batch so far (B, L)
    mask = torch.zeros(len(rows), 0, dtype=torch.long, device=device)
    past = None
    with tqdm(total=sum(len(d.turns) for d in dialogues), desc="generate", unit="turn", disable=not progress) as bar:
        for t in range(max((len(d.turns) for d in dialogues), default=0)):
            prompts, _, users = next_prompts(model, tokenizer, rows, t, config, bar)
            if not prompts:
                break
            if cache == "carry":  # every row stays in the batch; a finished one gets no new tokens
                segments = [new_tokens(fed[i], columns[i], mask[i], prompts.get(i, fed[i])) for i in range(len(rows))]
                order = list(range(len(rows)))
            else:
                order = sorted(prompts)
                segments = [prompts[i] for i in order]
                sequences = mask = torch.zeros(len(order), 0, dtype=torch.long, device=device)  # re-encoded
            block, block_mask = left_padded(segments, pad)
            base, width = sequences.shape[1], block.shape[1]
            if cache == "carry":
                for i, segment in zip(order, segments):
                    fed[i] += segment
                    columns[i] += range(base + width - len(segment), base + width)
            input_ids = torch.cat([sequences, block.to(device)], dim=1)
            attention_mask = torch.cat([mask, block_mask.to(device)], dim=1)
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                **({"past_key_values": past} if past is not None else {}),
                **decoding,
            )
            new = output.sequences[:, input_ids.shape[1] :].tolist()
            generated_mask = torch.zeros(len(order), len(new[0]), dtype=torch.long)
            for j, i in enumerate(order):
                if i not in prompts:
                    continue
                end = next((n for n, token in enumerate(new[j]) if token in stops), len(new[j]))
                reply = tokenizer.decode(new[j][:end], skip_special_tokens=True).strip()
                rows[i].add(t + 1, rows[i].dialogue.turns[t], users[i], reply, None)
                if cache == "carry":
                    generated_mask[j, :end] = 1  # the reply's tokens; its end and what follows are masked out
                    fed[i] += new[j][:end]
                    columns[i] += range(input_ids.shape[1], input_ids.shape[1] + end)
            if cache == "carry":
                sequences = output.sequences
                mask = torch.cat([attention_mask, generated_mask.to(device)], dim=1)
                past = output.past_key_values
            bar.update(len(prompts))
    for row in rows:
        row.stop_reason = row.stop_reason or "turns"
    return [transcript(row) for row in rows]
