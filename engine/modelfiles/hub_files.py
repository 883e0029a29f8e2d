"""A file on the Hugging Face hub, as the downloads (downloads.py), the header reads (remote_gguf.py) and the search
(hub_search.py) ask for it: the request, which version the hub says it is and where its bytes are, the hub's address
(HF_ENDPOINT), and what went wrong in words a person can act on.

This module imports the hub client, and guards that import against a malformed HF_ENDPOINT: import the hub client's
names from here (as downloads.py does http_get), so the guard runs first.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


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
from huggingface_hub.file_download import http_get as http_get  # noqa: E402 - downloads.py's, after the guard
from huggingface_hub.utils import build_hf_headers, validate_repo_id  # noqa: E402

from ..errors import EngineError  # noqa: E402

try:  # huggingface_hub 2.x ships its HTTP client as httpx2
    import httpx2 as _client
except ImportError:  # pragma: no cover - older huggingface_hub
    import httpx as _client  # type: ignore[no-redef]  # the same client under its older name
hub_http = _client  # the hub's HTTP client module (hub_search.py reads its errors too)


# huggingface_hub hands over 10 MiB at a time; smaller pieces give steady progress on slow links
# and let a cancel take effect within a fraction of a second.
_CHUNK_BYTES = 256 * 1024
hub_constants.DOWNLOAD_CHUNK_SIZE = min(hub_constants.DOWNLOAD_CHUNK_SIZE, _CHUNK_BYTES)
# The first time huggingface_hub 2.x builds a request's headers, it fetches a registry of AI coding agents (to name
# one in its User-Agent) from the hub it read from HF_ENDPOINT at import, so from huggingface.co when an endpoint
# argument or an HF_ENDPOINT set later names a mirror, and it can hold that first request for up to 3 s. Its telemetry
# switch leaves that out: the hub is asked only what SpecChat asks, at the address it was given.
hub_constants.HF_HUB_DISABLE_TELEMETRY = True


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
class RemoteFile:
    request: FileRequest
    path: Path
    endpoint: str
    url: str  # where the bytes come from (a CDN for LFS files)
    headers: dict[str, str]
    commit: str
    etag: str
    size: int | None


def resolve_file(request: FileRequest, path: Path, endpoint: str) -> RemoteFile:
    """Ask the hub which version of the file to fetch, how big it is and its checksum."""
    url = hf_hub_url(request.repo_id, request.filename, revision=request.revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint)
        headers = build_hf_headers()
    except Exception as exc:
        raise explain_failure(exc, request, endpoint) from exc
    if not meta.commit_hash or not meta.etag:
        raise DownloadError(
            f"{endpoint} did not answer like a Hugging Face hub for {request.label} (no commit or ETag header). "
            "If HF_ENDPOINT is set, check that it points to a hub or a hub mirror."
        )
    download_url = url
    if meta.xet_file_data is None and meta.location and meta.location != url:
        download_url = meta.location  # LFS files come from a CDN the hub redirects to
    if origin(download_url) != origin(url):
        headers.pop("authorization", None)  # the token is for the hub, not for the CDN
    return RemoteFile(
        request=request,
        path=path,
        endpoint=endpoint,
        url=download_url,
        headers=headers,
        commit=meta.commit_hash,
        etag=meta.etag,
        size=meta.size,
    )


def hub_endpoint() -> str:
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


def explain_failure(exc: Exception, request: FileRequest, endpoint: str, kept: str = "") -> DownloadError:
    """A message a person can act on, for what the hub client raised; kept: what survives, said at the end."""
    name = request.label
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
    if isinstance(exc, hub_http.ConnectError):
        return HubUnreachable(
            f"Cannot reach {endpoint} ({exc}). Check the network connection"
            f"{' and HF_ENDPOINT' if 'HF_ENDPOINT' in os.environ else ''}.{kept}"
        )
    if isinstance(exc, hub_http.TimeoutException):
        return HubUnreachable(f"{endpoint} stopped answering while fetching {name}.{kept}")
    if isinstance(exc, (hub_http.TransportError, hub_http.StreamError)):
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


def check_repo_id(repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise UnsafePathError(f"{repo_id!r} is not a valid Hugging Face repo id: {exc}") from None
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise UnsafePathError(f"{repo_id!r} is not a repo id of the form owner/name.")


def origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc
