"""Reading a file that a person or another file names: regular files only, never past a size limit.

Every path the app is given (an attachment, a conversation to import, a model, a prompts file) comes here, because
what a path names is not always a file: a FIFO blocks a read until some writer comes (the window hung), /dev/zero
never ends (the process ate memory until the OOM killer came), a folder cannot be read at all. So:

- a link is resolved first, and what it leads to is checked and read (the message names both);
- anything that is not a regular file is refused before it is opened, with a message that says what it is;
- the open itself cannot wait (O_NONBLOCK: a path swapped for a FIFO after the check opens at once) and takes
  no terminal (O_NOCTTY); the opened descriptor is checked again, so what is read is what was checked;
- the size is checked before reading and ENFORCED WHILE READING: a file may grow, and /proc files say 0.

FileRefused says why, for a person; Wording lets each use end its sentences in its own words.
No Qt here: app/ and engine/ both read through this module.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

READ_CHUNK = 64 << 10  # a fixed read size: some kernel files (/proc/self/pagemap) refuse reads of odd lengths
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a disk device"),
    (stat.S_ISSOCK, "a socket"),
)

# Why a file was refused (FileRefused.reason): callers that must say something of their own match on it.
MISSING, UNREADABLE, FOLDER, SPECIAL, TOO_LARGE = "missing", "unreadable", "folder", "special", "too large"


class FileRefused(Exception):
    """A file that was not read; str() says why, for a person. reason is one of the names above."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Wording:
    """The sentences of a refusal, as str.format templates. Fields: label (the name, and where a link leads),
    kind (what a special file is), size (e.g. "8.4 MB"), bytes (its size), limit (bytes), limit_mb, mb."""

    folder: str = "{label} is a folder, not a file."
    special: str = (
        "{label} is {kind}, not a regular file, so it was not read (it could wait for ever or never "
        "end). Only regular files can be read."
    )
    too_large: str = "{label} is {size} ({bytes:,} bytes): too large to read (at most {limit:,} bytes)."
    grew: str = (
        "{label} is over {limit:,} bytes (more than its size said): too large to read (at most {limit:,} bytes)."
    )
    unreadable: str = "{label} could not be read: {why}."


READING = Wording()


@dataclass(frozen=True)
class Target:
    """A path with its links resolved: real is what is checked and read, label what messages call it."""

    path: Path
    real: Path
    label: str


def human_size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1_000_000:.1f} MB"


def resolve(path: str | os.PathLike, wording: Wording = READING) -> Target:
    """path with every link resolved; FileRefused if it leads nowhere (missing, a loop, no permission)."""
    path = Path(path)
    try:
        real = path.resolve(strict=True)
    except OSError as exc:
        reason = MISSING if isinstance(exc, FileNotFoundError) else UNREADABLE
        raise _refused(wording.unreadable, reason, path.name, why=exc.strerror or exc) from exc
    except RuntimeError as exc:  # a link loop, on Python before 3.13
        raise _refused(wording.unreadable, UNREADABLE, path.name, why=exc) from exc
    label = f"{path.name} (a link to {real})" if path.is_symlink() else path.name
    return Target(path, real, label)


def check(st: os.stat_result, label: str, limit: int | None = None, wording: Wording = READING) -> None:
    """Refuses what is not a regular file, or is over limit bytes by its size."""
    if stat.S_ISDIR(st.st_mode):
        raise _refused(wording.folder, FOLDER, label)
    if not stat.S_ISREG(st.st_mode):
        kind = next((what for test, what in _KINDS if test(st.st_mode)), "a special file")
        raise _refused(wording.special, SPECIAL, label, kind=kind)
    if limit is not None and st.st_size > limit:
        raise _refused(wording.too_large, TOO_LARGE, label, bytes=st.st_size, limit=limit)


@contextmanager
def open_regular(
    path: str | os.PathLike | Target, limit: int | None = None, wording: Wording = READING
) -> Iterator[tuple[BinaryIO, Target]]:
    """(the opened file, its Target), checked as above; for readers that seek or map (the GGUF header)."""
    target = path if isinstance(path, Target) else resolve(path, wording)
    fd = _open_checked(target, limit, wording)
    with io.FileIO(fd, "rb", closefd=True) as f:
        yield f, target


def read_bytes(path: str | os.PathLike | Target, limit: int, wording: Wording = READING) -> bytes:
    """The whole file, at most limit bytes: FileRefused if it is more, whatever its size said."""
    target = path if isinstance(path, Target) else resolve(path, wording)
    fd = _open_checked(target, limit, wording)
    try:
        data = _read_to(fd, limit)
    except OSError as exc:
        raise _refused(wording.unreadable, UNREADABLE, target.label, why=exc.strerror or exc) from exc
    finally:
        os.close(fd)
    if data is None:
        raise _refused(wording.grew, TOO_LARGE, target.label, limit=limit)
    return data


def read_text(path: str | os.PathLike | Target, limit: int, wording: Wording = READING) -> str:
    """read_bytes as UTF-8 text (a BOM dropped); FileRefused if it is not UTF-8."""
    target = path if isinstance(path, Target) else resolve(path, wording)
    data = read_bytes(target, limit, wording)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _refused(
            wording.unreadable, UNREADABLE, target.label, why=f"it is not UTF-8 text (byte {exc.start} cannot be read)"
        ) from exc


def _open_checked(target: Target, limit: int | None, wording: Wording) -> int:
    """A descriptor of target.real, checked before the open (opening a device can act) and after it (the path
    may have changed in between: what is read is what the fstat saw)."""
    try:
        check(os.stat(target.real), target.label, limit, wording)
        fd = os.open(target.real, _FLAGS)
    except OSError as exc:
        raise _refused(wording.unreadable, UNREADABLE, target.label, why=exc.strerror or exc) from exc
    try:
        check(os.fstat(fd), target.label, limit, wording)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_to(fd: int, limit: int) -> bytes | None:
    """Every byte of fd, or None once there are more than limit (read in fixed chunks, one past the limit)."""
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
    return None


def _refused(template: str, reason: str, label: str, **fields) -> FileRefused:
    size = fields.get("bytes")
    limit = fields.get("limit")
    values = {
        "label": label,
        "kind": "",
        "why": "",
        "bytes": 0,
        "limit": 0,
        **fields,
        "size": human_size(size) if size is not None else "",
        "mb": (size or 0) / 2**20,
        "limit_mb": (limit or 0) // 2**20,
    }
    return FileRefused(template.format(**values), reason)
