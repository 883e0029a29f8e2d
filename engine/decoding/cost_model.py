"""The one cost model: how long a target step takes for a number of verified rows, how often drafts
are accepted, and so how many draft rows each sequence should verify next. The chat (one sequence),
the lab and the server (many) all plan their steps with DraftPlanner.

A step that verifies k drafts yields E(k) = 1 + sum_j prod_{i<=j} a_i tokens, where a_i is the measured
acceptance at draft slot i given the slots before it were kept. Acceptance is kept per *feature* of a
proposal, not per slot alone: for prompt lookup the length of the matched n-gram and whether this
source has been continuing well (a 12-token match that has been copying is almost always right; a
1-token match rarely is), for a draft model just the slot. Step times are medians of recent steps by
row count, so an outlier (a busy core, a page fault) does not steer the plan. Plain decoding (k = 0) is
always a candidate and wins whenever speculation is not predicted to pay by MIN_GAIN.
"""

from __future__ import annotations

import bisect
import heapq
import math
import statistics
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from ..errors import InvalidSettingError
from ..methods import DEFAULT_MAX_DRAFT, DEFAULT_MIN_DRAFT, MAX_DRAFT_LIMIT, MAX_DRAFT_RANGE, MIN_DRAFT_RANGE


@dataclass
class SpeculationConfig:
    max_draft: int = DEFAULT_MAX_DRAFT
    min_draft: int = DEFAULT_MIN_DRAFT
    adaptive: bool = True
    exact: bool = False  # every verify within the width this build decodes as one-row steps do (exactness.py)

    def __post_init__(self) -> None:
        low, high = MAX_DRAFT_RANGE
        if not (isinstance(self.max_draft, int) and low <= self.max_draft <= high):
            raise InvalidSettingError(f"max draft tokens must be {low}..{high}, got {self.max_draft!r}")
        if not (isinstance(self.min_draft, int) and MIN_DRAFT_RANGE[0] <= self.min_draft <= max(1, self.max_draft)):
            raise InvalidSettingError(f"min draft tokens must be 1..max draft, got {self.min_draft!r}")


# --- step times ---------------------------------------------------------------------------------
WINDOW = 9  # recent observations whose median is an estimate
# A step's time = base(rows) x drift. The base curve is the machine's and the model's, timed once per
# size up front (calibrate()); the drift (the median of recent steps' actual / base) follows what the
# base cannot: a longer context, fewer threads, another program on the cores. The base is never rewritten
# from the drift, so the two cannot chase each other: a server whose batch never takes a one-row step
# still predicts one right when its last client is alone (it did not, while both were learned together).
# Beyond the largest size known: the cheaper of the last measured slope and a power law r^0.5 (measured on
# this 2-core CPU, Gemma 3 270M: 2 rows 2.1x, 8 rows 3.8x, 16 rows 5.1x, 32 rows 9.1x one row).
ROW_COST_EXPONENT = 0.5
OPTIMISTIC_ROW_COST = 0.1  # before any multi-row step: each extra row ~10% of a step (a GPU's figure)
# Another process is using the cores when plain steps' drift runs this much above the quietest of the last
# QUIET_MEMORY plain steps. Plain steps only, and a sliding memory, because a step also slows as the context
# grows (SmolLM2 with flash attention on this CPU: one row 9.1 ms at position 0, 17.1 at 400, 27.3 at 800)
# and a drafted step more so (24 rows 112.8, 257.5, 445.0 ms): judged on every step against the quietest
# ever, answers that copied tripped the alarm every few dozen steps, and each false trial verified its
# drafts on one thread (49 rows: 1.0 s against 0.53; repeat-email 52 tok/s against 112). Nor is calibration
# the quiet mark: it decodes in an empty cache, and the first live steps ran 1.6x it.
CONTENDED = 1.6
QUIET_MEMORY = 64
# Steps that verify drafts cost more live than their calibrated base says, beyond the drift that the
# (mostly one-row) plain steps set: on Gemma 3 270M here, after one-row steps, 4 rows took 2.9 one-row steps
# against 2.44 calibrated, 8 rows 4.1 against 3.35, 16 rows 6.2 against 5.2 (a wide step after narrow ones
# finds colder caches, and calibration keeps each size's fastest). So drafted steps keep their own factor over
# base x drift, the median of recent ones, and the planner prices draft rows with it.
DRAFTED_FACTOR_RANGE = (0.8, 1.5)
# Calibration decodes once untimed first: the first decode after a load or a pause ran ~25% slow (SmolLM2,
# 1 row: 6.9 ms against 5.5 after), and a slow one-row base made every verify look that much cheaper than
# it is (8 rows: 3.4 plain steps predicted, 4.9 paid), so drafts that lose were taken.
CALIBRATION_WARMUP = 2
# A decode wider than any before grows llama.cpp's compute buffers: timed once in rising order, the wide sizes
# came out 15-23% dear (Gemma 3 270M, 32 rows: 97.7 ms, against 79.4 as the faster of two), which kept
# copies from drafting long. So the widest size is decoded once untimed first, and every size one sequence
# may verify is timed twice; wider ones (a batch of sequences) once.
CALIBRATION_REPEATS = 2
CALIBRATION_REPEATED_UP_TO = MAX_DRAFT_LIMIT + 1
CALIBRATION_EVERY_SIZE = 17  # rows timed one by one; then every 8th to 64, every 32nd beyond (and the largest)
CALIBRATION_STRIDE = 8
CALIBRATION_WIDE_FROM, CALIBRATION_WIDE_STRIDE = 64, 32


