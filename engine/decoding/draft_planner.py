"""How many draft rows each sequence should verify next: the one planner the chat (one sequence), the lab and the
server (many) plan their steps with, from step costs (step_costs.py) and acceptance (acceptance.py).

Each sequence's draft length is the one that maximises the batch's expected tokens per second (allocate_draft_rows).
Plain decoding (k = 0) is always a candidate and wins whenever speculation is not predicted to pay by MIN_GAIN. A
costly proposer (a draft model) is probed now and then while plain decoding wins, and its catch-up (the prompt its
cache must process first) must be repaid within the tokens still to come.

MIN_GAIN and the realism window, horizon and range were swept on replayed recordings (engine.measure.replay;
docs/benchmarks.md): each moved a step either way changed no recording's geometric mean by more than 3%, none of them
upwards on all.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from .acceptance import Acceptance
from .speculation_config import SpeculationConfig
from .step_costs import MEDIAN_WINDOW, StepCosts

MIN_GAIN = 1.05  # speculate only when predicted this much faster: a near-even bet loses to noise (swept)
# A costly proposer (a draft model) is probed while plain decoding wins, at growing intervals, so a draft
# that does not pay costs a few percent at most yet a draft that starts paying is noticed.
FIRST_DRAFT_PROBE_AFTER = 8  # plain steps before a draft model's first probe (fa010b1)
PROBE_INTERVAL_GROWTH = 2  # each probe that does not lead to drafting doubles the wait before the next
LONGEST_PROBE_INTERVAL = 256  # the longest wait between probes, in plain steps (fa010b1)
PROBE_DRAFT = 2  # tokens a probe drafts (or min_draft, if more): two slots measured for little (fa010b1)
# The acceptance model's bias, corrected: drafted tokens kept over those it predicted, summed over the last
# steps that drafted. Per-feature estimates miss what a feature cannot see (an answer that copies its
# prompt line by line but edits every line): long matches then predict far more than is kept, and a busy
# batch pays for every one of those rows (measured: 4 clients, lookup 0.82x plain before this; e20ac10).
REALISM_WINDOW = 24  # drafted steps whose kept / predicted tokens make the realism factor
REALISM_RANGE = (0.2, 1.2)  # bounds of the realism factor (e20ac10)
REALISM_MIN_OUTCOMES = 4  # outcomes before realism departs from 1: fewer are one answer's luck (dc7dcb5)
# Outcomes older than this many steps no longer count: a low realism stops drafting, and with it the
# outcomes that could raise it again (measured: 4 early misses held a server at plain decoding for the
# next 460 steps, through answers that copied their prompts whole). Meanwhile the shadow proposals keep
# the acceptance tables current, so after a pause the planner bets on what they have seen since.
REALISM_HORIZON = 64  # steps after which a drafted step's outcome stops counting (8a2b122)
# A probe of a costly proposer costs its catch-up (the rows its cache lags: a whole prompt, at first), its tokens
# and its wider verify. It is made only when that, with every probe the answer made before it, is at most this share
# of the answer's time still to come at plain speed (the 0.5B draft's first probe of a Qwen2.5-Coder chat answer paid
# 2.6 s of prompt processing, a third of the answer's 8 s plain decode, for 2 tokens). Each probe alone within the
# share let an answer probe four times, 5-8% of an open question that the draft then never drafted (issue 65).
PROBE_SHARE = 0.02  # most of the answer's remaining plain-speed time its probes may cost, together (e988dd1)
# The tokens still to come are not known (an answer stops when it will): a sequence is taken to go on for as
# long as it has gone so far, at least this long, within its budget.
HORIZON_FLOOR = 32  # the fewest tokens a sequence is expected still to make (e988dd1)
# Speculative steps between plain ones while a costly proposer drafts every step (it may never stop on
# its own at p_min 0): without a measured plain step there is nothing to judge drafting against.
PLAIN_PROBE_EVERY = 32  # drafted steps in a row before a costly proposer's plain measuring step (24f4335)


def _ratio(outcomes: Sequence[tuple[int, float, int]]) -> float:
    """Kept / predicted over (step, predicted, kept) outcomes; 1 for fewer than REALISM_MIN_OUTCOMES."""
    predicted = sum(p for _, p, _ in outcomes)
    if len(outcomes) < REALISM_MIN_OUTCOMES or predicted <= 0:
        return 1.0
    return sum(k for _, _, k in outcomes) / predicted


def allocate_draft_rows(
    expected: list[list[float]],
    caps: list[int],
    base_rows: int,
    step_seconds: Callable[[int], float],
    draft_seconds_per_token: float = 0.0,
    min_gain: float = 1.0,
) -> list[int]:
    """Draft lengths (one per sequence) that maximise expected tokens per second for the batch.

    expected[i][k] is sequence i's expected tokens from a step that verifies k of its drafts. A step
    costs step_seconds(total rows), shared by everyone, so a draft row is worth adding only where its
    expected gain beats what it slows the whole batch. Marginal gains within a sequence never grow
    (each is a product of acceptance probabilities), so adding rows best-gain-first gives the best
    split for every total; the total with the best rate wins, if it beats no drafts by min_gain.
    """
    k = [0] * len(expected)
    tokens = sum(e[0] for e in expected)
    plain_rate = tokens / step_seconds(base_rows)
    best_rate, best = plain_rate * min_gain, list(k)
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


@dataclass(frozen=True)
class Plan:
    lengths: list[int]  # draft rows per sequence
    measuring_plain: bool = False  # all zero to measure a plain step, not because plain is predicted faster
    # Per sequence, the drafted tokens expected kept at its length: as the bet counted on them, and as the
    # estimates say, scaled by realism (auto weighs a copy against a guess by these: each may beat plain decoding
    # only on a sure bet, but the less-seen one must not lose the comparison for being less seen). Empty when
    # nothing was predicted (no proposals, fixed lengths, a probe).
    predicted: list[float] = field(default_factory=list)
    expected: list[float] = field(default_factory=list)
    probe_s: float = 0.0  # a probe's predicted cost (catch-up, tokens, wider verify), charged to the probing sequences


class DraftPlanner:
    """Chooses every sequence's draft length for the next step from StepCosts and Acceptance."""

    def __init__(self, config: SpeculationConfig, costly_proposer: bool, steps: StepCosts | None = None):
        self.config = config
        self.costly = costly_proposer
        self.steps = steps or StepCosts()
        self.acceptance = Acceptance(max(config.max_draft, 1))
        self._draft_per_token: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self._catch_up_per_row: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self._steps_without_drafts = 0
        self._steps_with_drafts = 0
        self._probe_interval = FIRST_DRAFT_PROBE_AFTER
        self._outcomes: deque[tuple[int, float, int]] = deque(maxlen=REALISM_WINDOW)  # (step, predicted, kept)
        self._shadow_outcomes: deque[tuple[int, float, int]] = deque(maxlen=REALISM_WINDOW)  # the same, undrafted
        self._step = 0
        self._predicted = 0.0  # drafted tokens the last plan expected to be kept

    # --- measurements -------------------------------------------------------------------------
    def begin_request(self) -> None:
        """A new chat answer: step costs carry over (they are the machine's); acceptance mostly not."""
        self.acceptance.fade()

    def record_step(self, rows: int, drafted_rows: int, seconds: float) -> float:
        """Take one step's time; returns it in one-row steps' seconds."""
        per_row = self.steps.record(rows, seconds, drafted=drafted_rows > 0)
        self.count_step(drafted_rows > 0)
        return per_row

    def count_step(self, drafted: bool) -> None:
        """One step went by, verifying this planner's drafts or not (a second planner sharing the step costs,
        as --method auto's draft model beside lookup, counts its steps without timing them twice)."""
        self._step += 1
        self._steps_without_drafts = 0 if drafted else self._steps_without_drafts + 1
        self._steps_with_drafts = self._steps_with_drafts + 1 if drafted else 0

    def keep_only(self, plan: Plan, used: list[bool]) -> None:
        """Only these sequences' drafts from `plan` are verified (another proposer's won the rest): the
        realism check then weighs what is kept against what was predicted for those alone."""
        if plan.predicted:
            self._predicted = sum(p for p, u in zip(plan.predicted, used) if u)

    def record_outcome(self, kept: int) -> None:
        """Drafted tokens the step just verified kept, all sequences together (after a plan that drafted)."""
        if self._predicted > 0:
            self._outcomes.append((self._step, self._predicted, kept))
        self._predicted = 0.0

    def record_shadow_outcome(self, predicted: float, kept: int) -> None:
        """A proposal scored while not drafting, settled: what it would have kept against what was predicted."""
        if predicted > 0:
            self._shadow_outcomes.append((self._step, predicted, kept))

    @property
    def realism(self) -> float:
        """Kept / predicted drafted tokens lately (1 until a few steps have drafted). Below 1, the shadows
        settled lately may lift it back as far as 1: a low realism stops drafting, so without them it could
        only rise as its misses aged out (after two early misses, realism 0.45, Gemma 3's fix-json answer
        decoded plainly through two copies of 30 and 48 tokens; replayed 1.59x plain, the hindsight bound
        2.47x). They never raise it past 1: proposals the planner turned down are not the ones it drafts."""
        for outcomes in (self._outcomes, self._shadow_outcomes):
            while outcomes and outcomes[0][0] < self._step - REALISM_HORIZON:
                outcomes.popleft()
        drafted = _ratio(self._outcomes)
        if drafted < 1.0:
            drafted = max(drafted, min(1.0, _ratio([*self._outcomes, *self._shadow_outcomes])))
        low, high = REALISM_RANGE
        return min(high, max(low, drafted))

    def record_draft(self, tokens: int, seconds: float) -> None:
        """Take the time a costly proposer spent on `tokens` draft tokens. Kept in units of the target's
        one-row step at the time, so the two scale together: a thread trial or a busy core that slows
        the target does not make the draft look cheap next to it (it did: a draft as large as its target
        was probed during a one-thread trial, and its prompt processing cost that answer 25%)."""
        one_row = self.steps.seconds(1)
        if tokens and one_row:
            self._draft_per_token.append(seconds / tokens / one_row)

    def record_catch_up(self, rows: int, seconds: float) -> None:
        """Take the time a costly proposer spent catching up on `rows` tokens (prompt processing), kept apart
        from its drafted tokens' and, as theirs, in units of the target's one-row step."""
        one_row = self.steps.seconds(1)
        if rows and one_row:
            self._catch_up_per_row.append(seconds / rows / one_row)

    def catch_up_seconds(self, rows: int) -> float:
        """Predicted seconds for the costly proposer to catch up on `rows` tokens (0 before any timing)."""
        if not (self.costly and rows and self._catch_up_per_row):
            return 0.0
        return rows * statistics.median(self._catch_up_per_row) * (self.steps.seconds(1) or 0.0)

    @property
    def draft_timed(self) -> bool:
        return bool(self._draft_per_token)

    @property
    def draft_seconds_per_token(self) -> float:
        if not (self.costly and self._draft_per_token):
            return 0.0
        return statistics.median(self._draft_per_token) * (self.steps.seconds(1) or 0.0)

    def _hopeless(self, n: int) -> bool:
        """True when drafting could not beat plain decoding by MIN_GAIN even if every drafted token were kept:
        for no number of draft rows K does (n + K) tokens in K drafted tokens' time plus a step of n + K rows
        beat a plain step of n by that much. The plan never drafts on less, so a probe could teach it nothing,
        and probing only costs (measured: a draft model as large as the target lost 10-19% to its probes and
        their catch-up; one timed 0.8x its target, by noise, was still probed and its first probe paid the
        draft's prompt processing, 0.18 s of a Gemma 3 answer)."""
        d, plain = self.draft_seconds_per_token, self.steps.seconds(n)
        if not self._draft_per_token or plain is None:
            return False
        return all(
            (n + k) / (k * d + self.steps.measured_seconds(n + k, drafted=True)) <= MIN_GAIN * n / plain
            for k in range(1, n * self.config.max_draft + 1)
        )

    # --- decision -----------------------------------------------------------------------------
    def plan(
        self,
        features: list[Hashable],
        caps: list[int],
        own: list[Acceptance | None] | None = None,
        taken_rows: int = 0,
        lags: list[int] | None = None,
        horizon: list[int] | None = None,
        probed_s: list[float] | None = None,
    ) -> Plan:
        """Draft lengths for sequences with these proposal features; caps bound each (room, proposal); own:
        each sequence's own acceptance table, if it keeps one; taken_rows: draft rows this step verifies anyway
        (another proposer's, planned first), which every row planned here is added to. For a costly proposer,
        lags: the tokens each sequence's draft cache must catch up on before it drafts; horizon: the tokens
        each sequence is expected still to make (HORIZON_FLOOR). A draft must repay its catch-up within them.
        probed_s: what each sequence's probes have cost so far (DraftState.probed_s), which a next probe adds to."""
        cfg, n = self.config, len(caps)
        caps = [max(0, min(c, cfg.max_draft)) for c in caps]
        if not cfg.adaptive or cfg.max_draft == 0:
            return Plan([c if c >= cfg.min_draft else 0 for c in caps])
        if not any(caps) and not self.costly:  # nothing proposed (no match): no choice to make, and no plan to pay
            self._predicted = 0.0
            return Plan([0] * n, measuring_plain=not self.steps.measured(n))
        if not self.steps.measured(n):
            return Plan([0] * n, measuring_plain=True)  # first the step that drafting is judged against
        if self.costly and self._steps_with_drafts >= PLAIN_PROBE_EVERY:
            return Plan([0] * n, measuring_plain=True)
        raw = [self.acceptance.expected_tokens(f, o, c) for f, o, c in zip(features, own or [None] * n, caps)]
        h = self.realism
        # Scaled by realism, but never past what a step can yield: k drafts make at most k + 1 tokens.
        expected = [[min(1.0 + k, 1.0 + (e - 1.0) * h) for k, e in enumerate(per)] for per in raw]
        steps = self.steps
        lengths = allocate_draft_rows(
            expected,
            [len(e) - 1 for e in raw],
            n + taken_rows,
            lambda rows: steps.measured_seconds(rows, drafted=rows > n),
            self.draft_seconds_per_token,
            MIN_GAIN,
        )
        lengths = [k if k >= cfg.min_draft else 0 for k in lengths]
        gained = [e[k] - 1.0 for e, k in zip(expected, lengths)]
        if any(lengths) and not self._repays(lengths, gained, n + taken_rows, lags, horizon):
            lengths = [0] * n
        predicted = [e[k] - 1.0 for e, k in zip(raw, lengths)]
        self._predicted = sum(predicted)
        if any(lengths):
            self._probe_interval = FIRST_DRAFT_PROBE_AFTER
            mean = [
                min(k, (self.acceptance.expected_tokens(f, o, k, bet=False)[-1] - 1.0) * h) if k else 0.0
                for f, o, k in zip(features, own or [None] * n, lengths)
            ]
            return Plan(lengths, predicted=predicted, expected=mean)
        if self.costly and self._steps_without_drafts >= self._probe_interval and any(caps) and not self._hopeless(n):
            probe = [min(max(cfg.min_draft, PROBE_DRAFT), c) for c in caps]
            cost = self._probe_cost(probe, n + taken_rows, lags)
            if self._probe_affordable(cost, n + taken_rows, horizon, probed_s):
                self._probe_interval = min(PROBE_INTERVAL_GROWTH * self._probe_interval, LONGEST_PROBE_INTERVAL)
                return Plan(probe, probe_s=cost)  # a probe keeps acceptance current
        return Plan(lengths)

    def _repays(
        self, lengths: list[int], gained: list[float], rows: int, lags: list[int] | None, horizon: list[int] | None
    ) -> bool:
        """A bet on drafts saves, over the tokens expected still to come, more than their catch-up costs."""
        catch_up = self._catch_up_of(lengths, lags)
        if not catch_up or horizon is None:
            return True
        n, drafted, steps = len(lengths), sum(lengths), self.steps
        plain_rate = n / steps.measured_seconds(rows)
        drafting = steps.measured_seconds(rows + drafted, drafted=True) + drafted * self.draft_seconds_per_token
        rate = (n + sum(gained)) / drafting
        to_come = sum(horizon)
        return to_come / plain_rate - to_come / rate > catch_up

    def _catch_up_of(self, lengths: list[int], lags: list[int] | None) -> float:
        """Seconds the sequences that draft (length > 0) need to catch up first."""
        return self.catch_up_seconds(sum(lag for lag, k in zip(lags or [], lengths) if k))

    def _probe_cost(self, probe: list[int], rows: int, lags: list[int] | None) -> float:
        """A probe's seconds: its catch-up, its tokens and its wider verify."""
        drafted, steps = sum(probe), self.steps
        return (
            self._catch_up_of(probe, lags)
            + drafted * self.draft_seconds_per_token
            + steps.measured_seconds(rows + drafted, drafted=True)
            - steps.measured_seconds(rows)
        )

    def _probe_affordable(
        self, cost: float, rows: int, horizon: list[int] | None, probed_s: list[float] | None
    ) -> bool:
        """The probe, with what the sequences' probes cost before it, is at most PROBE_SHARE of the time still to
        come."""
        if horizon is None:
            return True
        spent = sum(probed_s or ())
        return cost + spent <= PROBE_SHARE * sum(horizon) / len(horizon) * self.steps.measured_seconds(rows)
