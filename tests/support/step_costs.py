"""Pinned target step times for tests of the draft policy: its decisions then follow the real model's
acceptance, not what else the shared machine is running."""

from __future__ import annotations

ONE_ROW_S = 0.0137  # one 1-row step of Gemma 3 270M on this 2-core CPU


def step_seconds(cost: dict[int, float], rows: int) -> float:
    """Seconds for a step verifying `rows`, from costs per row count (multiples of a 1-row step),
    interpolated linearly between the row counts given, flat beyond the last."""
    known = sorted(cost.items())
    for (r0, c0), (r1, c1) in zip(known, known[1:]):
        if rows <= r1:
            return ONE_ROW_S * (c0 + (c1 - c0) * (rows - r0) / (r1 - r0))
    return ONE_ROW_S * known[-1][1]


def pin_step_costs(
    monkeypatch, cost: dict[int, float] | None = None, one_row_s: float | None = None, extra_row_s: float | None = None
) -> None:
    """Make the planner see pinned step times (from `cost`, or one_row_s + extra_row_s per extra row)
    instead of live timings, both at calibration and at every step."""
    from engine.decoding.step_costs import StepCosts

    def pinned(rows: int) -> float:
        if cost is not None:
            return step_seconds(cost, rows)
        return one_row_s + extra_row_s * (rows - 1)

    record, take = StepCosts.record, StepCosts.take_calibration
    monkeypatch.setattr(
        StepCosts, "record", lambda self, rows, seconds, drafted=False: record(self, rows, pinned(rows), drafted)
    )
    monkeypatch.setattr(
        StepCosts, "take_calibration", lambda self, timings: take(self, {r: pinned(r) for r in timings})
    )


def pin_draft_costs(monkeypatch, token_s: float, catch_up_row_s: float | None = None) -> None:
    """Make the planner see a draft token cost token_s and a row of its catch-up catch_up_row_s (a third of a
    token unless given: a batched row of a small model costs about that here) instead of timing them. Both, not
    the token alone: a catch-up timed on a busy machine (up to 3 of the target's one-row steps a row in CI) made
    the draft's catch-up look too dear to repay, and a draft pinned to pay never drafted."""
    from engine.decoding.draft_planner import DraftPlanner

    record_draft, record_catch_up = DraftPlanner.record_draft, DraftPlanner.record_catch_up
    row_s = token_s / 3 if catch_up_row_s is None else catch_up_row_s
    monkeypatch.setattr(
        DraftPlanner, "record_draft", lambda self, tokens, seconds: record_draft(self, tokens, token_s * tokens)
    )
    monkeypatch.setattr(
        DraftPlanner, "record_catch_up", lambda self, rows, seconds: record_catch_up(self, rows, row_s * rows)
    )
