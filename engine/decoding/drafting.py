"""A proposer with the planner that decides, per sequence and step, how much of it to verify. The step loop
(step.py) asks each through one small interface, in the spirit of llama.cpp's common/speculative (begin /
draft / accept): begin(slot, ...) when a sequence starts, draft(...) for this step's proposals, accept(...)
with the verdicts, finish(slot, history) when it ends. drafting_for picks the kind from what the proposer's
protocol says (proposers/base.py), never from its class: a free proposer (lookup) proposes first and is then cut
to the plan; a costly one (a draft model) is planned first and drafts only what is wanted; one that offers
alternatives (auto: lookup and a draft model) has both weighed per sequence and step.

Each sequence's drafting state (its own acceptance table, whether its last proposal was kept whole, the shadow
proposal scored while it does not draft) is a DraftState that the step loop's SequenceState holds and only this
module changes."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import torch

from .acceptance import Acceptance
from .draft_planner import HORIZON_FLOOR, DraftPlanner, Plan
from .proposers.base import LOOKUP_SOURCE, PREDICTION_SOURCE, Proposal, Proposer, Want
from .proposers.prediction import PredictionProposer
from .runtime import Model
from .sampling import SamplingParams
from .speculation_config import SpeculationConfig
from .step_costs import StepCosts

if TYPE_CHECKING:
    from .proposers.base import CostlyProposer
    from .step import SequenceState
    from .verifier import Verdict

DRAFT_FEATURE = ("draft",)  # a draft model's guesses (model_feature of its source)
# A shadow proposal is scored over this many tokens at most, then the next starts from the proposal of its
# time: scored whole, a 48-token copy found on a 3-token match taught that match length 33 hits while the
# matches grew to 16 tokens unseen, and a later 3-token match drafted 11 and kept none (Gemma 3, fix-json).
SHADOW_TOKENS = 8

# This step's proposals, the plan's length for each sequence, and what bounded each (see StepLoop._propose).
Drafted = tuple[list[Proposal], Plan, list[int]]


@dataclass
class DraftState:
    """What drafting knows of one sequence, kept across its steps. The step loop's SequenceState holds it; only
    this module changes it."""

    continuing: bool = False  # its last resolved proposal was kept whole
    acceptance: Acceptance | None = None  # its own drafts' fate; the planner's shared table is the prior
    shadow: list[int] = field(default_factory=list)  # a free proposal scored while not drafting
    shadow_feature: Hashable = None
    shadow_hits: int = 0
    shadow_predicted: float = 0.0  # the tokens of the shadow the acceptance tables expected kept
    probed_s: float = 0.0  # what its costly proposers' probes have cost it this request: they share one budget

    def own(self, max_draft: int) -> Acceptance:
        """The sequence's own acceptance table, made on first use; its planner's shared table is the prior."""
        if self.acceptance is None:
            self.acceptance = Acceptance(max_draft)
        return self.acceptance


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


def prediction_feature(match_length: int, continuing: bool) -> tuple[int, bool, str]:
    """A request's prediction, grouped as lookup's copies are but apart from them: the client's guess at this very
    answer keeps its drafts at other rates than the history's coincidences."""
    return (*lookup_feature(match_length, continuing), PREDICTION_SOURCE)


def is_prediction(f: Hashable) -> bool:
    return isinstance(f, tuple) and f[-1:] == (PREDICTION_SOURCE,)


def model_feature(source: str) -> Hashable:
    """A model's guesses (a draft model's, an MTP head's) are recorded under their source, each apart."""
    return (source,)


def feature(s: SequenceState, proposal: Proposal) -> Hashable:
    """What a proposal's acceptance is predicted by, and recorded under."""
    if proposal.from_model:
        return model_feature(proposal.source)
    if proposal.source == PREDICTION_SOURCE:
        return prediction_feature(proposal.match_length, s.draft.continuing)
    return lookup_feature(proposal.match_length, s.draft.continuing)


