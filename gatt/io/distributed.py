"""Work split across the processes of one job (`torchrun`, `accelerate launch`) for the stages that are not
training: synthesis shards and evaluation batches.

Items are dealt round robin: process `rank` of `world` takes items rank, rank + world, ... Every item is a
fixed unit of work (a shard of dialogues, a batch of rollouts) whose result does not depend on which
process makes it or on what the others do, so the merged output is the same for any process count. A
plain `python` run is the same code with one process.

Accelerate's `PartialState` reads the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK; gloo on CPU
with ACCELERATE_USE_CPU=1, NCCL on GPUs) and picks this process's device (cuda:LOCAL_RANK).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import gather_object, parse_flag_from_env

T = TypeVar("T")

# Processes wait for one another at the end of a stage while the slowest finishes its share (a synthesis
# shard can take hours with a large teacher): far longer than torch's default 30-minute collective timeout.
# A process that dies does not leave the others waiting: the launcher stops the whole job.
STAGE_TIMEOUT = timedelta(days=7)


def process_state() -> PartialState:
    """This process's place in the job (one process without a launcher); gloo on CPU (`on_cpu`).

    Returns:
        Accelerate's state of this process, its collectives timing out after `STAGE_TIMEOUT`.

    Raises:
        RuntimeError: When Accelerate sees another number of processes than the launcher started (`check_launch`).
    """
    state = PartialState(cpu=on_cpu(), timeout=STAGE_TIMEOUT)
    check_launch(state.num_processes)
    return state


def on_cpu() -> bool:
    """Whether the job runs on CPU: no accelerator, or ACCELERATE_USE_CPU=1.

    Accelerate must be told (`cpu=True`), else under torchrun on a CPU machine it sees no backend and every process
    runs alone.

    Returns:
        True where no accelerator is available or ACCELERATE_USE_CPU is set.
    """
    return parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.accelerator.is_available()


def end_job() -> None:
    """Close a stage run by a launcher: every process waits for the others, then leaves the process group.

    A process that exits with its group open while a peer still works (process 0 judging a report, merging
    shards) has been seen to abort at exit in gloo ("terminate called without an active exception").
    """
    state = process_state()
    if state.num_processes > 1:
        state.wait_for_everyone()
        with last_reference_in_python():
            state.destroy_process_group()


@contextmanager
def last_reference_in_python() -> Iterator[None]:
    """Destroy the process group inside this block, and its last reference is dropped here, from Python.

    Gloo's destructor joins its worker threads, and a worker may need the GIL to free a tensor it still holds.
    torch's Python binding of a process group releases the GIL before destroying it; a C++ owner (DDP's reducer,
    torch's own registry) does not, and the join then waits forever on a thread that waits for the GIL: the
    teardown deadlock seen in CI. Holding the group here while `destroy_process_group` empties the registry
    makes this reference the last one (free any DDP model before: its reducer holds the group too).

    Yields:
        None, once; the block runs while this reference holds the group (if one is initialized).
    """
    group = torch.distributed.group.WORLD if torch.distributed.is_initialized() else None
    yield
    del group  # the last reference: the binding drops the GIL while gloo joins its threads


def check_launch(num_processes: int) -> None:
    """Refuse a job whose processes do not see one another: each would do all the work.

    Args:
        num_processes: The number of processes Accelerate sees.

    Raises:
        RuntimeError: When it differs from the number the launcher started (WORLD_SIZE, default 1).
    """
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if num_processes != launched:
        raise RuntimeError(f"launched as {launched} processes (WORLD_SIZE) but Accelerate sees {num_processes}")


def my_items(count: int, state: PartialState) -> list[int]:
    """The indices of the items (of `count`) this process makes.

    Args:
        count: The number of items of the whole job.
        state: This process's place in the job (`process_state`).

    Returns:
        The indices rank, rank + world, ... below `count`.
    """
    return list(range(state.process_index, count, state.num_processes))


def gather_items(mine: dict[int, T], state: PartialState) -> list[T]:
    """Every process's items, in index order (on every process).

    Args:
        mine: This process's items, by index.
        state: This process's place in the job (`process_state`).

    Returns:
        The items of all processes, sorted by index.
    """
    if state.num_processes == 1:
        return [mine[i] for i in sorted(mine)]
    every: Sequence[tuple[int, T]] = gather_object(sorted(mine.items(), key=lambda pair: pair[0]))
    return [item for _, item in sorted(every, key=lambda pair: pair[0])]
