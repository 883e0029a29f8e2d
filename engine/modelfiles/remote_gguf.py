"""Reads the header of a GGUF file on the Hugging Face hub without downloading the file.

The hub is asked where the file lives (a HEAD, as the hub client does: it follows the hub's 302 to
its CDN and names the repo's problems: gated, missing, ...); then HTTP range requests (closed
ranges, bytes=A-B) fetch the first 256 KiB and, while the parser asks for more, geometrically more,
never past max_header_bytes. A vocabulary of 150k tokens sits in the first few MB of a file of GBs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from huggingface_hub import get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import build_hf_headers, get_session

from ..errors import EngineError, ModelFileError
from .downloads import format_bytes
from .gguf_header import TensorInfo, parse_gguf
from .hub_files import (
    DownloadCancelled,
    DownloadError,
    FileRequest,
    HubUnreachable,
    explain_failure,
    hub_endpoint,
    hub_http,
    origin,
)

MAX_HEADER_BYTES = 64 * 1024 * 1024  # the largest real headers (262k-token vocabularies) take ~10 MB
FIRST_READ_BYTES = 256 * 1024
_CHUNK_BYTES = 64 * 1024  # how often a transfer looks at the clock and at a cancel
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


@dataclass(frozen=True)
class RemoteHeader:
    repo_id: str
    filename: str
    revision: str
    metadata: dict[
        str, Any
    ]  # as read_gguf_metadata gives it (with tensors: as read_gguf_layout, token strings counted)
    file_size: int
    bytes_read: int  # every body byte received, over all range requests
    tensors: tuple[TensorInfo, ...] = ()  # each tensor's name, type and shape, when asked for


def read_remote_metadata(
    repo_id: str,
    filename: str,
    revision: str = "main",
    *,
    endpoint: str | None = None,
    timeout_s: float = 20.0,
    max_header_bytes: int = MAX_HEADER_BYTES,
    cancelled: Callable[[], bool] | None = None,
    tensors: bool = False,
) -> RemoteHeader:
    """The metadata of a GGUF file on the hub, read with range requests. Raises ModelFileError for a file
    that is not (a sane) GGUF, DownloadError (HubUnreachable, DownloadCancelled) for the hub's answers.
    The whole call takes at most about timeout_s. With tensors, the tensor list that follows the metadata is
    read too (tens of KB more; the vocabulary's strings are stepped over, their count kept)."""
    request = FileRequest(repo_id, filename, revision)
    endpoint = (endpoint or hub_endpoint()).rstrip("/")
    deadline = time.monotonic() + timeout_s
    url, headers = _locate(request, endpoint, deadline)
    source = _RangeSource(request, endpoint, url, headers, deadline, max_header_bytes, cancelled)
    meta, infos = parse_gguf(source, request.label, tensors=tensors)
    return RemoteHeader(
        repo_id=repo_id,
        filename=filename,
        revision=revision,
        metadata=meta,
        file_size=source.size,
        bytes_read=source.bytes_read,
        tensors=tuple(infos),
    )


def _locate(request: FileRequest, endpoint: str, deadline: float) -> tuple[str, dict[str, str]]:
    """Where the bytes are (the CDN for LFS files) and the headers to send there, as hub_files.resolve_file does."""
    url = hf_hub_url(request.repo_id, request.filename, revision=request.revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, timeout=_left(deadline, request, endpoint), endpoint=endpoint)
        headers = build_hf_headers()  # HF_TOKEN or the saved login, as the hub client sends it
        headers["Accept-Encoding"] = "identity"  # ranges count the file's own bytes, not a compressed body's
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403) and type(exc) is HfHubHTTPError:  # no X-Error-Code to tell more
            raise _gated(request, status) from exc
        raise explain_failure(exc, request, endpoint) from exc
    except EngineError:
        raise
    except Exception as exc:
        raise explain_failure(exc, request, endpoint) from exc
    byte_url = url
    if meta.xet_file_data is None and meta.location and meta.location != url:
        byte_url = meta.location
    if origin(byte_url) != origin(url):
        headers.pop("authorization", None)  # the token is for the hub, not for the CDN
    return byte_url, headers