def calibration_sizes(max_rows: int) -> list[int]:
    """Rows to time up front. The curve is not smooth (Gemma 3 Q4_K on this 2-core CPU verifies 16 rows
    for 5.2 one-row steps but 15 rows for 7.2), so every size up to 17, then every 8th to 64, then every
    32nd (a batch of sequences; a 264-row step takes 0.6 s here), then max_rows."""
    sizes = list(range(1, min(max_rows, CALIBRATION_EVERY_SIZE) + 1))
    sizes += range(3 * CALIBRATION_STRIDE, min(max_rows, CALIBRATION_WIDE_FROM) + 1, CALIBRATION_STRIDE)
    sizes += range(CALIBRATION_WIDE_FROM + CALIBRATION_WIDE_STRIDE, max_rows + 1, CALIBRATION_WIDE_STRIDE)
    if sizes[-1] < max_rows:
        sizes.append(max_rows)
    return sizes


class StepCosts:
    """Seconds of one target step by rows verified (all sequences' rows together)."""

    def __init__(self) -> None:
        self._base: dict[int, float] = {}  # rows -> seconds, calibrated (or, uncalibrated, first seen)
        self._drift: deque[float] = deque(maxlen=WINDOW)  # recent steps' actual / base
        self._drift_now = 1.0  # their median, kept current: the planner reads it dozens of times a step
        self._drafted: deque[float] = deque(maxlen=WINDOW)  # recent drafted steps' actual / (base x drift)
        self.drafted_factor = 1.0  # their median, once three are in (DRAFTED_FACTOR_RANGE)
        self._plain: deque[float] = deque(maxlen=WINDOW)  # recent plain steps' actual / base, since the last reset
        self._quiet: deque[float] = deque(maxlen=QUIET_MEMORY)  # their medians, once three are in
        self._rows: list[int] = []  # the base's sizes, sorted, and their seconds: rebuilt on change
        self._secs: list[float] = []
        self._known: dict[int, float] = {}  # _base_of's answers, kept until the base changes (read ~50x a plan)
        self.calibrated = False  # take_calibration() has run

    def record(self, rows: int, seconds: float, drafted: bool = False) -> float:
        """Take one step's time (drafted: it verified drafts); returns it in one-row steps' seconds (the
        thread tuner compares those)."""
        if not self.calibrated and rows not in self._base:  # learn the base from the first step of a size
            self._set_base({**self._base, rows: seconds / self.drift})
        ratio = seconds / self._base_of(rows)
        if drafted:
            self._drafted.append(ratio / self._drift_now)
            if len(self._drafted) >= 3:
                low, high = DRAFTED_FACTOR_RANGE
                self.drafted_factor = min(high, max(low, statistics.median(self._drafted)))
        else:
            self._plain.append(ratio)
            if len(self._plain) >= 3:
                self._quiet.append(statistics.median(self._plain))
        self._drift.append(ratio)
        self._drift_now = statistics.median(self._drift)
        return ratio * self._base_of(1)

    def take_calibration(self, timings: dict[int, float]) -> None:
        """Take a measured curve: seconds by rows, with rows = 1 among them."""
        self.calibrated = True
        self._set_base(dict(timings))
        self.rescale()
        self._drift.extend([1.0] * 3)

    def rescale(self) -> None:
        """The machine changed (fewer threads): keep the base curve, measure the drift and the quiet mark afresh."""
        self._drift.clear()
        self._drift_now = 1.0
        self._plain.clear()
        self._quiet.clear()

    def _set_base(self, base: dict[int, float]) -> None:
        self._base = base
        self._rows, self._secs = map(list, zip(*sorted(base.items())))
        self._known = {}

    @property
    def drift(self) -> float:
        return self._drift_now

    def measured(self, rows: int) -> bool:
        return bool(self._drift) and (rows in self._base or (self.calibrated and rows >= 1))

    @property
    def contended(self) -> bool:
        """Plain steps are much slower than this machine managed on them lately."""
        return bool(self._quiet) and self._quiet[-1] > CONTENDED * min(self._quiet)

    def seconds(self, rows: int, drafted: bool = False) -> float | None:
        """Predicted seconds of a step of `rows` rows; drafted: one that verifies drafts."""
        if not self._base:
            return None
        return self._base_of(rows) * self._drift_now * (self.drafted_factor if drafted else 1.0)

    def plain_seconds(self, rows: int) -> float | None:
        """Predicted seconds of a plain step of `rows` rows from plain steps alone: the base times their recent
        drift (1 before any). Not the planner's drift, which drafted steps move too: a verify dearer than its
        base must not make plain decoding look dear as well."""
        if not self._base:
            return None
        return self._base_of(rows) * (statistics.median(self._plain) if self._plain else 1.0)

    def _base_of(self, rows: int) -> float:
        """Seconds of a step of `rows` rows before drift: measured, interpolated, or extrapolated."""
        known = self._known.get(rows)
        if known is None:
            known = self._known[rows] = self._curve(rows)
        return known

    def _curve(self, rows: int) -> float:
        sizes, secs = self._rows, self._secs
        i = bisect.bisect_left(sizes, rows)
        if i < len(sizes) and sizes[i] == rows:
            return secs[i]
        if 0 < i < len(sizes):
            r0, r1, c0, c1 = sizes[i - 1], sizes[i], secs[i - 1], secs[i]
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
        r_top, c_top = sizes[-1], secs[-1]
        if i == 0:  # below the smallest size seen (uncalibrated): proportionally
            return c_top * rows / r_top if len(sizes) == 1 else secs[0] * rows / sizes[0]
        if len(sizes) == 1:
            return c_top * (1 + OPTIMISTIC_ROW_COST * (rows - 1)) / (1 + OPTIMISTIC_ROW_COST * (r_top - 1))
        r_prev, c_prev = sizes[-2], secs[-2]
        linear = c_top + max(c_top - c_prev, 0.0) * (rows - r_top) / (r_top - r_prev)
        return min(linear, c_top * (rows / r_top) ** ROW_COST_EXPONENT)


