"""Teachers for context distillation: the toy world's scripted oracle, or any causal LM directory.

A teacher answers a batch of turn requests, each the dialogue so far with the instruction appended to
every user message, with `k` candidate replies per request. `teacher_gate` is the answer gate a candidate must also
pass, its relevance judged by the teacher's own model where the gate asks for the likelihood contrast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from data_gen.toy_world import ToyResponder
from data_gen.user_turns import UserTurn
from gatt.data.checks import Constraint
from gatt.eval.gate import (
    AnswerGate,
    GateConfig,
    relevance_embedder,
)
from gatt.eval.relevance import RelevanceScorer
from gatt.io.config import REQUIRED, arg
from gatt.model.chat_model import TORCH_DTYPES, load_chat_model
from gatt.model.embedded import model_path
from gatt.model.folder import check_model_folder
from gatt.model.generation import ChatBatch
from gatt.model.numerics import NUMERICS
from gatt.model.sampling import MAX_NEW_TOKENS, SAMPLER_DEFAULTS, Sampler, sampler_flags, sampler_settings

BATCH_SIZE = 32  # prompts per generate() call


@dataclass(frozen=True)
class TurnRequest:
    """One assistant turn to sample: the augmented history ending in a user message, and what it holds."""

    messages: list[dict[str, str]]
    turn: UserTurn
    constraints: Sequence[Constraint]
    key: str | None = None  # the dialogue's id: lets a model teacher keep its KV cache from turn to turn


class Teacher(Protocol):
    """Answers each request with up to `k` candidates; an empty list means the dialogue cannot go on."""

    name: str
    scorer: RelevanceScorer | None  # judges whether a reply answers a user turn that has no on-topic check

    def sample(self, requests: Sequence[TurnRequest], k: int) -> list[list[str]]:
        """Candidate replies for each request.

        Args:
            requests: the turns to answer.
            k: the most candidates per request.

        Returns:
            Up to `k` candidates per request, in order; an empty list means the dialogue cannot go on.
        """
        ...

    def seed(self, seed: int) -> None:
        """Restart sampling from `seed` (synthesis seeds each shard, so resuming reproduces it).

        Args:
            seed: the sampling seed.
        """


class OracleTeacher:
    """The toy world's scripted responder: one deterministic, always-obeying candidate.

    Args:
        catalogue: the constraints the responder knows how to obey.
    """

    name = "oracle"
    scorer = None  # the toy world's turns carry their topic: the on-topic check judges them

    def __init__(self, catalogue: Sequence[Constraint]) -> None:
        self.responder = ToyResponder(catalogue)

    def sample(self, requests: Sequence[TurnRequest], k: int) -> list[list[str]]:
        """One candidate per request (sampling it k times would give k copies).

        Args:
            requests: the turns to answer.
            k: unused: the oracle gives one candidate.

        Returns:
            The responder's reply to each request's user turn under its constraints, one per request.
        """
        return [[self.responder.reply(r.turn, r.constraints)] for r in requests]

    def seed(self, seed: int) -> None:
        """Nothing to seed: the oracle is deterministic.

        Args:
            seed: ignored.
        """


class ModelTeacher:
    """A causal LM with a chat template: k sampled candidates per request, batched across dialogues.

    Generation runs on `gatt.model.generation.ChatBatch`: each prompt is encoded once for its k candidates,
    and requests that carry a `key` (synthesis gives the dialogue id) keep their KV cache from one turn
    to the next, the kept candidate's row (recognised as the history's last reply), so a dialogue's
    history is never encoded twice.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        temperature: float = SAMPLER_DEFAULTS["temperature"],
        top_p: float = SAMPLER_DEFAULTS["top_p"],
        repetition_penalty: float = SAMPLER_DEFAULTS["repetition_penalty"],
        no_repeat_ngram_size: int = SAMPLER_DEFAULTS["no_repeat_ngram_size"],
        max_new_tokens: int = MAX_NEW_TOKENS,
        batch_size: int = BATCH_SIZE,
        device: str | None = None,
        dtype: str | None = None,
        device_map: str | None = None,
        numerics: str = "exact",
        seed: int = 0,
    ) -> None:
        """Load the teacher and its sampler.

        Args:
            model_dir: the causal LM's directory (its tokenizer needs a chat template).
            temperature: sampling temperature.
            top_p: nucleus sampling mass.
            repetition_penalty: Hugging Face's repetition penalty over the reply being written; 1.0: off.
            no_repeat_ngram_size: no n-gram of this size twice in one reply; 0: off.
            max_new_tokens: a reply's length limit in tokens; a prompt longer than the context less this gets no
                candidates.
            batch_size: dialogues decoded together in one `ChatBatch`.
            device: default this process's device (cuda:LOCAL_RANK under a launcher, else cuda if there is one,
                else cpu).
            dtype: fp32, bf16, fp16 or auto (the checkpoint's); default: transformers' default.
            device_map: e.g. "auto": spread a teacher too large for one device over the visible ones, instead of
                `device`.
            numerics: exact, bf16, or int8 on CPU (gatt/model/numerics.py: faster sampling; the candidates differ).
            seed: the sampling seed.
        """
        self.name = str(model_dir)
        self.model, self.tokenizer = load_chat_model(
            model_dir, role="teacher", device=device, device_map=device_map, dtype=dtype, numerics=numerics
        )
        self.device = self.model.device  # where inputs go (with a device map: the embeddings')
        self.scorer = RelevanceScorer(self.model, self.tokenizer)  # the teacher judges its own candidates' relevance
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.max_prompt = getattr(self.model.config, "max_position_embeddings", 2048) - max_new_tokens
        self.sampler = Sampler(
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            repetition_penalty=repetition_penalty,
            no_repeat_ngram_size=no_repeat_ngram_size,
            device=self.device,
        )
        self._groups: list[tuple[ChatBatch, list[Any]]] = []  # dialogues under way: a batch and its dialogues
        self._candidates: dict[Any, list[str]] = {}  # each dialogue's candidates of its last turn

    def seed(self, seed: int) -> None:
        """Restart sampling from `seed` and drop the dialogues under way (their KV caches and candidates).

        Args:
            seed: the sampling seed.
        """
        self.sampler.generator.manual_seed(seed)
        self._groups, self._candidates = [], {}

    def sample(self, requests: Sequence[TurnRequest], k: int) -> list[list[str]]:
        """k sampled replies per request; none for a request whose prompt no longer fits the context.

        A request with a `key` continues its dialogue's batch row, the candidate its history kept as the last reply
        (its KV cache kept); one without starts a fresh row.

        Args:
            requests: the turns to answer.
            k: candidates per request.

        Returns:
            `k` candidates per request, in order; an empty list for a request whose prompt does not fit.
        """
        prompts = [
            self.tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            for r in requests
        ]
        keys = [r.key if r.key is not None else object() for r in requests]  # no key: a fresh row, nothing kept
        fits = {key: i for i, key in enumerate(keys) if len(prompts[i]) <= self.max_prompt}
        self._settle(requests, fits)
        under_way = {key for _, members in self._groups for key in members}
        waiting = [key for key in fits if key not in under_way]
        for start in range(0, len(waiting), self.batch_size):
            chat = ChatBatch(self.model, self.tokenizer, self.sampler, max_new_tokens=self.max_new_tokens)
            self._groups.append((chat, waiting[start : start + self.batch_size]))
        candidates: list[list[str]] = [[] for _ in requests]
        groups = []
        for chat, members in self._groups:
            mine = [key for key in members if key in fits]
            if mine:
                out = chat.generate({key: prompts[fits[key]] for key in mine}, k)
                for key in mine:
                    candidates[fits[key]] = self._candidates[key] = [c.text for c in out[key]]
                groups.append((chat, mine))
        self._groups = groups
        return candidates

    def _settle(self, requests: Sequence[TurnRequest], fits: dict[Any, int]) -> None:
        """Keep each continuing dialogue's chosen candidate (the history's last reply); drop the others."""
        for chat, members in self._groups:
            chosen = {}
            for key in members:
                if key in fits:
                    messages = requests[fits[key]].messages
                    last = messages[-2]["content"] if len(messages) >= 2 else None
                    previous = self._candidates.get(key, [])
                    chosen[key] = previous.index(last) if last in previous else 0  # else: re-rendered tokens are fed
            chat.keep(chosen)
        self._candidates = {key: c for key, c in self._candidates.items() if key in fits}


