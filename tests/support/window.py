"""Helpers for the window tests (tests/app): the passage the greedy tests copy, the GUI thread's stall limit, the
probe that measures stalls and where a call ran, waiting for a worker's signal to be handled on the GUI thread,
the menus, a file drop, a conversation saved before the window opens, the draft highlight's characters, a fixed
answer streamed as the decoder streams, and the server panel started as a person starts it."""

from __future__ import annotations

import gc
import socket
import threading
import time
from contextlib import contextmanager

from PySide6.QtCore import QMimeData, QObject, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QTextCursor, QTextDocument
from PySide6.QtWidgets import QApplication, QMenu

# Greedy copying of a passage: long enough to stop mid-way, and prompt lookup has real material.
PASSAGE = (
    "Passage: The lighthouse at Point Arden was built in 1871 from granite quarried on the island itself. "
    "For ninety years its keepers climbed one hundred and twelve steps every evening to light the lamp.\n\n"
    "Copy the passage above word for word."
)


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


# The most CPU time the GUI thread may spend between two turns of its event loop. Work done on the GUI thread by
# mistake shows far above it: lexing the 400-line code block of test_render (~180 ms on a fast 2-core VM), loading
# a model, decoding, folding a 50 MB answer. Rendering a huge message's first fold is legitimately on the GUI thread,
# and on a slower 2-core VM it reached 100-146 ms at base (the fold's budget is ~40 ms of a fast machine's layout).
# The probe counts the GUI thread's own CPU time (time.thread_time), not the wall clock: other processes on shared
# cores, or a worker holding the GIL, make the wall-clock gaps longer but not this. A GUI thread that waits (a
# file, a socket, a held database) spends no CPU: those tests prove where the waiting happens (WhereItRan below, a
# lock or a hub held until the test lets go).
STALL_LIMIT_S = 0.200


class StallProbe:
    """A 2 ms timer on the GUI thread: the most CPU time the GUI thread spent between two of its ticks is the worst
    stall (a tick is one turn of the event loop: whatever ran between two ticks ran in one go)."""

    LIMIT_S = STALL_LIMIT_S  # the limit, with the probe a test was given

    def __init__(self):
        from PySide6.QtCore import QTimer

        self.gaps: list[float] = []  # CPU seconds of the GUI thread between ticks
        self.ticks = 0
        self._last = time.thread_time()
        self._timer = QTimer(interval=2)
        self._timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.thread_time()  # the GUI thread's: the timer fires on it
        self.gaps.append(now - self._last)
        self._last = now
        self.ticks += 1

    def start(self) -> None:
        self._last = time.thread_time()
        self._timer.start()

    def stop(self) -> float:
        """Stop, and return the worst gap in CPU seconds (the first tick's wait for the timer is left out)."""
        self._timer.stop()
        return max(self.gaps[1:])


class WhereItRan:
    """Wraps a function that may wait or work hard: the threads each call ran on, and (given a probe) how many times
    the GUI thread's event loop turned while the call was under way."""

    def __init__(self, function, probe: StallProbe | None = None):
        self.function, self.probe = function, probe
        self.threads: list[int] = []
        self.ticks_during: list[int] = []

    def __call__(self, *args, **kwargs):
        self.threads.append(threading.get_ident())
        before = self.probe.ticks if self.probe else 0
        try:
            return self.function(*args, **kwargs)
        finally:
            self.ticks_during.append((self.probe.ticks if self.probe else 0) - before)

    @property
    def on_gui_thread(self) -> bool:
        return threading.main_thread().ident in self.threads


def menu_actions(window) -> list[tuple[str, object]]:
    """(menu path, action) of every item in the window's menu bar, submenus included."""
    found = []

    def walk(menu: QMenu, path: str) -> None:
        for action in menu.actions():
            if action.isSeparator():
                continue
            label = f"{path} → {action.text().replace('&', '')}"
            if action.menu() is not None:
                walk(action.menu(), label)
            else:
                found.append((label, action))

    for top in window.menuBar().actions():
        walk(top.menu(), top.text().replace("&", ""))
    return found


def menu_action(window, text: str):
    for top in window.menuBar().actions():
        for action in top.menu().actions():
            if action.text().replace("&", "") == text:
                return action
    raise AssertionError(f"no menu item {text!r}")


def drop(widget, *paths) -> bool:
    """Drag files onto widget and drop them there, as a file manager does; True if the drop was taken."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    enter = QDragEnterEvent(QPoint(5, 5), *args)
    QApplication.sendEvent(widget, enter)
    event = QDropEvent(QPointF(5, 5), *args)
    QApplication.sendEvent(widget, event)
    return enter.isAccepted() and event.isAccepted()


def highlighted(doc: QTextDocument) -> str:
    """The rendered characters that carry the draft highlight."""
    from app.chat.render import DRAFT_COLOR

    out = []
    for pos in range(doc.characterCount() - 1):
        c = QTextCursor(doc)
        c.setPosition(pos)
        c.setPosition(pos + 1, QTextCursor.MoveMode.KeepAnchor)
        if c.charFormat().background().color() == DRAFT_COLOR:
            out.append(doc.characterAt(pos))
        else:
            out.append("_")
    return "".join(out)


def store_conversation(*messages):
    """A conversation saved before the window opens: (role, content, stats) per message."""
    from app.conversations.store import ConversationStore, Message, default_path

    store = ConversationStore(default_path())
    cid = store.create_conversation("Saved")
    for role, content, stats in messages:
        store.add_message(cid, Message(None, role, content, stats=stats))
    store.close()


def streams(text: str, piece: int = 40):
    """A stand-in for the decoder's generate: the answer's text is fixed (the embedded model will not write it)."""
    from engine.decoding.answer import Delta

    def generate(*_args, **_kwargs):
        for i in range(0, len(text), piece):
            time.sleep(0.002)
            yield Delta(tokens=[], segments=[(text[i : i + piece], False)])

    return generate


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(window, qtbot, **values):
    window.tools.open_server()
    panel = window.tools.server
    panel.port.setValue(free_port())
    for key, value in values.items():
        getattr(panel, key).setText(value) if isinstance(value, str) else getattr(panel, key).setChecked(value)
    with handled_on_gui(qtbot, window.engine.worker.serverStarted, 60_000):
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    return panel
