"""Server-sent events as the WHATWG spec says, from bytes as they come, and each event's JSON chunk: the remote
client's reading of a streamed answer (answer_stream.py). Bounded: a line or an event over MAX_LINE_BYTES, or a
stream over its total, is an error, never a buffer that grows."""

from __future__ import annotations

import re

from .. import text_rules
from .reading import MIB

MAX_LINE_BYTES = MIB  # a line or event of the stream: a real chunk is a few tokens' JSON, a few kB with logprobs
_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
DONE = "[DONE]"


class EventStream:
    """Server-sent events, parsed as the WHATWG spec says, from bytes as they come: lines end at CR, LF or CRLF
    and nowhere else (a JSON string may hold U+2028 or U+0085, at which str.splitlines would split); an empty line
    ends an event, whose data lines are joined with LF; comments (":", servers' pings), event names, ids and retry
    times are ignored; an event not ended when the stream ends is dropped. ValueError for a line or an event over
    MAX_LINE_BYTES, or more than max_total bytes in all."""

    def __init__(self, max_total: int):
        self.max_total = max_total
        self._line = bytearray()  # the line so far
        self._data: list[bytes] = []  # the event's data lines so far
        self._data_bytes = self._total = 0
        self._after_cr = False  # the last chunk ended with CR: an LF starting the next ends no other line
        self._start = True

    def feed(self, chunk: bytes) -> list[str]:
        """The data of each event chunk completes."""
        self._total += len(chunk)
        if self._total > self.max_total:
            raise ValueError(f"more than {self.max_total:,} bytes, more than an answer of this length takes")
        if self._start and chunk:
            chunk, self._start = chunk.removeprefix(_BOM), False
        at = 1 if self._after_cr and chunk[:1] == b"\n" else 0
        self._after_cr = False
        events = []
        for end in _LINE_END.finditer(chunk, at):
            self._line += chunk[at : end.start()]
            self._check(len(self._line), "a line")
            event = self._line_ended(bytes(self._line))
            self._line.clear()
            if event is not None:
                events.append(event)
            at = end.end()
            self._after_cr = end.group() == b"\r" and at == len(chunk)
        self._line += chunk[at:]
        self._check(len(self._line), "a line")
        return events

    def _line_ended(self, line: bytes) -> str | None:
        if not line:
            if not self._data:
                return None
            data, self._data, self._data_bytes = b"\n".join(self._data), [], 0
            return data.decode("utf-8", "replace")
        if line.startswith(b":"):
            return None
        name, _, value = line.partition(b":")
        if name == b"data":
            value = value[1:] if value.startswith(b" ") else value
            self._data_bytes += len(value) + 1
            self._check(self._data_bytes, "an event")
            self._data.append(value)
        return None

    @staticmethod
    def _check(size: int, what: str) -> None:
        if size > MAX_LINE_BYTES:
            raise ValueError(f"{what} over {MAX_LINE_BYTES / MIB:g} MiB")


def parse_chunk(data: str):
    """One event's JSON object, DONE, or None for anything else (a ping, data that is no JSON object)."""
    data = data.strip()
    if data == DONE:
        return DONE
    try:
        chunk = text_rules.loads(data)  # a lone surrogate in an answer becomes U+FFFD: it can be saved
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None
