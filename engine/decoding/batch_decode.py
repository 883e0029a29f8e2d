"""A fixed list of requests through one Batch (batch.py), pumped by the one loop (pump.py), as the lab measures them.

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

from .batch import Batch
from .jobs import Job, RequestRun, job_for
from .proposers.base import NoProposer, Proposer
from .pump import run_jobs
from .runtime import Model
from .sampling import SamplingParams, pick_device
from .speculation_config import SpeculationConfig
from .step import StepTotals
from .step_costs import StepCosts


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
        # Request i of the list has the streams of index i (jobs.py's seed rule); a filler goes on counting.
        jobs = [job_for(r.id, r.prompt, sampling, max_tokens, ignore_eos, i) for i, r in enumerate(requests)]
        for job in jobs:
            batch.submit(job)
        batch.loop.calibrate(0, 0, max(target.bos, 0), sequences=concurrency)  # before the clock
        batch.loop.totals = StepTotals()
        started = time.perf_counter()
        fillers: list[Job] = []

        def answered() -> bool:
            return all(j.run is not None and j.run.finished_at is not None for j in jobs)

        def step_done() -> None:
            if keep_full and not answered():  # slots that freed take the same requests again, in turn
                for _ in range(concurrency - len(batch.active) - len(batch.waiting)):
                    i = len(jobs) + len(fillers)
                    request = requests[i % len(requests)]
                    fillers.append(job_for(f"{request.id}+{i}", request.prompt, sampling, max_tokens, ignore_eos, i))
                    batch.submit(fillers[-1])
            if on_progress:
                on_progress(progress(jobs, batch, started))

        run_jobs(batch, cancel, on_step=step_done, done=answered)
        fill_runs = [j.run for j in fillers if j.run is not None]
        return BatchResult([_run_of(j) for j in jobs], batch.loop.totals, started, time.perf_counter(), fill_runs)


def _run_of(job: Job) -> RequestRun:
    assert job.run is not None  # run_jobs admits or fails every job: each has its run
    return job.run


def progress(jobs: list[Job], batch: Batch, started: float) -> BatchProgress:
    """How far a run has come: its requests answered, their tokens, the sequences decoding now."""
    runs = [j.run for j in jobs if j.run is not None]
    done = sum(1 for r in runs if r.finished_at is not None)
    generated = sum(len(r.tokens) for r in runs)
    return BatchProgress(done, len(jobs), generated, len(batch.active), time.perf_counter() - started)
