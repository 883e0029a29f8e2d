"""The one batched step under every decode (driven by batch.py: the chat's one slot, the server's and the lab's many).

Each step: the drafting (drafting.py: a proposer and its planner) proposes as many rows per sequence as its
planner chose; ONE batch holds every sequence's last token plus its drafts; it is decoded once, each sequence
verified on its own rows, and each sequence's KV cache rolled back on its own; then the step's time and
verdicts are recorded. KV convention: a sequence's last token is not yet in the cache, so after a verdict the
cache keeps positions < pos + 1 + accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch

from ..errors import GenerationCancelled
from ..methods import MAX_DRAFT_LIMIT
from .calibration import Progress, calibrate_steps
from .draft_planner import DraftPlanner
from .drafting import DraftState, drafting_for
from .exactness import exact_verify_rows
from .pace import PlainPace, SequencePace
from .proposers.base import PREDICTION_SOURCE, NoProposer, Proposal, Proposer
from .runtime import Model
from .speculation_config import SpeculationConfig
from .stats import GenerationStats
from .step_costs import StepCosts
from .threads import ThreadTuner
from .verifier import Verdict, Verifier

if TYPE_CHECKING:
    from .jobs import Job
    from .proposers.base import CostlyProposer


@dataclass
class SequenceState:
    """One request in flight: what it has produced so far and how its proposals have fared."""

    slot: int
    history: list[int]
    verifier: Verifier
    stats: GenerationStats
    stops_at_end: bool = True  # an end token ends the answer (not so with ignore_eos)
    draft: DraftState = field(default_factory=DraftState)  # how its proposals have fared: drafting.py's alone
    pace: SequencePace = field(default_factory=SequencePace)  # its time against plain decoding's, and the guard


@dataclass(frozen=True)
class StepOutcome:
    tokens: list[int]  # kept drafts, then the target's own token
    accepted: int  # how many of tokens came from the draft
    source: str | None = None  # the proposer of those drafts (Proposal.source): "lookup", "draft", "mtp"


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
    # tokens they delivered; prefills are not steps. The lab judges its levels by these (engine/lab/metrics.py).
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

    def __init__(
        self,
        target: Model,
        proposer: Proposer | None,
        speculation: SpeculationConfig,
        device: torch.device,
        step_costs: StepCosts | None = None,
        tune_threads: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.target = target
        self.clock = clock  # what step times are read from (a replay's virtual clock: engine.measure.replay)
        self.speculation = speculation
        self.device = device
        self.drafting = drafting_for(proposer or NoProposer(), speculation, step_costs, target, clock)
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
        self.plain_pace = PlainPace()  # what a plain step costs here: speedup_vs_plain's denominator
        self.exact_rows: int | None = None  # exact greedy: the widest verify decoded as one-row steps are

    @property
    def proposer(self) -> Proposer:
        return self.drafting.proposer

    @proposer.setter
    def proposer(self, proposer: Proposer) -> None:
        """Swap the proposer for a while (a plain answer: NoProposer), keeping the planners and what they learnt."""
        self.drafting.proposer = proposer

    @property
    def planner(self) -> DraftPlanner:
        """The planner that holds the step costs (and plans lookup's copies under auto)."""
        return self.drafting.planner

    @property
    def draft_planner(self) -> DraftPlanner:
        """The planner of a draft model's guesses (the one planner, but for auto)."""
        return self.drafting.draft_planner

    @property
    def speculating(self) -> bool:
        return self.proposer.name != "none" and self.speculation.max_draft > 0 and self.rollback > 0

    @property
    def rollback(self) -> int:
        """The most rejected drafts one step may roll back: any on an attention-only target, a hybrid model's
        recurrent snapshots (n_rs_seq) else."""
        target = self.target
        return MAX_DRAFT_LIMIT if target.can_roll_back else min(MAX_DRAFT_LIMIT, target.max_rollback or 0)

    @property
    def method(self) -> str:
        """What the stats call this loop's decoding: the proposer's name, or "none" when it cannot draft."""
        return self.proposer.name if self.speculating else NoProposer.name

    @property
    def proposer_names(self) -> tuple[str, ...]:
        """Who may propose this loop's drafts, as the stats count them (auto: both, from the first token on)."""
        return self.drafting.sources if self.speculating else ()

    def sources_for(self, job: Job) -> tuple[str, ...]:
        """Who may propose a job's drafts: the loop's proposers, and the job's prediction where it has one that
        this loop drafts along."""
        names = self.proposer_names
        return (*names, PREDICTION_SOURCE) if names and job.prediction and self.drafting.predicts else names

    @property
    def draft_model_bytes(self) -> int | None:
        """The draft model's weights in memory, where this loop runs one."""
        proposer = self.proposer
        model = None if proposer.free else cast("CostlyProposer", proposer).model
        return model.size_bytes if model is not None else None

    def free_cells(self, active: Sequence[SequenceState]) -> int:
        """Cells left in the target's KV cache, which every sequence shares (kv_unified: n_ctx in all)."""
        return self.target.n_ctx - self.held_cells - sum(len(s.history) - 1 for s in active)

    def step(self, active: Sequence[SequenceState], tokens_left: list[int]) -> list[StepOutcome]:
        """One step for every active sequence. tokens_left: each one's remaining token budget.
        On GenerationCancelled the half-decoded batch is dropped and every cache is as before."""
        n = len(active)
        first = active[0]  # calibrates once, in its free cells, if nobody did before the first step
        self.calibrate(first.slot, len(first.history) - 1, first.history[-1])
        began = self.clock()
        if self.speculating:
            proposals = self._propose(active, self._room(active, tokens_left), tokens_left)
        else:
            proposals = [Proposal() for _ in active]
        self._switch_threads(self.threads.before_step(drafting=any(p.tokens for p in proposals)))
        verdicts, rows, seconds = self._verify(active, proposals)
        self.totals.record(rows, seconds, n)
        per_row = self.planner.record_step(rows, rows - n, seconds)
        self._switch_threads(self.threads.record(per_row, self.planner.steps.contended, drafted=rows > n))
        outcomes = self._settle(active, proposals, verdicts)
        self.drafting.accept(active, proposals, verdicts, [o.tokens for o in outcomes])
        self._record_pace(active, proposals, outcomes, self.clock() - began)
        for s, outcome in zip(active, outcomes):
            s.history += outcome.tokens
        return outcomes

    def _room(self, active: Sequence[SequenceState], tokens_left: list[int]) -> list[int]:
        """The most draft rows each sequence may verify this step: every sequence's drafts fit one batch and the
        shared cache, within its token budget; none for a sequence the guard holds (it ran below plain)."""
        target, cfg, n = self.target, self.speculation, len(active)
        row_budget = (target.n_batch - n) // n  # every sequence's drafts fit one batch ...
        cell_budget = min((self.free_cells(active) - n) // n, self.rollback)  # ... the shared cache, the roll-back
        if cfg.exact:  # the batch stays as narrow as decodes like plain steps (unmeasured yet: one row)
            row_budget = min(row_budget, ((self.exact_rows or 1) - n) // n)
        return [
            0 if s.pace.holding else max(0, min(cfg.max_draft, row_budget, cell_budget, left - 1))
            for s, left in zip(active, tokens_left)
        ]

    def _verify(self, active: Sequence[SequenceState], proposals: list[Proposal]) -> tuple[list[Verdict], int, float]:
        """ONE batch of every sequence's last token and drafts, decoded with logits on every row, each sequence
        verified on its own rows. Returns the verdicts, the rows and the seconds they took."""
        target = self.target
        rows: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
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
            verdicts.append(
                s.verifier.verify(
                    logits[offset : offset + k + 1], proposal.tokens, proposal.probs, position=len(s.history)
                )
            )
            offset += k + 1
        return verdicts, len(rows), self.clock() - t

    def _settle(
        self, active: Sequence[SequenceState], proposals: list[Proposal], verdicts: list[Verdict]
    ) -> list[StepOutcome]:
        """Each sequence's kept tokens: its rejected drafts' cells rolled back, its stats counted."""
        target, outcomes = self.target, []
        for s, proposal, verdict in zip(active, proposals, verdicts):
            k = len(proposal.tokens)
            if verdict.accepted < k:  # rejected drafts' cells go (a plain step or a whole keep leaves none)
                target.forget_from(len(s.history) + verdict.accepted, s.slot)
            s.stats.verify_steps += 1
            source = proposal.source if k else None
            if k:
                s.stats.speculative_steps += 1
                s.stats.record_verdict(k, verdict.accepted, source)
            outcomes.append(
                StepOutcome([*proposal.tokens[: verdict.accepted], verdict.next_token], verdict.accepted, source)
            )
        return outcomes

    def _record_pace(
        self, active: Sequence[SequenceState], proposals: list[Proposal], outcomes: list[StepOutcome], seconds: float
    ) -> None:
        """Each sequence's time against plain decoding's for the same tokens: a step that drafted nothing is plain
        decoding, at its own cost, and teaches what a plain step costs; a drafting step's tokens are priced at
        the predicted plain step. The guard acts on adaptive speculation only."""
        n, threads, now = len(active), self.target.threads, self.clock()
        positions = [len(s.history) - 1 for s in active]
        plain_step = not any(p.tokens for p in proposals)
        if plain_step:
            self.plain_pace.record(n, threads, sum(positions) / n, seconds, now)
        calibrated = self.planner.steps.plain_seconds(n)
        for s, p, outcome, pos in zip(active, proposals, outcomes, positions):
            made = len(outcome.tokens)
            plain = (
                seconds if plain_step else self.plain_pace.predict(n, threads, pos + (made - 1) / 2, calibrated, now)
            )
            if plain is None:
                continue
            s.pace.record(
                seconds, made * plain if not plain_step else plain, bool(p.tokens) and self.speculation.adaptive, made
            )
            s.stats.speedup_vs_plain = s.pace.speedup if self.speculating else None  # plain is plain
            s.stats.guard = s.pace.note

    def _switch_threads(self, threads: int | None) -> None:
        if threads is not None:  # the scale measured at the old count no longer applies
            self.target.set_threads(threads)
            self.planner.steps.rescale()

    def calibrate(
        self,
        slot: int = 0,
        start: int = 0,
        token: int = 0,
        sequences: int = 1,
        timed_only: bool = False,
        on_progress: Progress | None = None,
    ) -> None:
        """Time a step of every size that `sequences` sequences may verify together, once, in free cells from
        `start` of sequence `slot` (rolled back after), so the planner knows what each verify costs before
        betting on one; and a costly proposer's token. Does nothing when calibrated already, or when nothing
        is planned (no speculation, fixed lengths). timed_only: time nothing now, take the sizes this model
        has timed before (wider ones are extrapolated; with none, each size is learnt from its first step)."""
        free_cells = self.target.can_roll_back or not start  # a recurrent state goes back only a decode's drafts
        timed_only = timed_only or not free_cells
        if self.speculating and self.speculation.exact and self.exact_rows is None and free_cells:
            self.exact_rows = exact_verify_rows(self.target, slot, start, [token])
        if not (self.speculating and self.speculation.adaptive):
            return
        calibrate_steps(
            self.target,
            self.planner.steps,
            self.speculation.max_draft,
            slot,
            start,
            token,
            sequences,
            timed_only,
            self.clock,
            on_progress,
        )
        self.drafting.time_draft(slot)

    # --- proposing and planning -----------------------------------------------------------------
    def _propose(self, active: Sequence[SequenceState], room: list[int], tokens_left: list[int]) -> list[Proposal]:
        """This step's proposals, each as long as its drafting planned; the sequences' stats say so."""
        cfg = self.speculation
        t = self.clock()
        chosen, plan, caps = self.drafting.draft(active, room, tokens_left)
        spent = self.clock() - t
        self.totals.draft_s += spent
        chosen = [p if len(p.tokens) >= cfg.min_draft else Proposal() for p in chosen]
        for s, k, p, cap, r in zip(active, plan.lengths, chosen, caps, room):
            s.stats.draft_s += spent / len(active)
            s.stats.policy_draft_length, s.stats.draft_length = k, len(p.tokens)
            # Paused only when the planner predicted plain decoding faster, never for a step taken to measure
            # plain decoding; a step with no choice to make (no proposal) or whose choice the token budget
            # made (too little room left for a draft worth its rows) keeps the last verdict.
            if plan.measuring_plain or not cfg.adaptive or k:
                s.stats.speculation_paused = False
            elif cap >= cfg.min_draft and r >= cfg.max_draft:
                s.stats.speculation_paused = True
        return chosen
