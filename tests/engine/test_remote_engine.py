"""Remote engines (engine/remote): a real SpecChat server the test starts (the embedded SmolLM2), llama-server
where SPECCHAT_LLAMA_SERVER names a binary, vLLM's /metrics text in its documented format, and a stand-in for
vLLM's streaming (vLLM needs a GPU: the real path is the same code, named in docs/remote-engines.md)."""

import json
import os
import shutil
import subprocess
import threading
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import httpx
import keyring
import pytest
from keyring.backends.fail import Keyring as NoKeyring
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams
from engine.errors import EngineError, InvalidSettingError
from engine.modelfiles.embedded import embedded_model_path
from engine.remote import answer_stream, client, keys, prometheus, reading
from engine.remote.client import RemoteEngine, RemoteModel
from engine.remote.endpoint import Endpoint, normalised_url, url_warning
from engine.remote.sse import EventStream

from support.remote_server import DONE, MIB, HostileServer, drafting_specchat_server, event, specchat_server  # noqa: E501

GREEDY = SamplingParams(temperature=0.0)
COPY = [
    {
        "role": "user",
        "content": "Passage: The lighthouse at Point Arden was built in 1871 from granite quarried "
        "on the island itself.\n\nCopy the passage above word for word.",
    }
]
COUNTING = [{"role": "user", "content": "Write the numbers from 1 to 40, separated by commas."}]


@pytest.fixture(scope="module")
def server():
    with drafting_specchat_server(api_key="right-key") as service:
        yield service


@pytest.fixture
def engine(server):
    engine = RemoteEngine(Endpoint(server.url, "", "right-key"))
    yield engine
    engine.close()


# --- addresses and keys ---------------------------------------------------------------------------
def test_urls_are_normalised_and_plain_http_beyond_this_machine_is_flagged():
    assert normalised_url(" localhost:8000/v1/ ") == "http://localhost:8000"
    assert normalised_url("https://gpu.example.org/api/v1") == "https://gpu.example.org/api"
    for bad in ("", "ftp://x", "http://:80", "http://host:port", "http://h/?q=1"):
        with pytest.raises(InvalidSettingError):
            normalised_url(bad)
    assert url_warning("http://127.0.0.1:8000") == url_warning("http://localhost:1") == ""
    assert url_warning("https://gpu.example.org") == ""
    assert "unencrypted" in url_warning("http://gpu.example.org:8000")


def test_api_keys_live_in_the_keyring_file_backend(tmp_path, keyring_in_tmp):
    keys.save_key("https://gpu.example.org", "sk-123")
    assert keys.saved_key("https://gpu.example.org") == "sk-123"
    assert "gpu_2eexample_2eorg" in (tmp_path / "keyring.cfg").read_text()  # the backend's own file (base64)
    keys.save_key("https://gpu.example.org", "")
    assert keys.saved_key("https://gpu.example.org") is None


def test_without_a_keyring_saving_says_so_and_reading_finds_nothing(monkeypatch):
    monkeypatch.delenv("SPECCHAT_ALLOW_FILE_KEYRING")
    with pytest.raises(EngineError, match="PlaintextKeyring is not a system keyring"):
        keys.save_key("https://gpu.example.org", "sk-123")  # a file is not a keyring outside the tests
    keyring.set_keyring(NoKeyring())
    with pytest.raises(EngineError, match="keyring"):
        keys.save_key("https://gpu.example.org", "sk-123")
    assert keys.saved_key("https://gpu.example.org") is None
    monkeypatch.setenv("MY_KEY", " sk-9 ")
    assert keys.key_from_env("MY_KEY") == "sk-9"
    with pytest.raises(EngineError, match="NO_SUCH_VARIABLE"):
        keys.key_from_env("NO_SUCH_VARIABLE")


# --- a SpecChat server ---------------------------------------------------------------------------
def test_models_and_the_prompt_counted_by_the_servers_tokenizer(engine, server):
    model = engine.model()
    assert (model.id, model.n_ctx) == ("smollm2", 1024)
    count = engine.count_prompt(COPY, model)
    local = Model(embedded_model_path(), LoadSettings(n_ctx=1024), vocab_only=True)
    try:
        from engine.chat_format import ChatFormatter

        expected = len(ChatFormatter(local).render(COPY)[1])
    finally:
        local.close()
    assert count.exact and count.tokens == expected and count.n_ctx == 1024
    raw = httpx.post(
        server.url + "/tokenize", json={"content": "Hello world"}, headers={"Authorization": "Bearer right-key"}
    ).json()  # llama-server's shape
    assert raw["count"] == len(raw["tokens"]) > 0 and raw["max_model_len"] == 1024
    answered = COPY + [{"role": "assistant", "content": "The lighthouse"}]  # counted, though not an answerable end
    assert engine.count_prompt(answered, model).tokens > count.tokens
    assert httpx.post(server.url + "/tokenize", json={"content": "x"}).status_code == 401