def drafting_for(
    proposer: Proposer,
    speculation: SpeculationConfig,
    steps: StepCosts | None,
    target: Model,
    clock: Callable[[], float],
) -> Drafting:
    """How a proposer is planned, from its protocol alone: alternatives (auto) are weighed, a free proposer is
    proposed then cut to the plan, a costly one planned then drafted."""
    if proposer.alternatives:
        free, *costly = proposer.alternatives
        return AutoDrafting(proposer, free, cast("list[CostlyProposer]", costly), speculation, steps, target, clock)
    kind = FreeDrafting if proposer.free else ModelDrafting
    return kind(
        proposer, DraftPlanner(speculation, costly_proposer=not proposer.free, steps=steps), target, speculation, clock
    )


class Drafting:
    """One proposer and its planner. `planner` holds the step costs every planner of a loop shares."""

    def __init__(
        self,
        proposer: Proposer,
        planner: DraftPlanner,
        target: Model,
        speculation: SpeculationConfig,
        clock: Callable[[], float],
    ):
        self.proposer, self.planner, self.target, self.speculation, self.clock = (
            proposer,
            planner,
            target,
            speculation,
            clock,
        )

    @property
    def draft_planner(self) -> DraftPlanner:
        """The planner of a draft model's guesses (the one planner, but for auto)."""
        return self.planner

    @property
    def sources(self) -> tuple[str, ...]:
        """Who may propose its drafts, as the stats count them (Proposal.source)."""
        return ()

    predicts = False  # drafts along a request's prediction (Predicted Outputs): where a free proposer is planned

    def begin(
        self,
        slot: int,
        prompt: Sequence[int],
        sampling: SamplingParams,
        device: torch.device,
        seed: int,
        prediction: Sequence[int] = (),
    ) -> None:
        """prediction: the request's predicted answer, as tokens (none for most requests)."""
        self.proposer.start(slot, prompt, sampling, device, seed)

    def draft(self, active: Sequence[SequenceState], room: list[int], tokens_left: list[int]) -> Drafted:
        raise NotImplementedError

    def accept(
        self,
        active: Sequence[SequenceState],
        proposals: list[Proposal],
        verdicts: list[Verdict],
        tokens: list[list[int]],
    ) -> None:
        """Learn from a step's verdicts: each proposal's fate in its tables, the step's in its planner, and
        every sequence's new tokens against any shadow proposal."""
        self.record_outcome(proposals, verdicts)
        self.record_tables(active, proposals, verdicts)
        for s, new in zip(active, tokens):
            self.score_shadow(s, new)

    def record_outcome(self, proposals: list[Proposal], verdicts: list[Verdict]) -> None:
        """The drafted tokens the step kept, against what its planner expected."""
        self.planner.record_outcome(sum(v.accepted for v in verdicts))

    def finish(self, slot: int, history: Sequence[int]) -> None:
        self.proposer.finish(slot, history)

    def time_draft(self, slot: int) -> None:
        """A costly proposer's token and catch-up row, timed once (the step loop's calibration)."""

    # --- shared by every kind -------------------------------------------------------------------
    def own(self, s: SequenceState) -> Acceptance:
        return s.draft.own(self.planner.acceptance.max_draft)

    def planner_of(self, proposal: Proposal) -> DraftPlanner:
        return self.draft_planner if proposal.from_model else self.planner

    def record_tables(
        self, active: Sequence[SequenceState], proposals: list[Proposal], verdicts: list[Verdict]
    ) -> None:
        for s, proposal, verdict in zip(active, proposals, verdicts):
            k = len(proposal.tokens)
            if k:
                f = feature(s, proposal)
                # Every draft kept: the step's own token is what the proposal's next one would have been verified
                # against. Without it a planner that drafts k never learns slot k+1 (stuck at one token after a
                # miss there, since a miss lowers an estimate and nothing else reaches the slot).
                beyond = proposal.beyond if verdict.accepted == k else None
                for table in (self.planner_of(proposal).acceptance, self.own(s)):
                    table.record(f, k, verdict.accepted)
                    if beyond is not None:
                        table.record_slot(f, k, verdict.next_token == beyond)
                s.draft.continuing = verdict.accepted == k

    def score_shadow(self, s: SequenceState, new_tokens: list[int]) -> None:
        """Score a shadow proposal slot by slot as the real tokens arrive; once it is settled, its tokens kept
        against those predicted count towards the planner's realism as a drafted step's would."""
        d = s.draft
        for tok in new_tokens:
            if not d.shadow:
                return
            hit = d.shadow[d.shadow_hits] == tok
            for table in (self.planner.acceptance, self.own(s)):
                table.record_slot(d.shadow_feature, d.shadow_hits, hit)
            d.shadow_hits += 1
            if not hit or d.shadow_hits == len(d.shadow):
                d.continuing = hit
                self.planner.record_shadow_outcome(d.shadow_predicted, d.shadow_hits - (0 if hit else 1))
                d.shadow, d.shadow_hits = [], 0


