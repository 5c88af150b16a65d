"""The rollout and teacher benchmarks (benchmarks/bench_eval.py, bench_teacher.py): both sides do the same work."""

import argparse

import bench_common  # noqa: E402
import bench_crossover  # noqa: E402
import bench_eval  # noqa: E402
import bench_teacher  # noqa: E402
import pytest
import torch
from test_generation import model, tokenizer  # noqa: E402,F401  (the tiny model and tokenizer fixtures)

import gatt.eval.rollout  # noqa: E402
import gatt.model.generation  # noqa: E402
from data_gen.synthesis import SynthesisConfig  # noqa: E402
from data_gen.teacher import ModelTeacher  # noqa: E402
from gatt.eval.inputs import load_eval_constraints, load_eval_turns  # noqa: E402
from gatt.eval.plan import plan_dialogues  # noqa: E402
from gatt.eval.rollout import reference_rollout, rollout  # noqa: E402
from gatt.eval.turns import RolloutConfig
from gatt.model.generation import ChatBatch  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread is as fast, and far less hurt by other processes on the cores than several."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def teacher_dir(model, tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------ bench_eval


def test_eval_sides_give_identical_replies_and_a_difference_is_named(model, tokenizer):
    plan = plan_dialogues(load_eval_constraints(), load_eval_turns(), dialogues=3, turns=4, seed=0)
    config = RolloutConfig(max_new_tokens=6, batch_size=3)
    ours = rollout(model, tokenizer, plan, config, progress=False)
    theirs = reference_rollout(model, tokenizer, plan, config, progress=False)
    assert bench_eval.check_identical(ours, theirs) == 1.0
    assert sum(len(t["turns"]) for t in ours) == 12

    changed = [dict(t, turns=[dict(turn) for turn in t["turns"]]) for t in theirs]
    changed[1]["turns"][2]["reply"] += " (changed)"
    with pytest.raises(AssertionError, match=rf"91\.7% identical\); first: dialogue {plan[1].id}, turn 3: "):
        bench_eval.check_identical(ours, changed)


def test_batched_generate_row_runs_the_baselines_it_is_given(model, tokenizer):
    """bench_smollm2's full size runs the carried cache alone: the row then names it the best and only baseline."""
    plan = plan_dialogues(load_eval_constraints(), load_eval_turns(), dialogues=3, turns=3, seed=0)
    config = RolloutConfig(max_new_tokens=5, batch_size=3)
    row = bench_common.rollout_vs_batched_generate(
        model, bench_eval.hugging_face_llama(model), tokenizer, plan, config, goal=2.5, settings={}, caches=("carry",)
    )
    assert set(row["turns_per_s"]) == {"ours", "ours_probe_off", "generate_carry"}
    assert row["best_baseline"] == "generate_carry" and set(row["ratios"]) == {"generate_carry"}
    assert row["identical_replies"] == {"ours_probe_off": 1.0, "generate_carry": 1.0}
    assert "(the fastest of carry)" in row["settings"]["theirs"]


def test_crossover_times_the_engine_against_generate_and_names_autos_choice(model, tokenizer, monkeypatch):
    """bench_crossover: the engine side runs the engine (no generate_rollout inside `rollout`), both generate() sides
    write its replies, the ratio is their medians', and auto's choice at the size is the library's."""
    routed = []
    monkeypatch.setattr(gatt.eval.rollout, "generate_rollout", lambda *a, **k: routed.append(a) or [])
    plan = plan_dialogues(load_eval_constraints(), load_eval_turns(), dialogues=3, turns=3, seed=0)
    llama = bench_eval.hugging_face_llama(model)
    row = bench_crossover.measure(
        model, llama, tokenizer, plan, RolloutConfig(max_new_tokens=5, batch_size=3), repeats=3
    )
    assert routed == []
    assert row["dialogue_turns"] == 9 and row["auto_chooses"] == "generate"
    assert row["identical_replies"] == {"generate_hugging_face": 1.0, "generate_model": 1.0}
    assert all(len(runs) == 3 for runs in row["runs"].values())
    faster = row["faster_generate"]
    assert row["seconds"][faster] == min(row["seconds"]["generate_hugging_face"], row["seconds"]["generate_model"])
    assert row["ratio"] == pytest.approx(row["seconds"][faster] / row["seconds"]["engine"], rel=0.01)
    assert bench_crossover.parse_sizes("8x8,32x2") == [(8, 8), (32, 2)]
    for bad in ("8x", "8x8x2", "0x4", "eight"):
        with pytest.raises(argparse.ArgumentTypeError, match="--sizes expects"):
            bench_crossover.parse_sizes(bad)


