"""One-turn pass rates: how often a teacher, with the instruction appended to a user turn, writes a reply
that passes the constraint's checks, and the checks and the answer gate together.

Measure this before choosing what a GAtt teacher can produce: synthesis keeps a turn when one of its k
candidates passes, so a constraint with a per-reply rate p yields a turn with probability 1 - (1 - p)^k,
and a dialogue of n turns about that to the power n. A persona without per-reply checks is measured on
its probe questions. Half the prompts use the instruction's short form, as synthesis does by default.

A rate of 0% says nothing of why: per constraint, each rejected candidate is counted under the type of the first
check it fails (the teacher did not follow), or under each reason the answer gate gave (a reply that follows but is
no answer, or a gate misjudging it), with the first reply rejected for the commonest reason to read.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from tqdm.auto import tqdm

from data_gen.constraints import instruction_text
from data_gen.shards import by_count
from data_gen.synthesis import _key, first_failed, gate_turn
from data_gen.teacher import Teacher, TurnRequest, gate_config, teacher_gate
from data_gen.toy_world import with_instruction
from data_gen.user_turns import UserTurn
from gatt.data.checks import CUSTOM_FAMILY, Constraint, reply_checks
from gatt.eval.embedding import EMBEDDING_JUDGE
from gatt.eval.gate import GateItem, gate_flags
from gatt.io.config import arg

EXAMPLE_WIDTH = 100  # characters of a user turn or rejected reply in the printed table (the JSON keeps them whole)


@dataclass(frozen=True)
class PassRateConfig(gate_flags(frozen=True)):
    """The settings of `python -m data_gen pass-rate`: what is sampled per constraint, and the answer gate's flags.

    Raises:
        ValueError: When `prompts` or `samples` is below 1.
    """

    prompts: int = arg(8, "user turns per constraint")
    samples: int = arg(2, "candidates per prompt (k)")
    seed: int = arg(0, "prompt draw and sampling seed")
    relevance_others: int = 3  # contrast questions where a turn has no on-topic check
    chunk: int = 64  # at most this many prompts per teacher call; a call never mixes constraints (progress steps)
    demonstration: bool = arg(
        False,
        "precede each prompt with one exchange of the same constraint whose reply passed the checks and the gate in a "
        "separate draw: does a richer teacher context raise the rate?",
    )
    without_instruction: bool = arg(
        False,
        "also sample every prompt without the instruction: how often a reply passes the checks anyway (the room GAtt "
        "has; a column of its own, `without_instruction` in the JSON)",
    )

    def __post_init__(self) -> None:
        if self.prompts < 1 or self.samples < 1:
            raise ValueError(f"prompts and samples must be >= 1, got {self.prompts} and {self.samples}")


def _rates(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    candidates = sum(r["candidates"] for r in rows)
    prompts = sum(r["prompts"] for r in rows)
    share = lambda part, whole: round(part / whole, 4) if whole else 0.0  # noqa: E731
    out = {
        "candidates": candidates,
        "checks": share(sum(r["checks"] for r in rows), candidates),
        "checks_and_gate": share(sum(r["checks_and_gate"] for r in rows), candidates),
        "prompts": prompts,
        "best_of_k": share(sum(r["any_passed"] for r in rows), prompts),
        "rejected": candidates - sum(r["checks_and_gate"] for r in rows),
        "rejection_reasons": by_count(sum((r["reasons"] for r in rows), Counter())),
    }
    if all("bare_checks" in r for r in rows):
        out["without_instruction"] = {
            "checks": share(sum(r["bare_checks"] for r in rows), candidates),
            "checks_and_gate": share(sum(r["bare_checks_and_gate"] for r in rows), candidates),
        }
    return out


@dataclass(frozen=True)
class Judged:
    """One candidate reply and what was found of it."""

    reply: str
    checks: bool  # it passes the constraint's checks
    gated: bool  # it passes the checks and the answer gate
    # Why it was rejected: the type of the first check it fails, or (having passed them) each answer-gate reason
    reasons: tuple[str, ...] = ()


Case = tuple[Constraint, UserTurn, str]  # the constraint, the user turn, the instruction text given ("": none)
Demonstration = list[dict[str, str]]  # an earlier exchange put before the user turn in the teacher's prompt


def _cases(
    constraints: Sequence[Constraint], user_pool: Sequence[UserTurn], config: PassRateConfig, rng: random.Random
) -> list[Case]:
    cases: list[Case] = []
    for c in constraints:
        questions = [UserTurn(p.question, None) for p in c.probes] if not c.checks else list(user_pool)
        for i in range(config.prompts):
            cases.append((c, rng.choice(questions), instruction_text([c], short=i % 2 == 1)))
    return cases


def _sample_and_judge(
    teacher: Teacher,
    cases: Sequence[Case],
    user_pool: Sequence[UserTurn],
    config: PassRateConfig,
    rng: random.Random,
    demonstrations: dict[str, Demonstration],
    desc: str = "pass rates",
) -> list[list[Judged]]:
    """Per case, each candidate with whether it passes the checks, and the checks and the gate, and if not, why.

    The teacher is called once per constraint (its prompts, in calls of at most `config.chunk`): the progress
    bar, in prompts, steps as each constraint's candidates are written, so it shows a rate and an ETA."""
    requests = [
        TurnRequest(
            [
                *demonstrations.get(c.name, []),
                {"role": "user", "content": with_instruction(turn.text, instruction) if instruction else turn.text},
            ],
            turn,
            [c],
        )
        for c, turn, instruction in cases
    ]
    teacher.seed(config.seed)
    sampled: list[list[str]] = []
    with tqdm(total=len(requests), desc=desc, unit="prompt") as progress:
        for start, end in _calls(cases, config.chunk):
            progress.set_postfix(constraint=cases[start][0].name, refresh=False)
            sampled += teacher.sample(requests[start:end], config.samples)
            progress.update(end - start)
    gate = teacher_gate(gate_config(strict_gate=config.strict_gate, relevance_judge=config.relevance_judge), teacher)
    items, owners = [], []
    failed = [
        [first_failed(candidate, reply_checks([c], turn.text)) for candidate in candidates]
        for (c, turn, _), candidates in zip(cases, sampled)
    ]
    for case, ((c, turn, _), candidates) in enumerate(zip(cases, sampled)):
        pool = [t.text for t in user_pool if _key(t) != _key(turn)]
        others = tuple(rng.sample(pool, min(config.relevance_others, len(pool))))
        for j, candidate in enumerate(candidates):
            if failed[case][j] is None:
                items.append(GateItem(gate_turn([c], turn, candidate), (), others))
                owners.append((case, j))
    gate_failed = {owner: verdict.failed for owner, verdict in zip(owners, gate.judge(items))}
    judged = []
    for case, candidates in enumerate(sampled):
        row = []
        for j, candidate in enumerate(candidates):
            check = failed[case][j]
            if check is not None:  # the gate judges only replies that pass the checks
                row.append(Judged(candidate, False, False, (check.type,)))
            else:
                row.append(Judged(candidate, True, not gate_failed[case, j], gate_failed[case, j]))
        judged.append(row)
    return judged


