"""Holds back streamed text that might be the start of a stop string, and cuts at one.

Each stop string keeps a streaming KMP state: the length of its longest prefix that is a suffix of the text so
far. Only new characters are fed, so a push costs O(new text × stop strings) amortised, however long the stop
strings are (re-searching the held text on every token took 54 s for one 1 MB stop string, on the engine thread
every request shares)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

Flag = TypeVar("Flag")  # what a segment carries along (the answer's draft source)


def prefix_function(s: str) -> list[int]:
    """fail[i]: the length of the longest proper prefix of s[:i + 1] that is also its suffix."""
    fail = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class _Stop:
    """One stop string's automaton: state = characters of it matched at the end of the text."""

    def __init__(self, s: str):
        self.s, self.fail, self.state = s, prefix_function(s), 0

    def feed(self, text: str) -> tuple[int, int]:
        """Advance over text; returns (index in text just past the first full match, or -1; characters examined).
        Stops at that match: the matcher cuts there and starts afresh."""
        s, fail, k, n, examined = self.s, self.fail, self.state, len(self.s), 0
        for i, c in enumerate(text):
            while k and s[k] != c:  # each fall-back undoes an earlier advance: amortised O(1) per character
                k = fail[k - 1]
                examined += 1
            examined += 1
            if s[k] == c:
                k += 1
                if k == n:
                    self.state = k
                    return i + 1, examined
        self.state = k
        return -1, examined


class StopMatcher(Generic[Flag]):
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._automata = [_Stop(s) for s in self.stops]
        self._pending: deque[tuple[str, Flag]] = deque()  # (text, source) not yet released
        self._pending_chars = 0
        self.examined = 0  # characters compared, over the matcher's life: what a push costs, for tests

    def push(self, segments: list[tuple[str, Flag]]) -> tuple[list[tuple[str, Flag]], bool]:
        """Add segments; return (segments safe to show, whether a stop string was reached). On a stop, the text
        before the earliest-starting match completed in this push is shown, and nothing after it."""
        if not self.stops:
            return segments, False
        new = "".join(t for t, _ in segments)
        before = self._pending_chars  # held text: no full match ends in it
        self._pending.extend(segments)
        self._pending_chars += len(new)
        cut = self._earliest_match(new, before)
        if cut is not None:
            released = self._take(cut)
            self._reset()
            return released, True
        hold = max(a.state for a in self._automata)  # the longest partial match: each < its string's length
        return self._take(self._pending_chars - hold), False

    def flush(self) -> list[tuple[str, Flag]]:
        out = list(self._pending)
        self._reset()
        return out

    def _earliest_match(self, new: str, before: int) -> int | None:
        """Where (in the pending text) the earliest-starting match ending in `new` begins, or None. A longer stop
        string may end later yet start earlier, so every string is fed all of `new`."""
        cut = None
        for a in self._automata:
            end, examined = a.feed(new)
            self.examined += examined
            if end >= 0:
                start = before + end - len(a.s)
                cut = start if cut is None else min(cut, start)
        return cut

    def _reset(self) -> None:
        self._pending.clear()
        self._pending_chars = 0
        for a in self._automata:
            a.state = 0

    def _take(self, n_chars: int) -> list[tuple[str, Flag]]:
        """Release the first n_chars of pending text; whole segments where they fit, the last one split."""
        out: list[tuple[str, Flag]] = []
        while self._pending and n_chars > 0:
            text, flag = self._pending[0]
            if len(text) <= n_chars:
                out.append(self._pending.popleft())
                n_chars -= len(text)
                self._pending_chars -= len(text)
            else:
                out.append((text[:n_chars], flag))
                self._pending[0] = (text[n_chars:], flag)
                self._pending_chars -= n_chars
                n_chars = 0
        return out
