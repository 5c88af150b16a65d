"""Recovery copies: GAtt dialogues with a reply that missed the instruction (the first, or any), not trained on.

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

The same lesson at any turn (`turn="any"`): GAtt also slips later, a start word "Gosh!" at turn 8 under "First word:
Greetings", and then copies its slip, where the reminded teacher slips less and recovers (docs/main-job.md). A copy
with `turn="any"` replaces one reply drawn among those that write a value and have a reply after them.

Not in make demo's recipe: at a quarter of the records (`recovery_share: 0.25`), over three seeds, first-reply copies
moved trained values -0.7 [-2.1, +0.7] points over turns 2-30 and the turn-one misses stayed missed
(docs/main-job.md).
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from gatt.data.check_types import Check
from gatt.data.values import shows, substitute

RECOVERY_TURNS = ("first", "any")  # which reply a copy replaces


def _replies(record: dict[str, Any]) -> list[int]:
    """The indices in `messages` of the record's assistant replies, in order."""
    return [i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"]


def recovery_copies(
    records: Sequence[dict[str, Any]], share: float, seed: int, turn: str = "first"
) -> list[dict[str, Any]]:
    """A recovery copy of `share` of the GAtt records that can have one, drawn with `seed`.

    A record can have one when it is GAtt data (it has `constraints` and `sampled_with_instruction`) and one of its
    replies can be replaced: sampled with the instruction, followed by another reply, one of the record's constraints'
    values written in it, and another value of that family (from `records`) turning it into one that fails that
    constraint's checks. `turn` says which replies may be: the first (`"first"`) or any (`"any"`: one drawn among
    those that write a value). Records other than GAtt data (replay, SFT) are passed over.

    Args:
        records: The training records.
        share: The share of those that can have a copy that get one, in [0, 1].
        seed: The draw's seed.
        turn: Which reply a copy replaces: `"first"` or `"any"`.

    Returns:
        The copies, in the order of their records: each a deep copy with the id `<id>-recovery`, one reply replaced,
        its `sampled_with_instruction` entry false and `meta.recovery` = {family, value, written, reply} (`reply`:
        the replaced reply's number, 1 for the first).

    Raises:
        ValueError: When `share` is outside [0, 1] or `turn` is not one of RECOVERY_TURNS.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"recovery_share must be in [0, 1], got {share}")
    if turn not in RECOVERY_TURNS:
        raise ValueError(f"recovery_turn must be one of {', '.join(RECOVERY_TURNS)}, got {turn!r}")
    values: dict[str, set[str]] = defaultdict(set)  # family -> every value the records hold
    for record in records:
        for constraint in record.get("constraints") or []:
            if constraint.get("family") and constraint.get("value"):
                values[constraint["family"]].add(constraint["value"])
    rng = random.Random(f"recovery-{seed}")
    reply_rng = random.Random(f"recovery-reply-{seed}")  # its own draw: turn="first" copies stay as they were
    candidates = []  # (record, the replaced reply's number, its index, the constraints whose value it writes)
    for record in records:
        sampled, replies = record.get("sampled_with_instruction"), _replies(record)
        if not record.get("constraints") or not sampled or not replies:
            continue
        options = []  # (number, index, shown) of each reply that can be replaced
        last = len(sampled) - 1  # a replaced reply has a reply after it
        for k, index in enumerate(replies[: last if turn == "any" else min(1, last)]):
            reply = record["messages"][index]["content"]
            shown = [c for c in record["constraints"] if c.get("value") and shows(reply, c["value"])]
            if sampled[k] and shown:
                options.append((k, index, shown))
        if options:
            candidates.append((record, *reply_rng.choice(options)))
    copies = []
    chosen = sorted(rng.sample(range(len(candidates)), round(share * len(candidates))))
    for record, k, index, shown in (candidates[i] for i in chosen):
        constraint = rng.choice(shown)
        old, reply = constraint["value"], record["messages"][index]["content"]
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
        out["messages"][index]["content"] = written
        out["sampled_with_instruction"][k] = False
        meta = {"family": constraint["family"], "value": old, "written": new, "reply": k + 1}
        out.setdefault("meta", {})["recovery"] = meta
        copies.append(out)
    return copies
