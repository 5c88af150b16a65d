"""The report's figures: adherence per turn with its intervals (adherence.png), the held-out tiers (tiers.png), the
dialogue kinds, and the attention on the instruction per layer and head (attention.png)."""

import io
from typing import Any

import numpy as np
from matplotlib.figure import Figure

KIND_TITLES: dict[str, str] = {
    "first": "given in turn one, kept",
    "late": "given in a later turn",
    "replace": "given in turn one, replaced by another value of its family",
    "revoke": "given in turn one, withdrawn",
    "add": "given in turn one, a second one of another family added",
}


# The adherence figure's strata: per-turn key -> (label, line style).
FIGURE_STRATA: dict[str, tuple[str, str]] = {
    "per_turn": ("trained values", "-"),
    "heldout_per_turn": ("held-out values", "--"),
    "heldout_family_per_turn": ("held-out families", ":"),
}


def kinds_figure(report: dict[str, Any], models: list[str]) -> Figure:
    """One panel per dialogue kind: each model's adherence by d (solid, with its 95% band) and, for replace and
    revoke, the share of replies still following the old instruction (dashed).

    Args:
        report: A report (`gatt.eval.report.build_report`).
        models: Its model columns, in order (`report_models`).

    Returns:
        The figure.
    """
    kinds = [k for k in KIND_TITLES if any(k in report[m].get("per_kind", {}) for m in models)]
    fig = Figure(figsize=(4 * len(kinds) + 2, 4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(kinds), sharey=True))
    for ax, kind in zip(axes, kinds):
        for i, m in enumerate(models):
            entry = report[m].get("per_kind", {}).get(kind)
            if not entry:
                continue
            ds, values, lo, hi = turn_series(entry["after"])
            ax.plot(ds, values, color=f"C{i}", marker="o", markersize=2, label=f"{m}: adherent")
            ax.fill_between(ds, lo, hi, color=f"C{i}", alpha=0.15)
            old = {d: {"adherence": v["share"], "ci95": v["ci95"]} for d, v in entry.get("old_followed", {}).items()}
            if old:
                ds, values, _, _ = turn_series(old)
                ax.plot(ds, values, color=f"C{i}", linestyle="--", label=f"{m}: old instruction followed")
        ax.set(xlabel="d: turns since the instruction or the change", title=kind, ylim=(0, 102))
    axes[0].set_ylabel("Share of replies (%)")
    fig.suptitle("Instructions at any turn (trained values; bands: 95% Wilson intervals)")
    handles = {h.get_label(): h for ax in axes for h in ax.lines}
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside right center")
    return fig


