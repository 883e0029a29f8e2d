"""The one batched step that the chat (one sequence), the lab and the server (many) all drive.

Each step: propose drafts, let the DraftPlanner choose how many rows every sequence verifies, build
ONE batch holding every sequence's last token plus its drafts, decode it, verify each sequence on its
own rows, and roll each sequence's KV cache back on its own. KV convention: a sequence's last token is
not yet in the cache, so after a verdict the cache keeps positions < pos + 1 + accepted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable

import torch

from ..errors import GenerationCancelled
from .cost_model import (CALIBRATION_REPEATED_UP_TO, CALIBRATION_REPEATS, CALIBRATION_WARMUP, HORIZON_FLOOR,
                         Acceptance, DraftPlanner, Plan, SpeculationConfig, StepCosts, calibration_sizes)
from .proposers.auto import AutoProposer
from .proposers.base import NoProposer, Proposal, Proposer
from . import step_timings
from .runtime import Model
from .stats import GenerationStats
from .threads import ThreadTuner
from .verifier import Verifier

if TYPE_CHECKING:  # the draft proposer imports this module (time_steps)
    from .proposers.draft_model import DraftModelProposer

DRAFT_FEATURE = ("draft",)
# A shadow proposal is scored over this many tokens at most, then the next starts from the proposal of its
# time: scored whole, a 48-token copy found on a 3-token match taught that match length 33 hits while the
# matches grew to 16 tokens unseen, and a later 3-token match drafted 11 and kept none (Gemma 3, fix-json).
SHADOW_TOKENS = 8


def tokens_to_come(s: SequenceState, tokens_left: int) -> int:
    """The tokens a sequence is expected still to make: as many as it has made so far (HORIZON_FLOOR at
    least), within its budget. A budget alone says little: a chat answer of 100 tokens may have 2,000 left."""
    return max(0, min(tokens_left, max(s.stats.generated, HORIZON_FLOOR)))


def lookup_feature(match_length: int, continuing: bool) -> tuple[int, bool]:
    """Proposals are grouped by match length (1, 2, 3, 4, 6, 8, 12, 16, 24, 32 and up) and by whether
    the sequence's last proposal was kept whole, since both predict acceptance."""
    for edge in (32, 24, 16, 12, 8, 6, 4, 3, 2, 1):
        if match_length >= edge:
            return edge, continuing
    return 0, continuing


def tokens_to_keep(tokens: list[int], target: Model, ignore_eos: bool, budget: int) -> tuple[int, str | None]:
    """How many of a step's tokens an answer keeps, and why it ends if it does: before an end token
    ("stop"), or at the token budget ("length"). The chat and the batch cut by this one rule."""
    keep, reason = len(tokens), None
    if not ignore_eos:
        keep = next((i for i, tok in enumerate(tokens) if target.is_end(tok)), keep)
        reason = "stop" if keep < len(tokens) else None
    if keep >= budget:
        keep, reason = budget, reason or "length"
    return keep, reason


