"""Model downloads from the Hugging Face hub that survive cancels, cut connections and restarts.

Where models live: ``<data dir>/models/<owner>/<repo>/<filename>`` (engine.paths.data_dir(), so
SPECCHAT_DATA_DIR moves it), a plain folder rather than the hub cache, because
- huggingface_hub 2.x downloads into a temporary file unique to each call and deletes it on any
  failure, so a cancelled or cut 5 GB download would start again from zero;
- people look at, back up and delete these files; cache blobs behind symlinks are hard to read.

How a file arrives: get_hf_file_metadata asks the hub (HEAD /{repo}/resolve/{revision}/{file}) for
the commit (X-Repo-Commit), size (X-Linked-Size) and sha256 (X-Linked-Etag) of the file. The bytes
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

import errno
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from filelock import FileLock, Timeout


def _endpoint_problem(endpoint: str) -> str | None:
    """Why an endpoint cannot be a hub address, or None if it can."""
    try:
        parts = urlsplit(endpoint)
        _ = parts.port  # raises for a port that is not a number from 0 to 65535
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "it does not start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    return None


# huggingface_hub reads HF_ENDPOINT once, into its constants, and parses it there: some malformed
# values ("http://[::1") raise as it is imported, which would stop the app from even starting. Its
# constants are imported without such a value; DownloadJob.run() then says what is wrong with it.
_endpoint_at_import = os.environ.get("HF_ENDPOINT")
if _endpoint_at_import and _endpoint_problem(_endpoint_at_import):
    del os.environ["HF_ENDPOINT"]
    try:
        from huggingface_hub import constants as hub_constants
    finally:
        os.environ["HF_ENDPOINT"] = _endpoint_at_import

from huggingface_hub import constants as hub_constants  # noqa: E402 - after the guard above
from huggingface_hub import get_hf_file_metadata, hf_hub_url  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get  # noqa: E402
from huggingface_hub.utils import build_hf_headers, validate_repo_id  # noqa: E402

from ..errors import EngineError, ModelFileError  # noqa: E402
from ..paths import data_dir, write_text_atomic  # noqa: E402
from .gguf_header import GGUF_MAGIC, read_gguf_header  # noqa: E402

try:  # huggingface_hub 2.x ships its HTTP client as httpx2
    import httpx2 as _http
except ImportError:  # pragma: no cover - older huggingface_hub
    import httpx as _http


# huggingface_hub hands over 10 MiB at a time; smaller pieces give steady progress on slow links
# and let a cancel take effect within a fraction of a second.
_CHUNK_BYTES = 256 * 1024
hub_constants.DOWNLOAD_CHUNK_SIZE = min(hub_constants.DOWNLOAD_CHUNK_SIZE, _CHUNK_BYTES)

DISK_HEADROOM_BYTES = 64 * 1024 * 1024  # never fill a disk to the last byte
_PROGRESS_INTERVAL_S = 0.1
_SPEED_WINDOW_S = 5.0
_HASH_BLOCK = 4 * 1024 * 1024


class DownloadError(EngineError):
    """A download could not finish; the message says why and what was kept."""


class DownloadCancelled(EngineError):
    """The download was stopped on request; what arrived is kept for resuming."""


class HubUnreachable(DownloadError):
    """No answer from the hub (offline, DNS, firewall, timeout)."""


class NotEnoughDiskSpace(DownloadError):
    pass


class ChecksumMismatch(DownloadError):
    pass


class UnsafePathError(DownloadError):
    """A repo id or file name that would land outside the models folder."""


@dataclass(frozen=True)
class FileRequest:
    repo_id: str
    filename: str
    revision: str = "main"

    @property
    def label(self) -> str:
        return f"{self.repo_id}/{self.filename}"


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


def models_dir() -> Path:
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def local_path(repo_id: str, filename: str, root: Path | None = None) -> Path:
    """Where a repo file lives once downloaded; refuses names that would escape the models folder."""
    _check_repo_id(repo_id)
    parts = _safe_parts(repo_id, filename)
    root = (root or models_dir()).resolve()
    path = root.joinpath(*repo_id.split("/"), *parts)
    if not path.resolve().is_relative_to(root):  # a symlinked folder could still point outside
        raise UnsafePathError(f"Refusing {repo_id}/{filename}: it would be written outside {root}.")
    return path


def source_record_path(path: Path) -> Path:
    return path.with_name(path.name + ".source.json")


def read_source_record(path: Path) -> dict | None:
    try:
        record = json.loads(source_record_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def installed_path(request: FileRequest, root: Path | None = None) -> Path | None:
    path = local_path(request.repo_id, request.filename, root)
    return path if path.is_file() else None


def partial_bytes(request: FileRequest, root: Path | None = None) -> int:
    """Bytes already fetched by an unfinished download of this file (0 if none)."""
    part = _part(local_path(request.repo_id, request.filename, root))
    return part.stat().st_size if part.is_file() else 0


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
        endpoint = _hub_endpoint()
        remotes = []
        for index, (request, path) in enumerate(zip(self.files, paths)):
            self._current = index
            self._emit(force=True)
            remotes.append(_resolve(request, path, endpoint))
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
    def _installed(self, index: int, remote: _Remote) -> bool:
        """Already here in the hub's current version? Then it counts as done."""
        self._current = index
        if self._is_current_version(remote):
            self._done[index] = remote.path.stat().st_size
            return True
        return False

    def _is_current_version(self, remote: _Remote) -> bool:
        path = remote.path
        if not path.is_file() or (remote.size is not None and path.stat().st_size != remote.size):
            return False
        record = read_source_record(path)
        if record and record.get("etag") == remote.etag:
            return True
        # A file with the right size but no record (copied in, or the record was lost): check it.
        if _matches_etag(path, remote.etag, self._check_cancel):
            _write_json(source_record_path(path), _record(remote))
            return True
        return False

    def _check_disk_space(self, todo: list[_Remote]) -> None:
        needed = sum(max((r.size or 0) - _usable_part_size(r), 0) for r in todo)
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

    def _fetch(self, remote: _Remote) -> None:
        path, part = remote.path, _part(remote.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(_lock(path)), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise DownloadError(
                f"{remote.request.filename} is already being downloaded by another SpecChat window or command."
            ) from None
        try:
            resume = _usable_part_size(remote)
            if not resume:
                part.unlink(missing_ok=True)
            _write_json(_part_info(path), _record(remote))
            self._phase = "downloading"
            self._done[self._current] = resume
            self._emit(force=True)
            try:
                with open(part, "r+b" if part.exists() else "w+b") as raw:
                    raw.seek(resume)
                    raw.truncate()
                    http_get(
                        remote.url,
                        _CountingFile(raw, self),
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
                raise _explain(exc, remote.request, remote.endpoint, part) from exc
            self._phase = "verifying"
            self._emit(force=True)
            self._verify(remote, part)
            _check_is_gguf(remote, part)
            os.replace(part, path)
            _part_info(path).unlink(missing_ok=True)
            _write_json(source_record_path(path), _record(remote))
        finally:
            lock.release()
            _lock(path).unlink(missing_ok=True)

    def _verify(self, remote: _Remote, part: Path) -> None:
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
            _part_info(remote.path).unlink(missing_ok=True)
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


def _check_is_gguf(remote: _Remote, part: Path) -> None:
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
    _part_info(remote.path).unlink(missing_ok=True)
    name = f"{remote.request.filename} from {remote.endpoint}"
    if start != GGUF_MAGIC:
        raise DownloadError(
            f"{name} is not a GGUF model (it starts with {start!r}): the server sent something "
            "else, perhaps an error page. Nothing was installed."
        )
    reason = str(problem).replace(part.name, remote.request.filename).rstrip(".")  # name the file people asked for
    raise DownloadError(f"{name} is not a usable GGUF model ({reason}). Nothing was installed.")


@dataclass(frozen=True)
class _Remote:
    request: FileRequest
    path: Path
    endpoint: str
    url: str  # where the bytes come from (a CDN for LFS files)
    headers: dict
    commit: str
    etag: str
    size: int | None


def _resolve(request: FileRequest, path: Path, endpoint: str) -> _Remote:
    """Ask the hub which version of the file to fetch, how big it is and its checksum."""
    url = hf_hub_url(request.repo_id, request.filename, revision=request.revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint)
        headers = build_hf_headers()
    except Exception as exc:
        raise _explain(exc, request, endpoint) from exc
    if not meta.commit_hash or not meta.etag:
        raise DownloadError(
            f"{endpoint} did not answer like a Hugging Face hub for {request.label} (no commit or ETag header). "
            "If HF_ENDPOINT is set, check that it points to a hub or a hub mirror."
        )
    download_url = url
    if meta.xet_file_data is None and meta.location and meta.location != url:
        download_url = meta.location  # LFS files come from a CDN the hub redirects to
    if _origin(download_url) != _origin(url):
        headers.pop("authorization", None)  # the token is for the hub, not for the CDN
    return _Remote(
        request=request,
        path=path,
        endpoint=endpoint,
        url=download_url,
        headers=headers,
        commit=meta.commit_hash,
        etag=meta.etag,
        size=meta.size,
    )


def _hub_endpoint() -> str:
    """The hub to ask: HF_ENDPOINT if set (read now, so a change applies to the next job)."""
    endpoint = os.environ.get("HF_ENDPOINT")
    if not endpoint:
        return hub_constants.ENDPOINT.rstrip("/")
    problem = _endpoint_problem(endpoint)
    if problem:
        raise DownloadError(
            f"HF_ENDPOINT is set to {endpoint!r}, which is not a usable hub address ({problem}). It should be the "
            "address of the Hugging Face hub or of a mirror, such as https://huggingface.co or "
            "http://127.0.0.1:8080; unset it to download from huggingface.co."
        )
    return endpoint.rstrip("/")


def _explain(exc: Exception, request: FileRequest, endpoint: str, part: Path | None = None) -> DownloadError:
    """A message a person can act on, for what the hub client raised."""
    name = request.label
    kept = _kept_note(part)
    if isinstance(exc, GatedRepoError):
        return DownloadError(
            f"{request.repo_id} is gated: accept its terms on the model page at huggingface.co, "
            "then set HF_TOKEN (or run `hf auth login`) and try again."
        )
    if isinstance(exc, RepositoryNotFoundError):
        return DownloadError(
            f"Repository {request.repo_id} was not found on {endpoint} "
            "(or it is private: set HF_TOKEN to a token that can read it)."
        )
    if isinstance(exc, RevisionNotFoundError):
        return DownloadError(f"Revision {request.revision!r} does not exist in {request.repo_id}.")
    if isinstance(exc, RemoteEntryNotFoundError):
        return DownloadError(f"{request.filename} is not in {request.repo_id} at revision {request.revision!r}.")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "an error"
        return DownloadError(
            f"{endpoint} answered HTTP {status} for {name}; the hub may be busy, try again later.{kept}"
        )
    if isinstance(exc, OfflineModeIsEnabled):
        return HubUnreachable("Downloads are off because HF_HUB_OFFLINE is set.")
    if isinstance(exc, _http.ConnectError):
        return HubUnreachable(
            f"Cannot reach {endpoint} ({exc}). Check the network connection"
            f"{' and HF_ENDPOINT' if 'HF_ENDPOINT' in os.environ else ''}.{kept}"
        )
    if isinstance(exc, _http.TimeoutException):
        return HubUnreachable(f"{endpoint} stopped answering while fetching {name}.{kept}")
    if isinstance(exc, (_http.TransportError, _http.StreamError)):
        return DownloadError(f"The connection dropped while downloading {name} ({exc}).{kept}")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DownloadError(f"The disk filled up while downloading {name}; free some space.{kept}")
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return DownloadError(f"The server sent less of {name} than it announced.{kept}")
    if isinstance(exc, OSError):
        return DownloadError(f"Could not write {name}: {exc.strerror or exc}.{kept}")
    if isinstance(exc, ValueError):
        return DownloadError(f"Cannot download {name}: {exc}")
    return DownloadError(f"Downloading {name} failed: {exc}")


class _CountingFile:
    """The file http_get writes into: reports its size after each write and stops on cancel."""

    def __init__(self, raw, job: DownloadJob):
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

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def update(self, n: int = 1) -> None:
        pass


def _check_repo_id(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise UnsafePathError(f"{repo_id!r} is not a valid Hugging Face repo id: {exc}") from None
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise UnsafePathError(f"{repo_id!r} is not a repo id of the form owner/name.")


def _safe_parts(repo_id: str, filename: str) -> list[str]:
    refusal = (
        f"Refusing {filename!r} from {repo_id}: a file name must be a relative path inside the repo "
        "(no '..', no absolute or Windows-style path)."
    )
    if not isinstance(filename, str) or not filename or "\x00" in filename or "\\" in filename:
        raise UnsafePathError(refusal)
    if filename.startswith("/") or re.match(r"^[A-Za-z]:", filename):
        raise UnsafePathError(refusal)
    parts = filename.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(refusal)
    return parts


def _part(path: Path) -> Path:
    return path.with_name(path.name + ".part")


def _part_info(path: Path) -> Path:
    return path.with_name(path.name + ".part.json")


def _lock(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _usable_part_size(remote: _Remote) -> int:
    """Bytes of an earlier attempt that can be continued: same hub version, not past the end."""
    part = _part(remote.path)
    if not part.is_file():
        return 0
    info = {}
    try:
        info = json.loads(_part_info(remote.path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    size = part.stat().st_size
    same_version = isinstance(info, dict) and info.get("etag") == remote.etag and info.get("size") == remote.size
    if not same_version or (remote.size is not None and size > remote.size):
        return 0
    return size


def _record(remote: _Remote) -> dict:
    return {
        "repo_id": remote.request.repo_id,
        "filename": remote.request.filename,
        "revision": remote.request.revision,
        "commit": remote.commit,
        "etag": remote.etag,
        "size": remote.size,
        "endpoint": remote.endpoint,
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _write_json(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))  # a crash leaves the old record or the new one


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


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


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
