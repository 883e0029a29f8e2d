"""Chooses how many drafted tokens to verify next: the k with the most expected tokens per second.

Expected tokens from one step that verifies k drafts: E(k) = 1 + sum_j prod_{i<=j} a_i, where a_i is
the measured acceptance at draft slot i given the slots before it were accepted. Cost: the measured
target step time for k+1 rows plus k measured draft-token times. k = 0 is plain decoding, and wins
whenever speculation does not pay. Everything is measured on this machine, during this conversation,
with exponential forgetting so the choice follows the text being written.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidSettingError

FORGET = 0.95  # per observation: ~20 recent ones dominate
MIN_GAIN = 1.1  # speculate only when predicted 10% faster: a near-even bet loses to estimation noise
NEW_REQUEST_MEMORY = 0.2  # share of the acceptance evidence a new answer inherits from the last one
PRIOR_WEIGHT = 2.0  # pseudo-observations pulling an unseen slot towards the overall rate
PRIOR_ACCEPTANCE = 0.5
# Guesses for verify sizes not measured yet. They err towards trying, since a tried size gets measured.
# Before any multi-row step: each extra row costs 10% of a 1-row step (a big model on a GPU).
OPTIMISTIC_ROW_COST = 0.1
# Beyond the longest verify measured: the cheaper of the last measured slope and a power law
# T(r) ∝ r^0.5. On 2-core CPUs the first extra rows cost the most (measured here: 2 rows 2.1x,
# 3 rows 3.6x, 13 rows 7.4x, 17 rows 9.1x; DESIGN.md: 3 rows 2.1x, 17 rows 6.6x), so a straight line
# through them overestimates long verifies; the square root errs low on purpose, and a tried size is
# measured at once.
ROW_COST_EXPONENT = 0.5
PROBE_EVERY = 24  # steps between probes of a costly proposer while speculation is off
# Speculative steps between plain ones while a costly proposer drafts. A draft model may draft every
# step (it never stops on its own at p_min 0), and without a measured plain step the policy could only
# guess what it is judged against; the step time also drifts with the context and the machine's load.
PLAIN_PROBE_EVERY = 32


@dataclass
class SpeculationConfig:
    max_draft: int = 16
    min_draft: int = 1  # shorter proposals are not worth a verify row: decode plainly instead
    adaptive: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.max_draft, int) and 0 <= self.max_draft <= 64):
            raise InvalidSettingError(f"max draft tokens must be 0..64, got {self.max_draft!r}")
        if not (isinstance(self.min_draft, int) and 1 <= self.min_draft <= max(1, self.max_draft)):
            raise InvalidSettingError(f"min draft tokens must be 1..max draft, got {self.min_draft!r}")


class _Ema:
    def __init__(self) -> None:
        self.value = 0.0
        self.weight = 0.0

    def add(self, x: float) -> None:
        self.value = self.value * FORGET + x
        self.weight = self.weight * FORGET + 1.0

    @property
    def mean(self) -> float | None:
        return self.value / self.weight if self.weight else None


class DraftLengthPolicy:
    def __init__(self, config: SpeculationConfig, costly_proposer: bool):
        self.config = config
        self.costly = costly_proposer
        self._tried = [0.0] * config.max_draft  # decayed count of steps that reached slot i
        self._kept = [0.0] * config.max_draft  # decayed count of those where slot i was accepted
        self._step_time: dict[int, _Ema] = {}  # rows verified -> seconds
        self._draft_time = _Ema()  # seconds per drafted token
        self._steps_since_speculation = 0
        self._steps_since_plain = 0
        self.measuring_plain = False  # the last choice was 0 to measure a plain step, not because it wins
        self.last_choice = config.max_draft

    # --- measurements -------------------------------------------------------------------------
    def begin_request(self) -> None:
        """A new answer: step costs carry over (they are the machine's); acceptance mostly does not."""
        self._tried = [t * NEW_REQUEST_MEMORY for t in self._tried]
        self._kept = [k * NEW_REQUEST_MEMORY for k in self._kept]

    def record_step(self, rows: int, seconds: float) -> None:
        self._step_time.setdefault(rows, _Ema()).add(seconds)
        self._steps_since_speculation = 0 if rows > 1 else self._steps_since_speculation + 1
        self._steps_since_plain = 0 if rows == 1 else self._steps_since_plain + 1

    def record_draft(self, tokens: int, seconds: float) -> None:
        if tokens:
            self._draft_time.add(seconds / tokens)

    def record_acceptance(self, drafted: int, accepted: int) -> None:
        for i in range(min(drafted, accepted + 1)):
            self.record_slot(i, i < accepted)

    def record_slot(self, slot: int, kept: bool) -> None:
        """One draft slot reached (every earlier slot was kept), and whether it was kept too."""
        if slot < len(self._tried):
            self._tried[slot] = self._tried[slot] * FORGET + 1.0
            self._kept[slot] = self._kept[slot] * FORGET + (1.0 if kept else 0.0)

    # --- estimates ----------------------------------------------------------------------------
    def slot_acceptance(self) -> list[float]:
        tried, kept = sum(self._tried), sum(self._kept)
        overall = (kept + PRIOR_ACCEPTANCE) / (tried + 1.0)
        return [(k + PRIOR_WEIGHT * overall) / (t + PRIOR_WEIGHT) for t, k in zip(self._tried, self._kept)]

    def expected_tokens(self) -> list[float]:
        """E(k) for k = 0..max_draft."""
        out, total, run = [1.0], 1.0, 1.0
        for a in self.slot_acceptance():
            run *= a
            total += run
            out.append(total)
        return out

    def measured(self, rows: int) -> bool:
        return rows in self._step_time

    def step_seconds(self, rows: int) -> float | None:
        """Target step time for `rows` rows: measured, interpolated between measured sizes, or guessed."""
        known = sorted((r, e.mean) for r, e in self._step_time.items() if e.mean is not None)
        if not known:
            return None
        for (r0, t0), (r1, t1) in zip(known, known[1:]):
            if r0 <= rows <= r1:
                return t0 + (t1 - t0) * (rows - r0) / (r1 - r0)
        r_top, t_top = known[-1]
        if rows < known[0][0] or (len(known) == 1 and r_top > 1):
            r0, t0 = known[0]
            return t0 * (rows / r0) ** ROW_COST_EXPONENT
        if len(known) == 1:
            return t_top * (1 + OPTIMISTIC_ROW_COST * (rows - 1))
        (r_prev, t_prev) = known[-2]
        linear = t_top + max(t_top - t_prev, 0.0) * (rows - r_top) / (r_top - r_prev)
        return min(linear, t_top * (rows / r_top) ** ROW_COST_EXPONENT)

    def tokens_per_second(self, k: int, expected: list[float] | None = None) -> float | None:
        step = self.step_seconds(k + 1)
        if step is None:
            return None
        draft = (self._draft_time.mean or 0.0) * k if self.costly else 0.0
        return (expected or self.expected_tokens())[k] / (step + draft)

    # --- decision -----------------------------------------------------------------------------
    def choose(self) -> int:
        """Draft tokens to verify next step (0: decode plainly)."""
        cfg = self.config
        self.measuring_plain = False
        if not cfg.adaptive or cfg.max_draft == 0:
            self.last_choice = cfg.max_draft
            return cfg.max_draft
        plain = self.step_seconds(1)
        if plain is None:
            # Nothing measured yet. A free proposer starts plain: its proposals are scored in the
            # shadow meanwhile. A costly one (a draft model someone chose) starts drafting.
            self.last_choice = cfg.max_draft if self.costly else 0
            self.measuring_plain = not self.costly  # a plain step to measure, not a prediction
            return self.last_choice
        if self.costly and (not self.measured(1) or self._steps_since_plain >= PLAIN_PROBE_EVERY):
            self.measuring_plain = True
            self.last_choice = 0
            return 0
        expected = self.expected_tokens()
        best_k, best_rate = 0, MIN_GAIN * expected[0] / plain
        for k in range(cfg.min_draft, cfg.max_draft + 1):
            rate = self.tokens_per_second(k, expected)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0 and self.costly and self._steps_since_speculation >= PROBE_EVERY:
            best_k = cfg.min_draft  # a short probe keeps the acceptance estimate current
        self.last_choice = best_k
        return best_k
