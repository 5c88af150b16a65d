"""The adherence report: report.json, report.md (the paper's Table 30 form), two figures, transcripts.jsonl."""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gatt.eval.figures import (
    KIND_TITLES,
    adherence_figure,
    attention_figure,
    kinds_figure,
    png,
    tiers_figure,
)
from gatt.eval.gate import REASONS
from gatt.eval.scoring import (
    TRAIN,
    Transcript,
    attention_per_head,
    first_turn,
    followable,
    paired_differences,
    score_model,
)
from gatt.eval.tiers import FAMILY_TURNS, family_rows, paired_tiers, tier_families
from gatt.io.files import write_bytes

TABLE_TURNS: tuple[int, ...] = (2, 4, 6, 10, 20)
TITLES: dict[str, str] = {
    "per_turn": "Adherence per turn (train constraints)",
    "heldout_per_turn": "Adherence per turn (held-out values)",
    "heldout_family_per_turn": "Adherence per turn (held-out families)",
}


# The paired differences of each stratum: report key -> (strata, what the report.md section calls them).
PAIRED: dict[str, tuple[tuple[str, ...], str]] = {
    "paired": (TRAIN, "trained values"),
    "paired_heldout": (("heldout_value",), "held-out values of trained families"),
    "paired_heldout_family": (("heldout_family",), "held-out families"),
}

# report keys that are not a model's scores
NOT_MODELS: tuple[str, ...] = ("settings", "followable", *PAIRED, "tiers", "paired_tiers", "rounds")


def report_models(report: dict[str, Any]) -> list[str]:
    """The report's model columns, in order.

    Args:
        report: A report (`build_report`).

    Returns:
        Its keys that name a model (not NOT_MODELS).
    """
    return [k for k in report if k not in NOT_MODELS]


def build_report(
    transcripts: list[Transcript], settings: dict[str, Any], baselines: Sequence[str] = ()
) -> dict[str, Any]:
    """The report (report.json) of the scored dialogues.

    Args:
        transcripts: The rolled-out dialogues, each with its `model`.
        settings: What the evaluation ran with, kept as `settings`.
        baselines: Models every model is also compared against (`paired`).

    Returns:
        `{"settings": settings, <model>: score_model(<its transcripts>), ...}`, models in order of appearance;
        `paired`: every model minus NAME and NAME+repeat, and minus each of `baselines`, on trained values
        (`paired_heldout`, `paired_heldout_family`: on the held-out strata, where they were rolled out); `tiers`
        and `paired_tiers` where held-out tiers were rolled out; `followable` (`followable`) where a NAME+repeat
        model gives an upper bound.

    Raises:
        ValueError: When a model is named like one of the report's other keys (NOT_MODELS).
    """
    by_model: dict[str, list[Transcript]] = {}
    for t in transcripts:
        by_model.setdefault(t["model"], []).append(t)
    if clash := sorted(set(by_model) & set(NOT_MODELS)):
        raise ValueError(
            f"a model may not be named {', '.join(map(repr, clash))}: the report keeps other results there"
        )
    report = {"settings": settings, **{name: score_model(group) for name, group in by_model.items()}}
    firsts = {name: first_turn(group) for name, group in by_model.items()}
    for key, (strata, _) in PAIRED.items():
        if paired := paired_differences(firsts, baselines, strata):
            report[key] = paired
    if tiers := tier_families(transcripts):  # the held-out tiers the plan declared: their families and differences
        report["tiers"] = tiers
        if paired := paired_tiers(firsts, baselines):
            report["paired_tiers"] = paired
    reminded = followable(report, first_turn(transcripts))
    return report if reminded is None else {**report, "followable": reminded}


def rate_cell(r: dict[str, Any] | None, key: str = "adherence") -> str:
    """A rate as a table cell: "87.5% [77.2–93.5] (n=64)"; "–" for none.

    Args:
        r: A rate (`gatt.eval.scoring.rate` or `share`), or None.
        key: The rate's value key ("adherence", "share", "on_topic").

    Returns:
        The cell's text.
    """
    if r is None:
        return "–"
    lo, hi = r["ci95"]
    return f"{100 * r[key]:.1f}% [{100 * lo:.1f}–{100 * hi:.1f}] (n={r['n']})"


