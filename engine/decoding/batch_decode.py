"""Several requests through one target context (llama.cpp sequence ids), on the one step loop.

Requests wait in a queue; up to `concurrency` are in flight, and a finished one hands its slot
(sequence id) to the next, as a server with continuous batching would. Every step is StepLoop.step
over all of them: one batch, one cost model deciding each sequence's draft rows.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..errors import EngineError, GenerationCancelled, InvalidSettingError
from .cost_model import SpeculationConfig, StepCosts
from .proposers.base import NoProposer, Proposer
from .runtime import Model
from .sampling import SamplingParams, pick_device, request_seed
from .stats import GenerationStats
from .step import SequenceState, StepLoop, StepTotals, tokens_to_keep
from .verifier import Verifier


# --- requests and what became of them ---------------------------------------------------------
@dataclass(frozen=True)
class BatchRequest:
    id: str
    prompt: list[int]


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


@dataclass
class BatchTotals(StepTotals):
    """What the target did across all sequences: the figures behind the cost model."""

    prefill_s: float = 0.0


@dataclass(frozen=True)
class BatchProgress:
    finished: int
    total: int
    generated: int
    active: int
    elapsed_s: float


@dataclass
class BatchResult:
    runs: list[RequestRun]
    totals: BatchTotals
    started_at: float
    finished_at: float

    @property
    def wall_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def generated(self) -> int:
        return sum(len(r.tokens) for r in self.runs)


VERIFY, DRAFT = 0, 1  # the random streams a request samples from


def stream_seed(seed: int, index: int, role: int) -> int:
    """The seed of one random stream: request `index` of a batch run with `seed`, for its verifier or its
    draft. Mixed (splitmix64 over a counter), so no two requests or roles share a stream, as seed + index
    for the verifier and + 1 for the draft did (request i's draft drew request i+1's verifier's numbers)."""
    x = (seed + (2 * index + role + 1) * 0x9E3779B97F4A7C15) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) % (2**63 - 1)


# --- the decoder --------------------------------------------------------------------------------
@dataclass
class _Sequence(SequenceState):
    run: RequestRun | None = None