# --- acceptance ---------------------------------------------------------------------------------
FORGET = 0.97  # per observation: ~30 recent ones dominate
NEW_REQUEST_MEMORY = 0.3  # share of the evidence a new chat answer inherits from the last one
PRIOR_WEIGHT = 2.0  # pseudo-observations pulling an unseen slot towards its feature's prior
# A draft slot expected to add fewer tokens than this is never worth its row, so E(k) stops there (the plan
# runs every step: it took ~55 µs of a 6 ms SmolLM2 step, now ~40).
NEGLIGIBLE_TOKENS = 1e-3
SEQUENCE_PRIOR_WEIGHT = 8.0  # the shared estimate counts as this many of one sequence's own observations
# The optimizer's curse: the planner drafts on the lookup features whose estimates are high, and an estimate made
# of few observations is high by chance as often as by right, so the ones it bets on run high. Replayed on the tuning
# prompts, bets on matches under 8 tokens from a source that had not been continuing kept 0.62-0.75 of the tokens
# predicted (three models), and one or two such misses, or a long copy failing where the answer edits it, left
# answers at 0.93-0.97x plain. So a bet counts on the estimate less this many standard deviations of its sampling
# noise: sqrt(n a (1 - a)) / (n + PRIOR_WEIGHT) for n observations of the slot (all of them, not the ~30 that the
# estimate forgets down to: a feature seen hundreds of times is not chosen by chance). An unseen feature's prior is
# no one's luck and counts whole, so a fresh chat's first copy drafts. Chosen on the tuning replays (worst answer
# 0.965 -> 0.984x plain; 1.0 and 2.0 did worse, and so did the bound on the first slot alone); on the held-out
# replays the worst went 0.928 -> 0.955x, the geometric mean from -1% to +3% per model.
BET_CONFIDENCE_SDS = 1.5