def test_eval_run_returns_one_comparison_with_identical_replies(monkeypatch):
    size = {"dialogues": 4, "turns": 2, "max_new_tokens": 4, "batch_size": 2, "repeats": 2}
    monkeypatch.setattr(bench_eval, "QUICK", size)
    results = bench_eval.run(quick=True, device="cpu")
    batched = results["rollout_vs_hf_generate_batched"]  # every dialogue in one generate() per turn
    assert batched["identical_replies"] == {"ours_probe_off": 1.0, "generate_none": 1.0, "generate_carry": 1.0}
    assert batched["settings"]["dialogues_per_batch"] == 4 and batched["turns"] == 8 and batched["goal"] == 2.5
    assert batched["ratio"] == pytest.approx(
        batched["turns_per_s"]["ours"]
        / max(batched["turns_per_s"][name] for name in ("generate_none", "generate_carry")),
        rel=1e-2,
    )
    result = results["rollout_vs_hf_generate"]
    assert result["identical_replies"] == 1.0 and result["unit"] == "turns/s" and result["goal"] == 3.0
    assert result["turns_per_round"] == [4, 4]  # a round: one batch of 2 dialogues x 2 turns, each side
    assert len(result["seconds"]["ours"]) == len(result["seconds"]["theirs"]) == 2
    assert result["ratio"] == pytest.approx(result["ours"] / result["theirs"], rel=1e-3)
    assert {
        k: result["settings"][k] for k in ("dialogues", "turns", "max_new_tokens", "dialogues_per_batch", "repeats")
    } == {"dialogues": 4, "turns": 2, "max_new_tokens": 4, "dialogues_per_batch": 2, "repeats": 2}


# ------------------------------------------------------------------------------------------ bench_teacher


def wants_to_stop(teacher: ModelTeacher) -> None:
    """Make the teacher's model put nearly all its mass on the end-of-turn tokens: replies would end at once."""
    stops = sorted(gatt.model.generation.stop_token_ids(teacher.model, teacher.tokenizer))

    def hook(module, args, output):
        output.logits[..., stops] = 1e4
        return output

    teacher.model.register_forward_hook(hook)


def test_teacher_and_generate_give_k_candidates_of_exactly_m_tokens(teacher_dir, monkeypatch):
    k, m = 3, 5
    teacher = ModelTeacher(teacher_dir, max_new_tokens=m, device="cpu", **bench_teacher.SAMPLING)
    wants_to_stop(teacher)
    dialogues = bench_teacher.draw(SynthesisConfig(num_dialogues=3, min_turns=2, max_turns=2, samples_per_turn=k))

    # Without the benchmark's switch, our teacher's replies end at the end-of-turn token: one token each.
    generated: list[dict] = []
    original = ChatBatch.generate
    monkeypatch.setattr(
        ChatBatch, "generate", lambda self, *a, **kw: generated.append(original(self, *a, **kw)) or generated[-1]
    )
    bench_teacher.batched_turn(teacher, dialogues, k)
    assert [len(c.tokens) for out in generated for cs in out.values() for c in cs] == [1] * 3 * k

    with bench_teacher.no_end_of_turn():
        generated.clear()
        teacher.seed(0)
        ours = bench_teacher.draw(SynthesisConfig(num_dialogues=3, min_turns=2, max_turns=2, samples_per_turn=k))
        for _ in range(2):
            bench_teacher.batched_turn(teacher, ours, k)
        theirs = [bench_teacher.generate_candidates(teacher, d.request().messages, k) for d in dialogues]
    assert gatt.model.generation.stop_token_ids is not None and gatt.model.generation.stop_token_ids(
        teacher.model, teacher.tokenizer
    )
    assert len(generated) == 2 and all(len(out) == 3 for out in generated)  # one batched call per turn, 3 dialogues
    assert [[len(c.tokens) for c in cs] for out in generated for cs in out.values()] == [[m] * k] * 6
    assert [[len(c) for c in cs] for cs in theirs] == [[m] * k] * 3
    assert all(len(d.replies) == 2 for d in ours)


def test_teacher_sides_synthesise_every_turn(teacher_dir):
    config = SynthesisConfig(num_dialogues=2, min_turns=3, max_turns=3, samples_per_turn=2)
    teacher = ModelTeacher(teacher_dir, max_new_tokens=4, device="cpu", **bench_teacher.SAMPLING)
    with bench_teacher.no_end_of_turn():
        for turn in (
            bench_teacher.batched_turn,
            bench_teacher.generate_turn,
            bench_teacher.batched_generate_turn,
            bench_teacher.CarriedGenerateTurn(),
        ):
            seconds, _, dialogues = bench_teacher.synthesis(teacher, turn, config)
            assert seconds > 0 and [len(d.replies) for d in dialogues] == [3, 3]
            assert all(isinstance(r, str) for d in dialogues for r in d.replies)


