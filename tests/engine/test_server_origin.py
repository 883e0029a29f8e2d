"""What a web page can make the local server do: nothing. A browser's simple cross-site POST (text/plain, no
preflight), a DNS-rebound Host and a foreign Origin are refused before the body is read or the model runs,
while clients that send JSON from loopback or a listed name, and pages from an allowed origin, are served as
before. Real HTTP against the real server on a tiny real GGUF (it loads and decodes in ms)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from starlette.datastructures import Headers

from engine.serving.api_config import ApiConfig
from engine.serving.request_guard import host_name, request_refusal
from engine.serving.service import ServeOptions

from support.hostile_templates import CHATML, hostile_gguf
from support.serving import serve

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_ORIGIN = "http://localhost:3000"
LISTED = "specchat.lan"
HOSTILE_HOSTS = (
    "evil.example",
    "evil.example:{port}",
    "127.0.0.1.evil.example",
    "localhost.evil.example:{port}",
    "192.168.1.5:{port}",
    "[fe80::1]:{port}",
    "specchat.lan.evil.example",
)
LOOPBACK_HOSTS = (
    "localhost:{port}",
    "127.0.0.1:{port}",
    "LOCALHOST",
    "127.0.0.2",
    "[::1]:{port}",
    LISTED,
    LISTED + ":{port}",
)
JSON_ENDPOINTS = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "w1 w2", "max_tokens": 2},
    "/tokenize": {"prompt": "w1 w2"},
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("origin")
        patch.setenv("SPECCHAT_CACHE_DIR", str(path / "cache"))
        yield path


@pytest.fixture(scope="module")
def chatml_gguf(folder) -> Path:
    return hostile_gguf(folder / "tiny.gguf", CHATML, complete=True)  # a plain ChatML template: it works


@pytest.fixture(scope="module")
def server(chatml_gguf):
    service, model = serve(chatml_gguf, cors_origins=(ALLOWED_ORIGIN,), allowed_hosts=(LISTED,))
    yield service
    service.stop()
    model.close()


@pytest.fixture()
def model_work(server, monkeypatch) -> list[str]:
    """What reached the model while a test ran: each tokenize and each job submitted."""
    seen: list[str] = []
    target, scheduler = server.scheduler.target, server.scheduler
    real_tokenize, real_submit = target.tokenize, scheduler.submit
    monkeypatch.setattr(target, "tokenize", lambda *a, **k: seen.append("tokenize") or real_tokenize(*a, **k))
    monkeypatch.setattr(scheduler, "submit", lambda job: seen.append("submit") or real_submit(job))
    return seen


def raw_reply(port: int, head: str) -> tuple[int, dict]:
    """Send only a request head (no body, whatever it declares, and nothing after it): the status and JSON the
    server answers with. A server that waited for the body would answer 408 once its BODY_TIMEOUT_S (30 s) had
    passed, well within the socket's 60 s (a liveness guard)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status_line, _, body = reply.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(body)