def _is_match(feature: Hashable) -> bool:
    """A lookup feature (match length, continuing), not a draft model's."""
    return isinstance(feature, tuple) and bool(feature) and isinstance(feature[0], int)


def prior_acceptance(feature: Hashable) -> float:
    """Before any evidence: a lookup match of n tokens continues correctly with about n/(n+1.5)
    (1 token: 0.4, 4: 0.73, 12: 0.89); a draft model's slot starts at even odds."""
    if _is_match(feature) and feature[0] > 0:
        n = feature[0]
        return n / (n + 1.5)
    return 0.5


class Acceptance:
    """Decayed counts of draft slots reached and kept, per proposal feature and slot."""

    def __init__(self, max_draft: int):
        self.max_draft = max_draft
        self._tried: dict[Hashable, list[float]] = {}
        self._kept: dict[Hashable, list[float]] = {}
        self._sums: dict[Hashable, list[float]] = {}  # per feature: [sum of tried, sum of kept], kept current
        self._seen: dict[Hashable, list[float]] = {}  # slots reached, not forgotten (only faded by fade())

    def record_slot(self, feature: Hashable, slot: int, kept: bool) -> None:
        """One draft slot reached (every earlier slot was kept), and whether it was kept too."""
        if slot >= self.max_draft:
            return
        tried = self._tried.setdefault(feature, [0.0] * self.max_draft)
        kept_ = self._kept.setdefault(feature, [0.0] * self.max_draft)
        sums = self._sums.setdefault(feature, [0.0, 0.0])
        self._seen.setdefault(feature, [0.0] * self.max_draft)[slot] += 1.0
        sums[0] += tried[slot] * (FORGET - 1.0) + 1.0
        sums[1] += kept_[slot] * (FORGET - 1.0) + (1.0 if kept else 0.0)
        tried[slot] = tried[slot] * FORGET + 1.0
        kept_[slot] = kept_[slot] * FORGET + (1.0 if kept else 0.0)

    def record(self, feature: Hashable, drafted: int, accepted: int) -> None:
        for i in range(min(drafted, accepted + 1)):
            self.record_slot(feature, i, i < accepted)

    def fade(self, share: float = NEW_REQUEST_MEMORY) -> None:
        for table in (*self._tried.values(), *self._kept.values(), *self._seen.values()):
            table[:] = [x * share for x in table]
        self._sums = {f: [sum(self._tried[f]), sum(self._kept[f])] for f in self._tried}

    def slot_acceptance(
        self, feature: Hashable, own: Acceptance | None = None, slots: int | None = None
    ) -> list[float]:
        """Per slot (the first `slots` of them): what a bet may count on. For a lookup match, the estimate less
        BET_CONFIDENCE_SDS of its uncertainty, which shrinks as the slot's observations grow (see there); for a
        draft model's guess, the estimate: it has one feature, so no choice among many to favour the lucky."""
        mean = self.mean_acceptance(feature, own, slots)
        if not _is_match(feature):
            return mean
        seen = self._seen.get(feature, [0.0] * self.max_draft)[: len(mean)]  # planned every step: only the slots asked
        if own is not None and feature in own._seen:  # the shared table holds the sequence's own as a rule
            seen = [max(a, b) for a, b in zip(seen, own._seen[feature])]
        return [a - BET_CONFIDENCE_SDS * math.sqrt(n * a * (1.0 - a)) / (n + PRIOR_WEIGHT) for a, n in zip(mean, seen)]

    def mean_acceptance(
        self, feature: Hashable, own: Acceptance | None = None, slots: int | None = None
    ) -> list[float]:
        """Per slot (the first `slots` of them): the estimate from every sequence's evidence, or, given one
        sequence's own table, that sequence's evidence with the shared estimate as its prior (one answer
        copies while another does not)."""
        slots = self.max_draft if slots is None else min(slots, self.max_draft)
        tried = self._tried.get(feature, [0.0] * self.max_draft)[:slots]
        kept = self._kept.get(feature, [0.0] * self.max_draft)[:slots]
        tried_sum, kept_sum = self._sums.get(feature, (0.0, 0.0))
        overall = (kept_sum + PRIOR_WEIGHT * self._pooled_prior(feature)) / (tried_sum + PRIOR_WEIGHT)
        shared = [(k + PRIOR_WEIGHT * overall) / (t + PRIOR_WEIGHT) for t, k in zip(tried, kept)]
        if own is None or feature not in own._tried:
            return shared
        return [
            (k + SEQUENCE_PRIOR_WEIGHT * a) / (t + SEQUENCE_PRIOR_WEIGHT)
            for t, k, a in zip(own._tried[feature], own._kept[feature], shared)
        ]

    def _pooled_prior(self, feature: Hashable) -> float:
        """A feature seen little borrows from its neighbours: every lookup feature with a match at least
        as long and the same continuing flag (a model whose long matches fail, as in tables, learns it
        once, not once per length). Borrowing only lowers the prior: long matches that hold say nothing of
        a two-token coincidence (Gemma 3's table answer drafted on 2-token matches at 0.98, borrowed from
        the copy before it, and kept 1 token in 15)."""
        prior = prior_acceptance(feature)
        if not _is_match(feature):
            return prior
        tried = kept = 0.0
        for other, (tried_sum, kept_sum) in self._sums.items():
            if other != feature and isinstance(other[0], int) and other[0] >= feature[0] and other[1:] == feature[1:]:
                tried += tried_sum
                kept += kept_sum
        return min(prior, (kept + PRIOR_WEIGHT * prior) / (tried + PRIOR_WEIGHT))

    def expected_tokens(
        self, feature: Hashable, own: Acceptance | None = None, slots: int | None = None, bet: bool = True
    ) -> list[float]:
        """E(k) for k = 0..slots (max_draft by default), or fewer: it stops where a further slot would add
        under NEGLIGIBLE_TOKENS, since no step is worth a row for that. bet: what a bet counts on
        (slot_acceptance), else the estimates themselves."""
        out, total, run = [1.0], 1.0, 1.0
        for a in (self.slot_acceptance if bet else self.mean_acceptance)(feature, own, slots):
            run *= a
            if run < NEGLIGIBLE_TOKENS:
                break
            total += run
            out.append(total)
        return out


