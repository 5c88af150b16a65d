"""The module paths from before the wings, still importable: `import gatt.collator` is `gatt.data.collator`.

`gatt/` was flat; its modules now live in wings by concern (`gatt.model`, `gatt.data`, `gatt.training`, `gatt.eval`,
`gatt.io`). Scripts, configs and commands written against the old paths keep working: importing an old name gives the
very module object of the new one (so `monkeypatch.setattr("gatt.train.X", ...)` patches what the library uses), and
`python -m gatt.evaluate` runs `gatt.eval.evaluate`. New code imports the new paths (the layout test enforces it).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

# old module -> new module (an old package maps its submodules too: gatt.attention.core -> gatt.model.attention.core)
MOVED = {
    "gatt.attention": "gatt.model.attention",
    "gatt.modeling": "gatt.model.modeling",
    "gatt.tokenizer": "gatt.model.tokenizer",
    "gatt.cache": "gatt.model.cache",
    "gatt.static_decode": "gatt.model.static_decode",
    "gatt.numerics": "gatt.model.numerics",
    "gatt.split_softmax": "gatt.model.split_softmax",
    "gatt.generation": "gatt.model.generation",
    "gatt.collator": "gatt.data.collator",
    "gatt.dialogues": "gatt.data.dialogues",
    "gatt.checks": "gatt.data.checks",
    "gatt.constraint_sets": "gatt.data.constraint_sets",
    "gatt.events": "gatt.data.events",
    "gatt.train": "gatt.training.trainer",
    "gatt.distill": "gatt.training.distill",
    "gatt.grpo": "gatt.training.grpo",
    "gatt.distributed": "gatt.io.distributed",
    "gatt.processes": "gatt.io.processes",
    "gatt.evaluate": "gatt.eval.evaluate",
    "gatt.gate": "gatt.eval.gate",
    "gatt.embedding": "gatt.eval.embedding",
    "gatt.files": "gatt.io.files",
    "gatt.machine": "gatt.io.machine",
    "gatt.model_folder": "gatt.model.folder",
    "gatt.chat_model": "gatt.model.chat_model",
    "gatt.pretrained": "gatt.model.pretrained",
    "gatt.embedded": "gatt.model.embedded",
    "gatt.config": "gatt.io.config",
    "gatt.cli": "gatt.io.cli",
}


def new_name(old: str) -> str | None:
    """The module an old path names now (`gatt.attention.core` -> `gatt.model.attention.core`), or None.

    Args:
        old: A dotted module name, old or not.

    Returns:
        The new dotted module name, or None when `old` is neither a moved module nor inside a moved package.
    """
    for before, after in MOVED.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before) :]
    return None


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the new module itself (one module object under both names)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec that this finder loads, for an old path whose new module exists.

        Args:
            fullname: The dotted name being imported.
            path: The parent package's `__path__` (unused).
            target: The module being reloaded, if any (unused).

        Returns:
            A spec named `fullname` with the new module's origin and package status, or None when `fullname` is
            not an old path or its new module cannot be found.
        """
        target_name = new_name(fullname)
        if target_name is None:
            return None
        found = importlib.util.find_spec(target_name)
        if found is None:
            return None
        return importlib.util.spec_from_loader(
            fullname, self, origin=found.origin, is_package=found.submodule_search_locations is not None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """Import the new module and hand it back as the old path's module.

        Keeps the new module's own spec in `spec.loader_state`, for `exec_module` to put back.

        Args:
            spec: The old path's spec, from `find_spec`.

        Returns:
            The new module object itself.
        """
        module = importlib.import_module(new_name(spec.name) or spec.name)
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the old path's: put it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Run nothing (the new module already ran); restore its own `__spec__`.

        Args:
            module: The module `create_module` returned.
        """
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname: str) -> CodeType | None:
        """`python -m OLD` runs the new module's code as __main__.

        Args:
            fullname: The dotted name, old or new.

        Returns:
            The code of the new module, or None when it is not found or its loader cannot give code.
        """
        found = importlib.util.find_spec(new_name(fullname) or fullname)
        return (
            found.loader.get_code(found.name)
            if found and isinstance(found.loader, importlib.abc.InspectLoader)
            else None
        )


def install() -> None:
    """Put the finder first on sys.meta_path, once.

    An old package's submodules (`gatt.attention.core`) must reach it before the path finder, which would load a
    second copy of the file from the package's `__path__`.
    """
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
