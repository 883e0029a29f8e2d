"""`python -m engine.measure.replay`: prompt lookup's policy replayed offline on recorded answers.

Timing runs on a shared CPU vary by 5-10% between runs, more than most policy changes are worth, so a
policy cannot be tuned on them. `record` saves a model's plain answers to a prompt set (token ids; greedy, or
sampled with `--temperature` over `--seeds`) and its warm step-cost curve (seconds by rows verified). A sampled
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
Each figure is a decode speed-up: plain decoding's time over the method's, per prompt. `replay --curves FILE
--shape NAME` charges another device's curve instead (engine.measure.gpu_kit): a prediction for that device. Deterministic,
about a second per prompt set; a replay does not see what the curve leaves out (numerics that part
greedy answers at near-ties, a context that grows, other programs). `trace` prints every replayed step of
chosen answers: what lookup offered, how much of it the answer keeps, and what the planner drafted.
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..chat_format import ChatFormatter
from ..decoding.cost_model import DEFAULT_MAX_DRAFT, MAX_DRAFT_LIMIT, SpeculationConfig, calibration_sizes
from ..decoding.loader import DecoderSettings, build_decoder
from ..decoding.proposers.base import Proposal
from ..decoding.proposers.lookup import LookupProposer
from ..decoding.sampling import SamplingParams
from ..decoding.stats import GenerationStats
from ..decoding.step import SequenceState, StepLoop, time_steps
from ..decoding.verifier import Verifier
from .bench import GREEDY, answer_tokens, encode, parse_seeds, read_prompts

NGRAM_SIMPLE_N, NGRAM_SIMPLE_M = 12, 48  # llama.cpp's defaults (common_params_speculative_ngram_map)
WARM_UP_TEXT = "Hello there, this is a warm up prompt of some length. " * 8  # cells before the timed ones


@dataclass
class Answer:
    id: str
    prompt: list[int]
    answer: list[int]  # the first token comes from the prompt's prefill; the rest are decode steps


@dataclass
class Recording:
    model: str
    curve: dict[int, float]  # seconds of one step by rows verified
    answers: list[Answer]
    ends: list[int]  # end tokens among those the prompts and answers use
    temperature: float = 0.0  # the answers' sampling (0: greedy; else one answer per prompt and seed)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> "Recording":
        raw = json.loads(Path(path).read_text())
        return cls(raw["model"], {int(k): v for k, v in raw["curve"].items()},
                   [Answer(**a) for a in raw["answers"]], raw["ends"], raw.get("temperature", 0.0))

    def seconds(self, rows: int) -> float:
        sizes = sorted(self.curve)
        return float(np.interp(rows, sizes, [self.curve[r] for r in sizes]))


def record(model: str, prompts: Sequence[dict], max_tokens: int, chat: bool = False,
           threads: int | None = None, temperature: float = 0.0, seeds: Sequence[int] = (1,)) -> Recording:
    """Plain answers (end tokens ignored, as bench's --ignore-eos) and the warm step-cost curve: greedy, or at
    a temperature one per seed (ids `prompt@seed`), with SamplingParams' other filters."""
    decoder = build_decoder(DecoderSettings(model=model, method="none", threads=threads))
    target = decoder.target
    try:
        warm = target.tokenize(WARM_UP_TEXT)
        target.prefill(warm, 0, 0)
        curve = time_steps(target, 0, len(warm), warm[-1], calibration_sizes(MAX_DRAFT_LIMIT + 1))
        target.forget_all()
        formatter = ChatFormatter(target) if chat else None
        runs = [(None, GREEDY)] if not temperature else \
            [(seed, SamplingParams(temperature=temperature, seed=seed)) for seed in seeds]
        answers = []
        for item in prompts:
            tokens, _ = encode(target, formatter, item["prompt"])
            for seed, sampling in runs:
                name = str(item["id"]) if seed is None else f"{item['id']}@{seed}"
                answers.append(Answer(name, list(tokens), answer_tokens(decoder, tokens, max_tokens, sampling)))
        used = {t for a in answers for t in a.prompt + a.answer}
        return Recording(target.name, curve, answers, sorted(t for t in used if target.is_end(t)), temperature)
    finally:
        target.close()


def on_device(recording: Recording, curves_path: str | Path, shape: str) -> Recording:
    """The recording's answers on another device's step costs: one shape's curve from a gpu_kit curves file."""
    shapes = json.loads(Path(curves_path).read_text())["shapes"]
    if shape not in shapes:
        raise ValueError(f"{curves_path} has no curve for {shape!r}; it has {', '.join(shapes)}")
    found = shapes[shape]
    curve = {int(rows): seconds for rows, seconds in found["seconds_by_rows"].items()}
    return Recording(f"{recording.model} on {shape}'s {found.get('backend', '?')} step costs", curve,
                     recording.answers, recording.ends, recording.temperature)


class ReplayTarget:
    """Stands in for the target model: each decode advances the virtual clock by the recorded curve, and
    the logits make the recorded answer the argmax at every position (so the verifier keeps exactly the
    drafted tokens the answer has)."""

    n_batch, can_roll_back, threads = 512, True, 1

    def __init__(self, recording: Recording):
        self.recording = recording
        self.now = 0.0
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
        return self.now

    def decode_multi(self, tokens, positions, seq_ids, want_logits) -> np.ndarray:
        self.now += self.recording.seconds(len(tokens))
        for row, column in self._hot:  # the last step's ones, cleared
            self._logits[row, column] = 0.0
        self._hot = [(row, self.truth[pos + 1]) for row, pos in enumerate(positions) if pos + 1 < len(self.truth)]
        for row, column in self._hot:
            self._logits[row, column] = 1.0
        return self._logits[:len(tokens)]

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


def replay_lookup(recording: Recording, max_draft: int = DEFAULT_MAX_DRAFT,
                  on_step: Callable[[TracedStep], None] | None = None) -> list[float]:
    """Prompt lookup's decode speed-up per answer, answered one after another as bench does (one planner);
    on_step, if given, sees every step."""
    target = ReplayTarget(recording)
    proposer = _WatchedLookup(remember_requests=False)
    loop = StepLoop(target, proposer, SpeculationConfig(max_draft=max_draft), torch.device("cpu"),
                    tune_threads=False, clock=target.clock)
    plain_step = recording.seconds(1)
    out = []
    for a in recording.answers:
        target.truth = a.prompt + a.answer
        history = a.prompt + a.answer[:1]
        loop.planner.begin_request()
        loop.proposer.start(0, a.prompt, None, None, 0)
        loop.calibrate(0, len(a.prompt), a.answer[0])
        seq = SequenceState(0, history, Verifier(GREEDY, torch.device("cpu"), 0),
                            GenerationStats(), stops_at_end=False)
        started, produced = target.now, 1
        while produced < len(a.answer):
            continuing, proposer.last = seq.continuing, []
            outcome = loop.step([seq], [len(a.answer) - produced])[0]
            if on_step is not None:
                offer = proposer.last[0] if proposer.last else Proposal()
                on_step(TracedStep(a.id, produced, offer.match_length, continuing, len(offer.tokens),
                                   _kept(offer.tokens, a.answer, produced), seq.stats.draft_length,
                                   outcome.accepted, loop.planner.realism))
            produced += len(outcome.tokens)
        out.append(_speed_up(len(a.answer), plain_step, target.now - started))
    return out


def ngram_simple_draft(tokens: list[int], n: int = NGRAM_SIMPLE_N, m: int = NGRAM_SIMPLE_M) -> list[int]:
    """llama.cpp's common_ngram_simple_draft: the latest earlier occurrence of the last n tokens, and up
    to m tokens after it (none unless at least n)."""
    cur = len(tokens) - 1  # the last token is the one just sampled, not yet in llama.cpp's history
    if cur <= n + m + 1:
        return []
    pattern = tokens[-n:]
    for j in range(cur - n - 1, 0, -1):
        if tokens[j:j + n] == pattern:
            copy = min(m, cur - (j + n))
            return tokens[j + n:j + n + copy] if copy >= n else []
    return []


def replay_ngram_simple(recording: Recording) -> list[float]:
    out = []
    for a in recording.answers:
        spent, produced = 0.0, 1
        while produced < len(a.answer):
            draft = ngram_simple_draft(a.prompt + a.answer[:produced])[:len(a.answer) - produced]
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
                    best = max(best, _kept(history[e + 1:e + 1 + max_draft], a.answer, i))
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
        best[i] = min(recording.seconds(k + 1) + best[min(n, i + 1 + min(k, kept[i]))]
                      for k in range(0, min(lengths[i], n - 1 - i) + 1))
    return _speed_up(n, recording.seconds(1), best[1])


def _kept(draft: list[int], answer: list[int], at: int) -> int:
    """How many of a draft proposed with answer[:at] written the answer goes on to write."""
    k = 0
    while k < len(draft) and at + k < len(answer) and draft[k] == answer[at + k]:
        k += 1
    return k


def _speed_up(tokens: int, plain_step: float, spent: float) -> float:
    return (tokens - 1) * plain_step / spent if spent > 0 else 1.0


def report(recording: Recording, max_draft: int) -> str:
    lookup = replay_lookup(recording, max_draft)
    ngram = replay_ngram_simple(recording)
    bound = hindsight_bound(recording, max_draft)
    any_copy = any_copy_bound(recording, max_draft)
    sampled = f", answers sampled at T = {recording.temperature}" if recording.temperature else ""
    lines = [f"{recording.model}{sampled}: decode speed-up over plain decoding on the recorded step costs "
             f"(1 row {1000 * recording.seconds(1):.1f} ms, 16 rows {1000 * recording.seconds(16):.1f} ms), "
             f"max draft {max_draft}",
             "| prompt | lookup | ngram-simple | lookup / ngram-simple | hindsight bound | any-copy bound "
             "| any-copy bound / ngram-simple |", "|---|---|---|---|---|---|---|"]
    for a, x, y, z, w in zip(recording.answers, lookup, ngram, bound, any_copy):
        lines.append(f"| {a.id} | {x:.2f}x | {y:.2f}x | {x / y:.2f} | {z:.2f}x | {w:.2f}x | {w / y:.2f} |")
    med = statistics.median
    lines.append(f"| median | {med(lookup):.2f}x | {med(ngram):.2f}x | {med(x / y for x, y in zip(lookup, ngram)):.2f} "
                 f"| {med(bound):.2f}x | {med(any_copy):.2f}x | {med(w / y for w, y in zip(any_copy, ngram)):.2f} |")
    return "\n".join(lines)


def trace(recording: Recording, ids: Sequence[str], max_draft: int) -> str:
    """Every step of the named answers (all when none are named), one line each: where the policy left
    tokens the answer would have kept (offered and keepable, not drafted) is where it can still gain."""
    lines = ["| prompt | at | match | continuing | offered | keepable | drafted | accepted | realism |",
             "|---|---|---|---|---|---|---|---|---|"]

    def show(t: TracedStep) -> None:
        if not ids or t.answer in ids:
            lines.append(f"| {t.answer} | {t.position} | {t.match_length} | {'yes' if t.continuing else 'no'} "
                         f"| {t.offered} | {t.keepable} | {t.drafted} | {t.accepted} | {t.realism:.2f} |")

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
    rec.add_argument("--seeds", type=parse_seeds, default=[1], help="with --temperature: one answer per seed, "
                     "as 1-3 or 1,2,5")
    rec.add_argument("--out", required=True)
    rep = sub.add_parser("replay", help="replay lookup, ngram-simple and the hindsight bound on a recording")
    rep.add_argument("recording")
    rep.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    rep.add_argument("--curves", help="a curves file from engine.measure.gpu_kit: predict on that device's step costs")
    rep.add_argument("--shape", help="with --curves: whose curve (e.g. qwen2-7b)")
    tr = sub.add_parser("trace", help="every replayed lookup step: offered, keepable, drafted, accepted")
    tr.add_argument("recording")
    tr.add_argument("ids", nargs="*", help="answers to show (all when none)")
    tr.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    args = parser.parse_args(argv)
    if args.command == "record":
        prompts = read_prompts(args.prompts)
        recording = record(args.model, prompts, args.max_tokens, args.chat, args.threads, args.temperature,
                           args.seeds)
        recording.save(args.out)
        print(f"recorded {len(recording.answers)} answers to {args.out}")
    elif args.command == "trace":
        print(trace(Recording.load(args.recording), args.ids, args.max_draft))
    else:
        recording = Recording.load(args.recording)
        if args.curves:
            if not args.shape:
                parser.error("--curves needs --shape")
            recording = on_device(recording, args.curves, args.shape)
        print(report(recording, args.max_draft))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