@dataclass(kw_only=True)
class TeacherConfig(sampler_flags("the --teacher folder's")):
    """The teacher of `data_gen gatt`, `replay` and `pass-rate`: each field a flag and a key of `--config`."""

    teacher: str = arg(
        REQUIRED, "'oracle' (the toy world's responder), 'embedded' (the shipped chat model) or a causal LM directory"
    )
    max_new_tokens: int = arg(MAX_NEW_TOKENS, "reply length limit")
    batch_size: int = arg(BATCH_SIZE, "prompts per teacher generate() call")
    device: str | None = arg(
        None,
        "teacher device, e.g. cuda, cuda:1, cpu (default: this process's GPU under torchrun/accelerate launch, else "
        "cuda if available, else cpu)",
    )
    teacher_dtype: str | None = arg(
        None,
        "load the teacher in this dtype (bf16 halves its memory; default: transformers' default)",
        choices=sorted(TORCH_DTYPES),
    )
    teacher_numerics: str = arg(
        "exact",
        "exact (fp32); bf16 (faster on a CPU with bf16 instructions); or int8: the teacher's Linear layers "
        "dynamically quantised, CPU only. The fast modes draw other candidates (gatt/model/numerics.py; int8 does not pay "
        "on SmolLM2-135M); auto: bf16 where the device has fast bf16 arithmetic, else exact",
        choices=NUMERICS,
    )
    teacher_device_map: str | None = arg(
        None,
        "spread a teacher too large for one device over the visible GPUs (e.g. auto, balanced); run one process per "
        "machine with it, or give each process its own CUDA_VISIBLE_DEVICES",
        metavar="MAP",
    )


