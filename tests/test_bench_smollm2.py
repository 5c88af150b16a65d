"""benchmarks/bench_smollm2.py's wiring at --quick sizes, on a tiny model in place of SmolLM2 (the rows' shapes,
the identities each side asserts, the ratios computed from the figures beside them)."""

import json

import bench_smollm2  # noqa: E402
import pytest
import run as runner  # noqa: E402
import torch
from test_generation import model, tokenizer  # noqa: E402,F401  (the tiny model and tokenizer fixtures)

from gatt.io.machine import cpu_name


@pytest.fixture(scope="module")
def results(model, tokenizer):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return bench_smollm2.run(quick=True, device="cpu", load=lambda: (model, tokenizer))
    finally:
        torch.set_num_threads(threads)


def test_rollout_row_compares_bf16_and_the_exact_path_with_the_path_before(results):
    row = results["smollm2_rollout_tokens_per_s"]
    assert row["mode"] == "bf16" and row["unit"] == "tokens/s" and row["goal"] == 2.0
    # value and baseline are rounded to 2 decimals, the ratio (of the raw rates) to 4: at a few tokens/s (the tiny
    # model in bf16) the rounding alone moves value / baseline by more than 1e-3 of it.
    expected = row["value"] / row["baseline"]
    rounding = (0.005 / row["value"] + 0.005 / row["baseline"]) * expected + 5e-5
    assert abs(row["ratio"] - expected) <= 1e-3 * expected + rounding
    assert row["value"] == pytest.approx(row["tokens"]["bf16"] / row["seconds"]["bf16"], rel=0.01)
    assert row["baseline"] == pytest.approx(row["tokens"]["before"] / row["seconds"]["before"], rel=0.01)
    assert row["exact"]["ratio"] == pytest.approx(row["exact"]["tokens_per_s"] / row["baseline"], rel=1e-2)
    assert row["exact"]["identical_to_before"] == 1.0  # stopped rows leaving the batch change no reply
    assert 0 <= row["agreement"] <= 1 and row["ceiling_tokens_per_s"] > 0
    assert row["ceiling_share"] == pytest.approx(row["value"] / row["ceiling_tokens_per_s"], abs=1e-3)
    assert set(row["adherence_per_turn"]["exact"]) <= set(range(1, 5))
    assert row["settings"]["repetition_penalty"] == 1.2 and row["settings"]["measure_attention"] is True


def test_scorer_share_is_the_gates_part_of_the_report(results):
    row = results["smollm2_report_scorer_share"]
    seconds, judges = row["seconds"], row["judges"]
    assert set(judges) == {"contrast", "embedding", "both"}
    for judge in judges.values():  # each judge's seconds over the report's: the rollouts and that judge's gate
        assert judge["share"] == pytest.approx(judge["seconds"] / (judge["seconds"] + seconds["rollouts"]), abs=2e-3)
        assert 0 <= judge["verdicts_identical_to_contrast"] <= 1
    assert judges["contrast"]["seconds"] == pytest.approx(seconds["answer_gate"], rel=1e-3)
    assert judges["contrast"]["verdicts_identical_to_contrast"] == 1.0
    # the headline is the strict gate's judge of messages without topic words
    assert row["judge"] == "embedding" and row["value"] == judges["embedding"]["share"]
    assert row["met"] == (row["value"] <= 0.15) and row["higher_is_better"] is False
    # the shared-prompt scorer gives the one-pass scorer's numbers, so the same verdicts
    assert row["replies_scored"] > 0 and row["before"]["verdicts_identical"] == 1.0
    assert row["before"]["relevance_max_abs_diff"] < 1e-3
    assert row["ratio_over_before"] == pytest.approx(row["before"]["seconds"] / seconds["answer_gate"], rel=1e-2)
    assert 0 <= row["bf16"]["verdicts_identical"] <= 1 and row["bf16"]["relevance_max_abs_diff"] > 0  # rounding shows


def test_the_scorer_share_alone_times_the_exact_rollouts_and_each_judge(model, tokenizer):
    only = bench_smollm2.run(
        quick=True, device="cpu", load=lambda: (model, tokenizer), only=["smollm2_report_scorer_share"]
    )
    assert set(only) == {"smollm2_report_scorer_share"}
    row = only["smollm2_report_scorer_share"]
    assert row["settings"]["order"] == "exact, one after another" and "before" not in row and "bf16" not in row
    assert (
        set(row["judges"]) == {"contrast", "embedding", "both"} and row["value"] == row["judges"]["embedding"]["share"]
    )


