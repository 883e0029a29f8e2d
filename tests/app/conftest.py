"""App test fixtures: settings and conversations in tmp_path, the real embedded SmolLM2-135M-Instruct (the
app's default; small context, short answers, greedy so runs repeat), and a window that is always closed
afterwards.

Tests that rely on a base model that continues text (long copies and counts), on a 262k vocabulary or on a
model without a chat template ask for the embedded Gemma 3 270M base with model=EMBEDDED_GEMMA (gemma_settings).
SmolLM2 is the default because a window's loads (the engine's model and the context meter's vocabulary)
take 0.8 s with it and 4.5 s with Gemma's 262k tokens, and most window tests only need a model that answers."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QFileDialog

from engine.modelfiles.embedded import EMBEDDED, EMBEDDED_GEMMA

from support.window import StallProbe, collect_garbage_now


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
def make_window(qtbot, dirs, gemma_path):
    """make_window(settings=None, wait_loaded=True) -> a shown MainWindow on the tmp dirs. (gemma_path: the embedded
    Gemma is assembled before any window that may offer or load it.)"""
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


@pytest.fixture
def wait_response(qtbot):
    """wait_response(window) -> the last message, once the window's session is idle again."""

    def wait(window, timeout=120_000):
        qtbot.waitUntil(lambda: not window.session.busy, timeout=timeout)
        return window.session.model.items[-1]

    return wait


@pytest.fixture
def stall_probe():
    probe = StallProbe()
    yield probe
    probe._timer.stop()


@pytest.fixture
def answered_dialogs(monkeypatch, dirs):
    """File dialogs answered with a file in the test's folder; every modal box closed once it shows."""
    export = dirs / "exported.json"
    asked = []

    def save(parent, caption, *args, **kwargs):
        asked.append(caption)
        return str(export), "JSON, every branch (*.json)"

    def open_one(parent, caption, *args, **kwargs):
        asked.append(caption)
        return str(export), ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(save))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(open_one))
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(lambda *a, **k: ([], "")))
    closed = []

    def close_modal() -> None:
        box = QApplication.activeModalWidget()
        if box is not None:
            closed.append(box.windowTitle())
            box.reject()

    closer = QTimer(interval=100)
    closer.timeout.connect(close_modal)
    closer.start()
    yield export, asked, closed
    closer.stop()
