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

from gatt import processes

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


RESULT_BLOCK = re.compile(
    r"<!-- result: (\S+) (per_turn|heldout_per_turn|heldout_family_per_turn|rounds|per_kind) -->\n(.*?)<!-- /result -->",
    re.S,
)


def _rows(table: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.strip().splitlines()]


def _per_turn_cell(report: dict, column: str, turn: str, stratum: str = "per_turn") -> str:
    """A model's adherence on a stratum (`gatt`: "87.5%"; `per_turn`: trained values), or a paired difference on
    trained values (`gatt - base`: "+12.5 [+3.1, +21.9]")."""
    if column in report.get("paired", {}) and stratum == "per_turn":
        d = report["paired"][column][turn]
        lo, hi = d["ci95"]
        return f"{100 * d['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return f"{100 * report[column][stratum][turn]['adherence']:.1f}%"


def _rounds_cell(round_: dict, column: str) -> str:
    """A round's `records`, its teacher's pass rate (`teacher: hobby`) or its student's adherence (`turn 20`)."""
    if column == "records":
        return str(round_["records"])
    if column.startswith("teacher: "):
        return f"{100 * round_['teacher_pass_rate_per_family'][column.removeprefix('teacher: ')]:.1f}%"
    return f"{100 * round_['per_turn'][column.removeprefix('turn ')]['adherence']:.1f}%"


def _per_kind_cell(report: dict, column: str, label: str) -> str:
    """A model's adherence d turns after a kind's event ("late, 19"), or its share of replies still following the
    old instruction ("revoke: old followed, 19")."""
    kind, d = label.rsplit(", ", 1)
    if kind.endswith(": old followed"):
        return (
            f"{100 * report[column]['per_kind'][kind.removesuffix(': old followed')]['old_followed'][d]['share']:.1f}%"
        )
    return f"{100 * report[column]['per_kind'][kind]['after'][d]['adherence']:.1f}%"


def test_readme_result_tables_are_the_committed_reports() -> None:
    """Every result table in README holds its committed report's figures: adherence per turn, paired
    differences with their intervals, GAtt rounds; the main job's and the real model's are there."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = RESULT_BLOCK.findall(readme)
    assert {(path, kind) for path, kind, _ in blocks} >= {
        ("results/demo/report.json", "per_turn"),
        ("results/demo/report.json", "heldout_family_per_turn"),
        ("results/smollm2-135m-full/report.json", "per_turn"),
        ("results/smollm2-135m-full/report.json", "rounds"),
        ("results/any-turn/report.json", "per_kind"),
    }
    for path, kind, table in blocks:
        report = json.loads((ROOT / path).read_text())
        header, _, *rows = _rows(table)
        for row in rows:
            if kind.endswith("per_turn"):
                expected = [_per_turn_cell(report, column, row[0], kind) for column in header[1:]]
            elif kind == "per_kind":
                expected = [_per_kind_cell(report, column, row[0]) for column in header[1:]]
            else:
                expected = [_rounds_cell(report["rounds"][int(row[0]) - 1], column) for column in header[1:]]
            assert row[1:] == expected, f"README's {path} {kind} table, row {row[0]}"
    demo = next(table for path, kind, table in blocks if (path, kind) == ("results/demo/report.json", "per_turn"))
    assert _rows(demo)[0][1:] == ["base", "base+repeat", "gatt"]
