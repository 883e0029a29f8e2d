"""How much of the model's context the conversation takes, shown under the message box as
"1,234 / 4,096 tokens", with a warning before the oldest messages would be left out.

Counting uses the loaded model's own tokenizer and chat format (engine.chat_format), so the figure is
the prompt the model would get. A chat on a remote engine is counted by the server (its /tokenize), off the
GUI thread (app.background), or estimated from its characters where the server cannot count, and labelled so.
The model itself lives on the engine thread, which is busy for as long as an answer streams; so a
vocabulary-only copy (no weights, a few MB) is loaded on a thread of its own, and the GUI thread only sends
it work and gets results back as signals. Typing is debounced.

The counter is not a background job (app.background) but a thread of its own, as the engine worker is: it holds
a loaded vocabulary for as long as the window is open, and its loads, counts and close must reach that one
vocabulary in order, the newest count of a kind skipping older ones still waiting.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from PySide6.QtCore import QCoreApplication, QObject, QThread, QTimer, Signal, Slot
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from app.models.threads import keep_until_finished
from app.remote_answer import ask_server
from engine.chat_format import ChatFormatter, answer_reserve
from engine.decoding.runtime import LoadSettings, Model
from engine.errors import ContextOverflowError
from engine.remote.client import PromptCount
from engine.remote.endpoint import Endpoint

log = logging.getLogger(__name__)

T = TypeVar("T")

DEBOUNCE_MS = 300
NEARLY_FULL = 0.85  # of what a prompt may take: from here on the meter says how much is left


@dataclass(frozen=True)
class Measure:
    tokens: int  # the whole conversation (and the message being written), as the model's prompt
    n_ctx: int
    budget: int  # what a prompt may take: the context less the answer's reserve
    drafted: bool  # the last message is the one being written
    trimmed: int = 0  # oldest messages sending it would leave out
    overflow: bool = False  # even the newest message alone does not fit


class Tokenizer:
    """A model's vocabulary and chat format, without its weights. Used only on the counter's thread."""

    def __init__(self, path: str, n_ctx: int):
        self.model = Model(path, LoadSettings(n_gpu_layers=0), vocab_only=True)
        self.model.n_ctx = n_ctx  # a vocabulary-only load has no context; the formatter trims to the real one
        self.formatter = ChatFormatter(self.model)

    def count_text(self, text: str) -> int:
        return len(self.model.tokenize(text, add_bos=False, special=False))

    def measure(self, messages: Sequence[dict], reserve: int) -> Measure:
        n_ctx = self.model.n_ctx
        if not messages:  # an empty chat sends nothing (and many templates read messages[0]: they fail on none)
            return Measure(0, n_ctx, n_ctx - reserve, drafted=False)
        tokens = len(self.formatter.render(messages)[1])
        drafted = bool(messages) and messages[-1]["role"] == "user"
        trimmed, overflow = 0, False
        if drafted and tokens > n_ctx - reserve:
            try:
                trimmed = self.formatter.prompt(messages, reserve).trimmed  # what sending it would do
            except ContextOverflowError:
                overflow = True
        return Measure(tokens, n_ctx, n_ctx - reserve, drafted, trimmed, overflow)

    def close(self) -> None:
        self.model.close()


class _CounterWorker(QObject):
    loaded = Signal(int, object)  # generation, error text (None: ready)
    done = Signal(int, object)  # job id, result (None: skipped; an exception: failed)

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer: Tokenizer | None = None
        self.newest: dict[str, int] = {}  # key → the newest job for it; older ones are skipped

    @Slot(int, str, int)
    def load(self, generation: int, path: str, n_ctx: int) -> None:
        self._close()
        error = None
        if path:
            try:
                self.tokenizer = Tokenizer(path, n_ctx)
            except Exception as exc:  # noqa: BLE001 - the meter is optional; the chat must go on without it
                log.warning("no tokenizer for the context meter: %s", exc)
                error = str(exc)
        self.loaded.emit(generation, error)

    @Slot(int, object, object)
    def run(self, job: int, key, work) -> None:
        if self.tokenizer is None or (key is not None and self.newest.get(key, job) != job):
            self.done.emit(job, None)
            return
        try:
            result = work(self.tokenizer)
        except Exception as exc:  # noqa: BLE001 - e.g. a template that rejects the conversation
            result = exc
        self.done.emit(job, result)

    @Slot()
    def close(self) -> None:
        self._close()
        QThread.currentThread().quit()

    def _close(self) -> None:
        if self.tokenizer is not None:
            self.tokenizer.close()
        self.tokenizer = None


class TokenCounter(QObject):
    """GUI-side handle of the counting thread: submit(work, callback) runs work(tokenizer) there and
    calls callback(result) back on the GUI thread."""

    readyChanged = Signal()
    _load = Signal(int, str, int)
    _run = Signal(int, object, object)
    _close = Signal()
    # The counting thread, as an attribute: it shadows QObject.thread() (this object lives on the GUI thread)
    thread: QThread  # type: ignore[assignment]

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("token counter")
        self.worker = _CounterWorker()
        self.worker.moveToThread(self.thread)
        self._load.connect(self.worker.load)
        self._run.connect(self.worker.run)
        self._close.connect(self.worker.close)
        self.worker.loaded.connect(self._loaded)
        self.worker.done.connect(self._done)
        self.available = False  # a tokenizer for the loaded model is in place
        self.n_ctx: int | None = None
        self.path: str | None = None
        self._generation = 0
        self._jobs = itertools.count(1)
        self._callbacks: dict[int, tuple[Callable[[Any], None], Callable[[Exception], None] | None]] = {}
        self._closing = False
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self.thread.start()

    def load(self, path: str, n_ctx: int) -> None:
        """Count for this model (its file and the context it was loaded with) from now on."""
        if (path, n_ctx) == (self.path, self.n_ctx) and self.available:
            return
        self._generation += 1
        self.path, self.n_ctx, self.available = path, n_ctx, False
        self._load.emit(self._generation, path, n_ctx)
        self.readyChanged.emit()

    def unload(self) -> None:
        self._generation += 1
        self.path, self.n_ctx, self.available = None, None, False
        self._load.emit(self._generation, "", 0)
        self.readyChanged.emit()

    def submit(
        self,
        work: Callable[[Tokenizer], T],
        callback: Callable[[T], None],
        key: str | None = None,
        failed: Callable[[Exception], None] | None = None,
    ) -> None:
        """Run work(tokenizer) on the counter's thread; callback(result) follows on this one, or failed(exception)
        if it failed, unless a newer job with the same key came first (then it is skipped: only the latest count
        matters)."""
        job = next(self._jobs)
        self._callbacks[job] = (callback, failed)
        if key is not None:
            self.worker.newest[key] = job
        self._run.emit(job, key, work)

    def _loaded(self, generation: int, error) -> None:
        if generation == self._generation:
            self.available = error is None and self.path is not None
            self.readyChanged.emit()

    def _done(self, job: int, result) -> None:
        callback, failed = self._callbacks.pop(job, (None, None))
        if isinstance(result, Exception):
            log.warning("token count failed: %s", result)
            if failed is not None:
                failed(result)
        elif result is not None and callback is not None:
            callback(result)

    def request_shutdown(self) -> None:
        """Count nothing more and end the thread, without waiting (a count of a long chat may take seconds): the
        window closes at once. The thread is kept until it ends (app.models.threads); the app's exit waits."""
        self.available = False  # nothing more is counted (the window is closing: its store is closed too)
        self._callbacks.clear()  # a count still running answers no one
        if self._closing or not self.thread.isRunning():
            return
        self._closing = True
        self._close.emit()
        keep_until_finished(self.thread, self.worker)

    def shutdown(self, timeout_ms: int = 10_000) -> bool:
        """request_shutdown, then wait for the thread (at the app's exit). True if it ended."""
        self.request_shutdown()
        return self.thread.wait(timeout_ms)