def _calls(cases: Sequence[Case], chunk: int) -> list[tuple[int, int]]:
    """The [start, end) ranges of the teacher calls: each constraint's run of cases, cut every `chunk` cases."""
    calls: list[tuple[int, int]] = []
    start = 0
    for end in range(1, len(cases) + 1):
        if end == len(cases) or end - start == chunk or cases[end][0] is not cases[start][0]:
            calls.append((start, end))
            start = end
    return calls


def demonstrations(
    teacher: Teacher, constraints: Sequence[Constraint], user_pool: Sequence[UserTurn], config: PassRateConfig
) -> dict[str, Demonstration]:
    """Per constraint, one exchange from a separate draw (seed + 1) whose reply passes the checks and the gate.

    Args:
        teacher: The teacher that writes the replies.
        constraints: The constraints to find a demonstration for.
        user_pool: The user turns prompts are drawn from (a constraint without checks is asked its probe questions
            instead), and the gate's contrast questions.
        config: The settings; the draw uses `seed` + 1 and no demonstration.

    Returns:
        {constraint name: the reminded user turn and that reply}, to put before the teacher's prompt (richer context
        distillation); a constraint with no passing reply is left out.
    """
    rng = random.Random(f"demonstrations-{config.seed}")
    draw = replace(config, seed=config.seed + 1, demonstration=False)
    cases = _cases(constraints, user_pool, draw, rng)
    found: dict[str, Demonstration] = {}
    judged = _sample_and_judge(teacher, cases, user_pool, draw, rng, {}, desc="demonstrations")
    for (c, turn, instruction), candidates in zip(cases, judged):
        reply = next((j.reply for j in candidates if j.gated), None)
        if reply is not None and c.name not in found:
            found[c.name] = [
                {"role": "user", "content": with_instruction(turn.text, instruction)},
                {"role": "assistant", "content": reply},
            ]
    return found