def time_steps(target: Model, slot: int, start: int, token: int, sizes: list[int],
               clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Seconds of a step of each size (rows of `token` in free cells from `start` of sequence `slot`, rolled
    back after), warm: CALIBRATION_WARMUP untimed one-row steps first, then CALIBRATION_REPEATS rounds over
    the sizes (those past CALIBRATION_REPEATED_UP_TO in the first only), the fastest of each size kept.
    Rounds, not repeats back to back: this VM's speed wanders over seconds, and two timings of one size a
    round apart are less alike than two in a row (the curve's ratios to one row varied 11% between
    calibrations timed back to back, 5% in rounds, on SmolLM2 and Gemma 3 270M here).

    Timings are kept by model file and load settings (step_timings.py), by thread count: a size timed
    once is not timed again for a day (the server's start and stop, a speculation change, a reload: each
    had re-timed every size, up to a minute and a half on a busy machine, while the window waited)."""
    kept = target.step_timings
    missing = [rows for rows in sizes if (target.threads, rows) not in kept]
    if missing:
        kept.update({(target.threads, rows): seconds
                     for rows, seconds in time_sizes(target, slot, start, token, missing, clock).items()})
        step_timings.save()
    return {rows: kept[target.threads, rows] for rows in sizes}


def time_decode(target: Model, slot: int, start: int, token: int, rows: int,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of one decode of `rows` rows of `token` in free cells from `start` of sequence `slot`, rolled
    back after."""
    t = clock()
    target.decode_multi([token] * rows, range(start, start + rows), [slot] * rows, [True] * rows)
    spent = clock() - t
    target.forget_from(start, slot)
    return spent


def time_sizes(target: Model, slot: int, start: int, token: int, sizes: list[int],
               clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """The timing itself, every size afresh: nothing is read from or kept in the model's timings."""
    def timed(rows: int) -> float:
        return time_decode(target, slot, start, token, rows, clock)

    for _ in range(CALIBRATION_WARMUP):
        timed(1)
    timed(max(sizes))  # untimed: the widest batch yet grows llama.cpp's buffers (Gemma, 32 rows: 109 ms, then 89)
    fastest: dict[int, float] = {}
    for round_ in range(CALIBRATION_REPEATS):
        for rows in sizes:
            if round_ == 0 or rows <= CALIBRATION_REPEATED_UP_TO:
                fastest[rows] = min(fastest.get(rows, float("inf")), timed(rows))
    return fastest


@dataclass
class SequenceState:
    """One request in flight: what it has produced so far and how its proposals have fared."""

    slot: int
    history: list[int]
    verifier: Verifier
    stats: GenerationStats
    continuing: bool = False  # its last resolved proposal was kept whole
    stops_at_end: bool = True  # an end token ends the answer (not so with ignore_eos)
    acceptance: Acceptance | None = None  # its own drafts' fate; the planner's shared table is the prior
    shadow: list[int] = field(default_factory=list)  # a free proposal scored while not drafting
    shadow_feature: Hashable = None
    shadow_hits: int = 0
    shadow_predicted: float = 0.0  # the tokens of the shadow the acceptance tables expected kept


@dataclass(frozen=True)
class StepOutcome:
    tokens: list[int]  # kept drafts, then the target's own token
    accepted: int  # how many of tokens came from the draft


@dataclass
class StepTotals:
    """What the target did across all sequences (the lab reports these)."""

    steps: int = 0
    rows: int = 0
    verify_s: float = 0.0
    draft_s: float = 0.0
    prefill_s: float = 0.0
    step_time_by_rows: dict[int, list[float]] = field(default_factory=dict)  # rows -> [count, seconds]
    sequence_s: float = 0.0  # sequences in each step x its seconds: / verify_s, the mean in flight
    # Steps with every slot of the batch busy (Batch records them): their seconds, proposing included, and the
    # tokens they delivered; prefills are not steps. The lab judges its levels by these (lab_metrics.py).
    full_s: float = 0.0
    full_tokens: int = 0

    def record(self, rows: int, seconds: float, sequences: int = 1) -> None:
        self.steps += 1
        self.rows += rows
        self.verify_s += seconds
        self.sequence_s += sequences * seconds
        entry = self.step_time_by_rows.setdefault(rows, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds


class StepLoop:
    """A target, a proposer and the planner that decides, step by step, how much to speculate."""

    def __init__(self, target: Model, proposer: Proposer | None, speculation: SpeculationConfig,
                 device: torch.device, step_costs: StepCosts | None = None, tune_threads: bool = True,
                 clock: Callable[[], float] = time.perf_counter):
        self.target = target
        self.clock = clock  # what step times are read from (a replay's virtual clock: engine.measure.replay)
        self.proposer = proposer or NoProposer()
        self.speculation = speculation
        self.device = device
        self.planner = DraftPlanner(speculation, costly_proposer=not self.proposer.free, steps=step_costs)
        # --method auto: self.planner plans lookup's copies, and a second planner, sharing the step costs, the
        # draft model's guesses (each keeps its own acceptance, realism and probing); otherwise the one planner.
        self.auto = isinstance(self.proposer, AutoProposer)
        if self.auto:
            self.planner.costly = False
            self.draft_planner = DraftPlanner(speculation, costly_proposer=True, steps=self.planner.steps)
        else:
            self.draft_planner = self.planner
        self.totals = StepTotals()
        # The tuner starts from the threads the model was loaded with, not its current count: a loop before this
        # one on the same model (the lab's previous level) may have left it on fewer, on trial, and the new tuner
        # took that for the full count and never tried more (a lab run in the window: every level after the first
        # on one thread of two, lookup at 0.54x plain decoding).
        full = target.settings.resolved_threads() if tune_threads else 1  # 1: never switches
        self.threads = ThreadTuner(full)
        if tune_threads and target.threads != full:
            self._switch_threads(full)
        self.held_cells = 0  # cells kept by finished sequences' caches (a batch with keep_caches)

    @property
    def speculating(self) -> bool:
        return (self.proposer.name != "none" and self.speculation.max_draft > 0 and self.target.can_roll_back)

    @property
    def method(self) -> str:
        """What the stats call this loop's decoding: the proposer's name, or "none" when it cannot draft."""
        return self.proposer.name if self.speculating else NoProposer.name

    @property
    def draft_model_bytes(self) -> int | None:
        """The draft model's weights in memory, where this loop runs one."""
        return None if self.proposer.free else self.proposer.model.size_bytes

    def free_cells(self, active: list[SequenceState]) -> int:
        """Cells left in the target's KV cache, which every sequence shares (kv_unified: n_ctx in all)."""
        return self.target.n_ctx - self.held_cells - sum(len(s.history) - 1 for s in active)

    def step(self, active: list[SequenceState], tokens_left: list[int]) -> list[StepOutcome]:
        """One step for every active sequence. tokens_left: each one's remaining token budget.
        On GenerationCancelled the half-decoded batch is dropped and every cache is as before."""
        target, cfg, n = self.target, self.speculation, len(active)
        proposals = [Proposal() for _ in active]
        first = active[0]  # calibrates once, in its free cells, if nobody did before the first step
        self.calibrate(first.slot, len(first.history) - 1, first.history[-1])
        if self.speculating:
            row_budget = (target.n_batch - n) // n  # every sequence's drafts fit one batch ...
            cell_budget = (self.free_cells(active) - n) // n  # ... and the shared cache
            room = [max(0, min(cfg.max_draft, row_budget, cell_budget, left - 1)) for left in tokens_left]
            proposals = self._propose(active, room, tokens_left)
        self._switch_threads(self.threads.before_step(drafting=any(p.tokens for p in proposals)))
        totals = self.totals
        rows, positions, seq_ids = [], [], []
        for s, proposal in zip(active, proposals):
            pos = len(s.history) - 1
            row = [s.history[-1], *proposal.tokens]
            rows += row
            positions += range(pos, pos + len(row))
            seq_ids += [s.slot] * len(row)
        t = self.clock()
        try:
            logits = target.decode_multi(rows, positions, seq_ids, [True] * len(rows))
        except GenerationCancelled:  # Stop arrived mid-verify: drop the half-processed batch
            for s in active:
                target.forget_from(len(s.history) - 1, s.slot)
            raise
        verdicts, offset = [], 0
        for s, proposal in zip(active, proposals):  # read every row before anything decodes again
            k = len(proposal.tokens)
            verdicts.append(s.verifier.verify(logits[offset:offset + k + 1], proposal.tokens, proposal.probs,
                                              position=len(s.history)))
            offset += k + 1
        seconds = self.clock() - t
        totals.record(len(rows), seconds, n)
        per_row = self.planner.record_step(len(rows), len(rows) - n, seconds)
        self._switch_threads(self.threads.record(per_row, self.planner.steps.contended, drafted=len(rows) > n))
        if self.auto:  # each planner learns from its own proposer's drafts
            drafted = [p.from_draft for p in proposals]
            self.draft_planner.count_step(any(p.tokens and p.from_draft for p in proposals))
            self.draft_planner.record_outcome(sum(v.accepted for v, d in zip(verdicts, drafted) if d))
            self.planner.record_outcome(sum(v.accepted for v, d in zip(verdicts, drafted) if not d))
        else:
            self.planner.record_outcome(sum(v.accepted for v in verdicts))
        outcomes = []
        for s, proposal, verdict in zip(active, proposals, verdicts):
            k = len(proposal.tokens)
            if verdict.accepted < k:  # rejected drafts' cells go (a plain step or a whole keep leaves none)
                target.forget_from(len(s.history) + verdict.accepted, s.slot)
            s.stats.verify_steps += 1
            if k:
                s.stats.speculative_steps += 1
                s.stats.record_verdict(k, verdict.accepted)
                feature = self._feature(s, proposal)
                for table in self._tables(s, proposal.from_draft):
                    table.record(feature, k, verdict.accepted)
                s.continuing = verdict.accepted == k
            tokens = [*proposal.tokens[:verdict.accepted], verdict.next_token]
            self._score_shadow(s, tokens)
            s.history += tokens
            outcomes.append(StepOutcome(tokens, verdict.accepted))
        return outcomes

    def _switch_threads(self, threads: int | None) -> None:
        if threads is not None:  # the scale measured at the old count no longer applies
            self.target.set_threads(threads)
            self.planner.steps.rescale()

    def calibrate(self, slot: int = 0, start: int = 0, token: int = 0, sequences: int = 1,
                  timed_only: bool = False) -> None:
        """Time a step of every size that `sequences` sequences may verify together, once, in free cells from
        `start` of sequence `slot` (rolled back after), so the planner knows what each verify costs before
        betting on one; and a costly proposer's token. Does nothing when calibrated already, or when nothing
        is planned (no speculation, fixed lengths). timed_only: time nothing now, take the sizes this model
        has timed before (wider ones are extrapolated; with none, each size is learnt from its first step)."""
        target, planner = self.target, self.planner
        if not (self.speculating and self.speculation.adaptive):
            return
        top = min(sequences * (self.speculation.max_draft + 1), target.n_batch, target.n_ctx - start - 1)
        sizes = calibration_sizes(top) if top >= 2 else []
        if timed_only:
            sizes = [rows for rows in sizes if (target.threads, rows) in target.step_timings]
        if not planner.steps.calibrated and len(sizes) >= 2 and sizes[0] == 1:
            planner.steps.take_calibration(time_steps(target, slot, start, token, sizes, self.clock))
        if not self.proposer.free and not self.draft_planner.draft_timed:
            token_s, catch_up_row_s = self.proposer.time_draft(slot)
            self.draft_planner.record_draft(1, token_s)
            self.draft_planner.record_catch_up(1, catch_up_row_s)

    # --- proposing and planning -----------------------------------------------------------------
    def _feature(self, s: SequenceState, proposal: Proposal) -> Hashable:
        if proposal.from_draft:
            return DRAFT_FEATURE
        return lookup_feature(proposal.match_length, s.continuing)

    def _propose(self, active: list[SequenceState], room: list[int], tokens_left: list[int]) -> list[Proposal]:
        cfg, proposer = self.speculation, self.proposer
        t = self.clock()
        if proposer.free:  # propose first (it costs nothing), then plan knowing each proposal
            chosen, plan, caps = self._propose_free(proposer, active, room)
        elif self.auto:
            chosen, plan, caps = self._propose_auto(proposer, active, room, tokens_left)
        else:  # a draft model costs a decode per token: plan first, then draft only what is wanted
            chosen, plan, caps = self._propose_draft(proposer, active, room, tokens_left)
        spent = self.clock() - t
        self.totals.draft_s += spent
        chosen = [p if len(p.tokens) >= cfg.min_draft else Proposal() for p in chosen]
        for s, k, p, cap, r in zip(active, plan.lengths, chosen, caps, room):
            s.stats.draft_s += spent / len(active)
            s.stats.policy_draft_length, s.stats.draft_length = k, len(p.tokens)
            # Paused only when the planner predicted plain decoding faster, never for a step taken to measure
            # plain decoding; a step with no choice to make (no proposal) or whose choice the token budget
            # made (too little room left for a draft worth its rows) keeps the last verdict.
            if plan.measuring_plain or not cfg.adaptive:
                s.stats.speculation_paused = False
            elif k:
                s.stats.speculation_paused = False
            elif cap >= cfg.min_draft and r >= cfg.max_draft:
                s.stats.speculation_paused = True
        return chosen

    def _propose_free(self, proposer: Proposer, active: list[SequenceState],
                      room: list[int]) -> tuple[list[Proposal], Plan, list[int]]:
        """A free proposer's proposals, cut to what the planner chose to verify; unchosen ones become shadows."""
        planner = self.planner
        offered = [self._up_to_end(p) if s.stops_at_end else p for s, p in
                   zip(active, proposer.propose([(s.slot, s.history, self.speculation.max_draft) for s in active]))]
        features = [self._feature(s, p) for s, p in zip(active, offered)]
        caps = [min(r, len(p.tokens)) for r, p in zip(room, offered)]
        plan = planner.plan(features, caps, [self._own(s) for s in active])
        chosen = [Proposal(p.tokens[:k], None, p.match_length) if k else Proposal()
                  for p, k in zip(offered, plan.lengths)]
        for s, p, f, k in zip(active, offered, features, plan.lengths):
            if not k and p.tokens and not s.shadow:  # not drafting: score what it would have said
                s.shadow, s.shadow_feature, s.shadow_hits = p.tokens[:SHADOW_TOKENS], f, 0
                s.shadow_predicted = planner.acceptance.expected_tokens(f, self._own(s), len(s.shadow))[-1] - 1.0
        return chosen, plan, caps

    def _plan_draft(self, proposer: DraftModelProposer, active: list[SequenceState], room: list[int],
                    tokens_left: list[int]) -> Plan:
        """The draft planner's plan, with each sequence's catch-up to repay within the tokens to come."""
        return self.draft_planner.plan([DRAFT_FEATURE] * len(active), room, [self._own(s) for s in active],
                                       lags=[proposer.lag(s.slot, s.history) for s in active],
                                       horizon=[tokens_to_come(s, left) for s, left in zip(active, tokens_left)])

    def _propose_draft(self, proposer: DraftModelProposer, active: list[SequenceState], room: list[int],
                       tokens_left: list[int], plan: Plan | None = None) -> tuple[list[Proposal], Plan, list[int]]:
        """A costly proposer's: the planner decides each length first (or `plan` did), then only those are
        drafted, and timed: the catch-up apart from the drafted tokens."""
        planner = self.draft_planner
        t = self.clock()
        plan = plan or self._plan_draft(proposer, active, room, tokens_left)
        wants = [(s.slot, s.history, k) for s, k in zip(active, plan.lengths) if k]
        made = iter(proposer.propose(wants) if wants else [])
        chosen = [next(made) if k else Proposal() for k in plan.lengths]
        spent = self.clock() - t
        caught_rows, caught_s = proposer.last_catch_up if wants else (0, 0.0)
        planner.record_catch_up(caught_rows, caught_s)
        planner.record_draft(sum(len(p.tokens) for p in chosen), spent - caught_s)
        return chosen, plan, room

    def _propose_auto(self, proposer: AutoProposer, active: list[SequenceState], room: list[int],
                      tokens_left: list[int]) -> tuple[list[Proposal], Plan, list[int]]:
        """Both planners plan (planning is cheap); each sequence verifies whichever proposal promises more tokens
        per second of its step, the draft's own tokens counted; the draft model then drafts for those sequences
        alone, so a copy that wins costs no draft decode."""
        copies, copy_plan, caps = self._propose_free(proposer.lookup, active, room)
        if copy_plan.measuring_plain:
            return copies, copy_plan, caps
        n, steps = len(active), self.planner.steps
        guess_plan = self._plan_draft(proposer.draft, active, room, tokens_left)
        d = self.draft_planner.draft_seconds_per_token

        def rate(plan: Plan, k: int, i: int, drafting: float) -> float:
            gained = plan.expected[i] if k else 0.0
            return (n + gained) / ((steps.seconds(n + k, drafted=k > 0) or 1.0) + drafting * k)

        # A draft plan that bets on nothing (a probe, or fixed lengths) is taken where lookup offers no copy.
        use_draft = [bool(g) and (rate(guess_plan, g, i, d) > rate(copy_plan, c, i, 0.0) if guess_plan.expected
                                  else not c)
                     for i, (c, g) in enumerate(zip(copy_plan.lengths, guess_plan.lengths))]
        self.planner.keep_only(copy_plan, [not u for u in use_draft])
        self.draft_planner.keep_only(guess_plan, use_draft)
        wanted = Plan([g if u else 0 for g, u in zip(guess_plan.lengths, use_draft)], guess_plan.measuring_plain)
        guesses, _, _ = self._propose_draft(proposer.draft, active, room, tokens_left, wanted)
        chosen = [g if u else c for c, g, u in zip(copies, guesses, use_draft)]
        lengths = [g if u else c for c, g, u in zip(copy_plan.lengths, guess_plan.lengths, use_draft)]
        return chosen, Plan(lengths, guess_plan.measuring_plain), room  # room bounds both proposals

    def _own(self, s: SequenceState) -> Acceptance:
        """The sequence's own acceptance table, made on first use."""
        if s.acceptance is None:
            s.acceptance = Acceptance(self.planner.acceptance.max_draft)
        return s.acceptance

    def _tables(self, s: SequenceState, from_draft: bool = False) -> tuple[Acceptance, Acceptance]:
        """Where a draft's fate is recorded: its planner's shared table and the sequence's own."""
        return (self.draft_planner if from_draft else self.planner).acceptance, self._own(s)

    def _up_to_end(self, proposal: Proposal) -> Proposal:
        """A draft that copies its source past an end token (a prompt's turn into the chat template that
        follows it) is cut after that token: nothing after it can be kept, as the answer ends there."""
        for i, tok in enumerate(proposal.tokens):
            if self.target.is_end(tok):
                return Proposal(proposal.tokens[:i + 1], proposal.probs, proposal.match_length)
        return proposal

    def _score_shadow(self, s: SequenceState, new_tokens: list[int]) -> None:
        """Score a shadow proposal slot by slot as the real tokens arrive; once it is settled, its tokens kept
        against those predicted count towards the planner's realism as a drafted step's would."""
        for tok in new_tokens:
            if not s.shadow:
                return
            hit = s.shadow[s.shadow_hits] == tok
            for table in self._tables(s):
                table.record_slot(s.shadow_feature, s.shadow_hits, hit)
            s.shadow_hits += 1
            if not hit or s.shadow_hits == len(s.shadow):
                s.continuing = hit
                self.planner.record_shadow_outcome(s.shadow_predicted, s.shadow_hits - (0 if hit else 1))
                s.shadow, s.shadow_hits = [], 0
