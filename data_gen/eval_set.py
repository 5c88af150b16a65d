"""The built-in evaluation set that ships inside `gatt` (gatt/eval/builtin/), exported from the toy world.

`gatt` never imports `data_gen`, so the evaluation reads these files instead of the catalogue
and the user-turn generator:

* `constraints.yaml`: the whole catalogue, each constraint tagged train or heldout;
* `families.yaml`: each family's kind and the families it never holds with (`gatt.data.events.conflict`);
* `user_turns.jsonl`: the held-out user turns (never in the training pool), one
  `{"content", "topic", "checks"}` object a line, whose `contains_any` check passes when a reply names
  the topic in any of the toy world's languages (the no-regression "still on topic" score).

Regenerate with `python -m data_gen eval-set --out gatt/eval/builtin`.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from data_gen.constraints import catalogue, family_table
from data_gen.user_turns import on_topic_check, split_user_turns
from gatt.data.checks import dump_constraints
from gatt.eval.inputs import EvalTurn
from gatt.io.files import atomic_path, write_text


def write_eval_set(out_dir: Path, *, seed: int = 0) -> dict:
    """Write out_dir/constraints.yaml, families.yaml and user_turns.jsonl atomically; return their counts.

    Args:
        out_dir: Folder to write into; created if missing.
        seed: Seed of the catalogue and of the training/held-out split of the user turns (default 0).

    Returns:
        The counts: "constraints", "families", "heldout_constraints", "user_turns" and "topics" (of the held-out
        turns), and "out", the folder as a string.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    constraints = catalogue(seed=seed)
    dump_constraints(constraints, out_dir / "constraints.yaml")
    families = family_table()
    write_text(out_dir / "families.yaml", yaml.safe_dump({"families": families}, sort_keys=False, width=100))

    _, heldout = split_user_turns(seed=seed)
    with atomic_path(out_dir / "user_turns.jsonl") as tmp, tmp.open("w", encoding="utf-8", newline="\n") as f:
        for turn in heldout:
            assert turn.topic is not None  # built-in turns always carry their topic
            record = {"content": turn.text, "topic": turn.topic, "checks": [on_topic_check(turn.topic).to_dict()]}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return {
        "constraints": len(constraints),
        "families": len(families),
        "heldout_constraints": sum(c.split == "heldout" for c in constraints),
        "user_turns": len(heldout),
        "topics": len({turn.topic for turn in heldout}),
        "out": str(out_dir),
    }


def training_turns(seed: int = 0) -> list[EvalTurn]:
    """The training side of the same split, as the evaluation reads turns (topic and on-topic check).

    These are the messages of GRPO's prompts (recipes/grpo_gatt.py), so that the report's held-out messages are
    never trained on.

    Args:
        seed: Seed of the split, as given to `write_eval_set` (default 0).

    Returns:
        One `EvalTurn` per training user turn that has a topic, with its on-topic check.
    """
    train, _ = split_user_turns(seed=seed)
    return [EvalTurn(turn.text, (on_topic_check(turn.topic),), turn.topic) for turn in train if turn.topic is not None]
