"""A small Hugging Face-compatible hub on 127.0.0.1 for download tests, and tiny real GGUF files.

It answers what the real huggingface_hub client asks for:
- HEAD/GET /{owner}/{name}/resolve/{revision}/{filename}: for LFS files a 302 to a CDN URL with
  X-Repo-Commit, X-Linked-Etag (the sha256) and X-Linked-Size, as the hub does; small non-LFS files
  are served in place with their git blob sha1 as ETag; 404s carry the hub's X-Error-Code.
- HEAD/GET /cdn/{sha256} on a second port (another origin, like the hub's CDN): the bytes, with
  Range support, open (bytes=A-) and closed (bytes=A-B), answered 206 + Content-Range.
- GET /api/models?search=&filter=&sort=&direction=&limit=&expand=: the repos whose id contains every
  word of search (case-insensitive) and that carry every filter tag, sorted (descending unless
  direction=1), limit per page with a Link rel="next" header as the hub paginates; only the expand
  fields (and id) when expand is given, the hub's default fields otherwise.
- GET /api/models/{owner}/{name}[/revision/{rev}][?blobs=true]: id, sha, downloads, likes, gated,
  lastModified, tags, cardData (base_model) and siblings (rfilename; size, blobId and lfs with blobs).
Per-repo listing facts (downloads, likes, gated, base_model, ...) are set with set_info(). A gated
repo answers 401 X-Error-Code GatedRepo on resolve unless the request carries an Authorization
header; its CDN bytes need that header or the signature the resolve redirect adds (the hub's CDN
URLs are signed), while its API info answers to anyone, as on the hub.
Faults are injected per file: an HTTP status, a connection cut after N bytes, a hold (the server
stops sending after N bytes until released), a wrong advertised sha256, and an ETag that is no
content hash (as a plain mirror or a proxy sends). With valid_tokens set, any other token is refused
(401), as the hub refuses a revoked one. The API can be made to answer an HTML page,
text that is no JSON, JSON of the wrong shape, or nothing at all (api_fault). Every request is logged.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_BLOCK = 64 * 1024


@dataclass
class HubFile:
    source: bytes | Path
    lfs: bool = True
    advertised_sha256: str | None = None  # set to lie about the checksum
    etag: str | None = None  # set to send this ETag instead of the content hash, as a plain mirror does

    @property
    def size(self) -> int:
        return len(self.source) if isinstance(self.source, bytes) else self.source.stat().st_size

    @property
    def sha256(self) -> str:
        return _sha256(self.source) if isinstance(self.source, bytes) else _sha256_of_file(str(self.source))

    @property
    def git_sha1(self) -> str:
        return _git_sha1(self.read(0, self.size))

    def read(self, start: int, length: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[start : start + length]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(length)


@dataclass
class Fault:
    status: int | None = None  # answer this HTTP status instead
    cut_after: int | None = None  # close the connection after this many body bytes
    hold_after: int | None = None  # stop after this many body bytes until release() is called
    times: int = 1  # how many requests the fault applies to (-1 = always)
    on: str = "bytes"  # "bytes" (the CDN GET), "resolve" (HEAD/GET on resolve) or "any"


@dataclass
class RepoInfo:
    """What the hub's API says about a repo besides its files."""

    downloads: int = 0
    likes: int = 0
    last_modified: str = "2026-01-01T00:00:00.000Z"
    tags: list[str] | None = None  # None: ["gguf"] when the repo holds a .gguf file, else []
    base_model: str | list[str] | None = None
    gated: bool | str = False  # False, or the hub's "auto" / "manual"


API_FAULTS = ("html", "not-json", "wrong-shape", "hang")
_DEFAULT_LIST_FIELDS = ("id", "likes", "downloads", "tags", "private", "library_name", "createdAt")
_SORT_KEYS = {"downloads": "downloads", "likes": "likes", "lastModified": "last_modified"}


