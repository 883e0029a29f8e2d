"""One answer's tokens become text here: cut before an end token, at the token budget, or exactly at a
stop string, streamed without splitting a character. The chat, the batch and the server share it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .runtime import Model
from .stop_strings import StopMatcher
from .text_stream import TextStream


def tokens_to_keep(tokens: list[int], target: Model, ignore_eos: bool, budget: int) -> tuple[int, str | None]:
    """How many of a step's tokens an answer keeps, and why it ends if it does: before an end token
    ("stop"), or at the token budget ("length"). The chat and the batch cut by this one rule."""
    keep, reason = len(tokens), None
    if not ignore_eos:
        keep = next((i for i, tok in enumerate(tokens) if target.is_end(tok)), keep)
        reason = "stop" if keep < len(tokens) else None
    if keep >= budget:
        keep, reason = budget, reason or "length"
    return keep, reason


@dataclass
class Delta:
    """Newly produced tokens and their text; each token's source names the proposer whose accepted draft it was
    ("lookup" or "draft"), None for the target's own token."""

    tokens: list[int]
    segments: list[tuple[str, str | None]] = field(default_factory=list)  # (text, source) per token

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)


class AnswerStream:
    """What an answer keeps of each step's tokens, and its text. `finish` says why it ended, once it has."""

    def __init__(self, target: Model, max_tokens: int, ignore_eos: bool = False, stop: Sequence[str] = ()):
        self.target = target
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.tokens: list[int] = []
        self.finish: str | None = None
        self._text = TextStream()
        self._stopper: StopMatcher[str | None] = StopMatcher(stop)

    @property
    def tokens_left(self) -> int:
        return self.max_tokens - len(self.tokens)

    def push(self, tokens: list[int], accepted: int = 0, source: str | None = None) -> Delta:
        """A step's tokens (the first `accepted` from drafts `source` proposed); returns what the answer keeps
        and shows."""
        keep, self.finish = tokens_to_keep(tokens, self.target, self.ignore_eos, self.tokens_left)
        kept, shown = [], []
        for i, tok in enumerate(tokens[:keep]):  # token by token, to stop exactly
            released, hit_stop = self._stopper.push(
                [(self._text.push(self.target.piece(tok)), source if i < accepted else None)]
            )
            shown += released
            kept.append(tok)
            if hit_stop:  # tokens accepted past a stop string are neither shown nor kept
                self.finish = "stop"
                self.tokens += kept
                return Delta(kept, shown)
        self.tokens += kept
        if self.finish:
            shown += self.close()
        return Delta(kept, shown)

    def end(self, reason: str) -> Delta:
        """End the answer for a reason of the caller's (context full, cancelled); returns held-back text."""
        self.finish = self.finish or reason
        return Delta([], self.close())

    def close(self) -> list[tuple[str, str | None]]:
        """Text held back for a possible stop string, and any incomplete character."""
        shown = self._stopper.flush()
        tail = self._text.flush()
        return shown + ([(tail, None)] if tail else [])
