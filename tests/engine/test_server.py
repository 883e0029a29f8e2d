"""The OpenAI-compatible server with the real embedded SmolLM2 (a chat template), through the real `openai`
client, raw HTTP and curl: answers, streams, concurrency, disconnects, bad input, keys, a full queue."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from engine.decoding.proposers.base import NoProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.speculation_config import SpeculationConfig
from engine.errors import InvalidSettingError
from engine.modelfiles.embedded import embedded_model_path
from engine.serving.service import ServeOptions, Service

from support.serving import COUNTING, N_CTX, PARALLEL, start

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    service, model = start()
    yield service
    service.stop()
    model.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def wait_idle(server, timeout=10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(server.url + "/health").json()
        if health["slots_processing"] == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    health = httpx.get(server.url + "/health").json()
    assert health == {"status": "ok", "slots_idle": PARALLEL, "slots_processing": 0, "requests_waiting": 0}


def test_chat_completion_carries_usage_and_timings(client):
    reply = client.chat.completions.create(model="smollm2", messages=COUNTING, max_tokens=40, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and "1, 2, 3" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens <= 40 and reply.usage.prompt_tokens > 10
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    timings = reply.model_extra["timings"]
    assert timings["predicted_n"] == reply.usage.completion_tokens
    assert timings["method"] == "lookup" and timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["predicted_per_second"] > 0 and timings["prompt_n"] + timings["cache_n"] == reply.usage.prompt_tokens
    length = timings["mean_acceptance_length"]  # per step that verified drafts: n/a where none drafted
    assert length is None if timings["draft_n"] == 0 else length >= 1.0


def test_streamed_chat_matches_the_whole_answer_and_ends_with_figures(client):
    whole = client.chat.completions.create(model="smollm2", messages=COUNTING, max_tokens=30, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=COUNTING,
            max_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].model_extra["timings"]["predicted_n"] == whole.usage.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The second identical prompt found its tokens cached in a kept sequence.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1


def test_raw_completion_and_a_stop_string(client):
    reply = client.completions.create(
        model="smollm2", prompt="Monday, Tuesday, Wednesday,", max_tokens=30, temperature=0, stop=["weekend"]
    )
    text = reply.choices[0].text
    assert "Thursday" in text and "weekend" not in text
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model_extra["timings"]["predicted_n"] == reply.usage.completion_tokens


def test_curl_sees_server_sent_events_ending_with_done(server):
    body = json.dumps({"messages": COUNTING, "max_tokens": 8, "stream": True})
    out = subprocess.run(
        ["curl", "-sN", "-H", "Content-Type: application/json", "-d", body, server.url + "/v1/chat/completions"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    events = [line for line in out.stdout.splitlines() if line]
    assert all(line.startswith("data: ") for line in events), events
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: ") :])
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and "usage" in last and "timings" in last


@pytest.mark.slow
def test_four_concurrent_streams_are_decoded_together(server, client):
    prompts = ["Name ten fruits.", "List the days of the week.", "Count from 1 to 20.", "Name five colours."]
    spans, texts, errors = {}, {}, []

    def one(i):
        try:
            stream = client.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": prompts[i]}],
                max_tokens=48,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            times, parts = [], []
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    times.append(time.monotonic())
                    parts.append(chunk.choices[0].delta.content)
            spans[i], texts[i] = (times[0], times[-1]), "".join(parts)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(texts) == 4 and all(texts.values())
    # In one batch: every stream had begun before any had ended.
    assert max(first for first, _ in spans.values()) < min(last for _, last in spans.values()), spans
    assert wait_idle(server)["slots_processing"] == 0


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server):
    body = {"messages": COUNTING, "max_tokens": 600, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        seen = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in seen)
    assert wait_idle(server, timeout=5)["slots_processing"] == 0
    record = next(r for r in reversed(server.api.records) if r.endpoint == "/v1/chat/completions")
    assert record.status == 499 and record.finish == "cancelled" and record.completion_tokens < 600


@pytest.mark.parametrize(
    "body, param",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (json.dumps({"messages": []}).encode(), "messages"),
        (json.dumps({"messages": "hello"}).encode(), "messages"),
        (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), "messages[0]"),
        (json.dumps({"messages": [{"role": "user", "content": 42}]}).encode(), "messages[0].content"),
        (json.dumps({"messages": COUNTING, "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({"messages": COUNTING, "max_tokens": "ten"}).encode(), "max_tokens"),
        (json.dumps({"messages": COUNTING, "max_tokens": 10 * N_CTX}).encode(), "max_tokens"),
        (json.dumps({"messages": COUNTING, "temperature": "hot"}).encode(), "temperature"),
        (json.dumps({"messages": COUNTING, "top_p": 0}).encode(), "top_p"),
        (json.dumps({"messages": COUNTING, "stream": "yes"}).encode(), "stream"),
        (json.dumps({"messages": COUNTING, "stop": [1, 2]}).encode(), "stop"),
        (json.dumps({"messages": COUNTING, "n": 3}).encode(), "n"),
        (json.dumps({"messages": [{"role": "user", "content": "word " * (2 * N_CTX)}]}).encode(), "messages"),
        (json.dumps({"prompt": ""}).encode(), "prompt"),
    ],
)
def test_bad_input_is_a_400_with_an_openai_error_and_the_server_keeps_serving(server, client, body, param):
    path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
    response = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param
    reply = client.chat.completions.create(model="smollm2", messages=COUNTING, max_tokens=3)
    assert reply.usage.completion_tokens >= 1


def test_a_prompt_beyond_the_context_says_so(server):
    response = httpx.post(
        server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * (2 * N_CTX)}]}
    )
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert str(N_CTX) in response.json()["error"]["message"]


def test_a_giant_prompt_is_refused_at_once_while_health_keeps_answering(server, monkeypatch):
    """A 6 MB message was templated and tokenized on the event loop before its size was checked: a 20 MB one
    blocked every request for 72 s. Now its byte length alone refuses it (it is neither templated nor tokenized),
    and /health answers while the request's preparation is held in progress."""
    from engine.serving import openai_api

    from support.serving import Hold, healthy_while_held

    rendered, tokenized = [], []
    real_render, real_tokenize = server.formatter.render, server.scheduler.target.tokenize
    monkeypatch.setattr(server.formatter, "render", lambda *a, **k: rendered.append(a) or real_render(*a, **k))
    monkeypatch.setattr(
        server.scheduler.target,
        "tokenize",
        lambda text, *a, **k: tokenized.append(len(text)) or real_tokenize(text, *a, **k),
    )
    preparing = Hold(monkeypatch, openai_api._Handlers, "chat_tokens")
    giant = "The quick brown fox jumps over the lazy dog. " * 140_000
    reply, _ = healthy_while_held(
        server.url,
        lambda: httpx.post(
            server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": giant}]}, timeout=120
        ),
        preparing,
    )
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
    assert "6,300,000 bytes" in reply.json()["error"]["message"]
    assert preparing.calls == 1 and rendered == [] and max(tokenized, default=0) < 1 << 16, (rendered, tokenized)


