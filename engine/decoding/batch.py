"""Sequences sharing one target context (llama.cpp sequence ids), on the one step loop. Jobs join and
leave at any step: the lab fills it from a fixed list, the server from its clients.

The one loop (pump.py) turns it: admit() drops cancelled jobs and prefills about one chunk of prompt (the job being
admitted goes on, else waiting ones take a free sequence id; after a prompt's last piece, its first token); step()
ends the longest sequence if the shared cache is full, then runs one StepLoop.step over every active sequence and
hands each job its output. So a long prompt delays the others' next token by one chunk, not by its whole prefill,
and a job cancelled while it is prefilled frees its id within one. Which sequence id a job gets, and which caches
outlive their jobs, is kv_slots.py's policy.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import ContextOverflowError, EngineError, GenerationCancelled, InvalidSettingError
from ..hardware import read_memory
from .answer import AnswerStream, Delta
from .jobs import Job, RequestRun
from .kv_slots import KvSlots
from .proposers.base import Proposer
from .runtime import Model
from .sampling import pick_device
from .speculation_config import SpeculationConfig
from .stats import GenerationStats
from .step import SequenceState, StepLoop
from .step_costs import StepCosts
from .verifier import Verifier

# Prompt tokens prefilled per pump while other sequences decode (llama-server and vLLM interleave the same way).
# Measured here (2 cores, SmolLM2 135M): a 128-token piece took 0.4-0.5 s at the start of a 3,000-token prompt
# and 0.8-1.0 s at its end (attention spans more cells), a one-row step ~10 ms; a 3,000-token prompt ran at
# 175-205 tok/s in pieces of 128, 150-180 in pieces of 64 and 115-215 in pieces of 512. So 128: a quarter of
# 512's stall (~1 s at most, docs/server.md "Fairness"), at no cost in prefill speed.
PREFILL_CHUNK = 128
# llama.cpp's CPU kernels compute a row differently in a batch of fewer than 64 rows, and Gemma's repacked GEMM
# takes rows 4 at a time (measured: a prompt's last logits moved by up to ~0.8 when its last piece was shorter
# than 64 rows or began off a multiple of 4, and not at all otherwise). Pieces of at least this many rows, each
# starting a multiple of 16 rows into Model.prefill's n_batch chunks, leave every row as those chunks compute it:
# the chunk size changes no token.
MIN_PIECE = 64
MEMORY_EVERY_S = 0.5  # a memory reading costs a syscall (or an NVML call): not every step


@dataclass
class _Sequence(SequenceState):
    job: Job = field(kw_only=True)
    answer: AnswerStream = field(kw_only=True)
    proposing: bool = False  # the proposer has started on it (after its first token is out)
    memory_read_at: float = 0.0


@dataclass
class _Filling:
    """A job being admitted: its prompt's tokens from `reused` on are prefilled a piece per pump."""

    job: Job
    slot: int
    reused: int
    done: int = 0  # of the tokens after `reused`


