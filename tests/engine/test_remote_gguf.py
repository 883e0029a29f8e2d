"""remote_gguf.read_remote_metadata reads a GGUF header from a hub with range requests: the real
models' headers through the local hub (hub_server.py) equal read_gguf_metadata of the files, for a
small part of their bytes; each bad answer (not GGUF, lying or truncated headers, no range support,
gated, missing, hanging, offline, a web page) gives its own message, quickly."""

import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine.errors import ModelFileError
from engine.modelfiles import gguf_header
from engine.modelfiles.embedded import embedded_gemma_path, embedded_model_path
from engine.modelfiles.gguf_header import read_gguf_metadata
from engine.modelfiles.hub_files import DownloadCancelled, DownloadError, HubUnreachable
from engine.modelfiles.remote_gguf import FIRST_READ_BYTES, read_remote_metadata

from support.hub_server import Fault, LocalHub

REPO = "tester/headers"
PAIRS = Path("/root/.cache/SpecChat/pairs")


def real_models() -> dict[str, Path]:
    found = {"smollm2.gguf": embedded_model_path(), "gemma3.gguf": embedded_gemma_path()}
    for path in sorted(PAIRS.glob("qwen2.5-coder-*.gguf")):  # absent in CI
        found[path.name] = path
    return found


@pytest.fixture
def hub(monkeypatch):
    hub = LocalHub().start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    hub.stop()


def refused(error, match: str, **kwargs):
    """The error read_remote_metadata raises, checked to say `match`. (A bad answer waited on or read on and on
    would end at the call's own deadline instead, which says only that the server stopped answering.)"""
    with pytest.raises(error, match=match) as caught:
        read_remote_metadata(REPO, kwargs.pop("filename", "model.gguf"), **kwargs)
    return caught.value


def timed_out_within(error: Exception, seconds: float) -> None:
    """error came from a request the client gave at most `seconds` to answer (what was left of the call's timeout_s):
    the client gave up on the server, which still held the request."""
    timeout = error.__cause__.request.extensions["timeout"]
    assert 0 < timeout["read"] <= seconds and 0 < timeout["connect"] <= seconds, timeout


@pytest.mark.parametrize("name", list(real_models()))
def test_a_real_header_read_remotely_equals_the_local_read_for_a_small_part_of_the_file(hub, name):
    path = real_models()[name]
    hub.add_file(REPO, name, path)
    remote = read_remote_metadata(REPO, name)
    local = read_gguf_metadata(path)
    size = path.stat().st_size
    print(
        f"\n{path.name}: read {remote.bytes_read:,} of {size:,} bytes ({remote.bytes_read / size:.2%}) "
        f"in {len(hub.byte_requests(name))} range requests"
    )
    assert remote.metadata == local and isinstance(remote.metadata["tokenizer.ggml.tokens"], list)
    assert remote.file_size == size and (remote.repo_id, remote.filename, remote.revision) == (REPO, name, "main")
    assert FIRST_READ_BYTES <= remote.bytes_read <= size // 10
    ranges = [r.range for r in hub.byte_requests(name)]
    assert all(r and r.startswith("bytes=") and not r.endswith("-") for r in ranges)  # closed ranges only
    assert sum(int(b) - int(a) + 1 for a, b in (r[6:].split("-") for r in ranges)) == remote.bytes_read