def test_a_streamed_answer_matches_the_servers_whole_answer_with_figures_measured_here(engine, server):
    model = engine.model()
    whole = httpx.post(
        server.url + "/v1/chat/completions",
        headers={"Authorization": "Bearer right-key"},
        json={"model": "smollm2", "messages": COPY, "max_tokens": 48, "temperature": 0},
        timeout=120,
    ).json()
    answer = engine.answer(COPY, GREEDY, 48, model)
    pieces = list(answer)
    figures = answer.figures.to_dict()
    assert "".join(pieces) == whole["choices"][0]["message"]["content"] and len(pieces) > 1
    assert figures["generated"] == whole["usage"]["completion_tokens"]
    assert figures["ttft_s"] > 0 and figures["tokens_per_s"] > 0 and figures["network_included"]
    assert figures["method"] == "lookup" and figures["drafted"] > 0 and 0 < figures["accepted"] <= figures["drafted"]
    assert figures["acceptance_source"] == "from the server's timings for this answer"
    assert figures["memory_label"] == "n/a (remote)" and figures["backend"].startswith("remote 127.0.0.1:")
    assert figures["finish_reason"] in ("stop", "length")


def test_stop_ends_the_answer_and_frees_the_servers_slot(engine, server):
    cancel = threading.Event()
    answer = engine.answer(COUNTING, GREEDY, 300, engine.model(), cancel)
    pieces = []
    for piece in answer:
        pieces.append(piece)
        if len(pieces) == 2:
            cancel.set()
    assert len(pieces) == 2 and answer.figures.finish_reason == "cancelled"
    deadline = time.monotonic() + LIVE_S  # a liveness guard: the slot is freed, whenever
    while httpx.get(server.url + "/health").json()["slots_processing"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(server.url + "/health").json()["slots_processing"] == 0


@pytest.mark.slow
def test_continue_writes_more_of_an_answer_cut_short(engine):
    """vLLM's continue_final_message, which the SpecChat server also takes: the window's Continue on a remote chat."""
    model = engine.model()
    whole = "".join(engine.answer(COUNTING, GREEDY, 40, model))
    short = engine.answer(COUNTING, GREEDY, 12, model)
    start = "".join(short)
    assert short.figures.finish_reason == "length" and whole.startswith(start)
    more = "".join(
        engine.answer(COUNTING + [{"role": "assistant", "content": start}], GREEDY, 28, model, continue_last=True)
    )
    assert more and whole.startswith(start + more[:10])  # greedy: it goes on as the whole answer did


def test_a_wrong_key_a_wrong_model_and_no_server_get_clear_messages(server):
    with pytest.raises(EngineError, match="refused the API key"):
        RemoteEngine(Endpoint(server.url, "", "wrong")).models()
    with pytest.raises(EngineError, match="does not serve “gpt-9”; it serves smollm2"):
        RemoteEngine(Endpoint(server.url, "gpt-9", "right-key")).model()
    with pytest.raises(EngineError, match="Could not reach"):
        RemoteEngine(Endpoint("http://127.0.0.1:9")).models()


# --- vLLM's formats ---------------------------------------------------------------------------------
# Exposition text as vLLM writes it (docs/usage/metrics.md; the spec-decode counters of
# vllm/v1/spec_decode/metrics.py, one series per engine, the per-position one labelled position="j").
VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="Qwen/Qwen2.5-1.5B"}} {running}
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="Qwen/Qwen2.5-1.5B"}} {finished}
vllm:request_success_total{{engine="0",finished_reason="length",model_name="Qwen/Qwen2.5-1.5B"}} 0.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="Qwen/Qwen2.5-1.5B"}} {drafts}
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="Qwen/Qwen2.5-1.5B"}} {draft_tokens}
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="Qwen/Qwen2.5-1.5B"}} {accepted}
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="Qwen/Qwen2.5-1.5B",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="Qwen/Qwen2.5-1.5B",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="Qwen/Qwen2.5-1.5B",position="2"}} {p2}
vllm:iteration_tokens_total_bucket{{le="1.0",model_name="Qwen/Qwen2.5-1.5B"}} 3.0
"""


def metrics_text(**counts) -> str:
    values = dict(running=0.0, finished=0.0, drafts=0.0, draft_tokens=0.0, accepted=0.0, p0=0.0, p1=0.0, p2=0.0)
    values.update(counts)
    return VLLM_METRICS.format(**values)


def test_vllm_metrics_parse_and_difference_into_one_answers_acceptance():
    before = prometheus.SpecCounters.from_text(
        metrics_text(finished=5.0, drafts=100.0, draft_tokens=300.0, accepted=150.0, p0=80.0, p1=45.0, p2=25.0)
    )
    after = prometheus.SpecCounters.from_text(
        metrics_text(finished=6.0, drafts=110.0, draft_tokens=330.0, accepted=171.0, p0=89.0, p1=52.0, p2=30.0)
    )
    moved = prometheus.delta(before, after)
    assert (moved.drafts, moved.drafted, moved.accepted) == (10, 30, 21) and moved.alone
    assert moved.per_position_acceptance == pytest.approx([0.9, 0.7, 0.5])
    assert moved.mean_acceptance_length == pytest.approx(3.1)
    busy = prometheus.SpecCounters.from_text(metrics_text(running=2.0, finished=5.0))
    assert prometheus.delta(busy, after).alone is False and "uncertain" in prometheus.delta(busy, after).note()
    assert prometheus.delta(prometheus.SpecCounters.from_text("vllm:num_requests_running 0\n"), after) is None


class FakeVllm:
    """vLLM's OpenAI server as its docs describe it (chunks with choices[].delta, reasoning_content, usage in a
    last chunk when asked, per-request metrics.speculative_decoding only when started with
    --per-request-spec-decode-metrics, /metrics counters moving as it answers). It cannot run here without a
    GPU; this stands in for it so the client's vLLM path runs."""

    def __init__(self, per_request: bool, cut: bool = False):
        self.per_request = per_request
        self.cut = cut  # the stream ends after two pieces, with neither a finish reason nor [DONE]
        self.counts = dict(finished=0.0, drafts=0.0, draft_tokens=0.0, accepted=0.0, p0=0.0, p1=0.0, p2=0.0)

    def app(self) -> Starlette:
        async def models(request):
            return JSONResponse(
                {"object": "list", "data": [{"id": "Qwen/Qwen2.5-1.5B", "object": "model", "max_model_len": 32768}]}
            )

        async def tokenize(request):
            body = await request.json()
            return JSONResponse({"count": 7 * len(body["messages"]), "max_model_len": 32768, "tokens": [1] * 7})

        async def metrics(request):
            return PlainTextResponse(metrics_text(**self.counts))

        async def chat(request):
            body = await request.json()

            def chunk(delta=None, usage=None, finish=None, **extra):
                out = {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "model": body["model"],
                    "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                return "data: " + json.dumps({**out, **({"usage": usage} if usage else {}), **extra}) + "\n\n"

            def events():
                yield chunk({"role": "assistant", "content": ""})
                yield chunk({"reasoning_content": "Counting."})
                for i, text in enumerate(["1, ", "2, ", "3"], start=1):
                    if self.cut and i == 3:
                        return
                    yield chunk({"content": text}, usage={"prompt_tokens": 7, "completion_tokens": 2 * i})
                self.counts.update(
                    finished=self.counts["finished"] + 1,
                    drafts=self.counts["drafts"] + 4,
                    draft_tokens=self.counts["draft_tokens"] + 12,
                    accepted=self.counts["accepted"] + 6,
                    p0=self.counts["p0"] + 3,
                    p1=self.counts["p1"] + 2,
                    p2=self.counts["p2"] + 1,
                )
                yield chunk({}, finish="stop")
                extra = {
                    "metrics": {
                        "speculative_decoding": {
                            "mean_acceptance_length": 2.5,
                            "num_draft_tokens": 12,
                            "num_accepted_draft_tokens": 6,
                            "num_spec_steps": 4,
                        }
                    }
                }
                yield chunk(usage={"prompt_tokens": 7, "completion_tokens": 6}, **(extra if self.per_request else {}))
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/tokenize", tokenize, methods=["POST"]),
                Route("/metrics", metrics),
                Route("/v1/chat/completions", chat, methods=["POST"]),
            ]
        )


