"""Model downloads from the Hugging Face hub that survive cancels, cut connections and restarts.

Where models live: ``<data dir>/models/<owner>/<repo>/<filename>`` (engine.paths.data_dir(), so
SPECCHAT_DATA_DIR moves it), a plain folder rather than the hub cache, because
- huggingface_hub 2.x downloads into a temporary file unique to each call and deletes it on any
  failure, so a cancelled or cut 5 GB download would start again from zero;
- people look at, back up and delete these files; cache blobs behind symlinks are hard to read.

How a file arrives (hub_files.py asks the hub, model_folder.py names the files): get_hf_file_metadata asks
the hub (HEAD /{repo}/resolve/{revision}/{file}) for the commit (X-Repo-Commit), size (X-Linked-Size) and sha256 (X-Linked-Etag) of the file. The bytes
go into ``<final>.part`` beside the final name through huggingface_hub's own http_get, which
resumes with a Range request, both after a dropped connection (it retries by itself) and when a
later job (after a cancel, or an app restart) finds the part. ``<final>.part.json`` names the hub
version the part belongs to, so a part of an older upload is never continued with newer bytes.
A file takes its final name only once its size and sha256 (git sha1 for small non-LFS files)
match what the hub reported, and a .gguf only once its header reads as GGUF (a mirror whose ETag is
no content hash can send an error page of the right size); ``<final>.source.json`` then records
where it came from.
HF_ENDPOINT, HF_TOKEN (or a saved `hf auth login`) and HF_HUB_OFFLINE work as in the hub client.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal, cast

from filelock import FileLock, Timeout

from ..errors import ModelFileError
from .gguf_header import GGUF_MAGIC, read_gguf_header
from .hub_files import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadError,
    FileRequest,
    NotEnoughDiskSpace,
    RemoteFile,
    explain_failure,
    http_get,
    hub_endpoint,
    resolve_file,
)
from .model_folder import (
    local_path,
    lock_path,
    models_dir,
    part_info_path,
    part_path,
    read_source_record,
    source_record,
    source_record_path,
    usable_part_size,
    write_json,
)

DISK_HEADROOM_BYTES = 64 * 1024 * 1024  # never fill a disk to the last byte
_PROGRESS_INTERVAL_S = 0.1
_SPEED_WINDOW_S = 5.0
_HASH_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Progress:
    phase: str  # "checking", "downloading", "verifying" or "done"
    file_index: int  # which file of the job
    file_count: int
    filename: str
    file_done: int  # bytes of this file on disk
    file_total: int | None
    done_bytes: int  # whole job
    total_bytes: int | None
    speed_bps: float  # over the last few seconds
    eta_s: float | None

    @property
    def fraction(self) -> float | None:
        return self.done_bytes / self.total_bytes if self.total_bytes else None

    @property
    def eta_text(self) -> str | None:
        """Time left for people: "42 s", "3 min 05 s", "1 h 02 min"."""
        if self.eta_s is None:
            return None
        seconds = int(self.eta_s)
        if seconds < 60:
            return f"{seconds} s"
        if seconds < 3600:
            return f"{seconds // 60} min {seconds % 60:02d} s"
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


ProgressCallback = Callable[[Progress], None]


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def download(repo_id: str, filename: str, revision: str = "main", on_progress: ProgressCallback | None = None) -> Path:
    return DownloadJob([FileRequest(repo_id, filename, revision)], on_progress).run()[0]


class DownloadJob:
    """Downloads several files (a target and its draft) as one job with one progress stream.

    run() blocks; call it from a worker thread. cancel() may be called from any thread.
    """

    def __init__(
        self, files: Sequence[FileRequest], on_progress: ProgressCallback | None = None, root: Path | None = None
    ):
        if not files:
            raise DownloadError("Nothing to download.")
        self.files = list(files)
        self._on_progress = on_progress
        self._root = root
        self._cancelled = threading.Event()
        self._totals: list[int | None] = [None] * len(self.files)
        self._done: list[int] = [0] * len(self.files)
        self._current = 0
        self._phase = "checking"
        self._received: deque[tuple[float, int]] = deque()
        self._received_total = 0
        self._last_emit = 0.0

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def run(self) -> list[Path]:
        paths = [local_path(f.repo_id, f.filename, self._root) for f in self.files]  # refuse before any request
        endpoint = hub_endpoint()
        remotes = []
        for index, (request, path) in enumerate(zip(self.files, paths)):
            self._current = index
            self._emit(force=True)
            remotes.append(resolve_file(request, path, endpoint))
            self._totals[index] = remotes[-1].size
            self._check_cancel()
        todo = [i for i, remote in enumerate(remotes) if not self._installed(i, remote)]
        self._check_disk_space([remotes[i] for i in todo])
        for index in todo:
            self._current = index
            self._fetch(remotes[index])
            self._done[index] = remotes[index].path.stat().st_size
        self._phase = "done"
        self._emit(force=True)
        return [r.path for r in remotes]

    # --- steps --------------------------------------------------------------------------------
    def _installed(self, index: int, remote: RemoteFile) -> bool:
        """Already here in the hub's current version? Then it counts as done."""
        self._current = index
        if self._is_current_version(remote):
            self._done[index] = remote.path.stat().st_size
            return True
        return False

    def _is_current_version(self, remote: RemoteFile) -> bool:
        path = remote.path
        if not path.is_file() or (remote.size is not None and path.stat().st_size != remote.size):
            return False
        record = read_source_record(path)
        if record and record.get("etag") == remote.etag:
            return True
        # A file with the right size but no record (copied in, or the record was lost): check it.
        if _matches_etag(path, remote.etag, self._check_cancel):
            write_json(source_record_path(path), source_record(remote))
            return True
        return False

    def _check_disk_space(self, todo: list[RemoteFile]) -> None:
        needed = sum(max((r.size or 0) - usable_part_size(r), 0) for r in todo)
        if not needed:
            return
        folder = models_dir() if self._root is None else self._root
        free = free_bytes(folder)
        if needed + DISK_HEADROOM_BYTES > free:
            names = ", ".join(r.request.filename for r in todo)
            raise NotEnoughDiskSpace(
                f"Not enough free disk space in {folder} for {names}: {format_bytes(needed)} more is needed "
                f"(plus {format_bytes(DISK_HEADROOM_BYTES)} to spare) and {format_bytes(free)} is free. "
                "Free some space or choose a smaller model, then start again."
            )

    def _fetch(self, remote: RemoteFile) -> None:
        path, part = remote.path, part_path(remote.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_path(path)), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise DownloadError(
                f"{remote.request.filename} is already being downloaded by another SpecChat window or command."
            ) from None
        try:
            resume = usable_part_size(remote)
            if not resume:
                part.unlink(missing_ok=True)
            write_json(part_info_path(path), source_record(remote))
            self._phase = "downloading"
            self._done[self._current] = resume
            self._emit(force=True)
            try:
                with open(part, "r+b" if part.exists() else "w+b") as raw:
                    raw.seek(resume)
                    raw.truncate()
                    http_get(
                        remote.url,
                        cast(BinaryIO, _CountingFile(raw, self)),  # has what http_get uses of a file
                        resume_size=resume,
                        headers=dict(remote.headers),
                        expected_size=remote.size,
                        displayed_filename=remote.request.filename,
                        tqdm_class=_NoBar,
                    )
            except (DownloadCancelled, DownloadError):
                raise
            except Exception as exc:
                if self.cancelled:  # the network gave out while stopping: the cancel is what matters
                    raise DownloadCancelled(
                        f"Download of {remote.request.filename} stopped.{_kept_note(part)}"
                    ) from exc
                raise explain_failure(exc, remote.request, remote.endpoint, _kept_note(part)) from exc
            self._phase = "verifying"
            self._emit(force=True)
            self._verify(remote, part)
            _check_is_gguf(remote, part)
            os.replace(part, path)
            part_info_path(path).unlink(missing_ok=True)
            write_json(source_record_path(path), source_record(remote))
        finally:
            lock.release()
            lock_path(path).unlink(missing_ok=True)

    def _verify(self, remote: RemoteFile, part: Path) -> None:
        size = part.stat().st_size
        if remote.size is not None and size != remote.size:
            raise DownloadError(
                f"{remote.request.filename} is incomplete ({format_bytes(size)} of {format_bytes(remote.size)}); "
                "start the download again to continue."
            )
        expected = _expected_digest(remote.etag, size)
        if expected is None:
            return  # the etag is no content hash (a non-hub mirror): the size check is all there is
        algorithm, want = expected
        got = _file_digest(part, algorithm, size, self._check_cancel)
        if got != want:
            part.unlink(missing_ok=True)
            part_info_path(remote.path).unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{remote.request.filename} arrived damaged ({algorithm} {got[:12]}… where the hub says "
                f"{want[:12]}…). The damaged file was deleted; download it again."
            )

    # --- progress -----------------------------------------------------------------------------
    def _check_cancel(self) -> None:
        if self._cancelled.is_set():
            remote_file = self.files[self._current]
            raise DownloadCancelled(f"Download of {remote_file.filename} stopped; what arrived is kept for resuming.")

    def _file_size_now(self, size: int) -> None:
        grew = size - self._done[self._current]
        self._done[self._current] = size
        if grew > 0:
            now = time.monotonic()
            self._received_total += grew
            self._received.append((now, self._received_total))
            while len(self._received) > 2 and now - self._received[0][0] > _SPEED_WINDOW_S:
                self._received.popleft()
        self._emit()

    def _speed(self, now: float) -> float:
        if len(self._received) < 2 or now - self._received[-1][0] > _SPEED_WINDOW_S:
            return 0.0  # nothing arrived lately (a stall, or verifying)
        (t0, b0), b1 = self._received[0], self._received[-1][1]
        return (b1 - b0) / (now - t0) if now > t0 else 0.0  # up to now, so a stall slows it down

    def _emit(self, force: bool = False) -> None:
        if self._on_progress is None:
            return
        now = time.monotonic()
        if not force and now - self._last_emit < _PROGRESS_INTERVAL_S:
            return
        self._last_emit = now
        known = all(t is not None for t in self._totals)
        total = sum(t or 0 for t in self._totals) if known else None
        done = sum(self._done)
        speed = self._speed(now)
        eta = (total - done) / speed if total is not None and speed > 0 else None
        self._on_progress(
            Progress(
                phase=self._phase,
                file_index=self._current,
                file_count=len(self.files),
                filename=self.files[self._current].filename,
                file_done=self._done[self._current],
                file_total=self._totals[self._current],
                done_bytes=done,
                total_bytes=total,
                speed_bps=speed,
                eta_s=eta,
            )
        )


