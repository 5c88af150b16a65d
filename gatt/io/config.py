"""Configs that are the command line: one dataclass per stage, whose fields carry their flags' help.

A field declared with `arg(default, "help", **argparse_settings)` becomes the flag `--field-name` with that help;
`parse_config(cls, argv)` reads `--config FILE.yaml` (keys: the field names) first, then the flags given on the
command line over it, and returns the dataclass. So a default is written once, in the dataclass, and a YAML file, a
command line and `--help` all read it from there. A YAML key that names no field is refused naming the file and the
fields; a required field missing from both is refused naming its flag.
(The pattern of TRL's `SFTConfig` and `HfArgumentParser`, whose list fields cannot take zero values and whose
flags are spelt with underscores: ours keeps the flags this project's commands have always had.)
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")
REQUIRED = dataclasses.MISSING  # `arg(REQUIRED, ...)`: no default; the YAML or the command line must give it


def arg(default: Any = REQUIRED, help: str = "", **settings: Any) -> Any:
    """A config field and its flag.

    Args:
        default: The field's default (REQUIRED: none; the YAML or the command line must give it). A list default is
            copied for each config.
        help: The flag's help.
        **settings: argparse settings (choices, nargs, action, metavar) where the field's type does not say them.

    Returns:
        The dataclass field, its help and settings in its metadata.
    """
    metadata = {"help": help, "settings": settings}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def yaml_values(value: Any) -> Any:
    """`value` as YAML writes it and a config reads it back: paths as strings, tuples as lists.

    Args:
        value: A value, or a dict, list or tuple of them (converted throughout).

    Returns:
        The converted value.
    """
    if isinstance(value, dict):
        return {key: yaml_values(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [yaml_values(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def config_keys(cls: type, exclude: Collection[str] = ()) -> list[str]:
    """The settings of the dataclass `cls` that are flags (declared with `arg`), but those in `exclude`.

    Args:
        cls: The config dataclass.
        exclude: Field names to leave out.

    Returns:
        The field names, in the dataclass's order.
    """
    return [f.name for f in dataclasses.fields(cls) if "settings" in f.metadata and f.name not in exclude]


def check_section(
    values: Any, where: str, keys: Collection[str], set_elsewhere: Collection[str] = ()
) -> dict[str, Any]:
    """Check a section of a config, which holds settings among `keys`.

    Args:
        values: The section.
        where: The section's name, for the messages.
        keys: The keys the section may hold.
        set_elsewhere: Keys among `keys` that the section's owner sets itself, so the section may not.

    Returns:
        `values`, as a dict.

    Raises:
        ValueError: When `values` is not a mapping, or holds a key not among `keys` or among `set_elsewhere`
            (naming it and the keys there are).
    """
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a mapping of settings, got {values!r}")
    valid = [key for key in keys if key not in set_elsewhere]
    if unknown := sorted(set(values) - set(valid)):
        taken = [key for key in unknown if key in set_elsewhere]
        elsewhere = f"{', '.join(taken)} set by the recipe itself; " if taken else ""
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; {elsewhere}the keys are {', '.join(valid)}")
    return dict(values)


def _flag(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def _scalar(annotation: Any) -> Any:
    """The type argparse converts one value to: int, float, str or Path (None | X: X; list[X]: X)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is list:
        annotation = typing.get_args(annotation)[0]
    return annotation if annotation in (int, float, str, Path) else str


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, exclude: Collection[str] = ()) -> None:
    """Add one flag per field of the dataclass `cls` declared with `arg` to `parser`.

    Every default is SUPPRESS, so the namespace holds what was given.

    Args:
        parser: The parser to add the flags to.
        cls: The config dataclass.
        exclude: Field names to add no flag for.
    """
    hints = typing.get_type_hints(cls)
    own = cls.__dict__.get("__annotations__", {})
    fields = dataclasses.fields(cls)
    for field in [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]:  # inherited last
        if not field.metadata or "settings" not in field.metadata or field.name in exclude:
            continue  # not a command-line field (of this command)
        settings = dict(field.metadata["settings"])
        help_text = field.metadata["help"]
        default = field.default_factory() if field.default_factory is not REQUIRED else field.default
        # no default shown for a required field, None, an empty list or a switch (0 and 1 are shown: 0 == False)
        shown = not (default is REQUIRED or default is None or default == [] or isinstance(default, bool))
        if shown and "default:" not in help_text:
            help_text += f" (default: {' '.join(map(str, default)) if isinstance(default, list | tuple) else default})"
        if hints[field.name] is bool and "action" not in settings:  # --flag, or --flag / --no-flag when on by default
            settings["action"] = argparse.BooleanOptionalAction if default is True else "store_true"
        if settings.get("action") not in ("store_true", "store_false", "count", argparse.BooleanOptionalAction):
            settings.setdefault("type", _scalar(hints[field.name]))
        parser.add_argument(_flag(field), dest=field.name, help=help_text, default=argparse.SUPPRESS, **settings)


def read_yaml_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A YAML mapping with `key=value` overrides applied.

    Args:
        path: The YAML file.
        overrides: `key=value` overrides, values parsed as YAML; `section.key=value` sets a key of a nested section.

    Returns:
        The mapping, overrides applied (an empty file gives {}).

    Raises:
        FileNotFoundError: When `path` does not exist.
        ValueError: When the file is not a mapping, an override is not `key=value`, or an override's section is
            not a mapping.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file not found: {path}")
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of keys to values")
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            raise ValueError(f"override {override!r} must look like key=value")
        *sections, name = key.strip().split(".")  # a.b=v: key b of section a
        target = values
        for section in sections:
            target = target.setdefault(section, {})
            if not isinstance(target, dict):
                raise ValueError(f"override {override!r}: {section} is not a section (a mapping) in {path}")
        target[name] = yaml.safe_load(value)
    return values


