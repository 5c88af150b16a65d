"""Where the user side of synthetic dialogues comes from.

Three sources, all offline:

* `TOPICS` / `TOPIC_KEYWORDS`: the toy world's everyday topics in seven languages, used by the
  scripted responder to talk about a topic and to decide whether a reply is on topic.
* `all_user_turns` / `sample_user_turns` / `split_user_turns`: the built-in generator, English
  templates (`PHRASINGS`) filled with a topic.
* `load_user_turns`: a user's own dialogues in the Hugging Face `messages` format (JSONL, Parquet,
  a `datasets` folder) or a plain text file, whose user turns are reused; the reading and
  validation live in `gatt.data.dialogues` (`load_dialogues`, `validate_messages`, re-exported here).

The built-in data live in data_gen/data/ (topics.yaml, topic_keywords.yaml, phrasings.yaml), read by
`data_gen.builtin_data`; this module keeps their names and the logic.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from data_gen import builtin_data
from gatt.data.check_types import Check

# Re-exported: data_gen's callers read a user's dialogues from here.
from gatt.data.dialogues import DIALOGUE_FORMATS, ROLES, OnError, load_dialogues, load_user_texts, validate_messages

__all__ = [
    "DIALOGUE_FORMATS",
    "LANGUAGE_CODES",
    "PHRASINGS",
    "ROLES",
    "TOPICS",
    "TOPIC_KEYWORDS",
    "UserTurn",
    "all_user_turns",
    "load_dialogues",
    "load_user_turns",
    "on_topic_check",
    "sample_user_turns",
    "split_user_turns",
    "validate_messages",
]

# The toy world's languages, topics and topic words (data_gen/data/topics.yaml, topic_keywords.yaml): each
# topic's name in running text per language, and the whole words that show a text is about it. The file
# order is kept; the split and seeded sampling follow it.
LANGUAGE_CODES: tuple[str, ...] = builtin_data.language_codes()
TOPICS: dict[str, dict[str, str]] = builtin_data.topics()
TOPIC_KEYWORDS: dict[str, dict[str, tuple[str, ...]]] = builtin_data.topic_keywords()


@dataclass(frozen=True)
class UserTurn:
    """One user message, with the TOPICS key it is about (None for a user's own message)."""

    text: str
    topic: str | None


# English templates with a {topic} slot that receives TOPICS[topic]["en"] (data_gen/data/phrasings.yaml).
PHRASINGS: tuple[str, ...] = builtin_data.phrasings()


def _user_turn(phrasing: str, topic: str) -> UserTurn:
    return UserTurn(text=phrasing.format(topic=TOPICS[topic]["en"]), topic=topic)


def all_user_turns() -> list[UserTurn]:
    """Every distinct built-in message (topics x phrasings), in a fixed order; at least 500 distinct texts.

    Returns:
        One user turn per (topic, phrasing), topic by topic.
    """
    return [_user_turn(phrasing, topic) for topic in TOPICS for phrasing in PHRASINGS]


def split_user_turns(heldout_fraction: float = 0.2, seed: int = 0) -> tuple[list[UserTurn], list[UserTurn]]:
    """Split all_user_turns() by (phrasing, topic) pair into (train, held-out); every topic is on both sides.

    Each topic holds out the same number of phrasings, at least one and never all of them.

    Args:
        heldout_fraction: the share of each topic's phrasings held out, strictly between 0 and 1.
        seed: the seed of the split (a topic's split does not change when other topics are added).

    Returns:
        (train, held-out) user turns, each in all_user_turns()'s order.

    Raises:
        ValueError: when `heldout_fraction` is not strictly between 0 and 1.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be strictly between 0 and 1, got {heldout_fraction}")
    # Each topic holds out the same number of phrasings, at least one and never all of them.
    n_heldout = min(max(round(heldout_fraction * len(PHRASINGS)), 1), len(PHRASINGS) - 1)
    heldout_pairs: set[tuple[str, str]] = set()
    for topic in TOPICS:
        # A per-topic generator keeps a topic's split unchanged when other topics are added.
        rng = random.Random(f"{seed}:{topic}")
        heldout_pairs.update((phrasing, topic) for phrasing in rng.sample(PHRASINGS, n_heldout))
    train: list[UserTurn] = []
    heldout: list[UserTurn] = []
    for topic in TOPICS:
        for phrasing in PHRASINGS:
            side = heldout if (phrasing, topic) in heldout_pairs else train
            side.append(_user_turn(phrasing, topic))
    return train, heldout


def _repeat_key(turn: UserTurn) -> str:
    # A user's own messages have no topic, so for them it is the message itself that must not recur.
    return f"topic:{turn.topic}" if turn.topic is not None else f"text:{turn.text}"


def _allowed(pool: Sequence[UserTurn], recent: list[str]) -> list[UserTurn]:
    # A pool with fewer topics than the window cannot honour it; forget the oldest topics first.
    window = list(recent)
    while True:
        allowed = [turn for turn in pool if _repeat_key(turn) not in window]
        if allowed or not window:
            return allowed
        window.pop(0)


def sample_user_turns(
    n: int, seed: int, *, exclude_recent: int = 4, pool: Sequence[UserTurn] | None = None
) -> list[UserTurn]:
    """n messages drawn from `seed`; no topic recurs within `exclude_recent` turns.

    A user's own messages have no topic: for them the message itself must not recur. A pool with fewer topics than
    the window cannot honour it; the oldest topics are forgotten first.

    Args:
        n: how many messages to draw.
        seed: the seed of the draw.
        exclude_recent: the window of turns within which no topic recurs; 0: no window.
        pool: the messages to draw from (default: all_user_turns()).

    Returns:
        The `n` messages drawn, with replacement.

    Raises:
        ValueError: when `n` or `exclude_recent` is negative, or the pool is empty.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if exclude_recent < 0:
        raise ValueError(f"exclude_recent must be >= 0, got {exclude_recent}")
    turns = list(pool) if pool is not None else all_user_turns()
    if not turns:
        raise ValueError("cannot sample user turns from an empty pool")
    rng = random.Random(seed)
    recent: list[str] = []
    sampled: list[UserTurn] = []
    for _ in range(n):
        turn = rng.choice(turns)
        if _repeat_key(turn) in recent:
            # Redrawing among the allowed turns only keeps the draw uniform over them, and the
            # full scan happens only on the rare collision.
            turn = rng.choice(_allowed(turns, recent))
        sampled.append(turn)
        if exclude_recent:
            recent = (recent + [_repeat_key(turn)])[-exclude_recent:]
    return sampled


# A user's own dialogues: read and validated by gatt.data.dialogues, shared with the evaluation.


def on_topic_check(topic: str) -> Check:
    """A `contains_any` check passed by a reply that names `topic` in any language (keywords, first seen kept).

    Args:
        topic: a TOPICS key.

    Returns:
        The check, its words the topic's keywords in every language, deduplicated ignoring case.
    """
    # The keywords, not the noun phrases ("the ocean"): a real model writes "oceans" or "im Ozean"
    # as often as the article form, and every noun phrase contains its own keyword anyway.
    # Keyed by casefold because the check ignores case: "Viking" (en, fr, nl) is one word.
    words: dict[str, str] = {}
    for language in LANGUAGE_CODES:
        for word in TOPIC_KEYWORDS[topic][language]:
            words.setdefault(word.casefold(), word)
    return Check("contains_any", {"words": list(words.values())})


def load_user_turns(path: str | Path, *, on_error: OnError = "raise") -> list[UserTurn]:
    """User messages of a dialogue file or a .txt file (one a line), in order, deduplicated, topic None.

    Args:
        path: a .txt file, or a dialogue file or folder (`gatt.data.dialogues.load_dialogues`).
        on_error: "raise" on the first malformed dialogue, or "skip" it.

    Returns:
        One user turn per distinct stripped message.

    Raises:
        FileNotFoundError: when `path` does not exist.
        ValueError: when the file is unsupported, a dialogue is malformed (with "raise"), or no user turns are
            found.
    """
    return [UserTurn(text=text, topic=None) for text in load_user_texts(path, on_error=on_error)]
