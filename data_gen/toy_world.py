"""The toy world: a deterministic scripted responder and the base SFT corpus the embedded model learns from.

The responder answers the built-in user messages on topic, in any of the catalogue's languages, and
obeys any combination of non-conflicting catalogue constraints, probes included, by each family's `reply`
rule (data_gen/data/catalogue.yaml): the lines it adds, then replacements, the sentence structure, a word limit,
the text before and after, the letter case and the wrapping, in that order. It is the `oracle` teacher of GAtt
synthesis.

The base corpus is built the way ordinary chat SFT data is, so a model trained on it shows the
failure GAtt fixes: instructions attached to one user message govern only that reply; instructions
in the system message appear only in short (1-2 turn) dialogues; plain dialogues and probes with and
without a constraint in view teach the default answers.

The responder's sentences in each language are data, in data_gen/data/toy_world.yaml (read by
`data_gen.builtin_data`).
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from data_gen import builtin_data
from data_gen.constraints import FAMILY_RULES, LANGUAGES, ConstraintSampler, Family, instruction_text
from data_gen.user_turns import TOPICS, UserTurn
from gatt.data.checks import Constraint

# How both the base corpus and GAtt synthesis attach an instruction to a user message (the eval's upper bound too).
from gatt.data.collator import append_instruction as with_instruction
from gatt.data.events import SHORT_PROB

# The responder's sentences per language (data_gen/data/toy_world.yaml, whose comments say why they read as
# they do). TOPIC_REPLIES' {T} is the topic's English noun phrase as a label.
TOPIC_REPLIES: dict[str, tuple[str, ...]] = builtin_data.topic_replies()
GENERIC_REPLY: dict[str, str] = builtin_data.toy_line("generic_reply")  # for messages outside the toy world
ASSISTANT_LINE: dict[str, str] = builtin_data.toy_line("assistant_line")
HELP_LINE: dict[str, str] = builtin_data.toy_line("help_line")  # after short probe answers, to show the language
QUESTION: dict[str, str] = builtin_data.toy_line("question")
LINES: dict[str, dict[str, str]] = builtin_data.lines()  # a family's line, per language
EMOJI: tuple[str, ...] = builtin_data.emoji()
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD_START = re.compile(r"(^|\s)(\S)")
_FINAL_PUNCTUATION = re.compile(r"[.!?;]+\Z")


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentences(text: str) -> list[str]:
    return _SENTENCE_END.split(text.strip())


class ToyResponder:
    """Answers a user turn under the constraints in view, deterministically.

    Args:
        catalogue: The constraints whose probe questions it recognises, by their text, so a probe works wherever
            it is asked.
    """

    def __init__(self, catalogue: Sequence[Constraint]) -> None:
        # Probe questions are recognised by their text, so a probe works wherever it is asked.
        self.probe_families: dict[str, set[str]] = {}
        for c in catalogue:
            for p in c.probes:
                self.probe_families.setdefault(p.question, set()).add(c.family)

    def reply(self, turn: UserTurn, in_view: Sequence[Constraint] = ()) -> str:
        """The reply to `turn` obeying every constraint in `in_view`.

        Args:
            turn: The user turn; a probe question is answered as a probe.
            in_view: The constraints in view, at most one per family (default none); constraints of families or
                values the catalogue does not have are not obeyed.

        Returns:
            The reply.
        """
        rules = [(FAMILY_RULES[c.family], _attributes(c)) for c in in_view if c.family in FAMILY_RULES]
        rules = [(rule, fill) for rule, fill in rules if fill is not None]
        lang = next((LANGUAGES[fill["value"]][0] for rule, fill in rules if rule.reply.language), "en")
        asked = self.probe_families.get(turn.text)
        answer = next(
            (r for r in rules if asked and r[0].name in asked and (r[0].reply.line or r[0].reply.answer)), None
        )
        sentences = self._body(turn, asked is not None, answer, lang)
        for rule, fill in rules:
            if rule.reply.line and (rule, fill) != answer:
                line = LINES[rule.reply.line][lang].format(**fill)
                sentences.insert(0 if rule.reply.line_first else len(sentences), line)
        for rule, _ in rules:
            for old, new in rule.reply.replace.items():
                sentences = [sentence.replace(old, new) for sentence in sentences]
        text = self._structure(sentences, next((r.reply.structure for r, _ in rules if r.reply.structure), ""))
        for rule, fill in rules:
            if rule.reply.words:
                text = _cut(text, int(rule.reply.words.format(**fill)))
        extra = {"question": QUESTION[lang], "emoji": EMOJI[zlib.crc32(text.encode()) % len(EMOJI)]}
        for rule, fill in rules:
            text = rule.reply.prefix.format(**fill, **extra) + text + rule.reply.suffix.format(**fill, **extra)
        for rule, _ in rules:
            text = _cased(text, rule.reply.case)
        for rule, _ in rules:
            if rule.reply.wrap:
                text = f"{rule.reply.wrap[0]}{text}{rule.reply.wrap[1]}"
        return text

    @staticmethod
    def _body(turn: UserTurn, probe: bool, answer: tuple[Family, dict[str, Any]] | None, lang: str) -> list[str]:
        """The reply's sentences before any rule: a probe's answer and the help line, or the topic's reply."""
        if probe:
            if answer is None:  # a probe of a family not in view, or of a form: any answer shows the form
                return [ASSISTANT_LINE[lang], HELP_LINE[lang]]
            rule, fill = answer
            return [LINES[rule.reply.line or rule.reply.answer][lang].format(**fill), HELP_LINE[lang]]
        if turn.topic in TOPICS:
            templates = TOPIC_REPLIES[lang]
            template = templates[zlib.crc32(turn.text.encode()) % len(templates)]
            return _sentences(template.format(T=_capitalize(TOPICS[turn.topic]["en"])))
        return _sentences(GENERIC_REPLY[lang])

    @staticmethod
    def _structure(sentences: list[str], structure: str) -> str:
        if structure == "first":
            return sentences[0]
        if structure == "numbered":
            return "\n".join(f"{i}. {sentence}" for i, sentence in enumerate(sentences, 1))
        if structure == "bulleted":
            return "\n".join(f"- {sentence}" for sentence in sentences)
        return " ".join(sentences)


