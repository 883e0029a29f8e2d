"""How often drafts are kept: decayed counts of draft slots reached and kept, per *feature* of a proposal and slot.

A step that verifies k drafts yields E(k) = 1 + sum_j prod_{i<=j} a_i tokens, where a_i is the acceptance at draft
slot i given the slots before it were kept. For prompt lookup the feature is the length of the matched n-gram and
whether this source has been continuing well (a 12-token match that has been copying is almost always right; a
1-token match rarely is); for a draft model it is just the slot.

The weights and rates below were swept on replayed recordings (engine.measure.replay; docs/benchmarks.md, "The
replay learns sampled answers"): each moved a step either way raised no recording by more than 1% and lowered some
by up to 3%.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import TypeGuard

FORGET = 0.97  # decay per observation, so ~30 recent ones dominate (swept: 0.93 and 0.99 did no better)
NEW_REQUEST_MEMORY = 0.3  # share of the evidence a new chat answer inherits from the last one (fa010b1)
PRIOR_WEIGHT = 2.0  # pseudo-observations pulling an unseen slot towards its feature's prior (swept: 1 and 4 no better)
SEQUENCE_PRIOR_WEIGHT = 8.0  # the shared estimate counts as this many of one sequence's own (swept: 2, 4, 16 no better)
# A draft slot expected to add fewer tokens than this is never worth its row, so E(k) stops there (the plan
# runs every step: it took ~55 µs of a 6 ms SmolLM2 step, now ~40; 7b4675a).
NEGLIGIBLE_TOKENS = 1e-3  # expected tokens below which a further slot is not considered
# The optimizer's curse: the planner drafts on the lookup features whose estimates are high, and an estimate made
# of few observations is high by chance as often as by right, so the ones it bets on run high. Replayed on the tuning
# prompts, bets on matches under 8 tokens from a source that had not been continuing kept 0.62-0.75 of the tokens
# predicted (three models), and one or two such misses, or a long copy failing where the answer edits it, left
# answers at 0.93-0.97x plain. So a bet counts on the estimate less this many standard deviations of its sampling
# noise: sqrt(n a (1 - a)) / (n + PRIOR_WEIGHT) for n observations of the slot (all of them, not the ~30 that the
# estimate forgets down to: a feature seen hundreds of times is not chosen by chance). An unseen feature's prior is
# no one's luck and counts whole, so a fresh chat's first copy drafts. Chosen on the tuning replays (worst answer
# 0.965 -> 0.984x plain; 1.0 and 2.0 did worse, and so did the bound on the first slot alone); on the held-out
# replays the worst went 0.928 -> 0.955x, the geometric mean from -1% to +3% per model (606a493).
BET_CONFIDENCE_SDS = 1.5  # standard deviations of sampling noise a lookup bet discounts (replayed: 1.0, 2.0 worse)
# Before any evidence, a lookup match of n tokens continues correctly with n / (n + MATCH_PRIOR_OFFSET): 1 token 0.4,
# 4 tokens 0.73, 12 tokens 0.89 (fa010b1; evidence outweighs it within a few observations, PRIOR_WEIGHT).
MATCH_PRIOR_OFFSET = 1.5  # a longer match is more likely right; how fast the prior rises with its length
DRAFT_MODEL_PRIOR = 0.5  # a draft model's slot before any evidence: even odds (fa010b1)


def is_match(feature: Hashable) -> TypeGuard[tuple[int, bool]]:
    """A lookup feature (match length, continuing), not a draft model's."""
    return isinstance(feature, tuple) and bool(feature) and isinstance(feature[0], int)


def prior_acceptance(feature: Hashable) -> float:
    """Before any evidence: a lookup match of n tokens continues correctly with about n/(n+1.5)
    (1 token: 0.4, 4: 0.73, 12: 0.89); a draft model's slot starts at even odds."""
    if is_match(feature) and feature[0] > 0:
        n = feature[0]
        return n / (n + MATCH_PRIOR_OFFSET)
    return DRAFT_MODEL_PRIOR


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

    def forget(self, which: Callable[[Hashable], bool]) -> None:
        """Drop every feature `which` picks, as if never seen."""
        for table in (self._tried, self._kept, self._sums, self._seen):
            for f in [f for f in table if which(f)]:
                del table[f]

    def slot_acceptance(
        self, feature: Hashable, own: Acceptance | None = None, slots: int | None = None
    ) -> list[float]:
        """Per slot (the first `slots` of them): what a bet may count on. For a lookup match, the estimate less
        BET_CONFIDENCE_SDS of its uncertainty, which shrinks as the slot's observations grow (see there); for a
        draft model's guess, the estimate: it has one feature, so no choice among many to favour the lucky."""
        mean = self.mean_acceptance(feature, own, slots)
        if not is_match(feature):
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
        if not is_match(feature):
            return prior
        tried = kept = 0.0
        for other, (tried_sum, kept_sum) in self._sums.items():
            if other != feature and is_match(other) and other[0] >= feature[0] and other[1:] == feature[1:]:
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
