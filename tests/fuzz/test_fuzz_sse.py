"""Fuzz: the remote engine's reading of a server's stream (engine/remote/sse.py: EventStream and parse_chunk;
answer_stream.py: RemoteAnswer's chunk reader). Whatever bytes a server sends, in whatever pieces, an answer gives text pieces and
ends, or raises EngineError (its documented error, with a message for a person): never another exception. Every
text it hands on (the pieces, the figures' texts, an error's message) is text that encodes as UTF-8, whatever
JSON escapes the server used. A well-formed stream loses nothing: its pieces are the text the server sent."""

import json
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.decoding.sampling import SamplingParams
from engine.errors import EngineError
from engine.remote import answer_stream, sse
from engine.remote.client import RemoteEngine, RemoteModel
from engine.remote.endpoint import Endpoint
from engine.remote.sse import EventStream

from support.fuzz_values import texts_in
from support.fuzz_watchdog import bounded

FUZZ = settings.get_profile("specchat-fuzz")
MAX_TOKENS = 64


class FakePump:
    """_Pump's interface over items given up front: the server's bytes as they came, then its end."""

    def __init__(self, items):
        self.items, self.before = list(items), None

    def get(self, timeout: float):
        return self.items.pop(0) if self.items else ("end", None)

    def stop(self) -> None:
        pass


@pytest.fixture(scope="module")
def engine():
    with RemoteEngine(Endpoint("http://127.0.0.1:9", model="m")) as remote:  # never connected to
        yield remote


def run_answer(engine, items) -> tuple[list[str], answer_stream.RemoteFigures, EngineError | None]:
    answer = engine.answer([{"role": "user", "content": "hi"}], SamplingParams(), MAX_TOKENS, RemoteModel("m", None))
    pieces, error = [], None
    with mock.patch.object(answer_stream, "_Pump", lambda _engine, _body: FakePump(items)), bounded("the SSE client"):
        try:
            for piece in answer:
                pieces.append(piece)
        except EngineError as exc:
            error = exc
    return pieces, answer.figures, error


def check_utf8(pieces, figures, error) -> None:
    for piece in pieces:
        assert isinstance(piece, str)
        piece.encode("utf-8")
    for text in texts_in(figures.to_dict()):
        text.encode("utf-8")
    if error is not None:
        str(error).encode("utf-8")


# --- generated streams ----------------------------------------------------------------------------
hostile_text = st.one_of(
    st.text(max_size=20),
    st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=20),
    st.sampled_from(["\ud800", "a\udfffb", "\u202e", "\x00", "\r\n", "\u2028", "data: x", "[DONE]"]),
)
leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), st.floats(), hostile_text)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(hostile_text, inner, max_size=3)),
    max_leaves=8,
)
delta = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "content": st.one_of(hostile_text, value),
            "reasoning_content": st.one_of(hostile_text, value),
            "reasoning": st.one_of(hostile_text, value),
            "role": value,
        },
    ),
    value,
)
choice = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "delta": delta,
            "text": value,
            "index": value,
            "finish_reason": st.one_of(st.sampled_from(["stop", "length", None, ""]), value),
        },
    ),
    value,
)
timings = st.fixed_dictionaries(
    {},
    optional={
        k: st.one_of(st.integers(-5, 10**6), value)
        for k in ("draft_n", "draft_n_accepted", "mean_acceptance_length", "predicted_n", "method")
    },
)
chunk_obj = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "choices": st.one_of(st.lists(choice, max_size=2), value),
            "usage": st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "completion_tokens": st.integers(-5, 10**6) | value,
                        "prompt_tokens": st.integers(-5, 10**6) | value,
                    },
                ),
                value,
            ),
            "timings": st.one_of(timings, value),
            "metrics": st.one_of(st.fixed_dictionaries({"speculative_decoding": st.one_of(timings, value)}), value),
            "error": st.one_of(hostile_text, st.fixed_dictionaries({"message": value}), value),
        },
    ),
    value,
)


@st.composite
def data_line(draw) -> bytes:
    obj = draw(chunk_obj)
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    raw = text.encode("utf-8", "surrogatepass")  # a server may send a surrogate's bytes raw, too
    prefix = draw(st.sampled_from([b"data: ", b"data:", b"data:  "]))
    return prefix + raw


line = st.one_of(
    data_line(),
    st.sampled_from(
        [
            b"",
            b":",
            b": ping",
            b"data: [DONE]",
            b"data:",
            b"data: {",
            b"data: null",
            b"data: []",
            b"event: error",
            b"id: 1",
            b"retry: x",
            b'data: "x"',
            b"\xef\xbb\xbfdata: {}",
            b"data: 1e999",
            b'data: {"choices": [{"delta": {"content": "\\ud800"}}]}',
            b'data: {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}',
        ]
    ),
    st.binary(max_size=60),
    st.builds(lambda n, nested: Big(n, nested), st.integers(1, sse.MAX_LINE_BYTES + 100), st.booleans()),
)