def test_generate_and_teacher_rows_time_the_same_work_on_both_sides(results):
    generate = results["smollm2_rollout_vs_hf_generate"]
    assert generate["identical_replies"] == 1.0 and generate["settings"]["dialogues"] == {"ours": 8, "theirs": 1}
    teacher = results["smollm2_teacher_vs_hf_generate"]
    assert teacher["settings"]["k"] == 4 and teacher["settings"]["dialogues"] == {"ours": 8, "theirs": 1}
    assert set(teacher["top_p_ms"]) == {"ours", "hugging_face"} and min(teacher["top_p_ms"].values()) > 0
    for row in (generate, teacher):
        assert row["ratio"] == pytest.approx(row["ours"] / row["theirs"], rel=1e-3)


def test_the_cpu_numerics_rows_refuse_another_device():
    # bf16 and int8 against the exact path, and the scorer's share, measure CPU numerics; the rows against
    # generate() run on a GPU too (make gpu-check).
    for row in bench_smollm2.CPU_ROWS:
        with pytest.raises(ValueError, match=f"bench_smollm2: {row} measure the CPU paths"):
            bench_smollm2.run(quick=True, device="cuda", only=[row])
    assert set(bench_smollm2.CPU_ROWS) == runner.CPU_ONLY


def test_batched_rows_compare_ours_with_the_fastest_batched_generate(results):
    rollouts = results["smollm2_rollout_vs_hf_generate_batched"]
    assert rollouts["best_baseline"] in rollouts["ratios"] and set(rollouts["ratios"]) == {
        "generate_none",
        "generate_carry",
    }
    assert rollouts["ratio"] == pytest.approx(min(rollouts["ratios"].values()), rel=1e-3)  # over the fastest
    assert rollouts["ratio"] == pytest.approx(rollouts["ours"] / rollouts["theirs"], rel=1e-3)
    # same weights, greedy, every decoding parameter given: Hugging Face's Llama writes the engine's replies
    assert rollouts["identical_replies"] == {"ours_probe_off": 1.0, "generate_none": 1.0, "generate_carry": 1.0}
    assert rollouts["settings"]["hugging_face_model"] == "LlamaForCausalLM (sdpa)" and rollouts["goal"] == 2.5
    teacher = results["smollm2_teacher_vs_hf_generate_batched"]
    assert teacher["settings"]["dialogues"] == {"ours": 8, "theirs": 8} and teacher["goal"] == 2.5
    assert "left-padded" in teacher["settings"]["theirs"]
    assert teacher["ratio"] == pytest.approx(teacher["ours"] / teacher["theirs"], rel=1e-3)
    # both batched baselines ran on every batch (--quick), and theirs is the faster in all
    baselines = {name: sum(b[name] for b in teacher["batches"]) for name in ("generate_none", "generate_carry")}
    assert teacher["best_baseline"] == min(baselines, key=baselines.get)
    assert teacher["seconds"]["theirs"] == pytest.approx(min(baselines.values()), abs=0.06)


def test_batched_teacher_row_resumes_at_the_batch_after_the_last_it_kept(model, tokenizer, tmp_path):
    size = {**bench_smollm2.QUICK, "dialogues": 4, "turns": 2, "teacher_batch": 2, "max_new_tokens": 4}
    progress = tmp_path / "progress.json"
    first = bench_smollm2.teacher_row(model, tokenizer, size, batched=True, progress=progress)
    kept = json.loads(progress.read_text())
    assert [b["first"] for b in kept["batches"]] == [0, 2] and kept["batches"] == first["batches"]
    assert all(b["cpu"] == cpu_name() for b in kept["batches"])  # each batch names the machine it ran on
    assert first["seconds"]["ours"] == pytest.approx(sum(b["ours"] for b in kept["batches"]), abs=0.06)
    # a run stopped after its first batch pair: the next one keeps that pair and runs the second batch only
    kept["batches"] = [{**kept["batches"][0], "ours": 1000.0, "generate_none": 3000.0, "generate_carry": 2000.0}]
    progress.write_text(json.dumps(kept))
    resumed = bench_smollm2.teacher_row(model, tokenizer, size, batched=True, progress=progress)
    assert [b["first"] for b in resumed["batches"]] == [0, 2] and resumed["batches"][0]["ours"] == 1000.0
    # theirs is the faster baseline over both batches: the carried cache here
    assert resumed["best_baseline"] == "generate_carry"
    assert resumed["seconds"]["theirs"] == pytest.approx(2000.0 + resumed["batches"][1]["generate_carry"], abs=0.06)
    # other settings start over
    other = bench_smollm2.teacher_row(model, tokenizer, {**size, "turns": 1}, batched=True, progress=progress)
    assert max(b["ours"] for b in other["batches"]) < 1000.0
    assert json.loads(progress.read_text())["settings"]["turns"] == 1
