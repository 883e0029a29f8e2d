"""Issue 63: hostile input to the OpenAI-compatible server, through the real server with the real embedded SmolLM2,
raw HTTP (http.client) for malformed bodies and the `openai` client for well-formed ones. Every client-sized field
is bounded and refused with a 400 naming it; a request with long stop strings no longer stalls another client's;
malformed bodies (deep nesting, lone surrogates, bad bytes, wrong types) are 4xx, never 500."""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

import openai
import pytest

from engine.serving.api_schema import MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_STOP_CHARS, MAX_STOPS

from support.serving import COUNTING, start

CHAT, COMPLETIONS, TOKENIZE = "/v1/chat/completions", "/v1/completions", "/tokenize"


@pytest.fixture(scope="module")
def server():
    service, model = start(parallel=2)
    yield service
    service.stop()
    model.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    """One raw POST, as a hand-written client sends it: the status and the JSON answer."""
    address = urlsplit(server.url)
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def refused(server, path: str, body: bytes, status: int = 400, headers: dict | None = None) -> dict:
    """The OpenAI-shaped error a body gets, asserting its status."""
    got, answer = post(server, path, body, headers)
    assert got == status, (got, answer)
    error = answer["error"]
    assert error["message"] and error["type"] == "invalid_request_error", error
    return error


def still_serving(client) -> None:
    reply = client.chat.completions.create(model="smollm2", messages=COUNTING, max_tokens=3)
    assert reply.usage.completion_tokens >= 1


def chat_body(**fields) -> bytes:
    """A chat request as JSON with \\u escapes (so a lone surrogate goes out as '\\ud800', as JSON allows)."""
    return json.dumps({"messages": COUNTING, "max_tokens": 2, **fields}).encode("ascii")


# --- sizes -------------------------------------------------------------------------------------------------------
def test_a_1mb_stop_string_is_a_400_naming_stop(server, client):
    for stop, name in (("x" * 1_000_000, "stop"), (["y", "x" * 1_000_000], "stop[1]")):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="smollm2", messages=COUNTING, max_tokens=4, stop=stop)
        error = caught.value.body
        assert error["param"] == "stop", error
        assert f"{name} is 1,000,000 characters; at most {MAX_STOP_CHARS:,}" in error["message"], error
    still_serving(client)


@pytest.mark.parametrize(
    "fields, param, said",
    [
        ({"stop": ["s"] * (MAX_STOPS + 1)}, "stop", f"up to {MAX_STOPS} strings"),
        (
            {"messages": [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)},
            "messages",
            f"at most {MAX_MESSAGES:,}",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * (MAX_CONTENT_PARTS + 1)}]},
            "messages[0].content",
            f"at most {MAX_CONTENT_PARTS:,}",
        ),
        ({"top_k": 2**40}, "top_k", "top_k"),
        ({"n": 2}, "n", "n"),
        ({"max_tokens": 10**9}, "max_tokens", "max_tokens"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "not supported"),
        ({"tools": [{"type": "function"}] * 1000}, "tools", "not supported"),
    ],
)
def test_every_sized_field_is_bounded_with_a_400_naming_it(server, client, fields, param, said):
    error = refused(server, CHAT, chat_body(**fields))
    assert error["param"] == param and said in error["message"], error
    still_serving(client)


@pytest.mark.slow
def test_sixteen_long_stops_and_another_clients_short_request_both_complete(server, client):
    """The long-stop request runs while the short one comes and goes: it did not hold the engine thread."""
    stops = [f"{i:02d}" + "\u2603" * (MAX_STOP_CHARS - 2) for i in range(MAX_STOPS)]  # never written by the model
    long_tokens, seen_when_short_ended, started, errors = [], [], threading.Event(), []

    def long_request():
        try:
            stream = client.chat.completions.create(
                model="smollm2",
                messages=COUNTING,
                max_tokens=200,
                temperature=0,
                stop=stops,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    started.set()
                if chunk.usage:
                    long_tokens.append(chunk.usage.completion_tokens)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            started.set()

    thread = threading.Thread(target=long_request)
    thread.start()
    started.wait(120)
    short = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    seen_when_short_ended.append(thread.is_alive())
    thread.join(300)
    assert not errors and long_tokens and set(long_tokens) == {200}, (errors, long_tokens)
    assert short.usage.completion_tokens == 4 and short.choices[0].finish_reason == "length"
    assert seen_when_short_ended == [True]  # answered while the long-stop request was still decoding


# --- text that is not Unicode ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, fields, param, said",
    [
        (CHAT, {"messages": [{"role": "user", "content": "hi \ud800 there"}]}, "messages[0].content", None),
        (
            CHAT,
            {"messages": [{"role": "system", "content": "ok"}, {"role": "user", "content": "\udfff"}]},
            "messages[1].content",
            None,
        ),
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udc80"}]}]},
            "messages[0].content[0].text",
            None,
        ),
        (CHAT, {"stop": "\ud800"}, "stop", None),
        (CHAT, {"stop": ["ok", "x\ud801"]}, "stop", "stop[1]"),
        (CHAT, {"model": "m\udcff"}, "model", None),
        (COMPLETIONS, {"prompt": "Once \ud800"}, "prompt", None),
        (TOKENIZE, {"prompt": "\ud800"}, "prompt", None),
        (TOKENIZE, {"content": "\ud800"}, "content", None),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_its_field(server, client, path, fields, param, said):
    body = {"messages": COUNTING, "max_tokens": 2, **fields}
    if path != CHAT:
        body.pop("messages")
    error = refused(server, path, json.dumps(body).encode("ascii"))
    assert error["param"] == param and "lone surrogate" in error["message"], error
    assert f"{said or param} has a lone surrogate" in error["message"], error
    still_serving(client)


def test_bytes_that_are_not_utf8_are_a_400(server, client):
    body = b'{"messages": [{"role": "user", "content": "caf\xe9 \xff\xfe"}], "max_tokens": 2}'
    assert "not valid JSON" in refused(server, CHAT, body)["message"]
    still_serving(client)


def test_unusual_but_valid_text_is_answered(server, client):
    """NUL, a BOM, a right-to-left override, a noncharacter and an astral character are Unicode: answered."""
    text = "a\x00b \ufeff \u202e \uffff \U0001f600 end"
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": text}], max_tokens=2, stop=["\x00"]
    )
    assert reply.usage.completion_tokens >= 1


