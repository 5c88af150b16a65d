"""The import graph: the data flows one way (data_gen -> gatt -> recipes), and no module of the library imports
one that imports it back, at the top or inside a function."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: str) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of `package` it imports, anywhere in its file."""
    modules = {_module(path): path for path in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        graph[name] = {m for m in found if m in modules and m != name and m != package}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finds_a_hidden_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_module_of_the_library_imports_one_that_imports_it_back() -> None:
    graph = imports("gatt")
    assert {"gatt.data.checks", "gatt.data.constraint_sets", "gatt.data.events"} <= set(graph)
    assert cycle(graph) is None


# The library's wings, lowest first: a wing imports only itself and the wings before it.
WINGS = ("io", "model", "data", "eval", "training")
# The one import up the wings, inside a function: the machine's work reading times the library's own model.
UPWARD = {("gatt.io.machine", "gatt.model.modeling")}


def wing(module: str) -> str | None:
    """The wing of a module of the library (`gatt.model.attention.core` -> "model"), None outside the wings."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "gatt" and parts[1] in WINGS else None


def test_every_module_of_the_library_is_in_a_wing() -> None:
    """gatt/ holds only its __init__ and the alias table of the flat paths (gatt/moved.py) beside the wings."""
    loose = {path.name for path in (ROOT / "gatt").glob("*.py")} - {"__init__.py", "moved.py"}
    folders = {path.name for path in (ROOT / "gatt").iterdir() if (path / "__init__.py").exists()}
    assert loose == set()
    assert folders == set(WINGS)


def climbs(graph: dict[str, set[str]]) -> list[str]:
    """The imports of `graph` from a wing to a wing above it, but the allowed UPWARD ones."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if wing(a) and wing(b) and WINGS.index(wing(b)) > WINGS.index(wing(a)) and (a, b) not in UPWARD
    )


def test_each_wing_imports_only_the_wings_below_it() -> None:
    graph = imports("gatt")
    assert climbs(graph) == []
    assert all(b in graph[a] for a, b in UPWARD), "an allowed climb that no longer exists: drop it from UPWARD"


def test_the_wings_check_sees_a_climb() -> None:
    assert wing("gatt.io.files") == "io" and wing("gatt.model.attention.core") == "model" and wing("gatt.moved") is None
    graph = {"gatt.model.generation": {"gatt.eval.gate", "gatt.io.config"}, "gatt.eval.gate": {"gatt.data.checks"}}
    assert climbs(graph) == ["gatt.model.generation -> gatt.eval.gate"]


def test_the_flat_paths_import_the_same_modules() -> None:
    """Code written before the wings keeps working: an old path is the new module itself (a package's submodules
    too), and the new module keeps its own name."""
    import importlib

    from gatt.moved import MOVED

    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
        assert importlib.import_module(new).__spec__.name == new
    assert importlib.import_module("gatt.attention.core") is importlib.import_module("gatt.model.attention.core")
    from gatt.train import TrainConfig
    from gatt.training.trainer import TrainConfig as Moved

    assert TrainConfig is Moved


def test_the_library_never_imports_the_data_generator_or_the_recipes() -> None:
    for path in (ROOT / "gatt").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.split(".")[0] in ("data_gen", "recipes", "benchmarks")], path


def test_no_recipe_or_benchmark_edits_the_import_path() -> None:
    """recipes/ is a package (`from recipes.demo import ...`) and each benchmark script imports its siblings as the
    script's own folder allows: none of them puts a folder on sys.path."""
    edits = [
        path.relative_to(ROOT)
        for folder in ("recipes", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"sys\.path\.(insert|append)|sys\.path\[", path.read_text(encoding="utf-8"))
    ]
    assert edits == []


def test_each_shared_default_is_written_once() -> None:
    """short_prob, max_new_tokens, the sampler's settings and the answer gate's flags: no config class of the project
    writes their default as a literal (each takes the one constant, SHORT_PROB, MAX_NEW_TOKENS, SAMPLER_DEFAULTS, or
    inherits the one mixin, sampler_flags, gate_flags); a recipe may still choose its own value in its YAML."""
    shared = {"short_prob", "max_new_tokens", "temperature", "top_p", "repetition_penalty", "no_repeat_ngram_size"}
    shared |= {"strict_gate", "relevance_judge"}
    literal = []
    for folder in ("gatt", "data_gen", "recipes"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ClassDef) or node.name == "GateConfig":  # the gate's own settings
                    continue
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value:
                        value = (
                            item.value.args[0] if isinstance(item.value, ast.Call) and item.value.args else item.value
                        )
                        if item.target.id in shared and isinstance(value, ast.Constant) and value.value is not None:
                            literal.append(f"{path.relative_to(ROOT)}:{item.lineno} {node.name}.{item.target.id}")
    assert literal == []


def test_each_module_of_a_wing_is_on_its_wing_s_api_page() -> None:
    """Each wing's API page (under docs/api/, named as the wing) lists every module of the wing (an attention
    submodule through gatt.model.attention)."""
    for name in WINGS:
        page = (ROOT / "docs" / "api" / f"{name}.md").read_text(encoding="utf-8")
        shown = set(re.findall(r"^::: (\S+)$", page, re.M))
        modules = {
            _module(path)
            for path in (ROOT / "gatt" / name).glob("*.py")
            if path.name != "__init__.py" or path.parent.name != name
        }
        modules |= {f"gatt.{name}.{p.name}" for p in (ROOT / "gatt" / name).iterdir() if (p / "__init__.py").exists()}
        assert modules - shown == set(), name


def test_the_project_imports_the_wings_not_the_flat_paths() -> None:
    """The flat paths are for code written before the wings (gatt/moved.py); the project's own code imports the new
    ones, so a reader follows one name per module."""
    from gatt.moved import new_name

    old = []
    for folder in ("gatt", "data_gen", "recipes", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name in ("moved.py", "test_layout.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                old += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if new_name(n)]
    assert old == []
