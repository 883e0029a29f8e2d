"""Fuzz: the server's request parser (engine/serving). A body, whatever bytes it is, becomes a request or an
ApiError with a 4xx status (the client's fault, said in OpenAI's error body): never another exception, which the
server would answer with a 500. A request that parses is whole: every text in it is UTF-8 text the tokenizer can
take (a lone surrogate from a JSON escape would fail there, as a 500), its numbers are in range."""

import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.decoding.sampling import SamplingParams
from engine.serving.api_schema import ApiError, Generation, parse_generation, parse_messages, parse_prompt
from engine.serving.fill_in_middle import MAX_EXTRA_CHUNKS, MAX_FILENAME_CHARS, Infill, parse_infill, parse_suffix
from engine.serving.request_body import parse_json  # the body's JSON, read as the server reads it

from support.fuzz_watchdog import bounded

N_CTX = 2048
FUZZ = settings.get_profile("specchat-fuzz")

# Text as hostile as JSON can carry: lone surrogates, controls, bidi overrides, NUL, huge runs.
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=40),  # lone surrogates
    st.sampled_from(["\ud800", "a\udfffb", "\u202e\u2066x", "\x00", "\ufeff", "𝕏" * 3, "\r\n\u2028", ""]),
    st.sampled_from([1_025, 200_000]).map(lambda n: "x" * n),  # past a stop string's bound; a big prompt
)
numbers = st.one_of(
    st.integers(), st.integers(-(2**70), 2**70), st.just(10**400), st.floats(allow_nan=True), st.booleans(), st.none()
)
json_leaf = st.one_of(st.none(), st.booleans(), numbers, hostile_text)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(hostile_text, inner, max_size=5)),
    max_leaves=8,
)

FIELDS = [
    "model",
    "messages",
    "prompt",
    "content",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "best_of",
    "logprobs",
    "echo",
    "suffix",
    "tools",
    "functions",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "ignore_eos",
    "continue_final_message",
    "add_special",
    "input_prefix",  # /infill's (fill_in_middle.py)
    "input_suffix",
    "input_extra",
    "n_predict",
]
message = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user", "assistant", "tool", ""]),
            "content": st.one_of(
                hostile_text,
                st.none(),
                json_value,
                st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": hostile_text}), max_size=3),
            ),
        }
    ),
    json_value,
)
field_values = {
    "messages": st.one_of(st.lists(message, max_size=4), json_value),
    "prompt": st.one_of(hostile_text, st.lists(hostile_text, max_size=2), json_value),
    "stop": st.one_of(hostile_text, st.lists(hostile_text, max_size=6), json_value),
    "suffix": st.one_of(hostile_text, json_value),
    "input_prefix": st.one_of(hostile_text, json_value),
    "input_suffix": st.one_of(hostile_text, json_value),
    "input_extra": st.one_of(
        st.lists(
            st.fixed_dictionaries({}, optional={"text": st.one_of(hostile_text, json_leaf), "filename": json_leaf}),
            max_size=3,
        ),
        json_value,
    ),
    "stream_options": st.one_of(
        st.fixed_dictionaries({}, optional={"include_usage": json_leaf, "continuous_usage_stats": json_leaf}),
        json_value,
    ),
}
body = st.fixed_dictionaries({}, optional={k: field_values.get(k, st.one_of(numbers, json_value)) for k in FIELDS})


class Deep:
    """A body nested n deep (a list's or an object's brackets), shown by its recipe: a failure prints that, not
    the body's hundreds of kB."""

    def __init__(self, n: int, kind: str, wrapped: bool = False):
        self.n, self.kind, self.wrapped = n, kind, wrapped

    def __repr__(self) -> str:
        return f"Deep({self.n}, {self.kind!r}, wrapped={self.wrapped})"

    def bytes(self) -> bytes:
        n = self.n
        body = (b"[" * n + b"]" * n) if self.kind == "list" else (b'{"a":' * n + b"1" + b"}" * n)
        return b'{"messages":' + body + b"}" if self.wrapped else body


raw_bytes = st.one_of(
    st.binary(max_size=200),
    st.builds(Deep, st.integers(1, 200_000), st.sampled_from(["list", "dict"]), st.booleans()),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b'"x"',
            b"NaN",
            b'{"temperature": NaN}',
            b"\xff\xfe{}",
            b'{"a":1}x',
            b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
            b"\x00" * 10,
            b'{"temperature": 1' + b"0" * 400 + b"}",
            b'{"seed": 1' + b"0" * 5000 + b"}",
        ]
    ),
)


