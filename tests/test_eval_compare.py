"""Tests for gatt.eval.compare: two reports of the same dialogues, paired over ranges of turns."""

import json
import random
from pathlib import Path
from typing import Any

import pytest

from gatt.eval.compare import (
    compare,
    family_attention,
    main,
    mean_adherence,
    paired_range,
    parse_range,
    read_transcripts,
)
from tests.test_eval_scoring import dialogue

T, F = True, False


def write(path: Path, transcripts: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "transcripts.jsonl").write_text("".join(json.dumps(t) + "\n" for t in transcripts))
    return path


def test_mean_adherence_reads_scored_turns_of_the_range_only() -> None:
    d = dialogue("d", "train", "hobby", [T, F, None, T, T])
    assert mean_adherence(d, 1, 2) == 0.5
    assert mean_adherence(d, 2, 4) == 0.5  # turn 3 unscored
    assert mean_adherence(d, 3, 3) is None
    assert mean_adherence(d, 6, 9) is None


def test_paired_range_is_the_mean_of_per_dialogue_differences() -> None:
    # A passes turns 1-4 of every dialogue; B passes half of them in d1 and none in d2: differences 0.5 and 1.0
    a = {i: dialogue(i, "train", "hobby", [T, T, T, T]) for i in ("d1", "d2")}
    b = {"d1": dialogue("d1", "train", "hobby", [T, F, T, F]), "d2": dialogue("d2", "train", "hobby", [F, F, F, F])}
    result = paired_range(a, b, ["d1", "d2"], 1, 4)
    assert result is not None
    assert result["difference"] == 0.75 and result["n"] == 2
    assert result["ci95"] == [0.5, 1.0]  # a resample of two dialogues: both 0.5, mixed (0.75) or both 1.0
    assert paired_range(a, b, ["d1", "d2"], 5, 9) is None  # no turn there


def test_paired_range_interval_against_a_direct_bootstrap() -> None:
    rng = random.Random(1)
    a, b, differences = {}, {}, []
    for i in range(40):
        pa, pb = [rng.random() < 0.7 for _ in range(10)], [rng.random() < 0.5 for _ in range(10)]
        a[f"d{i}"], b[f"d{i}"] = dialogue(f"d{i}", "train", "x", pa), dialogue(f"d{i}", "train", "x", pb)
        differences.append((sum(pa) - sum(pb)) / 10)
    result = paired_range(a, b, sorted(a), 1, 10)
    assert result is not None
    mean = sum(differences) / 40
    assert result["difference"] == pytest.approx(mean, abs=1e-6)
    sd = (sum((d - mean) ** 2 for d in differences) / 39) ** 0.5
    low, high = result["ci95"]
    # a percentile bootstrap of a mean is near the normal interval at n = 40
    assert low == pytest.approx(mean - 1.96 * sd / 40**0.5, abs=0.03)
    assert high == pytest.approx(mean + 1.96 * sd / 40**0.5, abs=0.03)


def test_compare_per_stratum_and_refuses_other_dialogues() -> None:
    a = {
        "t1": dialogue("t1", "train", "hobby", [T] * 20),
        "h1": dialogue("h1", "heldout_family", "tone", [T] * 10 + [F] * 10),
        "n1": dialogue("n1", "none", None, [None] * 20),
    }
    b = {
        "t1": dialogue("t1", "train", "hobby", [T] * 10 + [F] * 10),
        "h1": dialogue("h1", "heldout_family", "tone", [F] * 20),
        "n1": dialogue("n1", "none", None, [None] * 20),
    }
    result = compare(a, b, [(2, 10), (11, 20)])
    assert set(result) == {"train", "heldout_family"}  # no stratum without instructions, none not rolled out
    assert result["train"]["per_turn"]["10"] == [1.0, 1.0] and result["train"]["per_turn"]["20"] == [1.0, 0.0]
    assert "30" not in result["train"]["per_turn"]
    assert result["train"]["paired"]["11-20"]["difference"] == 1.0
    assert result["heldout_family"]["paired"]["2-10"]["difference"] == 1.0
    assert result["heldout_family"]["paired"]["11-20"]["difference"] == 0.0
    with pytest.raises(ValueError, match="different dialogues"):
        compare(a, {k: v for k, v in b.items() if k != "h1"})


def test_cli_reads_report_folders_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path / "a", [dialogue("t1", "train", "hobby", [T] * 30, model="gatt")])
    b = write(
        tmp_path / "b",
        [dialogue("t1", "train", "hobby", [F] * 30, model="base"), dialogue("t1", "train", "hobby", [T] * 30)],
    )
    out = tmp_path / "c.json"
    result = main([str(a), str(b), "--model-b", "base", "--ranges", "2-10", "30", "--out", str(out)])
    assert result["strata"]["train"]["paired"]["2-10"]["difference"] == 1.0
    assert result["strata"]["train"]["paired"]["30-30"]["difference"] == 1.0
    assert json.loads(out.read_text()) == result and "families" not in result
    assert "| train (1) | 100.0% / 0.0% |" in capsys.readouterr().out


def test_family_attention_is_the_mean_of_each_replys_most_attentive_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # dialogue() gives each reply heads [[0.5a, 1.5a], [a, a]]: its most attentive head holds 1.5a
    tone = dialogue("h1", "heldout_family", "tone", [T, F, T, T], attention=[0.1, 0.2, None, 0.4])
    other = dialogue("h2", "heldout_family", "city", [F, F, F, F], attention=[0.2] * 4)
    trained = dialogue("t1", "train", "hobby", [T] * 4, attention=[0.9] * 4)
    got = family_attention([tone, other, trained], 2, 4)
    assert set(got) == {"tone", "city"}  # held-out families only
    assert got["tone"]["attention_max_head"] == pytest.approx(1.5 * (0.2 + 0.4) / 2)  # turn 3 has no probe
    assert got["tone"]["adherence"] == pytest.approx(2 / 3) and got["tone"]["n"] == 3
    assert got["city"] == {"attention_max_head": pytest.approx(0.3), "adherence": 0.0, "n": 3}
    folder = write(tmp_path / "r", [tone, other, trained])
    result = main([str(folder), str(folder), "--families", "2-4"])
    assert result["families"]["a"] == got and result["families"]["turns"] == "2-4"
    assert "| tone | 0.450 / 0.450 | 66.7% / 66.7% |" in capsys.readouterr().out


def test_bad_inputs_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no transcripts.jsonl"):
        read_transcripts(tmp_path, "gatt")
    write(tmp_path / "r", [dialogue("t1", "train", "hobby", [T], model="base")])
    with pytest.raises(ValueError, match="no transcript of model 'gatt' \\(it holds base\\)"):
        read_transcripts(tmp_path / "r", "gatt")
    (tmp_path / "bad.jsonl").write_text('{"model": "gatt"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl, line 1"):
        read_transcripts(tmp_path / "bad.jsonl", "gatt")
    for text in ("a-b", "0-3", "9-2"):
        with pytest.raises(ValueError, match="--ranges"):
            parse_range(text)
    with pytest.raises(ValueError, match="--families: '9-2'"):
        parse_range("9-2", "--families")