def teacher_decoding(config: TeacherConfig) -> tuple[dict[str, float | int], dict[str, str]]:
    """The teacher's sampler settings and where each came from.

    Each flag given, else the teacher folder's generation_config.json, else the built-in default (the oracle has no
    folder).

    Args:
        config: the teacher's flags.

    Returns:
        (setting -> value, setting -> its source), as `sampler_settings` gives them.
    """
    return sampler_settings(asdict(config), None if config.teacher == "oracle" else model_path(config.teacher))


def build_teacher(config: TeacherConfig, constraints: list[Constraint]) -> Teacher:
    """The oracle or a model teacher as `config` says.

    Args:
        config: the teacher's flags: `teacher` is "oracle", "embedded" or a causal LM directory.
        constraints: the catalogue the oracle (the toy world's responder) answers under.

    Returns:
        An `OracleTeacher` or a `ModelTeacher`.

    Raises:
        FileNotFoundError: when the teacher folder or .gguf file does not exist (`check_model_folder`).
        ValueError: when it is not a model folder (`check_model_folder`).
    """
    if config.teacher == "oracle":
        return OracleTeacher(constraints)
    folder = model_path(config.teacher)
    check_model_folder(
        folder, "--teacher", hint=" ('oracle' is the toy world's responder, 'embedded' the shipped chat model)"
    )
    decoding, _ = teacher_decoding(config)
    return ModelTeacher(
        folder,
        **decoding,
        max_new_tokens=config.max_new_tokens,
        batch_size=config.batch_size,
        device=config.device,
        dtype=config.teacher_dtype,
        device_map=config.teacher_device_map,
        numerics=config.teacher_numerics,
    )


def gate_config(
    strict_repeats: bool = False, strict_gate: bool = False, relevance_judge: str | None = None
) -> GateConfig:
    """The teacher's answer gate: the default, without the topic-change exemption, or the real-model gate.

    Args:
        strict_repeats: Drop the topic-change exemption (default False).
        strict_gate: Use the real-model gate, `GateConfig.strict()` (default False; it overrides `strict_repeats`).
        relevance_judge: Judge relevance by this judge (default None: the gate's own default).

    Returns:
        The gate's config.
    """
    gate = GateConfig.strict() if strict_gate else GateConfig(topic_change_exempts=not strict_repeats)
    return gate if relevance_judge is None else gate.judged_by(relevance_judge)


def teacher_gate(settings: GateConfig, teacher: Teacher) -> AnswerGate:
    """The answer gate of `settings` with the teacher's judges.

    Args:
        settings: The gate's config.
        teacher: The teacher: its likelihood contrast (`scorer`), and its device (else "cpu") for the embedding model
            where `settings` name that judge.

    Returns:
        The answer gate.
    """
    return AnswerGate(settings, teacher.scorer, relevance_embedder(settings, getattr(teacher, "device", "cpu")))
