"""Holds back streamed text that might be the start of a stop string, and cuts at one."""
from __future__ import annotations

from typing import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._pending: list[tuple[str, str | None]] = []  # (text, source) not yet released

    def push(self, segments: list[tuple[str, bool]]) -> tuple[list[tuple[str, bool]], bool]:
        """Add segments; return (segments safe to show, whether a stop string was reached)."""
        if not self.stops:
            return segments, False
        self._pending += segments
        text = "".join(t for t, _ in self._pending)
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            released = self._take(min(cuts))
            self._pending = []
            return released, True
        hold = max((n for s in self.stops for n in range(len(s) - 1, 0, -1) if text.endswith(s[:n])), default=0)
        return self._take(len(text) - hold), False

    def flush(self) -> list[tuple[str, bool]]:
        out, self._pending = self._pending, []
        return out

    def _take(self, n_chars: int) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        while self._pending and n_chars > 0:
            text, flag = self._pending[0]
            if len(text) <= n_chars:
                out.append(self._pending.pop(0))
                n_chars -= len(text)
            else:
                out.append((text[:n_chars], flag))
                self._pending[0] = (text[n_chars:], flag)
                n_chars = 0
        return out
