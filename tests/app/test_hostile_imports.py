"""Issue 63: imports read safely, off the GUI thread, and closing is immediate, through the real window.

Before: File → Import conversation… read the file on the GUI thread with read_bytes, so a FIFO hung the window for
ever (its size said 0), /dev/zero or a chat.json linked to it ate memory until MemoryError or the OOM killer, and a
crafted chat froze the window while it was parsed and stored. Closing waited on the engine's thread (a model mid-load
held it 5-9 s) and on the token counter. Now the file goes through engine.safe_files on the import thread, and the
window asks its threads to stop and closes; the app's exit waits for them, with the window gone.

These tests assert where work ran and what was opened, never how long anything took."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFileDialog

from app.conversations import importing

from support.fifo_trap import FifoTrap
from support.window import menu_action

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="FIFOs and /dev/zero as Linux has them")
ROOT = Path(__file__).resolve().parents[2]


def import_from_the_menu(window, monkeypatch, path: Path) -> None:
    """File → Import conversation…, choosing path in its file dialog (modal, so stood in for)."""
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(path), "")))
    menu_action(window, "Import conversation…").trigger()  # returns once the import is done; the window lives on


def import_notice(window) -> str:
    return next((t for t in window.notices.texts() if "imported" in t or "could not" in t), "")


def where_imports_run(monkeypatch) -> dict[str, list[str]]:
    """The names of the threads that read and stored each import."""
    ran: dict[str, list[str]] = {"read": [], "store": []}

    def recorded(kind, real):
        def call(*args, **kwargs):
            ran[kind].append(threading.current_thread().name)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(importing, "read_conversation_file", recorded("read", importing.read_conversation_file))
    monkeypatch.setattr(importing, "add_conversation", recorded("store", importing.add_conversation))
    return ran


@contextmanager
def memory_bound(extra: int = 1 << 30):
    """The process may take at most `extra` more memory meanwhile, so a read to the end of /dev/zero fails at once
    with MemoryError instead of eating the machine's (as test_attachment_reads.memory_bound; importing that module
    picks tests/engine's conftest when both folders run together)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    data = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmData:")
    )
    limit = data + extra
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def big_conversation(path: Path, messages: int, chars: int) -> Path:
    """A valid export of `messages` turns of `chars` characters each, as a crafted file would be."""
    turns = [
        {
            "id": n,
            "parent": n - 1 if n > 1 else None,
            "role": "user" if n % 2 else "assistant",
            "content": f"{n} " + "lorem ipsum " * (chars // 12),
        }
        for n in range(1, messages + 1)
    ]
    path.write_text(
        json.dumps({"format": "specchat-conversation", "version": 1, "title": "Long chat", "messages": turns}),
        encoding="utf-8",
    )
    return path


@linux_only
def test_a_fifo_is_refused_at_once_and_never_opened(make_window, qtbot, dirs, quick_settings, monkeypatch):
    window = make_window(quick_settings)
    before = [c.id for c in window.store.conversations()]
    ran = where_imports_run(monkeypatch)
    with FifoTrap(dirs / "chat.json") as fifo:
        import_from_the_menu(window, monkeypatch, fifo.path)
        assert fifo.opened == 0  # refused by its type: nothing could wait for a writer
    refusal = import_notice(window)
    assert refusal.startswith("chat.json is a named pipe (FIFO), not a regular file"), refusal
    assert "nothing was imported" in refusal
    assert ran["read"] == ["conversation-import"] and ran["store"] == []  # read on the import thread
    assert [c.id for c in window.store.conversations()] == before
    window.input.setPlainText("still here")  # the window goes on as before
    assert window.input.toPlainText() == "still here" and not window.session.busy


@linux_only
@pytest.mark.parametrize("linked", [False, True], ids=["dev-zero", "a-link-to-dev-zero"])
def test_dev_zero_is_refused_without_being_read(make_window, qtbot, dirs, quick_settings, monkeypatch, linked):
    path = Path("/dev/zero")
    if linked:
        path = dirs / "chat.json"
        path.symlink_to("/dev/zero")
    window = make_window(quick_settings)
    before = [c.id for c in window.store.conversations()]
    with memory_bound():  # a read to the end of /dev/zero fails at once here, instead of eating memory
        import_from_the_menu(window, monkeypatch, path)
    label = "chat.json (a link to /dev/zero)" if linked else "zero"
    assert import_notice(window).startswith(f"{label} is a device, not a regular file")
    assert [c.id for c in window.store.conversations()] == before


def test_a_folder_is_refused_with_what_it_is(make_window, qtbot, dirs, quick_settings, monkeypatch):
    (dirs / "exports.json").mkdir()
    window = make_window(quick_settings)
    import_from_the_menu(window, monkeypatch, dirs / "exports.json")
    assert import_notice(window) == "exports.json is a folder, not a conversation file, so nothing was imported."


def test_a_large_import_is_read_checked_and_stored_off_the_gui_thread(
    make_window, qtbot, dirs, quick_settings, monkeypatch
):
    path = big_conversation(dirs / "long.json", messages=2000, chars=2400)  # ~5 MB, as the crafted one in the issue
    assert path.stat().st_size > 4_800_000
    window = make_window(quick_settings)
    ran = where_imports_run(monkeypatch)
    import_from_the_menu(window, monkeypatch, path)
    assert ran == {"read": ["conversation-import"], "store": ["conversation-import"]}
    assert threading.current_thread() is threading.main_thread()  # (the test itself runs on the GUI thread)
    cid = window.session.conversation_id
    assert window.store.conversation(cid).title == "Long chat (imported)"  # shown once done
    assert window.panel.current_id() == cid
    assert len(window.store.tree(cid).messages) == 2000
    assert import_notice(window) == ""


def test_a_second_import_meanwhile_is_refused_with_a_word(make_window, qtbot, dirs, quick_settings, monkeypatch):
    path = big_conversation(dirs / "short.json", messages=2, chars=20)
    window = make_window(quick_settings)
    entered, release = threading.Event(), threading.Event()
    real = importing.read_conversation_file

    def held(p):  # the first file is still being read on the import thread
        entered.set()
        release.wait()
        return real(p)

    monkeypatch.setattr(importing, "read_conversation_file", held)
    results = []

    def second() -> None:  # runs on the GUI thread meanwhile: the window is live while the first is imported
        if not entered.is_set():
            QTimer.singleShot(5, second)
            return
        results.append(("second", window.files.import_conversation(path)))
        release.set()

    QTimer.singleShot(0, second)
    results.append(("first", window.files.import_conversation(path)))
    assert results[0] == ("second", None)
    assert any("short.json is still being imported" in t for t in window.notices.texts())
    assert results[1] == ("first", window.session.conversation_id)


def test_closing_during_an_import_ends_its_wait_and_imports_nothing(
    make_window, qtbot, dirs, quick_settings, monkeypatch
):
    """Closed while the file is still read: the import's wait ends with the window, and nothing half-done is kept
    (no one is left to ask about its settings); the import thread finishes its read on its own."""
    from app.conversations.store import ConversationStore

    path = big_conversation(dirs / "late.json", messages=4, chars=20)
    window = make_window(quick_settings)
    store_path, before = window.store.path, [c.id for c in window.store.conversations()]
    entered, release, read = threading.Event(), threading.Event(), threading.Event()
    real_read = importing.read_conversation_file

    def held(p):
        entered.set()
        release.wait()
        try:
            return real_read(p)
        finally:
            read.set()

    monkeypatch.setattr(importing, "read_conversation_file", held)

    def close_meanwhile() -> None:
        if not entered.is_set():
            QTimer.singleShot(5, close_meanwhile)
            return
        window.close()
        release.set()

    QTimer.singleShot(0, close_meanwhile)
    assert window.files.import_conversation(path) is None  # the window closed first: its wait ended with it
    assert not window.isVisible()
    qtbot.waitUntil(read.is_set, timeout=60_000)
    qtbot.wait(50)  # its answer, queued to the GUI thread, is dropped there
    again = ConversationStore(store_path)
    try:
        assert [c.id for c in again.conversations()] == before
    finally:
        again.close()


def test_closing_does_not_wait_for_a_model_still_loading(make_window, qtbot, quick_settings, monkeypatch):
    import app.worker as worker_module

    entered, release = threading.Event(), threading.Event()
    real = worker_module.load_target

    def held(settings, *args, **kwargs):  # a model mid-load: llama.cpp cannot be interrupted there
        entered.set()
        release.wait()
        return real(settings, *args, **kwargs)

    monkeypatch.setattr(worker_module, "load_target", held)
    window = make_window(quick_settings, wait_loaded=False)
    qtbot.waitUntil(entered.is_set, timeout=60_000)
    thread = window.engine.thread
    try:
        assert window.close()
        assert not window.isVisible() and thread.isRunning()  # closed while the engine was still loading
        assert window.engine.worker.closing.is_set()  # asked to stop: it does once the load is done
    finally:
        release.set()
    qtbot.waitUntil(thread.isFinished, timeout=120_000)  # the load ends on its own, then the thread
    assert window.engine.worker.decoder is None  # and it freed what it loaded


CLOSE_WHILE_LOADING = """
import sys, threading
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

qt = QApplication(sys.argv)
import app.worker as worker_module
from app.main_window import MainWindow
from app.conversations.store import open_store
from app.settings.values import AppSettings

entered, release = threading.Event(), threading.Event()
real = worker_module.load_target
def held(settings, *args, **kwargs):
    entered.set()
    release.wait()
    return real(settings, *args, **kwargs)
worker_module.load_target = held

store, notices = open_store()
window = MainWindow(AppSettings(model="embedded", temperature=0.0, max_tokens=8, n_ctx=1024, threads=2), store, notices)
window.show()

def close_when_loading():
    if not entered.is_set():
        return QTimer.singleShot(10, close_when_loading)
    window.close()
    print("closed", window.isVisible(), window.engine.thread.isRunning(), flush=True)
    release.set()  # the load goes on after the window is gone; the exit waits for it
QTimer.singleShot(0, close_when_loading)
code = qt.exec()
print("exited loop", flush=True)
sys.exit(code)
"""


@pytest.mark.slow
def test_the_app_closed_mid_load_exits_cleanly(dirs):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CLOSE_WHILE_LOADING],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert "closed False True" in done.stdout, done.stdout + done.stderr  # gone while the engine still loaded
    assert "exited loop" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
    assert "QThread: Destroyed while thread is still running" not in done.stderr