@dataclass
class LoggedRequest:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class LocalHub:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    requests: list[LoggedRequest] = field(default_factory=list)
    info: dict[str, RepoInfo] = field(default_factory=dict)
    api_fault: str | None = None  # one of API_FAULTS: how every /api/ request is answered
    phrase_search: bool = False  # match the search as one substring, not word by word
    valid_tokens: set[str] | None = None  # when set, the hub refuses any other token (not the CDN)

    def __post_init__(self):
        self._secret = hashlib.sha256(str(id(self)).encode()).hexdigest()[:16]
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self)) for _ in ("hub", "cdn")]
        for server in self._servers:
            server.daemon_threads = True

    # --- set-up -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return _url(self._servers[0])

    @property
    def cdn_url(self) -> str:
        return _url(self._servers[1])

    def start(self) -> LocalHub:
        for server in self._servers:
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        self._release.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def add_file(self, repo_id: str, filename: str, source: bytes | Path, **kwargs) -> HubFile:
        hub_file = HubFile(source=source, **kwargs)
        self.repos.setdefault(repo_id, {})[filename] = hub_file
        return hub_file

    def set_info(self, repo_id: str, **kwargs) -> RepoInfo:
        """Listing facts for a repo: downloads, likes, last_modified, tags, base_model, gated."""
        info = self.info.setdefault(repo_id, RepoInfo())
        for key, value in kwargs.items():
            if not hasattr(info, key):
                raise TypeError(f"RepoInfo has no field {key!r}")
            setattr(info, key, value)
        self.repos.setdefault(repo_id, {})
        return info

    def add_fault(self, filename: str, fault: Fault) -> None:
        with self._lock:
            self.faults.setdefault(filename, []).append(fault)

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def release(self) -> None:
        """Let held responses continue."""
        self._release.set()

    # --- queries for assertions ---------------------------------------------------------------
    def byte_requests(self, filename: str | None = None) -> list[LoggedRequest]:
        """GETs of file contents (CDN), optionally of one file."""
        shas = None
        if filename is not None:
            shas = {
                f.advertised_sha256 or f.sha256
                for files in self.repos.values()
                for name, f in files.items()
                if name == filename
            }
        return [
            r
            for r in self.requests
            if r.method == "GET" and r.path.startswith("/cdn/") and (shas is None or r.path.split("/")[2] in shas)
        ]

    # --- internals ----------------------------------------------------------------------------
    def _take_fault(self, filename: str, where: str) -> Fault | None:
        with self._lock:
            for fault in self.faults.get(filename, []):
                if fault.times != 0 and fault.on in (where, "any"):
                    if fault.times > 0:
                        fault.times -= 1
                    return fault
        return None

    def _find_by_sha(self, sha: str) -> tuple[str, str, HubFile] | None:
        for repo_id, files in self.repos.items():
            for name, hub_file in files.items():
                if sha in (hub_file.advertised_sha256, hub_file.sha256) and hub_file.lfs:
                    return repo_id, name, hub_file
        return None

    def _info(self, repo_id: str) -> RepoInfo:
        return self.info.get(repo_id) or RepoInfo()

    def _signature(self, sha: str) -> str:
        return hashlib.sha256(f"{self._secret}{sha}".encode()).hexdigest()[:32]

    def _tags(self, repo_id: str) -> list[str]:
        tags = self._info(repo_id).tags
        if tags is not None:
            return list(tags)
        return ["gguf"] if any(name.endswith(".gguf") for name in self.repos[repo_id]) else []

    def _model_json(self, repo_id: str, blobs: bool, fields: tuple[str, ...] | None = None) -> dict:
        """The hub's JSON for a repo; fields limits it to those keys (and id), as expand does."""
        info = self._info(repo_id)
        siblings = []
        for name, hub_file in self.repos[repo_id].items():
            sibling = {"rfilename": name}
            if blobs and hub_file.lfs:  # git holds an LFS pointer: blobId is the pointer's hash
                sha = hub_file.advertised_sha256 or hub_file.sha256
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {hub_file.size}\n"
                sibling.update(
                    size=hub_file.size,
                    blobId=_git_sha1(pointer.encode()),
                    lfs={"sha256": sha, "size": hub_file.size, "pointerSize": len(pointer)},
                )
            elif blobs:
                sibling.update(size=hub_file.size, blobId=hub_file.git_sha1)
            siblings.append(sibling)
        card = {"base_model": info.base_model} if info.base_model is not None else {}
        data = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": COMMIT,
            "lastModified": info.last_modified,
            "createdAt": "2025-01-01T00:00:00.000Z",
            "private": False,
            "gated": info.gated,
            "disabled": False,
            "downloads": info.downloads,
            "likes": info.likes,
            "library_name": "gguf",
            "tags": self._tags(repo_id),
            "cardData": card,
            "siblings": siblings,
        }
        if fields is not None:
            data = {key: value for key, value in data.items() if key in ("_id", "id") or key in fields}
        return data

    def _search(self, query: dict[str, list[str]]) -> list[str]:
        """Repo ids matching every search word and filter tag, in the asked order."""
        words = " ".join(query.get("search", [])).lower().split()
        if self.phrase_search:  # the hub's documented rule: the search string is one substring of the id
            words = [" ".join(words)] if words else []
        tags = [t for value in query.get("filter", []) for t in value.split(",") if t]
        found = [
            repo_id
            for repo_id in self.repos
            if all(w in repo_id.lower() for w in words) and all(t in self._tags(repo_id) for t in tags)
        ]
        found.sort()  # ties in id order, so results are repeatable
        key = _SORT_KEYS.get((query.get("sort") or [""])[0])
        if key:
            ascending = (query.get("direction") or ["-1"])[0] == "1"
            found.sort(key=lambda repo_id: getattr(self._info(repo_id), key), reverse=not ascending)
        return found


