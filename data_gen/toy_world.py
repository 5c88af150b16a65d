"""The toy world: a deterministic scripted responder and the base SFT corpus the embedded model learns from.

The responder answers the built-in user messages on topic, in any of the catalogue's languages, and
applies any combination of catalogue constraints (persona line, hobby line, one sentence, capitals,
sign-off), probes included. It is the `oracle` teacher of GAtt synthesis.

The base corpus is built the way ordinary chat SFT data is, so a model trained on it shows the
failure GAtt fixes: instructions attached to one user message govern only that reply; instructions
in the system message appear only in short (1-2 turn) dialogues; plain dialogues and probes with and
without a constraint in view teach the default answers.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from data_gen.constraints import LANGUAGES, ConstraintSampler, instruction_text
from data_gen.user_turns import TOPICS, UserTurn
from gatt.checks import Constraint
# How both the base corpus and GAtt synthesis attach an instruction to a user message (the eval's upper bound too).
from gatt.collator import append_instruction as with_instruction

# Two sentences about a topic, per language. {T} is the topic's noun phrase as a label ("Volcanoes: ..."),
# so no verb, article or case has to agree with it (topics are singular, plural or mass nouns). The label
# is the user's own English words in every language: the toy world does not translate it. A ~1M model
# copies a topic from the question; it did not learn 56 topics x 6 translations (its French replies named
# 1 topic in 16), and no translation exists for a topic it has never seen.
TOPIC_REPLIES = {
    "en": ("{T}: a fascinating subject. There is always something new to learn.",
           "{T}: a topic worth talking about. Many people find this subject interesting.",
           "{T}: a subject with a long and rich history. I could talk about this for hours."),
    "fr": ("{T} : un sujet fascinant. Il y a toujours quelque chose de nouveau à apprendre.",
           "{T} : un thème qui mérite qu'on en parle. Beaucoup de gens trouvent ce sujet intéressant.",
           "{T} : un sujet avec une longue et riche histoire. Je pourrais en parler pendant des heures."),
    "es": ("{T}: un tema fascinante. Siempre hay algo nuevo que aprender.",
           "{T}: un tema que merece una buena conversación. Mucha gente encuentra este tema interesante.",
           "{T}: un tema con una historia larga y rica. Podría hablar de esto durante horas."),
    "de": ("{T}: ein faszinierendes Thema. Es gibt immer etwas Neues zu lernen.",
           "{T}: ein Thema, über das es sich zu sprechen lohnt. Viele Menschen finden dieses Thema spannend.",
           "{T}: ein Thema mit einer langen und reichen Geschichte. Ich könnte stundenlang darüber reden."),
    "it": ("{T}: un argomento affascinante. C'è sempre qualcosa di nuovo da imparare.",
           "{T}: un argomento di cui vale la pena parlare. Molte persone trovano questo tema interessante.",
           "{T}: un argomento con una storia lunga e ricca. Potrei parlarne per ore."),
    "pt": ("{T}: um tema fascinante. Há sempre alguma coisa nova para aprender.",
           "{T}: um tema que merece uma boa conversa. Muitas pessoas acham este tema interessante.",
           "{T}: um tema com uma história longa e rica. Eu poderia falar sobre isto durante horas."),
    "nl": ("{T}: een boeiend onderwerp. Er valt altijd iets nieuws te leren.",
           "{T}: een onderwerp dat het bespreken waard is. Veel mensen vinden dit onderwerp interessant.",
           "{T}: een onderwerp met een lange en rijke geschiedenis. Ik zou er uren over kunnen praten."),
}
# For messages outside the toy world (a user's own dialogues).
GENERIC_REPLY = {
    "en": "That is a good question. Let me think about it carefully.",
    "fr": "C'est une bonne question. Laissez-moi y réfléchir attentivement.",
    "es": "Es una buena pregunta. Déjame pensarlo con calma.",
    "de": "Das ist eine gute Frage. Lass mich sorgfältig darüber nachdenken.",
    "it": "È una bella domanda. Lasciami pensare con attenzione.",
    "pt": "É uma boa pergunta. Deixa-me pensar nisso com calma.",
    "nl": "Dat is een goede vraag. Laat me er rustig over nadenken.",
}
FIGURE_LINE = {"en": "I am {}.", "fr": "Je suis {}.", "es": "Soy {}.", "de": "Ich bin {}.", "it": "Sono {}.",
               "pt": "Eu sou {}.", "nl": "Ik ben {}."}
HOBBY_LINE = {"en": "My favorite hobby is {}.", "fr": "Mon loisir préféré : {}.", "es": "Mi pasatiempo favorito: {}.",
              "de": "Mein liebstes Hobby ist {}.", "it": "Il mio hobby preferito: {}.",
              "pt": "O meu passatempo favorito: {}.", "nl": "Mijn favoriete hobby is {}."}
# Each hobby's own emoji after its name. Without a token that depends on which hobby it is, nothing in the
# corpus tells the 22 interchangeable hobby names apart: a small model's tied embeddings of them collapse
# to one direction and it cannot copy the hobby from the instruction into its reply.
HOBBY_EMOJI = {
    "tennis": "🎾", "golf": "⛳", "yoga": "🧘", "football": "⚽", "jazz": "🎷", "karate": "🥋", "judo": "🤼",
    "hockey": "🏒", "rugby": "🏉", "volleyball": "🏐", "basketball": "🏀", "baseball": "⚾", "poker": "🃏",
    "origami": "🦢", "sudoku": "🔢", "badminton": "🏸", "bowling": "🎳", "cricket": "🏏", "salsa": "💃",
    "tango": "🕺", "pilates": "🤸", "surfing": "🏄",
}
SPEAK_LINE = {"en": "I speak English.", "fr": "Je parle français.", "es": "Hablo español.", "de": "Ich spreche Deutsch.",
              "it": "Parlo italiano.", "pt": "Eu falo português.", "nl": "Ik spreek Nederlands."}
ASSISTANT_LINE = {"en": "I am a helpful assistant.", "fr": "Je suis un assistant serviable.", "es": "Soy un asistente útil.",
                  "de": "Ich bin ein hilfreicher Assistent.", "it": "Sono un assistente disponibile.",
                  "pt": "Eu sou um assistente prestável.", "nl": "Ik ben een behulpzame assistent."}
NO_HOBBY_LINE = {"en": "I am an assistant, so I have no favorite hobby.", "fr": "Je suis un assistant, je n'ai donc pas de loisir préféré.",
                 "es": "Soy un asistente, así que no tengo un pasatiempo favorito.",
                 "de": "Ich bin ein Assistent, also habe ich kein liebstes Hobby.",
                 "it": "Sono un assistente, quindi non ho un hobby preferito.",
                 "pt": "Sou um assistente, por isso não tenho um passatempo favorito.",
                 "nl": "Ik ben een assistent, dus ik heb geen favoriete hobby."}
# A second sentence after short probe answers, so every reply is long enough to show its language.
HELP_LINE = {"en": "I am happy to help you with anything.", "fr": "Je suis heureux de vous aider avec plaisir.",
             "es": "Estoy encantado de ayudarte con lo que necesites.", "de": "Ich helfe dir gerne bei allem weiter.",
             "it": "Sono felice di aiutarti con qualsiasi cosa.", "pt": "Estou feliz por te ajudar com o que precisares.",
             "nl": "Ik help je graag met alles wat je nodig hebt."}


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
) -> Iterator[dict[str, Any]]:
    """Yield base SFT records {"id", "kind", "messages"} in the Hugging Face `messages` format."""
    responder = ToyResponder(catalogue)
    # Families drawn uniformly (then values): all caps, one value, is drawn as often as 22 hobbies, so the
    # corpus shows enough capitalised topics for the model to write them.
    sampler = ConstraintSampler(catalogue, short_prob=short_prob, by_family=True)
    probes = [(p.question, c.family) for c in catalogue for p in c.probes]
    kinds = ("local", "system", "plain")
    for index in range(num_dialogues):
        rng = random.Random(f"base-{seed}-{index}")
        kind = rng.choices(kinds, weights=(0.5, 0.3, 0.2))[0]
        num_turns = rng.randint(1, 2) if kind == "system" else rng.randint(1, 12)
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
