"""What the file given as the draft (`--draft FILE`, the pair picker) drafts with: a draft model, or the draft head it
is (an EAGLE-3 head drafts; another head kind is refused with the Models window's sentence), told by its header."""

from __future__ import annotations

from . import draft_model, eagle3
from .base import CostlyProposer, Ingredients


def build(ingredients: Ingredients) -> CostlyProposer:
    draft = ingredients.draft_model("draft")
    if draft.head_kind:
        return eagle3.build_for_head(draft, ingredients)
    return draft_model.build(ingredients)
