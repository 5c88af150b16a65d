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
from typing import Any, Literal

import torch
from accelerate import PartialState
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gatt.eval.plan import EvalDialogue
from gatt.eval.turns import (
    RolloutConfig,
    RolloutRow,
    context_length,
    next_prompts,
    render,
    transcript,
    user_message,
)
from gatt.io.distributed import gather_items, my_items
from gatt.model.generation import DECODERS as CHAT_BATCH_DECODERS
from gatt.model.generation import ChatBatch, decoder_options, left_padded, new_tokens, stop_token_ids
from gatt.model.sampling import Sampler

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
    """What of `config` the greedy `generate()` paths (`generate_rollout`, `reference_rollout`) cannot do.

    Args:
        config: the rollout's settings.

    Returns:
        Sampling, the attention probe or split-softmax, in words; None: nothing.
    """
    if config.do_sample:
        return "sampling (its random draws differ)"
    if config.measure_attention:
        return "the attention probe (generate() gives no attention without eager attention)"
    if config.split_softmax is not None:
        return "split-softmax"
    return None


def generate_mismatch(config: RolloutConfig) -> str | None:
    """Why `generate_rollout` would not write `rollout`'s replies under `config`.

    Args:
        config: the rollout's settings.

    Returns:
        The reason in words (`beyond_generate`'s, or a repetition penalty or n-gram rule); None: it writes the same
        ones.
    """
    if (why := beyond_generate(config)) is not None:
        return why
    if config.repetition_penalty != 1.0 or config.no_repeat_ngram_size:
        return "a repetition penalty or n-gram rule (generate() counts the prompt's tokens too)"
    return None


def batch_decoder(model: PreTrainedModel, config: RolloutConfig, batch: Sequence[EvalDialogue]) -> str:
    """What rolls `batch` out: `generate`, or one of ChatBatch's decoders (`decoder_options`' names, auto included).

    auto is `generate` where the engine does not beat generate() by 1.2x (on a CPU in fp32, a batch of at most
    GENERATE_AT_MOST dialogue-turns) and generate() writes the same replies (`generate_mismatch`), else the engine's
    own choice for the device; `engine` is that choice at every size.

    Args:
        model: the model under test (its device and dtype).
        config: the rollout's settings; `config.decoder` is the decoder asked for.
        batch: the dialogues of the batch.

    Returns:
        "generate", or the ChatBatch decoder's name ("auto" for `engine`).

    Raises:
        ValueError: when `config.decoder` is not one of DECODERS, or is `generate` for a config whose replies
            generate() would not write the same (`generate_mismatch`).
    """
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
    replies).

    Args:
        model: the model under test.
        tokenizer: its tokenizer, with a chat template.
        dialogues: the test dialogues.
        config: the rollout's settings.
        progress: show a progress bar over the turns.
        batches: roll out only these batches (of `config.batch_size` dialogues, numbered from 0): a process's share;
            None: all.

    Returns:
        One transcript (`transcript`) per dialogue rolled out, in order.

    Raises:
        ValueError: when the tokenizer has no chat template, or `config.decoder` is refused (`batch_decoder`).
    """
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
            rows = [RolloutRow(d) for d in batch]
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

    A batch's replies depend only on its dialogues and seed, so the transcripts equal one process's.

    Args:
        model: the model under test.
        tokenizer: its tokenizer, with a chat template.
        dialogues: the test dialogues, the same on every process.
        config: the rollout's settings.
        state: the job's processes; only the local main process shows a progress bar.

    Returns:
        The transcripts of all `dialogues`, in order.
    """
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
    """The same transcripts the slow way: Hugging Face `generate()` per turn on the re-encoded history.

    One dialogue at a time, greedy.

    Args:
        model: the model under test.
        tokenizer: its tokenizer, with a chat template.
        dialogues: the test dialogues.
        config: the rollout's settings.
        progress: show a progress bar over the turns.

    Returns:
        One transcript per dialogue, in order.

    Raises:
        ValueError: when `config` asks for sampling, the attention probe or split-softmax (`beyond_generate`).
    """
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
            row = RolloutRow(dialogue)
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


# generate_rollout's cache: "none" re-encodes every history each turn; "carry" keeps the batch's KV cache from turn to
# turn (each row's cached tokens that its re-rendered history no longer starts with are masked out, and the new ones
# follow a masked gap: generate() takes any 0/1 attention mask and counts positions over the 1s); "static" re-encodes
# into `cache_implementation="static"` (the cache `torch.compile` needs on a GPU; sized once for the longest turn,
# generate() compiles its step once, where sized per call the cache grows and the step recompiles at each longer turn).
GenerateCache = Literal["none", "carry", "static"]