def _check_is_gguf(remote: RemoteFile, part: Path) -> None:
    """Refuse a .gguf that is something else: where the etag is no content hash, an error page of
    the advertised size passes every other check."""
    if not remote.request.filename.lower().endswith(".gguf"):
        return
    try:
        read_gguf_header(part)
        return
    except ModelFileError as exc:
        problem = exc
    with open(part, "rb") as f:
        start = f.read(len(GGUF_MAGIC))
    # Not a piece of the real file, so nothing worth resuming: remove it with the note that names its version.
    part.unlink(missing_ok=True)
    part_info_path(remote.path).unlink(missing_ok=True)
    name = f"{remote.request.filename} from {remote.endpoint}"
    if start != GGUF_MAGIC:
        raise DownloadError(
            f"{name} is not a GGUF model (it starts with {start!r}): the server sent something "
            "else, perhaps an error page. Nothing was installed."
        )
    reason = str(problem).replace(part.name, remote.request.filename).rstrip(".")  # name the file people asked for
    raise DownloadError(f"{name} is not a usable GGUF model ({reason}). Nothing was installed.")


class _CountingFile:
    """The file http_get writes into: reports its size after each write and stops on cancel."""

    def __init__(self, raw: BinaryIO, job: DownloadJob):
        self._raw = raw
        self._job = job

    def write(self, data: bytes) -> int:
        self._job._check_cancel()
        written = self._raw.write(data)
        self._job._file_size_now(self._raw.tell())
        return written

    def tell(self) -> int:
        return self._raw.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        # http_get starts over when a server ignores the Range header.
        new_size = self._raw.truncate(size)
        self._job._file_size_now(new_size)
        return new_size


