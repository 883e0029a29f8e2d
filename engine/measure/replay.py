"""`python -m engine.measure.replay`: the decoding methods' policies replayed offline on recorded answers.

Timing runs on a shared CPU vary by 5-10% between runs, more than most policy changes are worth, so a
policy cannot be tuned on them. `record` saves a model's plain answers to a prompt set (token ids; greedy, or
sampled with `--temperature` over `--seeds`) and its step-cost curve as decoding pays it (seconds by rows
verified; recording.py). A sampled
answer replays as faithfully as a greedy one: a seed fixes the token at each position whatever is drafted
(the verifier draws lookup's tokens by Gumbel noise keyed to the position), so which drafted tokens an answer
keeps is still which ones it goes on to write. `replay` then drives the real StepLoop,
DraftPlanner and LookupProposer over those answers on a virtual clock that charges each decode the
recorded curve, and sets the result beside two baselines on the same clock:
- llama.cpp's ngram-simple (`llama-server --spec-type ngram-simple`): after a 12-token match, up to 48
  tokens drafted, every step;
- the hindsight bound for these proposals: at every step the draft length that is best for the rest of
  the answer, knowing how many of each proposal's tokens the answer keeps (dynamic programming over the
  answer, longest-match proposals without learned edits). It bounds what choosing draft lengths can win;
- the any-copy bound: the same, with each step's draft copied from whichever earlier place in the history
  the answer follows furthest. It bounds what any prompt-lookup proposer can win on these step costs.
With `record --draft FILE` (greedy answers) the draft model's proposal at every position is recorded too, with
its own curve, and the draft and auto methods replay as well (engine.measure.draft_replay).
Each figure is a decode speed-up: plain decoding's time over the method's, per prompt. `replay --curves FILE
--shape NAME [--draft-shape NAME]` charges another device's curves instead (engine.measure.gpu_kit): a
prediction for that device. Deterministic,
about a second per prompt set; a replay does not see what the curve leaves out (numerics that part
greedy answers at near-ties, a context that grows, other programs). `trace` prints every replayed step of
chosen answers: what lookup offered, how much of it the answer keeps, and what the planner drafted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..decoding.cost_model import SpeculationConfig
from ..decoding.proposers.auto import AutoProposer
from ..decoding.proposers.base import NoProposer, Proposal
from ..decoding.proposers.lookup import LookupProposer
from ..decoding.stats import GenerationStats
from ..decoding.step import SequenceState, StepLoop
from ..decoding.verifier import Verifier
from ..errors import EngineError
from ..lab.bench import GREEDY, parse_seeds, read_prompts
from ..methods import DEFAULT_MAX_DRAFT, DEFAULT_P_MIN, MAX_DRAFT_LIMIT
from .draft_replay import ReplayDraft
from .recording import Recording, on_device, record

NGRAM_SIMPLE_N, NGRAM_SIMPLE_M = 12, 48  # llama.cpp's defaults (common_params_speculative_ngram_map)


class ReplayTarget:
    """Stands in for the target model: each decode advances the virtual clock by the recorded curve, and
    the logits make the recorded answer the argmax at every position (so the verifier keeps exactly the
    drafted tokens the answer has)."""

    n_batch, can_roll_back, threads = 512, True, 1

    def __init__(self, recording: Recording, host_time: bool = False):
        self.recording = recording
        self.now = 0.0
        # host_time: the clock also runs with the real time the loop spends around the decodes (planning,
        # proposing, verifying over the vocabulary) on this machine, which the curves leave out
        self.host_time = host_time
        self._started, self._inside = time.perf_counter(), 0.0
        self.n_ctx = 1 + max(len(a.prompt) + len(a.answer) for a in recording.answers) + MAX_DRAFT_LIMIT
        self.n_vocab = 1 + max(t for a in recording.answers for t in a.prompt + a.answer)
        self.truth: list[int] = []  # the prompt and answer being replayed
        self._ends = set(recording.ends)
        self._logits = np.zeros((MAX_DRAFT_LIMIT + 1, self.n_vocab), dtype=np.float32)
        self._hot: list[tuple[int, int]] = []

    @property
    def step_timings(self) -> dict:
        """None kept: every replay calibrates on the virtual clock, as a freshly loaded model does."""
        return {}

    def clock(self) -> float:
        if not self.host_time:
            return self.now
        return self.now + time.perf_counter() - self._started - self._inside

    def advance(self, seconds: float) -> None:
        """Time spent outside the target (a replayed draft model's decodes)."""
        self.now += seconds

    def decode_multi(self, tokens, positions, seq_ids, want_logits) -> np.ndarray:
        t = time.perf_counter()
        self.now += self.recording.seconds(len(tokens))
        for row, column in self._hot:  # the last step's ones, cleared
            self._logits[row, column] = 0.0
        self._hot = [(row, self.truth[pos + 1]) for row, pos in enumerate(positions) if pos + 1 < len(self.truth)]
        for row, column in self._hot:
            self._logits[row, column] = 1.0
        self._inside += time.perf_counter() - t  # the stand-in's own work: the curve charges the decode
        return self._logits[: len(tokens)]

    def forget_from(self, pos: int, seq_id: int = 0) -> None:
        pass

    def set_threads(self, threads: int) -> None:
        pass

    def is_end(self, token: int) -> bool:
        return token in self._ends


@dataclass(frozen=True)
class TracedStep:
    """One replayed step: what lookup offered, what the planner took of it, and what the answer keeps."""

    answer: str
    position: int  # answer tokens written before the step
    match_length: int
    continuing: bool
    offered: int  # drafted tokens proposed
    keepable: int  # of those, how many the recorded answer goes on to write
    drafted: int  # how many the planner verified
    accepted: int
    realism: float


class _WatchedLookup(LookupProposer):
    """The shipped proposer, keeping its last proposal for a trace."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.last: list[Proposal] = []

    def propose(self, wants):
        self.last = super().propose(wants)
        return self.last


REPLAYED = ("lookup", "draft", "auto")


def replay_lookup(
    recording: Recording, max_draft: int = DEFAULT_MAX_DRAFT, on_step: Callable[[TracedStep], None] | None = None
) -> list[float]:
    """Prompt lookup's decode speed-up per answer; on_step, if given, sees every step."""
    return replay_method(recording, "lookup", max_draft, on_step)


def replay_method(
    recording: Recording,
    method: str,
    max_draft: int = DEFAULT_MAX_DRAFT,
    on_step: Callable[[TracedStep], None] | None = None,
    adaptive: bool = True,
    host_time: bool = False,
) -> list[float]:
    """A method's decode speed-up per answer (lookup; draft and auto where the recording has the draft's
    proposals), answered one after another as bench does (one decoder); adaptive=False: fixed lengths of
    max_draft, as the live setting. host_time: the loop's own time on this machine counts too, plain decoding's
    included (not deterministic then; on a GPU, where a step takes milliseconds, it is a real part of a step)."""
    if method not in REPLAYED:
        raise ValueError(f"replays {', '.join(REPLAYED)}, not {method!r}")
    if method != "lookup" and not recording.has_draft:
        raise ValueError(f"{method} needs a recording with a draft model's proposals (record --draft)")
    spent = _replay(recording, method, max_draft, on_step, adaptive, host_time)
    if not host_time:  # plain decoding on the curve alone: one one-row step per token
        return [_speed_up(len(a.answer), recording.seconds(1), s) for a, s in zip(recording.answers, spent)]
    plain = _replay(recording, "none", max_draft, None, adaptive, host_time)
    return [p / s if s > 0 else 1.0 for p, s in zip(plain, spent)]


def _replay(
    recording: Recording,
    method: str,
    max_draft: int,
    on_step: Callable[[TracedStep], None] | None,
    adaptive: bool,
    host_time: bool,
) -> list[float]:
    """Seconds of each answer's decode (after its first token) by one method on the replay's clock."""
    target = ReplayTarget(recording, host_time)
    lookup = _WatchedLookup(remember_requests=False)
    draft = ReplayDraft(
        recording.draft_seconds, target.advance, target.n_batch, pick_width=target.n_vocab if host_time else 0
    )
    proposer = {"none": NoProposer(), "lookup": lookup, "draft": draft, "auto": AutoProposer(lookup, draft)}[method]
    loop = StepLoop(
        target,
        proposer,
        SpeculationConfig(max_draft=max_draft, adaptive=adaptive),
        torch.device("cpu"),
        tune_threads=False,
        clock=target.clock,
    )
    out = []
    for a in recording.answers:
        target.truth = a.prompt + a.answer
        draft.follow(a.prompt, a.answer, a.draft_kept, a.draft_made)
        history = a.prompt + a.answer[:1]
        loop.planner.begin_request()
        lookup.start(0, a.prompt, None, None, 0)
        loop.calibrate(0, len(a.prompt), a.answer[0])
        seq = SequenceState(0, history, Verifier(GREEDY, torch.device("cpu"), 0), GenerationStats(), stops_at_end=False)
        started, produced = target.clock(), 1
        while produced < len(a.answer):
            continuing, lookup.last = seq.draft.continuing, []
            outcome = loop.step([seq], [len(a.answer) - produced])[0]
            if on_step is not None:
                offer = lookup.last[0] if lookup.last else Proposal()
                on_step(
                    TracedStep(
                        a.id,
                        produced,
                        offer.match_length,
                        continuing,
                        len(offer.tokens),
                        _kept(offer.tokens, a.answer, produced),
                        seq.stats.draft_length,
                        outcome.accepted,
                        loop.planner.realism,
                    )
                )
            produced += len(outcome.tokens)
        out.append(target.clock() - started)
    return out


def ngram_simple_draft(tokens: list[int], n: int = NGRAM_SIMPLE_N, m: int = NGRAM_SIMPLE_M) -> list[int]:
    """llama.cpp's common_ngram_simple_draft: the latest earlier occurrence of the last n tokens, and up
    to m tokens after it (none unless at least n)."""
    cur = len(tokens) - 1  # the last token is the one just sampled, not yet in llama.cpp's history
    if cur <= n + m + 1:
        return []
    pattern = tokens[-n:]
    for j in range(cur - n - 1, 0, -1):
        if tokens[j : j + n] == pattern:
            copy = min(m, cur - (j + n))
            return tokens[j + n : j + n + copy] if copy >= n else []
    return []


def replay_ngram_simple(recording: Recording) -> list[float]:
    out = []
    for a in recording.answers:
        spent, produced = 0.0, 1
        while produced < len(a.answer):
            draft = ngram_simple_draft(a.prompt + a.answer[:produced])[: len(a.answer) - produced]
            spent += recording.seconds(1 + len(draft))
            produced += 1 + _kept(draft, a.answer, produced)
        out.append(_speed_up(len(a.answer), recording.seconds(1), spent))
    return out


def hindsight_bound(recording: Recording, max_draft: int = DEFAULT_MAX_DRAFT) -> list[float]:
    """Per answer: the best draft lengths for the shipped proposer's proposals, knowing the answer."""
    proposer = LookupProposer(remember_requests=False)
    out = []
    for a in recording.answers:
        proposals = [proposer.propose_one(a.prompt + a.answer[:i], max_draft).tokens for i in range(len(a.answer))]
        kept = [_kept(p, a.answer, i) for i, p in enumerate(proposals)]
        out.append(_best_schedule(recording, len(a.answer), kept, [len(p) for p in proposals]))
    return out


def any_copy_bound(recording: Recording, max_draft: int = DEFAULT_MAX_DRAFT) -> list[float]:
    """Per answer: the hindsight bound over every proposal that copies the history. At each step the draft
    is the continuation of whichever earlier occurrence of the last token the answer goes on to follow
    furthest (every prompt-lookup proposal, of any n-gram length or scoring, continues one of them; the
    shipped proposer's own draft, which may repeat a period past the history's end, is a candidate too),
    padded to any length, and the draft lengths are the best. No way of choosing what to copy beats it;
    edits the proposer writes into a copy, and a draft model, are outside it."""
    proposer = LookupProposer(remember_requests=False)
    out = []
    for a in recording.answers:
        kept = []
        for i in range(len(a.answer)):
            history = a.prompt + a.answer[:i]
            best = _kept(proposer.propose_one(history, max_draft).tokens, a.answer, i)
            for e in range(len(history) - 1):
                if history[e] == history[-1]:
                    best = max(best, _kept(history[e + 1 : e + 1 + max_draft], a.answer, i))
            kept.append(best)
        out.append(_best_schedule(recording, len(a.answer), kept, [max_draft] * len(a.answer)))
    return out


def _best_schedule(recording: Recording, n: int, kept: list[int], lengths: list[int]) -> float:
    """The speed-up of the fastest schedule over an answer of n tokens, where a step at token i may verify up
    to lengths[i] drafts of which the answer keeps kept[i] (dynamic programming, from the end)."""
    if n <= 1:
        return 1.0
    best = [0.0] * (n + 1)  # best[i]: least time to produce answer[i:] given answer[:i]
    for i in range(n - 1, 0, -1):
        best[i] = min(
            recording.seconds(k + 1) + best[min(n, i + 1 + min(k, kept[i]))]
            for k in range(0, min(lengths[i], n - 1 - i) + 1)
        )
    return _speed_up(n, recording.seconds(1), best[1])


def _kept(draft: list[int], answer: list[int], at: int) -> int:
    """How many of a draft proposed with answer[:at] written the answer goes on to write."""
    k = 0
    while k < len(draft) and at + k < len(answer) and draft[k] == answer[at + k]:
        k += 1
    return k


def _speed_up(tokens: int, plain_step: float, spent: float) -> float:
    return (tokens - 1) * plain_step / spent if spent > 0 else 1.0


def speed_ups(recording: Recording, max_draft: int, host_time: bool = False) -> dict[str, list[float]]:
    """Every figure the report shows, per answer: the methods replayed (draft and auto where the recording has
    the draft's proposals; with host_time, this machine's loop time counted), ngram-simple and the two bounds."""
    out = {
        "lookup": replay_method(recording, "lookup", max_draft, host_time=host_time),
        "ngram-simple": replay_ngram_simple(recording),
        "hindsight bound": hindsight_bound(recording, max_draft),
        "any-copy bound": any_copy_bound(recording, max_draft),
    }
    if recording.has_draft:
        out |= {m: replay_method(recording, m, max_draft, host_time=host_time) for m in ("draft", "auto")}
    return out


def as_json(recording: Recording, figures: dict[str, list[float]]) -> dict:
    """The figures by method and answer, with each method's geometric mean over the answers."""
    return {
        "model": recording.model,
        "draft": recording.draft,
        "temperature": recording.temperature,
        "speed_ups": {m: dict(zip((a.id for a in recording.answers), xs)) for m, xs in figures.items()},
        "geomean": {m: statistics.geometric_mean(xs) for m, xs in figures.items()},
    }


def report(
    recording: Recording, max_draft: int, figures: dict[str, list[float]] | None = None, host_time: bool = False
) -> str:
    f = figures or speed_ups(recording, max_draft, host_time)
    lookup, ngram, bound, any_copy = f["lookup"], f["ngram-simple"], f["hindsight bound"], f["any-copy bound"]
    models = [f[m] for m in ("draft", "auto") if m in f]
    sampled = f", answers sampled at T = {recording.temperature}" if recording.temperature else ""
    drafted = f"; draft {recording.draft} (1 row {1000 * recording.draft_seconds(1):.1f} ms)" if models else ""
    lines = [
        f"{recording.model}{sampled}: decode speed-up over plain decoding on the recorded step costs "
        f"(1 row {1000 * recording.seconds(1):.1f} ms, 16 rows {1000 * recording.seconds(16):.1f} ms)"
        f"{drafted}, max draft {max_draft}"
        f"{'; the methods with this machine’s loop time (--host-time)' if host_time else ''}",
        "| prompt | lookup | ngram-simple | lookup / ngram-simple | hindsight bound | any-copy bound "
        "| any-copy bound / ngram-simple |" + (" draft | auto |" if models else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if models else ""),
    ]
    for i, (a, x, y, z, w) in enumerate(zip(recording.answers, lookup, ngram, bound, any_copy)):
        extra = "".join(f" {m[i]:.2f}x |" for m in models)
        lines.append(f"| {a.id} | {x:.2f}x | {y:.2f}x | {x / y:.2f} | {z:.2f}x | {w:.2f}x | {w / y:.2f} |{extra}")
    med = statistics.median
    extra = "".join(f" {med(m):.2f}x |" for m in models)
    lines.append(
        f"| median | {med(lookup):.2f}x | {med(ngram):.2f}x | {med(x / y for x, y in zip(lookup, ngram)):.2f} "
        f"| {med(bound):.2f}x | {med(any_copy):.2f}x | {med(w / y for w, y in zip(any_copy, ngram)):.2f} |"
        f"{extra}"
    )
    lines.append("geomean: " + ", ".join(f"{m} {statistics.geometric_mean(f[m]):.2f}x" for m in REPLAYED if m in f))
    return "\n".join(lines)


def check(recording: Recording, live: dict, max_draft: int, host_time: bool = False) -> tuple[str, dict]:
    """The replay's prediction set beside live figures of the same answers (bench_compare --out, run greedy with
    --ignore-eos and the recording's --max-tokens): per method, each prompt's median live ratio to plain decoding
    and the prediction, and over the prompts the geometric means and prediction / live."""
    methods = [m for m in REPLAYED if (m == "lookup" or recording.has_draft) and any(m in row for row in live["rows"])]
    figures = {m: replay_method(recording, m, max_draft, host_time=host_time) for m in methods}  # these alone
    ids = [a.id for a in recording.answers]
    lines = [
        "| prompt | " + " | ".join(f"{m} live | {m} replay" for m in methods) + " |",
        "|---|" + "---|---|" * len(methods),
    ]
    measured = {m: {} for m in methods}
    for i, name in enumerate(ids):
        cells = []
        for m in methods:
            runs = [row[m] / row["none"] for row in live["rows"] if row["id"] == name and row.get("none")]
            if runs:
                measured[m][name] = statistics.median(runs)
            shown = f"{measured[m][name]:.2f}x" if name in measured[m] else "n/a"
            cells.append(f"{shown} | {figures[m][i]:.2f}x")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    summary = {}
    for m in methods:
        both = [name for name in ids if name in measured[m]]
        if both:
            live_geo = statistics.geometric_mean(measured[m][n] for n in both)
            replay_geo = statistics.geometric_mean(figures[m][ids.index(n)] for n in both)
            summary[m] = {
                "live": live_geo,
                "replay": replay_geo,
                "replay_over_live": replay_geo / live_geo,
                "prompts": len(both),
            }
    lines.append(
        "geomean over prompts: "
        + "; ".join(
            f"{m} live {x['live']:.2f}x, replay {x['replay']:.2f}x (replay / live {x['replay_over_live']:.3f})"
            for m, x in summary.items()
        )
    )
    return "\n".join(lines), summary


def trace(recording: Recording, ids: Sequence[str], max_draft: int) -> str:
    """Every step of the named answers (all when none are named), one line each: where the policy left
    tokens the answer would have kept (offered and keepable, not drafted) is where it can still gain."""
    lines = [
        "| prompt | at | match | continuing | offered | keepable | drafted | accepted | realism |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def show(t: TracedStep) -> None:
        if not ids or t.answer in ids:
            lines.append(
                f"| {t.answer} | {t.position} | {t.match_length} | {'yes' if t.continuing else 'no'} "
                f"| {t.offered} | {t.keepable} | {t.drafted} | {t.accepted} | {t.realism:.2f} |"
            )

    speed_ups = replay_lookup(recording, max_draft, show)
    lines += [f"{a.id}: {x:.2f}x" for a, x in zip(recording.answers, speed_ups) if not ids or a.id in ids]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.measure.replay", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record plain answers and the step-cost curve")
    rec.add_argument("--model", default="embedded")
    rec.add_argument("--prompts", required=True, help="JSONL with id and prompt per line")
    rec.add_argument("--max-tokens", type=int, default=200)
    rec.add_argument("--chat", action="store_true", help="send each prompt as one user message (chat template)")
    rec.add_argument("--threads", type=int, default=None)
    rec.add_argument("--temperature", type=float, default=0.0, help="sample the answers (0: greedy)")
    rec.add_argument(
        "--seeds", type=parse_seeds, default=[1], help="with --temperature: one answer per seed, as 1-3 or 1,2,5"
    )
    rec.add_argument(
        "--draft",
        help="a draft model: record its proposal at every position too (greedy only), so draft and auto replay",
    )
    rec.add_argument("--p-min", type=float, default=DEFAULT_P_MIN, help="with --draft: its confidence cutoff")
    rec.add_argument(
        "--max-rows",
        type=int,
        default=MAX_DRAFT_LIMIT + 1,
        help="the widest step timed (wider ones are charged on the slope of the widest two)",
    )
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay", help="replay lookup, ngram-simple and the hindsight bound on a recording")
    rep.add_argument("recording")
    rep.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    rep.add_argument("--curves", help="a curves file from engine.measure.gpu_kit: predict on that device's step costs")
    rep.add_argument("--shape", help="with --curves: whose curve (e.g. qwen2-7b)")
    rep.add_argument(
        "--host-time",
        action="store_true",
        help="count the loop's own time on this machine too "
        "(planning, proposing, verifying; plain decoding's too): for a device whose steps are short",
    )
    rep.add_argument("--out", help="also write the figures as JSON (per method and answer, and geomeans)")
    rep.add_argument(
        "--draft-shape",
        help="with --curves: the draft's curve (e.g. qwen2-0.5b); without it, a prediction leaves draft and auto out",
    )
    ch = sub.add_parser("check", help="the replay's prediction beside live bench_compare figures of the same answers")
    ch.add_argument("recording")
    ch.add_argument("live", help="bench_compare --out JSON (greedy, --ignore-eos, the recording's --max-tokens)")
    ch.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    ch.add_argument("--host-time", action="store_true")
    tr = sub.add_parser("trace", help="every replayed lookup step: offered, keepable, drafted, accepted")
    tr.add_argument("recording")
    tr.add_argument("ids", nargs="*", help="answers to show (all when none)")
    tr.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    args = parser.parse_args(argv)
    if args.command == "record" and args.draft and args.temperature:
        parser.error("--draft records along greedy answers only (no --temperature)")
    if args.command == "replay" and args.curves and not args.shape:
        parser.error("--curves needs --shape")
    try:
        if args.command == "record":
            prompts = read_prompts(args.prompts)
            recording = record(
                args.model,
                prompts,
                args.max_tokens,
                args.chat,
                args.threads,
                args.temperature,
                args.seeds,
                args.draft,
                args.p_min,
                args.max_rows,
            )
            recording.save(args.out)
            print(f"recorded {len(recording.answers)} answers to {args.out}")
        elif args.command == "check":
            print(
                check(
                    Recording.load(args.recording),
                    json.loads(Path(args.live).read_text()),
                    args.max_draft,
                    args.host_time,
                )[0]
            )
        elif args.command == "trace":
            print(trace(Recording.load(args.recording), args.ids, args.max_draft))
        else:
            recording = Recording.load(args.recording)
            if args.curves:
                recording = on_device(recording, args.curves, args.shape, args.draft_shape)
            figures = speed_ups(recording, args.max_draft, args.host_time)
            print(report(recording, args.max_draft, figures, args.host_time))
            if args.out:
                Path(args.out).write_text(json.dumps(as_json(recording, figures), indent=1))
    except (EngineError, OSError, ValueError) as exc:  # a bad file, a draft that does not fit, a shape not timed
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