# --- the plan ---------------------------------------------------------------------------------
MIN_GAIN = 1.05  # speculate only when predicted this much faster: a near-even bet loses to estimation noise
# A costly proposer (a draft model) is probed while plain decoding wins, at growing intervals, so a draft
# that does not pay costs a few percent at most yet a draft that starts paying is noticed.
FIRST_DRAFT_PROBE_AFTER = 8
LONGEST_PROBE_INTERVAL = 256
# The acceptance model's bias, corrected: drafted tokens kept over those it predicted, summed over the last
# steps that drafted. Per-feature estimates miss what a feature cannot see (an answer that copies its
# prompt line by line but edits every line): long matches then predict far more than is kept, and a busy
# batch pays for every one of those rows (measured: 4 clients, lookup 0.82x plain before this).
REALISM_WINDOW = 24
REALISM_RANGE = (0.2, 1.2)
# Outcomes older than this many steps no longer count: a low realism stops drafting, and with it the
# outcomes that could raise it again (measured: 4 early misses held a server at plain decoding for the
# next 460 steps, through answers that copied their prompts whole). Meanwhile the shadow proposals keep
# the acceptance tables current, so after a pause the planner bets on what they have seen since.
REALISM_HORIZON = 64
# A probe of a costly proposer costs its catch-up (the rows its cache lags: a whole prompt, at first), its tokens
# and its wider verify. It is made only when that is at most this share of the answer's time still to come at
# plain speed, so probing never costs more than a few percent (the 0.5B draft's first probe of a Qwen2.5-Coder
# chat answer paid 2.6 s of prompt processing, a third of the answer's 8 s plain decode, for 2 tokens).
PROBE_SHARE = 0.02
# The tokens still to come are not known (an answer stops when it will): a sequence is taken to go on for as
# long as it has gone so far, at least this long, within its budget.
HORIZON_FLOOR = 32
# Speculative steps between plain ones while a costly proposer drafts every step (it may never stop on
# its own at p_min 0): without a measured plain step there is nothing to judge drafting against.
PLAIN_PROBE_EVERY = 32


