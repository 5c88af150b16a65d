"""Value swaps: more GAtt dialogues from each kept one, a constraint's value replaced by another of its family.

A dialogue the teacher kept under "Begin every answer with the title <<Memo>>." is also a dialogue under
"... <<Chronicle>>." once every "Memo" in its instruction and replies reads "Chronicle". GAtt data hold a few
hundred dialogues, so most values of a family appear in none or one of them, and a small student learns the
values it saw ("heading: Memo or Insight") instead of copying the value its system message names: at test time it
writes <<Update>> and <<Insight>> under <<Chronicle>> from turn one (docs/main-job.md). A swapped
copy shows the same replies under other values at no teacher cost, so only reading the value from the instruction
fits them all.

A swap is written only where it is exact: the value shows verbatim (as written, or in lower, upper or title case, as
whole words: gatt/data/values.py) in the instruction, its short form and every reply; the new wording is one of the
new constraint's own wordings; and every reply of the copy passes every check in force (the new constraint's and the
others', probe turns' checks included) and no longer shows the old value. A value's other marks in a reply are not
its value and stay as they were (the toy world's emoji after a hobby: "My favorite hobby is golf 🏀." from
basketball's). Values come from the constraints synthesis draws from (for `make demo`, the trained values: never a
held-out one); a user's own constraints without a `family` have no sibling and are never swapped, nor are records
that carry `events` (`data_gen gatt --kinds`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gatt.data.checks import CUSTOM_FAMILY, Constraint, passes_all, reply_checks
from gatt.data.events import constraint_entry, instruction_text
from gatt.data.values import shows, substitute


def families(constraints: Sequence[Constraint]) -> dict[str, list[Constraint]]:
    """The constraints that can stand in for one another: by family, users' family-less constraints left out.

    Args:
        constraints: the constraints synthesis draws from.

    Returns:
        Family -> its constraints that have a value, in order.
    """
    pool: dict[str, list[Constraint]] = {}
    for c in constraints:
        if c.family != CUSTOM_FAMILY and c.value:
            pool.setdefault(c.family, []).append(c)
    return pool


def swapped(
    record: dict[str, Any],
    constraints: Sequence[Constraint],
    pool: Mapping[str, Sequence[Constraint]],
    rng: random.Random,
    number: int,
) -> dict[str, Any] | None:
    """A copy of a first-kind GAtt record (docs/data.md, "Formats"), each swappable constraint given another value.

    Args:
        record: the GAtt record; one that carries `events` or no instruction is not swapped.
        constraints: the constraints the record was given under (as drawn, in their wordings).
        pool: family -> its constraints (`families`), the other values drawn from.
        rng: the generator the new values are drawn with.
        number: the copy's number, in its id (`<id>-swap-<number>`).

    Returns:
        The copy (its instruction, short form, constraints and replies swapped, `meta` naming the record and the
        swaps), or None where no constraint could be swapped exactly.
    """
    if record.get("events") or record["instruction"] is None:
        return None
    replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    users = [m["content"] for m in record["messages"] if m["role"] == "user"]
    texts = (record["instruction"], record["instruction_short"], *replies)
    new_constraints, swaps = [], {}
    for c in constraints:
        others = [o for o in pool.get(c.family, ()) if o.value != c.value]
        if not others or not all(shows(text, c.value) for text in texts):
            new_constraints.append(c)
            continue
        other = rng.choice(others)
        wording = substitute(c.instruction, c.value, other.value)
        if wording not in (other.instruction, *other.paraphrases):
            new_constraints.append(c)
            continue
        new_constraints.append(replace(other, instruction=wording))
        swaps[c.value] = other.value
    if not swaps:
        return None
    new_replies = []
    for reply in replies:
        for old, new in swaps.items():
            reply = substitute(reply, old, new)
        new_replies.append(reply)
    for user, reply in zip(users, new_replies):
        if not passes_all(reply, reply_checks(new_constraints, user)) or any(shows(reply, old) for old in swaps):
            return None
    answers = iter(new_replies)
    messages = [{**m, "content": next(answers)} if m["role"] == "assistant" else dict(m) for m in record["messages"]]
    return {
        **record,
        "id": f"{record['id']}-swap-{number}",
        "instruction": instruction_text(new_constraints, short=False),
        "instruction_short": instruction_text(new_constraints, short=True),
        "constraints": [constraint_entry(c) for c in new_constraints],
        "messages": messages,
        "meta": {**record["meta"], "swapped_from": record["id"], "swaps": swaps},
    }
