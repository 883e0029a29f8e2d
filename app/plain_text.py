"""Text from a conversation where nothing in it may change how it reads: a window title, a suggested file name,
settings shown before they are used. Bidi controls (U+202E turns "Invoice ‮fdp.exe" into what reads as
"Invoice exe.pdf"), zero-width and other invisible characters are taken out there, or shown by their code.
No Qt here."""

from __future__ import annotations

import re
import unicodedata

from engine.text_rules import plain_name

WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{n}" for n in range(1, 10)), *(f"LPT{n}" for n in range(1, 10))}
NAME_CHARS = 80


def safe_file_name(title: str, suffix: str) -> str:
    """A file name from a title that any system and any shell takes as it is, unquoted: letters and digits of any
    script (with their marks) and - _ . , + only, words joined by "-" (a space splits a shell word), each without
    a dash, dot or comma at its ends; no run of dots (an ellipsis typed as three); not a Windows device name; at
    most NAME_CHARS before suffix."""
    text = plain_name(title).replace("…", " ")  # a title cut short ends in an ellipsis: not part of the name
    kept = "".join(c if c.isalnum() or unicodedata.category(c)[0] == "M" or c in "-_.,+" else " " for c in text)
    words = (w.strip("-.,") for w in re.sub(r"\.{2,}", " ", kept).split())  # "--onto" → onto, "me," → me
    name = "-".join(w for w in words if w)[:NAME_CHARS].strip("-.")
    name = name or "conversation"
    if name.split(".")[0].strip().upper() in WINDOWS_RESERVED:
        name = f"chat-{name}"
    return name + suffix