def turn_series(table: dict[str, dict[str, Any]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """A per-turn table as a plotted series.

    Args:
        table: Turn -> {"adherence", "ci95"}, shares in [0, 1].

    Returns:
        (turns, adherence %, interval low %, interval high %).
    """
    turns = [int(t) for t in table]
    values = [100 * table[str(t)]["adherence"] for t in turns]
    return (
        turns,
        values,
        [100 * table[str(t)]["ci95"][0] for t in turns],
        [100 * table[str(t)]["ci95"][1] for t in turns],
    )


def adherence_figure(report: dict[str, Any], models: list[str]) -> Figure:
    """Two panels sharing the turn axis: adherence (checks and the answer gate), then the checks alone, each with a
    line per model and stratum that has turns (a band on each model's first); one legend outside both, so no curve
    is hidden under it.

    Args:
        report: A report (`gatt.eval.report.build_report`).
        models: Its model columns, in order (`report_models`).

    Returns:
        The figure.
    """
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    gated, checks = fig.subplots(1, 2, sharey=True)
    for i, m in enumerate(models):
        for ax, scores in ((gated, report[m]), (checks, report[m]["checks_only"])):
            banded = False
            for key, (label, style) in FIGURE_STRATA.items():
                turns, values, lo, hi = turn_series(scores[key])
                if not turns:
                    continue
                ax.plot(turns, values, color=f"C{i}", linestyle=style, marker="o", markersize=3, label=f"{m}: {label}")
                if not banded:
                    ax.fill_between(turns, lo, hi, color=f"C{i}", alpha=0.2)
                    banded = True
    gated.set(xlabel="Turn", ylabel="Adherence (%)", title="Checks and answer gate", ylim=(0, 102))
    checks.set(xlabel="Turn", title="Checks alone")
    fig.suptitle("Instruction adherence per turn (bands: 95% Wilson intervals)")
    if gated.lines:
        fig.legend(*gated.get_legend_handles_labels(), loc="outside right center")
    return fig


def tiers_figure(report: dict[str, Any], models: list[str]) -> Figure:
    """One panel per stratum (trained values, held-out values) and held-out tier: adherence per turn of every
    model, with 95% bands: where each tier falls, and against what its reminded teacher holds.

    Args:
        report: A report (`gatt.eval.report.build_report`).
        models: Its model columns, in order (`report_models`).

    Returns:
        The figure.
    """
    panels = [("per_turn", None, "trained values"), ("heldout_per_turn", None, "held-out values")]
    panels += [("tier_per_turn", tier, f"tier: {tier}") for tier in report.get("tiers", {})]
    fig = Figure(figsize=(3.6 * len(panels), 3.8), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True)
    for ax, (key, tier, title) in zip(axes, panels):
        for i, m in enumerate(models):
            series = report[m].get(key, {})
            turns, values, lo, hi = turn_series(series.get(tier, {}) if tier else series)
            if turns:
                ax.plot(turns, values, color=f"C{i}", marker="o", markersize=2, label=m)
                ax.fill_between(turns, lo, hi, color=f"C{i}", alpha=0.15)
        ax.set(xlabel="Turn", title=title, ylim=(0, 102))
    axes[0].set_ylabel("Adherence (%)")
    if axes[0].lines:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right center")
    fig.suptitle("Adherence per turn by stratum and held-out tier (bands: 95% Wilson intervals)")
    return fig


def attention_figure(
    report: dict[str, Any], models: list[str], maps: dict[str, dict[str, list[list[float]]]]
) -> Figure:
    """Per model, the share of attention on the instruction of every (layer, head) per turn (cf. Figure 10);
    without per-head maps, the mean and max-head shares per turn as lines.

    Args:
        report: A report (`gatt.eval.report.build_report`).
        models: Its model columns, in order (`report_models`).
        maps: Model -> turn -> its (layers, heads) attention shares on the instruction.

    Returns:
        The figure.
    """
    maps = {m: heads for m, heads in maps.items() if heads}
    if maps:
        grids, turns = {}, {}
        for m, per_turn in maps.items():
            turns[m] = [int(t) for t in per_turn]
            grids[m] = np.array([np.ravel(heads) for heads in per_turn.values()])  # (turns, layers * heads)
        vmax = max(float(g.max()) for g in grids.values()) or 1.0  # one scale so models compare
        fig = Figure(figsize=(5 * len(grids) + 1, 5), layout="constrained")
        axes = np.atleast_1d(fig.subplots(1, len(grids), sharey=True))
        for ax, m in zip(axes, grids):
            layers, heads = np.shape(next(iter(maps[m].values())))
            image = ax.imshow(
                grids[m],
                aspect="auto",
                origin="lower",
                cmap="viridis",
                vmin=0.0,
                vmax=vmax,
                interpolation="nearest",
                extent=(-0.5, layers * heads - 0.5, min(turns[m]) - 0.5, max(turns[m]) + 0.5),
            )
            for boundary in range(1, layers):
                ax.axvline(boundary * heads - 0.5, color="white", linewidth=0.4, alpha=0.6)
            step = max(1, layers // 8)
            ax.set_xticks(
                [layer * heads + (heads - 1) / 2 for layer in range(0, layers, step)],
                [str(layer) for layer in range(0, layers, step)],
            )
            ax.set(xlabel=f"Layer ({heads} heads each)", title=m)
            ax.yaxis.get_major_locator().set_params(integer=True)
        axes[0].set_ylabel("Turn")
        fig.colorbar(image, ax=list(axes), label="attention share on the instruction")
        fig.suptitle("Attention on the instruction per (layer, head) and turn (cf. Figure 10)")
        return fig
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for i, m in enumerate(models):
        color = f"C{i}"
        for key, style, label in (
            ("attention_on_instruction", "-", "mean"),
            ("attention_on_instruction_max_head", "--", "max head"),
        ):
            series = report[m].get(key)
            if series:
                ax.plot(
                    [int(t) for t in series],
                    list(series.values()),
                    color=color,
                    linestyle=style,
                    marker="o",
                    markersize=3,
                    label=f"{m} ({label})",
                )
    if ax.lines:
        ax.set(
            xlabel="Turn", ylabel="Attention share on the instruction", title="Attention on the instruction per turn"
        )
        ax.legend()
    else:
        ax.text(0.5, 0.5, "attention not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    return fig


def png(fig: Figure) -> bytes:
    """A figure as PNG bytes (120 dpi, tight bounding box).

    Args:
        fig: The figure.

    Returns:
        The PNG file's bytes.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    return buffer.getvalue()
