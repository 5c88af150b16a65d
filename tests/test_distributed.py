"""Synthesis and evaluation across processes (torchrun, 2 CPU processes on gloo): the same bytes as one
process, each process doing its share and no dialogue made twice; a killed 2-process run resumes."""

import json
import os
import time
from pathlib import Path

import pytest
import torch
from test_data_gen import catalogue_without_language, gatt_args, read_jsonl, tiny_teacher_dir

from data_gen.__main__ import main as data_gen_main
from data_gen.teacher import ModelTeacher, TurnRequest
from data_gen.user_turns import UserTurn
from gatt.eval.evaluate import main as evaluate_main
from gatt.io import processes
from gatt.io.distributed import my_items
from gatt.io.processes import ProcessTree

ROOT = Path(__file__).resolve().parents[1]
# One thread in every process: the runs compared below do the same arithmetic in the same order.
ENV = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}


def torchrun(work: Path, module: str, *args: str) -> ProcessTree:
    """`torchrun --standalone --nproc_per_node 2 -m MODULE ARGS` as a process tree (each rank's output in its own file
    under WORK/ranks-N too): a test that times out kills every process and names the rank that was stuck."""
    run = len(list(work.glob("ranks-*")))
    ranks = work / f"ranks-{run}"
    command = processes.torchrun(2, ranks, "--standalone", "-m", module, *args)
    return ProcessTree(command, work / f"torchrun-{run}.log", env=ENV, cwd=ROOT, rank_logs=ranks)


