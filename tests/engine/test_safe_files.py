"""engine.safe_files: only regular files are read, never past their limit, and a refusal says what the path is.

A FIFO is refused before it is opened (a read would wait for a writer for ever), and one swapped in after the check
is opened without waiting and refused by the opened descriptor's type; /dev/zero, and a link to it, are refused as
devices; a folder is named a folder; a file over its limit is refused by its size, and one that grows past it, or
says 0 (/proc), is refused while it is read."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from engine import safe_files
from engine.safe_files import FileRefused, Wording

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="FIFOs, /dev/zero and /proc as Linux has them")


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\xef\xbb\xbfhello\n")
    assert safe_files.read_bytes(path, 100) == b"\xef\xbb\xbfhello\n"
    assert safe_files.read_text(path, 100) == "hello\n"  # the BOM dropped
    assert safe_files.read_bytes(path, len(b"\xef\xbb\xbfhello\n")) == b"\xef\xbb\xbfhello\n"  # at the limit: read


def test_a_link_is_resolved_and_named(tmp_path):
    (tmp_path / "real.txt").write_text("inside")
    (tmp_path / "alias.txt").symlink_to("real.txt")
    target = safe_files.resolve(tmp_path / "alias.txt")
    assert target.real == (tmp_path / "real.txt").resolve()
    assert target.label == f"alias.txt (a link to {target.real})"
    assert safe_files.read_text(tmp_path / "alias.txt", 100) == "inside"


@linux_only
def test_a_fifo_is_refused_without_being_opened(tmp_path, monkeypatch):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    opened = []
    real_open = os.open
    monkeypatch.setattr(safe_files.os, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    with pytest.raises(FileRefused) as refused:
        safe_files.read_bytes(fifo, 1 << 20)
    assert str(refused.value).startswith("pipe.json is a named pipe (FIFO), not a regular file")
    assert refused.value.reason == safe_files.SPECIAL and opened == []


@linux_only
def test_a_fifo_swapped_in_after_the_check_is_opened_without_waiting_and_refused(tmp_path, monkeypatch):
    """The path passed its stat as a regular file, then became a FIFO: O_NONBLOCK opens it at once (no writer is
    waited for), and the opened descriptor's fstat refuses it."""
    fifo = tmp_path / "swapped.json"
    os.mkfifo(fifo)
    regular = os.stat(__file__)
    real_stat = os.stat
    monkeypatch.setattr(safe_files.os, "stat", lambda p, *a, **k: regular if Path(p) == fifo else real_stat(p, *a, **k))
    with pytest.raises(FileRefused, match="swapped.json is a named pipe"):
        safe_files.read_bytes(fifo, 1 << 20)


@linux_only
@pytest.mark.parametrize("linked", [False, True])
def test_dev_zero_and_a_link_to_it_are_refused_as_devices(tmp_path, linked):
    path = Path("/dev/zero")
    if linked:
        path = tmp_path / "chat.json"
        path.symlink_to("/dev/zero")
    with pytest.raises(FileRefused) as refused:
        safe_files.read_bytes(path, 1 << 20)
    label = "chat.json (a link to /dev/zero)" if linked else "zero"
    assert str(refused.value).startswith(f"{label} is a device, not a regular file")
    assert refused.value.reason == safe_files.SPECIAL


def test_a_folder_is_named_a_folder(tmp_path):
    with pytest.raises(FileRefused) as refused:
        safe_files.read_bytes(tmp_path, 1 << 20, Wording(folder="{label} is a folder: pick a file in it."))
    assert str(refused.value) == f"{tmp_path.name} is a folder: pick a file in it."
    assert refused.value.reason == safe_files.FOLDER
    with pytest.raises(FileRefused, match="is a folder"), safe_files.open_regular(tmp_path):
        pass


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(FileRefused) as refused:
        safe_files.read_bytes(tmp_path / "gone.json", 10)
    assert str(refused.value) == "gone.json could not be read: No such file or directory."
    assert refused.value.reason == safe_files.MISSING


def test_a_file_over_its_limit_is_refused_by_its_size_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.truncate(2_000_001)  # sparse: a size, without writing it
    monkeypatch.setattr(safe_files, "_read_to", lambda *a: pytest.fail("read although its size was over"))
    with pytest.raises(FileRefused) as refused:
        safe_files.read_bytes(path, 2_000_000)
    assert str(refused.value) == ("big.bin is 2.0 MB (2,000,001 bytes): too large to read (at most 2,000,000 bytes).")
    assert refused.value.reason == safe_files.TOO_LARGE


def test_a_file_that_grows_past_its_limit_while_read_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "growing.log"
    path.write_bytes(b"x" * 100)
    real_open = safe_files._open_checked

    def checked_then_grown(*args):
        fd = real_open(*args)  # checked at 100 bytes: within the limit
        with open(path, "ab") as f:
            f.write(b"y" * (3 * safe_files.READ_CHUNK))  # then it grows
        return fd

    monkeypatch.setattr(safe_files, "_open_checked", checked_then_grown)
    with pytest.raises(FileRefused) as refused:
        safe_files.read_bytes(path, 1000)
    assert str(refused.value).startswith("growing.log is over 1,000 bytes (more than its size said)")


@linux_only
def test_a_proc_file_that_says_zero_is_read_only_to_its_limit():
    assert os.stat("/proc/self/status").st_size == 0
    assert b"VmData" in safe_files.read_bytes("/proc/self/status", 1 << 20)  # within the limit: read
    with pytest.raises(FileRefused, match="more than its size said"):
        safe_files.read_bytes("/proc/self/status", 16)


@linux_only
def test_open_regular_hands_a_checked_file_and_refuses_the_rest(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 20)
    with safe_files.open_regular(path) as (f, target):
        assert f.read(4) == b"GGUF" and target.label == "model.gguf"
    assert f.closed
    with pytest.raises(FileRefused, match="is a device"), safe_files.open_regular("/dev/zero"):
        pass


def test_text_that_is_not_utf8_is_refused():
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(b"ok \xff\xfe")
        f.flush()
        with pytest.raises(FileRefused, match=r"it is not UTF-8 text \(byte 3 cannot be read\)"):
            safe_files.read_text(f.name, 100)