class _RangeSource:
    """A remote GGUF file for gguf_header.parse_gguf: range reads, growing geometrically, capped."""

    def __init__(
        self,
        request: FileRequest,
        endpoint: str,
        url: str,
        headers: dict[str, str],
        deadline: float,
        max_bytes: int,
        cancelled: Callable[[], bool] | None,
    ):
        self.request, self.endpoint, self.url, self.headers = request, endpoint, url, headers
        self.deadline, self.max_bytes, self.cancelled = deadline, max_bytes, cancelled
        self.bytes_read = 0
        self.size = 0  # set by the first answer's Content-Range
        self._first = self._fetch(0, min(FIRST_READ_BYTES, max_bytes))
        if _looks_like_html(self._first):
            raise _html(request, endpoint)

    def read(self, at: int, n: int) -> bytes:
        if at == 0 and n <= len(self._first):
            return self._first
        end = min(at + max(n, at), self.size)  # at least double what the parser has: few round trips
        if at + n > self.max_bytes:
            raise ModelFileError(
                f"The header of {self.request.label} would need more than {format_bytes(self.max_bytes)} to read "
                f"(its metadata runs to byte {at + n:,} of {self.size:,}): it is damaged or unusually large. "
                "Download the file to check it."
            )
        return self._fetch(at, min(end, self.max_bytes) - at)

    def _fetch(self, start: int, length: int) -> bytes:
        if self.cancelled is not None and self.cancelled():
            raise DownloadCancelled(f"Reading the header of {self.request.label} was cancelled.")
        headers = {**self.headers, "Range": f"bytes={start}-{start + length - 1}"}
        timeout = _left(self.deadline, self.request, self.endpoint)
        try:
            with get_session().stream(
                "GET", self.url, headers=headers, timeout=timeout, follow_redirects=True
            ) as response:
                return self._body(response, self._check(response, start, length))
        except EngineError:
            raise
        except Exception as exc:
            raise explain_failure(exc, self.request, self.endpoint) from exc

    def _check(self, response: hub_http.Response, start: int, length: int) -> int:
        """How many bytes the answer brings; refuses any answer but the bytes asked for before reading it."""
        status, label = response.status_code, self.request.label
        if status in (401, 403):
            raise _gated(self.request, status)
        if status == 404:
            raise DownloadError(f"{label} is not on {self.endpoint} (HTTP 404 for its bytes).")
        if status == 416:
            raise ModelFileError(f"{label} is truncated: it has no byte {start:,}.")
        if status == 200:  # the whole file is coming: read none of it
            raise DownloadError(
                f"The server of {label} ({origin(self.url)[1]}) does not support range reads (it "
                "answered a request for part of the file with all of it), so its header cannot be "
                "read without downloading the whole file."
            )
        if status != 206:
            raise DownloadError(
                f"{self.endpoint} answered HTTP {status} for the header of {label}; "
                "the hub may be busy, try again later."
            )
        if "text/html" in response.headers.get("content-type", ""):
            raise _html(self.request, self.endpoint)
        match = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
        if not match or int(match.group(1)) != start:
            raise DownloadError(
                f"The server of {label} answered a range request with other bytes "
                f"(Content-Range {response.headers.get('content-range')!r})."
            )
        if self.size and int(match.group(3)) != self.size:
            raise DownloadError(f"{label} changed on the server while its header was read; try again.")
        self.size = int(match.group(3))
        return min(length, int(match.group(2)) + 1 - start)  # fewer where the file ends

    def _body(self, response: hub_http.Response, length: int) -> bytes:
        """Up to length bytes of the body, counting each one; stops at the deadline or a cancel."""
        chunks, got = [], 0
        for chunk in response.iter_bytes(_CHUNK_BYTES):
            self.bytes_read += len(chunk)
            chunks.append(chunk)
            got += len(chunk)
            if got >= length:
                break  # a server sending more than asked is not read further
            if self.cancelled is not None and self.cancelled():
                raise DownloadCancelled(f"Reading the header of {self.request.label} was cancelled.")
            _left(self.deadline, self.request, self.endpoint)
        data = b"".join(chunks)[:length]
        if len(data) < length:
            raise DownloadError(
                f"The connection closed after {len(data):,} of {length:,} bytes of the header of "
                f"{self.request.label}; try again."
            )
        return data


def _left(deadline: float, request: FileRequest, endpoint: str) -> float:
    """Seconds left to the whole read, or HubUnreachable once there are none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise HubUnreachable(f"{endpoint} stopped answering while reading the header of {request.label}.")
    return left


def _gated(request: FileRequest, status: int) -> DownloadError:
    return DownloadError(
        f"{request.repo_id} is gated or private (HTTP {status}): accept its terms on the model "
        "page at huggingface.co, then set HF_TOKEN (or run `hf auth login`) and try again."
    )


def _html(request: FileRequest, endpoint: str) -> DownloadError:
    return DownloadError(
        f"{endpoint} sent a web page instead of the bytes of {request.label}: a proxy, a login "
        "page or a mirror that is not a hub answered. Check HF_ENDPOINT and the network."
    )


def _looks_like_html(first: bytes) -> bool:
    start = first[:64].lstrip().lower()
    return start.startswith((b"<!doctype html", b"<html", b"<head", b"<body"))