class FreeDrafting(Drafting):
    """A proposer that costs next to nothing (lookup, none): propose first, then plan knowing each proposal;
    a proposal not verified becomes a shadow, scored as the real tokens arrive. A request's prediction (Predicted
    Outputs) is a free proposer of that request's own, asked first: its draft where it has one, else the proposer's."""

    predicts = True

    def __init__(
        self,
        proposer: Proposer,
        planner: DraftPlanner,
        target: Model,
        speculation: SpeculationConfig,
        clock: Callable[[], float],
    ):
        super().__init__(proposer, planner, target, speculation, clock)
        self.predictions = PredictionProposer()

    @property
    def sources(self) -> tuple[str, ...]:
        return (LOOKUP_SOURCE,)

    def begin(
        self,
        slot: int,
        prompt: Sequence[int],
        sampling: SamplingParams,
        device: torch.device,
        seed: int,
        prediction: Sequence[int] = (),
    ) -> None:
        super().begin(slot, prompt, sampling, device, seed)
        self.predict(slot, prompt, prediction)

    def predict(self, slot: int, prompt: Sequence[int], prediction: Sequence[int]) -> None:
        """Sequence `slot` drafts along this prediction first (none: it has none)."""
        self.predictions.start(slot, len(prompt), prediction)
        # One client's guess says nothing of the next one's, so each is learnt afresh, within its request. Planned
        # adaptively after a wrong prediction, the next request's right one kept 138 of 292 tokens; learnt afresh,
        # 194; in each sequence's own table alone (slower to move off the prior), 91.
        if len(prediction):
            self.planner.acceptance.forget(is_prediction)

    def finish(self, slot: int, history: Sequence[int]) -> None:
        super().finish(slot, history)
        self.predictions.finish(slot)

    def offers(self, active: Sequence[SequenceState]) -> list[Proposal]:
        """Each sequence's proposal: its prediction's draft, where it has a prediction that drafts now, else the
        proposer's (asked only for the others)."""
        wants: list[Want] = [(s.slot, s.history, self.speculation.max_draft) for s in active]
        if not self.predictions:
            return self.proposer.propose(wants)
        predicted = [self.predictions.propose_one(*w) if self.predictions.has(w[0]) else Proposal() for w in wants]
        rest = [w for w, p in zip(wants, predicted) if not p.tokens]
        others = iter(self.proposer.propose(rest) if rest else [])
        return [p if p.tokens else next(others) for p in predicted]

    def draft(self, active: Sequence[SequenceState], room: list[int], tokens_left: list[int]) -> Drafted:
        planner = self.planner
        offered = [self._up_to_end(p) if s.stops_at_end else p for s, p in zip(active, self.offers(active))]
        features = [feature(s, p) for s, p in zip(active, offered)]
        caps = [min(r, len(p.tokens)) for r, p in zip(room, offered)]
        plan = planner.plan(features, caps, [self.own(s) for s in active])
        chosen = [
            Proposal(p.tokens[:k], None, p.match_length, p.source, p.tokens[k] if k < len(p.tokens) else None)
            if k
            else Proposal()
            for p, k in zip(offered, plan.lengths)
        ]
        for s, p, f, k in zip(active, offered, features, plan.lengths):
            d = s.draft
            if not k and p.tokens and not d.shadow:  # not drafting: score what it would have said
                d.shadow, d.shadow_feature, d.shadow_hits = p.tokens[:SHADOW_TOKENS], f, 0
                d.shadow_predicted = planner.acceptance.expected_tokens(f, self.own(s), len(d.shadow))[-1] - 1.0
        return chosen, plan, caps

    def _up_to_end(self, proposal: Proposal) -> Proposal:
        """A draft that copies its source past an end token (a prompt's turn into the chat template that
        follows it) is cut after that token: nothing after it can be kept, as the answer ends there."""
        for i, tok in enumerate(proposal.tokens):
            if self.target.is_end(tok):
                return Proposal(proposal.tokens[: i + 1], proposal.probs, proposal.match_length, proposal.source)
        return proposal


