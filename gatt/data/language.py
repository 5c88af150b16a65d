"""A reply's language and spelling: lingua's detector (its models ship in the package) and pyspellchecker's word
lists, loaded once per process on first use, for the `language` check, the gate's word-salad test and the embedding
judge's fallback."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lingua
    import spellchecker


@functools.cache
def _detector() -> lingua.LanguageDetector:
    # Built once per process: the first detection loads every language model (~1 GB, several seconds).
    # lingua is imported here, on first use, so code that never checks a language does not need it loaded.
    import lingua

    return lingua.LanguageDetectorBuilder.from_all_languages().build()


@functools.cache
def known_language_codes() -> frozenset[str]:
    """The ISO 639-1 codes (lower case) of every language lingua detects; built once per process.

    Returns:
        The codes, e.g. "en", "fr".
    """
    import lingua

    return frozenset(language.iso_code_639_1.name.lower() for language in lingua.Language.all())


# Languages with a word list in pyspellchecker (word frequencies from OpenSubtitles, MIT), by ISO 639-1 code.
SPELLING_LANGUAGES = ("ar", "de", "en", "es", "eu", "fa", "fr", "it", "lv", "nl", "pt", "ru")
_SPELLED = re.compile(r"[^\W\d_]{3,}")  # words of 3+ letters: shorter ones are in every list


@functools.cache
def _speller(code: str) -> spellchecker.SpellChecker:
    from spellchecker import SpellChecker

    return SpellChecker(language=code, distance=1)  # distance: unused (no corrections are asked for)


def unknown_word_share(text: str, min_words: int = 4) -> float | None:
    """The share of the text's words (3+ letters, lower case) that the word list of its detected language lacks.

    A plural whose singular it lists is known.

    Args:
        text: The text to check.
        min_words: The fewest words of 3+ letters the text must have to be scored (default 4).

    Returns:
        The share, from 0 to 1; None where that language has no list (SPELLING_LANGUAGES) or the text has fewer than
        `min_words` such words.
    """
    language = detect_language(text)
    if language not in SPELLING_LANGUAGES:
        return None
    spelled = _SPELLED.findall(text.lower())
    if len(spelled) < min_words:
        return None
    speller = _speller(language)

    def known(word: str) -> bool:  # a plural counts where its singular is listed (the Spanish list has few plurals)
        return word in speller or any(word.endswith(end) and word[: -len(end)] in speller for end in ("s", "es"))

    return sum(not known(word) for word in spelled) / len(spelled)


@functools.lru_cache(maxsize=4096)
def detect_language(text: str) -> str | None:
    """ISO 639-1 code (lower case) of the text's language, or None if undecidable.

    Cached: a reply's language is asked for by its `language` check, the gate's word-salad test and the embedding
    judge's fallback.

    Args:
        text: The text; detected in lower case, so ALL-CAPS text is detectable too.

    Returns:
        The code, e.g. "en"; None for blank text or where lingua cannot decide.
    """
    if not text.strip():
        return None
    # Detection quality depends on letter case; lower case keeps ALL-CAPS replies detectable.
    language = _detector().detect_language_of(text.lower())
    return None if language is None else language.iso_code_639_1.name.lower()