class BatchDecoder:
    """Decodes many requests through one target context. Not thread-safe: one worker drives it."""

    def __init__(self, target: Model, proposer: Proposer | None = None,
                 speculation: SpeculationConfig | None = None, device: torch.device | None = None):
        self.target = target
        self.proposer = proposer or NoProposer()
        self.speculation = speculation or SpeculationConfig()
        self.device = device or pick_device()
        self.step_costs = StepCosts()  # the machine's, kept across runs (a lab's cells)

    def run(self, requests: Sequence[BatchRequest], concurrency: int, sampling: SamplingParams = SamplingParams(),
            max_tokens: int = 128, ignore_eos: bool = False, cancel: threading.Event | None = None,
            on_progress: Callable[[BatchProgress], None] | None = None) -> BatchResult:
        """Serve every request with at most `concurrency` in flight; raises GenerationCancelled on cancel."""
        target = self.target
        slots_available = target.settings.n_seq_max
        if not 1 <= concurrency <= slots_available:
            raise InvalidSettingError(f"concurrency must be 1..{slots_available} (the context's sequences), "
                                      f"got {concurrency!r}")
        if not (isinstance(max_tokens, int) and max_tokens >= 1):
            raise InvalidSettingError(f"max_tokens must be a whole number ≥ 1, got {max_tokens!r}")
        cancel = cancel or threading.Event()
        target.forget_all()
        loop = StepLoop(target, self.proposer, self.speculation, self.device, self.step_costs)
        loop.calibrate(0, 0, max(target.bos, 0), max_rows=concurrency * (self.speculation.max_draft + 1))  # before the clock
        totals = loop.totals = BatchTotals()
        queue = list(enumerate(requests))[::-1]
        free_slots = list(range(concurrency))[::-1]
        active: list[_Sequence] = []
        runs: list[RequestRun | None] = [None] * len(requests)
        started = time.perf_counter()
        seed = request_seed(sampling)  # reproducible with a seed; each request gets streams of its own

        def report() -> None:
            if on_progress:
                done = sum(1 for r in runs if r is not None and r.finished_at is not None)
                generated = sum(len(r.tokens) for r in runs if r is not None)
                on_progress(BatchProgress(done, len(requests), generated, len(active),
                                          time.perf_counter() - started))

        def finish(seq: _Sequence, reason: str) -> None:
            seq.run.finished_at = time.perf_counter()
            seq.run.stats.finish_reason = reason
            target.forget_from(0, seq.slot)
            loop.proposer.finish(seq.slot, seq.history)
            free_slots.append(seq.slot)
            active.remove(seq)

        def emit(seq: _Sequence, new_tokens: list[int], now: float) -> None:
            """Keep what the step produced (cut at an end token or the budget); finish when done."""
            stats = seq.run.stats
            keep, reason = tokens_to_keep(new_tokens, target, ignore_eos, max_tokens - stats.generated)
            new_tokens = new_tokens[:keep]
            if new_tokens:
                seq.run.tokens += new_tokens
                seq.run.deliveries.append((now, len(new_tokens)))
                stats.generated += len(new_tokens)
                stats.decode_s = now - seq.run.first_token_at
            if reason is None and len(seq.history) >= target.n_ctx:
                reason = "context"
            if reason:
                finish(seq, reason)

        def fits(prompt: list[int]) -> bool:
            """Room in the shared cache for the prompt and one row for every sequence's next step."""
            return not active or len(prompt) + len(active) + 1 <= loop.free_cells(active)

        try:
            while queue or active:
                if cancel.is_set():
                    raise GenerationCancelled("stopped by the user")
                while queue and free_slots and fits(queue[-1][1].prompt):  # admit: prefill into a free id
                    index, request = queue.pop()
                    seq, first = self._admit(request, free_slots.pop(), sampling, stream_seed(seed, index, VERIFY),
                                             loop)
                    runs[index] = seq.run
                    active.append(seq)
                    now = time.perf_counter()
                    seq.run.stats.ttft_s = now - seq.run.admitted_at
                    seq.history.append(first)
                    emit(seq, [first], now)  # the first token obeys the same end/budget rules
                    if seq in active:  # only now, so the first token never waits for the proposer
                        loop.proposer.start(seq.slot, request.prompt, sampling, self.device,
                                            stream_seed(seed, index, DRAFT))
                # Every sequence needs a cell for its next token. When they do not all fit, the one holding
                # the most of the cache ends, as a lone sequence ends when it fills the context.
                while active and loop.free_cells(active) < len(active):
                    finish(max(active, key=lambda s: len(s.history)), "context")
                if active:
                    stepping = list(active)
                    outcomes = loop.step(stepping, [max_tokens - s.run.stats.generated for s in stepping])
                    now = time.perf_counter()
                    for seq, outcome in zip(stepping, outcomes):
                        emit(seq, outcome.tokens, now)
                report()
        except GenerationCancelled:
            for seq in list(active):
                finish(seq, "cancelled")
            raise
        return BatchResult([r for r in runs if r is not None], totals, started, time.perf_counter())

    def _admit(self, request: BatchRequest, slot: int, sampling: SamplingParams, seed: int,
               loop: StepLoop) -> tuple[_Sequence, int]:
        """Prefill a request into its sequence id; returns the sequence and its first token (the proposer
        starts after it is out). seed: the verifier's stream."""
        target = self.target
        if not request.prompt:
            raise InvalidSettingError(f"request {request.id}: the prompt is empty")
        if len(request.prompt) >= target.n_ctx:
            raise EngineError(f"request {request.id}: a {len(request.prompt)}-token prompt does not fit "
                              f"the {target.n_ctx}-token context")
        stats = GenerationStats(method=loop.method, backend=target.backend, prompt_tokens=len(request.prompt))
        run = RequestRun(request.id, slot, [], stats, admitted_at=time.perf_counter())
        target.forget_from(0, slot)
        logits = target.prefill(request.prompt, 0, seq_id=slot)
        verifier = Verifier(sampling, self.device, seed)
        first = verifier.verify(logits, [], None, position=len(request.prompt)).next_token
        stats.prefill_s = time.perf_counter() - run.admitted_at
        loop.totals.prefill_s += stats.prefill_s
        return _Sequence(slot, list(request.prompt), verifier, stats, run=run), first
