"""How a sequence may speculate: the draft-length bounds and switches that the chat, the server and the lab take
(--max-draft, --min-draft, fixed lengths, exact verifies). The planner (draft_planner.py) chooses within them."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidSettingError
from ..methods import DEFAULT_MAX_DRAFT, DEFAULT_MIN_DRAFT, MAX_DRAFT_RANGE, MIN_DRAFT_RANGE


@dataclass
class SpeculationConfig:
    max_draft: int = DEFAULT_MAX_DRAFT  # draft rows one sequence may verify in a step (0: never speculate)
    min_draft: int = DEFAULT_MIN_DRAFT  # a planned draft shorter than this is not made
    adaptive: bool = True  # the planner chooses each length; False: every proposal is drafted up to max_draft
    exact: bool = False  # every verify within the width this build decodes as one-row steps do (exactness.py)

    def __post_init__(self) -> None:
        low, high = MAX_DRAFT_RANGE
        if not (isinstance(self.max_draft, int) and low <= self.max_draft <= high):
            raise InvalidSettingError(f"max draft tokens must be {low}..{high}, got {self.max_draft!r}")
        if not (isinstance(self.min_draft, int) and MIN_DRAFT_RANGE[0] <= self.min_draft <= max(1, self.max_draft)):
            raise InvalidSettingError(f"min draft tokens must be 1..max draft, got {self.min_draft!r}")
