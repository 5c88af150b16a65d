"""README's quick-start and smoke commands run exactly as README prints them, in order, on a copy of the checkout.

The blocks tested are the ```bash blocks that follow the line `<!-- tested: tests/test_readme.py -->`
in README.md; a command edited there is the command run here, so README and code cannot drift apart.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- tested: tests/test_readme.py -->"


def readme_commands(readme: str) -> list[str]:
    """The command lines of every marked block, in order: comments dropped, `\\` continuations joined."""
    commands = []
    for block in re.findall(re.escape(MARK) + r"\s*```bash\n(.*?)```", readme, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def test_readme_marks_the_quick_start_and_smoke_commands() -> None:
    commands = readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert any(c.startswith("python recipes/demo.py") for c in commands)
    assert any(c.startswith("accelerate launch recipes/train_gatt.py --config recipes/configs/smoke.yaml") for c in commands)
    assert readme_commands(f"{MARK}\n```bash\n# a comment\npython a.py \\\n    --x 1  # why\n\nmake b\n```\n") == [
        "python a.py      --x 1", "make b"]


def test_readme_commands_run_as_printed(tmp_path: Path) -> None:
    # A fresh checkout's layout: the recipes and their configs; the package comes from this checkout.
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in readme_commands((ROOT / "README.md").read_text(encoding="utf-8")):
        result = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    assert (tmp_path / "runs" / "demo-smoke" / "report" / "report.json").stat().st_size > 0
    assert (tmp_path / "runs" / "smoke" / "final" / "config.json").stat().st_size > 0
    assert (tmp_path / "runs" / "smoke-report" / "report.json").stat().st_size > 0