def serve_fake_vllm(per_request: bool = False, cut: bool = False, tls: tuple[str, str] | None = None):
    """(the stand-in vLLM on a free port, its uvicorn server, its thread); tls: (key file, certificate file)."""
    import uvicorn

    from engine.serving.service import listen

    sock = listen("127.0.0.1", 0)
    ssl = {"ssl_keyfile": tls[0], "ssl_certfile": tls[1]} if tls else {}
    server = uvicorn.Server(uvicorn.Config(FakeVllm(per_request, cut).app(), log_level="warning", **ssl))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return f"{'https' if tls else 'http'}://127.0.0.1:{sock.getsockname()[1]}", server, thread


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_is_verified_a_self_signed_certificate_is_refused(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    url, server, thread = serve_fake_vllm(tls=(str(key), str(cert)))
    try:
        with pytest.raises(EngineError, match="certificate could not be verified"):
            RemoteEngine(Endpoint(url)).models()
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("per_request", [True, False])
def test_vllm_answers_with_acceptance_from_its_per_request_metrics_or_its_counters(per_request):
    url, server, thread = serve_fake_vllm(per_request)
    try:
        engine = RemoteEngine(Endpoint(url))
        model = engine.model()
        assert (model.id, model.n_ctx) == ("Qwen/Qwen2.5-1.5B", 32768)
        assert engine.count_prompt(COUNTING, model).tokens == 7
        answer = engine.answer(COUNTING, GREEDY, 32, model)
        assert "".join(answer) == "<think>Counting.</think>1, 2, 3"
        f = answer.figures.to_dict()
        assert (f["generated"], f["prompt_tokens"], f["drafted"], f["accepted"]) == (6, 7, 12, 6)
        if per_request:
            assert f["mean_acceptance_length"] == 2.5 and "per-request metrics" in f["acceptance_source"]
        else:
            assert f["mean_acceptance_length"] == pytest.approx(2.5)
            assert f["per_position_acceptance"] == pytest.approx([0.75, 0.5, 0.25])
            assert f["acceptance_source"] == ("from the server's /metrics counters; no other request ran meanwhile")
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_stream_cut_short_is_an_error_that_keeps_the_text_so_far():
    url, server, thread = serve_fake_vllm(cut=True)
    try:
        engine = RemoteEngine(Endpoint(url))
        answer = engine.answer(COUNTING, GREEDY, 32, engine.model())
        pieces = []
        with pytest.raises(EngineError, match="ended the answer without finishing it"):
            for piece in answer:
                pieces.append(piece)
        assert "".join(pieces) == "<think>Counting.</think>1, 2, " and answer.figures.generated == 4
    finally:
        server.should_exit = True
        thread.join(10)


# --- a server that misbehaves ------------------------------------------------------------------------------
CHAT = "POST /v1/chat/completions"
HUGE = 64 * MIB  # what a hostile route sends at most: the 200 MB, cut short (the client stops far sooner)
BLOCK = 64 << 10
LIVE_S = 60  # a liveness guard: how long a wait for what must happen may last before the test fails


def collect(answer) -> tuple[list[str], EngineError | None]:
    """The answer's pieces, and the EngineError that ended it (None where it finished)."""
    pieces = []
    try:
        for piece in answer:
            pieces.append(piece)
    except EngineError as exc:
        return pieces, exc
    return pieces, None


def hostile_answer(server: HostileServer, max_tokens: int = 64, cancel=None, **engine_options):
    engine = RemoteEngine(Endpoint(server.url), **engine_options)
    return engine.answer(COUNTING, GREEDY, max_tokens, RemoteModel("hostile", None), cancel)


def measured(call):
    """(call's result, the most memory Python held meanwhile above what it held before)."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        out = call()
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


class StepClock:
    """A clock of the test's own for the client's deadlines: 0 s at its first read, then `step` seconds later at each
    read after it (the client reads it once each time it checks a deadline, so a deadline passes at a known check)."""

    def __init__(self, step: float):
        self.step, self.reads = step, []

    def read(self) -> float:
        self.reads.append(len(self.reads) * self.step)
        return self.reads[-1]


def test_a_line_without_an_end_is_given_up_at_1_mib_and_the_text_so_far_kept():
    def endless_line(conn):
        conn.head()
        conn.send(event({"content": "Hello"}))
        conn.send(b'data: {"choices": [{"delta": {"content": "')
        for _ in range(HUGE // BLOCK):
            if not conn.send(b"x" * BLOCK):
                return

    with HostileServer({CHAT: endless_line}) as server:
        (pieces, error), peak = measured(lambda: collect(hostile_answer(server)))
        assert server.last(CHAT).gone.wait(LIVE_S)  # the client went before the route sent its last byte
    assert pieces == ["Hello"] and error is not None and "sent a line over 1 MiB" in str(error)
    assert "the text so far is kept" in str(error)
    assert server.last(CHAT).sent < 12 * MIB and peak < 16 * MIB  # not the 64 MiB sent at most


def test_a_huge_error_body_is_read_to_64_kib_and_shown_in_a_few_hundred_characters():
    def huge_error(conn):
        conn.head(500, "application/json", HUGE)
        conn.send(b'{"error": {"message": "')
        for _ in range(HUGE // BLOCK):
            if not conn.send((b"out of memory " * (BLOCK // 14 + 1))[:BLOCK]):
                return

    with HostileServer({CHAT: huge_error, "GET /v1/models": huge_error}) as server:
        (_pieces, error), peak = measured(lambda: collect(hostile_answer(server)))
        with pytest.raises(EngineError) as listing:
            RemoteEngine(Endpoint(server.url)).models()
        sent = [conn.sent for conn in server.conns[CHAT] + server.conns["GET /v1/models"]]
    for message in (str(error), str(listing.value)):
        assert "answered HTTP 500: " in message and len(message) < 450, message  # the body was no JSON: raw text
    assert max(sent) < 12 * MIB and peak < 16 * MIB


def test_huge_metrics_are_read_to_8_mib_and_too_many_series_are_not_parsed(monkeypatch):
    def million_series(conn):
        conn.head(200, "text/plain")
        conn.send(metrics_text(drafts=1.0, draft_tokens=3.0).encode())  # the counters, then 1M series more
        for start in range(0, 1_000_000, 10_000):
            lines = "".join(
                f'vllm:iteration_tokens_total_bucket{{le="{i}",model_name="m"}} 1.0\n'
                for i in range(start, start + 10_000)
            )
            if not conn.send(lines.encode()):
                return

    parsed = []  # the lengths of the texts parsed
    real_parse = prometheus.parse
    monkeypatch.setattr(
        prometheus, "parse", lambda text, *a, **k: parsed.append(len(text)) or real_parse(text, *a, **k)
    )
    with HostileServer({"GET /metrics": million_series}) as server:
        counters, peak = measured(RemoteEngine(Endpoint(server.url)).spec_counters)
        sent = server.last("GET /metrics").sent
    assert counters is None and parsed == [] and sent < 20 * MIB and peak < 40 * MIB  # refused at 8 MiB, unparsed
    monkeypatch.undo()
    many = "".join(f'vllm:spec_decode_num_draft_tokens_total{{engine="{i}"}} 1\n' for i in range(20_000))
    with pytest.raises(ValueError, match="more than 10,000 series"):
        prometheus.SpecCounters.from_text(many)
    long_line = 'vllm:spec_decode_num_draft_tokens_total{model_name="' + "x" * 100_000 + '"} 1\n'
    assert not prometheus.SpecCounters.from_text(long_line).speculates  # skipped unread


@pytest.mark.slow
def test_a_listing_of_100000_models_is_cut_to_1000_and_a_missing_model_named_in_a_short_message():
    many = {"object": "list", "data": [{"id": f"org/model-{i:06d}", "object": "model"} for i in range(100_000)]}
    too_many = {"object": "list", "data": many["data"] * 3}  # 13 MB of JSON
    with HostileServer({"GET /v1/models": lambda conn: conn.json(many)}) as server:
        assert len(RemoteEngine(Endpoint(server.url)).models()) == 1000
        assert RemoteEngine(Endpoint(server.url, "org/model-099999")).model().id == "org/model-099999"
        with pytest.raises(EngineError) as missing:
            RemoteEngine(Endpoint(server.url, "gpt-9")).model()
    message = str(missing.value)
    assert message.startswith(f"{server.url} does not serve “gpt-9”; it serves org/model-000000, ")
    assert " more." in message and len(message) < 450, message
    with (
        HostileServer({"GET /v1/models": lambda conn: conn.json(too_many)}) as server,
        pytest.raises(EngineError, match="answered more than 8 MiB"),
    ):
        RemoteEngine(Endpoint(server.url)).models()


@pytest.mark.slow
def test_a_quick_call_ends_at_its_deadline_though_bytes_trickle_in(monkeypatch):
    def trickled_models(conn):
        body = json.dumps({"data": [{"id": "hostile"}]}).encode()
        conn.head(200, "application/json", len(body))
        for byte in body:
            if not conn.send(bytes([byte])) or not conn.wait(0.2):
                return

    monkeypatch.setattr(client, "QUICK_TIMEOUT_S", 1.0)
    clock = StepClock(0.4)  # the deadline set at 0 s; each byte that comes is checked 0.4 s later on this clock
    for module in (client, reading):
        monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=clock.read))
    with HostileServer({"GET /v1/models": trickled_models}) as server:
        with pytest.raises(EngineError, match="did not answer within 1 s"):
            RemoteEngine(Endpoint(server.url)).models()
        # Given up at the first check past the deadline (its third read of the body), not before, while bytes
        # still came: the server was still sending when the client went.
        assert clock.reads == [k * 0.4 for k in range(4)], clock.reads
        assert server.last("GET /v1/models").gone.wait(LIVE_S)


def test_an_answer_ends_here_at_max_tokens_and_a_margin_whatever_the_server_sends():
    def endless(conn):
        conn.head()
        for i in range(10_000):
            if not conn.send(event({"content": f"{i} "})):
                return
        conn.send(event({}, finish="stop") + DONE)

    def one_huge_delta(conn):
        conn.head()
        conn.send(event({"content": "x" * 900_000}) + event({}, finish="stop") + DONE)

    with HostileServer({CHAT: endless}) as server:
        answer = hostile_answer(server, max_tokens=64)
        pieces, error = collect(answer)
        assert server.last(CHAT).gone.wait(LIVE_S)  # the response closed here, not read to its end
    assert error is None and 64 < len(pieces) <= 64 + 16 and answer.figures.finish_reason == "length"
    with HostileServer({CHAT: one_huge_delta}) as server:
        answer = hostile_answer(server, max_tokens=64)
        pieces, error = collect(answer)
    assert error is None and len("".join(pieces)) == (64 + 16) * 64 and answer.figures.finish_reason == "length"


def hello_then(after):
    """A route: headers, one piece of text, then after(conn)."""

    def route(conn):
        conn.head()
        conn.send(event({"role": "assistant", "content": ""}) + event({"content": "Hello"}))
        after(conn)

    return route


def silent(conn):
    conn.wait(10)  # ends early once the client goes


def trickle(conn, every_s: float = 0.5):
    """A byte every every_s: a whole event about every 50 bytes."""
    for byte in event({"content": " world"}) * 4:
        if not conn.send(bytes([byte])) or not conn.wait(every_s):
            return


@pytest.mark.parametrize("after", [silent, trickle], ids=["silent", "a-byte-at-a-time"])
def test_stop_ends_the_answer_without_waiting_on_the_server_whatever_it_does(after):
    with HostileServer({CHAT: hello_then(after)}) as server:
        cancel = threading.Event()
        answer = hostile_answer(server, cancel=cancel)
        pieces = []
        for piece in answer:
            pieces.append(piece)
            if len(pieces) == 1:
                threading.Timer(0.3, cancel.set).start()  # while the client waits on a silent or trickling server
        # The client closed the connection while the server still held it (silent for 10 s, or a byte every 0.5 s
        # with no whole event for 25 s): Stop waited on nothing the server did, and a real server frees the slot.
        assert server.last(CHAT).gone.wait(LIVE_S), "the answer ended only when the server did"
    assert pieces == ["Hello"] and answer.figures.finish_reason == "cancelled"


@pytest.mark.slow
def test_an_answer_with_no_new_event_for_the_deadline_fails_though_bytes_trickle_in(monkeypatch):
    feeds = []  # per read of the stream: how many events it completed

    class CountedStream(EventStream):
        def feed(self, data: bytes) -> list[str]:
            events = super().feed(data)
            feeds.append(len(events))
            return events

    # The answer's clock moves a quarter second with each read of bytes, whatever they hold, and not otherwise.
    monkeypatch.setattr(answer_stream, "EventStream", CountedStream)
    monkeypatch.setattr(answer_stream, "time", SimpleNamespace(perf_counter=lambda: 0.25 * len(feeds)))
    with HostileServer({CHAT: hello_then(lambda conn: trickle(conn, every_s=0.2))}) as server:
        pieces, error = collect(hostile_answer(server, read_timeout_s=1.0))
        assert server.last(CHAT).gone.wait(LIVE_S)  # given up while the server still trickled
    assert pieces == ["Hello"] and error is not None and "sent nothing new for 1 s" in str(error)
    # Given up at the fifth read with no new event (1.25 s after the last one), not at the fourth (1 s): bytes that
    # make no event do not put the deadline off, and the deadline is not sooner than read_timeout_s.
    last_event = max(i for i, events in enumerate(feeds) if events)
    assert len(feeds) - 1 - last_event == 5, feeds


def test_server_sent_events_are_parsed_as_their_spec_says():
    """Lines end at CR, LF or CRLF only: U+2028, U+2029 and U+0085 in a JSON string are text. Comments, a BOM,
    data over two lines, line ends split between reads."""

    def route(conn):
        conn.head()
        for part in (
            b"\xef\xbb\xbf: a comment, as servers ping\n\n",
            event({"content": "a\u2028b"}),
            event({"content": "c\u0085d\u2029e"}, end=b"\r\n\r\n"),
            event({"content": "f"}, end=b"\r\r"),
            b'data: {"choices": [{"index": 0,\ndata: "delta": {"content": "g"}}]}\n\n',
            event({"content": "h"}, end=b"\r"),
            b"\n\r\n",
            b"event: ignored\nid: 1\n",
            event({}, finish="stop"),
            DONE,
        ):
            conn.send(part)
            time.sleep(0.01)  # each its own read

    with HostileServer({CHAT: route}) as server:
        answer = hostile_answer(server)
        pieces, error = collect(answer)
    assert error is None and "".join(pieces) == "a\u2028bc\u0085d\u2029efgh" and answer.figures.finish_reason == "stop"
    first = event({"content": "x\u2028y"}, end=b"\r\n\r\n")
    stream, events = first + b"data: [DONE]\r\n\r\n", EventStream(MIB)
    assert [e for b in range(len(stream)) for e in events.feed(stream[b : b + 1])] == [
        first[6:-4].decode(),
        "[DONE]",
    ]  # fed a byte at a time
    pings = EventStream(max_total=1000)
    with pytest.raises(ValueError, match="more than 1,000 bytes"):  # no events, only pings: not for ever
        for _ in range(200):
            pings.feed(b": ping\n")
    with pytest.raises(ValueError, match="an event over 1 MiB"):  # data lines that never end their event
        EventStream(max_total=16 * MIB).feed(b"data: x\n" * MIB)


def test_a_content_that_is_not_text_is_a_clear_error_and_null_is_none():
    said = {}

    def route(conn):
        conn.head()
        conn.send(
            event({"role": "assistant", "content": None})
            + event({"content": "Hello"})
            + event({"content": said["content"]})
            + event({}, finish="stop")
            + DONE
        )

    with HostileServer({CHAT: route}) as server:
        for content, kind in (
            (42, "a number"),
            (["x"], "a list"),
            ({"text": "x"}, "an object"),
            (True, "true or false"),
            (None, None),
        ):
            said["content"] = content
            pieces, error = collect(hostile_answer(server))
            assert pieces == ["Hello"]
            if kind is None:
                assert error is None
            else:
                assert f"delta content was {kind}, not text" in str(error) and "text so far is kept" in str(error)


# --- llama-server ---------------------------------------------------------------------------------
SERVER = os.environ.get("SPECCHAT_LLAMA_SERVER")


@pytest.mark.skipif(not (SERVER and Path(SERVER).exists()), reason="set SPECCHAT_LLAMA_SERVER to a llama-server binary")
def test_llama_server_streams_stops_counts_and_reports_its_drafts():
    from engine.measure.versus_server import LlamaServer

    llama = LlamaServer(SERVER, str(embedded_model_path()), ["--spec-type", "ngram-simple"], threads=2)
    try:
        engine = RemoteEngine(Endpoint(f"http://127.0.0.1:{llama.port}"))
        model = engine.model()
        count = engine.count_prompt(COPY, model)
        assert count.exact and count.tokens > 20 and count.n_ctx == model.n_ctx
        passage = [
            {
                "role": "user",
                "content": COPY[0]["content"].replace(
                    "itself.",
                    "itself. For ninety years its keepers climbed one hundred and twelve steps every evening.",
                ),
            }
        ]
        answer = engine.answer(passage, GREEDY, 48, model)  # (llama-server leaves draft_n out when it drafted none)
        text = "".join(answer)
        f = answer.figures.to_dict()
        assert "lighthouse" in text and f["generated"] > 10 and f["tokens_per_s"] > 0
        assert f["drafted"] > 0 and f["accepted"] <= f["drafted"] and "timings" in f["acceptance_source"]
        cancel = threading.Event()
        stopped = engine.answer(COUNTING, GREEDY, 300, model, cancel)
        for i, _ in enumerate(stopped):
            if i == 1:
                cancel.set()
        assert stopped.figures.finish_reason == "cancelled"
    finally:
        llama.close()


# --- the experiment against running servers ------------------------------------------------------------
@pytest.mark.slow
def test_a_level_against_a_server_stays_full_until_its_last_request_is_answered(server):
    """The remote lab's cells, as the local lab's levels: a client done with its requests sends fillers until every
    client is, the last cut short (and ended by the server); their tokens count in the aggregate."""
    import argparse
    import asyncio

    from engine.lab.serve_cell import run_cell

    n = 160
    args = argparse.Namespace(
        endpoint="chat", requests=1, max_tokens=n, temperature=0.0, seed=1, ignore_eos=True, api_key="right-key"
    )
    prompts = [COPY[0]["content"], COUNTING[0]["content"]]  # lookup ends the copy first
    cell = asyncio.run(run_cell(server.url, prompts, 2, args, keep_full=True))
    assert cell["requests"] == 2 and not cell["errors"] and cell["completion_tokens"] == 2 * n
    assert cell["filler_requests"] >= 1 and 0 <= cell["filler_tokens"] < n * cell["filler_requests"]
    assert cell["aggregate_tokens_per_s"] * cell["wall_s"] == pytest.approx(2 * n + cell["filler_tokens"])
    assert cell["full_tokens_per_s"] > cell["aggregate_tokens_per_s"]  # prefills left out
    # the filler cut short is ended on the server at once (left running, it had up to 160 tokens to go)
    assert httpx.get(server.url + "/health").json()["slots_processing"] <= 1
    time.sleep(0.3)
    assert httpx.get(server.url + "/health").json()["slots_processing"] == 0
    alone = asyncio.run(run_cell(server.url, prompts, 2, args))
    assert alone["filler_requests"] == alone["filler_tokens"] == 0 and alone["completion_tokens"] == 2 * n


@pytest.mark.slow
def test_the_lab_runs_against_servers_through_serve_benchs_path_with_the_crossover(tmp_path, server, monkeypatch):
    """engine.lab --engine-url: plain and lookup SpecChat servers (a real model each), and a vLLM whose acceptance
    comes from its /metrics counters, measured through serve_bench's path into the lab's own results document,
    summary (with where speculation stops paying) and plot."""
    from engine.lab.cli import main as lab

    plain, plain_model = specchat_server(plain=True)
    vllm_url, vllm, vllm_thread = serve_fake_vllm()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "copy", "prompt": COPY[0]["content"]}) + "\n")
    monkeypatch.setenv("LAB_KEY", "right-key")
    try:
        assert (
            lab(
                [
                    "--engine-url",
                    f"none={plain.url}",
                    "--engine-url",
                    f"lookup={server.url}",
                    "--engine-url",
                    f"vllm={vllm_url}",
                    "--api-key-env",
                    "LAB_KEY",
                    "--concurrency",
                    "1,2",
                    "--prompts",
                    str(prompts),
                    "--max-tokens",
                    "24",
                    "--out",
                    str(tmp_path / "out"),
                ]
            )
            == 0
        )
    finally:
        plain.stop()
        plain_model.close()
        vllm.should_exit = True
        vllm_thread.join(10)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["schema"] == "specchat-lab/1" and results["env"]["remote"]
    assert "right-key" not in (tmp_path / "out" / "results.json").read_text()
    cells = {(c["method"], c["concurrency"]): c for c in results["cells"]}
    assert set(cells) == {(m, n) for m in ("none", "lookup", "vllm") for n in (1, 2)}
    assert all(c["aggregate_tokens_per_s"] > 0 and not c["errors"] and c["e2e_p50_s"] > 0 for c in cells.values())
    assert all(c["requests"] == c["concurrency"] for c in cells.values())  # one prompt: each client sends it once
    # Picked as the local lab's repeats are (engine.lab.crossover.least_disturbed), every run's figures kept beside the pick.
    assert all(c["repeats"] == 1 and c["full_tokens_per_s_runs"] == [c["full_tokens_per_s"]] for c in cells.values())
    assert cells[("lookup", 1)]["acceptance_source"] == "timings" and cells[("none", 1)]["acceptance_source"] is None
    assert cells[("lookup", 1)]["drafted"] > 0 and cells[("lookup", 1)]["per_request_tokens_per_s"] > 0
    assert cells[("vllm", 2)]["acceptance_source"] == "/metrics" and cells[("vllm", 2)]["acceptance_rate"] == 0.5
    assert set(results["crossover"]) == {"lookup", "vllm"} and results["advice"]["settings"] == {}
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| lookup | 2 |" in summary and "## Crossover" in summary and "- prompt lookup: " in summary
    assert "On the servers (none http://127.0.0.1:" in summary and "nothing here to apply" in summary
    assert (tmp_path / "out" / "plot.png").stat().st_size > 10_000
