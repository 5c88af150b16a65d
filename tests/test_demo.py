"""The main job's wiring (recipes/demo.py) on a tiny variant: every stage runs, the report has every model and turn."""

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "recipes"))

from demo import main  # noqa: E402


def test_demo_runs_every_stage_then_skips_what_is_done(tmp_path, capsys):
    config = ROOT / "recipes" / "configs" / "demo_smoke.yaml"
    out = tmp_path / "demo"
    report = main(["--config", str(config), f"out={out}"])
    printed = capsys.readouterr().out
    assert set(report) == {"settings", "base", "gatt", "base+repeat"}
    for name in ("base", "gatt", "base+repeat"):
        assert list(report[name]["per_turn"]) == [str(t) for t in range(1, 7)]
    for path in ("data/base/base.jsonl", "base/final/config.json", "data/gatt/gatt.jsonl", "gatt/final/config.json",
                 "report/report.json", "report/report.md", "report/adherence.png", "report/attention.png"):
        assert (out / path).stat().st_size > 0, path
    assert yaml.safe_load((out / "gatt" / "config.yaml").read_text())["model"] == str(out / "base" / "final")
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings["stage_seconds"]) == ["base-data", "base-model", "gatt-data", "gatt-model", "report"]
    assert "| Turn | base | base+repeat | gatt |" in printed
    # Same inputs: every stage is skipped. A changed GAtt stage reruns it and what follows, not what precedes.
    main(["--config", str(config), f"out={out}"])
    assert capsys.readouterr().out.count("up to date, skipped") == 5
    main(["--config", str(config), f"out={out}", "gatt_overrides=[max_steps=3, eval_every=0, batch_size=4]"])
    printed = capsys.readouterr().out
    assert printed.count("up to date, skipped") == 3 and "[4/5 gatt-model] running" in printed
    assert json.loads((out / "gatt" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
    # A stage made again with the same command gives a new result: the stages after it run again too.
    (out / "stamps" / "gatt-model.done").unlink()
    main(["--config", str(config), f"out={out}", "gatt_overrides=[max_steps=3, eval_every=0, batch_size=4]"])
    printed = capsys.readouterr().out
    assert printed.count("up to date, skipped") == 3 and "[5/5 report] running" in printed


def test_demo_refuses_an_unknown_key_naming_it(capsys):
    with pytest.raises(SystemExit):
        main(["--config", str(ROOT / "recipes" / "configs" / "demo_smoke.yaml"), "gatt_dialgues=5"])
    assert "unknown key(s) gatt_dialgues" in capsys.readouterr().err