class ModelDrafting(Drafting):
    """A draft model costs a decode per token: plan first, then draft only what is wanted, timed (its catch-up
    apart from the drafted tokens)."""

    proposer: CostlyProposer

    @property
    def sources(self) -> tuple[str, ...]:
        """Its drafts' source: the proposer's own (a draft model's "draft", an MTP head's "mtp")."""
        return (self.proposer.source,)

    def plan(self, active: Sequence[SequenceState], room: list[int], tokens_left: list[int]) -> Plan:
        """The plan, with each sequence's catch-up to repay within the tokens to come."""
        return self.planner.plan(
            [model_feature(self.proposer.source)] * len(active),
            room,
            [self.own(s) for s in active],
            lags=[self.proposer.lag(s.slot, s.history) for s in active],
            horizon=[tokens_to_come(s, left) for s, left in zip(active, tokens_left)],
            probed_s=[s.draft.probed_s for s in active],
        )

    def draft(
        self, active: Sequence[SequenceState], room: list[int], tokens_left: list[int], plan: Plan | None = None
    ) -> Drafted:
        t = self.clock()
        plan = plan or self.plan(active, room, tokens_left)
        wants: list[Want] = [(s.slot, s.history, k) for s, k in zip(active, plan.lengths) if k]
        made = iter(self.proposer.propose(wants) if wants else [])
        chosen = [next(made) if k else Proposal() for k in plan.lengths]
        spent = self.clock() - t
        if plan.probe_s:
            probing = [s for s, k in zip(active, plan.lengths) if k]
            for s in probing:
                s.draft.probed_s += plan.probe_s / len(probing)
        caught_rows, caught_s = self.proposer.last_catch_up if wants else (0, 0.0)
        self.planner.record_catch_up(caught_rows, caught_s)
        self.planner.record_draft(sum(len(p.tokens) for p in chosen), spent - caught_s)
        return chosen, plan, room

    def time_draft(self, slot: int) -> None:
        if not self.planner.draft_timed:
            token_s, catch_up_row_s = self.proposer.time_draft(slot)
            self.planner.record_draft(1, token_s)
            # A row of a batched catch-up costs no more than a one-row decode; one timed dearer was timed in a
            # busy spell, and taken as it was it made every catch-up look too dear to repay, so the draft never
            # ran and no live catch-up could correct it.
            self.planner.record_catch_up(1, min(catch_up_row_s, token_s))


