"""A model's built-in drafter in words, for the Models window: MTP layers inside the model, or a file that is itself
an EAGLE-3 / DFlash draft head (engine.modelfiles.model_inspect.drafter_of's answer). Files' headers are read by
read_drafters on a background thread; these functions only word the answer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.errors import ModelFileError
from engine.methods import MTP
from engine.modelfiles.head_check import HEAD_NAMES
from engine.modelfiles.model_inspect import HEAD_SUPPORT, inspect_model

NOT_READ = "?"  # a header that could not be read: the tooltip says why


def drafter_short(drafter: dict[str, Any] | None) -> str:
    """For a table cell: "MTP, 1 layer", "EAGLE-3 head", or "none"."""
    if drafter is None:
        return "none"
    if drafter.get("kind") == "mtp":
        layers = drafter.get("layers")
        return f"MTP, {layers} layer{'' if layers == 1 else 's'}" if isinstance(layers, int) else "MTP"
    return f"{_head_name(drafter)} head"


def drafter_sentence(drafter: dict[str, Any] | None) -> str:
    """What the drafter means for a person choosing models."""
    if drafter is None:
        return "No built-in drafter: a draft model or prompt lookup drafts for it."
    if drafter.get("kind") == "mtp":
        return f"Built-in drafter: {drafter_short(drafter)} (choose “{MTP.label}” in the chat settings)."
    kind = str(drafter.get("kind"))
    layers = [str(x) for x in drafter.get("target_layers") or []]
    reads = f"it reads its target's layers {', '.join(layers)}" if layers else "its header names no target layers"
    support = HEAD_SUPPORT.get(kind, f"SpecChat cannot draft with {_head_name(drafter)} heads.")
    can = support or "SpecChat can draft with it: choose it as the draft of its target."
    name = _head_name(drafter)
    article = "An" if name[:1] in "AEIOU" else "A"
    return f"{article} {name} draft head for a target model, not a model to chat with: {reads}. {can}"


def read_drafters(paths: Iterable[str], stopped: Callable[[], bool]) -> dict[str, dict[str, Any] | str | None]:
    """{path: drafter (or None), or the reason its header could not be read}, on a background thread."""
    found: dict[str, dict[str, Any] | str | None] = {}
    for path in paths:
        if stopped():
            break
        try:
            found[path] = inspect_model(path)["drafter"]
        except (ModelFileError, OSError, ValueError) as exc:
            found[path] = str(exc) or type(exc).__name__
    return found


def _head_name(drafter: dict[str, Any]) -> str:
    kind = str(drafter.get("kind"))
    return HEAD_NAMES.get(kind, kind)
