"""How every command line of the project reports bad input: one `error: ...` line, exit status 1, no traceback.

Each command's `main()` runs its work inside `exit_on_bad_input()`, which turns the errors that mean
bad input (a missing file or model, a bad value or key, malformed YAML or JSON, a user's check that
raises) into that one line, naming the file, key or record as the error's message does.
`GATT_TRACEBACK=1` re-raises instead, for debugging. `command_name` is the name a command's usage line shows:
the installed command's (`gatt-data`) or the module form it also runs as (`python -m data_gen`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml


class BadInput(RuntimeError):
    """Bad input that no built-in error type names: a user's check that fails to run (`gatt.data.checks.CheckError`)."""


BAD_INPUT: tuple[type[BaseException], ...] = (ValueError, OSError, BadInput, yaml.YAMLError)


@contextmanager
def exit_on_bad_input() -> Iterator[None]:
    """Exit with `error: <message>` when the block raises one of BAD_INPUT (see the module docstring).

    With `GATT_TRACEBACK` set in the environment the error is re-raised instead.

    Yields:
        Nothing; the block runs inside the context.

    Raises:
        SystemExit: When the block raises one of BAD_INPUT: the line `error: <message>` (the error's type name when
            its message is empty), exit status 1.
    """
    try:
        yield
    except BAD_INPUT as error:
        if os.environ.get("GATT_TRACEBACK"):
            raise
        sys.exit(f"error: {error or type(error).__name__}")


def command_name(module_form: str) -> str:
    """The command's name for its usage line.

    Args:
        module_form: The module form that runs the same code (`python -m data_gen`).

    Returns:
        The installed command's name (`gatt-data`) when one started this process, else `module_form`.
    """
    name = Path(sys.argv[0]).name
    return name if name.startswith("gatt-") else module_form