@torch.no_grad()
def generate_settings(
    config: RolloutConfig, stops: list[int], pad: int, cache: GenerateCache, static_cache_len: int | None
) -> dict[str, Any]:
    """generate()'s keyword arguments for `generate_rollout`.

    Greedy, every decoding parameter given (none read from the model folder). A config generate() cannot follow, or
    another cache, is refused.

    Args:
        config: the rollout's settings.
        stops: the token ids generation stops at.
        pad: the padding token id.
        cache: "none", "carry" or "static"; "static" asks for a static cache.
        static_cache_len: the static cache's columns (None: generate()'s own size); used with `cache="static"` only.

    Returns:
        The keyword arguments of `model.generate()`.

    Raises:
        ValueError: when `config` asks for sampling, the attention probe or split-softmax, or `cache` is not one of
            "none", "carry", "static".
    """
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
    """The transcripts as a user of Hugging Face would write them: one `generate()` call per turn over all `dialogues`.

    Left-padded, greedy, every decoding parameter passed (none read from generation_config.json): the baseline
    `rollout` is measured against (benchmarks/bench_smollm2.py). generate()'s repetition penalty counts the prompt's
    tokens too (ours: the reply's only), so only without one are the replies the same.

    Args:
        model: the model under test.
        tokenizer: its tokenizer, with a chat template.
        dialogues: the test dialogues.
        config: the rollout's settings.
        cache: "none", "carry" or "static": what is kept from turn to turn (GenerateCache).
        static_cache_len: the static cache's columns when given (once for the longest turn: one compile of the step).
        progress: show a progress bar over the turns.

    Returns:
        One transcript per dialogue, in order.

    Raises:
        ValueError: when `config` asks for sampling, the attention probe or split-softmax, or `cache` is unknown
            (`generate_settings`).
    """
    stops = sorted(stop_token_ids(model, tokenizer))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    decoding, device = generate_settings(config, stops, pad, cache, static_cache_len), model.eval().device
    rows = [RolloutRow(d) for d in dialogues]
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
            ends = _add_replies(
                tokenizer, rows, t, {i: (new[j], users[i]) for j, i in enumerate(order) if i in prompts}, stops
            )
            if cache == "carry":
                generated_mask = _carry_replies(order, new, ends, fed, columns, input_ids.shape[1])
                sequences = output.sequences
                mask = torch.cat([attention_mask, generated_mask.to(device)], dim=1)
                past = output.past_key_values
            bar.update(len(prompts))
    for row in rows:
        row.stop_reason = row.stop_reason or "turns"
    return [transcript(row) for row in rows]


def _add_replies(
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[RolloutRow],
    turn: int,
    generated: dict[int, tuple[list[int], str]],
    stops: Sequence[int],
) -> dict[int, int]:
    """Each generated row's reply (its tokens up to the first stop token, decoded) added to its transcript at `turn`.

    Args:
        tokenizer: The model's tokenizer.
        rows: The dialogues' rollouts.
        turn: The turn's index (0-based).
        generated: Row index -> (the tokens generate() wrote after the prompt, the user message the turn sent).
        stops: The stop token ids.

    Returns:
        Row index -> the number of reply tokens before its stop token.
    """
    ends = {}
    for i, (tokens, user) in generated.items():
        ends[i] = next((n for n, token in enumerate(tokens) if token in stops), len(tokens))
        reply = tokenizer.decode(tokens[: ends[i]], skip_special_tokens=True).strip()
        rows[i].add(turn + 1, rows[i].dialogue.turns[turn], user, reply, None)
    return ends


def _carry_replies(
    order: Sequence[int],
    new: list[list[int]],
    ends: dict[int, int],
    fed: list[list[int]],
    columns: list[list[int]],
    start: int,
) -> torch.Tensor:
    """Under cache="carry": each reply's tokens recorded as its row's (`fed`, at batch `columns` from `start`).

    Args:
        order: The row of each batch line.
        new: Each batch line's generated tokens.
        ends: Row -> its reply's token count (`_add_replies`); rows without a reply this turn are absent.
        fed: Each row's real tokens in the batch, extended in place.
        columns: The batch column of each, extended in place.
        start: The batch column of the first generated token.

    Returns:
        The generated tokens' attention mask (B, new tokens): 1 on each reply's tokens, 0 on its end and after.
    """
    generated_mask = torch.zeros(len(order), len(new[0]), dtype=torch.long)
    for j, i in enumerate(order):
        if i in ends:
            generated_mask[j, : ends[i]] = 1
            fed[i] += new[j][: ends[i]]
            columns[i] += range(start, start + ends[i])
    return generated_mask
