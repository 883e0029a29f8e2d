"""Turns token byte pieces into text without ever splitting a multi-byte character."""

from __future__ import annotations

import codecs


class TextStream:
    """Feeds raw token bytes in, returns only complete UTF-8 text out."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """Whatever bytes are still pending at the end (an incomplete character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
