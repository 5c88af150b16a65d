"""The held-out tiers in the report: each tier's families, its paired differences, its tables and its figure.

A tier is a named group of families held out as a whole (gatt/eval/plan.py `plan_units`), e.g. wordings (a trained
check with other words), behaviours (a check no trained family has) or a whole kind. Its dialogues carry its name
(`tier` in the transcripts), so every score the report gives the held-out families pooled is also given per tier.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from gatt.eval.scoring import Transcript, paired_differences, tier_stratum, tiers_of

FAMILY_TURNS: tuple[int, ...] = (10, 20, 30)  # the per-family table's turns (those the dialogues reach)


def tier_families(transcripts: Sequence[Transcript]) -> dict[str, list[str]]:
    """{tier: its families, sorted} over the dialogues that carry a tier (report.json `tiers`)."""
    out: dict[str, set[str]] = {}
    for t in transcripts:
        if t.get("tier"):
            out.setdefault(t["tier"], set()).add(t["constraint"]["family"])
    return {tier: sorted(out[tier]) for tier in tiers_of(transcripts)}


def paired_tiers(
    firsts: Mapping[str, Sequence[Transcript]], baselines: Sequence[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """{tier: {"A - B": per-turn paired difference}} on each tier's dialogues (report.json `paired_tiers`)."""
    tiers = tiers_of(t for group in firsts.values() for t in group)
    out = {tier: paired_differences(firsts, baselines, (tier_stratum(tier),)) for tier in tiers}
    return {tier: paired for tier, paired in out.items() if paired}


def _percent(r: Mapping[str, Any] | None) -> str:
    return "–" if r is None else f"{100 * r['adherence']:.0f}"


def family_rows(report: Mapping[str, Any], models: Sequence[str]) -> list[tuple[str, list[str]]]:
    """One row per evaluated family (its tier, or trained / held-out values): per model, adherence at turns 10, 20
    and 30 as `a / b / c (n=N)`, N the dialogues of the family at turn 10."""
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


def tiers_figure(report: Mapping[str, Any], models: Sequence[str]) -> Figure:
    """One panel per stratum (trained values, held-out values) and held-out tier: adherence per turn of every
    model, with 95% bands: where each tier falls, and against what its reminded teacher holds."""
    panels = [("per_turn", None, "trained values"), ("heldout_per_turn", None, "held-out values")]
    panels += [("tier_per_turn", tier, f"tier: {tier}") for tier in report.get("tiers", {})]
    fig = Figure(figsize=(3.6 * len(panels), 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True)
    for ax, (key, tier, title) in zip(axes, panels):
        for i, m in enumerate(models):
            series = report[m].get(key, {})
            series = series.get(tier, {}) if tier else series
            turns = [int(t) for t in series]
            if not turns:
                continue
            values = [100 * r["adherence"] for r in series.values()]
            ax.plot(turns, values, color=f"C{i}", marker="o", markersize=2, label=m)
            lo = [100 * r["ci95"][0] for r in series.values()]
            hi = [100 * r["ci95"][1] for r in series.values()]
            ax.fill_between(turns, lo, hi, color=f"C{i}", alpha=0.15)
        ax.set(xlabel="Turn", title=title, ylim=(0, 102))
    axes[0].set_ylabel("Adherence (%)")
    if axes[0].lines:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right center")
    fig.suptitle("Adherence per turn by stratum and held-out tier (bands: 95% Wilson intervals)")
    return fig