# --- structure and types ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"messages": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        b'{"messages": [{"role": "user", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
    ],
)
def test_100000_deep_nested_json_is_a_400(server, client, body):
    assert "too deeply" in refused(server, CHAT, body)["message"]
    still_serving(client)


@pytest.mark.parametrize("body", [b"null", b'"hello"', b"42", b"true", b"[]", b"", b"{", b'{"a":1}x', b"NaN"])
def test_a_body_that_is_not_a_json_object_is_a_400(server, client, body):
    refused(server, CHAT, body)
    refused(server, TOKENIZE, body)
    still_serving(client)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"model": ["smollm2"]}, "model"),
        ({"messages": {"role": "user", "content": "hi"}}, "messages"),
        ({"messages": None}, "messages"),
        ({"messages": [None]}, "messages[0]"),
        ({"messages": [["user", "hi"]]}, "messages[0]"),
        ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": {"text": "hi"}}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages[0].content"),
        ({"stop": {"s": 1}}, "stop"),
        ({"stop": [None]}, "stop"),
        ({"stop": 7}, "stop"),
        ({"temperature": [1]}, "temperature"),
        ({"temperature": 10**400}, "temperature"),
        ({"top_p": None, "min_p": "0.1"}, "min_p"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": {"n": 1}}, "max_tokens"),
        ({"seed": 2**64}, "seed"),
        ({"stream": None, "ignore_eos": "yes"}, "ignore_eos"),
        ({"stream_options": [True]}, "stream_options"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options"),
        ({"response_format": "json"}, "response_format"),
        ({"n": [1]}, "n"),
    ],
)
def test_wrong_types_are_a_400_naming_the_field(server, client, fields, param):
    error = refused(server, CHAT, chat_body(**fields))
    assert error["param"] == param, error
    still_serving(client)


@pytest.mark.parametrize(
    "path, body, param",
    [
        (COMPLETIONS, {"prompt": ["a", "b"]}, "prompt"),
        (COMPLETIONS, {"prompt": 5}, "prompt"),
        (COMPLETIONS, {"prompt": None}, "prompt"),
        (TOKENIZE, {"prompt": 5}, "prompt"),
        (TOKENIZE, {"messages": "hi"}, "messages"),
    ],
)
def test_wrong_types_on_the_other_endpoints_are_a_400(server, client, path, body, param):
    assert refused(server, path, json.dumps(body).encode())["param"] == param


def declared_only(server, length: str) -> tuple[int, bytes]:
    """A POST that declares a body of `length` bytes and sends none: the status and the answer."""
    address = urlsplit(server.url)
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    try:
        conn.putrequest("POST", CHAT)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", length)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_a_huge_content_length_is_a_413_before_any_body(server, client):
    status, answer = declared_only(server, str(10**12))
    assert status == 413 and json.loads(answer)["error"]["code"] == "request_too_large"
    for length in (str(10**30), "-1", "12abc"):  # refused by uvicorn's HTTP parser before any route
        assert 400 <= declared_only(server, length)[0] < 500
    still_serving(client)


def test_a_non_ascii_api_key_is_a_401_not_a_500():
    service, model = start(parallel=1, api_key="sesame")
    try:
        for key in ("s\u00e9same", "\u00ff" * 40):  # http.client sends header values as Latin-1
            status, answer = post(service, CHAT, chat_body(), headers={"Authorization": f"Bearer {key}"})
            assert status == 401 and answer["error"]["code"] == "invalid_api_key", answer
        status, answer = post(service, CHAT, chat_body(), headers={"Authorization": "Bearer sesame"})
        assert status == 200 and answer["usage"]["completion_tokens"] >= 1
    finally:
        service.stop()
        model.close()
