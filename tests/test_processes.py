"""Process trees: a command and everything it starts end together, even ranks a launcher put in sessions of their own."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from gatt.io import processes
from gatt.io.processes import ProcessTree, TreeLeftovers, TreeTimeout, running

# Like torchrun: the launcher starts its worker in a session of its own, so killing the launcher's group misses it.
LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], env={**os.environ, "RANK": "0"}, start_new_session=True
    )
    print("worker", worker.pid, flush=True)
    AFTER
    """
)


def worker_pid(tree: ProcessTree) -> int:
    for line in tree.output().splitlines():
        if line.startswith("worker "):
            return int(line.split()[1])
    raise AssertionError(tree.output())


def test_a_tree_still_running_at_its_timeout_is_killed_whole_and_the_error_names_the_stuck_rank(tmp_path):
    log = tmp_path / "job.log"
    tree = ProcessTree([sys.executable, "-c", LAUNCHER.replace("AFTER", "worker.wait()")], log)
    with pytest.raises(TreeTimeout) as error:
        tree.wait(timeout_s=3)
    worker = worker_pid(tree)
    assert "rank 0 (pid" in str(error.value) and "process (pid" in str(error.value)
    assert str(log) in str(error.value)
    assert not running(worker) and not running(tree.pid)
    assert tree.members() == []


def test_a_command_that_exits_leaving_a_process_behind_fails_and_leaves_nothing(tmp_path):
    tree = ProcessTree([sys.executable, "-c", LAUNCHER.replace("AFTER", "")], tmp_path / "job.log")
    with pytest.raises(TreeLeftovers, match=r"exited with 0 but left rank 0 \(pid"):
        tree.wait(timeout_s=60)
    assert not running(worker_pid(tree)) and tree.members() == []


def test_run_returns_the_exit_code_and_output_and_the_context_ends_a_tree_left_running(tmp_path):
    script = "import sys; print('hello'); print('oops', file=sys.stderr); raise SystemExit(3)"
    done = processes.run([sys.executable, "-c", script], tmp_path / "a.log", 60)
    assert (done.returncode, sorted(done.output.split()), done.errors) == (3, ["hello", "oops"], "")
    done = processes.run([sys.executable, "-c", script], tmp_path / "b.log", 60, split_errors=True)
    assert (done.returncode, done.output, done.errors) == (3, "hello\n", "oops\n")
    with ProcessTree([sys.executable, "-c", LAUNCHER.replace("AFTER", "worker.wait()")], tmp_path / "c.log") as tree:
        while "worker" not in tree.output():
            pass
    assert not running(worker_pid(tree)) and tree.members() == []


def test_a_stuck_torchrun_rank_is_named_with_its_own_log(tmp_path):
    # Rank 1 finishes; rank 0 hangs, as the deadlocked rank did in DDP's teardown.
    script = tmp_path / "job.py"
    script.write_text(
        "import os, time\nif os.environ['RANK'] == '0':\n    time.sleep(300)\nprint('done', flush=True)\n"
    )
    ranks = tmp_path / "ranks"
    tree = ProcessTree(processes.torchrun(2, ranks, "--standalone", script), tmp_path / "job.log", rank_logs=ranks)
    with pytest.raises(TreeTimeout) as error:
        tree.wait(timeout_s=10)  # rank 1, a plain script, has long finished
    message = str(error.value)
    assert "rank 0 (pid" in message and "rank 1 (pid" not in message
    assert f"{ranks}/" in message and "/attempt_0/0/stdout.log" in message
    assert tree.members() == []
    assert "[default1]:done" in tree.output()


def test_members_ignore_processes_of_other_trees(tmp_path):
    with ProcessTree([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "a.log") as a:
        with ProcessTree([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "b.log") as b:
            assert [m.pid for m in a.members()] == [a.pid] and [m.pid for m in b.members()] == [b.pid]
            assert os.getpid() not in {m.pid for m in a.members()}


def test_a_tree_started_inside_a_tree_ends_with_the_outer_one(tmp_path):
    # gpu-check runs the demo as a tree, and the demo runs each stage as a tree of its own: killing the outer tree
    # must end the stage too (an orphaned report stage once held a GPU's memory after its check was killed).
    inner = tmp_path / "inner.pid"
    script = (
        "from gatt.io.processes import ProcessTree\n"
        "import sys, time\n"
        f"tree = ProcessTree([sys.executable, '-c', 'import time; time.sleep(300)'], {str(tmp_path / 'inner.log')!r})\n"
        f"open({str(inner)!r}, 'w').write(str(tree.pid))\n"
        "tree.process.wait()\n"
    )
    outer = ProcessTree([sys.executable, "-c", script], tmp_path / "outer.log")
    deadline = time.monotonic() + 120  # importing gatt (torch, transformers) takes 3-8 s on a loaded 2-core VM
    while not inner.exists() and time.monotonic() < deadline and outer.process.poll() is None:
        time.sleep(0.1)
    assert inner.exists(), outer.output()
    with pytest.raises(TreeTimeout):
        outer.wait(timeout_s=1)
    assert not running(int(inner.read_text())) and outer.members() == []