def encoded(obj) -> bytes:
    """JSON as a client may send it: lone surrogates as \\u escapes (ensure_ascii), NaN as NaN."""
    return json.dumps(obj, ensure_ascii=True).encode("ascii")


def parse_request(raw: bytes, chat: bool):
    """What openai_api's handlers do with a body before any model work: read_body, then the fields."""
    body = parse_json(raw)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model': expected a string", param="model")
    gen = parse_generation(body, N_CTX)
    suffix = parse_suffix(body, chat)
    utf8(suffix)
    if chat:
        continuing = body.get("continue_final_message") is True
        return gen, parse_messages(body, answering=not continuing)
    return gen, parse_prompt(body)


def check_infill(infill: Infill) -> None:
    for text in (infill.prefix, infill.suffix, infill.prompt):
        utf8(text)
    assert len(infill.extra) <= MAX_EXTRA_CHUNKS
    for chunk in infill.extra:
        utf8(chunk.text)
        utf8(chunk.filename)
        assert len(chunk.filename) <= MAX_FILENAME_CHARS


def utf8(text: str) -> None:
    text.encode("utf-8")  # raises UnicodeEncodeError for a lone surrogate: the tokenizer would, as a 500


def check_whole(gen: Generation, what) -> None:
    assert isinstance(gen.sampling, SamplingParams)
    for value in (gen.sampling.temperature, gen.sampling.top_p, gen.sampling.min_p):
        assert isinstance(value, float) and math.isfinite(value)
    assert gen.max_tokens is None or 1 <= gen.max_tokens < N_CTX
    assert all(isinstance(s, str) and s for s in gen.stop)
    for s in gen.stop:
        utf8(s)
    if isinstance(what, str):
        assert what
        utf8(what)
    else:
        assert what and all(m["role"] in ("system", "user", "assistant") for m in what)
        for m in what:
            utf8(m["content"])


def expect_request_or_4xx(raw: bytes) -> None:
    for chat in (True, False):
        try:
            with bounded("the request parser"):
                gen, what = parse_request(raw, chat)
        except ApiError as exc:
            assert 400 <= exc.status < 500, exc.status
            json.dumps(exc.body())  # the error body itself can be sent
            continue
        check_whole(gen, what)
    try:  # /infill's body
        with bounded("the infill parser"):
            infill, gen = parse_infill(parse_json(raw), N_CTX)
    except ApiError as exc:
        assert 400 <= exc.status < 500, exc.status
        json.dumps(exc.body())
        return
    check_infill(infill)
    check_whole(gen, "x")


@settings(FUZZ, max_examples=150)
@given(body)
@example({"temperature": 10**400})
@example({"messages": [{"role": "user", "content": "\ud800"}]})
@example({"prompt": "a\udfffb"})
@example({"stop": ["\udc80"], "prompt": "x"})
@example({"prompt": "x", "suffix": "\udc80"})
@example({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "c", "filename": "\ud800"}]})
def test_generated_request_bodies_parse_or_are_refused_with_a_4xx(obj):
    expect_request_or_4xx(encoded(obj))


@settings(FUZZ, max_examples=150)
@given(raw_bytes)
@example(Deep(100_000, "list"))
@example(Deep(50_000, "dict", wrapped=True))
def test_generated_raw_bytes_parse_or_are_refused_with_a_4xx(raw):
    expect_request_or_4xx(raw.bytes() if isinstance(raw, Deep) else raw)


@settings(FUZZ, max_examples=100)
@given(
    st.one_of(
        st.none(),
        st.text(max_size=30),
        st.sampled_from(["²", "1e3", "-1", " 12 ", "0x10", "9" * 4000, "\u0663", "12\x00"]),
    )
)
def test_a_generated_content_length_is_a_count_or_a_4xx(value):
    expect_length_or_4xx(value)


def test_a_content_length_of_5000_digits_is_a_4xx():
    expect_length_or_4xx("9" * 5000)


def expect_length_or_4xx(value):
    try:
        from engine.serving.request_body import declared_length
    except ImportError:  # before request_body.py: nothing to fuzz here
        return
    try:
        with bounded("the Content-Length reader"):
            n = declared_length(value)
    except ApiError as exc:
        assert 400 <= exc.status < 500
        return
    assert n is None if value is None else (isinstance(n, int) and n >= 0)
