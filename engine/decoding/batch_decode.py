"""A fixed list of requests through one Batch (batch.py), as the lab measures them.

Requests wait in order; up to `concurrency` are in flight, and a finished one hands its sequence id
to the next, as a server with continuous batching would. Every step is StepLoop.step over all of
them: one batch, one cost model deciding each sequence's draft rows. With keep_full, slots that free
once nothing waits take fillers (the same requests again, in turn) until the last request is answered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .batch import Batch, Job, RequestRun, run_jobs
from .cost_model import SpeculationConfig, StepCosts
from .proposers.base import NoProposer, Proposer
from .runtime import Model
from .sampling import SamplingParams, pick_device, request_seed, stream_seeds
from .step import StepTotals


# --- requests and what became of them ---------------------------------------------------------
@dataclass(frozen=True)
class BatchRequest:
    id: str
    prompt: list[int]


@dataclass(frozen=True)
class BatchProgress:
    finished: int
    total: int
    generated: int
    active: int
    elapsed_s: float


@dataclass
class BatchResult:
    runs: list[RequestRun]  # the requests', in order
    totals: StepTotals
    started_at: float
    finished_at: float
    fillers: list[RequestRun] = field(default_factory=list)  # what kept the slots busy (keep_full)

    @property
    def wall_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def generated(self) -> int:
        return sum(len(r.tokens) for r in self.runs)

    @property
    def filler_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.fillers)


# --- the decoder --------------------------------------------------------------------------------
class BatchDecoder:
    """Decodes a fixed list of requests through one target context, as the lab measures it."""

    def __init__(
        self,
        target: Model,
        proposer: Proposer | None = None,
        speculation: SpeculationConfig | None = None,
        device: torch.device | None = None,
    ):
        self.target = target
        self.proposer = proposer or NoProposer()
        self.speculation = speculation or SpeculationConfig()
        self.device = device or pick_device()
        self.step_costs = StepCosts()  # the machine's, kept across runs (a lab's cells)

    def run(
        self,
        requests: Sequence[BatchRequest],
        concurrency: int,
        sampling: SamplingParams = SamplingParams(),
        max_tokens: int = 128,
        ignore_eos: bool = False,
        cancel: threading.Event | None = None,
        on_progress: Callable[[BatchProgress], None] | None = None,
        keep_full: bool = False,
    ) -> BatchResult:
        """Serve every request with at most `concurrency` in flight; raises GenerationCancelled on cancel.
        keep_full: `concurrency` stay in flight to the end. A fixed list otherwise ends with its slowest answers
        decoding with fewer beside them (at 4 requests on 4 slots, lookup's copies ended first and its level ran
        2.2 sequences on average), which a busy server, its queue refilling every slot, never does."""
        target = self.target
        target.forget_all()
        batch = Batch.build(target, self.proposer, self.speculation, concurrency, self.device, self.step_costs)
        loop = batch.loop
        seed = request_seed(sampling)  # reproducible with a seed; each request gets streams of its own
        jobs = [
            Job(r.id, list(r.prompt), sampling, max_tokens, ignore_eos, seeds=stream_seeds(seed, i))
            for i, r in enumerate(requests)
        ]
        for job in jobs:
            batch.submit(job)
        loop.calibrate(0, 0, max(target.bos, 0), sequences=concurrency)  # before the clock
        loop.totals = StepTotals()
        started = time.perf_counter()

        def report() -> None:
            if on_progress:
                runs = [j.run for j in jobs if j.run is not None]
                done = sum(1 for r in runs if r.finished_at is not None)
                on_progress(
                    BatchProgress(
                        done,
                        len(jobs),
                        sum(len(r.tokens) for r in runs),
                        len(batch.active),
                        time.perf_counter() - started,
                    )
                )

        fillers: list[Job] = []

        def answered() -> bool:
            return all(j.run is not None and j.run.finished_at is not None for j in jobs)

        def step_done() -> None:
            if keep_full and not answered():
                refill(concurrency - len(batch.active) - len(batch.waiting))
            report()

        def refill(free: int) -> None:
            for _ in range(free):
                i = len(jobs) + len(fillers)
                request = requests[i % len(requests)]
                fillers.append(
                    Job(
                        f"{request.id}+{i}",
                        list(request.prompt),
                        sampling,
                        max_tokens,
                        ignore_eos,
                        seeds=stream_seeds(seed, i),
                    )
                )
                batch.submit(fillers[-1])

        run_jobs(batch, cancel, on_step=step_done, done=answered)
        return BatchResult(
            [j.run for j in jobs],
            loop.totals,
            started,
            time.perf_counter(),
            [j.run for j in fillers if j.run is not None],
        )