def test_a_gated_repo_says_so_and_reads_with_a_token(hub, tiny, monkeypatch):
    hub.add_file(REPO, "model.gguf", tiny)
    hub.set_info(REPO, gated="manual")
    refused(DownloadError, "gated.*accept its terms.*HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    assert read_remote_metadata(REPO, "model.gguf").metadata == read_gguf_metadata(tiny)
    assert all(r.authorization is None for r in hub.byte_requests())  # the token stays with the hub


def test_forbidden_bytes_say_gated(hub, tiny):
    hub.add_file(REPO, "model.gguf", tiny)
    hub.add_fault("model.gguf", Fault(status=403, on="bytes"))
    refused(DownloadError, "gated or private \\(HTTP 403\\).*HF_TOKEN")


def test_a_missing_repo_or_file_is_named(hub, tiny):
    hub.add_file(REPO, "model.gguf", tiny)
    refused(DownloadError, "other.gguf is not in tester/headers", filename="other.gguf")
    with pytest.raises(DownloadError, match="Repository nobody/nothing was not found"):
        read_remote_metadata("nobody/nothing", "model.gguf")


def test_a_file_that_is_not_gguf_or_a_web_page(hub):
    hub.add_file(REPO, "model.gguf", b"PK\x03\x04" + bytes(5000))
    refused(ModelFileError, "is not a GGUF model \\(it starts with b'PK")
    hub.add_file(REPO, "model.gguf", b"<!DOCTYPE html><html><body>Sign in</body></html>" + b" " * 5000)
    refused(DownloadError, "sent a web page instead of the bytes")


def test_a_truncated_header(hub, tiny):
    hub.add_file(REPO, "model.gguf", tiny.read_bytes()[:3000])
    refused(ModelFileError, "truncated inside its metadata")


def lying(tiny: Path, key: bytes, offset_after_key: int, fmt: str, value: int) -> bytes:
    """tiny's bytes with the number right after `key` (past offset_after_key bytes) set to value."""
    data = bytearray(tiny.read_bytes())
    at = data.index(key) + len(key) + offset_after_key
    struct.pack_into(fmt, data, at, value)
    return bytes(data)


def test_lying_counts_are_refused_before_any_loop(hub, tiny):
    billion = lying(tiny, b"tokenizer.ggml.tokens", 4 + 4, "<Q", 1_000_000_000)  # after value and item types
    hub.add_file(REPO, "model.gguf", billion)
    error = refused(ModelFileError, "tokenizer.ggml.tokens claims 1,000,000,000 strings")
    assert "tokenizer.ggml.tokens" in str(error) and len(hub.byte_requests()) == 1
    many_keys = bytearray(tiny.read_bytes())
    struct.pack_into("<Q", many_keys, 16, 900_000)  # the header's key count: 900k keys in a few KB
    hub.add_file(REPO, "model.gguf", bytes(many_keys))
    refused(ModelFileError, "claims 900,000 keys")
    struct.pack_into("<Q", many_keys, 16, 2_000_000)
    hub.add_file(REPO, "model.gguf", bytes(many_keys))
    refused(ModelFileError, "implausible GGUF header")


def test_more_strings_than_any_vocabulary_is_refused(hub, tiny, monkeypatch):
    monkeypatch.setattr(gguf_header, "MAX_ARRAY_STRINGS", 100)  # a real 10-million one needs an 80 MB file
    hub.add_file(REPO, "model.gguf", tiny)
    refused(ModelFileError, "tokenizer.ggml.tokens claims 303 strings \\(more than 100 is never")
    with pytest.raises(ModelFileError, match="tokenizer.ggml.tokens claims 303 strings"):
        read_gguf_metadata(tiny)  # the local read has the same guard


def test_a_string_length_past_the_end(hub, tiny):
    first_key = tiny.read_bytes()[24:32]  # the first key's length field
    data = bytearray(tiny.read_bytes())
    struct.pack_into("<Q", data, 24, 1 << 40)
    assert first_key != bytes(data[24:32])
    hub.add_file(REPO, "model.gguf", bytes(data))
    refused(ModelFileError, "truncated inside its metadata")


def test_a_header_larger_than_the_cap_says_so_and_reads_no_more(hub):
    path = embedded_model_path()
    hub.add_file(REPO, "model.gguf", path)
    cap = 512 * 1024
    error = refused(ModelFileError, "would need more than 524.3 KB to read", max_header_bytes=cap)
    assert "damaged or unusually large" in str(error)
    ends = [int(r.range.split("-")[1]) for r in hub.byte_requests()]
    assert max(ends) < cap


def test_a_server_that_stops_sending_times_out(hub, tiny):
    hub.add_file(REPO, "model.gguf", tiny)
    hub.add_fault("model.gguf", Fault(hold_after=1000))
    try:
        timed_out_within(refused(HubUnreachable, "stopped answering", timeout_s=1.0), 1.0)
    finally:
        hub.release()  # (only now: the hub held the bytes until the client had given up)


def test_a_cancel_stops_the_read(hub, tiny):
    hub.add_file(REPO, "model.gguf", tiny)
    refused(DownloadCancelled, "cancelled", cancelled=lambda: True)


def test_offline_says_the_hub_cannot_be_reached(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    refused(HubUnreachable, "Cannot reach http://127.0.0.1")


# --- faults the local hub does not have: a tiny server of its own ------------------------------
class OddServer:
    """Answers the hub's HEAD like a plain mirror, then GETs as `mode` says: 'whole' sends 200 and a
    200 MB body, ignoring Range; 'html' sends 206 with an HTML page; 'hang' never answers at all."""

    def __init__(self, mode: str):
        self.mode, self.sent, self.stop = mode, 0, threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        odd = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                if odd.mode == "hang":
                    odd.stop.wait(30)
                    return
                self._head(200, {"ETag": '"abc"', "X-Repo-Commit": "0" * 40, "Content-Length": str(200 << 20)})

            def do_GET(self):
                if odd.mode == "html":
                    body = b"<html><body>Please log in</body></html>"
                    return self._head(
                        206,
                        {
                            "Content-Type": "text/html",
                            "Content-Length": str(len(body)),
                            "Content-Range": f"bytes 0-{len(body) - 1}/{len(body)}",
                        },
                        body,
                    )
                self._head(200, {"Content-Length": str(200 << 20)})
                block = b"GGUF" + bytes(65532)
                try:
                    while odd.sent < 200 << 20 and not odd.stop.is_set():
                        self.wfile.write(block)
                        odd.sent += len(block)
                except OSError:
                    pass  # the client hung up, as it should

            def _head(self, status, headers, body=b""):
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

        return Handler


@pytest.fixture
def odd(request, monkeypatch):
    server = OddServer(request.param)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.close()


@pytest.mark.parametrize("odd", ["whole"], indirect=True)
def test_a_server_ignoring_range_is_not_downloaded_whole(odd):
    refused(DownloadError, "does not support range reads")
    time.sleep(0.2)
    assert odd.sent < 50 << 20, odd.sent  # it stopped long before the 200 MB


@pytest.mark.parametrize("odd", ["html"], indirect=True)
def test_an_html_answer_to_a_range_read(odd):
    refused(DownloadError, "sent a web page instead of the bytes")


@pytest.mark.parametrize("odd", ["hang"], indirect=True)
def test_a_hub_that_never_answers_times_out(odd):
    timed_out_within(refused(HubUnreachable, "stopped answering", timeout_s=1.0), 1.0)