def finish(tree: ProcessTree) -> str:
    returncode = tree.wait(timeout_s=300)
    output = tree.output()
    assert returncode == 0, output
    return output


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_items_are_dealt_round_robin_each_to_one_process():
    class State:
        def __init__(self, rank: int, world: int) -> None:
            self.process_index, self.num_processes = rank, world

    for world in (1, 2, 3, 8):
        shares = [my_items(10, State(rank, world)) for rank in range(world)]
        assert sorted(i for share in shares for i in share) == list(range(10))  # each item once
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def compare_synthesis(one: Path, two: Path, num_dialogues: int, shard_size: int) -> None:
    """Same records; the 2-process summary says who made what, and the rest of it is the 1-process summary."""
    assert (two / "gatt.jsonl").read_bytes() == (one / "gatt.jsonl").read_bytes()
    single, double = (json.loads((d / "gatt.summary.json").read_text()) for d in (one, two))
    assert (single["processes"], single["per_rank"]) == (1, [num_dialogues])
    shards = -(-num_dialogues // shard_size)
    sizes = [min(shard_size, num_dialogues - s * shard_size) for s in range(shards)]
    # Process r made shards r, r + 2, ...: the work was split, and no dialogue was made twice.
    assert double["processes"] == 2 and double["per_rank"] == [sum(sizes[0::2]), sum(sizes[1::2])]
    for shard in range(shards):
        made = json.loads((two / "gatt.shards" / f"shard-{shard:05d}.stats.json").read_text())
        assert (made["process"], made["processes"]) == (shard % 2, 2)
    drop = ("processes", "per_rank", "path")
    assert {k: v for k, v in double.items() if k not in drop} == {k: v for k, v in single.items() if k not in drop}


def test_oracle_synthesis_on_two_processes_writes_the_one_process_bytes(tmp_path):
    constraints = catalogue_without_language(tmp_path)
    data_gen_main(gatt_args(tmp_path / "one", *constraints, n=44))
    output = finish(torchrun(tmp_path, "data_gen", *gatt_args(tmp_path / "two", *constraints, n=44)))
    assert output.count('"per_rank"') == 1  # one summary for the job, from process 0
    compare_synthesis(tmp_path / "one", tmp_path / "two", 44, 8)


def test_model_teacher_synthesis_on_two_processes_writes_the_one_process_bytes(tmp_path):
    teacher = tiny_teacher_dir(tmp_path)
    (tmp_path / "any.yaml").write_text(
        "constraints:\n  - {name: anything, instruction: Say anything., short: 'Say: anything', checks: [{type: regex, pattern: '(?s).*'}]}\n"
    )
    # One user message: no other question to contrast a reply with, so the random teacher's replies are kept
    # unless empty or looping; the records then hold its sampled text.
    (tmp_path / "turns.txt").write_text("Tell me something.\n")
    args = [
        "gatt",
        "--teacher",
        str(teacher),
        "--num-dialogues",
        "12",
        "--min-turns",
        "2",
        "--max-turns",
        "3",
        "--samples-per-turn",
        "2",
        "--max-new-tokens",
        "6",
        "--shard-size",
        "3",
        "--batch-size",
        "4",
        "--constraints",
        str(tmp_path / "any.yaml"),
        "--user-turns",
        str(tmp_path / "turns.txt"),
    ]
    data_gen_main([*args, "--out", str(tmp_path / "one")])
    finish(torchrun(tmp_path, "data_gen", *args, "--out", str(tmp_path / "two")))
    records = read_jsonl(tmp_path / "one" / "gatt.jsonl")
    assert len(records) >= 6 and len({r["messages"][1]["content"] for r in records}) > 1  # sampled, varied text
    compare_synthesis(tmp_path / "one", tmp_path / "two", 12, 3)


def test_killed_two_process_synthesis_resumes_without_duplicates_or_losses(tmp_path):
    constraints = catalogue_without_language(tmp_path)
    args = gatt_args(tmp_path / "killed", *constraints, n=320)
    tree = torchrun(tmp_path, "data_gen", *args)
    shards = tmp_path / "killed" / "gatt.shards"
    deadline = time.time() + 120
    while len(list(shards.glob("shard-*.jsonl"))) < 4 and time.time() < deadline and tree.process.poll() is None:
        time.sleep(0.05)
    killed = tree.kill()  # the launcher and both workers
    assert sorted(m.rank for m in killed if m.rank is not None) == ["0", "1"] and tree.members() == []
    done = len(list(shards.glob("shard-*.jsonl")))
    assert 4 <= done < 40 and not (tmp_path / "killed" / "gatt.jsonl").exists(), "killed part-way"
    finish(torchrun(tmp_path, "data_gen", *args))  # the same command resumes
    data_gen_main(gatt_args(tmp_path / "whole", *constraints, n=320))
    assert (tmp_path / "killed" / "gatt.jsonl").read_bytes() == (tmp_path / "whole" / "gatt.jsonl").read_bytes()
    ids = [r["id"] for r in read_jsonl(tmp_path / "killed" / "gatt.jsonl")]
    assert len(ids) == len(set(ids)) == 320
    summary = json.loads((tmp_path / "killed" / "gatt.summary.json").read_text())
    assert sum(summary["per_rank"]) == 320


def test_evaluation_on_two_processes_writes_the_one_process_report(tmp_path):
    model = tiny_teacher_dir(tmp_path)
    args = [
        "--model",
        f"a={model}",
        "--model",
        f"b={model}",
        "--turns",
        "3",
        "--dialogues",
        "6",
        "--no-instruction-dialogues",
        "2",
        "--batch-size",
        "2",
        "--max-new-tokens",
        "6",
        "--repeat-instruction",
        "a",
        "--split-softmax",
        "a:0.5",
        "--relevance-model",
        "none",
    ]
    evaluate_main([*args, "--out", str(tmp_path / "one")])
    output = finish(torchrun(tmp_path, "gatt.eval.evaluate", *args, "--out", str(tmp_path / "two")))
    assert output.count("wrote ") == 1  # process 0 reports
    for name in ("report.json", "transcripts.jsonl", "report.md"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    report = json.loads((tmp_path / "one" / "report.json").read_text())
    assert {"a", "b", "a+repeat", "a+split"} <= set(report)
    transcripts = read_jsonl(tmp_path / "one" / "transcripts.jsonl")
    assert len(transcripts) == 4 * 8  # 8 dialogues in each column (a+repeat, a+split: 6 rolled out, 2 reused)


def test_a_teacher_loads_in_bf16_and_over_a_device_map(tmp_path):
    teacher_dir = tiny_teacher_dir(tmp_path)
    teacher = ModelTeacher(teacher_dir, dtype="bf16", device_map="auto", max_new_tokens=4)
    assert teacher.model.dtype == torch.bfloat16 and teacher.device == torch.device("cpu")
    request = TurnRequest([{"role": "user", "content": "Hello there."}], UserTurn("Hello there.", None), [])
    assert [len(c) for c in teacher.sample([request], 2)] == [2]
    with pytest.raises(SystemExit, match="a --device or a --teacher-device-map, not both"):
        data_gen_main(
            [
                "gatt",
                "--teacher",
                str(teacher_dir),
                "--num-dialogues",
                "1",
                "--out",
                str(tmp_path / "x"),
                "--device",
                "cpu",
                "--teacher-device-map",
                "auto",
            ]
        )
