"""Two reports of the same test dialogues, paired: `python -m gatt.eval.compare A B`, one model minus another.

`python -m gatt.eval.compare runs/variant/report runs/demo/report --ranges 2-10 11-20 21-30 --out compare.json`

Both reports must have rolled out the same dialogues (the same `gatt.eval.evaluate` plan: seed, dialogues, turns). Per
stratum (trained values, held-out values, held-out families), each model's adherence at a few turns, and for each
range of turns the paired difference: per dialogue, A's mean adherence over the range minus B's, averaged over
the dialogues, with a 95% percentile bootstrap interval over dialogues. A range averages turns within a dialogue
first, so one dialogue weighs the same whatever its length, and the interval is over the dialogues, which is where
the variation is (one dialogue's turns pass or fail together). This is how docs/main-job.md compares fine-tunes.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gatt.eval.scoring import STRATA_INSTRUCTED, Transcript, adherence_per_turn
from gatt.io.cli import exit_on_bad_input
from gatt.io.files import write_json

TURNS = (2, 4, 6, 10, 20, 30)  # the turns the tables of docs/main-job.md show
RANGES = ((2, 10), (11, 20), (21, 30))
RESAMPLES = 4000


def read_transcripts(path: str | Path, model: str) -> dict[str, Transcript]:
    """`model`'s transcripts by dialogue id, from a report folder (its transcripts.jsonl) or a transcripts file.

    Args:
        path: A report folder (gatt.eval.evaluate --out), read as its transcripts.jsonl, or a transcripts file.
        model: The model whose transcripts are kept (a transcript's "model" field).

    Returns:
        The model's transcripts, by dialogue id.

    Raises:
        ValueError: When there is no transcripts file, a line is not a transcript, or no transcript is `model`'s.
    """
    file = Path(path)
    file = file / "transcripts.jsonl" if file.is_dir() else file
    if not file.is_file():
        raise ValueError(
            f"{path}: no transcripts.jsonl (give a gatt.eval.evaluate --out folder or its transcripts.jsonl)"
        )
    found: dict[str, Transcript] = {}
    models: set[str] = set()
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                transcript = json.loads(line)
                models.add(transcript["model"])
                if transcript["model"] == model:
                    found[transcript["id"]] = transcript
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise ValueError(f"{file}, line {number}: not a transcript ({error})") from None
    if not found:
        raise ValueError(f"{file}: no transcript of model {model!r} (it holds {', '.join(sorted(models)) or 'none'})")
    return found


def parse_range(text: str, flag: str = "--ranges") -> tuple[int, int]:
    """FIRST-LAST (or one turn) -> (first, last).

    Args:
        text: The range, "FIRST-LAST", or one turn "N" (first = last = N).
        flag: The option that gave it, named in the error (default "--ranges").

    Returns:
        The first and last turns.

    Raises:
        ValueError: When `text` is not one or two integers, or does not run from turn 1 or later to a turn no
            earlier than its first.
    """
    first, sep, last = text.partition("-")
    try:
        bounds = (int(first), int(last if sep else first))
    except ValueError:
        raise ValueError(f"{flag} takes FIRST-LAST turn ranges such as 11-20, got {text!r}") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise ValueError(f"{flag}: {text!r} must run from turn 1 or later to a turn no earlier than its first")
    return bounds


def mean_adherence(transcript: Transcript, first: int, last: int) -> float | None:
    """The share of the dialogue's scored turns in [first, last] that passed.

    Args:
        transcript: One dialogue's transcript.
        first: The range's first turn.
        last: The range's last turn (included).

    Returns:
        The share of the scored turns (those whose "passed" is not None) that passed; None: no scored turn there.
    """
    scored = [bool(t["passed"]) for t in transcript["turns"] if first <= t["turn"] <= last and t["passed"] is not None]
    return sum(scored) / len(scored) if scored else None


def paired_range(
    a: dict[str, Transcript], b: dict[str, Transcript], ids: Sequence[str], first: int, last: int, seed: int = 0
) -> dict[str, Any] | None:
    """A minus B over turns [first, last] of the dialogues `ids`.

    Per dialogue, A's `mean_adherence` over the range minus B's, for the dialogues with a scored turn in the range
    under both; the interval comes from RESAMPLES bootstrap resamples of those differences.

    Args:
        a: A's transcripts by dialogue id.
        b: B's transcripts by dialogue id.
        ids: The dialogues compared (ids of both).
        first: The range's first turn.
        last: The range's last turn (included).
        seed: The bootstrap's seed (default 0).

    Returns:
        {"difference": mean of the per-dialogue differences, "n": number of dialogues, "ci95": [low, high], a 95%
        percentile bootstrap interval}, rounded to 6 places; None: no dialogue has a scored turn in the range under
        both.
    """
    differences = []
    for i in ids:
        mean_a, mean_b = mean_adherence(a[i], first, last), mean_adherence(b[i], first, last)
        if mean_a is not None and mean_b is not None:
            differences.append(mean_a - mean_b)
    if not differences:
        return None
    n, rng = len(differences), random.Random(seed)
    means = sorted(sum(rng.choices(differences, k=n)) / n for _ in range(RESAMPLES))
    low, high = means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]
    return {"difference": round(sum(differences) / n, 6), "n": n, "ci95": [round(low, 6), round(high, 6)]}


def compare(
    a: dict[str, Transcript], b: dict[str, Transcript], ranges: Sequence[tuple[int, int]] = RANGES, seed: int = 0
) -> dict[str, Any]:
    """Per stratum: n, each side's adherence at TURNS and A - B over each range of `ranges`.

    Args:
        a: A's transcripts by dialogue id.
        b: B's transcripts by dialogue id, of the same dialogues.
        ranges: The (first, last) turn ranges of the paired differences (default RANGES: 2-10, 11-20, 21-30).
        seed: The bootstrap's seed (default 0).

    Returns:
        By stratum of STRATA_INSTRUCTED that has dialogues (the strata A's transcripts give): {"n": dialogues,
        "per_turn": {turn: [A's adherence, B's]} for the turns of TURNS both sides scored, "paired":
        {"FIRST-LAST": `paired_range`'s result}}.

    Raises:
        ValueError: When the two sides rolled out different dialogues (ids in one only).
    """
    missing = sorted(set(a) ^ set(b))
    if missing:
        raise ValueError(
            f"the two reports rolled out different dialogues ({len(missing)} ids in one only, e.g. {missing[0]}): "
            "compare reports made with the same gatt.eval.evaluate plan (seed, dialogues, turns)"
        )
    out: dict[str, Any] = {}
    for stratum in STRATA_INSTRUCTED:
        ids = sorted(i for i, t in a.items() if t["stratum"] == stratum)
        if not ids:
            continue
        per_turn = [adherence_per_turn([side[i] for i in ids], (stratum,)) for side in (a, b)]
        out[stratum] = {
            "n": len(ids),
            "per_turn": {
                str(turn): [side[str(turn)]["adherence"] for side in per_turn]
                for turn in TURNS
                if all(str(turn) in side for side in per_turn)
            },
            "paired": {f"{first}-{last}": paired_range(a, b, ids, first, last, seed) for first, last in ranges},
        }
    return out


def family_attention(transcripts: Iterable[Transcript], first: int, last: int) -> dict[str, dict[str, Any]]:
    """Attention on the instruction and adherence per family of the held-out-family stratum, over turns [first, last].

    Args:
        transcripts: One side's transcripts.
        first: The range's first turn.
        last: The range's last turn (included).

    Returns:
        By family, sorted: "attention_max_head", the mean over replies of the most attentive (layer, head)'s share
        of attention on the instruction (`attention_per_head`; None without the attention probe); "adherence", the
        share of scored replies that passed (None without one); and "n", the number of scored replies.
    """
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in transcripts:
        if t["stratum"] == "heldout_family" and t["constraint"]:
            by_family[t["constraint"]["family"]] += [x for x in t["turns"] if first <= x["turn"] <= last]
    out = {}
    for family, turns in sorted(by_family.items()):
        heads = [x["attention_per_head"] for x in turns if x.get("attention_per_head")]
        scored = [bool(x["passed"]) for x in turns if x["passed"] is not None]
        out[family] = {
            "attention_max_head": round(sum(max(map(max, h)) for h in heads) / len(heads), 6) if heads else None,
            "adherence": round(sum(scored) / len(scored), 6) if scored else None,
            "n": len(scored),
        }
    return out


def markdown(result: dict[str, Any], names: tuple[str, str]) -> str:
    """The comparison as one table: a row per stratum.

    Args:
        result: `compare`'s result.
        names: The two sides' names in the column headers.

    Returns:
        A Markdown table: per stratum, both sides' adherence at each turn of TURNS and A - B with its 95% interval
        over each range, in percent.
    """
    ranges = next(iter(result.values()))["paired"] if result else {}
    header = ["stratum (n)", *(f"turn {t}: {names[0]} / {names[1]}" for t in TURNS)]
    header += [f"turns {r}: {names[0]} - {names[1]}" for r in ranges]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for stratum, s in result.items():
        cells = [f"{stratum} ({s['n']})"]
        cells += [
            " / ".join(f"{100 * x:.1f}%" for x in s["per_turn"][str(t)]) if str(t) in s["per_turn"] else ""
            for t in TURNS
        ]
        for d in s["paired"].values():
            cells.append(
                ""
                if d is None
                else f"{100 * d['difference']:+.1f} [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}]"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def families_markdown(families: dict[str, Any]) -> str:
    """`family_attention` of both sides as one table: a row per held-out family.

    Args:
        families: {"turns": "FIRST-LAST", "a": A's `family_attention`, "b": B's}, as `main` records it.

    Returns:
        A Markdown table: per family of A, the most attentive head's share of attention and the adherence, A / B.
    """

    def pair(key: str, family: str, form: str) -> str:
        values = [families[side].get(family, {}).get(key) for side in ("a", "b")]
        return " / ".join("" if v is None else form.format(v) for v in values)

    lines = [
        f"| held-out family (turns {families['turns']}) | attention, max head: A / B | adherence: A / B |",
        "|---|---|---|",
    ]
    for family in families["a"]:
        lines.append(
            f"| {family} | {pair('attention_max_head', family, '{:.3f}')} | {pair('adherence', family, '{:.1%}')} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m gatt.eval.compare`.

    Returns:
        The argument parser; its description is the module docstring.
    """
    parser = argparse.ArgumentParser(
        prog="python -m gatt.eval.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("a", help="report folder (gatt.eval.evaluate --out) or transcripts.jsonl of the model compared")
    parser.add_argument("b", help="report folder or transcripts.jsonl of the model it is compared against")
    parser.add_argument("--model-a", default="gatt", help="the model's column in A (default: gatt)")
    parser.add_argument("--model-b", default="gatt", help="the model's column in B (default: gatt)")
    parser.add_argument(
        "--ranges",
        nargs="+",
        default=[f"{f}-{last}" for f, last in RANGES],
        help="turn ranges FIRST-LAST (default: 2-10 11-20 21-30)",
    )
    parser.add_argument(
        "--families",
        metavar="FIRST-LAST",
        help="also per held-out family over these turns: the most attentive head's share on the instruction, adherence",
    )
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    parser.add_argument("--out", help="also write the comparison as JSON to this file")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the comparison (and write it with --out).

    Bad input (a missing report, a bad range, different dialogues) exits with one `error: ...` line
    (`gatt.io.cli.exit_on_bad_input`).

    Args:
        argv: The command-line arguments (default None: sys.argv[1:]).

    Returns:
        What --out writes: {"a": "A MODEL_A", "b": "B MODEL_B", "strata": `compare`'s result}, and with --families
        "families": {"turns": "FIRST-LAST", "a": A's `family_attention`, "b": B's}.
    """
    args = build_parser().parse_args(argv)
    with exit_on_bad_input():
        ranges = [parse_range(r) for r in args.ranges]
        a, b = read_transcripts(args.a, args.model_a), read_transcripts(args.b, args.model_b)
        result: dict[str, Any] = {
            "a": f"{args.a} {args.model_a}",
            "b": f"{args.b} {args.model_b}",
            "strata": compare(a, b, ranges, args.seed),
        }
        if args.families:
            first, last = parse_range(args.families, "--families")
            result["families"] = {
                "turns": f"{first}-{last}",
                **{side: family_attention(t.values(), first, last) for side, t in (("a", a), ("b", b))},
            }
    print(markdown(result["strata"], ("A", "B")))
    if "families" in result:
        print("\n" + families_markdown(result["families"]))
    if args.out:
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