@pytest.mark.slow
def test_a_browsers_simple_post_is_a_415_before_the_body_is_read_or_the_model_runs(server, model_work):
    for path, body in JSON_ENDPOINTS.items():
        for content_type in (
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            None,
        ):
            headers = {"Content-Type": content_type} if content_type else {}
            reply = httpx.post(server.url + path, content=json.dumps(body), headers=headers, timeout=30)
            assert reply.status_code == 415, (path, content_type, reply.text)
            error = reply.json()["error"]
            assert error["code"] == "unsupported_media_type" and "'application/json'" in error["message"]
    assert model_work == []
    status, reply = raw_reply(
        server.port,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: text/plain\r\nContent-Length: 100000\r\n\r\n",
    )
    assert status == 415, ("the body was waited for", status, reply)  # it never comes: answered without it
    refused = [r for r in server.api.records if r.status == 415]
    assert len(refused) == 16 and {r.method for r in refused} == {"-"}  # in the Server panel's log
    # JSON, with or without parameters, is served as before.
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
        reply = httpx.post(
            server.url + "/v1/completions",
            content=json.dumps(JSON_ENDPOINTS["/v1/completions"]),
            headers={"Content-Type": content_type},
            timeout=30,
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    assert "submit" in model_work


def test_a_host_that_is_not_loopback_or_listed_is_a_403(server, model_work):
    port = server.port
    for host in HOSTILE_HOSTS:
        for method, path in (("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/completions")):
            reply = httpx.request(
                method,
                server.url + path,
                headers={"Host": host.format(port=port)},
                json=JSON_ENDPOINTS["/v1/completions"],
                timeout=30,
            )
            assert reply.status_code == 403, (host, path, reply.text)
            error = reply.json()["error"]
            assert error["code"] == "host_not_allowed" and "--allow-host" in error["message"]
    assert model_work == []
    for host in LOOPBACK_HOSTS:
        headers = {"Host": host.format(port=port)}
        assert httpx.get(server.url + "/v1/models", headers=headers).status_code == 200, host
        reply = httpx.post(
            server.url + "/v1/completions", json=JSON_ENDPOINTS["/v1/completions"], headers=headers, timeout=30
        )
        assert reply.status_code == 200, (host, reply.text)
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # /health answers as before


def test_a_foreign_origin_is_a_403_and_an_allowed_one_gets_cors_headers(server, model_work):
    for origin in ("http://evil.example", "null", "http://localhost:3001", "http://127.0.0.1:" + str(server.port)):
        for method, path in (("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/chat/completions")):
            reply = httpx.request(
                method,
                server.url + path,
                headers={"Origin": origin},
                json=JSON_ENDPOINTS["/v1/chat/completions"],
                timeout=30,
            )
            assert reply.status_code == 403, (origin, path, reply.text)
            assert reply.json()["error"]["code"] == "origin_not_allowed"
            assert "access-control-allow-origin" not in reply.headers
        preflight = httpx.options(
            server.url + "/v1/chat/completions",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
    assert model_work == []
    preflight = httpx.options(
        server.url + "/v1/chat/completions",
        headers={
            "Origin": ALLOWED_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        },
    )
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    reply = httpx.post(
        server.url + "/v1/chat/completions",
        json=JSON_ENDPOINTS["/v1/chat/completions"],
        headers={"Origin": ALLOWED_ORIGIN},
        timeout=30,
    )
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert httpx.get(server.url + "/v1/models", headers={"Origin": ALLOWED_ORIGIN}).status_code == 200
    # No Origin (curl, editors, SDKs): served, and no CORS headers.
    plain = httpx.post(server.url + "/v1/chat/completions", json=JSON_ENDPOINTS["/v1/chat/completions"], timeout=30)
    assert plain.status_code == 200 and not any(h.startswith("access-control-") for h in plain.headers)


def test_serving_every_interface_takes_ip_hosts_but_only_listed_names(chatml_gguf):
    service, model = serve(chatml_gguf, host="0.0.0.0", api_key="sesame", allowed_hosts=("mybox.local",))
    try:
        url, key = f"http://127.0.0.1:{service.port}", {"Authorization": "Bearer sesame"}
        for host in ("192.168.1.5:{port}", "10.0.0.7", "[fe80::1]:{port}", "mybox.local:{port}", "localhost"):
            reply = httpx.get(url + "/v1/models", headers={**key, "Host": host.format(port=service.port)})
            assert reply.status_code == 200, (host, reply.text)
        for host in ("evil.example", "otherbox.local:{port}"):
            reply = httpx.get(url + "/v1/models", headers={**key, "Host": host.format(port=service.port)})
            error = reply.json()["error"]
            assert reply.status_code == 403 and error["code"] == "host_not_allowed"
            assert "answers to localhost and IP addresses" in error["message"]
    finally:
        service.stop()
        model.close()


def test_the_rules_on_their_own():
    assert [host_name(h) for h in ("Example.COM.:8765", "[::1]:80", "[::1]", "::1", "127.0.0.1:1", "x")] == [
        "example.com",
        "::1",
        "::1",
        "::1",
        "127.0.0.1",
        "x",
    ]
    bound = ApiConfig("m", bind_host="192.168.1.5", cors_origins=("*",))

    def refusal(config, **headers):
        refused = request_refusal(Headers(headers), "GET", config)
        return refused and refused.code

    assert refusal(bound, host="192.168.1.5:8765", origin="http://anything.example") is None  # '*': every origin
    assert refusal(bound, host="192.168.1.6:8765") == "host_not_allowed"  # not every interface: its own only
    assert refusal(bound) is None  # no Host at all (HTTP/1.0): no browser sends that
    with pytest.raises(Exception, match="allowed host"):
        ServeOptions(allowed_hosts=("*.example",))


@pytest.mark.slow
def test_cors_star_without_a_key_is_warned_of(caplog):
    with caplog.at_level(logging.WARNING):
        ServeOptions(cors_origins=("*",), api_key="sesame")
        assert "every web page" not in caplog.text
        assert ServeOptions(cors_origins=("*",)).open_to_every_page
        assert "every web page" in caplog.text
    missing = str(ROOT / "no-such-model.gguf")
    open_to_all, keyed = (
        subprocess.Popen(
            [sys.executable, "-m", "engine.serve", *args, "--model", missing],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        for args in (["--cors", "*"], ["--cors", "*", "--api-key", "k", "--allow-host", "a b"])
    )
    said = open_to_all.communicate(timeout=60)[1]
    assert open_to_all.returncode == 2 and "every web page" in said and "Set an API key" in said
    assert said.index("every web page") < said.index("not found")  # said before the model loads
    said = keyed.communicate(timeout=60)[1]
    assert keyed.returncode == 2 and "every web page" not in said and "'a b'" in said, said  # --allow-host is read
