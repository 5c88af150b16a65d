"""Commands run as a tree of processes (a launcher and its ranks) that is always ended as a whole.

torchrun starts each rank in a session of its own, so killing the launcher, or its process group, leaves the
ranks running, re-parented to init: orphans that hold cores and ports until someone kills them by hand. Every
process started here carries a tag in its environment, which a launcher's ranks inherit, so the whole tree is
found by that tag, and ended, even after its parent is gone. A command still running at its timeout is killed
with every process of its tree, and the error names each one left (its rank, when it has one) and the log.

Linux only for the tree (`/proc`); elsewhere the command's own process group is still ended.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

TAG = "GATT_PROCESS_TREE"
PROC = Path("/proc")


@dataclass(frozen=True)
class Member:
    """One live process of a tree."""

    pid: int
    rank: str | None  # RANK, set by a launcher for each of its workers; None for any other process
    command: str

    def describe(self, rank_logs: Path | None = None) -> str:
        """`rank R (pid P: COMMAND)`, with the rank's own log files when torchrun wrote them under `rank_logs`.

        Args:
            rank_logs: The folder torchrun wrote each rank's log files to (`torchrun(...)`); None: no log files named.

        Returns:
            The description (`process (pid P: COMMAND)` for a process without a rank), the command cut to 120
            characters, each log file appended as `, log PATH`.
        """
        who = f"rank {self.rank}" if self.rank is not None else "process"
        logs = sorted(rank_logs.glob(f"*/attempt_*/{self.rank}/*.log")) if rank_logs and self.rank is not None else []
        return f"{who} (pid {self.pid}: {self.command[:120]})" + "".join(f", log {log}" for log in logs)


class TreeTimeout(RuntimeError):
    """A command's tree was still running at its timeout (and has been killed)."""


class TreeLeftovers(RuntimeError):
    """A command exited but left processes of its tree running (they have been killed)."""


def members(tag: str) -> list[Member]:
    """The live processes whose environment carries `tag` (zombies and unreadable processes aside).

    Args:
        tag: The tree's tag, one of the comma-separated values of the GATT_PROCESS_TREE environment variable.

    Returns:
        The processes (this one aside), those without a rank first, then by rank and pid; none where `/proc` is missing.
    """
    found = []
    if not PROC.is_dir():
        return found
    prefix = f"{TAG}=".encode()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            tags = next((v[len(prefix) :].decode().split(",") for v in environ if v.startswith(prefix)), [])
            if tag not in tags or not running(int(entry.name)):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone, or not ours
        rank = next((v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"RANK=")), None)
        found.append(Member(int(entry.name), rank, command))
    return sorted(found, key=lambda m: (m.rank is not None, m.rank or "", m.pid))