class _NoBar:
    """Stands in for tqdm: progress comes from the bytes on disk, not from a console bar."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        return False

    def update(self, n: int = 1) -> None:
        pass


def _expected_digest(etag: str, size: int) -> tuple[str, str] | None:
    """The hub's etag is the sha256 of LFS files and the git blob sha1 of small ones."""
    etag = etag.lower()
    if re.fullmatch(r"[0-9a-f]{64}", etag):
        return "sha256", etag
    if re.fullmatch(r"[0-9a-f]{40}", etag):
        return "git-sha1", etag
    return None


def _matches_etag(path: Path, etag: str, check_cancel: Callable[[], None]) -> bool:
    size = path.stat().st_size
    expected = _expected_digest(etag, size)
    return expected is not None and _file_digest(path, expected[0], size, check_cancel) == expected[1]


def _file_digest(path: Path, algorithm: str, size: int, check_cancel: Callable[[], None]) -> str:
    if algorithm == "git-sha1":
        digest = hashlib.sha1(f"blob {size}\0".encode())
    else:
        digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            check_cancel()
            digest.update(block)
    return digest.hexdigest()


def _kept_note(part: Path | None) -> str:
    """What survives a failed download, said at the end of the error message."""
    if part is None:
        return ""
    size = part.stat().st_size if part.is_file() else 0
    if not size:
        return " Nothing had arrived yet."
    return f" The {format_bytes(size)} that arrived are kept: start the download again to resume."


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
