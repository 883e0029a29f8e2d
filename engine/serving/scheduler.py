"""The engine thread a server (and the window's chat, while serving) shares: one Batch, pumped by the one loop
(decoding/pump.py) while it has work, fed from any thread. Up to `parallel` jobs decode together; up to
`max_queue` more wait in line, and beyond that submit() refuses (the server answers 429). The step loop's cost
model decides per step how many draft rows each sequence verifies, so speculation steps back by itself as the batch
fills. A long prompt is prefilled a chunk per pump (batch.py): the other streams go on between its chunks, and a
request cancelled in its prefill frees its slot within one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..decoding.batch import Batch
from ..decoding.jobs import Job
from ..decoding.proposers.base import Proposer
from ..decoding.pump import pump
from ..decoding.runtime import Model
from ..decoding.speculation_config import SpeculationConfig
from ..decoding.step_costs import StepCosts
from ..errors import EngineError

log = logging.getLogger(__name__)


# What a job still running when the server stops is told (its client, or the window's chat, keeps what came).
SERVER_STOPPED = "The server was stopped mid-answer; the answer so far is kept."


class QueueFull(EngineError):
    """Every slot is busy and the waiting line is full: try again shortly."""


class ServerStopping(EngineError):
    """The server is stopping: it takes no new job."""


@dataclass(frozen=True)
class Load:
    running: int
    waiting: int
    parallel: int


class Scheduler:
    """Owns the target while it runs: nothing else may decode with it until stop()."""

    def __init__(
        self,
        target: Model,
        proposer: Proposer | None,
        speculation: SpeculationConfig,
        parallel: int,
        max_queue: int = 32,
        device: torch.device | None = None,
        step_costs: StepCosts | None = None,
    ):
        # No thread tuner here: its trials compare a few steps before and after a switch, and a server's
        # steps change with every request that joins or leaves (measured: it kept 1 thread, steps ~2x slower).
        # keep_caches: a conversation's next turn reuses its cache.
        self.batch = Batch.build(
            target, proposer, speculation, parallel, device, step_costs, tune_threads=False, keep_caches=True
        )
        self.loop = self.batch.loop
        self.parallel, self.max_queue = parallel, max_queue
        self._inbox: list[Job] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._ready = threading.Event()
        self._serving: threading.Thread | None = None  # the thread in serve(), once it runs
        self._ended = threading.Event()  # serve() has ended every job
        self._thread = threading.Thread(target=self.serve, name="specchat-engine", daemon=True)

    @property
    def target(self) -> Model:
        return self.loop.target

    @property
    def method(self) -> str:
        return self.loop.method

    def start(self) -> Scheduler:
        """Serve on a thread of its own; returns once it has timed every verify size (a few seconds for a
        wide batch on a CPU)."""
        self._thread.start()
        self._ready.wait()
        return self

    def load(self) -> Load:
        with self._wake:
            return Load(self.batch.running, len(self.batch.waiting) + len(self._inbox), self.parallel)

    def submit(self, job: Job) -> Job:
        """Queue a job (from any thread). Raises for a job that can never run, or QueueFull."""
        self.batch.check(job)
        with self._wake:
            if self._stopping:
                raise ServerStopping("the server is stopping")
            busy = self.batch.running + len(self.batch.waiting) + len(self._inbox)
            if busy >= self.parallel + self.max_queue:
                raise QueueFull(f"all {self.parallel} slots are busy and {self.max_queue} requests are waiting")
            self._inbox.append(job)
            self._wake.notify()
        return job

    def cancel(self, job: Job) -> None:
        """End a job at the next step (from any thread): its slot is free for the next one."""
        job.cancel.set()
        with self._wake:
            self._wake.notify()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self, timeout: float = 30.0) -> None:
        """End every job and the engine loop; the target is the caller's again afterwards. Returns once serve() has
        ended the jobs (whichever thread runs it), so what they are told reaches their clients while the HTTP side
        still runs: stopped the other way round, streams were cut mid-chunk and their callbacks met a closed loop."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        me = threading.current_thread()
        if self._thread.is_alive() and self._thread is not me:
            self._thread.join(timeout)
        elif self._serving is not None and self._serving is not me:
            self._ended.wait(timeout)

    def serve(self, on_ready: Callable[[], None] | None = None, timed_only: bool = False) -> None:
        """The engine loop, on the calling thread, until stop(). Every decode of the target happens on this
        one thread, calibration included: llama.cpp's OpenMP threads belong to the thread that calls it, and
        while another thread that decoded before is alive, a decode from a new one ran 15 ms instead of 5.6
        (measured, SmolLM2, 1 row; the other thread's team keeps a core). So the app's worker calls this
        itself rather than handing the model to a thread of ours. timed_only: no step is timed before serving
        (the window's chat timed its sizes already; see StepLoop.calibrate), so no request waits on it."""
        self._serving = threading.current_thread()
        try:
            self.loop.calibrate(0, 0, max(self.target.bos, 0), sequences=self.parallel, timed_only=timed_only)
            self._ready.set()
            if on_ready is not None:  # (the window says "serving" from here: requests are answered at once)
                on_ready()
            self._pump_until_stopped()
        finally:
            try:
                self._end_jobs()
            finally:
                self._ended.set()  # stop() waits on it, whatever happened

    def _pump_until_stopped(self) -> None:
        for _ in pump(self.batch, self._take_inbox, self._fail_running):
            pass

    def _take_inbox(self, batch: Batch) -> bool:
        """The loop's feed: wait for work, then hand the batch what came in; False once stopping."""
        with self._wake:
            while not self._stopping and not self._inbox and batch.idle:
                self._wake.wait()
            if self._stopping:
                return False
            inbox, self._inbox = self._inbox, []
            for job in inbox:
                batch.waiting.append(job)  # checked by submit
        return True

    def _fail_running(self, exc: Exception) -> None:
        """A failed step ends its jobs, never the server."""
        log.exception("a batch step failed")
        for job in self.batch.running_jobs:  # the one being prefilled included
            job.error = f"the engine failed: {exc}"
        self.batch.cancel_all("error")

    def _end_jobs(self) -> None:
        """Every job left ends: one mid-answer is told the server stopped (its text so far stands), one still
        waiting ends cancelled (the API words that the same way: openai_api's _ended_by_server)."""
        batch = self.batch
        with self._wake:
            for job in self._inbox:
                batch.waiting.append(job)
            self._inbox = []
        for job in batch.running_jobs:
            job.error = job.error or SERVER_STOPPED
        batch.cancel_all("error")
        batch.kv.forget()
