"""The methods replayed: the real StepLoop, DraftPlanner and LookupProposer (and, where the recording has them, the
draft model's recorded proposals: draft_replay.py) driven over recorded answers on a virtual clock that charges each
decode the recorded step-cost curve (ReplayTarget stands in for the model). Each figure is a decode speed-up over
plain decoding on the same clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from ..decoding.proposers.auto import AutoProposer
from ..decoding.proposers.base import NoProposer, Proposal, Proposer
from ..decoding.proposers.lookup import LookupProposer
from ..decoding.runtime import Model
from ..decoding.speculation_config import SpeculationConfig
from ..decoding.stats import GenerationStats
from ..decoding.step import SequenceState, StepLoop
from ..decoding.verifier import Verifier
from ..lab.bench import GREEDY
from ..methods import DEFAULT_MAX_DRAFT, MAX_DRAFT_LIMIT
from .draft_replay import ReplayDraft
from .recording import Recording
from .replay_bounds import kept_tokens, speed_up


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
        return [speed_up(len(a.answer), recording.seconds(1), s) for a, s in zip(recording.answers, spent)]
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
    proposers: dict[str, Proposer] = {
        "none": NoProposer(),
        "lookup": lookup,
        "draft": draft,
        "auto": AutoProposer(lookup, draft),
    }
    proposer = proposers[method]
    loop = StepLoop(
        cast(Model, target),  # a replay of a Model: what the step loop uses of one, on a recorded clock
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
        lookup.start(0, a.prompt, GREEDY, torch.device("cpu"), 0)  # the lookup reads only the prompt
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
                        kept_tokens(offer.tokens, a.answer, produced),
                        seq.stats.draft_length,
                        outcome.accepted,
                        loop.planner.realism,
                    )
                )
            produced += len(outcome.tokens)
        out.append(target.clock() - started)
    return out
