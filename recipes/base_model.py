"""make base-model's product: the chat model a recipe trained, packaged with the record of how it was made, as
`make ship-base-model` puts it in the package (gatt/model/embedded.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gatt.model.embedded import package


def package_base_model(
    out: Path, demo_config: dict[str, Any], command: str, report: dict[str, Any], timings: dict[str, Any]
) -> Path:
    """make base-model's product: OUT/embedded, the model trained in OUT/base with the record of how it was made
    (`demo_config` and `command`: the recipe's config and command line; `report`: its report.json; `timings`:
    timings.json's content)."""
    reminded = report["base+repeat"]
    record = {
        "name": "embedded",
        "command": command,
        "demo_config": demo_config,
        "train_config": yaml.safe_load((out / "base" / "config.yaml").read_text()),  # as the trainer ran it
        "data_seed": demo_config["seed"],
        **{key: timings[key] for key in ("machine", "stage_seconds", "total_seconds_at_reference_speed")},
        "report": {
            "reminded_pass_rate_per_family": {f: v["overall"] for f, v in reminded["per_family"].items()},
            "reminded_per_turn": reminded["per_turn"],
            "base_per_turn": report["base"]["per_turn"],
        },
    }
    return package(out / "base" / "final", out / "embedded", record)
