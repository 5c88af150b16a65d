"""The rounds of GAtt (expert iteration: round r's teacher is round r-1's model): where each round's data and
model live in a recipe's output folder, its student's name in the report, and report.json's `rounds` entries
(gatt.eval.report.add_rounds writes them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def round_entries(
    out: Path, teachers: list[str], report: dict[str, Any], timings: dict[str, float]
) -> list[dict[str, Any]]:
    """report.json's `rounds`, one a teacher of `teachers`: each round's teacher, its reminded pass rate per family
    (from the round's data summary in `out`: candidates passing the checks and the answer gate), its student's
    adherence per turn and family, and the seconds its two stages took (`timings`: stage -> seconds)."""
    entries = []
    rounds = len(teachers)
    for r, teacher in enumerate(teachers, start=1):
        data = json.loads((gatt_data_dir(out, r) / "gatt.summary.json").read_text())
        student = report[student_name(r, rounds)]
        entries.append(
            {
                "round": r,
                "teacher": teacher,
                "student": student_name(r, rounds),
                "records": data["records"],
                "teacher_pass_rate_per_family": data["pass_rate_per_family"],
                "per_turn": student["per_turn"],
                "per_family": {f: v["overall"] for f, v in student["per_family"].items()},
                "seconds": round(sum(timings[f"{stage}{round_suffix(r)}"] for stage in ("gatt-data", "gatt-model")), 1),
            }
        )
    return entries


def round_suffix(r: int) -> str:
    """Round r's stage-name suffix: none for the first round (gatt-data, gatt-model), then -R (gatt-data-2)."""
    return "" if r == 1 else f"-{r}"


def round_dir(out: Path, r: int) -> Path:
    """Round r's GAtt data (data/gatt) and model (gatt)."""
    return out / f"round-{r}"


def gatt_data_dir(out: Path, r: int) -> Path:
    """Round r's GAtt data folder (gatt.jsonl and gatt.summary.json)."""
    return round_dir(out, r) / "data" / "gatt"


def gatt_dir(out: Path, r: int) -> Path:
    """Round r's GAtt model folder (its `final` is the model)."""
    return round_dir(out, r) / "gatt"


def student_name(r: int, rounds: int) -> str:
    """The report's name of round r's student: `gatt` with one round, `gatt-r1`, `gatt-r2`, ... with several."""
    return "gatt" if rounds == 1 else f"gatt-r{r}"