def prefill_piece(done: int, total: int, chunk: int, block: int) -> int:
    """How many rows of a prompt to decode next, `done` of `total` decoded: about `chunk` at most, never across
    Model.prefill's `block`-row chunks, every piece but a block's last a multiple of 16, and none shorter than
    MIN_PIECE where its block is longer (see MIN_PIECE). A chunk of a block or more gives Model.prefill's chunks."""
    left = min(total, (done // block + 1) * block) - done  # to the end of this block
    if left <= chunk:
        return left
    piece = max(MIN_PIECE, chunk // 16 * 16)
    if left - piece < MIN_PIECE:  # leave the block's last piece MIN_PIECE rows at least
        piece = (left - MIN_PIECE) // 16 * 16
    return piece if piece >= MIN_PIECE else left


class Batch:
    """Jobs through one target context and one StepLoop: the one driver of decoding, turned by the one loop
    (pump.py). The chat is one slot that keeps its cache and reuses its prompt's logits on Regenerate
    (generate.py), the server many slots fed from its clients (serving/scheduler.py), the lab a fixed list
    (batch_decode.py). Not thread-safe: one thread pumps it."""

    def __init__(
        self,
        loop: StepLoop,
        slots: int,
        keep_caches: bool = False,
        prefill_chunk: int = PREFILL_CHUNK,
        reuse_prompt_logits: bool = False,
    ):
        target = loop.target
        if not 1 <= slots <= target.settings.n_seq_max:
            raise InvalidSettingError(
                f"slots must be 1..{target.settings.n_seq_max} (the context's sequences), got {slots!r}"
            )
        self.loop, self.target, self.slots = loop, target, slots
        self.kv = KvSlots(target, slots, keep_caches, reuse_prompt_logits)  # who gets which id, which caches stay
        self.waiting: deque[Job] = deque()
        self.active: list[_Sequence] = []
        self.filling: _Filling | None = None  # the job being prefilled: neither waiting nor active
        self.prefill_chunk = prefill_chunk  # prompt tokens per pump (a huge one: whole prompts, as before issue 51)

    @classmethod
    def build(
        cls,
        target: Model,
        proposer: Proposer | None,
        speculation: SpeculationConfig,
        slots: int,
        device: torch.device | None = None,
        step_costs: StepCosts | None = None,
        tune_threads: bool = True,
        **options: Any,
    ) -> Batch:
        """A batch on a new StepLoop: the one place outside the research tools that makes a step loop."""
        loop = StepLoop(target, proposer, speculation, device or pick_device(), step_costs, tune_threads=tune_threads)
        return cls(loop, slots, **options)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active and self.filling is None

    @property
    def running(self) -> int:
        return len(self.active) + (self.filling is not None)

    @property
    def running_jobs(self) -> list[Job]:
        return [s.job for s in self.active] + ([self.filling.job] if self.filling else [])

    def check(self, job: Job) -> None:
        """Raise for a job that can never be served, before it waits in line."""
        if not job.prompt:
            raise InvalidSettingError(f"request {job.id}: the prompt is empty")
        if len(job.prompt) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"request {job.id}: a {len(job.prompt)}-token prompt does not fit the "
                f"{self.target.n_ctx}-token context, with room for an answer"
            )
        if not (isinstance(job.max_tokens, int) and job.max_tokens >= 1):
            raise InvalidSettingError(f"max_tokens must be a whole number ≥ 1, got {job.max_tokens!r}")

    def submit(self, job: Job) -> None:
        self.check(job)
        self.waiting.append(job)

    def pump(self) -> None:
        """One turn of the loop (pump.py) at once, for a caller that steps the batch by hand."""
        self.admit()
        self.step()

    def admit(self) -> None:
        """End what was cancelled, then prefill about one chunk of what fits (a job whose prompt is done gives its
        first token). The chat hands that token on before the step that follows."""
        for job in [j for j in self.waiting if j.cancel.is_set()]:
            self.waiting.remove(job)
            self._fail(job, None)
        for seq in [s for s in self.active if s.job.cancel.is_set()]:
            self._end(seq, "cancelled")
        if self.filling and self.filling.job.cancel.is_set():
            self._drop_filling(None)
        self._prefill()

    def step(self) -> None:
        """One step for every active sequence, their proposers started first where not yet."""
        self._make_room()
        if not self.active:
            return
        for seq in self.active:  # only now, so a first token never waits for the proposer
            if not seq.proposing:
                job = seq.job
                self.loop.drafting.begin(
                    seq.slot, job.prompt, job.sampling, self.loop.device, job.seeds[1], prediction=job.prediction
                )
                seq.proposing = True
        stepping = list(self.active)
        started = time.perf_counter()
        try:
            outcomes = self.loop.step(stepping, [s.answer.tokens_left for s in stepping])
        except GenerationCancelled:  # Stop arrived mid-verify (the chat's interrupt): every cache is as before
            return
        now = time.perf_counter()
        delivered = 0
        for seq, outcome in zip(stepping, outcomes):
            delta = seq.answer.push(outcome.tokens, outcome.accepted, outcome.source)
            delivered += len(delta.tokens)
            self._emit(seq, delta, now)
        if len(stepping) == self.slots:
            self.loop.totals.full_s += now - started
            self.loop.totals.full_tokens += delivered

    def cancel_all(self, reason: str = "cancelled") -> None:
        """End every job now, waiting or running."""
        while self.waiting:
            self._fail(self.waiting.popleft(), None)
        if self.filling:
            self._drop_filling(self.filling.job.error)
        for seq in list(self.active):
            self._end(seq, reason)

    # --- the cache's cells ------------------------------------------------------------------------
    def _free_cells(self) -> int:
        # The job being prefilled has its whole prompt's cells set aside: the active ones must not grow into them.
        self.loop.held_cells = self.kv.held_cells + (len(self.filling.job.prompt) if self.filling else 0)
        return self.loop.free_cells(self.active)

    def _make_room(self) -> None:
        """Kept caches give way while the active sequences lack room to speculate in full. Then every
        sequence needs a cell for its next token: when they do not all fit, the one holding the most of
        the cache ends, as a lone sequence ends when it fills the context."""
        self._release_caches(len(self.active) * (self.loop.speculation.max_draft + 1))
        while self.active and self._free_cells() < len(self.active):
            self._end(max(self.active, key=lambda s: len(s.history)), "context")

    def _fits(self, prompt: list[int]) -> bool:
        """Room in the shared cache for the prompt and one row for every sequence's next step; kept
        caches give way first, the least recently used first."""
        need = len(prompt) + len(self.active) + 1
        self._release_caches(need)
        return not self.active or self._free_cells() >= need

    def _release_caches(self, cells: int) -> None:
        """Drop kept caches, the least recently used first, until `cells` cells are free (or none is kept)."""
        while self.kv.cached and self._free_cells() < cells:
            self.kv.drop_oldest()

    # --- a job's life -----------------------------------------------------------------------------
    def _prefill(self) -> None:
        """Prefill about prefill_chunk prompt tokens: the job being admitted goes on, and once it is active the
        next waiting job that fits takes a free sequence id. A piece is decoded whole, so one more than the chunk
        leaves waits for the next pump (unless nothing was decoded in this one)."""
        spent = 0
        while True:
            if self.filling is None:
                if not (self.waiting and self.kv.free and self._fits(self.waiting[0].prompt)):
                    return
                self._start_filling(self.waiting.popleft())
                continue
            fill = self.filling
            total = len(fill.job.prompt) - fill.reused
            piece = prefill_piece(fill.done, total, self.prefill_chunk, self.target.n_batch)
            if spent and spent + piece > self.prefill_chunk:
                return
            spent += piece
            self._prefill_piece(fill, piece)

    def _start_filling(self, job: Job) -> None:
        """Give a job a free sequence id (with what its cache holds of the prompt); its prefill starts."""
        target, loop = self.target, self.loop
        slot, reused, known = self.kv.claim(job.prompt)
        stats = GenerationStats(
            method=loop.method,
            backend=target.backend,
            prompt_tokens=len(job.prompt),
            reused_prompt_tokens=reused,
            draft_model_bytes=loop.draft_model_bytes,
            by_proposer={name: {"drafted": 0, "accepted": 0, "steps": 0} for name in loop.sources_for(job)},
        )
        job.run = RequestRun(job.id, slot, [], stats, admitted_at=time.perf_counter())
        self.filling = _Filling(job, slot, reused)
        try:
            target.forget_from(reused, slot)
        except EngineError as exc:
            self._drop_filling(str(exc))
            return
        if known is not None:  # Regenerate: the prompt's cells and logits are there already
            self._prompt_done(self.filling, known)

    def _prefill_piece(self, fill: _Filling, rows: int) -> None:
        """Decode the next `rows` of the prompt; after the last, the job's first token."""
        job, start = fill.job, fill.reused + fill.done
        last = start + rows == len(job.prompt)
        started = time.perf_counter()
        try:
            logits = self.target.decode(job.prompt[start : start + rows], start, 1 if last else 0, seq_id=fill.slot)
            fill.done += rows
            if last:
                self.kv.keep_prompt_logits(fill.slot, job.prompt, logits)
        except GenerationCancelled:
            self._drop_filling(None)
            return
        except EngineError as exc:
            self._drop_filling(str(exc))
            return
        finally:
            self.loop.totals.prefill_s += time.perf_counter() - started  # the target's own time, not the wait
        if last:
            self._prompt_done(fill, logits)

    def _prompt_done(self, fill: _Filling, logits: np.ndarray) -> None:
        """The prompt is in the cache: its first token from its logits, and the job joins the active ones."""
        job = fill.job
        verifier = Verifier(job.sampling, self.loop.device, job.seeds[0])
        first = verifier.verify(logits, [], None, position=len(job.prompt)).next_token
        self.filling = None
        self._activate(job, fill.slot, verifier, first)

    def _activate(self, job: Job, slot: int, verifier: Verifier, first: int) -> None:
        """A prefilled job joins the active sequences with its first token; its proposer starts at its first step."""
        run = job.run
        assert run is not None  # set when it was admitted (_start_filling)
        now, stats = time.perf_counter(), run.stats
        stats.prefill_s = stats.ttft_s = now - run.admitted_at  # other sequences' steps included: a wait
        seq = _Sequence(
            slot,
            [*job.prompt, first],
            verifier,
            stats,
            stops_at_end=not job.ignore_eos,
            job=job,
            answer=AnswerStream(self.target, job.max_tokens, job.ignore_eos, job.stop),
        )
        run.tokens = seq.answer.tokens  # the run's tokens are the answer's, as it grows
        self.active.append(seq)
        self._emit(seq, seq.answer.push([first]), now)

    def _drop_filling(self, error: str | None) -> None:
        """End the job being prefilled (cancelled, or failed): its sequence id is free again, its new cells gone. A
        cancelled prompt leaves the cache it continued (a recurrent state, cut part-way, cannot)."""
        fill, self.filling = self.filling, None
        assert fill is not None  # only while a job is being prefilled
        self.kv.release(fill.slot, fill.job.prompt, fill.reused if error is None and self.target.can_roll_back else 0)
        self._fail(fill.job, error)

    def _emit(self, seq: _Sequence, delta: Delta, now: float) -> None:
        """Hand on what the answer kept of a step; end the sequence when the answer is done."""
        run, answer = seq.job.run, seq.answer
        assert run is not None  # an active job was admitted
        if delta.tokens:
            stats = run.stats
            run.deliveries.append((now, len(delta.tokens)))
            stats.generated = len(answer.tokens)
            assert run.first_token_at is not None  # a delivery was just recorded
            stats.decode_s = now - run.first_token_at
            if stats.decode_tokens_per_s:  # the live rate's history
                stats.rate_history.append((now - run.admitted_at, stats.decode_tokens_per_s))
            if now - seq.memory_read_at > MEMORY_EVERY_S:  # live, for the stats line
                stats.memory, seq.memory_read_at = read_memory(self.target.backend), now
        if answer.finish is None and len(seq.job.prompt) + len(answer.tokens) >= self.target.n_ctx:
            delta.segments += answer.end("context").segments
        if (delta.tokens or delta.segments) and seq.job.on_delta:
            seq.job.on_delta(seq.job, delta)
        if answer.finish:
            self._end(seq, answer.finish)

    def _end(self, seq: _Sequence, reason: str) -> None:
        job, answer = seq.job, seq.answer
        if answer.finish is None:
            tail = answer.end(reason)
            if tail.segments and job.on_delta:
                job.on_delta(job, tail)
        run = job.run
        assert run is not None  # an active job was admitted
        run.finished_at = time.perf_counter()
        run.stats.finish_reason = answer.finish
        run.stats.memory = read_memory(self.target.backend)  # the final reading, as the answer ends
        history = [*job.prompt, *answer.tokens]  # what was really produced
        self.active.remove(seq)
        self.loop.drafting.finish(seq.slot, history)
        self.kv.release(seq.slot, history, len(seq.history) - 1)  # the KV convention: its last token is not in it
        if job.on_done:
            job.on_done(job)

    def _fail(self, job: Job, error: str | None) -> None:
        """A job that ends without running: cancelled while waiting (error None), or refused."""
        job.error = error
        if job.run is None:
            stats = GenerationStats(method=self.loop.method, backend=self.target.backend, prompt_tokens=len(job.prompt))
            job.run = RequestRun(job.id, -1, [], stats, admitted_at=time.perf_counter())
        job.run.finished_at = time.perf_counter()
        job.run.stats.finish_reason = "error" if error else "cancelled"
        if job.on_done:
            job.on_done(job)
