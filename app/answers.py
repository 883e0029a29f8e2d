"""The one answer path: how a chat answer reaches the window, whoever writes it.

Three sources answer a GenerationRequest: this machine's engine in its own loop, the same engine as one job of
the API server's batch (app/engine_answers.py), and a remote server (app/remote_answer.py). Each implements
AnswerSource.answer(request, out) and only says what happens (text, figures, the end, a failure it was told
of) through `out`, an Answer. run_answer drives them all: it is the one place the engine worker's started /
progress / finished / failed signals are emitted and an unexpected failure is put into words, so the chat,
Stop, Regenerate, Compare and the figures see the same thing from every source.
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.background import run_in_background
from app.progress import ProgressBatch
from engine.decoding.sampling import SamplingParams
from engine.errors import EngineError
from engine.remote.endpoint import Endpoint

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    messages: list[dict]  # [{"role", "content"}], ending with the user message to answer
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 1024
    cancel: threading.Event = field(default_factory=threading.Event)
    id: int = field(default_factory=itertools.count(1).__next__)
    plain: bool = False  # this request only, no speculation (the Compare view's baseline)
    continue_last: bool = False  # messages end with an answer cut short: write more of it
    remote: Endpoint | None = None  # answered by this server (app/remote_answer.py), not this machine's engine


class _Emits(Protocol):
    def emit(self, *args: Any) -> None: ...


class AnswerSignals(Protocol):
    """The engine worker's answer signals (anything with these attributes' emit, in tests)."""

    @property
    def started(self) -> _Emits: ...  # (request id)
    @property
    def progress(self) -> _Emits: ...  # (request id, [(text, source)], figures)
    @property
    def finished(self) -> _Emits: ...  # (request id, final figures)
    @property
    def failed(self) -> _Emits: ...  # (request id, message, figures so far)
    @property
    def notice(self) -> _Emits: ...  # (text): something the user should know that is not a failure


class AnswerSource(Protocol):
    failure: str  # the words before an unexpected failure's type and text, e.g. "The engine failed"
    what: str  # what failed, for the log

    def answer(self, request: GenerationRequest, out: Answer) -> None:
        """Answer request through out; raise (an EngineError's text is shown as it is) when it cannot."""


class Answer:
    """One request's way to the window: its text batched (app/progress.py), then finished or failed, once."""

    def __init__(self, signals: AnswerSignals, rid: int):
        self.signals, self.rid = signals, rid
        self.batch = ProgressBatch(signals.progress.emit, rid)
        self.figures: Callable[[], dict] = dict  # the answer's figures so far; {} until the source has some

    def notice(self, text: str) -> None:
        self.signals.notice.emit(text)

    def add(self, segments: list, figures: Callable[[], dict] | None = None) -> None:
        self.batch.add(segments, figures or self.figures)

    def show_held(self) -> None:
        """The text batched so far, now (the source goes quiet): not held back for a next piece."""
        if self.batch.pending:
            self.batch.flush(self.figures())

    def finish(self, stats: dict, **extra) -> None:
        self.batch.flush(stats)
        self.signals.finished.emit(self.rid, {**stats, **extra})

    def fail(self, message: str, stats: dict) -> None:
        self.batch.flush(stats)
        self.signals.failed.emit(self.rid, message, stats)


def run_answer(source: AnswerSource, request: GenerationRequest, signals: AnswerSignals) -> None:
    """Answer request from source: started, then its progress, then finished or failed, whatever happens."""
    out = Answer(signals, request.id)
    signals.started.emit(request.id)
    try:
        source.answer(request, out)
    except Exception as exc:  # noqa: BLE001 - the chat is told whatever fails; the worker stays alive
        if not isinstance(exc, EngineError):
            log.error("%s failed:\n%s", source.what, traceback.format_exc())
        message = str(exc) if isinstance(exc, EngineError) else f"{source.failure}: {type(exc).__name__}: {exc}"
        out.fail(message, out.figures())


def run_answer_in_background(
    source: AnswerSource, request: GenerationRequest, signals: AnswerSignals, name: str
) -> None:
    """run_answer off the GUI thread (app.background), its signals queued to the GUI. A daemon job: an answer that
    waits on a server far away does not keep the app from quitting."""

    def run() -> None:
        try:
            run_answer(source, request, signals)
        except RuntimeError as exc:  # the worker was deleted: the window closed while this was answered
            log.info("an answer outlived its window: %s", exc)

    run_in_background(run, daemon=True, name=name)