class AutoDrafting(Drafting):
    """A proposer's alternatives (auto's: lookup's copy and each drafter's guess: a draft model's, the target's own MTP
    head's), weighed per sequence and step. The planners share the step costs: `planner` plans the free proposer's
    copies, one more per costly proposer its guesses (each keeps its own acceptance, realism and probing). Each
    sequence verifies whichever proposal promises more tokens per second of its step, a drafter's own tokens counted;
    a drafter that wins no sequence is not asked at all, so an idle one costs nothing that step."""

    predicts = True  # its copies' drafting asks each request's prediction first

    def __init__(
        self,
        proposer: Proposer,
        free: Proposer,
        costly: Sequence[CostlyProposer],
        speculation: SpeculationConfig,
        steps: StepCosts | None,
        target: Model,
        clock: Callable[[], float],
    ):
        copies = DraftPlanner(speculation, costly_proposer=False, steps=steps)
        super().__init__(proposer, copies, target, speculation, clock)
        self.copies = FreeDrafting(free, copies, target, speculation, clock)
        self.guesses = [
            ModelDrafting(
                c, DraftPlanner(speculation, costly_proposer=True, steps=copies.steps), target, speculation, clock
            )
            for c in costly
        ]

    @property
    def draft_planner(self) -> DraftPlanner:
        """The first drafter's planner (the draft model's, where there is one)."""
        return self.guesses[0].planner

    @property
    def sources(self) -> tuple[str, ...]:
        return (*self.copies.sources, *(source for g in self.guesses for source in g.sources))

    def draft(self, active: Sequence[SequenceState], room: list[int], tokens_left: list[int]) -> Drafted:
        """Every proposer plans (planning is cheap); each drafter then drafts for the sequences it won alone."""
        copies, copy_plan, caps = self.copies.draft(active, room, tokens_left)
        if copy_plan.measuring_plain:
            return copies, copy_plan, caps
        plans = [g.plan(active, room, tokens_left) for g in self.guesses]
        winners = self.choose(len(active), copy_plan, plans)
        self.planner.keep_only(copy_plan, [w < 0 for w in winners])
        chosen, lengths = list(copies), list(copy_plan.lengths)
        for j, (guesses, plan) in enumerate(zip(self.guesses, plans)):
            won = [w == j for w in winners]
            guesses.planner.keep_only(plan, won)
            if not any(won):
                continue
            wanted = replace(plan, lengths=[k if u else 0 for k, u in zip(plan.lengths, won)])
            made, _, _ = guesses.draft(active, room, tokens_left, wanted)
            for i in (i for i, u in enumerate(won) if u):
                chosen[i], lengths[i] = made[i], plan.lengths[i]
        measuring = any(p.measuring_plain for p in plans) and not any(lengths)
        return chosen, Plan(lengths, measuring), room  # room bounds every proposal

    def choose(self, n: int, copy_plan: Plan, plans: list[Plan]) -> list[int]:
        """Per sequence, which drafter's guess to verify (its index), or -1 for the copy: the guess that promises
        more tokens per second of the step than the copy and than every other guess."""
        steps = self.planner.steps

        def rate(plan: Plan, k: int, i: int, drafting: float) -> float:
            gained = plan.expected[i] if k and plan.expected else 0.0
            return (n + gained) / ((steps.seconds(n + k, drafted=k > 0) or 1.0) + drafting * k)

        winners = []
        for i, c in enumerate(copy_plan.lengths):
            best, best_rate = -1, rate(copy_plan, c, i, 0.0)
            for j, (guesses, plan) in enumerate(zip(self.guesses, plans)):
                g = plan.lengths[i]
                if not g:
                    continue
                r = rate(plan, g, i, guesses.planner.draft_seconds_per_token)
                # A plan that bets on nothing (a probe, or fixed lengths) is taken where nothing else is offered.
                if (r > best_rate) if plan.expected else (best < 0 and not c):
                    best, best_rate = j, r
            winners.append(best)
        return winners

    def record_outcome(self, proposals: list[Proposal], verdicts: list[Verdict]) -> None:
        """Each planner learns from its own proposer's drafts."""
        for guesses in self.guesses:
            mine = [p.source in guesses.sources for p in proposals]
            guesses.planner.count_step(any(p.tokens and m for p, m in zip(proposals, mine)))
            guesses.planner.record_outcome(sum(v.accepted for v, m in zip(verdicts, mine) if m))
        self.planner.record_outcome(sum(v.accepted for v, p in zip(verdicts, proposals) if not p.from_model))

    def time_draft(self, slot: int) -> None:
        for guesses in self.guesses:
            guesses.time_draft(slot)

    def begin(
        self,
        slot: int,
        prompt: Sequence[int],
        sampling: SamplingParams,
        device: torch.device,
        seed: int,
        prediction: Sequence[int] = (),
    ) -> None:
        super().begin(slot, prompt, sampling, device, seed)  # auto's proposer starts every alternative
        self.copies.predict(slot, prompt, prediction)

    def finish(self, slot: int, history: Sequence[int]) -> None:
        super().finish(slot, history)
        self.copies.predictions.finish(slot)
