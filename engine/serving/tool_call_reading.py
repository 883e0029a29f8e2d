"""Reading a model's answer back into OpenAI `tool_calls` (tool_calls.py has the request side and the response):
Hermes / Qwen `<tool_call>` blocks, Llama 3.x `<|python_tag|>` calls, Mistral `[TOOL_CALLS]`, and a whole answer
that is a call object naming declared tools (a marker that is a control token is not in the text). A call is the
model's words: its JSON is parsed, never run; a block that does not parse as a call stays in `content`."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
MARKERS = (HERMES_OPEN, PYTHON_TAG, MISTRAL)


@dataclass
class Answer:
    """An answer read for calls: the text outside them (None when only calls) and the calls, OpenAI's shape."""

    content: str | None
    calls: list[dict[str, Any]] = field(default_factory=list)


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _call(obj: object, names: set[str] | None = None) -> dict[str, Any] | None:
    """OpenAI's tool call for one parsed JSON object, or None when it is not one (names: the only names taken)."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    if names is not None and name not in names:
        return None
    return {
        "id": call_id(),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


_DECODER = json.JSONDecoder()


def _json_at(text: str, at: int) -> tuple[Any, int] | None:
    """The JSON value starting at text[at] (spaces skipped) and where it ends, or None."""
    while at < len(text) and text[at].isspace():
        at += 1
    try:
        return _DECODER.raw_decode(text, at)
    except (ValueError, RecursionError):
        return None


def _hermes(text: str, start: int) -> tuple[list[dict[str, Any]], int] | None:
    """Calls in one <tool_call> block at text[start], and where the block ends; an unclosed block counts only when
    its JSON ends the answer."""
    got = _json_at(text, start + len(HERMES_OPEN))
    if got is None:
        return None
    value, end = got
    call = _call(value)
    if call is None:
        return None
    rest = text[end:]
    stripped = rest.lstrip()
    if stripped.startswith(HERMES_CLOSE):
        return [call], len(text) - len(stripped) + len(HERMES_CLOSE)
    if not stripped:
        return [call], len(text)
    return None


def _python_tag(text: str, start: int) -> tuple[list[dict[str, Any]], int] | None:
    """Llama's <|python_tag|> calls, `;` between them, to the answer's end."""
    calls, at = [], start + len(PYTHON_TAG)
    while True:
        got = _json_at(text, at)
        call = _call(got[0]) if got else None
        if got is None or call is None:
            return None
        calls.append(call)
        at = got[1]
        rest = text[at:].lstrip()
        if not rest:
            return calls, len(text)
        if not rest.startswith(";"):
            return None
        at = len(text) - len(rest) + 1


def _mistral(text: str, start: int) -> tuple[list[dict[str, Any]], int] | None:
    """Mistral's [TOOL_CALLS][...] list, or v11's [TOOL_CALLS]name[ARGS]{...} (repeated), to the answer's end."""
    at = start + len(MISTRAL)
    got = _json_at(text, at)
    if got is not None and isinstance(got[0], list):
        listed = [c for v in got[0] if (c := _call(v)) is not None]
        if not listed or len(listed) != len(got[0]) or text[got[1] :].strip():
            return None
        return listed, len(text)
    calls: list[dict[str, Any]] = []
    for part in text[at:].split(MISTRAL):
        name, sep, args = part.partition(MISTRAL_ARGS)
        value = _json_at(args, 0) if sep else None
        if value is None or args[value[1] :].strip():
            return None
        call = _call({"name": name.strip(), "arguments": value[0]})
        if call is None:
            return None
        calls.append(call)
    return calls, len(text)


_READERS = {HERMES_OPEN: _hermes, PYTHON_TAG: _python_tag, MISTRAL: _mistral}


def parse_answer(text: str, names: set[str]) -> Answer:
    """The answer's calls and the text outside them (see the module docstring); names: the declared tools."""
    bare = _bare(text, names)
    if bare is not None:
        return Answer(None, bare)
    outside = _Outside()
    at = 0
    while True:
        found = [(i, m) for m in MARKERS if (i := text.find(m, at)) >= 0]
        if not found:
            outside.text(text[at:])
            break
        start, marker = min(found)
        outside.text(text[at:start])
        read = _READERS[marker](text, start)
        if read is None:  # not a call: the marker stays text, and the search goes on past it
            outside.text(marker)
            at = start + len(marker)
            continue
        outside.call(read[0])
        at = read[1]
    outside.end()
    return Answer(outside.shown if outside.shown or not outside.calls else None, outside.calls)


class _Outside:
    """The content beside calls, one rule for whole and streamed answers: the spaces that join text to a call (its
    line breaks) are not content; text without calls is kept exactly. `out` collects the content to send."""

    def __init__(self) -> None:
        self.shown, self.held, self.after_call = "", "", False
        self.calls: list[dict[str, Any]] = []
        self.out: list[str] = []

    def text(self, piece: str) -> None:
        if self.after_call:
            piece = piece.lstrip()
            if not piece:
                return
            self.after_call = False
        piece = self.held + piece
        body = piece.rstrip()
        self.held = piece[len(body) :]
        if body:
            self.out.append(body)
            self.shown += body

    def call(self, calls: list[dict[str, Any]]) -> None:
        self.held, self.after_call = "", True
        self.calls += calls

    def end(self) -> None:
        if self.held:
            self.out.append(self.held)
            self.shown += self.held
            self.held = ""


def _bare(text: str, names: set[str]) -> list[dict[str, Any]] | None:
    """A whole answer that is one call object, or a list of them, naming declared tools only (a marker that is a
    control token leaves only this in the text)."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return None
    got = _json_at(stripped, 0)
    if got is None or got[1] != len(stripped):
        return None
    items = got[0] if isinstance(got[0], list) else [got[0]]
    calls = [_call(v, names) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def could_be_bare(text: str) -> bool:
    """Streaming: text that may yet be a bare call answer (see _bare), so nothing of it is shown before its end."""
    stripped = text.lstrip()
    return not stripped or stripped[0] in "{["