def test_carried_cache_turn_writes_what_re_encoding_each_history_writes(teacher_dir):
    """The batched baseline that carries its KV cache from turn to turn feeds generate() exactly the re-encoded
    histories: from the same seed it samples the replies that re-encoding every history samples, over 3 turns of 3
    dialogues (prompts of different lengths, replies re-tokenised when rendered), on Hugging Face's Llama as in the
    benchmark, and its cache holds the kept candidate's keys."""
    config = SynthesisConfig(num_dialogues=3, min_turns=3, max_turns=3, samples_per_turn=2)
    teacher = ModelTeacher(teacher_dir, max_new_tokens=5, device="cpu")
    teacher.model = bench_eval.hugging_face_llama(teacher.model)
    replies = {}
    carried = bench_teacher.CarriedGenerateTurn()
    with bench_teacher.no_end_of_turn():
        for name, turn in (("re-encoded", bench_teacher.batched_generate_turn), ("carried", carried)):
            replies[name] = [d.replies for d in bench_teacher.synthesis(teacher, turn, config)[2]]
    assert replies["carried"] == replies["re-encoded"]  # the same seed: the same draws from the same logits
    assert [len(r) for r in replies["carried"]] == [3, 3, 3] and len({r[0] for r in replies["carried"]}) > 1
    # the cache carried on holds the kept (first) candidate's keys: those of encoding the batch's real tokens afresh
    # (all but the last drawn token, which generate() never feeds)
    tokens, mask = carried.sequences[:, :-1], carried.mask[:, :-1]  # (B, L - 1)
    with torch.no_grad():
        fresh = teacher.model(
            input_ids=tokens, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True
        ).past_key_values
    real = mask.bool()[:, None, :, None].expand_as(fresh.layers[0].keys)  # (B, H_kv, L - 1, D)
    for ours, theirs in zip(carried.cache.layers, fresh.layers):
        torch.testing.assert_close(ours.keys[real], theirs.keys[real], rtol=1e-4, atol=1e-5)


def test_teacher_run_returns_the_cpu_comparison(monkeypatch):
    monkeypatch.setattr(bench_teacher, "QUICK", {"dialogues": 2, "turns": 2, "k": 2, "max_new_tokens": 4, "repeats": 1})
    results = bench_teacher.run(quick=True, device="cpu")
    # teacher_batched_vs_single: on a GPU only
    assert list(results) == ["teacher_vs_hf_generate", "teacher_vs_hf_generate_batched"]
    batched = results["teacher_vs_hf_generate_batched"]
    assert batched["goal"] == 2.5 and batched["settings"]["theirs"].startswith("LlamaForCausalLM (sdpa")
    assert batched["ratio"] == pytest.approx(batched["ours"] / batched["theirs"], rel=1e-3)
    result = results["teacher_vs_hf_generate"]
    assert result["unit"] == "turns/s" and result["goal"] == 4.0 and len(result["seconds"]["theirs"]) == 1
    assert {k: result["settings"][k] for k in ("dialogues", "turns", "k", "max_new_tokens", "repeats")} == {
        "dialogues": 2,
        "turns": 2,
        "k": 2,
        "max_new_tokens": 4,
        "repeats": 1,
    }
    assert gatt.model.generation.stop_token_ids.__name__ == "stop_token_ids"  # the switch is undone


def test_teacher_batched_vs_single_compares_the_same_synthesis(teacher_dir):
    """The GPU-only comparison's sides (our teacher batched across dialogues vs one dialogue per call), here on CPU."""
    config = SynthesisConfig(num_dialogues=3, min_turns=2, max_turns=2, samples_per_turn=2)
    teachers = {name: ModelTeacher(teacher_dir, max_new_tokens=3, device="cpu") for name in ("batched", "single")}
    with bench_teacher.no_end_of_turn():
        rate, seconds, _ = bench_teacher.compare(
            teachers,
            {"batched": bench_teacher.batched_turn, "single": bench_teacher.sequential_turn},
            config,
            repeats=2,
        )
    assert set(rate) == {"batched", "single"} and all(r > 0 for r in rate.values())
    assert [len(s) for s in seconds.values()] == [2, 2]
    assert teachers["batched"].batch_size == 3 and teachers["single"].batch_size == 1