class _ApiAnswers:
    """The hub's JSON API, for the request handler below (self.hub is the LocalHub)."""

    hub: LocalHub

    def _serve_api(self, path: str, body: bool):
        if self.hub.api_fault == "hang":
            self.hub._release.wait(timeout=30)  # answer nothing until released (or the hub stops)
            return self._cut()
        if self.hub.api_fault == "html":
            return self._send(
                200,
                "text/html; charset=utf-8",
                b"<!doctype html><html><body><h1>Welcome to our proxy</h1></body></html>",
                body,
            )
        if self.hub.api_fault == "not-json":
            return self._send(200, "application/json", b"{'models': [oops", body)
        query = parse_qs(urlsplit(self.path).query)
        if path == "/api/models":
            return self._serve_list(query, body)
        match = re.fullmatch(r"/api/models/([^/]+/[^/]+?)(?:/revision/(.+))?", path)
        if not match:
            return self._error(404, None, "Not found")
        repo_id, revision = match.groups()
        if repo_id not in self.hub.repos:
            return self._error(404, "RepoNotFound", "Repository not found")
        if revision not in (None, "main", COMMIT):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        data = self.hub._model_json(repo_id, blobs=(query.get("blobs") or [""])[0].lower() == "true")
        if self.hub.api_fault == "wrong-shape":
            data = [data]
        self._send_json(data, body)

    def _serve_list(self, query: dict[str, list[str]], body: bool):
        found = self.hub._search(query)
        limit = int((query.get("limit") or ["1000"])[0])
        start = int((query.get("cursor") or ["0"])[0])  # the hub's cursor is opaque; an offset does here
        page = found[start : start + limit]
        expand = query.get("expand", []) + query.get("expand[]", [])
        fields = tuple(expand) if expand else _DEFAULT_LIST_FIELDS
        data = [self.hub._model_json(repo_id, blobs=False, fields=fields) for repo_id in page]
        extra = {}
        if start + limit < len(found):
            following = {**query, "cursor": [str(start + limit)]}
            extra["Link"] = f'<{self.hub.url}/api/models?{urlencode(following, doseq=True)}>; rel="next"'
        if self.hub.api_fault == "wrong-shape":
            data = {"models": data}
        self._send_json(data, body, extra)

    def _send_json(self, data, body: bool, extra: dict | None = None):
        self._send(200, "application/json; charset=utf-8", json.dumps(data).encode(), body, extra)

    def _send(self, status: int, content_type: str, payload: bytes, body: bool, extra: dict | None = None):
        self._headers(status, {**(extra or {}), "Content-Type": content_type, "Content-Length": str(len(payload))})
        if body:
            self.wfile.write(payload)


