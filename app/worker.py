"""The engine on its own thread. The GUI thread only sends requests and receives signals.

EngineWorker lives on a QThread and owns every model; EngineClient is its GUI-side handle. It is a dedicated
thread, not a background job (app.background), because it is an actor with state rather than one call: it holds
the loaded models and their KV caches for as long as the window is open, they are used from that one thread in
the order asked (load, apply, answer, serve, close), it runs the server's engine loop for as long as serving lasts,
and a load cannot be interrupted, so closing hands the thread to app.models.threads to be waited for at exit.
Answers come through app/answers.py (one path for this machine's engine, the server's batch and a remote
engine), which emits this worker's answer signals; EngineClient picks the source for each request and relays
the signals to the GUI. Tokens are batched (app/progress.py), so a fast model cannot flood the event loop.
Stop is a threading.Event the GUI sets directly; the engine checks it every step (and inside long batches), so
it is honoured even while the worker is busy.

Connect the worker's signals only to methods of QObjects that live on the GUI thread: a plain
function or lambda has no thread of its own and would run on the worker thread.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, QTimer, Signal, Slot

from app.answers import GenerationRequest, run_answer, run_answer_in_background
from app.engine_answers import LocalAnswers, ServedAnswers
from app.models.model_names import model_label
from app.models.threads import keep_until_finished
from app.remote_answer import RemoteAnswers
from engine.chat_format import ChatFormatter
from engine.decoding.calibration import timing_deferred
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.loader import DecoderSettings, load_draft, load_target, loads_mtp, make_proposer
from engine.decoding.proposers.base import NoProposer
from engine.decoding.runtime import Model
from engine.errors import EngineError, GenerationCancelled
from engine.methods import DRAFT_METHODS
from engine.modelfiles import model_store
from engine.modelfiles.embedded import DISPLAY_NAMES
from engine.modelfiles.load_marker import LoadMarker
from engine.text_rules import plain_name

if TYPE_CHECKING:
    from engine.serving.service import ServeOptions, Service

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.001  # Python's default is 0.005
# Opt-in: a positive value runs the engine's threads below the GUI on Linux. It helps the window on
# an oversubscribed CPU, but then any other busy program slows generation down, so it is off by default.
ENGINE_NICE = (
    int(os.environ.get("SPECCHAT_ENGINE_NICE", "0")) if os.environ.get("SPECCHAT_ENGINE_NICE", "0").isdigit() else 0
)


TIMING = "Timing steps for speculation…"  # short: the status bar cuts what does not fit


def timing_status(done: int, total: int, seconds_left: float | None) -> str:
    """The status line of a step timing: timings done of all, and the time left, an estimate."""
    if done == total:
        return f"Timing steps: {done} of {total}"
    if seconds_left is None:
        return f"Timing steps: {done} of {total}, time left n/a"
    left = f"{math.ceil(seconds_left)} s" if seconds_left < 60 else f"{math.ceil(seconds_left / 60)} min"
    return f"Timing steps: {done} of {total}, ~{left} left (estimate)"


class EngineWorker(QObject):
    loadStarted = Signal(str)  # what is loading, for the progress indicator
    working = Signal(str)  # background work the window may say it waits on ("" when done)
    loaded = Signal(object)  # model info (dict)
    loadFailed = Signal(str)
    notice = Signal(str)  # something the user should know that is not a failure
    speculationApplied = Signal(object)  # dict
    started = Signal(int)  # request id
    progress = Signal(int, object, object)  # request id, [(text, source)], stats snapshot
    finished = Signal(int, object)  # request id, final stats snapshot
    failed = Signal(int, str, object)  # request id, message, stats so far
    serverStarted = Signal(object)  # {"url", "method", "parallel", "model"}
    serverStopped = Signal(str)  # why, for a person ("" when asked to)
    serverFailed = Signal(str)
    serverRequest = Signal(object)  # engine.serving.api_config.RequestRecord, one per API request
    closed = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.decoder: SpeculativeDecoder | None = None
        self.formatter: ChatFormatter | None = None
        self.settings: DecoderSettings | None = None
        self.draft_model: Model | None = None
        self.draft_path: str | None = None
        self.marker = LoadMarker()  # says, after a crash mid-load, which model not to load again
        self.service: Service | None = None  # while serving (this thread then runs its engine loop)
        self.closing = threading.Event()  # set from the GUI thread at shutdown: a step timing stops mid-way
        # Set from the GUI thread when a message is sent: a step timing gives way to it at once, and goes on after
        # the answer (what it timed is kept); the answer plans on the sizes timed so far.
        self.answer_waiting = threading.Event()
        self._timing_due = False  # a timing was cut short by a message: resumed after the answer
        self._stop_reason = ""

    # --- models -------------------------------------------------------------------------------
    @Slot()
    def lower_priority(self) -> None:
        """Run this thread, and the compute threads llama.cpp starts from it, a little below the GUI,
        so a busy CPU serves the window first. Linux only (per-thread nice); elsewhere a no-op."""
        if not sys.platform.startswith("linux") or ENGINE_NICE <= 0:
            return
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ENGINE_NICE)
        except OSError as exc:
            log.info("could not lower the engine thread's priority: %s", exc)

    @Slot(object)
    def load(self, settings: DecoderSettings) -> None:
        """Load the target (and draft) for these settings, replacing whatever was loaded."""
        self._unload()
        self.loadStarted.emit("the embedded demo model" if settings.model == "embedded" else settings.model)
        self.marker.begin("target", settings.model)
        try:
            target = load_target(settings, strict=False)
        except EngineError as exc:
            log.warning("not loaded: %s", exc)
            self.loadFailed.emit(str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - the app must survive anything a model file does
            log.exception("loading %s", settings.model)
            self.loadFailed.emit(f"Could not load {settings.model}: {exc}")
            return
        finally:
            self.marker.end()
        self.decoder = SpeculativeDecoder(target)
        self.formatter = ChatFormatter(target)
        self.settings = settings
        if self.formatter.template_error:
            self.notice.emit(self.formatter.template_error)
        info = self._apply(settings)
        self.loaded.emit({**self._model_info(), **info})  # the window is usable now; a message sent meanwhile
        self._calibrate()  # is answered right after this

    @Slot(object)
    def apply_speculation(self, settings: DecoderSettings) -> None:
        """Change speculation for the next response; the target and its KV cache stay."""
        if self.decoder is None:
            return
        if loads_mtp(settings.method, settings.model) != self.decoder.target.settings.mtp:
            self.load(settings)  # the MTP layers load with the model (or go with it): a reload, as for a new model
            return
        if settings.method in DRAFT_METHODS and settings.draft != self.draft_path:
            self.loadStarted.emit(f"draft model {settings.draft}")
        self.settings = settings
        self.speculationApplied.emit(self._apply(settings))
        self._calibrate()

    def _apply(self, settings: DecoderSettings) -> dict[str, Any]:
        assert self.decoder is not None  # speculation is applied to a loaded model
        target = self.decoder.target
        try:
            if settings.method in DRAFT_METHODS and settings.draft != self.draft_path:
                self._close_draft()
                self.marker.begin("draft", str(settings.draft))
                try:
                    self.draft_model = load_draft(settings, target)
                finally:
                    self.marker.end()
                self.draft_path = settings.draft
            proposer = make_proposer(settings, target, self.draft_model if settings.method in DRAFT_METHODS else None)
            self.decoder.set_speculation(proposer, settings.speculation())
            method, error = proposer.name, None
        except Exception as exc:  # noqa: BLE001 - a bad draft must not cost the loaded target
            if not isinstance(exc, EngineError):
                log.exception("applying speculation")
            else:
                log.warning("speculation off: %s", exc)
            self._close_draft()
            self.decoder.set_speculation(NoProposer(), settings.speculation())
            method, error = "none", f"Speculation is off: {exc}"
            self.notice.emit(error)
        draft_name = (
            model_label(str(settings.draft)) if self.draft_model is not None and method in DRAFT_METHODS else None
        )  # its file's name and quantization, not the GGUF's own name
        return {"method": method, "draft_name": draft_name, "speculation_error": error}

    def _calibrate(self) -> None:
        """Time the verify sizes now, after the window has the model (it is usable meanwhile, and says what it
        waits on), not during the first answer. Sizes timed before for this model are not timed again. A message
        sent meanwhile cuts it short: the answer comes first, and the timing goes on after it (generate)."""
        self._timing_due = False
        if self.answer_waiting.is_set():  # a message is queued behind this: it goes first
            self._timing_due = True
            return
        self.working.emit(TIMING)
        assert self.decoder is not None  # a model was just loaded
        target = self.decoder.target
        # Closing waited for it (~20 s for Gemma 3 270M's first timing), and so did a message sent meanwhile.
        target.set_interrupt(lambda: self.closing.is_set() or self.answer_waiting.is_set())
        try:
            self.decoder.calibrate(on_progress=self._timing_progress)
        except GenerationCancelled:
            self._timing_due = not self.closing.is_set()
            log.info("step timing paused: %s", "a message was sent" if self._timing_due else "the window is closing")
        except Exception:  # noqa: BLE001 - an answer calibrates by itself if this did not
            log.exception("calibration")
        finally:
            target.set_interrupt(None)
            self.working.emit("")

    def _timing_progress(self, done: int, total: int, seconds_left: float | None) -> None:
        self.working.emit(timing_status(done, total, seconds_left))

    def _model_info(self) -> dict[str, Any]:
        assert self.decoder is not None and self.formatter is not None  # a model was just loaded
        t = self.decoder.target
        name = DISPLAY_NAMES.get(self.settings.model) if self.settings else None
        name = name or model_store.display_name(t.path) or t.name  # "qwen2.5-coder:0.5b", not the GGUF's own
        name = plain_name(name)  # a file's or header's name: no bidi control may make it read as another
        return {
            "name": name,
            "path": str(t.path),
            "backend": t.backend,
            "n_ctx": t.n_ctx,
            "chat_template": self.formatter.uses_template,
        }

    def _close_draft(self) -> None:
        if self.draft_model is not None:
            self.draft_model.close()
        self.draft_model, self.draft_path = None, None

    def _unload(self) -> None:
        self._close_draft()
        if self.decoder is not None:
            self.decoder.target.close()
        self.decoder = self.formatter = None

    # --- the API server ---------------------------------------------------------------------------
    # While serving, this thread runs the server's engine loop (Scheduler.serve) and so is blocked: every
    # decode stays on this one thread, which llama.cpp's OpenMP threads need (a decode from another thread
    # ran 2.7x slower, measured). The GUI thread then talks to the server directly: stop_server() and
    # submitting a job (app/engine_answers.py's ServedAnswers) are safe from any thread, and jobs' callbacks
    # run here and emit the usual signals.
    @Slot(object)
    def start_server(self, options: ServeOptions) -> None:
        """Serve the loaded model (options: engine.serving's ServeOptions) until stop_server(): its context is
        reopened for options.parallel sequences, and the chat's answers join the same batch as the API's."""
        from engine.serving.service import Service  # the HTTP stack loads only when it serves

        if self.decoder is None:
            self.serverFailed.emit("Load a model first.")
            return
        target = self.decoder.target
        assert self.settings is not None  # set with the decoder
        draft = self.draft_model if self.settings.method in DRAFT_METHODS else None
        try:
            for model in (target, draft):
                if model is not None:
                    model.reopen(options.parallel)
            proposer = make_proposer(self.settings, target, draft)
            service = Service(
                target,
                proposer,
                self.settings.speculation(),
                options,
                model_id=target.path.stem,
                on_record=self.serverRequest.emit,
            ).start(engine_thread=False)
        except Exception as exc:  # noqa: BLE001 - a port in use or no memory must not cost the chat
            log.warning("server not started: %s", exc)
            self._chat_again()
            self.serverFailed.emit(str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}")
            return
        self.service, self._stop_reason = service, ""
        started = {
            "url": service.url,
            "method": service.scheduler.method,
            "parallel": options.parallel,
            "model": DISPLAY_NAMES.get(self.settings.model, target.path.stem),
        }
        try:  # serves at once on the step costs the chat measured: nobody waits on timing the batch's sizes
            service.scheduler.serve(on_ready=lambda: self.serverStarted.emit(started), timed_only=True)
        except Exception:  # noqa: BLE001 - the chat must get its engine back whatever happened
            log.exception("the server's engine loop failed")
            service.stop()
        self.service = None
        self._chat_again()
        self.serverStopped.emit(self._stop_reason)

    def stop_server(self, reason: str = "") -> None:
        """From any thread: end the server; this thread then gives the chat its engine back."""
        service = self.service
        if service is not None:
            self._stop_reason = reason
            service.stop()

    def _chat_again(self) -> None:
        """One sequence again for the chat, with a decoder of its own (its KV cache starts empty)."""
        assert self.decoder is not None and self.settings is not None  # the server served a loaded model
        target = self.decoder.target
        for model in (target, self.draft_model):
            if model is not None:
                model.reopen(1)
        self.decoder = SpeculativeDecoder(target)
        self._apply(self.settings)
        self._calibrate()  # the sizes the chat timed before the server are kept: nothing to time, as a rule

    @Slot()
    def close(self) -> None:
        self._unload()
        self.closed.emit()
        QThread.currentThread().quit()

    # --- generation ---------------------------------------------------------------------------
    @Slot(object)
    def generate(self, request: GenerationRequest) -> None:
        """Answer request with this machine's decoder, here on the worker's thread; a step timing this cut short
        goes on after it (unless another message waits)."""
        self.answer_waiting.clear()
        due = self._timing_due and self.decoder is not None
        with timing_deferred(self.decoder.target) if due and self.decoder is not None else nullcontext():
            run_answer(LocalAnswers(self), request, self)
        if due and not self.answer_waiting.is_set():
            self._calibrate()


class EngineClient(QObject):
    """GUI-side handle: starts the worker's thread, forwards requests to it as queued signals, and relays the
    answer signals on the GUI thread (the chat connects here, not to the worker)."""

    started = Signal(int)  # request id
    progress = Signal(int, object, object)  # request id, [(text, source)], stats snapshot
    finished = Signal(int, object)  # request id, final stats snapshot
    failed = Signal(int, str, object)  # request id, message, stats so far
    _load = Signal(object)
    _apply = Signal(object)
    _generate = Signal(object)
    _start_server = Signal(object)
    _close = Signal()
    # The engine's thread, as an attribute: it shadows QObject.thread() (this object lives on the GUI thread)
    thread: QThread  # type: ignore[assignment]

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        # The worker runs Python between its native calls; hand the GIL back to the GUI thread quickly.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.thread = QThread()
        self.thread.setObjectName("engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self._load.connect(self.worker.load)
        self._apply.connect(self.worker.apply_speculation)
        self._generate.connect(self.worker.generate)
        self._start_server.connect(self.worker.start_server)
        self._close.connect(self.worker.close)
        self.thread.started.connect(self.worker.lower_priority)
        self.current: GenerationRequest | None = None
        self._shutting_down = False
        self.worker.finished.connect(self._done)
        self.worker.failed.connect(self._done)
        w = self.worker  # queued to this GUI-thread object after _done, as the chat's own connections were
        for worker_signal, relay in (
            (w.started, self.started),
            (w.progress, self.progress),
            (w.finished, self.finished),
            (w.failed, self.failed),
        ):
            worker_signal.connect(relay)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)  # never leave the thread running at exit
        self.thread.start()

    def load(self, settings: DecoderSettings) -> None:
        self.stop_server("The server stopped: a different model is loading. Start it again in Server….")
        self._load.emit(settings)

    def apply_speculation(self, settings: DecoderSettings) -> None:
        self.stop_server("The server stopped: the speculation settings changed. Start it again in Server….")
        self._apply.emit(settings)

    def generate(self, request: GenerationRequest) -> GenerationRequest:
        """Answer request from the source it needs (app/answers.py); its signals come from this client."""
        self.current = request
        if request.remote is not None:  # another machine answers: a thread waits on it, this engine is free
            run_answer_in_background(RemoteAnswers(), request, self.worker, "remote-answer")
        elif self.worker.service is not None:  # the worker's thread is running the server's engine loop
            # Templating and tokenizing a conversation is not the GUI thread's work (a template may take its
            # sandbox's 3 s before it is refused): a thread of its own, whose signals are queued to the GUI.
            run_answer_in_background(ServedAnswers(self.worker), request, self.worker, "served-chat-prompt")
        else:
            self.worker.answer_waiting.set()  # a step timing under way stops for it (EngineWorker._calibrate)
            # Start on the next turn of the event loop, once the GUI has laid out the messages just
            # added: the prompt's prefill takes every core, and that layout competing with it is
            # what the window would stall on (tens of ms on 2 cores).
            QTimer.singleShot(0, lambda: self._generate.emit(request))
        return request

    def start_server(self, options: ServeOptions) -> None:
        self._start_server.emit(options)

    def stop_server(self, reason: str = "") -> None:
        self.worker.stop_server(reason)  # thread-safe: the worker's thread is busy serving

    def stop(self) -> None:
        if self.current is not None:
            self.current.cancel.set()

    def _done(self, rid: int, *_: object) -> None:
        if self.current is not None and self.current.id == rid:
            self.current = None

    def request_shutdown(self) -> None:
        """Stop any response, and ask the worker to free the models and end its thread, without waiting: the window
        closes at once. The thread is kept until it ends (app.models.threads), and the app's exit waits for it."""
        self.stop()
        self.stop_server("")
        if self._shutting_down or not self.thread.isRunning():
            return
        self._shutting_down = True
        self.worker.closing.set()  # a step timing stops mid-way; a load cannot be stopped, and ends on its own
        self._close.emit()
        keep_until_finished(self.thread, self.worker)

    def shutdown(self, timeout_ms: int = 120_000) -> bool:
        """request_shutdown, then wait for the thread to end (at the app's exit, the window gone). True if it ended.

        A response stops within one step; a model load cannot be interrupted, so this may wait for it."""
        self.request_shutdown()
        return self.thread.wait(timeout_ms)
