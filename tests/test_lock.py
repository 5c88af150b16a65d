"""requirements.lock (what `make install` and CI install) pins every dependency within pyproject.toml's ranges."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def lock_pins() -> dict[str, str]:
    text = (ROOT / "requirements.lock").read_text()
    return {m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, flags=re.M)}


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    pins = lock_pins()
    for requirement in declared():
        name = requirement.name.lower()
        assert name in pins, f"{name} is not in requirements.lock: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            name,
            pins[name],
            str(requirement.specifier),
        )


def test_torch_is_the_cpu_wheel_and_transformers_is_bounded() -> None:
    assert lock_pins()["torch"].endswith("+cpu")
    [transformers] = [r for r in declared() if r.name == "transformers"]
    assert not transformers.specifier.contains("6.0.0") and transformers.specifier.contains("5.24.0")
