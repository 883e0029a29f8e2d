"""What an attached file's path leads to is read safely (issue 51, item 5), through the real window: the paperclip
(its file dialog stood in for) and drops. Links are resolved first; only regular files are read, never on the GUI
thread, and never past the size cap; a FIFO, a device, a file over the cap are refused with a notice that says why.

On the code before, a FIFO was opened on the GUI thread (the window hung until a writer came) and a link to
/dev/zero was read to the end of memory: these tests hold the process's data size (memory_bound) so such a read
fails at once with MemoryError instead of taking the machine's memory."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

if sys.platform != "linux":
    pytest.skip("FIFOs, /dev/zero, /proc and RLIMIT_DATA as Linux has them", allow_module_level=True)

import resource  # noqa: E402 - POSIX only

from PySide6.QtWidgets import QFileDialog, QPlainTextEdit

from app.chat.attachments import MAX_FILE_BYTES

from support.fifo_trap import FifoTrap
from support.window import STALL_LIMIT_S, drop


class SlowFifo(FifoTrap):
    """A FifoTrap whose writer, once a reader has opened the FIFO, waits HOLD_S before writing and closing: a read
    on the GUI thread stalls the window that long (and then ends, so the old code fails instead of hanging)."""

    HOLD_S = 0.5
    PAYLOAD = b"from the pipe\n"


def _data_bytes() -> int:
    """This process's private writable memory (what RLIMIT_DATA counts), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmData in /proc/self/status")


@contextmanager
def memory_bound(extra: int = 1 << 30):
    """Lets the process take at most `extra` more private memory meanwhile (an unbounded read then fails with
    MemoryError), and yields a function giving how much its peak resident size has grown since."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _data_bytes() + extra
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    try:
        yield lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def choose(monkeypatch, window, *paths) -> None:
    """Click the paperclip and pick paths in its file dialog (modal, so stood in for: see README)."""
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(p) for p in paths], ""))
    window.attach_button.click()


def notice(qtbot, window, words: str, timeout: int = 10_000) -> str:
    """The window's notice that says words, once it is shown."""
    qtbot.waitUntil(lambda: any(words in t for t in window.notices.texts()), timeout=timeout)
    return next(t for t in window.notices.texts() if words in t)


def test_a_fifo_from_the_paperclip_is_refused_unopened_and_the_window_never_stalls(
    make_window, qtbot, dirs, quick_settings, monkeypatch, stall_probe
):
    window = make_window(quick_settings)
    with SlowFifo(dirs / "pipe.txt") as fifo:
        stall_probe.start()
        qtbot.wait(50)  # ticking before the click: the probe leaves its first gap out
        choose(monkeypatch, window, fifo.path)
        qtbot.wait(300)  # the window goes on ticking meanwhile
        stall = stall_probe.stop()
        assert stall < STALL_LIMIT_S, f"the GUI thread worked {stall * 1000:.0f} ms in one go"
        refusal = notice(qtbot, window, "pipe.txt is a named pipe")
        assert "not a regular file" in refusal and "Only regular files can be attached" in refusal
        assert fifo.opened == 0  # refused by its type: never opened, so nothing could wait on a writer
    assert window.tray.attachments == [] and window.tray.pending == 0


def test_a_link_to_dev_zero_dropped_on_the_window_is_refused_without_reading_it(
    make_window, qtbot, dirs, quick_settings
):
    zeros = dirs / "zeros.txt"
    zeros.symlink_to("/dev/zero")
    window = make_window(quick_settings)
    with memory_bound() as grown:
        assert drop(window.input.viewport(), zeros)  # on the message box
        refusal = notice(qtbot, window, "zeros.txt (a link to /dev/zero) is a device")
        assert grown() < 64 << 20
    assert "not a regular file" in refusal
    assert window.tray.attachments == [] and window.tray.pending == 0


def test_files_over_the_cap_are_refused_with_their_size_even_when_their_size_says_less(
    make_window, qtbot, dirs, quick_settings, monkeypatch
):
    huge = dirs / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: its size says one byte over, without writing it
    pages = dirs / "pages.log"
    pages.symlink_to("/proc/self/pagemap")  # a regular file whose size says 0, yet gigabytes long
    window = make_window(quick_settings)
    with memory_bound() as grown:
        assert drop(window, pages)  # anywhere on the window
        refusal = notice(qtbot, window, "pages.log (a link to /proc/")
        assert f"is over {MAX_FILE_BYTES:,} bytes" in refusal, refusal  # read to the cap, then refused
        choose(monkeypatch, window, huge)
        refusal = notice(qtbot, window, "huge.txt is 8.4 MB")
        assert f"({MAX_FILE_BYTES + 1:,} bytes): too large" in refusal and f"at most {MAX_FILE_BYTES:,}" in refusal
        assert grown() < 64 << 20
    assert window.tray.attachments == [] and window.tray.pending == 0


def test_a_text_file_and_a_link_to_one_are_attached_and_sent_as_before(
    make_window, qtbot, dirs, quick_settings, monkeypatch
):
    notes = dirs / "notes.md"
    notes.write_text("# Notes\r\n\r\n- one\r\n- two\r\n", encoding="utf-8")
    (dirs / "real").mkdir()
    (dirs / "real" / "todo.txt").write_text("buy milk\n", encoding="utf-8")
    (dirs / "hop.txt").symlink_to(dirs / "real" / "todo.txt")
    alias = dirs / "todo.txt"
    alias.symlink_to("hop.txt")  # a relative link to a link: resolved to the end
    window = make_window(quick_settings)
    choose(monkeypatch, window, notes, alias)
    assert window.tray.pending == 2 and window.tray.attachments == []  # being read: nothing shown yet
    window.input.setPlainText("Sort these.")
    window.send_message()  # the message waits for its files
    assert window.session.model.items == [] and "still being checked" in window.statusBar().currentMessage()
    qtbot.waitUntil(lambda: len(window.tray.attachments) == 2 and window.tray.pending == 0, timeout=30_000)
    assert [a.name for a in window.tray.attachments] == ["notes.md", "todo.txt"]  # in order, as chosen
    window.tray.chips[1].view_button.click()  # view it (from the message, not the disk)
    assert window.tray.chips[1].dialog.findChild(QPlainTextEdit).toPlainText() == "buy milk\n"
    window.tray.chips[1].dialog.close()

    window.send_message()
    sent = window.session.model.items[0].content
    assert sent == (
        "Sort these.\n\nFile: notes.md\n```md\n# Notes\n\n- one\n- two\n```\n\nFile: todo.txt\n```txt\nbuy milk\n```"
    )
    assert not [t for t in window.notices.texts() if "could not" in t or "not a regular" in t]
