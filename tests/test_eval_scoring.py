"""Tests for adherence scoring (Wilson intervals, per turn, per family, survival) and the report files."""

import json
from pathlib import Path
from typing import Any

import pytest

from gatt.eval.figures import adherence_figure
from gatt.eval.report import _markdown, build_report, format_table, report_models, summary_tables, write_report
from gatt.eval.scoring import (
    STRATA_INSTRUCTED,
    adherence_per_turn,
    attention_max_head,
    attention_per_head,
    attention_per_turn,
    no_regression,
    paired_difference,
    paired_differences,
    per_family,
    rate,
    score_model,
    survival,
    wilson_interval,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def dialogue(
    id: str,
    stratum: str,
    family: str | None,
    passes: list[bool | None],
    model: str = "gatt",
    on_topic: list[bool | None] | None = None,
    attention: list[float | None] | None = None,
    stop_reason: str = "turns",
    gate: list[list[str] | None] | None = None,
) -> dict[str, Any]:
    """One judged transcript; `passes[i]` is turn i+1's checks verdict, `gate[i]` the reasons the gate failed it."""
    constraint = None if family is None else {"name": f"{family}-x", "family": family, "value": "x", "split": "train"}
    turns = []
    for i, passed in enumerate(passes):
        attn = None if attention is None else attention[i]
        failed = [] if gate is None or gate[i] is None else gate[i]
        turns.append(
            {
                "turn": i + 1,
                "kind": "chat",
                "user": f"u{i}",
                "reply": f"r{i}",
                "checks": [] if passed is None else [{"type": "contains_any", "passed": passed}],
                "checks_passed": passed,
                "on_topic": None if on_topic is None else on_topic[i],
                "gate": {"passed": not failed, "failed": failed, "relevance": None, "repeats": None},
                "passed": None if passed is None else passed and not failed,
                "attention_on_instruction": attn,
                "attention_per_layer": None if attn is None else [attn, attn],
                "attention_per_head": None
                if attn is None
                else [[0.5 * attn, 1.5 * attn], [attn, attn]],  # (layers, heads)
            }
        )
    return {
        "model": model,
        "id": id,
        "stratum": stratum,
        "constraint": constraint,
        "instruction": None if family is None else f"{family}: x",
        "stop_reason": stop_reason,
        "turns": turns,
    }


T, F = True, False


@pytest.fixture
def transcripts() -> list[dict[str, Any]]:
    return [
        dialogue("d1", "train", "hobby", [T, T, T, F], attention=[0.2, 0.4, None, 0.6]),
        dialogue("d2", "train", "hobby", [T, F, T, T]),
        dialogue("d3", "train", "language", [T, T, T, T], attention=[0.4, 0.2, None, None], stop_reason="context"),
        dialogue("d4", "heldout_value", "hobby", [F, F]),
        dialogue("d5", "heldout_family", "tone", [T, F, T]),
        dialogue(
            "d6",
            "none",
            None,
            [None] * 4,
            on_topic=[T, F, T, T],
            attention=[0.9] * 4,
            gate=[None, ["off_topic"], ["loop"], None],
        ),
    ]


def test_wilson_known_values() -> None:
    for (k, n), (lo, hi) in {
        (8, 10): (0.4901624, 0.9433178),
        (0, 10): (0.0, 0.2775328),
        (10, 10): (0.7224672, 1.0),
        (50, 100): (0.4038315, 0.5961685),
    }.items():
        got = wilson_interval(k, n)
        assert got == pytest.approx((lo, hi), abs=1e-6), (k, n)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0


@pytest.mark.parametrize("k,n", [(0, 0), (1, 0), (-1, 10), (11, 10)])
def test_wilson_rejects_bad_counts(k: int, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n)


def test_rate_rounds_to_six_decimals() -> None:
    assert rate(2, 3) == {"adherence": 0.666667, "n": 3, "ci95": [0.20766, 0.938508]}
    assert rate(8, 10) == {"adherence": 0.8, "n": 10, "ci95": [0.490162, 0.943318]}


def test_adherence_per_turn_counts_and_order(transcripts: list[dict[str, Any]]) -> None:
    table = adherence_per_turn(transcripts, ("train",))
    assert list(table) == ["1", "2", "3", "4"]
    assert [r["n"] for r in table.values()] == [3, 3, 3, 3]
    assert [r["adherence"] for r in table.values()] == pytest.approx([1.0, 2 / 3, 1.0, 2 / 3], abs=1e-6)
    assert table["2"] == rate(2, 3) and table["4"] == rate(2, 3)
    # Numeric, not lexical, order of turn keys.
    long = [dialogue("l", "train", "hobby", [T] * 12)]
    assert list(adherence_per_turn(long, ("train",))) == [str(t) for t in range(1, 13)]


def test_strata_do_not_leak(transcripts: list[dict[str, Any]]) -> None:
    scores = score_model(transcripts)
    assert scores["per_turn"] == adherence_per_turn(transcripts[:3], ("train",))
    assert scores["heldout_per_turn"] == {"1": rate(0, 1), "2": rate(0, 1)}
    assert scores["heldout_family_per_turn"] == {"1": rate(1, 1), "2": rate(0, 1), "3": rate(1, 1)}
    assert adherence_per_turn(transcripts, ("none",)) == {}  # no verdicts without an instruction
    assert adherence_per_turn(transcripts, ("heldout_value", "heldout_family"))["1"] == rate(1, 2)


def test_per_family(transcripts: list[dict[str, Any]]) -> None:
    fam = per_family(transcripts)
    assert list(fam) == ["hobby", "language", "tone"]
    assert fam["hobby"]["train"] == {"1": rate(2, 2), "2": rate(1, 2), "3": rate(2, 2), "4": rate(1, 2)}
    assert fam["hobby"]["heldout"] == {"1": rate(0, 1), "2": rate(0, 1)}
    assert fam["hobby"]["overall"] == rate(6, 10)
    assert set(fam["language"]) == {"train", "overall"} and fam["language"]["overall"] == rate(4, 4)
    assert set(fam["tone"]) == {"heldout", "overall"} and fam["tone"]["overall"] == rate(2, 3)


def test_survival(transcripts: list[dict[str, Any]]) -> None:
    train = survival(transcripts, ("train",))
    assert train["n"] == 3
    assert train["per_turn"] == pytest.approx({"1": 1.0, "2": 2 / 3, "3": 2 / 3, "4": 1 / 3}, abs=1e-6)
    assert train["mean_turns_to_first_violation"] == pytest.approx((4 + 2 + 5) / 3, abs=1e-6)
    heldout = survival(transcripts, ("heldout_value", "heldout_family"))
    assert heldout == {"per_turn": {"1": 0.5, "2": 0.0, "3": 0.0}, "mean_turns_to_first_violation": 1.5, "n": 2}
    assert survival(transcripts, ("nothing",)) == {"per_turn": {}, "mean_turns_to_first_violation": None, "n": 0}


def test_no_regression_and_attention(transcripts: list[dict[str, Any]]) -> None:
    # With the gate a looping reply is no answer even where the on-topic check passes; alone, the checks count it.
    assert no_regression(transcripts) == {"on_topic": 0.5, "n": 4, "ci95": rate(2, 4)["ci95"], "mean_words": 1.0}
    assert no_regression(transcripts, "checks_passed") == {
        "on_topic": 0.75,
        "n": 4,
        "ci95": rate(3, 4)["ci95"],
        "mean_words": 1.0,
    }
    assert no_regression(transcripts[:5]) is None
    # With the instruction: every chat turn of the instructed dialogues (all pass the gate here); probes do not count.
    instructed = no_regression(transcripts, strata=STRATA_INSTRUCTED)
    assert instructed == {"on_topic": 1.0, "n": 17, "ci95": rate(17, 17)["ci95"], "mean_words": 1.0}
    transcripts[0]["turns"][1]["kind"] = "probe"
    assert no_regression(transcripts, strata=STRATA_INSTRUCTED)["n"] == 16
    assert no_regression(transcripts, "checks_passed", STRATA_INSTRUCTED) is None  # no on-topic checks there
    transcripts[0]["turns"][1]["kind"] = "chat"
    # The "none" dialogue's attention is excluded: it has no instruction to attend to.
    assert attention_per_turn(transcripts) == pytest.approx({"1": 0.3, "2": 0.3, "4": 0.6})
    assert attention_per_turn(transcripts[1:2]) == {}
    # Per (layer, head), averaged over the turn's replies; the max head is the largest of those means.
    per_head = attention_per_head(transcripts)
    assert per_head["1"] == [pytest.approx([0.15, 0.45]), pytest.approx([0.3, 0.3])] and set(per_head) == {
        "1",
        "2",
        "4",
    }
    assert attention_max_head(per_head) == pytest.approx({"1": 0.45, "2": 0.45, "4": 0.9})


def test_max_head_is_the_head_that_keeps_the_instruction_over_replies() -> None:
    # Two replies whose strongest heads differ: no single head holds 1.0 over the turn, so the max head is 0.5.
    a, b = dialogue("a", "train", "hobby", [T]), dialogue("b", "train", "hobby", [T])
    a["turns"][0]["attention_per_head"], b["turns"][0]["attention_per_head"] = [[1.0, 0.0]], [[0.0, 1.0]]
    assert attention_max_head(attention_per_head([a, b])) == {"1": 0.5}
    assert attention_max_head(attention_per_head([a, a])) == {"1": 1.0}


def test_score_model_keys(transcripts: list[dict[str, Any]]) -> None:
    scores = score_model(transcripts)
    adherence = {
        "per_turn",
        "heldout_per_turn",
        "heldout_family_per_turn",
        "per_family",
        "survival",
        "no_regression",
        "no_regression_instructed",
    }
    assert set(scores) == adherence | {
        "checks_only",
        "per_kind",
        "answer_gate",
        "attention_on_instruction",
        "attention_on_instruction_max_head",
        "stop_reasons",
        "dialogues",
    }
    assert set(scores["checks_only"]) == adherence
    assert set(scores["survival"]) == {"train", "heldout"}
    assert scores["stop_reasons"] == {"turns": 5, "context": 1}
    assert scores["dialogues"] == 6


def test_gate_is_the_headline_and_checks_alone_are_kept(transcripts: list[dict[str, Any]]) -> None:
    judged = [dialogue("d1", "train", "hobby", [T, T, T, F], gate=[None, None, ["repeat"], None]), *transcripts[1:]]
    scores, before = score_model(judged), score_model(transcripts)
    # d1's turn 3 passed its checks but repeated an earlier reply: it counts in checks_only, not in the headline.
    assert scores["per_turn"]["3"] == rate(2, 3) and scores["checks_only"]["per_turn"]["3"] == rate(3, 3)
    assert scores["checks_only"] == before["checks_only"]
    assert scores["per_turn"]["1"] == scores["checks_only"]["per_turn"]["1"] == rate(3, 3)
    assert scores["survival"]["train"]["per_turn"]["3"] == pytest.approx(1 / 3)
    assert scores["checks_only"]["survival"]["train"]["per_turn"]["3"] == pytest.approx(2 / 3)
    assert scores["per_family"]["hobby"]["overall"] == rate(5, 10)
    assert scores["checks_only"]["per_family"]["hobby"]["overall"] == rate(6, 10)
    # Every reply is judged (21 turns), unscored ones included: d1 repeat, d6 off topic and loop.
    assert scores["answer_gate"] == {
        "passed": round(18 / 21, 6),
        "n": 21,
        "failed": {
            "empty": 0.0,
            "loop": round(1 / 21, 6),
            "repeat": round(1 / 21, 6),
            "off_topic": round(1 / 21, 6),
            "echo": 0.0,
            "template": 0.0,
            "salad": 0.0,
        },
    }


def test_build_report_schema(transcripts: list[dict[str, Any]]) -> None:
    base = [dict(t, model="base") for t in transcripts[:2]]
    report = build_report(base + transcripts, {"turns": 4})
    assert list(report) == ["settings", "base", "gatt"]
    assert report["settings"] == {"turns": 4}
    assert report["base"]["dialogues"] == 2 and report["gatt"] == score_model(transcripts)
    with pytest.raises(ValueError, match="settings"):
        build_report([dict(transcripts[0], model="settings")], {})


def test_followable_families_come_from_the_upper_bound_and_gatt_is_judged_on_them() -> None:
    runs = []
    for model, hobby, language in (
        ("gatt", [T, T, F], [F, F, F]),
        ("base", [T, F, F], [T, F, F]),
        ("base+repeat", [T, T, T], [T, F, F]),
    ):
        runs += [
            dialogue(f"{model}-h", "train", "hobby", hobby, model=model),
            dialogue(f"{model}-l", "train", "language", language, model=model),
            dialogue(f"{model}-hv", "heldout_value", "hobby", [F, F, F], model=model),
        ]
    report = build_report(runs, {})
    assert list(report) == ["settings", "gatt", "base", "base+repeat", "followable"]
    followable = report["followable"]
    # base+repeat: hobby 3/6 over all turns (held-out values included) is below 0.8; with them at [T, T, T] it is not.
    assert followable["families"] == [] and followable["beyond_the_model"] == {"hobby": 0.5, "language": 0.333333}
    runs = [
        dict(t, turns=[dict(turn, passed=True) for turn in t["turns"]]) if t["id"] == "base+repeat-hv" else t
        for t in runs
    ]
    followable = build_report(runs, {})["followable"]
    assert followable["reference"] == "base+repeat" and followable["families"] == ["hobby"]
    assert followable["per_turn"]["gatt"] == {"1": rate(1, 1), "2": rate(1, 1), "3": rate(0, 1)}  # hobby, train only
    assert followable["per_turn"]["base"]["2"] == rate(0, 1)
    markdown = _markdown(build_report(runs, {}))
    assert "Beyond the model even when reminded: language (33%); those are not GAtt failures." in markdown
    assert "followable" not in build_report([t for t in runs if t["model"] != "base+repeat"], {})


def long_run() -> list[dict[str, Any]]:
    """Two models, 22 turns; gatt keeps the instruction, base drops it from turn 5."""
    out = []
    for i in range(4):
        out.append(dialogue(f"g{i}", "train", "hobby", [T] * 22, attention=[0.3] * 22))
        out.append(dialogue(f"b{i}", "train", "hobby", [T] * 4 + [F] * 18, model="base", attention=[0.1] * 22))
    out.append(dialogue("gh", "heldout_value", "hobby", [T] * 22))
    out.append(dialogue("gn", "none", None, [None] * 22, on_topic=[T] * 22))
    return out


def test_paired_difference_is_the_mean_per_dialogue_difference_with_its_interval() -> None:
    gatt = [dialogue(f"d{i}", "train", "hobby", p) for i, p in enumerate([[T, T], [T, F], [T, T], [F, T]])]
    base = [
        dict(t, model="base")
        for t in [dialogue(f"d{i}", "train", "hobby", p) for i, p in enumerate([[T, F], [T, F], [F, F], [T, F]])]
    ]
    held = dialogue("h", "heldout_value", "hobby", [T, T])  # not a trained value: left out
    paired = paired_difference(gatt + [held], base)
    # turn 1: differences 0, 0, 1, -1 -> mean 0, sd sqrt(2/3); turn 2: 1, 0, 1, 1 -> mean 0.75, sd 0.5
    half1, half2 = 1.959963984540054 * (2 / 3) ** 0.5 / 2, 1.959963984540054 * 0.5 / 2
    assert paired["1"] == {"difference": 0.0, "n": 4, "ci95": [round(-half1, 6), round(half1, 6)]}
    assert paired["2"] == {"difference": 0.75, "n": 4, "ci95": [round(0.75 - half2, 6), 1.0]}  # clipped
    reminded = [dict(t, model="base+repeat") for t in base]
    split = [dict(gatt[0], model="base+split")]
    pairs = paired_differences({"gatt": gatt, "base": base, "base+repeat": reminded, "base+split": split})
    assert list(pairs) == ["gatt - base", "gatt - base+repeat"] and pairs["gatt - base"] == paired
    assert paired_differences({"gatt": gatt, "base": base}) == {}  # no reminded baseline, nothing to pair against
    # a named baseline: one fine-tune against another (and nothing against a baseline that is not there)
    assert paired_differences({"gatt": gatt, "base": base}, baselines=["base", "other"]) == {"gatt - base": paired}
    later = [dict(t, model="gatt-r2") for t in base]  # a second fine-tune: no better than base
    with_named = paired_differences(
        {"gatt": gatt, "gatt-r2": later, "base": base, "base+repeat": reminded}, baselines=["gatt"]
    )
    assert list(with_named) == [
        "gatt - base",
        "gatt - base+repeat",
        "gatt-r2 - base",
        "gatt-r2 - base+repeat",
        "gatt-r2 - gatt",
    ]
    assert with_named["gatt-r2 - gatt"]["2"]["difference"] == -0.75
    # two named baselines: each pair once, the later minus the earlier
    both = paired_differences({"gatt": gatt, "gatt-r2": later, "base": base}, baselines=["gatt", "gatt-r2"])
    assert list(both) == ["gatt-r2 - gatt", "base - gatt", "base - gatt-r2"]
    markdown = _markdown(build_report(gatt + base + reminded, {}))
    assert "## Paired differences" in markdown and "| 2 | +75.0 [+26.0, +100.0] (n=4) |" in markdown


def test_format_table_rows() -> None:
    report = build_report(long_run(), {})
    table = format_table(report)
    lines = table.splitlines()
    assert lines[0] == "| Turn | gatt | base |"
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["2", "4", "6", "10", "20", "22"]
    assert "| 2 | 100.0% [51.0–100.0] (n=4) | 100.0% [51.0–100.0] (n=4) |" in lines
    assert "| 6 | 100.0% [51.0–100.0] (n=4) | 0.0% [0.0–49.0] (n=4) |" in lines
    # Last turn equal to a table turn: no duplicate row; turns beyond the last are left out.
    short = build_report(
        [dialogue("s", "train", "hobby", [T] * 20), dialogue("s", "train", "hobby", [T] * 5, model="b")], {}
    )
    assert [line.split("|")[1].strip() for line in format_table(short).splitlines()[2:]] == ["2", "4", "6", "10", "20"]
    assert "| 10 | 100.0% [20.7–100.0] (n=1) | – |" in format_table(short)


def test_summary_tables_print_the_strata_that_have_rows() -> None:
    """A report on held-out strata alone (no train constraints) prints its held-out tables, not an empty one."""
    heldout = build_report(
        [
            dialogue("h", "heldout_value", "hobby", [True] * 4),
            dialogue("h", "heldout_value", "hobby", [False] * 4, "b"),
        ],
        {},
    )
    summary = summary_tables(heldout)
    assert "Adherence per turn (train constraints)" not in summary
    assert summary.startswith("Adherence per turn (held-out values)\n| Turn | gatt | b |")
    assert "| 4 | 100.0% [20.7–100.0] (n=1) | 0.0% [0.0–79.3] (n=1) |" in summary
    both = build_report(long_run(), {})
    assert summary_tables(both).startswith(f"Adherence per turn (train constraints)\n{format_table(both)}\n\n")


def test_write_report_files(tmp_path: Path) -> None:
    run = long_run()
    report = build_report(run, {"turns": 22, "seed": 0})
    out = tmp_path / "nested" / "out"
    write_report(report, run, out)
    names = {"report.json", "report.md", "adherence.png", "attention.png", "transcripts.jsonl"}
    assert {p.name for p in out.iterdir()} == names  # no .tmp left behind

    first = (out / "report.json").read_bytes()
    assert json.loads(first) == report
    write_report(report, run, out)
    assert (out / "report.json").read_bytes() == first

    md = (out / "report.md").read_text()
    for row in ("| 2 |", "| 4 |", "| 6 |", "| 10 |", "| 20 |", "| 22 |"):
        assert row in md
    assert "| 1 |" not in md
    assert "held-out values" in md and "held-out families" not in md
    assert "- seed: 0" in md and "on topic" in md and "Attention" in md
    assert "| Turn | gatt (mean) | base (mean) | gatt (max head) | base (max head) |" in md
    assert "| 20 | 0.300 | 0.100 | 0.450 | 0.150 |" in md

    for png in ("adherence.png", "attention.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000

    lines = (out / "transcripts.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == run


def test_adherence_figure_keeps_its_legend_off_the_curves_and_the_checks_in_their_own_panel() -> None:
    report = build_report(long_run(), {"turns": 22, "seed": 0})
    figure = adherence_figure(report, report_models(report))
    figure.draw_without_rendering()  # lays out the constrained figure
    gated, checks = figure.axes
    assert [ax.get_title() for ax in (gated, checks)] == ["Checks and answer gate", "Checks alone"]
    models = report_models(report)
    strata = ("per_turn", "heldout_per_turn", "heldout_family_per_turn")
    series = [
        f"{m}: {label}"
        for m in models
        for key, label in zip(strata, ("trained values", "held-out values", "held-out families"))
        if report[m][key]
    ]
    assert [line.get_label() for line in gated.lines] == series and len(series) > len(models)
    assert [line.get_label() for line in checks.lines] == series  # the same strata, by the checks alone
    (legend,) = figure.legends
    box = legend.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in figure.axes)
    assert [text.get_text() for text in legend.get_texts()] == [line.get_label() for line in gated.lines]


def test_adherence_figure_of_held_out_strata_alone() -> None:
    """A report on held-out values and held-out families only (IFEval parameters, IFBench types) plots both strata
    in both panels."""
    run = [
        dialogue("v", "heldout_value", "a", [T, F, T]),
        dialogue("f", "heldout_family", "b", [F, T, T]),
    ]
    report = build_report(run, {})
    figure = adherence_figure(report, report_models(report))
    gated, checks = figure.axes
    labels = ["gatt: held-out values", "gatt: held-out families"]
    assert [line.get_label() for line in gated.lines] == labels == [line.get_label() for line in checks.lines]
    assert [line.get_linestyle() for line in gated.lines] == ["--", ":"]
    assert list(gated.lines[1].get_ydata()) == [0.0, 100.0, 100.0]


def test_attention_png_without_measurements(tmp_path: Path) -> None:
    run = [dialogue("x", "train", "hobby", [T, F], stop_reason="context")]
    write_report(build_report(run, {}), run, tmp_path)
    assert (tmp_path / "attention.png").read_bytes().startswith(PNG_MAGIC)
    assert "Attention share" not in (tmp_path / "report.md").read_text()


def test_ifevals_own_metrics_per_turn_beside_the_gated_adherence(tmp_path: Path) -> None:
    """prompt_strict: replies following every IFEval instruction in force; instruction_strict: each instruction;
    both by the checker alone (a gate failure does not count), only over replies with IFEval checks."""
    two = dialogue("i1", "heldout_value", "ifeval:a", [T, T], gate=[["loop"], None])
    two["turns"][0]["checks"] = [{"type": "ifeval", "passed": True}, {"type": "ifeval", "passed": False}]
    two["turns"][1]["checks"] = [{"type": "ifeval", "passed": True}, {"type": "ifeval", "passed": True}]
    one = dialogue("i2", "heldout_value", "ifeval:b", [T, F])
    one["turns"][0]["checks"] = [{"type": "ifeval", "passed": True}]
    one["turns"][1]["checks"] = [{"type": "ifeval", "passed": False}]
    bench = dialogue("i3", "heldout_family", "ifbench:c", [F])
    bench["turns"][0]["checks"] = [{"type": "ifbench", "passed": False}]
    others = [dialogue("h1", "train", "hobby", [T, T])]  # no IFEval check: not counted
    scores = score_model([two, one, bench, *others])
    turn1, turn2 = scores["ifeval"]["per_turn"]["1"], scores["ifeval"]["per_turn"]["2"]
    assert (turn1["prompt_strict"], turn1["instruction_strict"], turn1["n"]) == (0.5, round(2 / 3, 6), 2)
    assert (turn2["prompt_strict"], turn2["instruction_strict"], turn2["n"]) == (0.5, round(2 / 3, 6), 2)
    assert turn1["ci95"] == rate(1, 2)["ci95"]
    assert scores["ifbench"]["per_turn"] == {
        "1": {"prompt_strict": 0.0, "instruction_strict": 0.0, "n": 1, "ci95": [0.0, rate(0, 1)["ci95"][1]]}
    }
    assert "ifeval" not in score_model(others) and "ifbench" not in score_model(others)
    markdown = _markdown(build_report([{**t, "model": "gatt"} for t in (two, one, bench)], {}))
    assert "## IFEval's own metrics: prompt / instruction strict" in markdown
    assert "| 2 | 50.0% / 66.7% (n=2) |" in markdown  # turns 2, 4, 6, 10, 20 and the last
    assert "## IFBench's own metrics" in markdown
