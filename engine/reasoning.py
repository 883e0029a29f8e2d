"""A reasoning model's thought, kept apart from its answer.

Qwen3, QwQ and the DeepSeek-R1 distills write their reasoning first, between <think> and </think>,
then the answer. Their chat templates leave that reasoning out when the turn is sent back as history,
so SpecChat does the same (the model was trained on histories without it), and shows it folded.

Some templates (newer R1 distills) write the opening <think> into the prompt themselves, so the answer
starts inside the thought and only </think> appears: then everything before it is the thought.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ThinkSpan:
    """Where the parts of a response lie: text[thought_start:thought_end] is the thought,
    text[answer_start:] the answer."""

    thought_start: int
    thought_end: int
    answer_start: int
    closed: bool  # the closing tag has arrived (False while the model is still thinking)


def find_thinking(text: str) -> ThinkSpan | None:
    """The think block at the start of a response, or None when it has none."""
    lead = len(text) - len(text.lstrip())
    if text.startswith(OPEN, lead):
        start = lead + len(OPEN)
    elif len(text) - lead >= 2 and OPEN.startswith(text[lead:]):
        return ThinkSpan(len(text), len(text), len(text), False)  # "<thi" while streaming: hold it back
    else:
        close = text.find(CLOSE)
        if close < 0 or OPEN in text[:close]:
            return None
        start = 0  # the template opened the thought (see the module docstring)
    close = text.find(CLOSE, start)
    if close < 0:
        return ThinkSpan(start, len(text), len(text), False)
    answer = close + len(CLOSE)
    answer += len(text[answer:]) - len(text[answer:].lstrip())
    return ThinkSpan(start, close, answer, True)


def split_thinking(text: str) -> tuple[str | None, str, bool]:
    """(thought, answer, closed): thought is None when the response has no think block; closed is
    False only while a thought is still being written."""
    span = find_thinking(text)
    if span is None:
        return None, text, True
    return text[span.thought_start : span.thought_end].strip(), text[span.answer_start :], span.closed


def without_thinking(text: str) -> str:
    """The answer alone: what a previous assistant turn contributes to the next prompt."""
    return split_thinking(text)[1]


class ThoughtClock:
    """Times a thought while its response streams: from the response's first text (where the thought
    begins) to the arrival of the closing tag. Fed the whole text so far, with the time it arrived."""

    def __init__(self, seconds: float | None = None):
        self.began: float | None = None
        self.seconds = seconds  # known already: a continued answer keeps its thought's time

    def update(self, text: str, now: float) -> float | None:
        if self.seconds is None and text:
            if self.began is None:
                self.began = now
            span = find_thinking(text)
            if span is not None and span.closed:
                self.seconds = round(now - self.began, 2)
        return self.seconds
