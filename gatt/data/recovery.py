"""Recovery copies: GAtt dialogues whose first reply missed the instruction, that reply not trained on.

A GAtt model decodes greedily from its own history. When its first reply misses the instruction (a start word
"Gosh" under "First word: Bravo", "a jar of pickles" where the system message names a silver spoon), every later
reply copies that reply, not the system message thirty turns back: over make demo's three seeds, 59% of GAtt's
failed replies on trained values at turns 2-30 are in the 7% of dialogues it got wrong at turn one, and 4 of those
13 dialogues ever pass again, where the reminded teacher, told again every turn, wins back 11 of its 12
(docs/main-job.md). Its GAtt data never show a wrong reply: every reply there passed its checks.

A recovery copy is a kept GAtt dialogue whose first reply names another value of the same constraint's family (its
value replaced as whole words, in the case it is written: `gatt.data.values`), so that it fails that constraint's
checks, marked not sampled with the instruction (`sampled_with_instruction[0] = false`: no loss on it). Its later
replies, each written with the instruction in view, are trained on as before: the lesson meant is to follow the
system message over a reply of its own that did not. The values come from the same records, so a copy holds only
values the data already holds (for make demo, trained values: never a held-out one).

Not in make demo's recipe: at a quarter of the records (`recovery_share: 0.25`), over three seeds, trained values
moved -0.7 [-2.1, +0.7] points over turns 2-30 and the turn-one misses stayed missed (docs/main-job.md).
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from gatt.data.check_types import Check
from gatt.data.values import shows, substitute


def _first_reply(record: dict[str, Any]) -> int | None:
    """The index in `messages` of the record's first assistant reply, or None."""
    return next((i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"), None)


def recovery_copies(records: Sequence[dict[str, Any]], share: float, seed: int) -> list[dict[str, Any]]:
    """A recovery copy of `share` of the GAtt records that can have one, drawn with `seed`.

    A record can have one when it is GAtt data (it has `constraints` and `sampled_with_instruction`, its first reply
    sampled with the instruction and at least one reply after it), one of its constraints' values is written in its
    first reply, and another value of that family (from `records`) turns the reply into one that fails that
    constraint's checks. Records other than GAtt data (replay, SFT) are passed over.

    Args:
        records: The training records.
        share: The share of those that can have a copy that get one, in [0, 1].
        seed: The draw's seed.

    Returns:
        The copies, in the order of their records: each a deep copy with the id `<id>-recovery`, its first reply
        replaced, `sampled_with_instruction[0]` false and `meta.recovery` = {family, value, written}.

    Raises:
        ValueError: When `share` is outside [0, 1].
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"recovery_share must be in [0, 1], got {share}")
    values: dict[str, set[str]] = defaultdict(set)  # family -> every value the records hold
    for record in records:
        for constraint in record.get("constraints") or []:
            if constraint.get("family") and constraint.get("value"):
                values[constraint["family"]].add(constraint["value"])
    rng = random.Random(f"recovery-{seed}")
    candidates = []  # (record, its first reply's index, the constraints whose value that reply writes), in order
    for record in records:
        sampled, first = record.get("sampled_with_instruction"), _first_reply(record)
        if not record.get("constraints") or not sampled or len(sampled) < 2 or not sampled[0] or first is None:
            continue
        reply = record["messages"][first]["content"]
        shown = [c for c in record["constraints"] if c.get("value") and shows(reply, c["value"])]
        if shown:
            candidates.append((record, first, shown))
    copies = []
    chosen = sorted(rng.sample(range(len(candidates)), round(share * len(candidates))))
    for record, first, shown in (candidates[i] for i in chosen):
        constraint = rng.choice(shown)
        old, reply = constraint["value"], record["messages"][first]["content"]
        checks = [Check.from_dict(c, f"record {record.get('id', '?')}") for c in constraint.get("checks", [])]
        others = sorted(values[constraint["family"]] - {old})
        for new in rng.sample(others, len(others)):
            written = substitute(reply, old, new)
            if not shows(written, old) and not all(c.passes(written) for c in checks):
                break
        else:
            continue  # no other value makes the reply miss: no copy
        out = copy.deepcopy(record)
        out["id"] = f"{record.get('id', '?')}-recovery"
        out["messages"][first]["content"] = written
        out["sampled_with_instruction"][0] = False
        out.setdefault("meta", {})["recovery"] = {"family": constraint["family"], "value": old, "written": new}
        copies.append(out)
    return copies
