"""A request as the engine runs it: a Job (what to answer, where its output goes) and its RequestRun (its tokens and
timeline). job_for is the one way a request becomes a Job, for the chat, the bench, the lab and the server alike,
so the one seed rule holds on every path: the same request with the same seed gives the same answer."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .answer import Delta
from .sampling import SamplingParams, request_seed, stream_seeds
from .stats import GenerationStats


@dataclass
class RequestRun:
    """One request's tokens and timeline (perf_counter seconds)."""

    request_id: str
    slot: int
    tokens: list[int]
    stats: GenerationStats
    admitted_at: float
    deliveries: list[tuple[float, int]] = field(default_factory=list)  # (when, tokens) per step with output
    finished_at: float | None = None

    @property
    def first_token_at(self) -> float | None:
        return self.deliveries[0][0] if self.deliveries else None

    @property
    def end_to_end_s(self) -> float | None:
        return self.finished_at - self.admitted_at if self.finished_at is not None else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after the first (as GenerationStats counts)."""
        if len(self.tokens) < 2 or len(self.deliveries) < 2:
            return None
        span = self.deliveries[-1][0] - self.deliveries[0][0]
        return (len(self.tokens) - 1) / span if span > 0 else None

    def inter_token_gaps(self) -> list[float]:
        """Seconds per token after the first: a step that delivers m tokens after a gap g counts as m
        gaps of g/m, so a burst of accepted drafts is neither hidden nor counted as zero-latency."""
        gaps: list[float] = []
        for (t0, _), (t1, m) in zip(self.deliveries, self.deliveries[1:]):
            gaps += [(t1 - t0) / m] * m
        return gaps


@dataclass(eq=False)
class Job:
    """One request: what to answer, and where its output goes. on_delta and on_done run on the thread
    that pumps the batch, so they must be quick (hand the data to another thread's queue). Make one with
    job_for, which seeds it by the one rule."""

    id: str
    prompt: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    ignore_eos: bool = False
    stop: Sequence[str] = ()
    seeds: tuple[int, int] = (0, 0)  # the verifier's and the draft's random streams
    prediction: Sequence[int] = ()  # the answer as the client predicts it, as tokens (OpenAI's Predicted Outputs)
    cancel: threading.Event = field(default_factory=threading.Event)
    on_delta: Callable[[Job, Delta], None] | None = None
    on_done: Callable[[Job], None] | None = None
    run: RequestRun | None = None  # set when admitted
    error: str | None = None  # set when it could not be served

    @property
    def finish_reason(self) -> str | None:
        return "error" if self.error else (self.run.stats.finish_reason if self.run else None)


def job_for(
    job_id: str,
    prompt: Sequence[int],
    sampling: SamplingParams,
    max_tokens: int,
    ignore_eos: bool = False,
    index: int = 0,
    *,
    stop: Sequence[str] = (),
    cancel: threading.Event | None = None,
    on_delta: Callable[[Job, Delta], None] | None = None,
    on_done: Callable[[Job], None] | None = None,
    prediction: Sequence[int] = (),
) -> Job:
    """The Job of one request: request `index` of a run (0 for a lone request; the lab numbers its list). The seed
    rule: its verifier and draft streams are stream_seeds(request_seed(sampling), index), the user's seed or a fresh
    random one, so a seed gives one answer whichever path (chat, bench, lab, server) runs it."""
    return Job(
        job_id,
        list(prompt),
        sampling,
        max_tokens,
        ignore_eos,
        stop,
        seeds=stream_seeds(request_seed(sampling), index),
        cancel=cancel if cancel is not None else threading.Event(),
        on_delta=on_delta,
        on_done=on_done,
        prediction=prediction,
    )
