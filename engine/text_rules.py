"""One rule for text that crosses a boundary into SpecChat (a remote answer, a request, an imported chat, a file,
a model's metadata): it comes out as text that every encoder takes, and where it names something, it reads as
it is.

- valid_text: a lone UTF-16 surrogate ("\\ud800" is valid JSON, and Python keeps it in a str) has no UTF-8 form,
  so saving, sending or tokenizing it raises. It becomes U+FFFD; proper pairs are joined.
- loads: json.loads whose every string (keys too) is valid_text, and whose nesting too deep to walk is a
  ValueError like any other malformed JSON, never a RecursionError.
- plain_name: a name (a title, a model, a file, a tool) as one line with no bidi control or invisible
  character: U+202E turns "Invoice \u202efdp.exe" into what reads as "Invoice exe.pdf".
- bidi_shown: an answer keeps its text, but its bidi overrides, embeddings and isolates are shown by their code
  instead of obeyed, so a model cannot make one string read as another.
"""

from __future__ import annotations

import json
import re
import unicodedata

# Format (Cf: bidi controls, zero-width characters, soft hyphen, tags), control (Cc), line and paragraph separators.
_INVISIBLE = ("Cf", "Cc", "Zl", "Zp")
# The characters that reorder the text around them: embeddings and overrides (U+202A-E), isolates (U+2066-9).
# Marks (U+200E/F, U+061C) only set a direction for neutrals and are part of ordinary right-to-left text.
BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")


def valid_text(text: str) -> str:
    """text with every lone surrogate replaced by U+FFFD (and surrogate pairs joined): encodable as UTF-8."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def valid_json(value):
    """value (from json.loads) with every string in it, keys included, made valid_text. Iterative: a deep value
    cannot exhaust the stack here."""
    if isinstance(value, str):
        return valid_text(value)
    if not isinstance(value, (dict, list)):
        return value
    root = [value]
    stack = [(root, 0)]
    while stack:
        holder, key = stack.pop()
        item = holder[key]
        if isinstance(item, str):
            holder[key] = valid_text(item)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
        elif isinstance(item, dict):
            if not all(k.isascii() for k in item):
                fixed = {valid_text(k): v for k, v in item.items()}
                item.clear()
                item.update(fixed)
            stack.extend((item, k) for k in item)
    return root[0]


def loads(data: str | bytes | bytearray):
    """json.loads(data) with every string valid_text. Raises ValueError (json.JSONDecodeError or a plain one) for
    anything malformed: bytes that are not UTF-8, nesting too deep for the parser."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8 text (byte {exc.start} cannot be read)") from exc
    try:
        value = json.loads(data)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    return valid_json(value)


def _invisible(c: str) -> bool:
    return unicodedata.category(c) in _INVISIBLE


def plain_name(text: str) -> str:
    """text as one line with nothing invisible in it: controls and line breaks become spaces, format characters
    (bidi controls, zero-width characters) go; runs of spaces become one."""
    text = valid_text(text)
    if text.isascii() and text.isprintable():
        return " ".join(text.split())
    kept = "".join((" " if unicodedata.category(c) != "Cf" else "") if _invisible(c) else c for c in text)
    return " ".join(kept.split())


def shown_plainly(text: str) -> str:
    """text as it is, with each invisible character (but line breaks and tabs) shown as ⟨U+XXXX⟩, so what is
    read is what the text holds."""
    return "".join(f"⟨U+{ord(c):04X}⟩" if _invisible(c) and c not in "\n\t" else c for c in valid_text(text))


SHOWN_WIDTH = len("⟨U+202E⟩")  # what one bidi control becomes in bidi_shown


def bidi_shown(text: str) -> str:
    """text with each bidi embedding, override and isolate shown as ⟨U+XXXX⟩ rather than obeyed; everything
    else (emoji joiners, right-to-left letters and marks) as it is."""
    return BIDI_CONTROLS.sub(lambda m: f"⟨U+{ord(m.group()):04X}⟩", text)
