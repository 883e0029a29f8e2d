"""StopMatcher (streaming KMP) against the naive matcher it replaced, and what a push costs with long stops."""

from __future__ import annotations

import random

from engine.decoding.stop_strings import StopMatcher, prefix_function


class NaiveMatcher:
    """The matcher before issue 63: re-searches all held text for every prefix of every stop on each push."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self._pending = []

    def push(self, segments):
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

    def flush(self):
        out, self._pending = self._pending, []
        return out

    def _take(self, n_chars):
        out = []
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


def _word(rng: random.Random, alphabet: str, low: int, high: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def _script(rng: random.Random) -> tuple[list[str], list[list[tuple[str, int]]]]:
    """Stops and pushes over a tiny alphabet, so partial and overlapping matches are common."""
    alphabet = rng.choice(["ab", "abc", "aab"])
    stops = [_word(rng, alphabet, 0, 6) for _ in range(rng.randint(0, 4))]
    pushes = [
        [(_word(rng, alphabet, 0, 4), rng.randint(0, 2)) for _ in range(rng.randint(1, 3))]
        for _ in range(rng.randint(1, 12))
    ]
    return stops, pushes


def _run(matcher, pushes) -> list:
    """Every push's result, then the flush: a stop ends the stream, as the answer does."""
    out = []
    for segments in pushes:
        shown, stopped = matcher.push(list(segments))
        out.append((shown, stopped))
        if stopped:
            break
    out.append(matcher.flush())
    return out


def test_the_streaming_matcher_equals_the_naive_one_on_random_small_inputs():
    rng = random.Random(63)
    for case in range(5000):
        stops, pushes = _script(rng)
        assert _run(StopMatcher(stops), pushes) == _run(NaiveMatcher(stops), pushes), (case, stops, pushes)


def test_matching_goes_on_after_a_flush_as_the_naive_one_does():
    rng = random.Random(7)
    for _ in range(500):
        stops, pushes = _script(rng)
        fast, naive = StopMatcher(stops), NaiveMatcher(stops)
        for segments in pushes:  # flush between pushes: each starts afresh
            assert fast.push(list(segments)) == naive.push(list(segments))
            assert fast.flush() == naive.flush()


def test_the_earliest_starting_match_wins_even_when_it_ends_later():
    m = StopMatcher(["bcd", "abcdef"])
    assert m.push([("xab", 1)]) == ([("x", 1)], False)
    assert m.push([("cdef", 2)]) == ([], True)  # "abcdef" starts first: nothing more is shown
    m = StopMatcher(["cd", "zz"])
    assert m.push([("abcdzz", 0)]) == ([("ab", 0)], True)


def test_prefix_function():
    assert prefix_function("aabaaab") == [0, 1, 0, 1, 2, 2, 3]
    assert prefix_function("") == []


def test_a_100000_character_stop_costs_linear_work_over_1000_pushes():
    """Held back whole (it is all a prefix of the stop), then cut: the naive matcher compared ~10^8 prefixes."""
    stop = "ab" * 50_000
    m = StopMatcher([stop, "zz" * 600])
    shown_chars, stopped = 0, False
    for i in range(1000):
        shown, stopped = m.push([("ab" * 50, i)])  # the 1000th push completes the stop
        shown_chars += sum(len(t) for t, _ in shown)
    assert stopped and shown_chars == 0
    pushed = 1000 * 100
    assert m.examined <= 2 * 2 * pushed  # two stops, each at most two comparisons per character, amortised


def test_an_unmatched_long_stop_releases_text_as_it_goes():
    m = StopMatcher(["x" * 100_000])
    released = []
    for i in range(1000):
        shown, stopped = m.push([("y" * 7, i)])
        assert not stopped
        released += shown
    assert sum(len(t) for t, _ in released) == 7000 and m.flush() == []
    assert m.examined <= 2 * 7000