def measure_pass_rates(
    teacher: Teacher, constraints: Sequence[Constraint], user_pool: Sequence[UserTurn], config: PassRateConfig
) -> dict[str, Any]:
    """Measure the one-turn pass rates of `teacher`, per constraint and per family.

    Args:
        teacher: The teacher that writes the candidates.
        constraints: The constraints to measure.
        user_pool: The user turns prompts are drawn from (a constraint without checks is asked its probe questions
            instead), and the gate's contrast questions.
        config: The settings. With `config.demonstration`, each prompt is preceded by a demonstration
            (`demonstrations`); a constraint without one is measured without. With `config.without_instruction`, the
            same prompts are sampled again without the instruction.

    Returns:
        {"settings", "per_family", "per_constraint"}: per constraint and per family, the share of candidates passing
        the checks, the checks and the gate, the share of prompts where one of the k candidates passes both
        (`best_of_k`) and the rejection reasons; per constraint also its commonest reason's first rejected reply
        (`rejection_example`).

    Raises:
        ValueError: When `constraints` or `user_pool` is empty.
    """
    if not constraints:
        raise ValueError("no constraint to measure")
    if not user_pool:
        raise ValueError("no user turn to ask")
    demos = demonstrations(teacher, constraints, user_pool, config) if config.demonstration else {}
    rng = random.Random(f"pass-rate-{config.seed}")
    cases = _cases(constraints, user_pool, config, rng)
    judged = _sample_and_judge(teacher, cases, user_pool, config, rng, demos)
    bare: list[list[Judged] | None] = [None] * len(cases)
    if config.without_instruction:  # the same prompts, no instruction and no demonstration
        unreminded = [(c, turn, "") for c, turn, _ in cases]
        bare = list(_sample_and_judge(teacher, unreminded, user_pool, config, rng, {}, desc="without instruction"))
    rows: dict[str, dict[str, Any]] = {}
    examples: dict[str, dict[str, dict[str, str]]] = {}  # per constraint, the first rejected reply of each reason
    for (c, turn, _), candidates, plain in zip(cases, judged, bare):
        row = rows.setdefault(
            c.name,
            {
                "family": c.family,
                "split": c.split,
                "prompts": 0,
                "candidates": 0,
                "checks": 0,
                "checks_and_gate": 0,
                "any_passed": 0,
                "reasons": Counter(),
            },
        )
        row["prompts"] += 1
        row["candidates"] += len(candidates)
        row["checks"] += sum(j.checks for j in candidates)
        row["checks_and_gate"] += sum(j.gated for j in candidates)
        row["any_passed"] += any(j.gated for j in candidates)
        for j in candidates:
            row["reasons"].update(j.reasons)
            for reason in j.reasons:
                examples.setdefault(c.name, {}).setdefault(reason, {"user": turn.text, "reply": j.reply})
        if plain is not None:
            row["bare_checks"] = row.get("bare_checks", 0) + sum(j.checks for j in plain)
            row["bare_checks_and_gate"] = row.get("bare_checks_and_gate", 0) + sum(j.gated for j in plain)
    families = sorted({row["family"] for row in rows.values()})
    return {
        "settings": _settings(config, teacher, demos),
        "per_family": {f: _rates([r for r in rows.values() if r["family"] == f]) for f in families},
        "per_constraint": {
            name: {"family": r["family"], "split": r["split"], **_rates([r]), **_example(examples.get(name, {}), r)}
            for name, r in rows.items()
        },
    }


def _example(examples: dict[str, dict[str, str]], row: dict[str, Any]) -> dict[str, Any]:
    """`rejection_example`: the first rejected reply of the constraint's commonest reason (none if none was)."""
    reasons = by_count(row["reasons"])
    if not reasons:
        return {"rejection_example": None}
    commonest = next(iter(reasons))
    return {"rejection_example": {"reason": commonest, **examples[commonest]}}


def format_reasons(rates: dict[str, Any]) -> str:
    """The "rejected for" cell: each rejection reason with its count, commonest first ("-" where none was).

    Args:
        rates: A constraint's or family's figures, with `rejection_reasons`.

    Returns:
        The cell, e.g. "language 12, off_topic 3".
    """
    return ", ".join(f"{reason} {n}" for reason, n in rates["rejection_reasons"].items()) or "-"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table of `rows` under `header`."""
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def _name(name: str) -> str:
    """A constraint's name as a table cell."""
    return name.replace("|", "/") or "(no name)"