class Big(bytes):
    """A data line n bytes long (nested JSON brackets, or one long word), shown by its recipe, not its MiB."""

    def __new__(cls, n: int, nested: bool):
        line = super().__new__(cls, b"data: " + (b"[" * n + b"]" * n if nested else b"x" * n))
        line.recipe = f"Big({n}, nested={nested})"
        return line

    def __repr__(self) -> str:
        return self.recipe


line_end = st.sampled_from([b"\n", b"\r", b"\r\n", b"\n\n", b"\r\n\r\n"])


class Items(list):
    """The pump's items; shown with any long bytes cut (a failure's blob replays them whole)."""

    def __repr__(self) -> str:
        def shown(item):
            kind, value = item
            if isinstance(value, bytes) and len(value) > 400:
                return f"({kind!r}, {value[:200]!r} + <{len(value) - 200:,} more bytes>)"
            return repr(item)

        return "Items([" + ", ".join(map(shown, self)) + "])"


@st.composite
def byte_stream(draw) -> list:
    lines = draw(st.lists(st.tuples(line, line_end), max_size=12))
    raw = b"".join(a + b for a, b in lines)
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    items = [("bytes", p) for p in pieces]
    ending = draw(st.sampled_from(["end", "status", "error"]))
    if ending == "status":
        items = [("status", (draw(st.integers(100, 599)), draw(st.one_of(st.binary(max_size=80), data_line()))))]
    elif ending == "error":
        items.append(("error", draw(st.sampled_from([ConnectionError("gone"), ValueError("odd"), OSError(5, "io")]))))
    else:
        items.append(("end", None))
    return Items(items)


@settings(FUZZ, max_examples=200)
@given(byte_stream())
@example([("bytes", b'data: {"choices": [{"delta": {"content": "\\ud800"}}]}\n\n'), ("end", None)])
@example([("bytes", b'data: {"choices": [{"delta": {"reasoning_content": "\\udfff"}}]}\n\n'), ("end", None)])
@example([("bytes", b'data: {"error": "\\ud800"}\n\n'), ("end", None)])
@example(
    [
        (
            "bytes",
            b'data: {"choices": [{"finish_reason": "stop"}], "timings": {"draft_n": 1, "method": "\\ud800"}}\n\n',
        ),
        ("end", None),
    ]
)
@example([("status", (500, b'{"error": {"message": "\\ud800"}}'))])
def test_a_generated_stream_gives_utf8_text_or_an_engine_error(engine, items):
    expected_errors = (ConnectionError, ValueError, OSError)  # the transport's own, handed on by _failed
    try:
        pieces, figures, error = run_answer(engine, items)
    except expected_errors as exc:
        assert items[-1][0] == "error" and exc is items[-1][1]
        return
    check_utf8(pieces, figures, error)


# --- nothing lost ---------------------------------------------------------------------------------
@settings(FUZZ, max_examples=100)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=8), line_end, st.data())
def test_a_well_formed_stream_in_any_pieces_loses_nothing(engine, contents, end, data):
    end = end if end in (b"\n\n", b"\r\n\r\n") else end * 2
    events = [
        json.dumps(
            {"choices": [{"index": 0, "delta": {"content": c}, "finish_reason": None}]},
            ensure_ascii=data.draw(st.booleans()),
        )
        for c in contents
    ]
    events.append(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    raw = b"".join(b"data: " + e.encode("utf-8") + end for e in events) + b"data: [DONE]" + end
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))  # mid-character cuts included
    items = [("bytes", raw[a:b]) for a, b in zip([0, *cuts], [*cuts, len(raw)])] + [("end", None)]
    pieces, figures, error = run_answer(engine, items)
    assert error is None
    assert "".join(pieces) == "".join(contents)
    assert figures.finish_reason == "stop"


@settings(FUZZ, max_examples=200)
@given(st.lists(st.binary(max_size=100), max_size=10))
def test_the_event_parser_takes_any_bytes(chunks):
    events = EventStream(max_total=1 << 20)
    with bounded("EventStream"):
        for chunk in chunks:
            try:
                datas = events.feed(chunk)
            except ValueError:
                return
            for d in datas:
                assert isinstance(d, str)
                d.encode("utf-8")
                parsed = sse.parse_chunk(d)
                assert parsed is None or parsed is sse.DONE or isinstance(parsed, dict)