def test_unknown_routes_and_methods_answer_in_json(server):
    assert httpx.get(server.url + "/v1/nothing").json()["error"]["message"]
    assert httpx.get(server.url + "/v1/chat/completions").status_code == 405


def test_an_api_key_is_required_when_set_and_off_loopback():
    with pytest.raises(InvalidSettingError, match="API key"):
        ServeOptions(host="0.0.0.0")
    service, model = start(parallel=1, api_key="sesame")
    try:
        url = service.url
        assert httpx.post(url + "/v1/chat/completions", json={"messages": COUNTING}).status_code == 401
        wrong = openai.OpenAI(base_url=url + "/v1", api_key="open", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=url + "/v1", api_key="sesame", max_retries=0)
        assert right.chat.completions.create(model="x", messages=COUNTING, max_tokens=2).usage.completion_tokens
        assert httpx.get(url + "/health").status_code == 200  # health stays open, as llama-server's
    finally:
        service.stop()
        model.close()


def test_beyond_the_queue_a_request_gets_429_with_retry_after():
    service, model = start(parallel=1, proposer=NoProposer(), max_queue=0)
    try:
        body = {"messages": COUNTING, "max_tokens": 400, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", service.url + "/v1/chat/completions", json=body, timeout=60) as busy:
            data = (line for line in busy.iter_lines() if line.startswith("data: "))
            for _ in range(3):  # the role chunk, then tokens: the answer is running in the one slot
                next(data)
            assert httpx.get(service.url + "/health").json()["slots_processing"] == 1
            refused = httpx.post(service.url + "/v1/chat/completions", json={"messages": COUNTING}, timeout=30)
        assert refused.status_code == 429 and refused.headers["Retry-After"]
        assert refused.json()["error"]["code"] == "server_busy"
    finally:
        service.stop()
        model.close()


@pytest.mark.slow
def test_the_command_refuses_the_network_without_a_key_and_a_taken_port():
    run = subprocess.run(
        [sys.executable, "-m", "engine.serve", "--host", "0.0.0.0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 2 and "API key" in run.stderr


def test_a_taken_port_is_a_clear_error(server):
    model = Model(embedded_model_path(), LoadSettings(n_ctx=256, threads=1))
    try:
        with pytest.raises(Exception, match="Could not listen"):
            Service(model, None, SpeculationConfig(), ServeOptions(port=server.port, parallel=1), "x").start()
    finally:
        model.close()
