"""The documentation site builds with no warning: `mkdocs build --strict` fails on a broken link, a missing
anchor, a page left out of the build or an API reference (`::: module`) that does not resolve."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "collator" / "index.html").read_text(encoding="utf-8")
    assert "GAttCollator" in api  # the API reference is generated from the docstrings, not empty
    assert (
        tmp_path / "site" / "results" / "demo" / "adherence.png"
    ).stat().st_size > 0  # the results it shows ship with it
