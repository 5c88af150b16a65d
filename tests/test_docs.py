"""The documentation site builds with no warning: `mkdocs build --strict` fails on a broken link, a missing
anchor, a page left out of the build or an API reference (`::: module`) that does not resolve."""

import sys
from pathlib import Path

from gatt.io import processes

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    env = {"NO_MKDOCS_2_WARNING": "1", "PATH": ""}
    result = processes.run(command, tmp_path / "mkdocs.log", timeout_s=600, env=env, cwd=ROOT, split_errors=True)
    assert result.returncode == 0, result.errors[-3000:]
    assert "WARNING" not in result.errors, result.errors[-3000:]
    api = (tmp_path / "site" / "api" / "data" / "index.html").read_text(encoding="utf-8")
    assert "GAttCollator" in api  # the API reference is generated from the docstrings, not empty
    assert (
        tmp_path / "site" / "results" / "demo" / "seed-0" / "adherence.png"
    ).stat().st_size > 0  # the results it shows ship with it