class _Handler(_ApiAnswers, BaseHTTPRequestHandler):
    """Answers one request; _make_handler binds it to a hub (self.hub)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body: bool):
        self.hub.requests.append(
            LoggedRequest(self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization"))
        )
        path = unquote(urlsplit(self.path).path)
        if path.startswith("/cdn/"):
            return self._serve_bytes(path.split("/")[2], body)
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if token and self.hub.valid_tokens is not None and token not in self.hub.valid_tokens:
            return self._error(401, None, "Invalid credentials in Authorization header")
        if path == "/api/models" or path.startswith("/api/models/"):
            return self._serve_api(path, body)
        match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if not match:
            return self._error(404, "RepoNotFound", "Not a resolve URL")
        repo_id, revision, filename = match.groups()
        files = self.hub.repos.get(repo_id)
        if files is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        if revision not in ("main", COMMIT):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        hub_file = files.get(filename)
        if hub_file is None:
            return self._error(404, "EntryNotFound", "Entry not found")
        if self.hub._info(repo_id).gated and not self.headers.get("Authorization"):
            return self._gated(repo_id)
        fault = self.hub._take_fault(filename, "resolve")
        if fault and fault.status:
            return self._error(fault.status, None, "Injected failure")
        common = {"X-Repo-Commit": COMMIT}
        if hub_file.lfs:
            sha = hub_file.advertised_sha256 or hub_file.sha256
            etag = hub_file.etag or sha
            signed = f"?signature={self.hub._signature(sha)}" if self.hub._info(repo_id).gated else ""
            self._headers(
                302,
                {
                    **common,
                    "Location": f"{self.hub.cdn_url}/cdn/{sha}{signed}",
                    "ETag": f'"{etag}"',
                    "X-Linked-Etag": f'"{etag}"',
                    "X-Linked-Size": str(hub_file.size),
                    "Content-Length": "0",
                },
            )
            return
        self._send_range(filename, hub_file, body, {**common, "ETag": f'"{hub_file.etag or hub_file.git_sha1}"'})

    def _serve_bytes(self, sha: str, body: bool):
        found = self.hub._find_by_sha(sha)
        if found is None:
            return self._error(404, None, "No such blob")
        repo_id, filename, hub_file = found
        if self.hub._info(repo_id).gated and not self.headers.get("Authorization"):
            signature = parse_qs(urlsplit(self.path).query).get("signature", [""])[0]
            if signature != self.hub._signature(sha):
                return self._gated(repo_id)
        self._send_range(filename, hub_file, body, {"ETag": f'"{sha}"'})

    def _gated(self, repo_id: str):
        return self._error(
            401,
            "GatedRepo",
            f"Access to model {repo_id} is restricted. You must have access "
            "to it and be authenticated to access it. Please log in.",
        )

    def _send_range(self, filename: str, hub_file: HubFile, body: bool, extra: dict):
        fault = self.hub._take_fault(filename, "bytes") if body else None
        if fault and fault.status:
            return self._error(fault.status, None, "Injected failure")
        size = hub_file.size
        start, end, status = 0, size, 200  # end is exclusive
        requested = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if requested:
            start, status = int(requested.group(1)), 206
            if requested.group(2):  # a closed range A-B: B is inclusive and may run past the end
                end = min(int(requested.group(2)), size - 1) + 1
            if start >= size or start >= end:
                return self._headers(416, {"Content-Range": f"bytes */{size}", "Content-Length": "0"})
        headers = {**extra, "Accept-Ranges": "bytes", "Content-Length": str(end - start)}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self._headers(status, headers)
        if not body:
            return
        sent, position = 0, start
        while position < end:
            if fault and fault.cut_after is not None and sent >= fault.cut_after:
                return self._cut()
            if fault and fault.hold_after is not None and sent >= fault.hold_after:
                self.hub._release.wait(timeout=30)
                fault = None
            limit = _BLOCK
            for stop in (fault.cut_after if fault else None, fault.hold_after if fault else None):
                if stop is not None and stop > sent:
                    limit = min(limit, stop - sent)
            chunk = hub_file.read(position, min(limit, end - position))
            try:
                self.wfile.write(chunk)
                self.wfile.flush()
            except OSError:
                return  # the client went away (a cancel)
            sent += len(chunk)
            position += len(chunk)

    def _cut(self):
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _headers(self, status: int, headers: dict):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def _error(self, status: int, code: str | None, message: str):
        body = message.encode()
        headers = {"Content-Length": str(len(body)), "X-Error-Message": message, "X-Repo-Commit": COMMIT}
        if code:
            headers["X-Error-Code"] = code
        self._headers(status, headers)
        if self.command != "HEAD":
            self.wfile.write(body)


def _make_handler(hub: LocalHub) -> type:
    return type("Handler", (_Handler,), {"hub": hub})


def _url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


@cache
def _sha256_of_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
