"""A constraint's value as written in a reply: found and replaced as whole words, in the case a rule gave it.

A value shows in a reply as written, or in lower, upper or title case (a case rule may have changed it), and only
as whole words: the value "Whale" is not in "Whales", and replacing it there would write "Dolphins". Value swaps
(`data_gen/value_swaps.py`) and recovery copies (`gatt/data/recovery.py`) both read and rewrite values this way.
"""

from __future__ import annotations

import re


def forms(value: str) -> dict[str, str]:
    """How a value may be written in a reply, each form mapped to its case ("title", "upper", "lower"; "" as written).

    Args:
        value: The constraint's value.

    Returns:
        Written form -> its case; where two cases give the same form, the value as written wins.
    """
    return {value.title(): "title", value.upper(): "upper", value.lower(): "lower", value: ""}


def _pattern(form: str) -> str:
    return rf"(?<!\w){re.escape(form)}(?!\w)"


def shows(text: str, value: str) -> bool:
    """Whether `text` writes `value` as whole words in any of its forms.

    Args:
        text: A reply or an instruction.
        value: The constraint's value.

    Returns:
        True where one of `forms(value)` stands in `text` with no letter, digit or underscore either side.
    """
    return any(re.search(_pattern(form), text) for form in forms(value))


def substitute(text: str, old: str, new: str) -> str:
    """`text` with every whole-word `old` (in any of its forms) replaced by `new` in the same form.

    Args:
        text: A reply or an instruction.
        old: The value written there.
        new: The value to write instead, cased as each form of `old` it replaces.

    Returns:
        The text with `old` replaced; unchanged where `old` does not show.
    """
    for form, case in sorted(forms(old).items(), key=lambda item: item[0] != old):  # the value as written first
        cased = {"lower": new.lower(), "upper": new.upper(), "title": new.title()}.get(case, new)
        text = re.sub(_pattern(form), lambda _, swap=cased: swap, text)  # the value itself, never a template
    return text