def kill(tag: str, pgid: int | None = None) -> list[Member]:
    """SIGKILL every process of the tree (and the process group `pgid`) and wait until each has died (a zombie at most).

    Repeated while the tree still shows a process (one started meanwhile), for 10 s at most.

    Args:
        tag: The tree's tag (see `members`).
        pgid: A process group to kill as well (the command's own, which works without `/proc`); None: none.

    Returns:
        The processes of the tree that were alive.
    """
    alive: list[Member] = []
    deadline = time.monotonic() + 10
    while (found := members(tag)) and time.monotonic() < deadline:
        alive += [member for member in found if member.pid not in {m.pid for m in alive}]
        for member in found:
            try:
                os.kill(member.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        while any(running(member.pid) for member in found) and time.monotonic() < deadline:
            time.sleep(0.02)
    return alive


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not died yet (a zombie, or a process being torn down, has).

    Args:
        pid: The process id.

    Returns:
        False when the process is gone, a zombie or being torn down (or `/proc` cannot tell), else True.
    """
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def torchrun(processes: int, rank_logs: Path, *args: object) -> list[str]:
    """`torchrun --nproc_per_node PROCESSES ... ARGS` that also writes each rank's output to its own files.

    Each rank's output goes to its files under `rank_logs` and into the shared output, each line prefixed with its
    rank (`[default0]:`).

    Args:
        processes: PROCESSES, the ranks to start on this machine.
        rank_logs: The folder for each rank's log files.
        *args: ARGS, the script and its arguments (each passed through str()).

    Returns:
        The command line, run with this Python (`python -m torch.distributed.run`).
    """
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    return [*launcher, "--log-dir", str(rank_logs), "--tee", "3", *map(str, args)]


class ProcessTree:
    """`command` started in a session of its own, its output in `log`, every descendant tagged.

    Use as a context manager: leaving the block ends whatever of the tree still runs.

    Args:
        command: The command: its arguments, or one string (run by a shell with `shell`).
        log: Where the command's output (stdout and stderr) goes; None: this process's own output.
        env: The command's environment (default: this process's), to which the tree's tag is added.
        cwd: The command's working folder (default: this process's).
        shell: Whether `command` runs in a shell.
        rank_logs: Where `torchrun(...)` writes each rank's files, named in the errors.
        stderr_log: Where the command's standard error goes, kept apart from `log`; None: into `log`.
    """

    def __init__(
        self,
        command: Sequence[str] | str,
        log: Path | None,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        shell: bool = False,
        rank_logs: Path | None = None,
        stderr_log: Path | None = None,
    ) -> None:
        self.rank_logs, self.stderr_log = rank_logs, stderr_log
        self.command = command if isinstance(command, str) else shlex.join(str(c) for c in command)
        self.log = Path(log) if log is not None else None
        self.tag = uuid.uuid4().hex
        # A tree started inside another (a demo stage inside gpu-check) carries both tags: ending the outer ends it.
        base = os.environ if env is None else env
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
        with (
            self.log.open("wb") if self.log is not None else nullcontext() as out,
            stderr_log.open("wb") if stderr_log else nullcontext() as err,
        ):
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env={**base, TAG: ",".join(filter(None, [base.get(TAG, ""), self.tag]))},
                stdout=out,
                stderr=err or subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                shell=shell,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        """The command's own process id (the leader of its session and process group)."""
        return self.process.pid

    def output(self) -> str:
        """What the tree has written so far (its standard output only, when `stderr_log` takes the errors).

        Returns:
            The text of `log`, undecodable bytes replaced; "" when the output is not logged to a file.
        """
        return self.log.read_text(errors="replace") if self.log is not None else ""

    def errors(self) -> str:
        """What the tree has written to its standard error, when `stderr_log` keeps it apart ("" otherwise).

        Returns:
            The text of `stderr_log`, undecodable bytes replaced, or "".
        """
        return self.stderr_log.read_text(errors="replace") if self.stderr_log else ""

    def members(self) -> list[Member]:
        """The live processes of the tree (see the module-level `members`).

        Returns:
            Each live process that carries this tree's tag.
        """
        return members(self.tag)

    def kill(self) -> list[Member]:
        """SIGKILL the whole tree now and reap the command's own process.

        Returns:
            The processes that were alive.
        """
        alive = kill(self.tag, self.process.pid)
        self.process.wait()
        return alive

    def time_out(self, timeout_s: float) -> TreeTimeout:
        """Kill the whole tree, which ran past `timeout_s`.

        Args:
            timeout_s: The timeout it ran past, named in the error.

        Returns:
            The error to raise, naming what still ran (with its rank and log files), the command, the log and its tail.
        """
        stuck = self.kill()
        return TreeTimeout(
            f"still running after {timeout_s:.0f} s, killed: {'; '.join(m.describe(self.rank_logs) for m in stuck)}\n"
            f"command: {self.command}\nits output: {self.log}\n{tail(self.log)}"
        )

    def wait(self, timeout_s: float) -> int:
        """Wait for the command to exit, then end whatever of its tree still runs.

        Args:
            timeout_s: How long to wait, in seconds.

        Returns:
            The command's exit code.

        Raises:
            TreeTimeout: When the command still runs at `timeout_s`: the tree is killed and the error names what
                still ran.
            TreeLeftovers: When the command exits leaving processes behind: they are killed and the error names them.
        """
        try:
            returncode = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise self.time_out(timeout_s) from None
        left = kill(self.tag)
        if left:
            raise TreeLeftovers(
                f"exited with {returncode} but left {'; '.join(m.describe(self.rank_logs) for m in left)} running: killed\n"
                f"command: {self.command}\nits output: {self.log}\n{tail(self.log)}"
            )
        return returncode

    def __enter__(self) -> ProcessTree:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None or self.members():
            self.kill()


@dataclass(frozen=True)
class Finished:
    """A command run to its end: its exit code, its output, and its standard error when kept apart."""

    returncode: int
    output: str
    errors: str


def run(
    command: Sequence[str] | str,
    log: Path,
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    shell: bool = False,
    rank_logs: Path | None = None,
    split_errors: bool = False,
) -> Finished:
    """Run `command` to its end as a `ProcessTree`. Nothing of it outlives the call.

    Args:
        command: The command: its arguments, or one string (run by a shell with `shell`).
        log: Where the command's output goes.
        timeout_s: How long the command may run, in seconds.
        env: The command's environment (default: this process's).
        cwd: The command's working folder (default: this process's).
        shell: Whether `command` runs in a shell.
        rank_logs: Where `torchrun(...)` writes each rank's files, named in the errors.
        split_errors: Whether standard error is kept apart, beside `log` in LOG.stderr.

    Returns:
        The exit code, the output, and the standard error when kept apart ("" otherwise).

    Raises:
        TreeTimeout: When the command still runs at `timeout_s` (its tree is killed).
        TreeLeftovers: When the command exits leaving processes of its tree running (they are killed).
    """
    stderr_log = log.with_name(log.name + ".stderr") if split_errors else None
    with ProcessTree(command, log, env=env, cwd=cwd, shell=shell, rank_logs=rank_logs, stderr_log=stderr_log) as tree:
        returncode = tree.wait(timeout_s)
        return Finished(returncode, tree.output(), tree.errors())


def tail(log: Path | None, lines: int = 40) -> str:
    """The last `lines` lines of `log`, for an error message.

    Args:
        log: The log file; None: no log.
        lines: How many lines (default 40).

    Returns:
        Those lines joined by newlines; "" when `log` is None or does not exist.
    """
    if log is None:
        return ""
    try:
        text = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(text[-lines:])
