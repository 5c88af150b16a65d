"""Public functions and classes of the library and the data generator are documented in Google style, as mkdocs.yml
declares (mkdocstrings renders the sections on the API pages): a docstring; `Args:` naming every parameter;
`Returns:` (or `Yields:`) where something is returned. `python tests/test_docstrings.py [FILE ...]` lists what is
missing."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("gatt", "data_gen")


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return [name for name in names if name not in ("self", "cls")]


def _returns(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return node.returns is not None and not (isinstance(node.returns, ast.Constant) and node.returns.value is None)


def _section(doc: str, name: str) -> list[str]:
    """The lines of a Google-style section (`Args:`), dedented, or [] without one."""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == f"{name}:":
            body = []
            for nxt in lines[i + 1 :]:
                if nxt.strip() and not nxt.startswith((" ", "\t")):
                    break
                body.append(nxt.strip())
            return body
    return []


def problems(path: Path) -> list[str]:
    """What the Google-style rule finds missing in one file, a line each (`path:line name: what`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found: list[str] = []

    def function(node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str = "", doc_of_class: str = "") -> None:
        decorators = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in node.decorator_list}
        if "overload" in decorators:
            return
        name = f"{owner}{node.name}"
        doc = ast.get_docstring(node) or ""
        if node.name == "__init__":
            doc = doc + "\n" + doc_of_class  # the class's docstring may document its arguments
        elif not doc:
            found.append(f"{where}:{node.lineno} {name}: no docstring")
            return
        if "property" in decorators or any(d.endswith("setter") for d in decorators):
            return
        params = _params(node)
        if params:
            listed = {line.split(":")[0].split(" (")[0].lstrip("*") for line in _section(doc, "Args") if ":" in line}
            missing = [p for p in params if p not in listed]
            if missing:
                found.append(f"{where}:{node.lineno} {name}: Args misses {', '.join(missing)}")
        if _returns(node) and node.name != "__init__" and not (_section(doc, "Returns") or _section(doc, "Yields")):
            found.append(f"{where}:{node.lineno} {name}: no Returns")

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            function(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node) or ""
            if not doc:
                found.append(f"{where}:{node.lineno} {node.name}: no docstring")
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not item.name.startswith("_") or item.name == "__init__"
                ):
                    function(item, f"{node.name}.", doc)
    return found


def library_files() -> list[Path]:
    return sorted(path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py"))


def test_the_rule_finds_what_is_missing(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def ok(a: int) -> int:\n"
        '    """Double.\n\n    Args:\n        a: a number.\n\n    Returns:\n        Twice a.\n    """\n'
        "def bare(a: int) -> int:\n"
        '    """Double."""\n'
        "class C:\n"
        '    """A class.\n\n    Args:\n        x: kept.\n    """\n'
        "    def __init__(self, x: int, y: int) -> None:\n"
        "        pass\n"
        "def _private(a): pass\n"
    )
    assert problems(sample) == [
        f"{sample}:10 bare: Args misses a",
        f"{sample}:10 bare: no Returns",
        f"{sample}:18 C.__init__: Args misses y",
    ]


def test_public_functions_and_classes_are_documented_in_google_style() -> None:
    missing = [line for path in library_files() for line in problems(path)]
    assert missing == [], f"{len(missing)} missing:\n" + "\n".join(missing[:50])


if __name__ == "__main__":
    paths = [Path(p).resolve() for p in sys.argv[1:]] or library_files()
    lines = [line for path in paths for line in problems(path)]
    print("\n".join(lines) or "nothing missing")
    print(f"{len(lines)} missing", file=sys.stderr)
