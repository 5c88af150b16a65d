"""benchmarks/profile_stages.py: py-spy's raw samples become each stage's shares by what it was doing."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from profile_stages import markdown, profile, stage_of  # noqa: E402

DEMO = 'process 10:"python recipes/demo.py --config x.yaml";'
EVAL = 'process 12:"python -m gatt.evaluate --model a=b\n--turns 20";'  # a command line may hold newlines
RAW = (
    f"{DEMO}main (recipes/demo.py:200) 5\n"
    f"{DEMO}{EVAL}main (gatt/evaluate.py:9);ChatBatch._decode (gatt/generation.py:290);forward (torch/nn/modules/linear.py:1) 30\n"
    f"{DEMO}{EVAL}main (gatt/evaluate.py:9);ChatBatch._decode (gatt/generation.py:290);marked_shares (gatt/generation.py:310) 4\n"
    f"{DEMO}{EVAL}ChatBatch._decode (gatt/generation.py:290);forward (gatt/attention/module.py:158);"
    f"_explicit_attention (gatt/attention/core.py:113) 6\n"
    f"{DEMO}{EVAL}judge (gatt/eval/judge.py:1);RelevanceScorer._score (gatt/gate.py:172);forward (x.py:1) 8\n"
    f"{DEMO}{EVAL}<module> (gatt/evaluate.py:1);_find_and_load (<frozen importlib._bootstrap>:1176) 2\n"
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


def test_a_later_rounds_stages_are_named_as_the_demo_names_them() -> None:
    data = 'process 3:"python -m data_gen gatt --teacher runs/demo/round-1/gatt/final --round {r} --out runs/demo/round-{r}/data/gatt";'
    model = (
        'process 4:"python recipes/train_gatt.py --config recipes/configs/gatt_tiny.yaml '
        'train_file=[\\"runs/demo/round-1/data/gatt/gatt.jsonl\\"] output_dir=runs/demo/round-{r}/gatt --resume";'
    )
    assert [stage_of(f"{DEMO}{data.format(r=r)}f (x.py:1)") for r in (1, 2, 12)] == [
        "gatt-data",
        "gatt-data-2",
        "gatt-data-12",
    ]
    assert [stage_of(f"{DEMO}{model.format(r=r)}f (x.py:1)") for r in (1, 3)] == ["gatt-model", "gatt-model-3"]
    assert stage_of(f"{DEMO}{EVAL}f (x.py:1)") == "report"


def test_text_that_is_not_a_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples found"):
        profile("not py-spy output", rate=5)