def _attributes(constraint: Constraint) -> dict[str, Any] | None:
    """{value, and the value's attributes} of a catalogue constraint; None for a value the catalogue lacks."""
    attributes = FAMILY_RULES[constraint.family].values.get(constraint.value)
    return None if attributes is None else {"value": constraint.value, **attributes}


def _cut(text: str, words: int) -> str:
    """The first `words` words of `text`, ending with its final punctuation (a reply cut short, "Volcanoes: a
    fascinating subject." -> "Volcanoes: a fascinating.")."""
    parts = text.split()
    if len(parts) <= words:
        return text
    end = _FINAL_PUNCTUATION.search(text)
    return " ".join(parts[:words]).rstrip(",:;.!?") + (end.group() if end else ".")


def _cased(text: str, case: str) -> str:
    if case == "upper":
        return text.upper()
    if case == "lower":
        return text.lower()
    if case == "title":
        return _WORD_START.sub(lambda m: m.group(1) + m.group(2).upper(), text)
    return text


def base_corpus(
    num_dialogues: int,
    seed: int,
    catalogue: Sequence[Constraint],
    user_pool: Sequence[UserTurn],
    *,
    short_prob: float = SHORT_PROB,
    max_turns: int = 12,
) -> Iterator[dict[str, Any]]:
    """Yield base SFT records {"id", "kind", "messages"} in the Hugging Face `messages` format.

    Dialogues with local instructions (or none) of 1 to `max_turns` turns, system-prompt dialogues of 1 or 2.
    Each dialogue is drawn from its own seed, so a record does not depend on the number of dialogues.

    Args:
        num_dialogues: The number of dialogues.
        seed: The corpus's seed.
        catalogue: The constraints the instructions are drawn from, and whose probe questions are asked.
        user_pool: The user turns drawn for the messages that are not probes.
        short_prob: The chance of the instruction's short form (default SHORT_PROB).
        max_turns: The most turns of a dialogue that is not a system-prompt one (default 12; at least 2).

    Yields:
        One record per dialogue: "id" (`b-000000`, ...), "kind" (`local`, `system` or `plain`) and "messages".

    Raises:
        ValueError: When `max_turns` is below 2.
    """
    if max_turns < 2:
        raise ValueError(f"max_turns must be >= 2, got {max_turns}")
    responder = ToyResponder(catalogue)
    # Families drawn uniformly (then values): all caps, one value, is drawn as often as 22 hobbies, so the
    # corpus shows enough capitalised topics for the model to write them.
    sampler = ConstraintSampler(catalogue, short_prob=short_prob, by_family=True)
    probes = [(p.question, c.family) for c in catalogue for p in c.probes]
    kinds = ("local", "system", "plain")
    for index in range(num_dialogues):
        rng = random.Random(f"base-{seed}-{index}")
        kind = rng.choices(kinds, weights=(0.5, 0.3, 0.2))[0]
        num_turns = rng.randint(1, 2) if kind == "system" else rng.randint(1, max_turns)
        messages: list[dict[str, str]] = []
        system: list[Constraint] = []
        if kind == "system":
            system, use_short = sampler.sample(rng)
            messages.append({"role": "system", "content": instruction_text(system, use_short)})
        for _ in range(num_turns):
            local: list[Constraint] = []
            if kind == "local" and rng.random() < 0.4:
                local, use_short = sampler.sample(rng)
            in_view = system or local
            if rng.random() < 0.2:  # a probe, of a family in view when there is one
                families = {c.family for c in in_view}
                question = rng.choice([q for q, f in probes if f in families] or [q for q, _ in probes])
                turn = UserTurn(question, None)
            else:
                turn = rng.choice(user_pool)
            user = with_instruction(turn.text, instruction_text(local, use_short)) if local else turn.text
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": responder.reply(turn, in_view)})
        yield {"id": f"b-{index:06d}", "kind": kind, "messages": messages}
