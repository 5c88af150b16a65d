"""README.md and docs/results.md show only what the committed JSON says: every result block equals what
recipes/results_page.py renders from results/, a drifted cell is caught, and the README is a front door (short, what
GAtt is and the two commands on its first screen, no figure outside a result block)."""

import re
from pathlib import Path

import pytest

from recipes import results_page

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FIRST_SCREEN = 24  # lines a newcomer sees before scrolling


def test_every_result_block_is_its_json() -> None:
    assert results_page.main(["--check"]) == 0
    for page in results_page.PAGES:
        names = [m.group(2) for m in results_page.BLOCK.finditer((ROOT / page).read_text(encoding="utf-8"))]
        assert names and set(names) <= set(results_page.TABLES), page
    tables = {m.group(2) for m in results_page.BLOCK.finditer((ROOT / "docs" / "results.md").read_text())}
    # the measured tables the README had: embedded, SmolLM2, GRPO, any turn, IFEval/IFBench, split-softmax, benchmarks
    assert {"embedded-strata", "smollm2", "grpo-smollm2", "any-turn", "ifeval", "split-softmax", "benchmarks"} <= tables


def test_a_drifted_cell_is_caught_and_rendering_mends_it(tmp_path: Path) -> None:
    row = next(line for line in README.splitlines() if line.startswith("| gatt |"))
    cell = row.split("|")[2]
    drifted = README.replace(row, row.replace(cell, " 12.3% (0.0-99.9) ", 1), 1)
    assert drifted != README
    assert results_page.stale_blocks(drifted) == ["main-result"]
    assert results_page.render(drifted) == README
    page = tmp_path / "page.md"
    page.write_text(drifted, encoding="utf-8")
    assert results_page.main(["--check", str(page)]) == 1
    assert results_page.main([str(page)]) == 0 and page.read_text(encoding="utf-8") == README


def test_an_unknown_block_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="page.md: unknown result 'no-such-table'"):
        results_page.render("<!-- result: no-such-table -->\n<!-- /result -->", "page.md")


def test_the_main_result_is_make_demos_report() -> None:
    """Cross-check of the renderer by hand: GAtt's turn-20 cell is the mean of the three seeds' reports' adherence
    on trained values and their range, as percentages."""
    import json

    readings = []
    for seed in (0, 1, 2):
        report = json.loads((ROOT / "results" / "demo" / f"seed-{seed}" / "report.json").read_text())
        readings.append(100 * report["gatt"]["per_turn"]["20"]["adherence"])
    row = next(line for line in README.splitlines() if line.startswith("| gatt |"))
    mean = sum(readings) / 3
    assert row.split("|")[6].strip() == f"{mean:.1f}% ({min(readings):.1f}-{max(readings):.1f})"


def test_the_readme_is_a_front_door() -> None:
    lines = README.splitlines()
    assert len(lines) <= 120
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "Ghost Attention (GAtt)" in first and "make demo" in first and "make test" in first
    outside = results_page.BLOCK.sub("", README)
    assert not re.findall(r"\d+(?:\.\d+)?\s?%", outside), "a percentage outside a result block"
    assert not re.findall(r"\b\d+\.\d+x\b", outside), "a ratio outside a result block"
    assert not re.findall(r"\b\d+(?:\.\d+)?\s(?:s|seconds|min|minutes|GFLOP/s)\b", outside), "a time outside a block"
