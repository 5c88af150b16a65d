"""GAtt synthesis (the paper's steps 1-3): append the instruction to every user turn, sample each reply
from a teacher with it in view, keep a candidate that passes every check and the answer gate
(`gatt.eval.gate`: not empty, no loop, no repeat of an earlier reply, on the user's topic) - rejection
sampling that never keeps a degenerate reply. A built-in user turn is on topic when it names its topic
(the eval's on-topic check); a user's own message, when the teacher's likelihood contrast says so.
Probe turns (a constraint's attribute questions, e.g. a persona's) are judged by the probe's checks.

Dialogues advance in lockstep, one turn at a time, so the teacher answers a whole shard's turn in one
batched call. A turn with no passing candidate gets another user message (up to `redraws` times: a
teacher often fails on one topic, not on the instruction); after that it ends its dialogue there: the
dialogue is kept up to its last passing turn if that still reaches `min_turns`, else dropped; all are counted.

Work is written in shards (`<out>/gatt.shards/shard-NNNNN.jsonl`, renamed into place when complete),
so a killed run resumes on the same command without duplicates or losses; each dialogue's draws depend
only on (seed, its index), and the teacher is seeded per shard, so the output is the same however often
the run was interrupted. Under `torchrun` or `accelerate launch` the processes deal the shards round robin
(`gatt.io.distributed`); when every shard is written, process 0 merges them: the same bytes as one process.
With several machines, --out must be on a filesystem they share.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from data_gen.constraints import ConstraintSampler, instruction_text
from data_gen.shards import check_settings, load_demonstrations, merge, shard_path, shard_tally
from data_gen.teacher import Teacher, TurnRequest, gate_config, teacher_gate
from data_gen.toy_world import with_instruction
from data_gen.user_turns import TOPIC_KEYWORDS, UserTurn, on_topic_check
from data_gen.value_swaps import families, swapped
from gatt.data.check_types import Check
from gatt.data.checks import Constraint, passes_all, reply_checks
from gatt.data.events import (
    KINDS,
    SHORT_PROB,
    SHORT_PROB_HELP,
    Event,
    constraint_entry,
    dialogue_kind,
    draw_events,
    following_checks,
    in_force,
    kinds_help,
    withdrawn,
)
from gatt.eval.embedding import EMBEDDING_JUDGE
from gatt.eval.gate import (
    GateItem,
    GateTurn,
    gate_flags,
)
from gatt.io.config import REQUIRED, arg
from gatt.io.distributed import my_items, process_state
from gatt.io.files import write_text

# Why a candidate was rejected: the type of the first check it fails, WITHDRAWN where it follows an instruction
# withdrawn earlier in the dialogue, or the answer gate's REASONS (one candidate may fail several of those).
WITHDRAWN = "withdrawn"


def first_failed(reply: str, checks: Iterable[Check]) -> Check | None:
    """The first check the reply fails, or None where it passes every one.

    The checks are run as `passes_all` runs them, in order and none past the first failure, so asking why a
    reply failed runs nothing `passes_all` would not (a user's `python` check included).

    Args:
        reply: The reply to check.
        checks: The checks, in the order they are run.

    Returns:
        The first failing check, or None.
    """
    return next((check for check in checks if not check.passes(reply)), None)


@dataclass(frozen=True)
class SynthesisConfig(gate_flags(frozen=True)):
    """What decides the output: the same config, inputs and teacher give byte-identical records."""

    num_dialogues: int = arg(REQUIRED, "dialogues to generate")
    min_turns: int = arg(2, "shortest dialogue kept")
    max_turns: int = arg(24, "longest dialogue drawn")
    samples_per_turn: int = arg(4, "candidates per turn (k) for rejection")
    seed: int = arg(0, "same seed and inputs -> byte-identical output")
    short_prob: float = arg(SHORT_PROB, SHORT_PROB_HELP)
    probe_prob: float = 0.15
    shard_size: int = arg(64, "dialogues per resumable shard")
    redraws: int = arg(
        2, "other user messages tried at a turn whose k candidates all fail, before the dialogue ends there"
    )
    relevance_others: int = 3  # other questions a reply is contrasted with where the turn has no on-topic check
    strict_repeats: bool = arg(
        False,
        "reject a near copy of an earlier reply even where its topic word changed (the gate lets such template "
        "answers pass); a real model's teacher needs it, or the fine-tuned model learns to repeat itself",
    )
    demonstration: bool = arg(
        False,
        "open the teacher's prompt with one exchange of each constraint whose reply passed the checks and the gate "
        "in a separate draw (richer context distillation: the record keeps only the dialogue); kept in "
        "DIR/gatt.shards/demonstrations.json for a resumed run",
    )
    round: int = arg(
        1,
        "expert-iteration round, written into each record's meta; a round after the first draws other dialogues "
        "than round 1 from the same seed (recipes/demo.py `rounds`)",
        metavar="R",
    )
    value_swaps: int = arg(
        0,
        "copies of each kept dialogue with a constraint's value swapped for another of its family, where the swap is "
        "exact (data_gen/value_swaps.py): more values at no teacher cost, so GAtt learns to copy a value, not recall it",
        metavar="N",
    )
    kinds: tuple[str, ...] = arg(
        ("first",),
        kinds_help(
            "drawn alike",
            "The teacher sees the instructions in force appended to every user turn; a reply after a withdrawal "
            "must not follow the old instruction. Records carry `kind` and `events`; the wordings are "
            "gatt/data/events.yaml's or a constraint's own (`changes` in its entry)",
        ),
        nargs="+",
        choices=KINDS,
        metavar="KIND",
    )

    @property
    def draw_key(self) -> str:
        """What every random draw of a dialogue starts from: the seed, and the round after the first."""
        return f"gatt-{self.seed}" if self.round == 1 else f"gatt-{self.seed}-round-{self.round}"

    def __post_init__(self) -> None:
        if self.num_dialogues < 1:
            raise ValueError(f"num_dialogues must be >= 1, got {self.num_dialogues}")
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns} and {self.max_turns}")
        if self.samples_per_turn < 1:
            raise ValueError(f"samples_per_turn must be >= 1, got {self.samples_per_turn}")
        if self.redraws < 0:
            raise ValueError(f"redraws must be >= 0, got {self.redraws}")
        if self.value_swaps < 0:
            raise ValueError(f"value_swaps must be >= 0, got {self.value_swaps}")
        if self.round < 1:
            raise ValueError(f"round must be >= 1, got {self.round}")
        if not self.kinds or set(self.kinds) - set(KINDS):
            raise ValueError(f"kinds must be some of {', '.join(KINDS)}, got {list(self.kinds)}")


@dataclass
class _Dialogue:
    """One dialogue in flight."""

    index: int
    constraints: list[Constraint]  # every constraint the dialogue gives, in the order given
    use_short: bool
    turns: list[UserTurn]
    replies: list[str]
    events: list[Event] = field(default_factory=list)  # what each user turn gives, changes or withdraws
    ended: str | None = None  # None while running; "complete", "rejected" or "context_full"
    redrawn: int = 0  # user messages redrawn at the current turn
    demonstration: list[dict[str, str]] = field(default_factory=list)  # teacher context before the dialogue

    def __post_init__(self) -> None:
        if self.constraints and not self.events:  # given no events: its constraints, in turn one, kept (the paper)
            self.events = [
                Event(1, "give", tuple(self.constraints), instruction_text(self.constraints, self.use_short))
            ]

    @property
    def instruction(self) -> str:
        """Every instruction the dialogue gives, in its words (the gate exempts their runs from the template test)."""
        return " ".join(e.text for e in self.events)

    def in_force(self, turn: int) -> list[Constraint]:
        """The constraints in force at user turn `turn` (from 1)."""
        return in_force(self.events, turn)

    def request(self) -> TurnRequest:
        """The augmented history: the instructions in force at each user message appended to it (none before a late
        instruction, none of a withdrawn one), after the demonstration."""
        messages = list(self.demonstration)
        for number, (turn, reply) in enumerate(zip(self.turns, self.replies + [None]), start=1):
            state = self.in_force(number)
            text = with_instruction(turn.text, instruction_text(state, self.use_short)) if state else turn.text
            messages.append({"role": "user", "content": text})
            if reply is not None:
                messages.append({"role": "assistant", "content": reply})
        current = len(self.replies) + 1
        return TurnRequest(messages, self.turns[current - 1], self.in_force(current), key=str(self.index))

    def accepts(self, reply: str) -> bool:
        """Whether a candidate for the current turn passes the checks in force and follows no withdrawn instruction."""
        return self.refusal(reply) is None

    def refusal(self, reply: str) -> str | None:
        """Why a candidate for the current turn is refused before the gate, or None where it is not.

        Args:
            reply: The candidate.

        Returns:
            The type of the first check in force it fails ("language", "startswith", ...), "withdrawn" where it
            follows a withdrawn instruction, or None.
        """
        number = len(self.replies) + 1
        turn = self.turns[number - 1]
        failed = first_failed(reply, reply_checks(self.in_force(number), turn.text))
        if failed is not None:
            return failed.type
        question = turn.text if is_probe(self.constraints, turn) else None
        for old in withdrawn(self.events, number):
            shows = following_checks(old, question)
            if shows and passes_all(reply, shows):
                return WITHDRAWN
        return None


def is_probe(constraints: Sequence[Constraint], turn: UserTurn) -> bool:
    """Whether the turn asks one of the constraints' attribute questions.

    Args:
        constraints: The dialogue's constraints.
        turn: The user turn.

    Returns:
        True where the turn's text is one of the constraints' probe questions.
    """
    return any(probe.question == turn.text for c in constraints for probe in c.probes)


def gate_turn(constraints: Sequence[Constraint], turn: UserTurn, reply: str) -> GateTurn:
    """The turn as the answer gate sees it: a probe, or a chat message with its topic's on-topic check.

    Args:
        constraints: The dialogue's constraints (to tell a probe).
        turn: The user turn.
        reply: The reply to it.

    Returns:
        The gate's turn; on-topic checks only where the turn's topic is a built-in one (`TOPIC_KEYWORDS`).
    """
    on_topic = (on_topic_check(turn.topic),) if turn.topic in TOPIC_KEYWORDS else ()
    return GateTurn(turn.text, reply, "probe" if is_probe(constraints, turn) else "chat", on_topic)


def _key(turn: UserTurn) -> str:
    # A user's own messages have no topic: then it is the message itself that must not come back.
    return f"topic:{turn.topic}" if turn.topic is not None else f"text:{turn.text}"


def draw_dialogue(
    index: int, config: SynthesisConfig, sampler: ConstraintSampler | None, user_pool: Sequence[UserTurn]
) -> _Dialogue:
    """Constraints, instruction form and user turns of dialogue `index`, from (seed, index) alone.

    Args:
        index: The dialogue's index in the run.
        config: The synthesis config: its draw key, turn range, probe probability and kinds.
        sampler: Draws the dialogue's constraints and instruction form (None: a dialogue without instruction).
        user_pool: The user messages chat turns are drawn from.

    Returns:
        The dialogue in flight, with no replies yet.
    """
    rng = random.Random(f"{config.draw_key}-{index}")
    constraints, use_short = sampler.sample(rng) if sampler is not None else ([], False)
    num_turns = rng.randint(config.min_turns, config.max_turns)
    events: list[Event] = []
    if constraints:  # the kind and its events from a draw of their own: first-kind dialogues are as they always were
        events_rng = random.Random(f"{config.draw_key}-{index}-kind")
        kind = events_rng.choice(config.kinds)
        opening = instruction_text(constraints, use_short)
        assert sampler is not None
        events = draw_events(kind, constraints, opening, sampler.constraints, num_turns, events_rng, short=use_short)
        constraints = [c for e in events if e.action != "revoke" for c in e.constraints]
    probes = [p.question for c in constraints for p in c.probes]
    turns = []
    for _ in range(num_turns):
        if probes and rng.random() < config.probe_prob:
            turns.append(UserTurn(rng.choice(probes), None))
        else:
            turns.append(_chat_turn(rng, user_pool, avoid={_key(t) for t in turns}))
    return _Dialogue(index, constraints, use_short, turns, [], events)


def _chat_turn(rng: random.Random, user_pool: Sequence[UserTurn], avoid: set[str]) -> UserTurn:
    """A message on a topic the dialogue has not had yet (every answer then has something new to say), if any is left."""
    return rng.choice([t for t in user_pool if _key(t) not in avoid] or user_pool)


def redraw_turn(dialogue: _Dialogue, config: SynthesisConfig, user_pool: Sequence[UserTurn]) -> None:
    """Replace the current turn's user message by a chat message on another topic, from (seed, index, turn, try).

    Counts the try in `dialogue.redrawn`.

    Args:
        dialogue: The dialogue, changed in place.
        config: The synthesis config (its draw key).
        user_pool: The user messages to draw from.
    """
    turn = len(dialogue.replies)
    dialogue.redrawn += 1
    rng = random.Random(f"{config.draw_key}-{dialogue.index}-redraw-{turn}-{dialogue.redrawn}")
    failed = dialogue.turns[turn]
    others = [t for t in user_pool if t.text != failed.text and (t.topic is None or t.topic != failed.topic)]
    others = others or list(user_pool)
    dialogue.turns[turn] = _chat_turn(rng, others, avoid={_key(t) for t in dialogue.turns[:turn]})


def _gate_items(
    dialogue: _Dialogue, candidates: Sequence[str], config: SynthesisConfig, user_pool: Sequence[UserTurn]
) -> list[GateItem]:
    """One gate item per candidate of the dialogue's current turn, with its earlier turns and contrast questions."""
    turn = dialogue.turns[len(dialogue.replies)]
    earlier = tuple(gate_turn(dialogue.constraints, t, reply) for t, reply in zip(dialogue.turns, dialogue.replies))
    rng = random.Random(f"{config.draw_key}-{dialogue.index}-others-{len(dialogue.replies)}-{dialogue.redrawn}")
    pool = [t.text for t in user_pool if _key(t) != _key(turn)]
    others = tuple(rng.sample(pool, min(config.relevance_others, len(pool))))
    instruction = dialogue.instruction
    return [
        GateItem(gate_turn(dialogue.constraints, turn, candidate), earlier, others, instruction)
        for candidate in candidates
    ]


def synthesize_shard(
    dialogues: list[_Dialogue],
    teacher: Teacher,
    config: SynthesisConfig,
    user_pool: Sequence[UserTurn],
    stats: Counter,
    progress: tqdm | None = None,
    tally: Counter | None = None,
) -> None:
    """Run every dialogue of a shard to its end, one batched teacher call per turn.

    Args:
        dialogues: The shard's dialogues, run in place: replies appended, `ended` set.
        teacher: Samples the candidates; its scorer (and device) serve the answer gate.
        config: The synthesis config.
        user_pool: The user messages for redrawn turns and the gate's contrast questions.
        stats: Counts of candidates, rejections (per reason and family) and turns, updated in place.
        progress: A tqdm bar that advances by one for each dialogue as it ends; its postfix shows the turn, the
            dialogues still active, and the run's kept and dropped dialogues so far (default None: no bar).
        tally: The run's kept and dropped dialogues, shared across shards and updated in place (default None: a
            fresh count).
    """
    k = config.samples_per_turn
    gate = teacher_gate(gate_config(config.strict_repeats, config.strict_gate, config.relevance_judge), teacher)
    tally = Counter() if tally is None else tally
    while active := [d for d in dialogues if d.ended is None]:
        turn = len(active[0].replies) + 1
        _show(progress, tally, turn=turn, active=len(active), refresh=True)
        requests = [d.request() for d in active]
        sampled = teacher.sample(requests, k)
        # Candidates that pass the checks in force (and follow no withdrawn instruction) go to the answer gate,
        # all dialogues' in one batch.
        refused = [[d.refusal(c) for c in candidates] for d, candidates in zip(active, sampled)]
        passing = [[c for c, why in zip(candidates, whys) if why is None] for candidates, whys in zip(sampled, refused)]
        items = [item for d, p in zip(active, passing) for item in _gate_items(d, p, config, user_pool)]
        verdicts = iter(gate.judge(items))
        for dialogue, candidates, checked, whys in zip(active, sampled, passing, refused):
            answers = []
            reasons = Counter(why for why in whys if why is not None)  # why this turn's candidates were rejected
            for candidate in checked:
                verdict = next(verdicts)
                stats["gate_rejected_candidates"] += not verdict.passed
                stats.update(f"gate_{reason}" for reason in verdict.failed)
                reasons.update(verdict.failed)
                if verdict.passed:
                    answers.append(candidate)
            kept = answers[0] if answers else None
            for family in {c.family for c in dialogue.constraints}:  # the teacher's pass rate per family
                stats[f"candidates:{family}"] += len(candidates)
                stats[f"passed:{family}"] += len(answers)
                # A family's name may hold ":" (ifeval:...), a reason never: the reason is after the last one.
                stats.update({f"rejected:{family}:{reason}": n for reason, n in reasons.items()})
            stats["candidates"] += len(candidates)
            stats["rejected_candidates"] += candidates.index(kept) if kept is not None else len(candidates)
            if not candidates:
                dialogue.ended = "context_full"
            elif kept is None and dialogue.redrawn < config.redraws:
                redraw_turn(dialogue, config, user_pool)
                stats["redrawn_turns"] += 1
            elif kept is None:
                dialogue.ended = "rejected"
                stats["rejected_turns"] += 1
            else:
                dialogue.replies.append(kept)
                dialogue.redrawn = 0
                if len(dialogue.replies) == len(dialogue.turns):
                    dialogue.ended = "complete"
            if dialogue.ended is not None:  # one step of the bar per dialogue, as it ends
                tally["kept" if len(dialogue.replies) >= config.min_turns else "dropped"] += 1
                if progress is not None:
                    _show(progress, tally, turn=turn, active=sum(d.ended is None for d in active), refresh=False)
                    progress.update(1)


def _show(progress: tqdm | None, tally: Counter, *, turn: int | None, active: int, refresh: bool) -> None:
    """The bar's postfix: the turn being sampled and the dialogues still active (during a shard), and the
    dialogues kept and dropped so far."""
    if progress is not None:
        shard = {"turn": turn, "active": active} if turn is not None else {}
        progress.set_postfix({**shard, "kept": tally["kept"], "dropped": tally["dropped"]}, refresh=refresh)


def to_record(dialogue: _Dialogue, teacher_name: str, config: SynthesisConfig) -> dict[str, Any]:
    """The record format of docs/data.md ("Formats"): clean messages, the instruction kept apart.

    Args:
        dialogue: The dialogue, up to its last kept reply.
        teacher_name: The teacher's name, for the record's meta.
        config: The synthesis config (seed, round, k, kinds).

    Returns:
        The record; "kind" and "events" only where `config.kinds` is not ("first",).
    """
    messages = []
    for turn, reply in zip(dialogue.turns, dialogue.replies):
        messages += [{"role": "user", "content": turn.text}, {"role": "assistant", "content": reply}]
    events = [e for e in dialogue.events if e.turn <= len(dialogue.replies)]  # those the kept turns reach
    opening = list(events[0].constraints) if events and events[0].turn == 1 else []
    record = {
        "id": f"d-{dialogue.index:06d}",
        # the turn-one instruction, both forms (the collator places the one `use_short` picks); None if none
        "instruction": instruction_text(opening, short=False) if opening else None,
        "instruction_short": instruction_text(opening, short=True) if opening else None,
        "use_short": dialogue.use_short,
        "constraints": [constraint_entry(c) for e in events if e.action != "revoke" for c in e.constraints],
        "messages": messages,
        "sampled_with_instruction": [True] * len(dialogue.replies),
        "meta": {
            "teacher": teacher_name,
            "seed": config.seed,
            "round": config.round,
            "k": config.samples_per_turn,
            "ended": dialogue.ended,
        },
    }
    if config.kinds != ("first",):
        # what each user turn gives, changes or withdraws; the collator writes a later turn's words into it
        record["kind"] = dialogue_kind(events)
        record["events"] = [e.to_dict() for e in events]
    return record


def synthesize(
    out_dir: str | Path,
    config: SynthesisConfig,
    teacher: Teacher,
    constraints: Sequence[Constraint],
    user_pool: Sequence[UserTurn],
    name: str = "gatt",
    demonstrate: Callable[[], dict[str, list[dict[str, str]]]] | None = None,
) -> dict[str, Any]:
    """Write `out_dir/NAME.jsonl` (resuming finished shards) and return the summary (on every process).

    Args:
        out_dir: Output folder; the shards go to `out_dir/NAME.shards`.
        config: The synthesis config.
        teacher: Samples the replies and judges their relevance.
        constraints: The constraints drawn from; none: dialogues without an instruction, each reply the teacher's
            own answer that passes the answer gate (replay data against forgetting).
        user_pool: The user messages drawn from.
        name: The output's name, NAME (default "gatt").
        demonstrate: With `config.demonstration`, gives each constraint's demonstration (a passing exchange,
            data_gen/pass_rate.py), kept in the shard folder so a resumed run uses the same ones; a dialogue's
            teacher prompt opens with those of its constraints (default None).

    Returns:
        The run's summary, as `out_dir/NAME.summary.json` holds it.

    Raises:
        ValueError: When the shard folder was made with other settings (`check_settings`).
    """
    out_dir = Path(out_dir)
    shard_dir = out_dir / f"{name}.shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    check_settings(shard_dir / "settings.json", _run_settings(config, teacher, constraints, user_pool))
    demonstrations = load_demonstrations(shard_dir / "demonstrations.json", demonstrate) if config.demonstration else {}
    # Families drawn alike: a family with few values (all caps) gets as much GAtt data as the hobbies.
    sampler = ConstraintSampler(constraints, short_prob=config.short_prob, by_family=True) if constraints else None
    pool = families(constraints)  # the values a value swap draws from
    num_shards = -(-config.num_dialogues // config.shard_size)
    state = process_state()
    mine = my_items(num_shards, state)
    where = f" (process {state.process_index} of {state.num_processes})" if state.num_processes > 1 else ""
    # Shards finished before an interruption count as done from the start (the bar's rate and ETA are this run's).
    tally: Counter = Counter()
    for shard in mine:
        if shard_path(shard_dir, shard).exists():
            tally.update(shard_tally(shard_path(shard_dir, shard)))
    progress = tqdm(
        total=sum(len(_shard_indices(s, config)) for s in mine),
        initial=tally.total(),
        desc=f"{name} synthesis{where}",
        unit="dialogue",
        disable=not state.is_local_main_process,
    )
    _show(progress, tally, turn=None, active=0, refresh=False)
    for shard in mine:
        path = shard_path(shard_dir, shard)
        indices = _shard_indices(shard, config)
        if not path.exists():  # else finished before an interruption (counted in the bar's initial)
            # The shard's sampling depends on neither earlier shards nor, past round 1, the other rounds' samples.
            teacher.seed(config.seed * 100_003 + shard + (config.round - 1) * 1_000_000_007)
            dialogues = [draw_dialogue(i, config, sampler, user_pool) for i in indices]
            for d in dialogues:
                d.demonstration = [m for c in d.constraints for m in demonstrations.get(c.name, [])]
            stats: Counter = Counter()
            synthesize_shard(dialogues, teacher, config, user_pool, stats, progress, tally)
            lines = [json.dumps(_shard_entry(d, teacher.name, config, pool), ensure_ascii=False) for d in dialogues]
            # Stats first: the shard's .jsonl appearing is what marks it finished.
            made = {"process": state.process_index, "processes": state.num_processes, "counts": stats}
            write_text(path.with_suffix(".stats.json"), json.dumps(made))
            write_text(path, "".join(line + "\n" for line in lines))
    progress.close()
    state.wait_for_everyone()  # every shard is written
    if state.is_main_process:
        merge(out_dir, shard_dir, num_shards, name, processes=state.num_processes)
    state.wait_for_everyone()  # the merged file and summary are written
    return json.loads((out_dir / f"{name}.summary.json").read_text())


def _shard_indices(shard: int, config: SynthesisConfig) -> range:
    """The dialogues of a shard."""
    return range(shard * config.shard_size, min((shard + 1) * config.shard_size, config.num_dialogues))


def _shard_entry(
    dialogue: _Dialogue, teacher_name: str, config: SynthesisConfig, pool: dict[str, list[Constraint]]
) -> dict[str, Any]:
    """A kept record and its value swaps, or the bookkeeping of a dropped dialogue (so the summary can count it)."""
    kept = len(dialogue.replies) >= config.min_turns
    entry: dict[str, Any] = {
        "kept": kept,
        "families": sorted(c.family for c in dialogue.constraints),
        "kind": dialogue_kind([e for e in dialogue.events if e.turn <= len(dialogue.replies)]),
        "ended": dialogue.ended,
        "turns": len(dialogue.replies),
        "planned": len(dialogue.turns),
    }
    if kept:
        entry["record"] = to_record(dialogue, teacher_name, config)
    if kept and config.value_swaps:
        rng = random.Random(f"{config.draw_key}-{dialogue.index}-swaps")
        copies: dict[str, dict[str, Any]] = {}  # by the values swapped in: a draw made twice is written once
        for n in range(1, config.value_swaps + 1):
            if (copy := swapped(entry["record"], dialogue.constraints, pool, rng, n)) is not None:
                copies.setdefault(json.dumps(copy["meta"]["swaps"], sort_keys=True), copy)
        entry["swaps"] = list(copies.values())
    return entry


def _run_settings(
    config: SynthesisConfig, teacher: Teacher, constraints: Sequence[Constraint], user_pool: Sequence[UserTurn]
) -> dict[str, Any]:
    """What a shard folder is made with (its settings.json), as that file reads back (tuples as lists)."""
    # relevance_judge left at the gate's default and no value swaps stay out: shards written before those settings
    # existed resume
    later = {"relevance_judge": config.relevance_judge, "value_swaps": config.value_swaps}
    later = {key: value for key, value in later.items() if value}
    settings = {
        "config": {**{k: v for k, v in asdict(config).items() if k not in ("relevance_judge", "value_swaps")}, **later},
        "teacher": teacher.name,
        "constraints": [c.name for c in constraints],
        "user_pool": len(user_pool),
    }
    if gate_config(config.strict_repeats, config.strict_gate, config.relevance_judge).uses_embedding:
        settings["embedding_judge"] = EMBEDDING_JUDGE
    return json.loads(json.dumps(settings))
