"""The held-out tiers in the report: each tier's families, its paired differences and its per-family rows.

A tier is a named group of families held out as a whole (gatt/eval/plan.py `plan_units`), e.g. wordings (a trained
check with other words), behaviours (a check no trained family has) or a whole kind. Its dialogues carry its name
(`tier` in the transcripts), so every score the report gives the held-out families pooled is also given per tier.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from gatt.eval.scoring import Transcript, paired_differences, tier_stratum, tiers_of

FAMILY_TURNS: tuple[int, ...] = (10, 20, 30)  # the per-family table's turns (those the dialogues reach)


def tier_families(transcripts: Sequence[Transcript]) -> dict[str, list[str]]:
    """Each tier's families, over the dialogues that carry a tier (report.json `tiers`).

    Args:
        transcripts: The evaluated dialogues; those without a `tier` are skipped.

    Returns:
        {tier: its families, sorted}.
    """
    out: dict[str, set[str]] = {}
    for t in transcripts:
        if t.get("tier"):
            out.setdefault(t["tier"], set()).add(t["constraint"]["family"])
    return {tier: sorted(out[tier]) for tier in tiers_of(transcripts)}


def paired_tiers(
    firsts: Mapping[str, Sequence[Transcript]], baselines: Sequence[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """The paired differences on each tier's dialogues (report.json `paired_tiers`).

    Args:
        firsts: {model: its transcripts}, as `build_report` groups them (`paired_differences`'s `by_model`).
        baselines: The models named as baselines, each model compared against them (`paired_differences`).

    Returns:
        {tier: {"A - B": per-turn paired difference}}; a tier with no paired difference is left out.
    """
    tiers = tiers_of(t for group in firsts.values() for t in group)
    out = {tier: paired_differences(firsts, baselines, (tier_stratum(tier),)) for tier in tiers}
    return {tier: paired for tier, paired in out.items() if paired}


def _percent(r: Mapping[str, Any] | None) -> str:
    return "–" if r is None else f"{100 * r['adherence']:.0f}"


def family_rows(report: Mapping[str, Any], models: Sequence[str]) -> list[tuple[str, list[str]]]:
    """One row per evaluated family (its tier, or trained / held-out values) for the per-family table.

    Args:
        report: The report (report.json): per model its `per_family` values, and the `tiers`.
        models: The models, one cell each.

    Returns:
        (label, cells) per family, sorted: the label is `family (tier)`, the tier "trained" for a family in no tier;
        per model a cell with adherence at turns 10, 20 and 30 as `a / b / c (n=N)`, N the dialogues of the family
        at turn 10. A trained family has values in both strata: its trained values are the row.
    """
    tier_of = {family: tier for tier, families in report.get("tiers", {}).items() for family in families}
    families = sorted({f for m in models for f in report[m]["per_family"]})
    rows = []
    for family in families:
        cells = []
        for m in models:
            entry = report[m]["per_family"].get(family, {})
            # a trained family has values in both strata: its trained values are the row; a held-out family has one
            table = entry.get("train") or entry.get("heldout") or {}
            n = table.get(str(FAMILY_TURNS[0]), {}).get("n", 0)
            cells.append(" / ".join(_percent(table.get(str(t))) for t in FAMILY_TURNS) + f" (n={n})")
        rows.append((f"{family} ({tier_of.get(family, 'trained')})", cells))
    return rows
