"""benchmarks/profile_stages.py: py-spy's raw samples become each stage's shares by what it was doing."""

import pytest
from profile_stages import markdown, profile, stage_of  # noqa: E402

DEMO = 'process 10:"python recipes/demo.py --config x.yaml";'
EVAL = 'process 12:"python -m gatt.eval.evaluate\n--config runs/demo/configs/report.yaml";'  # a command line may hold newlines
RAW = (
    f"{DEMO}main (recipes/demo.py:200) 5\n"
    f"{DEMO}{EVAL}main (gatt/eval/evaluate.py:9);ChatBatch._decode (gatt/model/generation.py:290);forward (torch/nn/modules/linear.py:1) 30\n"
    f"{DEMO}{EVAL}main (gatt/eval/evaluate.py:9);ChatBatch._decode (gatt/model/generation.py:290);marked_shares (gatt/model/generation.py:310) 4\n"
    f"{DEMO}{EVAL}ChatBatch._decode (gatt/model/generation.py:290);forward (gatt/model/attention/module.py:158);"
    f"_explicit_attention (gatt/model/attention/core.py:113) 6\n"
    f"{DEMO}{EVAL}judge (gatt/eval/judge.py:1);RelevanceScorer._score (gatt/eval/gate.py:172);forward (x.py:1) 8\n"
    f"{DEMO}{EVAL}<module> (gatt/eval/evaluate.py:1);_find_and_load (<frozen importlib._bootstrap>:1176) 2\n"
)


def test_samples_go_to_their_stage_and_first_matching_category() -> None:
    result = profile(RAW, rate=5)
    assert result["stages"]["demo.py itself"] == {"sampled_seconds": 1, "share": {"other Python": 1.0}}
    report = result["stages"]["report"]
    assert report["sampled_seconds"] == 10  # 50 samples at 5 Hz
    assert report["share"] == {
        "decode steps: the rest (linear layers, norms, LM head)": 0.6,
        "relevance scorer (its forward passes)": 0.16,
        "decode steps: attention over the KV cache": 0.12,
        "attention probe (shares of the marked keys)": 0.08,
        "imports and start-up": 0.04,
    }
    table = markdown(result, ["report"])
    assert "| decode steps: the rest (linear layers, norms, LM head) | 60% |" in table and "report (10 s)" in table


def test_a_process_is_named_by_the_stage_config_it_runs() -> None:
    data = 'process 3:"python -m data_gen gatt --config runs/demo/configs/gatt-data{s}.yaml";'
    model = (
        'process 4:"python -m accelerate.commands.launch --num_processes 1 recipes/train_gatt.py --resume '
        '--config runs/demo/configs/gatt-model{s}.yaml";'
    )
    rank = 'process 5:"recipes/train_gatt.py --resume --config runs/demo/configs/gatt-model{s}.yaml";'
    assert [stage_of(f"{DEMO}{data.format(s=s)}f (x.py:1)") for s in ("", "-2", "-12")] == [
        "gatt-data",
        "gatt-data-2",
        "gatt-data-12",
    ]
    assert [stage_of(f"{DEMO}{model.format(s=s)}{rank.format(s=s)}f (x.py:1)") for s in ("", "-3")] == [
        "gatt-model",
        "gatt-model-3",
    ]
    report = 'process 12:"python -m gatt.eval.evaluate --config runs/demo/configs/report.yaml";'
    assert stage_of(f"{DEMO}{report}f (x.py:1)") == "report"
    assert (
        stage_of(f'{DEMO}process 6:"python -m gatt.model.pretrained --out runs/s/base/final";f (x.py:1)')
        == "base-model"
    )
    assert stage_of(f"{DEMO}f (x.py:1)") == "demo.py itself"


def test_text_that_is_not_a_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples found"):
        profile("not py-spy output", rate=5)
