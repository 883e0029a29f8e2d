"""App test fixtures: settings and conversations in tmp_path, the real embedded SmolLM2-135M-Instruct (the
app's default; small context, short answers, greedy so runs repeat), and a window that is always closed
afterwards.

Tests that rely on a base model that continues text (long copies and counts), on a 262k vocabulary or on a
model without a chat template ask for the embedded Gemma 3 270M base with model=EMBEDDED_GEMMA (gemma_settings).
SmolLM2 is the default because a window's loads (the engine's model and the context meter's vocabulary)
take 0.8 s with it and 4.5 s with Gemma's 262k tokens, and most window tests only need a model that answers."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager

import pytest
from PySide6.QtCore import QObject
from PySide6.QtWidgets import QApplication

from engine.modelfiles.embedded import EMBEDDED, EMBEDDED_GEMMA, embedded_gemma_path

# Greedy copying of a passage: long enough to stop mid-way, and prompt lookup has real material.
PASSAGE = (
    "Passage: The lighthouse at Point Arden was built in 1871 from granite quarried on the island itself. "
    "For ninety years its keepers climbed one hundred and twelve steps every evening to light the lamp.\n\n"
    "Copy the passage above word for word."
)


@pytest.fixture(scope="session")
def model_file():
    return embedded_gemma_path()  # assembled once, in the real cache dir


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


@pytest.fixture
def quick_settings():
    from app.settings.values import AppSettings

    return AppSettings(model=EMBEDDED, temperature=0.0, max_tokens=24, n_ctx=1024, threads=2)


@pytest.fixture
def gemma_settings(quick_settings):
    """quick_settings on the embedded Gemma 3 270M base: a model that copies and counts, without a template."""
    from dataclasses import replace

    return replace(quick_settings, model=EMBEDDED_GEMMA)


@pytest.fixture
def make_window(qtbot, dirs, model_file):
    """make_window(settings=None, wait_loaded=True) -> a shown MainWindow on the tmp dirs."""
    from app.conversations.store import open_store
    from app.main_window import MainWindow
    from app.settings.values import AppSettings

    windows = []

    def make(settings: AppSettings | None = None, wait_loaded: bool = True, notices=()):
        store, store_notices = open_store()
        window = MainWindow(
            settings or AppSettings(model=EMBEDDED, temperature=0.0, max_tokens=24, n_ctx=1024, threads=2),
            store,
            [*notices, *store_notices],
        )
        windows.append(window)
        qtbot.addWidget(window)
        if wait_loaded:
            # Loaded, and the steps timed that the worker times right after (the window is usable meanwhile,
            # but what a test asks of the engine next would wait behind it). A lambda runs on the worker's
            # thread: it only appends.
            states: list[str] = []
            window.engine.worker.working.connect(lambda what: states.append(what))
            with qtbot.waitSignal(window.modelLoaded, timeout=120_000):
                window.show()
            qtbot.waitUntil(lambda: len(states) >= 2 and states[-1] == "", timeout=120_000)
        else:
            window.show()
        return window

    yield make
    from app.models.threads import wait_for_stopping_threads

    for window in windows:
        window.close()  # asks the worker threads to stop; closing twice is harmless
    wait_for_stopping_threads()  # closing does not wait for them: the next test starts once they have ended
    collect_garbage_now()


class _Relay(QObject):
    """Receives a signal on the GUI thread, as the window's own slots do, and keeps its arguments."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def receive(self, *args) -> None:  # a QObject's method: Qt queues it to the thread this relay lives in
        self.calls.append(args)


@contextmanager
def handled_on_gui(qtbot, signal, timeout: int):
    """qtbot.waitSignal for a signal the engine's worker emits on its own thread, waiting until the GUI thread
    has handled it. pytest-qt's blocker is not a QObject, so its slot runs on the emitting thread: the test went
    on while the window's own (queued) slots had not run yet, and read the panel before it knew it was serving."""
    relay = _Relay()
    signal.connect(relay.receive)  # queued after the window's slots, which were connected first
    try:
        yield relay.calls
        qtbot.waitUntil(lambda: bool(relay.calls), timeout=timeout)
    finally:
        signal.disconnect(relay.receive)


def collect_garbage_now() -> None:
    """Collect what a test left while its threads are stopped, not midway through the next test's load: two
    full runs crashed (SIGSEGV) in the collector on the GUI thread while a new worker thread opened a model."""
    QApplication.processEvents()  # deleteLater()s first
    gc.collect()


@pytest.fixture
def wait_response(qtbot):
    """wait_response(window) -> the last message, once the window's session is idle again."""

    def wait(window, timeout=120_000):
        qtbot.waitUntil(lambda: not window.session.busy, timeout=timeout)
        return window.session.model.items[-1]

    return wait


# The longest the GUI thread may be blocked. Work done on the GUI thread by mistake shows far above it: a file read
# or an import stored there (seconds), a wait on a held database (5 s), lexing the 400-line code block of
# test_render (~180 ms on a fast 2-core VM, more on a slow one). Rendering a huge message's first fold is
# legitimately on the GUI thread, and on a slower 2-core VM it reached 100-146 ms at base (the fold's budget is
# ~40 ms of a fast machine's layout), so 100 ms made those tests fail by the machine, not the code.
STALL_LIMIT_S = 0.200


class StallProbe:
    """A 2 ms timer on the GUI thread: the longest gap between its ticks is the worst stall."""

    LIMIT_S = STALL_LIMIT_S  # for a test module that cannot import this conftest by name

    def __init__(self):
        from PySide6.QtCore import QTimer

        self.gaps: list[float] = []
        self._last = time.perf_counter()
        self._timer = QTimer(interval=2)
        self._timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.gaps.append(now - self._last)
        self._last = now

    def start(self) -> None:
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> float:
        """Stop, and return the worst gap in seconds (the first tick's wait for the timer is left out)."""
        self._timer.stop()
        return max(self.gaps[1:])


@pytest.fixture
def stall_probe():
    probe = StallProbe()
    yield probe
    probe._timer.stop()