def _cell(text: str, width: int = EXAMPLE_WIDTH) -> str:
    """`text` on one line, without the table's "|", cut to `width` characters."""
    flat = " ".join(text.split()).replace("|", "/")
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def format_constraint_rates(result: dict[str, Any]) -> str:
    """The per-constraint table in markdown, one row per constraint in the order measured.

    Args:
        result: What `measure_pass_rates` returned.

    Returns:
        The table: per constraint its name, family, split, prompts and candidates, the JSON's `checks`,
        `checks_and_gate` and `best_of_k` as percentages (and the checks without instruction where measured), and
        why candidates were rejected (`rejection_reasons`).
    """
    k = result["settings"]["samples"]
    bare = result["settings"].get("without_instruction", False)
    header = ["constraint", "family", "split", "prompts", "candidates", "checks", "checks and gate", f"best of {k}"]
    header += ["checks without instruction"] if bare else []
    header += ["rejected for"]
    rows = []
    for name, r in result["per_constraint"].items():
        cells = [_name(name), r["family"], r["split"], r["prompts"], r["candidates"]]
        cells += [f"{r[key]:.0%}" for key in ("checks", "checks_and_gate", "best_of_k")]
        cells += [f"{r['without_instruction']['checks']:.0%}"] if bare else []
        rows.append([*cells, format_reasons(r)])
    return _markdown(header, rows)


def format_examples(result: dict[str, Any]) -> str:
    """The table of rejected replies: per constraint with a rejection, its commonest reason, the user turn and the
    first reply rejected for it, each cut to one line (the JSON's `rejection_example` keeps them whole).

    Args:
        result: What `measure_pass_rates` returned.

    Returns:
        The markdown table, or "" where no constraint had a rejection.
    """
    header = ["constraint", "commonest reason", "user turn", "rejected reply"]
    rows = [
        [
            _name(name),
            r["rejection_example"]["reason"],
            _cell(r["rejection_example"]["user"]),
            _cell(r["rejection_example"]["reply"]),
        ]
        for name, r in result["per_constraint"].items()
        if r["rejection_example"] is not None
    ]
    return _markdown(header, rows) if rows else ""


def format_family_rates(result: dict[str, Any]) -> str:
    """The per-family table in markdown.

    Args:
        result: What `measure_pass_rates` returned.

    Returns:
        The table: per family its candidates, `checks`, `checks_and_gate` and `best_of_k` as percentages (and the
        checks without instruction where measured), and why candidates were rejected.
    """
    k = result["settings"]["samples"]
    bare = result["settings"].get("without_instruction", False)
    header = ["family", "candidates", "checks", "checks and gate", f"best of {k}"]
    header += ["checks without instruction"] if bare else []
    header += ["rejected for"]
    rows = []
    for family, r in result["per_family"].items():
        cells = [family, r["candidates"]] + [f"{r[key]:.0%}" for key in ("checks", "checks_and_gate", "best_of_k")]
        cells += [f"{r['without_instruction']['checks']:.0%}"] if bare else []
        rows.append([*cells, format_reasons(r)])
    return _markdown(header, rows)


def format_pass_rates(result: dict[str, Any]) -> str:
    """What `python -m data_gen pass-rate` prints.

    Args:
        result: What `measure_pass_rates` returned.

    Returns:
        The per-constraint table, then the per-family table unless every constraint is of the default family
        `custom` (a constraint file without `family` fields), then the rejected replies (`format_examples`) where
        any was; separated by blank lines.
    """
    tables = [format_constraint_rates(result)]
    if set(result["per_family"]) != {CUSTOM_FAMILY}:
        tables.append(format_family_rates(result))
    tables.append(format_examples(result))
    return "\n\n".join(table for table in tables if table)


def _settings(config: PassRateConfig, teacher: Teacher, demos: dict[str, Any]) -> dict[str, Any]:
    """The measurement's settings as its JSON records them: the config, the teacher, the demonstrated constraints and
    the embedding judge where the gate uses one."""
    uses_embedding = gate_config(strict_gate=config.strict_gate, relevance_judge=config.relevance_judge).uses_embedding
    return {
        **asdict(config),
        "teacher": teacher.name,
        **({"demonstrated": sorted(demos)} if config.demonstration else {}),
        **({"embedding_judge": EMBEDDING_JUDGE} if uses_embedding else {}),
    }
