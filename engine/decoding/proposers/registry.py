"""Method name -> how to build its proposer: the one place that names every kind of drafter (the chat, the server,
the bench, the lab and the system check build theirs here). A new drafter is a module of this package with its
proposer and a `build(ingredients)` (see base.py), and its line below."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import InvalidSettingError
from ...methods import DEFAULT_P_MIN
from . import auto, base, draft_file, lookup, mtp
from .base import Ingredients, Proposer

if TYPE_CHECKING:
    from ..runtime import Model

BUILDERS: dict[str, Callable[[Ingredients], Proposer]] = {
    "none": base.build,
    "lookup": lookup.build,
    "draft": draft_file.build,
    "auto": auto.build,
    "mtp": mtp.build,
}


def build_proposer(method: str, ingredients: Ingredients) -> Proposer:
    builder = BUILDERS.get(method)
    if builder is None:
        raise InvalidSettingError(f"method must be one of {', '.join(BUILDERS)}, got {method!r}")
    return builder(ingredients)


def proposer_for(
    method: str,
    target: Model,
    draft: Model | None,
    p_min: float = DEFAULT_P_MIN,
    min_ngram: int = 1,
    max_ngram: int | None = None,
    remember_requests: bool = True,
) -> Proposer:
    """The proposer of one method (the chat's, the lab's, the system check's), from its registered builder."""
    return build_proposer(method, Ingredients(target, draft, p_min, min_ngram, max_ngram, remember_requests))