class ContextMeter(QWidget):
    """ "1,234 / 4,096 tokens" for the conversation and the message being written, and a warning when
    sending it would leave the oldest messages out of what the model sees (they stay saved).

    source() gives the messages as they would be sent, the message being written last (if any), and the
    answer's max tokens; schedule() counts again a moment later (call it on every change)."""

    measured = Signal(object)  # Measure

    def __init__(
        self,
        counter: TokenCounter,
        source: Callable[[], tuple[list[dict], int]],
        parent: QWidget | None = None,
        remote: Callable[[], Endpoint | None] = lambda: None,
    ):
        super().__init__(parent)
        self.counter = counter
        self.source: Callable[[], tuple[list[dict], int]] | None = source  # None once the window closes
        self.remote = remote  # the open chat's remote engine, or None for this machine's
        self._remote_job = 0
        self.measure: Measure | None = None
        row = QHBoxLayout(self)
        row.setContentsMargins(2, 0, 0, 0)
        self.count = QLabel()
        self.count.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # a figure to glance at, not to read
        self.warning = QLabel()
        self.warning.setWordWrap(True)
        self.warning.hide()
        row.addWidget(self.count)
        row.addWidget(self.warning, 1)
        self._timer = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self._timer.timeout.connect(self.count_now)
        counter.readyChanged.connect(self.schedule)
        self._show_state()

    def schedule(self) -> None:
        if self.source is not None:
            self._timer.start()

    def restart(self) -> None:
        """Another conversation is shown: what was counted for the last one goes at once (a count may take a
        moment, and until it comes no figure is better than the wrong one)."""
        if self.source is not None:
            self._remote_job += 1  # a remote count still on its way was the last conversation's
            self._show_state()
            self.schedule()

    def stop(self) -> None:
        """The window is closing (its store too): count nothing more."""
        self._timer.stop()
        self.source = None

    def message_budget(self) -> int | None:
        """Tokens one message may take (the context less the answer's reserve), None with no model."""
        if self.counter.n_ctx is None or self.source is None:
            return None
        return self.counter.n_ctx - answer_reserve(self.source()[1], self.counter.n_ctx)

    def count_now(self) -> None:
        self._timer.stop()
        if self.source is None:
            return
        endpoint = self.remote()
        if endpoint is not None:
            return self._count_remotely(endpoint, *self.source())
        if not self.counter.available:
            self._show_state()
            return
        messages, max_tokens = self.source()
        assert self.counter.n_ctx is not None  # available: a model's context is known
        reserve = answer_reserve(max_tokens, self.counter.n_ctx)
        self.counter.submit(lambda t: t.measure(messages, reserve), self._show, key="meter", failed=self._failed)

    def _count_remotely(self, endpoint: Endpoint, messages: list[dict], max_tokens: int) -> None:
        self._remote_job += 1
        job = self._remote_job

        def count(remote) -> PromptCount:
            return remote.count_prompt(messages, remote.model()) if messages else PromptCount(0, None, True)

        ask_server(endpoint, count, lambda result: self._show_remote(job, result, max_tokens), "remote-count", self)

    def _show_remote(self, job: int, result, max_tokens: int) -> None:
        if job != self._remote_job or self.source is None:
            return  # a newer count is on its way
        self.warning.hide()
        if isinstance(result, str):
            self.measure = None
            self.count.setText("tokens n/a (remote)")
            self.count.setToolTip(f"The server could not be asked how long this conversation is: {result}")
            return
        about = "" if result.exact else "≈"
        how = (
            "counted by the server's own tokenizer"
            if result.exact
            else "an estimate (4 characters a token): this server cannot count tokens"
        )
        if result.n_ctx is None:
            self.measure = None
            self.count.setText(f"{about}{result.tokens:,} tokens")
            self.count.setToolTip(
                f"The conversation takes {about}{result.tokens:,} tokens, {how}; the server does "
                "not say how long its context is."
            )
            return
        reserve = answer_reserve(max_tokens, result.n_ctx)
        m = Measure(result.tokens, result.n_ctx, result.n_ctx - reserve, drafted=False)
        self.measure = m
        self.count.setText(f"{about}{m.tokens:,} / {m.n_ctx:,} tokens")
        self.count.setToolTip(
            f"The conversation takes {about}{m.tokens:,} tokens of the server's {m.n_ctx:,}-token "
            f"context ({how}); {m.n_ctx - m.budget:,} are kept for the answer."
        )
        if m.tokens > m.budget:
            self.warning.setText(
                "This conversation is longer than the server's context allows with room for an "
                "answer: it will refuse it. Start a new chat, or lower 'Max response tokens'."
            )
            self.warning.setStyleSheet("color: #c62828;")
            self.warning.show()
        self.measured.emit(m)

    def _show_state(self) -> None:
        self.measure = None
        self.count.setText("" if self.counter.n_ctx is None else f"… / {self.counter.n_ctx:,} tokens")
        self.count.setToolTip("")
        self.warning.hide()

    def _failed(self, exc: Exception) -> None:
        self.measure = None
        self.count.setText("tokens n/a")
        self.count.setToolTip(f"This conversation's tokens could not be counted: {exc}")
        self.warning.hide()

    def _show(self, m: Measure) -> None:
        if self.source is None or self.remote() is not None:
            return  # counted here before the chat moved to a remote engine: the server's count is the one to show
        self.measure = m
        self.count.setText(f"{m.tokens:,} / {m.n_ctx:,} tokens")
        takes = "and your message take" if m.drafted else "takes"
        self.count.setToolTip(
            f"The conversation {takes} {m.tokens:,} tokens "
            f"of the model's {m.n_ctx:,}-token context; {m.n_ctx - m.budget:,} are kept for the "
            "answer."
        )
        text, level = warning_text(m)
        self.warning.setText(text)
        self.warning.setStyleSheet("color: #c62828;" if level == "warning" else "")
        self.warning.setVisible(bool(text))
        self.measured.emit(m)


def warning_text(m: Measure) -> tuple[str, str]:
    """(text, "warning" | "info") for a measure; ("", "") when there is room."""
    if m.overflow:
        return (
            "This message does not fit the context even on its own: shorten it (or its files), lower "
            "'Max response tokens', or raise the context size in Settings.",
            "warning",
        )
    if m.trimmed:
        s = "s" if m.trimmed != 1 else ""
        return (
            f"Sending this leaves the {m.trimmed} oldest message{s} out of what the model sees (they stay saved here).",
            "warning",
        )
    if m.tokens > m.budget:
        return (
            "The context is full: the next message will leave the oldest messages out of what the model sees.",
            "warning",
        )
    if m.tokens >= NEARLY_FULL * m.budget:
        return (f"Nearly full: {m.budget - m.tokens:,} tokens left before the oldest messages are left out.", "info")
    return "", ""
