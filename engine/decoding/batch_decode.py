"""Several sequences in one target context, decoded together (llama.cpp sequence ids).

Each step builds ONE batch holding every active sequence's last token plus its drafts, decodes it
with logits on exactly those rows, verifies each sequence on its own rows, and rolls each
sequence's KV cache back on its own. KV convention as in generate.py: a sequence's last token is
not yet in the cache, so after a verdict the cache keeps positions < pos + 1 + accepted.

Requests wait in a queue; up to `concurrency` are in flight, and a finished one hands its slot
(sequence id) to the next, as a server with continuous batching would.
"""
from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .draft_policy import PLAIN_PROBE_EVERY, PROBE_EVERY, DraftLengthPolicy, SpeculationConfig
from ..errors import EngineError, GenerationCancelled, InvalidSettingError
from .proposers.base import NoProposer, Proposal, Proposer
from .proposers.draft_model import check_draft, stack_candidates
from .runtime import Model, common_prefix
from .sampling import (Candidates, SamplingParams, filter_logits, make_generator, pick_device, position_seed,
                       request_seed)
from .stats import GenerationStats
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
class BatchTotals:
    """What the target did across all sequences: the figures behind the cost model."""

    steps: int = 0
    rows: int = 0  # rows verified (last tokens + drafts)
    verify_s: float = 0.0  # time inside the target's batched decodes
    draft_s: float = 0.0  # time spent proposing, all sequences
    prefill_s: float = 0.0
    step_time_by_rows: dict[int, list[float]] = field(default_factory=dict)  # rows in a step -> [count, seconds]

    def record_step(self, rows: int, seconds: float) -> None:
        self.steps += 1
        self.rows += rows
        self.verify_s += seconds
        entry = self.step_time_by_rows.setdefault(rows, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds


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


# --- drafters: proposals for many sequences at once ---------------------------------------------
class SequenceDrafter:
    """A stateless proposer (none, prompt lookup) asked once per sequence."""

    def __init__(self, proposer: Proposer):
        self.proposer = proposer
        self.name = proposer.name
        self.free = proposer.free

    def start(self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device,
              seed: int) -> None:
        self.proposer.begin(prompt, sampling, device, seed)

    def propose(self, wants: list[tuple[int, Sequence[int], int]]) -> list[Proposal]:
        return [self.proposer.propose(history, k) for _, history, k in wants]

    def finish(self, slot: int) -> None:
        pass


@dataclass
class _DraftSlot:
    cached: list[int]
    sampling: SamplingParams
    device: torch.device
    seed: int  # the draft's own stream (stream_seed), still reproducible
    generator: torch.Generator


class BatchedDraftModel:
    """A draft model drafting for every sequence together: each draft position is one batched
    decode over the sequences still drafting, not one decode per sequence. Same rules as
    DraftModelProposer: catch up lazily on what the target kept, stop a sequence's draft when its
    confidence falls below p_min, keep q for the verifier when sampling."""

    name = "draft"
    free = False

    def __init__(self, draft: Model, target: Model, p_min: float = 0.75):
        check_draft(draft, target, p_min)
        self.model = draft
        self.p_min = p_min
        self._slots: dict[int, _DraftSlot] = {}

    def start(self, slot: int, prompt: Sequence[int], sampling: SamplingParams, device: torch.device,
              seed: int) -> None:
        self.model.forget_from(0, slot)
        # The prompt in one prefill, as the target processes it, so draft == target gives equal logits.
        self.model.prefill(prompt, 0, seq_id=slot)
        self._slots[slot] = _DraftSlot(list(prompt), sampling, device, seed, make_generator(seed, device))

    def finish(self, slot: int) -> None:
        self.model.forget_from(0, slot)
        self._slots.pop(slot, None)

    def propose(self, wants: list[tuple[int, Sequence[int], int]]) -> list[Proposal]:
        rows: list[tuple[int, int, int, bool]] = []  # (token, position, slot, wants logits)
        for slot, history, _ in wants:
            state = self._slots[slot]
            keep = min(common_prefix(state.cached, history), len(history) - 1)
            self.model.forget_from(keep, slot)
            state.cached = list(history)
            new = history[keep:]
            rows += [(t, keep + j, slot, j == len(new) - 1) for j, t in enumerate(new)]
        picks = self._decode_and_pick(rows)
        drafts: dict[int, list[int]] = {slot: [] for slot, _, _ in wants}
        q_rows: dict[int, list[Candidates]] = {slot: [] for slot, _, _ in wants}
        live = [(slot, k) for slot, _, k in wants if k > 0]
        while live:
            rows, still = [], []
            for slot, k in live:
                token, confidence, q = picks[slot]
                if confidence < self.p_min:
                    continue
                drafts[slot].append(token)
                if q is not None:
                    q_rows[slot].append(q)
                if len(drafts[slot]) == k:
                    continue
                state = self._slots[slot]
                rows.append((token, len(state.cached), slot, True))
                state.cached.append(token)
                still.append((slot, k))
            live = still
            if rows:
                picks = self._decode_and_pick(rows)
        return [Proposal(tokens=drafts[slot], probs=stack_candidates(q_rows[slot]) if q_rows[slot] else None)
                for slot, _, _ in wants]

    def _decode_and_pick(self, rows: list[tuple[int, int, int, bool]]) -> dict[int, tuple[int, float, Candidates | None]]:
        """Decode rows (in n_batch chunks); pick each sequence's next draft token from its logits row."""
        picks = {}
        n_batch = self.model.n_batch
        for begin in range(0, len(rows), n_batch):
            chunk = rows[begin:begin + n_batch]
            tokens, positions, slots, want = zip(*chunk)
            logits = self.model.decode_multi(tokens, positions, slots, want)
            wanted = [slot for slot, w in zip(slots, want) if w]
            for i, slot in enumerate(wanted):
                state = self._slots[slot]
                picks[slot] = self._pick(state, logits[i], position=len(state.cached))
        return picks

    @staticmethod
    def _pick(state: _DraftSlot, row: np.ndarray, position: int) -> tuple[int, float, Candidates | None]:
        """The draft token for sequence index `position`, its confidence, and q when sampling."""
        if state.sampling.greedy:
            token = int(row.argmax())
            return token, 1.0 / float(np.exp(row - row[token]).sum()), None
        q = filter_logits(torch.from_numpy(row).to(state.device).view(1, -1), state.sampling)
        state.generator.manual_seed(position_seed(state.seed, position))
        return q.sample(0, state.generator), float(q.probs[0].max()), q


# --- draft lengths for the whole batch ----------------------------------------------------------
def allocate_draft_rows(expected: list[list[float]], caps: list[int], base_rows: int,
                        step_seconds: Callable[[int], float], draft_seconds_per_token: float = 0.0) -> list[int]:
    """Draft lengths (one per sequence) that maximise expected tokens per second for the batch.

    expected[i][k] is sequence i's expected tokens from a step that verifies k of its drafts. A step
    costs step_seconds(total rows), shared by everyone, so a draft row is worth adding only where its
    expected gain beats what it slows the whole batch. Marginal gains within a sequence never grow
    (each is a product of acceptance probabilities), so adding rows best-gain-first gives the best
    split for every total; the total with the best rate wins.
    """
    k = [0] * len(expected)
    tokens = sum(e[0] for e in expected)
    best_rate, best = tokens / step_seconds(base_rows), list(k)
    heap = [(-(e[1] - e[0]), i) for i, e in enumerate(expected) if caps[i] > 0]
    heapq.heapify(heap)
    added = 0
    while heap:
        gain, i = heapq.heappop(heap)
        k[i] += 1
        added += 1
        tokens -= gain
        rate = tokens / (step_seconds(base_rows + added) + draft_seconds_per_token * added)
        if rate > best_rate:
            best_rate, best = rate, list(k)
        if k[i] < caps[i]:
            heapq.heappush(heap, (-(expected[i][k[i] + 1] - expected[i][k[i]]), i))
    return best


class BatchDraftPlanner:
    """Fixed mode: every sequence drafts up to max_draft. Adaptive mode: each sequence's measured
    per-slot acceptance and the batch's measured step time by total rows pick the lengths
    (allocate_draft_rows), so drafts are dropped exactly when the batch is better off without them."""

    def __init__(self, config: SpeculationConfig, costly_proposer: bool):
        self.config = config
        self.costly = costly_proposer
        # DraftLengthPolicy's estimators, reused: acceptance per sequence, step time for the batch.
        self._acceptance: dict[int, DraftLengthPolicy] = {}
        self._steps = DraftLengthPolicy(config, costly_proposer)
        self._draft_per_token: float | None = None
        self._steps_without_drafts = 0
        self._steps_with_drafts = 0

    def reset(self, slot: int) -> None:
        self._acceptance[slot] = DraftLengthPolicy(self.config, self.costly)

    def record_step(self, rows: int, drafted_rows: int, seconds: float) -> None:
        self._steps.record_step(rows, seconds)
        self._steps_without_drafts = 0 if drafted_rows else self._steps_without_drafts + 1
        self._steps_with_drafts = self._steps_with_drafts + 1 if drafted_rows else 0

    def record_acceptance(self, slot: int, drafted: int, accepted: int) -> None:
        self._acceptance[slot].record_acceptance(drafted, accepted)

    def record_draft(self, tokens: int, seconds: float) -> None:
        if tokens:
            per_token = seconds / tokens
            old = self._draft_per_token
            self._draft_per_token = per_token if old is None else 0.9 * old + 0.1 * per_token

    def plan(self, slots: list[int], caps: list[int]) -> list[int]:
        cfg = self.config
        if not cfg.adaptive:
            return [min(cfg.max_draft, c) for c in caps]
        if self._steps.step_seconds(len(slots)) is None:
            # Nothing measured yet: as in the chat, a free proposer starts plain and earns drafts in
            # the shadow; a costly one (a draft model someone chose) starts drafting.
            return [min(cfg.max_draft, c) if self.costly else 0 for c in caps]
        if self.costly and (not self._steps.measured(len(slots)) or self._steps_with_drafts >= PLAIN_PROBE_EVERY):
            return [0] * len(caps)  # measure the draft-free step that drafting is judged against
        expected = [self._acceptance[s].expected_tokens() for s in slots]
        draft_cost = (self._draft_per_token or 0.0) if self.costly else 0.0
        lengths = allocate_draft_rows(expected, caps, len(slots), self._steps.step_seconds, draft_cost)
        if not any(lengths) and self.costly and self._steps_without_drafts >= PROBE_EVERY:
            lengths = [min(cfg.min_draft, c) for c in caps]  # a short probe keeps acceptance current
        return lengths


# --- the decoder --------------------------------------------------------------------------------
@dataclass
class _Sequence:
    run: RequestRun
    history: list[int]
    verifier: Verifier
    shadow: list[int] = field(default_factory=list)  # a free proposal scored while not drafting
    shadow_hits: int = 0


class BatchDecoder:
    """Decodes many requests through one target context. Not thread-safe: one worker drives it."""

    def __init__(self, target: Model, drafter: SequenceDrafter | BatchedDraftModel | None = None,
                 speculation: SpeculationConfig | None = None, device: torch.device | None = None):
        self.target = target
        self.drafter = drafter or SequenceDrafter(NoProposer())
        self.speculation = speculation or SpeculationConfig()
        self.device = device or pick_device()

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
        speculating = self.drafter.name != "none" and self.speculation.max_draft > 0
        planner = BatchDraftPlanner(self.speculation, costly_proposer=not self.drafter.free)
        queue = list(enumerate(requests))[::-1]
        free_slots = list(range(concurrency))[::-1]
        active: list[_Sequence] = []
        runs: list[RequestRun | None] = [None] * len(requests)
        totals = BatchTotals()
        started = time.perf_counter()
        seed = request_seed(sampling)  # reproducible with a seed; each request gets streams of its own
        target.forget_all()

        def report() -> None:
            if on_progress:
                done = sum(1 for r in runs if r is not None and r.finished_at is not None)
                generated = sum(len(r.tokens) for r in runs if r is not None)
                on_progress(BatchProgress(done, len(requests), generated, len(active),
                                          time.perf_counter() - started))

        def finish(seq: _Sequence, reason: str) -> None:
            seq.run.finished_at = time.perf_counter()
            seq.run.stats.finish_reason = reason
            target.forget_from(0, seq.run.slot)
            self.drafter.finish(seq.run.slot)
            free_slots.append(seq.run.slot)
            active.remove(seq)

        def emit(seq: _Sequence, new_tokens: list[int], now: float) -> None:
            """Keep what the step produced (cut at an end token or the budget); finish when done."""
            stats, reason = seq.run.stats, None
            for i, tok in enumerate(new_tokens):
                if target.is_end(tok) and not ignore_eos:
                    new_tokens, reason = new_tokens[:i], "stop"
                    break
            budget = max_tokens - stats.generated
            if len(new_tokens) >= budget:
                new_tokens, reason = new_tokens[:budget], reason or "length"
            if new_tokens:
                seq.run.tokens += new_tokens
                seq.run.deliveries.append((now, len(new_tokens)))
                seq.history += new_tokens
                stats.generated += len(new_tokens)
                stats.decode_s = now - seq.run.first_token_at
            self._score_shadow(seq, new_tokens, planner)
            if reason is None and len(seq.history) >= target.n_ctx:
                reason = "context"
            if reason:
                finish(seq, reason)

        def fits(prompt: list[int]) -> bool:
            """Room in the shared cache for the prompt and one row for every sequence's next step."""
            return not active or len(prompt) + len(active) + 1 <= self._free_cells(active)

        try:
            while queue or active:
                if cancel.is_set():
                    raise GenerationCancelled("stopped by the user")
                while queue and free_slots and fits(queue[-1][1].prompt):  # admit: prefill into a free id
                    index, request = queue.pop()
                    seq, first = self._admit(request, free_slots.pop(), sampling, stream_seed(seed, index, VERIFY),
                                             totals, planner)
                    runs[index] = seq.run
                    active.append(seq)
                    now = time.perf_counter()
                    seq.run.stats.ttft_s = now - seq.run.admitted_at
                    emit(seq, [first], now)  # the first token obeys the same end/budget rules
                    if seq in active:  # only now, so the first token never waits for a draft model's prefill
                        t = time.perf_counter()
                        self.drafter.start(seq.run.slot, request.prompt, sampling, self.device,
                                           stream_seed(seed, index, DRAFT))
                        spent = time.perf_counter() - t
                        seq.run.stats.draft_s += spent
                        totals.draft_s += spent
                # Every sequence needs a cell for its next token. When they do not all fit, the one holding
                # the most of the cache ends, as a lone sequence ends when it fills the context.
                while active and self._free_cells(active) < len(active):
                    finish(max(active, key=lambda s: len(s.history)), "context")
                if active:
                    self._step(active, planner, totals, speculating, max_tokens, emit)
                report()
        except GenerationCancelled:
            for seq in list(active):
                finish(seq, "cancelled")
            raise
        return BatchResult([r for r in runs if r is not None], totals, started, time.perf_counter())

    # --- one request joins ---------------------------------------------------------------------
    def _admit(self, request: BatchRequest, slot: int, sampling: SamplingParams, seed: int, totals: BatchTotals,
               planner: BatchDraftPlanner) -> tuple[_Sequence, int]:
        """Prefill a request into its sequence id; returns the sequence and its first token (the drafter
        starts after it is out). seed: the verifier's stream."""
        target = self.target
        if not request.prompt:
            raise InvalidSettingError(f"request {request.id}: the prompt is empty")
        if len(request.prompt) >= target.n_ctx:
            raise EngineError(f"request {request.id}: a {len(request.prompt)}-token prompt does not fit "
                              f"the {target.n_ctx}-token context")
        stats = GenerationStats(method=self.drafter.name, backend=target.backend, prompt_tokens=len(request.prompt))
        run = RequestRun(request.id, slot, [], stats, admitted_at=time.perf_counter())
        target.forget_from(0, slot)
        logits = target.prefill(request.prompt, 0, seq_id=slot)
        verifier = Verifier(sampling, self.device, seed)
        first = verifier.verify(logits, [], None, position=len(request.prompt)).next_token
        stats.prefill_s = time.perf_counter() - run.admitted_at
        totals.prefill_s += stats.prefill_s
        planner.reset(slot)
        return _Sequence(run, list(request.prompt), verifier), first

    def _free_cells(self, active: list[_Sequence]) -> int:
        """Cells left in the target's KV cache, which every sequence shares (kv_unified: n_ctx in all).
        A sequence holds its history but the last token (the KV convention)."""
        return self.target.n_ctx - sum(len(s.history) - 1 for s in active)

    # --- one step for every active sequence ----------------------------------------------------
    def _step(self, active: list[_Sequence], planner: BatchDraftPlanner, totals: BatchTotals, speculating: bool,
              max_tokens: int, emit) -> None:
        target, cfg = self.target, self.speculation
        row_budget = (target.n_batch - len(active)) // len(active)  # every sequence's drafts fit one batch
        cell_budget = (self._free_cells(active) - len(active)) // len(active)  # ... and the shared cache
        proposals: list[Proposal] = [Proposal() for _ in active]
        if speculating:
            caps = [max(0, min(cfg.max_draft, row_budget, cell_budget, max_tokens - s.run.stats.generated - 1))
                    for s in active]
            lengths = planner.plan([s.run.slot for s in active], caps)
            wants = [(i, s, k) for i, (s, k) in enumerate(zip(active, lengths)) if k >= cfg.min_draft]
            if wants:
                t = time.perf_counter()
                made = self.drafter.propose([(s.run.slot, s.history, k) for _, s, k in wants])
                spent = time.perf_counter() - t
                totals.draft_s += spent
                planner.record_draft(sum(len(p.tokens) for p in made), spent)
                for (i, s, _), proposal in zip(wants, made):
                    s.run.stats.draft_s += spent / len(wants)
                    if len(proposal.tokens) >= cfg.min_draft:
                        proposals[i] = proposal
            if self.drafter.free and cfg.adaptive:
                for s, k in zip(active, lengths):  # not drafting: score what lookup would have said
                    if k < cfg.min_draft and not s.shadow:
                        s.shadow = self.drafter.propose([(s.run.slot, s.history, cfg.max_draft)])[0].tokens

        tokens, positions, seq_ids = [], [], []
        for s, proposal in zip(active, proposals):
            pos = len(s.history) - 1
            row = [s.history[-1], *proposal.tokens]
            tokens += row
            positions += range(pos, pos + len(row))
            seq_ids += [s.run.slot] * len(row)
        t = time.perf_counter()
        logits = target.decode_multi(tokens, positions, seq_ids, [True] * len(tokens))
        verdicts, offset = [], 0
        for s, proposal in zip(active, proposals):  # read every row before anything decodes again
            n = len(proposal.tokens) + 1
            verdicts.append(s.verifier.verify(logits[offset:offset + n], proposal.tokens, proposal.probs,
                                              position=len(s.history)))
            offset += n
        seconds = time.perf_counter() - t
        drafted_rows = len(tokens) - len(active)
        totals.record_step(len(tokens), seconds)
        planner.record_step(len(tokens), drafted_rows, seconds)
        now = time.perf_counter()
        for s, proposal, verdict in zip(list(active), proposals, verdicts):
            pos = len(s.history) - 1
            target.forget_from(pos + 1 + verdict.accepted, s.run.slot)
            stats = s.run.stats
            stats.verify_steps += 1
            if proposal.tokens:
                stats.speculative_steps += 1
                stats.record_verdict(len(proposal.tokens), verdict.accepted)
                planner.record_acceptance(s.run.slot, len(proposal.tokens), verdict.accepted)
            emit(s, [*proposal.tokens[:verdict.accepted], verdict.next_token], now)

    @staticmethod
    def _score_shadow(seq: _Sequence, new_tokens: list[int], planner: BatchDraftPlanner) -> None:
        for tok in new_tokens:
            if not seq.shadow:
                return
            if seq.shadow[seq.shadow_hits] == tok:
                seq.shadow_hits += 1
                if seq.shadow_hits < len(seq.shadow):
                    continue
            planner.record_acceptance(seq.run.slot, len(seq.shadow), seq.shadow_hits)
            seq.shadow, seq.shadow_hits = [], 0