def _ratio(outcomes: Sequence[tuple[int, float, int]]) -> float:
    """Kept / predicted over (step, predicted, kept) outcomes; 1 for fewer than four."""
    predicted = sum(p for _, p, _ in outcomes)
    if len(outcomes) < 4 or predicted <= 0:
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


class DraftPlanner:
    """Chooses every sequence's draft length for the next step from StepCosts and Acceptance."""

    def __init__(self, config: SpeculationConfig, costly_proposer: bool, steps: StepCosts | None = None):
        self.config = config
        self.costly = costly_proposer
        self.steps = steps or StepCosts()
        self.acceptance = Acceptance(max(config.max_draft, 1))
        self._draft_per_token: deque[float] = deque(maxlen=WINDOW)
        self._catch_up_per_row: deque[float] = deque(maxlen=WINDOW)
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
            (n + k) / (k * d + self.steps.seconds(n + k, drafted=True)) <= MIN_GAIN * n / plain
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
    ) -> Plan:
        """Draft lengths for sequences with these proposal features; caps bound each (room, proposal); own:
        each sequence's own acceptance table, if it keeps one; taken_rows: draft rows this step verifies anyway
        (another proposer's, planned first), which every row planned here is added to. For a costly proposer,
        lags: the tokens each sequence's draft cache must catch up on before it drafts; horizon: the tokens
        each sequence is expected still to make (HORIZON_FLOOR). A draft must repay its catch-up within them."""
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
            lambda rows: steps.seconds(rows, drafted=rows > n),
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
            probe = [min(max(cfg.min_draft, 2), c) for c in caps]
            if self._probe_affordable(probe, n + taken_rows, lags, horizon):
                self._probe_interval = min(2 * self._probe_interval, LONGEST_PROBE_INTERVAL)
                return Plan(probe)  # a probe keeps acceptance current
        return Plan(lengths)

    def _repays(
        self, lengths: list[int], gained: list[float], rows: int, lags: list[int] | None, horizon: list[int] | None
    ) -> bool:
        """A bet on drafts saves, over the tokens expected still to come, more than their catch-up costs."""
        catch_up = self._catch_up_of(lengths, lags)
        if not catch_up or horizon is None:
            return True
        n, drafted, steps = len(lengths), sum(lengths), self.steps
        plain_rate = n / steps.seconds(rows)
        drafting = steps.seconds(rows + drafted, drafted=True) + drafted * self.draft_seconds_per_token
        rate = (n + sum(gained)) / drafting
        to_come = sum(horizon)
        return to_come / plain_rate - to_come / rate > catch_up

    def _catch_up_of(self, lengths: list[int], lags: list[int] | None) -> float:
        """Seconds the sequences that draft (length > 0) need to catch up first."""
        return self.catch_up_seconds(sum(lag for lag, k in zip(lags or [], lengths) if k))

    def _probe_affordable(self, probe: list[int], rows: int, lags: list[int] | None, horizon: list[int] | None) -> bool:
        """A probe's catch-up, tokens and wider verify cost at most PROBE_SHARE of the time still to come."""
        if horizon is None:
            return True
        n, drafted, steps = len(probe), sum(probe), self.steps
        cost = (
            self._catch_up_of(probe, lags)
            + drafted * self.draft_seconds_per_token
            + steps.seconds(rows + drafted, drafted=True)
            - steps.seconds(rows)
        )
        return cost <= PROBE_SHARE * sum(horizon) / n * steps.seconds(rows)