def _table(header: str, columns: list[str], rows: list[tuple[str, list[str]]]) -> str:
    lines = [f"| {header} | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(lines)


def _table_turns(tables: list[dict[str, Any]]) -> list[int]:
    """Turns 2, 4, 6, 10, 20 and the last turn, those present in any of the per-turn tables."""
    present = {int(t) for table in tables for t in table}
    if not present:
        return []
    return sorted({t for t in TABLE_TURNS if t in present} | {max(present)})


def format_table(report: dict[str, Any], key: str = "per_turn", *, checks_only: bool = False) -> str:
    """The Table-30 markdown table of a per-turn table: rows are turns, one column per model.

    Args:
        report: The report (`build_report`).
        key: The per-turn table (one of TITLES: "per_turn", "heldout_per_turn", "heldout_family_per_turn").
        checks_only: Take the scores from the checks alone instead of the checks and the answer gate.

    Returns:
        The markdown table: turns 2, 4, 6, 10, 20 and the last, those present.
    """
    models = report_models(report)
    tables = [_scores(report, m, checks_only)[key] for m in models]
    rows = [(str(t), [rate_cell(table.get(str(t))) for table in tables]) for t in _table_turns(tables)]
    return _table("Turn", models, rows)


def summary_tables(report: dict[str, Any]) -> str:
    """The gated per-turn tables that have rows, each under its title: what a command prints at its end.

    Args:
        report: The report (`build_report`).

    Returns:
        The tables of train constraints, held-out values and held-out families that have rows (a report on held-out
        strata alone has no train table), separated by blank lines.
    """
    models = report_models(report)
    return "\n\n".join(
        f"{title}\n{format_table(report, key)}" for key, title in TITLES.items() if any(report[m][key] for m in models)
    )


def _scores(report: dict[str, Any], model: str, checks_only: bool) -> dict[str, Any]:
    return report[model]["checks_only"] if checks_only else report[model]


def _adherence_sections(report: dict[str, Any], checks_only: bool, level: str) -> list[str]:
    """The per-turn tables, per-family table, survival and no regression, from checks and gate or checks alone."""
    models = report_models(report)
    scores = {m: _scores(report, m, checks_only) for m in models}
    parts = []
    for key, title in TITLES.items():
        if any(scores[m][key] for m in models):
            parts += [f"{level} {title}", format_table(report, key, checks_only=checks_only)]
        if key == "per_turn" and not checks_only and report.get("followable"):
            parts += _followable_section(report, level)
    families = sorted({f for m in models for f in scores[m]["per_family"]})
    if families:
        rows = [(f, [rate_cell(scores[m]["per_family"].get(f, {}).get("overall")) for m in models]) for f in families]
        parts += [f"{level} Adherence per family (all turns)", _table("Family", models, rows)]
    rows = []
    for split in ("train", "heldout"):
        cells = []
        for m in models:
            s = scores[m]["survival"][split]
            mean = s["mean_turns_to_first_violation"]
            cells.append("–" if mean is None else f"{mean:.2f} (n={s['n']})")
        rows.append((split, cells))
    parts += [f"{level} Survival: mean turn of the first violation", _table("Split", models, rows)]
    rows = []
    for key, where in (
        ("no_regression", "without an instruction"),
        ("no_regression_instructed", "with the instruction"),
    ):
        regression = [scores[m].get(key) for m in models]
        if any(regression):
            rows += [
                (f"on topic, {where}", [rate_cell(r, "on_topic") for r in regression]),
                (
                    f"mean words per reply, {where}",
                    ["–" if r is None else f"{r['mean_words']:.1f}" for r in regression],
                ),
            ]
    if rows:
        parts += [f"{level} No regression: on-topic rate and reply length (chat turns)", _table("", models, rows)]
    return parts


def _followable_section(report: dict[str, Any], level: str) -> list[str]:
    """The train constraints of the families the reminded model follows, and the families beyond it."""
    f = report["followable"]
    tables = [f["per_turn"].get(m, {}) for m in report_models(report)]
    rows = [(str(t), [rate_cell(table.get(str(t))) for table in tables]) for t in _table_turns(tables)]
    beyond = ", ".join(f"{family} ({100 * a:.0f}%)" for family, a in f["beyond_the_model"].items()) or "none"
    text = (
        f"Families that `{f['reference']}` follows in >= {100 * f['threshold']:.0f}% of all turns: "
        f"{', '.join(f['families']) or 'none'}. Beyond the model even when reminded: {beyond}; "
        "those are not GAtt failures."
    )
    parts = [f"{level} Adherence per turn (train constraints of families the reminded model follows)", text]
    return parts + ([_table("Turn", report_models(report), rows)] if rows else [])


def _paired_section(paired: dict[str, dict[str, dict[str, Any]]], stratum: str) -> list[str]:
    pairs = list(paired)
    turns = _table_turns(list(paired.values()))

    def cell(d: dict[str, Any] | None) -> str:
        if d is None:
            return "–"
        lo, hi = d["ci95"]
        return f"{100 * d['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] (n={d['n']})"

    rows = [(str(t), [cell(paired[p].get(str(t))) for p in pairs]) for t in turns]
    text = (
        f"Points of adherence on {stratum}, A - B over the same dialogues, with the 95% interval of "
        "the mean of the per-dialogue differences."
    )
    return [f"## Paired differences on {stratum}", text, _table("Turn", pairs, rows)]


def _tier_sections(report: dict[str, Any]) -> list[str]:
    """Each held-out tier's per-turn table and paired differences, then adherence per family at turns 10, 20, 30."""
    models, parts = report_models(report), []
    for tier, families in report.get("tiers", {}).items():
        tables = [report[m].get("tier_per_turn", {}).get(tier, {}) for m in models]
        rows = [(str(t), [rate_cell(table.get(str(t))) for table in tables]) for t in _table_turns(tables)]
        parts += [
            f"## Adherence per turn (held-out tier `{tier}`: {', '.join(families)})",
            _table("Turn", models, rows),
        ]
    for tier, paired in report.get("paired_tiers", {}).items():
        parts += _paired_section(paired, f"held-out tier `{tier}`")
    if report.get("tiers"):
        turns = " / ".join(map(str, FAMILY_TURNS))
        text = (
            f"Adherence (%) at turns {turns} per family: trained values for a trained family, every value for a "
            "held-out one (its tier in brackets); n: the family's dialogues at the first of those turns."
        )
        columns = [f"{m}: turn {turns}" for m in models]
        parts += [
            "## Adherence per family at turns " + turns,
            text,
            _table("Family", columns, family_rows(report, models)),
        ]
    return parts


KIND_DS: tuple[int, ...] = (0, 1, 2, 5, 10, 19)  # the report.md rows of the per-kind tables (and the last d)


def _has_kinds(report: dict[str, Any]) -> bool:
    """Whether some model was rolled out on a dialogue kind other than `first`."""
    return any(set(report[m].get("per_kind", {})) - {"first"} for m in report_models(report))


def _kinds_section(report: dict[str, Any]) -> list[str]:
    """Per dialogue kind, adherence by d (turns since the instruction or the change), and for replace and revoke
    the share of replies that still follow the old instruction."""
    models = report_models(report)
    text = (
        "Trained values. d counts the turns since the kind's event (d = 0: the turn that gives the instruction, "
        "or the change). Adherent: the reply obeys every instruction in force (none after a withdrawal) and "
        "passes the answer gate. Old instruction followed: the reply still follows the replaced or withdrawn "
        "instruction, where its checks show it (language, capitals, opening, sign-off; a hobby or persona on "
        "its probes). NAME+repeat is given the instructions in force in every user turn."
    )
    parts = ["## Instructions at any turn", text]
    for kind, title in KIND_TITLES.items():
        entries = [report[m].get("per_kind", {}).get(kind) for m in models]
        if not any(entries):
            continue
        for key, label, cell in (
            ("after", "adherence", rate_cell),
            ("old_followed", "old instruction followed", lambda r: rate_cell(r, "share")),
        ):
            tables = [(e or {}).get(key, {}) for e in entries]
            present = {int(d) for table in tables for d in table}
            if not present:
                continue
            ds = sorted({d for d in KIND_DS if d in present} | {max(present)})
            rows = [(str(d), [cell(table.get(str(d))) for table in tables]) for d in ds]
            parts += [f"### {kind}: {title}; {label}", _table("d", models, rows)]
        by_family = [(e or {}).get("old_followed_per_family", {}) for e in entries]
        families = sorted({f for table in by_family for f in table})
        if families:
            first, last = next(e["pooled_ds"] for e in entries if e and "pooled_ds" in e)
            rows = [(f, [rate_cell(table.get(f), "share") for table in by_family]) for f in families]
            parts += [
                f"### {kind}: {title}; old instruction followed, by its family (d = {first}..{last})",
                _table("Family", models, rows),
            ]
    return parts


def _rounds_section(rounds: list[dict[str, Any]]) -> list[str]:
    """One row per GAtt round: its teacher's reminded pass rate per family and its student's adherence per turn."""
    families = sorted({f for r in rounds for f in r["teacher_pass_rate_per_family"]})
    turns = _table_turns([r["per_turn"] for r in rounds])
    columns = [
        "teacher",
        "records",
        "seconds (data + model)",
        *(f"teacher: {f}" for f in families),
        *(f"student: turn {t}" for t in turns),
    ]
    rows = [
        (
            str(r["round"]),
            [
                f"`{r['teacher']}`",
                str(r["records"]),
                f"{r['seconds']:.0f}" if "seconds" in r else "–",
                *(
                    f"{100 * r['teacher_pass_rate_per_family'][f]:.1f}%"
                    if f in r["teacher_pass_rate_per_family"]
                    else "–"
                    for f in families
                ),
                *(rate_cell(r["per_turn"].get(str(t))) for t in turns),
            ],
        )
        for r in rounds
    ]
    text = (
        "Round r+1's teacher is round r's GAtt model with the instruction appended to every user turn; each "
        "round's student is trained on every round's data so far. Teacher: the share of its candidates that "
        "pass the checks and the answer gate, in that family's dialogues. Student: adherence on train constraints."
    )
    return ["## GAtt rounds", text, _table("Round", columns, rows)]


def add_rounds(out_dir: Path, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Put the GAtt rounds into `out_dir`'s report.json (key `rounds`) and report.md (a table).

    Args:
        out_dir: The report's folder, holding report.json.
        rounds: One entry per round: its `round`, `teacher`, `records`, `teacher_pass_rate_per_family`, the
            student's `per_turn` and optionally `seconds`.

    Returns:
        The report, with `rounds`.
    """
    out_dir = Path(out_dir)
    report = {**json.loads((out_dir / "report.json").read_text()), "rounds": rounds}
    _write_tables(report, out_dir)
    return report


def _benchmark_section(report: dict[str, Any]) -> list[str]:
    """IFEval's own metrics per turn (and IFBench's), beside the gated tables, where their checks scored replies."""
    models = report_models(report)
    parts: list[str] = []
    for name, title in (("ifeval", "IFEval"), ("ifbench", "IFBench")):
        tables = [report[m].get(name, {}).get("per_turn", {}) for m in models]
        if not any(tables):
            continue
        text = (
            f"The replies under {title} instructions, by the benchmark's strict checker, without the answer gate: "
            "prompt-level (every instruction in force followed) and instruction-level (each one), with the reply count."
        )
        rows = []
        for t in _table_turns(tables):
            cells = []
            for table in tables:
                r = table.get(str(t))
                cells.append(
                    "–"
                    if r is None
                    else f"{100 * r['prompt_strict']:.1f}% / {100 * r['instruction_strict']:.1f}% (n={r['n']})"
                )
            rows.append((str(t), cells))
        parts += [f"## {title}'s own metrics: prompt / instruction strict", text, _table("Turn", models, rows)]
    return parts


def _markdown(report: dict[str, Any]) -> str:
    models = report_models(report)
    parts = [
        "# GAtt adherence report",
        "A reply is adherent when it passes the instruction's checks **and** the answer gate (it is a real "
        "answer: not empty, no loop, no repeat of an earlier reply, on the user's topic). The checks alone "
        "are in the last section.",
    ]
    parts += _adherence_sections(report, checks_only=False, level="##")
    for key, (_, stratum) in PAIRED.items():
        if report.get(key):
            parts += _paired_section(report[key], stratum)
    parts += _tier_sections(report)
    if report.get("rounds"):
        parts += _rounds_section(report["rounds"])
    if _has_kinds(report):
        parts += _kinds_section(report)
    parts += _benchmark_section(report)
    gates = [report[m].get("answer_gate") for m in models]
    if any(gates):
        rows = [("real answers", ["–" if g is None else f"{100 * g['passed']:.1f}% (n={g['n']})" for g in gates])]
        rows += [
            (f"failed: {reason}", ["–" if g is None else f"{100 * g['failed'][reason]:.1f}%" for g in gates])
            for reason in REASONS
        ]
        parts += ["## Answer gate: share of all replies", _table("", models, rows)]
    attention = [report[m]["attention_on_instruction"] for m in models]
    if any(attention):
        heads = [report[m].get("attention_on_instruction_max_head") or {} for m in models]
        turns = _table_turns(attention)
        rows = [
            (
                str(t),
                [f"{a[str(t)]:.3f}" if str(t) in a else "–" for a in attention]
                + [f"{h[str(t)]:.3f}" if str(t) in h else "–" for h in heads],
            )
            for t in turns
        ]
        columns = [f"{m} (mean)" for m in models] + [f"{m} (max head)" for m in models]
        parts += [
            "## Attention share on the instruction",
            "Mean: over every layer and head. Max head: the single (layer, head) with the largest share, "
            "its share averaged over the turn's replies (the paper's Figure 10 shows maxima).",
            _table("Turn", columns, rows),
        ]
    parts += ["## Checks alone, without the answer gate"] + _adherence_sections(report, checks_only=True, level="###")
    parts += ["## Settings", "\n".join(f"- {k}: {v}" for k, v in report["settings"].items())]
    return "\n\n".join(parts) + "\n"


def _write_tables(report: dict[str, Any], out_dir: Path) -> None:
    write_bytes(out_dir / "report.json", (json.dumps(report, indent=2, sort_keys=False) + "\n").encode())
    write_bytes(out_dir / "report.md", _markdown(report).encode())


def write_report(report: dict[str, Any], transcripts: list[Transcript], out_dir: Path) -> None:
    """Write the report's files into `out_dir` (created if missing).

    Args:
        report: The report (`build_report`).
        transcripts: The dialogues it scored, written to transcripts.jsonl and read for attention.png.
        out_dir: The folder: report.json, report.md, adherence.png, attention.png and transcripts.jsonl, kinds.png
            where dialogues of other kinds than `first` were rolled out, and tiers.png where held-out tiers were.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_tables(report, out_dir)
    models = report_models(report)
    write_bytes(out_dir / "adherence.png", png(adherence_figure(report, models)))
    if report.get("tiers"):
        write_bytes(out_dir / "tiers.png", png(tiers_figure(report, models)))
    if _has_kinds(report):
        write_bytes(out_dir / "kinds.png", png(kinds_figure(report, models)))
    maps = {m: attention_per_head([t for t in transcripts if t["model"] == m]) for m in models}
    write_bytes(out_dir / "attention.png", png(attention_figure(report, models, maps)))
    lines = "".join(json.dumps(t, ensure_ascii=False, sort_keys=False) + "\n" for t in transcripts)
    write_bytes(out_dir / "transcripts.jsonl", lines.encode("utf-8"))
