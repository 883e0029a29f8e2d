"""Whether the lab's advice is about the chat, and what applying it changes.

The lab may have measured other models than the chat runs (its form is free), or another method or draft cap:
Apply is offered only for results of the chat's own target (and draft, where the chat uses one), with the chat's
method among those measured, and it sends only the settings the lab measured that the chat does differently.
"Plain decoding" turns speculation off and leaves the chosen method alone, so turning it back on restores it; a
draft cap or mode comes only with a new method, as the lab ran that method (it compares methods, not caps)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.methods import DRAFT_METHODS, method_words
from engine.modelfiles.embedded import DISPLAY_NAMES, resolve_model

LABELS = method_words("label")


@dataclass(frozen=True)
class ChatModels:
    target: str  # a built-in model's key or a GGUF path, as the chat's settings hold it
    draft: str | None
    method: str  # the chat's effective method: "none" while speculation is off
    max_draft: int | None = None
    adaptive: bool | None = None

    @property
    def uses_draft(self) -> bool:
        return self.method in DRAFT_METHODS and bool(self.draft)


def model_name(spec: str | None) -> str:
    if not spec:
        return "none"
    return DISPLAY_NAMES.get(str(spec), Path(str(spec)).name)


def same_model(a: str | None, b: str | None) -> bool:
    """One file, however it is named (a built-in key or its path, a relative or absolute path)."""
    if not a or not b:
        return False
    try:
        return resolve_model(a).resolve() == resolve_model(b).resolve()
    except (OSError, RuntimeError, ValueError):
        return str(a) == str(b)


def apply_blocker(results: dict, chat: ChatModels | None) -> str | None:
    """Why Apply is not offered for these results, or None where it may be."""
    settings, env = results.get("settings", {}), results.get("env", {})
    if env.get("remote"):
        return "The servers' speculation is set where they run: nothing here to apply."
    if chat is None:
        return "Apply is off: the lab does not know the chat's models (open it from the chat window's Model menu)."
    measured = env.get("model") or settings.get("model")
    if not same_model(measured, chat.target):
        return (
            f"Apply is off: the lab measured {env.get('model_name') or model_name(measured)}, but the chat runs "
            f"{model_name(chat.target)}. Run the lab on the chat's models to get advice for it."
        )
    ran = set(settings.get("methods", ()))
    lab_draft = env.get("draft") or settings.get("draft")
    if chat.uses_draft and not same_model(lab_draft, chat.draft):
        return (
            f"Apply is off: the chat drafts with {model_name(chat.draft)}, and the lab measured "
            f"{'no draft model' if not lab_draft else model_name(lab_draft)}."
        )
    if chat.method not in ran:
        return (
            f"Apply is off: the lab did not measure the chat's method ({LABELS.get(chat.method, chat.method)}), "
            "so it cannot say whether another does better."
        )
    return None


def chat_changes(recommended: dict, chat: ChatModels) -> dict:
    """The settings Apply sends: the recommended ones the chat does differently, no others."""
    method = recommended.get("method")
    if method == "none":  # speculation off; the method the user chose stays chosen
        return {} if chat.method == "none" else {"speculation": False}
    if not method or method == chat.method:  # the lab compared methods, not draft caps: nothing it found to change
        return {}
    changes = {"method": method}
    for key in ("max_draft", "adaptive"):  # with a new method, the drafting it was measured with
        if key in recommended and recommended[key] != getattr(chat, key):
            changes[key] = recommended[key]
    return changes


def changes_words(changes: dict, chat: ChatModels | None) -> str:
    """e.g. "method Auto → Prompt lookup, max draft 48 → 8"."""
    words = []
    for key, value in changes.items():
        if key == "speculation":
            words.append("speculation on → off" if not value else "speculation off → on")
        elif key == "method":
            was = LABELS.get(chat.method, chat.method) if chat else "?"
            words.append(f"method {was} → {LABELS.get(value, value)}")
        else:
            before = getattr(chat, key, None) if chat else None
            shown = (lambda v: "on" if v else "off") if key == "adaptive" else str
            words.append(f"{key.replace('_', ' ')} {'?' if before is None else shown(before)} → {shown(value)}")
    return ", ".join(words)
