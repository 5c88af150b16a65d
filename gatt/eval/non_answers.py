"""What a non-answer looks like, reply by reply: the answer gate's tests on one reply's text (gatt/eval/gate.py says
when each applies): empty, a loop, an echo of the user's message, a template shared with an earlier reply, word salad,
a repeat of an earlier reply. Words are case-folded, punctuation dropped, CJK characters one by one."""

from __future__ import annotations

import difflib
import re
from collections import Counter

from gatt.data.language import unknown_word_share

LOOP_DISTINCT = 0.5  # loops: distinct word 4-grams below this share of all (replies of 20+ words)


# CJK scripts have no spaces between words: each character counts as a word there.
_WORDS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|[^\W_]+")


def words(text: str) -> list[str]:
    """The reply's words, case-folded, punctuation dropped (CJK characters one by one).

    Args:
        text: The text to split.

    Returns:
        The words, in order.
    """
    return _WORDS.findall(text.casefold())


def is_empty(reply: str) -> bool:
    """No letter or digit at all.

    Args:
        reply: The reply.

    Returns:
        Whether the reply has no word.
    """
    return not words(reply)


def loops(reply: str, distinct: float = LOOP_DISTINCT) -> bool:
    """Whether the reply loops on a repeated phrase (see the module docstring for the rule).

    Args:
        reply: The reply.
        distinct: Least share of distinct word 4-grams of a reply of 20+ words (default LOOP_DISTINCT, `GateConfig.loop_distinct`).

    Returns:
        True where the reply loops (its list items repeat included, `list_loops`).
    """
    if list_loops(reply):
        return True
    tokens = words(reply)
    for n in range(1, min(12, len(tokens) // 2) + 1):
        needed = 4 if n == 1 else 3 if n <= 5 else 2  # a long phrase said twice in a row is already a loop
        for start in range(len(tokens) - n * needed + 1):
            phrase = tokens[start : start + n]
            if all(tokens[start + r * n : start + (r + 1) * n] == phrase for r in range(1, needed)):
                return True
    # The same 5 words three times anywhere: a loop with something in between ("..., and to get a flat tire on the road").
    if max(Counter(tuple(tokens[i : i + 5]) for i in range(len(tokens) - 4)).values(), default=0) >= 3:
        return True
    if len(tokens) >= 20:
        grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
        return len(set(grams)) < distinct * len(grams)
    return False


_LIST_ITEM = re.compile(r"(?:^|\n)\s*(?:[-*\u2022]|\d+[.)])\s+|\s(?=\d+[.)]\s)")


_DOUBLED_MARKER = re.compile(r"(?<![\w.])(\d+[.)])\s+\1(?!\w)")


def list_loops(reply: str) -> bool:
    """A list whose items repeat: the same item text twice (numbers and punctuation aside), or a list marker said
    twice in a row ("1. 1.").

    Args:
        reply: The reply.

    Returns:
        Whether the reply has such a list.
    """
    if _DOUBLED_MARKER.search(reply):
        return True
    items = [" ".join(w for w in words(item) if not w.isdigit()) for item in _LIST_ITEM.split(reply)[1:]]
    items = [item for item in items if item]
    return len(items) >= 2 and len(set(items)) < len(items)


def _whole_words(text: str) -> set[str]:
    return {w for w in words(text) if not (len(w) == 1 and w.isascii() and w.isalpha())}


def echoes(reply: str, user: str, cover: float = 0.8, new: int = 2) -> bool:
    """Whether the reply says the user's message back: most of its distinct words, and next to nothing else.

    Single letters (the "s" of "what's", the "l" of "l'eau") are not words here, so a restated question that drops its
    contraction ("The most surprising thing about castles..." after "What's the most surprising thing about
    castles?") is still one.

    Args:
        reply: The reply.
        user: The user's message.
        cover: Least share of the message's distinct words the reply says back (default 0.8).
        new: Most distinct words of its own the reply adds (default 2).

    Returns:
        Whether the reply echoes the message; False where either has no word.
    """
    mine, theirs = _whole_words(reply), _whole_words(user)
    if not mine or not theirs:
        return False
    return len(mine & theirs) >= cover * len(theirs) and len(mine - theirs) <= new


def shared_run(reply: str, earlier: str, instruction: str = "", opening: int = 8, span: int = 12) -> bool:
    """Whether the reply opens with the same `opening` words as `earlier`, or shares a run of `span` words with it,
    leaving aside runs that `instruction` contains.

    Args:
        reply: The reply.
        earlier: An earlier reply of the dialogue.
        instruction: The instruction's words; a run it contains does not count (default "": none).
        opening: Number of opening words compared (default 8; 0: no opening test).
        span: Least length of a shared run, in words (default 12; 0: no run test).

    Returns:
        Whether the reply shares such an opening or run with `earlier`.
    """
    mine, theirs = words(reply), words(earlier)
    given = f" {' '.join(words(instruction))} "

    def required(run: list[str]) -> bool:
        return bool(instruction) and f" {' '.join(run)} " in given

    if opening and len(mine) >= opening and mine[:opening] == theirs[:opening] and not required(mine[:opening]):
        return True
    matcher = difflib.SequenceMatcher(None, theirs, mine, autojunk=False)
    return span > 0 and any(
        block.size >= span and not required(mine[block.b : block.b + block.size])
        for block in matcher.get_matching_blocks()
    )


def is_salad(reply: str, unknown: float = 0.22) -> bool:
    """Whether over `unknown` of the reply's words (3+ letters) are in no word list of its detected language.

    Args:
        reply: The reply.
        unknown: Share of unknown words above which the reply is word salad (default 0.22).

    Returns:
        Whether the reply is word salad by `unknown_word_share`; False where that cannot be told.
    """
    share = unknown_word_share(reply)
    return share is not None and share > unknown


def repeated_share(reply: str, earlier: str) -> float:
    """Share of the reply's words that fall in blocks it shares with `earlier` (0 for an empty reply).

    Args:
        reply: The reply.
        earlier: An earlier reply (word-level matching, `difflib`).

    Returns:
        The share, from 0 to 1.
    """
    mine = words(reply)
    if not mine:
        return 0.0
    matcher = difflib.SequenceMatcher(None, words(earlier), mine, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / len(mine)