def override_keys(overrides: Sequence[str]) -> set[str]:
    """The top-level keys `key=value` overrides set (`a.b=v` sets `a`).

    Args:
        overrides: `key=value` overrides.

    Returns:
        The keys.
    """
    return {override.partition("=")[0].strip().split(".")[0] for override in overrides}


def dataclass_from_dict(
    cls: type[T],
    values: dict[str, Any],
    source: str = "config",
    overridden: Collection[str] = (),
    *,
    shared: Collection[str] = (),
) -> T:
    """`cls` from `values`: the project's one config loader.

    Each value is converted to its field's type where YAML wrote it otherwise (a path as a string, a tuple as a list).

    Args:
        cls: The config dataclass.
        values: {field name: value}.
        source: Where the values were read from, for the messages (default "config").
        overridden: The keys given on the command line (`override_keys`), the others read from `source`.
        shared: Keys that the same command's other configs take (`configs_from`), left to them.

    Returns:
        The config.

    Raises:
        ValueError: When a key is unknown (naming it, where it was given and the valid keys), a required one is
            missing, or a value is outside its field's choices.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names) - set(shared))
    if unknown:
        given = [key for key in unknown if key in overridden]
        where = "the command line" if given else source
        raise ValueError(f"{where}: unknown key(s) {', '.join(given or unknown)}; valid keys: {', '.join(names)}")
    values = {name: value for name, value in values.items() if name in names}
    if missing := _missing(cls, values):
        keys, flags = ", ".join(f.name for f in missing), ", ".join(_flag(f) for f in missing)
        raise ValueError(
            f"{source}: missing required key(s) {keys}; give {flags} on the command line, or {keys} in a --config file"
        )
    _refuse_bad_choices(cls, values, source)
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        if _scalar(hints[name]) is Path and isinstance(value, str):
            values[name] = Path(value)
        elif typing.get_origin(hints[name]) is list and isinstance(value, tuple):
            values[name] = list(value)
        elif typing.get_origin(hints[name]) is tuple and isinstance(value, list):
            values[name] = tuple(value)
    return cls(**values)


def _refuse_bad_choices(cls: type, values: dict[str, Any], source: str) -> None:
    """Refuse a value (or a list's element) outside its field's `choices`, naming the key and `source`: argparse
    checks a flag's choices, this checks a config file's."""
    for field in dataclasses.fields(cls):
        choices = field.metadata.get("settings", {}).get("choices") if field.metadata else None
        value = values.get(field.name)
        if choices is None or value is None:
            continue
        for item in value if isinstance(value, list | tuple) else [value]:
            if item not in choices:
                allowed = ", ".join(map(str, choices))
                raise ValueError(f"{source}: {field.name} must be one of {allowed}, got {item!r}")


def _missing(cls: type, values: dict[str, Any]) -> list[dataclasses.Field]:
    """The fields of `cls` that have no default and no value in `values`."""
    return [
        f
        for f in dataclasses.fields(cls)
        if f.name not in values and f.default is REQUIRED and f.default_factory is REQUIRED
    ]


def configs_from(classes: Sequence[type], given: dict[str, Any], parser: argparse.ArgumentParser) -> tuple[Any, ...]:
    """The dataclasses `classes` from what `parser` parsed.

    Args:
        classes: The config dataclasses.
        given: What `parser` parsed; its `config`, the YAML file read first, the other values over it.
        parser: The parser; the file's keys are checked against the settings it takes.

    Returns:
        One config per class, in order.
    """
    given = dict(given)
    file = given.pop("config", None)
    names = [a.dest for a in parser._actions if a.option_strings and a.dest not in ("help", "config")]
    source = f"--config {file}" if file is not None else "the command line"
    values = {**(check_section(read_yaml_config(file), source, names) if file is not None else {}), **given}
    return tuple(dataclass_from_dict(cls, values, source, shared=names) for cls in classes)


def parse_config(cls: type[T], argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None) -> T:
    """The command line `argv` read as `cls`: `--config FILE.yaml` first, the flags given over it.

    Args:
        cls: The config dataclass.
        argv: The command-line arguments (None: sys.argv's).
        parser: The parser (None: `config_parser(cls)`).

    Returns:
        The config.
    """
    parser = parser or config_parser(cls)
    return configs_from((cls,), vars(parser.parse_args(argv)), parser)[0]


def config_parser(
    *classes: type, parser: argparse.ArgumentParser | None = None, **kwargs: Any
) -> argparse.ArgumentParser:
    """An argument parser with `--config FILE.yaml` and one flag per field of each of `classes`.

    Args:
        *classes: The config dataclasses.
        parser: The parser to add the flags to (None: a new one).
        **kwargs: argparse.ArgumentParser's arguments for a new parser.

    Returns:
        The parser.
    """
    parser = parser or argparse.ArgumentParser(**kwargs)
    parser.add_argument(
        "--config",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="FILE.yaml",
        help="settings from a YAML file (keys: the flags' names with underscores); flags given override them",
    )
    for cls in classes:
        add_config_arguments(parser, cls)
    return parser
