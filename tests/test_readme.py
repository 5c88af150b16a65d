"""The commands README.md and the documentation pages show run as printed, in order, on a copy of the checkout.

The blocks tested are the ```bash blocks that follow the line `<!-- tested: tests/test_readme.py -->` in
README.md and in the pages of docs/ (in the site's order); a command edited there is the command run here,
so the pages and the code cannot drift apart. The "with your own model" blocks (README.md and docs/getting-started.md),
marked `<!-- tested with a small model: tests/test_readme.py -->`, run last, with the small model the training
page's block made standing in for `path/to/chat-model` and small sizes appended (a later flag or key wins).
"""

import json
import os
import re
import shutil
import sys
from pathlib import Path

import yaml

from gatt.io import processes

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- tested: tests/test_readme.py -->"
SMALL_MODEL_MARK = "<!-- tested with a small model: tests/test_readme.py -->"
PLACEHOLDER = "path/to/chat-model"
# Appended to each command of the own-model block: a few dialogues, steps and turns. A toy model trained for
# 20 steps writes no reply that passes its checks, so the fine-tune takes the oracle's dialogues instead.
SMALL_SIZES = {
    "gatt-data gatt": " --num-dialogues 2 --max-turns 2 --samples-per-turn 2 --max-new-tokens 16",
    "gatt-data replay": " --num-dialogues 2 --max-turns 2 --samples-per-turn 2 --max-new-tokens 16",
    # the smoke model's replay (strict gate, 16 tokens) keeps no dialogue: the replay mix is tested in test_train
    "accelerate launch -m recipes.train_gatt": " train_file=runs/smoke-data/gatt.jsonl num_epochs=0 max_steps=2"
    " save_every=0"
    " replay_file=null replay_ratio=0",
    "gatt-eval": " --turns 3 --dialogues 2 --no-instruction-dialogues 0 --max-new-tokens 16",
}


def block_commands(text: str, mark: str = MARK) -> list[str]:
    """The command lines of every block after `mark`, in order: comments dropped, `\\` continuations joined."""
    commands = []
    for block in re.findall(re.escape(mark) + r"\s*```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def nav_pages(nav: list) -> list[str]:
    """mkdocs.yml's pages in the site's order."""
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def commands_to_run() -> list[str]:
    """README's marked commands, then each documentation page's, then the own-model blocks on a small model."""
    texts = [(ROOT / "README.md").read_text(encoding="utf-8")]
    texts += [
        (ROOT / "docs" / page).read_text(encoding="utf-8")
        for page in nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    ]
    commands = [c for text in texts for c in block_commands(text)]
    for command in (c for text in texts for c in block_commands(text, SMALL_MODEL_MARK)):
        sizes = next(extra for prefix, extra in SMALL_SIZES.items() if command.startswith(prefix))
        commands.append(command.replace(PLACEHOLDER, "runs/smoke/final") + sizes)
    return list(dict.fromkeys(commands))  # a command shown twice (README and a page) runs once


def test_block_commands_parse_comments_and_continuations() -> None:
    assert block_commands(f"{MARK}\n```bash\n# a comment\npython a.py \\\n    --x 1  # why\n\nmake b\n```\n") == [
        "python a.py      --x 1",
        "make b",
    ]
    assert block_commands(f"{SMALL_MODEL_MARK}\n```bash\nrun {PLACEHOLDER}\n```\n", SMALL_MODEL_MARK) == [
        f"run {PLACEHOLDER}"
    ]


def test_the_pages_mark_the_quick_start_training_and_own_model_commands() -> None:
    commands = commands_to_run()
    assert any(c.startswith("gatt-demo --config recipes/configs/demo_smoke.yaml") for c in commands)
    assert any(c.startswith("gatt-train --config recipes/configs/smoke.yaml") for c in commands)
    # README's own-model block: the installed commands, the fine-tune under accelerate launch
    own = block_commands((ROOT / "README.md").read_text(encoding="utf-8"), SMALL_MODEL_MARK)
    starts = [
        f"gatt-data gatt --teacher {PLACEHOLDER} ",
        f"gatt-data replay --teacher {PLACEHOLDER} ",
        f"accelerate launch -m recipes.train_gatt --config recipes/configs/lora_gatt.yaml model={PLACEHOLDER} ",
        f"gatt-eval --model base={PLACEHOLDER} ",
    ]
    assert len(own) == len(starts) and all(
        " ".join(c.split()).startswith(s) for c, s in zip(own, starts, strict=True)
    ), own


def test_commands_run_as_printed(tmp_path: Path) -> None:
    # A fresh checkout's layout: the recipes and their configs; the package comes from this checkout. The installed
    # commands import the copy's recipes (gatt-demo runs its stages in its checkout), as that checkout's install would.
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    for i, command in enumerate(commands_to_run()):
        result = processes.run(
            command, tmp_path / "logs" / f"{i}.log", timeout_s=900, env=env, cwd=tmp_path, shell=True
        )
        assert result.returncode == 0, f"{command}\n{result.output[-3000:]}"
    assert (tmp_path / "runs" / "demo-smoke" / "report" / "report.json").stat().st_size > 0
    assert (tmp_path / "runs" / "smoke" / "final" / "config.json").stat().st_size > 0
    assert (tmp_path / "runs" / "smoke-report" / "report.json").stat().st_size > 0
    # the own-model block: its data step ran on the small model, its fine-tune and its report finished
    assert json.loads((tmp_path / "runs" / "my" / "data" / "gatt.summary.json").read_text())["dialogues"] == 2
    assert (tmp_path / "runs" / "my" / "gatt" / "final" / "config.json").stat().st_size > 0
    report = json.loads((tmp_path / "runs" / "my" / "report" / "report.json").read_text())
    assert {"base", "base+repeat", "gatt"} <= set(report)
