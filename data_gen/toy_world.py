"""The toy world: a deterministic scripted responder and the base SFT corpus the embedded model learns from.

The responder answers the built-in user messages on topic, in any of the catalogue's languages, and
applies any combination of catalogue constraints (persona line, hobby line, one sentence, capitals,
sign-off), probes included. It is the `oracle` teacher of GAtt synthesis.

The base corpus is built the way ordinary chat SFT data is, so a model trained on it shows the
failure GAtt fixes: instructions attached to one user message govern only that reply; instructions
in the system message appear only in short (1-2 turn) dialogues; plain dialogues and probes with and
without a constraint in view teach the default answers.

The responder's sentences in each language and the hobbies' emoji are data, in data_gen/data/toy_world.yaml
(read by `data_gen.builtin_data`).
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from data_gen import builtin_data
from data_gen.constraints import LANGUAGES, ConstraintSampler, instruction_text
from data_gen.user_turns import TOPICS, UserTurn
from gatt.checks import Constraint

# How both the base corpus and GAtt synthesis attach an instruction to a user message (the eval's upper bound too).
from gatt.collator import append_instruction as with_instruction

# The responder's sentences per language and the hobbies' emoji (data_gen/data/toy_world.yaml, whose
# comments say why they read as they do). TOPIC_REPLIES' {T} is the topic's English noun phrase as a label.
TOPIC_REPLIES: dict[str, tuple[str, ...]] = builtin_data.topic_replies()
GENERIC_REPLY: dict[str, str] = builtin_data.toy_line("generic_reply")  # for messages outside the toy world
FIGURE_LINE: dict[str, str] = builtin_data.toy_line("figure_line")
HOBBY_LINE: dict[str, str] = builtin_data.toy_line("hobby_line")
HOBBY_EMOJI: dict[str, str] = builtin_data.hobby_emoji()  # tells the small model's hobby names apart
SPEAK_LINE: dict[str, str] = builtin_data.toy_line("speak_line")
ASSISTANT_LINE: dict[str, str] = builtin_data.toy_line("assistant_line")
NO_HOBBY_LINE: dict[str, str] = builtin_data.toy_line("no_hobby_line")
HELP_LINE: dict[str, str] = builtin_data.toy_line("help_line")  # after short probe answers, to show the language


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def _hobby_line(lang: str, hobby: str) -> str:
    emoji = HOBBY_EMOJI.get(hobby)
    return HOBBY_LINE[lang].format(f"{hobby} {emoji}" if emoji else hobby)


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)[0]


class ToyResponder:
    """Answers a user turn under the constraints in view, deterministically."""

    def __init__(self, catalogue: Sequence[Constraint]) -> None:
        # Probe questions are recognised by their text, so a probe works wherever it is asked.
        self.probe_family = {p.question: c.family for c in catalogue for p in c.probes}

    def reply(self, turn: UserTurn, in_view: Sequence[Constraint] = ()) -> str:
        """The reply to `turn` obeying every constraint in `in_view` (at most one per family)."""
        by_family = {c.family: c for c in in_view}
        lang = LANGUAGES[by_family["language"].value][0] if "language" in by_family else "en"
        probe = self.probe_family.get(turn.text)
        body = self._body(turn, probe, by_family, lang)
        if "brevity" in by_family:
            return self._format(_first_sentence(body), by_family)
        sentences = [body]
        if "figure" in by_family and probe != "figure":
            sentences.insert(0, FIGURE_LINE[lang].format(by_family["figure"].value))
        if "hobby" in by_family and probe != "hobby":
            sentences.append(_hobby_line(lang, by_family["hobby"].value))
        return self._format(" ".join(sentences), by_family)

    @staticmethod
    def _body(turn: UserTurn, probe: str | None, by_family: dict[str, Constraint], lang: str) -> str:
        if probe == "hobby":
            hobby = by_family.get("hobby")
            first = _hobby_line(lang, hobby.value) if hobby else NO_HOBBY_LINE[lang]
        elif probe == "figure":
            figure = by_family.get("figure")
            first = FIGURE_LINE[lang].format(figure.value) if figure else ASSISTANT_LINE[lang]
        elif probe == "language":
            first = SPEAK_LINE[lang]
        elif probe is not None:  # format probes: any answer shows the format
            first = ASSISTANT_LINE[lang]
        elif turn.topic in TOPICS:
            templates = TOPIC_REPLIES[lang]
            template = templates[zlib.crc32(turn.text.encode()) % len(templates)]
            return template.format(T=_capitalize(TOPICS[turn.topic]["en"]))
        else:
            return GENERIC_REPLY[lang]
        return f"{first} {HELP_LINE[lang]}"

    @staticmethod
    def _format(text: str, by_family: dict[str, Constraint]) -> str:
        if "caps" in by_family:
            text = text.upper()
        if "signoff" in by_family:
            text = f"{text} {by_family['signoff'].value}"
        return text


def base_corpus(
    num_dialogues: int,
    seed: int,
    catalogue: Sequence[Constraint],
    user_pool: Sequence[UserTurn],
    *,
    short_prob: float = 0.5,
    max_turns: int = 12,
) -> Iterator[dict[str, Any]]:
    """Yield base SFT records {"id", "kind", "messages"} in the Hugging Face `messages` format: dialogues with
    local instructions (or none) of 1 to `max_turns` turns, system-prompt dialogues of 1 or 2."""
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
