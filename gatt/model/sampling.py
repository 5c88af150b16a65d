"""Sampling a reply's tokens: greedy, or temperature and nucleus sampling with Hugging Face's logits processors,
and the sampler's settings as command-line flags, each default written once (`SAMPLER_DEFAULTS`, `MAX_NEW_TOKENS`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation import (
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from gatt.io.config import arg


class NucleusWarper(LogitsProcessor):
    """Top-p (nucleus) filtering that keeps Hugging Face's `TopPLogitsWarper` set without sorting the vocabulary.

    A token stays when the probability mass of the tokens more likely than it is below `top_p` (the most
    likely token always stays): the smallest most-likely set whose mass reaches `top_p`. The set is
    found among each row's `candidates` most likely tokens (`topk`, linear in the vocabulary) where they
    hold `top_p` of the mass; a row whose mass is spread wider falls back to the full sort. Sorting all
    49,152 tokens of SmolLM2's vocabulary for 64 rows at every step was most of a teacher's sampling time.
    The kept set equals `TopPLogitsWarper`'s up to float rounding of a token whose mass sits exactly on
    the boundary (tested on random rows).

    Args:
        top_p: the nucleus mass, in (0, 1]; 1.0 keeps every token.
        candidates: how many of each row's most likely tokens the set is looked for among before the full sort.

    Raises:
        ValueError: when `top_p` is not in (0, 1].
    """

    def __init__(self, top_p: float, candidates: int = 1024) -> None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.top_p, self.candidates = top_p, candidates
        self.fallback = TopPLogitsWarper(top_p)

    def __call__(self, input_ids: Tensor | None, scores: Tensor) -> Tensor:  # (B, V) -> (B, V)
        if self.top_p >= 1.0:
            return scores
        probs = scores.float().softmax(-1)  # (B, V)
        top, index = probs.topk(min(self.candidates, scores.shape[-1]), dim=-1)  # (B, k), most likely first
        keep = top.cumsum(-1) - top < self.top_p  # the mass of the tokens before each is below top_p
        keep[:, 0] = True
        out = torch.full_like(scores, float("-inf")).scatter(
            1, index, scores.gather(1, index).masked_fill(~keep, float("-inf"))
        )
        wide = top.sum(-1) < self.top_p  # (B,): the nucleus reaches past the candidates
        if wide.any():
            out[wide] = self.fallback(input_ids, scores[wide])
        return out


class Sampler:
    """Greedy, or temperature + top-p sampling from a seeded generator.

    `repetition_penalty` and `no_repeat_ngram_size` are Hugging Face's logits processors of the same
    names, applied to the reply being written (not to the history): the usual cure for a small model's
    greedy loops ("I am a scientist. I am a scientist. ...").

    Args:
        do_sample: sample (temperature + top-p) instead of taking the most likely token.
        temperature: sampling temperature.
        top_p: nucleus sampling mass.
        seed: the seed of the sampler's generator.
        repetition_penalty: Hugging Face's repetition penalty over the reply being written; 1.0: off.
        no_repeat_ngram_size: no n-gram of this size twice in one reply; 0: off.
        device: the device of the generator (the logits').
    """

    def __init__(
        self,
        *,
        do_sample: bool,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.do_sample = do_sample
        self.processors = LogitsProcessorList(
            ([RepetitionPenaltyLogitsProcessor(repetition_penalty)] if repetition_penalty != 1.0 else [])
            + ([NoRepeatNGramLogitsProcessor(no_repeat_ngram_size)] if no_repeat_ngram_size > 0 else [])
        )
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), NucleusWarper(top_p)])
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: Tensor, reply: Tensor) -> Tensor:  # (B, V), (B, t) tokens so far -> (B,)
        scores = self.processors(reply, logits.float()) if self.processors else logits
        if not self.do_sample:
            return scores.argmax(-1)
        scores = self.warpers(None, scores.float())
        return torch.multinomial(scores.softmax(-1), 1, generator=self.generator)[:, 0]


MAX_NEW_TOKENS = 64  # a reply's length limit in tokens, wherever replies are generated (teacher, report, GRPO)

# The `Sampler` flags' built-in defaults: what a flag not given takes when the model folder's
# generation_config.json does not set it (as `generate()` reads its defaults from that file).
SAMPLER_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.7,
    "top_p": 0.95,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
}
FLAG_GIVEN, BUILT_IN = "command line", "built-in default"  # sources of a sampler setting besides the folder's file


def sampler_flags(folder: str) -> type:
    """A dataclass of the four sampler settings as command-line fields (gatt/io/config.py), each None unless given.

    `sampler_settings` then reads it from `folder` generation_config.json, else takes SAMPLER_DEFAULTS. A command's
    config inherits it, so every generating command has the same flags, each default named once.

    Args:
        folder: the model folder as the flags' help names it (e.g. "the --teacher folder's").

    Returns:
        The dataclass `SamplerFlags` (keyword-only fields temperature, top_p, repetition_penalty,
        no_repeat_ngram_size).
    """
    what = {
        "temperature": "sampling temperature",
        "top_p": "nucleus sampling mass",
        "repetition_penalty": "Hugging Face's repetition penalty over the reply being written; 1.0: off",
        "no_repeat_ngram_size": "no n-gram of this size twice in one reply; 0: off",
    }
    fields = [
        (
            key,
            type(default) | None,
            arg(None, f"{what[key]} (default: {folder} generation_config.json, else {default})"),
        )
        for key, default in SAMPLER_DEFAULTS.items()
    ]
    return dataclasses.make_dataclass("SamplerFlags", fields, kw_only=True)


def generation_config_file(folder: str | Path) -> Path:
    """Where a model folder's generation config is (a .gguf file: its folder's).

    Args:
        folder: a model folder or a .gguf file.

    Returns:
        The path of generation_config.json.
    """
    folder = Path(folder)
    return (folder.parent if folder.suffix == ".gguf" else folder) / "generation_config.json"


def folder_sampler_settings(folder: str | Path) -> dict[str, float | int]:
    """The sampler settings that `folder`'s generation_config.json sets.

    Only the keys the file gives: transformers leaves the others None.

    Args:
        folder: a model folder or a .gguf file.

    Returns:
        Setting -> value, typed as in SAMPLER_DEFAULTS; {} without the file.
    """
    path = generation_config_file(folder)
    if not path.is_file():
        return {}
    config = GenerationConfig.from_pretrained(path.parent)
    values = {key: getattr(config, key, None) for key in SAMPLER_DEFAULTS}
    return {key: type(SAMPLER_DEFAULTS[key])(v) for key, v in values.items() if v is not None}


def sampler_settings(
    given: Mapping[str, Any], folder: str | Path | None
) -> tuple[dict[str, float | int], dict[str, str]]:
    """Each sampler setting's value and where each came from.

    The value in `given` where not None; else the one set by `folder`'s generation_config.json; else
    SAMPLER_DEFAULTS.

    Args:
        given: the command line's settings.
        folder: the model folder; None: an oracle, no file to read.

    Returns:
        (setting -> value, setting -> its source: FLAG_GIVEN, the generation_config.json path, or BUILT_IN).
    """
    read = folder_sampler_settings(folder) if folder is not None else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, built_in in SAMPLER_DEFAULTS.items():
        if given.get(key) is not None:
            values[key], sources[key] = given[key], FLAG_GIVEN
        elif key in read:
            values[key], sources[key] = read[key], str(generation_config_file(folder))
        else:
            values[key], sources[key] = built_in, BUILT_IN
    return values, sources
