"""Synthesis in shards: each shard of dialogues is one file, written whole when finished, so an interrupted run
resumes at the first missing shard without duplicates or losses; the settings a folder was made with, kept beside its
shards (another setting is refused); the merge of the shards into NAME.jsonl and its summary."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gatt.eval.gate import REASONS
from gatt.io.files import write_text


def by_count(counts: Counter) -> dict[str, int]:
    """Rejection reasons, commonest first (ties by name, so the order is the same however the counts were summed).

    Args:
        counts: The count of each reason.

    Returns:
        The reasons counted at least once, with their counts.
    """
    return {reason: n for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if n > 0}


def load_demonstrations(
    path: Path, demonstrate: Callable[[], dict[str, list[dict[str, str]]]] | None
) -> dict[str, list[dict[str, str]]]:
    """The demonstrations kept at `path`, or `demonstrate()`'s, written there first.

    Args:
        path: The shard folder's demonstrations file (JSON).
        demonstrate: Makes the demonstrations when `path` does not exist yet; None: none can be made.

    Returns:
        The demonstrations: messages (role and content) by constraint name.

    Raises:
        ValueError: When `path` does not exist and `demonstrate` is None.
    """
    if path.exists():
        return json.loads(path.read_text())
    if demonstrate is None:
        raise ValueError("demonstration is on but no demonstrations were given (data_gen gatt --demonstration)")
    found = demonstrate()
    write_text(path, json.dumps(found, ensure_ascii=False, indent=2))
    return found


def shard_path(shard_dir: Path, shard: int) -> Path:
    """The file of shard number `shard`: `shard-NNNNN.jsonl` in `shard_dir`.

    Args:
        shard_dir: The folder of the shards.
        shard: The shard's number.

    Returns:
        The shard's path (its stats beside it, with the suffix `.stats.json`).
    """
    return shard_dir / f"shard-{shard:05d}.jsonl"


def shard_tally(path: Path) -> Counter:
    """A finished shard's kept and dropped dialogues.

    Args:
        path: The shard's file, one dialogue entry a line.

    Returns:
        The counts under `kept` and `dropped`.
    """
    tally: Counter = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        tally["kept" if json.loads(line)["kept"] else "dropped"] += 1
    return tally


def check_settings(path: Path, settings: dict[str, Any]) -> None:
    """Refuse a shard folder made with other settings; a new folder records these.

    Args:
        path: The folder's settings file (`settings.json` beside the shards).
        settings: This run's settings, as JSON reads them back (tuples as lists); written to `path` when it does not
            exist.

    Raises:
        ValueError: When `path` holds other settings (use another --out or delete that folder).
    """
    if path.exists():
        previous = json.loads(path.read_text())
        if previous != settings:
            raise ValueError(
                f"{path.parent} holds shards made with other settings ({path}); use another --out or delete that folder"
            )
    else:
        write_text(path, json.dumps(settings, indent=2))


def merge(out_dir: Path, shard_dir: Path, num_shards: int, name: str, processes: int) -> None:
    """Concatenate the shards into NAME.jsonl (atomically) and summarise yield, lengths and who made what.

    Each kept dialogue gives its record and its value swaps; the summary (records, dialogues, rejections, yield and
    pass rate per family, turn lengths, dialogues made by each process) goes to NAME.summary.json.

    Args:
        out_dir: Where NAME.jsonl and NAME.summary.json are written.
        shard_dir: The folder of the shards and their `.stats.json` files.
        num_shards: How many shards the run has.
        name: NAME, the output files' stem.
        processes: How many processes made the shards (a shard from an earlier run keeps its maker's index).

    Raises:
        FileNotFoundError: When a shard is missing after every process finished (processes on several machines need
            --out on a filesystem they all write to).
    """
    entries, stats, per_rank = _read_shards(shard_dir, num_shards, processes)
    records = [record for e in entries if e["kept"] for record in (e["record"], *e.get("swaps", ()))]
    write_text(out_dir / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    lengths = [e["turns"] for e in entries if e["kept"]]
    attempted, kept = Counter(), Counter()
    for e in entries:
        for family in e["families"]:
            attempted[family] += 1
            kept[family] += e["kept"]
    reasons: dict[str, Counter] = {f: Counter() for f in attempted}
    for key, n in stats.items():
        if key.startswith("rejected:"):
            family, reason = key.removeprefix("rejected:").rsplit(":", 1)
            reasons.setdefault(family, Counter())[reason] += n
    summary = {
        "records": len(records),
        "dialogues": len(entries),
        "value_swaps": sum(len(e.get("swaps", ())) for e in entries),
        "processes": processes,
        "per_rank": per_rank,
        "dropped": sum(not e["kept"] for e in entries),
        "truncated": sum(e["kept"] and e["turns"] < e["planned"] for e in entries),
        "ended": dict(Counter(e["ended"] for e in entries)),
        "rejected_turns": stats["rejected_turns"],
        "redrawn_turns": stats["redrawn_turns"],
        "candidates": stats["candidates"],
        "rejected_candidates": stats["rejected_candidates"],
        # Candidates that passed the checks and failed the answer gate, and why (one may fail for several reasons).
        "gate_rejected_candidates": stats["gate_rejected_candidates"],
        "gate_failed": {reason: stats[f"gate_{reason}"] for reason in REASONS},
        "yield_per_family": {f: round(kept[f] / attempted[f], 4) for f in sorted(attempted)},
        # kept records per dialogue kind (gatt/data/events.py), as their kept turns make it (cut before a change: first)
        "kinds": dict(sorted(Counter(e.get("kind", "first") for e in entries if e["kept"]).items())),
        # Candidates that passed the checks and the gate, of all the teacher wrote in that family's dialogues.
        "pass_rate_per_family": {
            f: round(stats[f"passed:{f}"] / max(stats[f"candidates:{f}"], 1), 4) for f in sorted(attempted)
        },
        # Why the candidates of that family's dialogues were rejected, commonest first: the first check failed (its
        # type), "withdrawn", or each answer-gate reason of a reply that passed the checks.
        "rejection_reasons": {f: by_count(reasons[f]) for f in sorted(attempted)},
        "turns": {
            "min": min(lengths, default=0),
            "median": statistics.median(lengths) if lengths else 0,
            "max": max(lengths, default=0),
            "histogram": dict(sorted(Counter(lengths).items())),
        },
    }
    write_text(out_dir / f"{name}.summary.json", json.dumps(summary, indent=2))


def _read_shards(shard_dir: Path, num_shards: int, processes: int) -> tuple[list[dict[str, Any]], Counter, list[int]]:
    """Every shard's entries, their summed counts, and the dialogues each process made (`merge`'s Raises)."""
    stats: Counter = Counter()
    entries = []
    per_rank = [0] * processes  # dialogues made by each process (a shard from an earlier run keeps its maker)
    for shard in range(num_shards):
        path = shard_path(shard_dir, shard)
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing after every process finished: processes on several "
                "machines need --out on a filesystem they all write to"
            )
        made = json.loads(path.with_suffix(".stats.json").read_text())
        made = (
            made if "counts" in made else {"process": 0, "counts": made}
        )  # a shard written before processes were recorded
        stats.update(made["counts"])
        lines = path.read_text(encoding="utf-8").splitlines()
        per_rank += [0] * (made["process"] + 1 - len(per_rank))
        per_rank[made["process"]] += len(lines)
        entries += [json.loads(line) for line in lines]
    return entries, stats, per_rank
