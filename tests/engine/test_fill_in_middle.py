"""Fill-in-the-middle through the real server with the `openai` client and raw HTTP: `suffix` on /v1/completions
and llama-server's /infill build llama.cpp's FIM prompt from the model's own FIM tokens; a model without them (the
embedded SmolLM2 and Gemma have none) gets a 400 that says so; bad suffixes and input_extra get 400s naming the
field. A tiny real GGUF with Qwen2.5-Coder's FIM token names (llama.cpp finds them by name) serves the prompt's
shape; the real Qwen2.5-Coder 1.5B, where its pair is fetched, shows a real fill and prompt lookup copying from
the suffix."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.speculation_config import SpeculationConfig
from engine.measure.real_pair import TARGET, pair_dir
from engine.serving.fill_in_middle import MAX_EXTRA_CHUNKS, NO_FIM
from engine.serving.service import ServeOptions, Service

from support.hostile_templates import BYTES
from support.serving import serve, start
from support.tiny import write_tiny_gguf

FIM_NAMES = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
TINY_CTX = 512  # support.serving.serve's
PREFIX, SUFFIX = "w1 w2 w3", "w7 w8"


@pytest.fixture(scope="module")
def fim_gguf(tmp_path_factory):
    """A tiny real GGUF whose vocabulary has Qwen2.5-Coder's six FIM tokens (and byte tokens, so any text tokenizes)."""
    path = tmp_path_factory.mktemp("fim") / "tiny-fim.gguf"
    return write_tiny_gguf(path, tokens=BYTES, control_tokens=FIM_NAMES, complete=True, context_length=TINY_CTX)


@pytest.fixture(scope="module")
def tiny(fim_gguf):
    service, model = serve(fim_gguf)
    yield service
    service.stop()
    model.close()


@pytest.fixture(scope="module")
def tiny_client(tiny):
    return openai.OpenAI(base_url=tiny.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tiny_vocab(fim_gguf):
    model = Model(fim_gguf, vocab_only=True)
    yield model
    model.close()


def infill(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/infill", json=body, timeout=120)


def test_the_server_says_whether_its_model_fills_in_the_middle(tiny):
    meta = httpx.get(tiny.url + "/v1/models").json()["data"][0]["meta"]
    assert meta["fill_in_middle"] is True


def test_a_fim_completion_returns_text_usage_and_timings_from_llama_cpps_prompt(tiny, tiny_client, tiny_vocab):
    reply = tiny_client.completions.create(
        model="tiny", prompt=PREFIX, suffix=SUFFIX, max_tokens=6, seed=3, extra_body={"ignore_eos": True}
    )

    def tok(text):
        return tiny_vocab.tokenize(text, add_bos=False, special=False)

    pre, suf, mid = (tiny_vocab.tokenize(n, add_bos=False, special=True)[0] for n in FIM_NAMES[:3])
    # llama.cpp's PSM order, file-level (no input_extra): [BOS][FIM_PRE]prefix[FIM_SUF]suffix[FIM_MID]
    expected = [tiny_vocab.bos, pre, *tok(PREFIX), suf, *tok(SUFFIX), mid]
    assert reply.usage.prompt_tokens == len(expected)
    assert reply.usage.completion_tokens == 6 and reply.choices[0].finish_reason == "length"
    assert reply.choices[0].text  # a seeded draw of six tokens over the tiny vocabulary: byte tokens' names
    assert reply.model_extra["timings"]["predicted_n"] == 6
    # /infill with the same prefix and suffix builds the same prompt, and shows it with its control tokens.
    same = infill(tiny.url, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=6, seed=3, ignore_eos=True).json()
    assert same["tokens_evaluated"] == len(expected) and same["content"]
    assert re.fullmatch(r"<s><\|fim_prefix\|>.+<\|fim_suffix\|>.+<\|fim_middle\|>", same["prompt"], re.S)
    assert "<|repo_name|>" not in same["prompt"] and same["truncated"] is False


def test_an_empty_suffix_is_a_plain_completion(tiny, tiny_client):
    plain = tiny_client.completions.create(model="tiny", prompt=PREFIX, max_tokens=2, extra_body={"ignore_eos": True})
    empty = tiny_client.completions.create(
        model="tiny", prompt=PREFIX, suffix="", max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert empty.usage.prompt_tokens == plain.usage.prompt_tokens


def test_infill_answers_as_llama_server_does_whole_and_streamed(tiny):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 5, "seed": 11, "ignore_eos": True}
    whole = infill(tiny.url, **body)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert answer["stop"] is True and answer["model"] == "tiny" and answer["stop_type"] == "limit"
    assert answer["tokens_predicted"] == 5 and answer["tokens_evaluated"] > 5 and answer["content"]
    assert answer["timings"]["predicted_n"] == 5 and answer["generation_settings"]["n_predict"] == 5
    assert answer["has_new_line"] == ("\n" in answer["content"])
    events = []
    with httpx.stream("POST", tiny.url + "/infill", json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))  # llama-server's stream has no [DONE]
    *parts, last = events
    assert parts and all(e["stop"] is False and e["content"] for e in parts)
    assert last["stop"] is True and last["tokens_predicted"] == 5 and last["stop_type"] == "limit"
    assert last["content"] == ""  # as llama-server's last event: the text came in the events before


def test_input_extra_goes_first_and_is_cut_from_its_start_to_fit(tiny):
    small = infill(
        tiny.url,
        input_prefix=PREFIX,
        input_suffix=SUFFIX,
        input_extra=[{"filename": "util.py", "text": "w5 w6"}],
        n_predict=4,
    ).json()
    # The repo-level lines: [FIM_REP]myproject, [FIM_SEP]util.py and its text, [FIM_SEP]filename, then the FIM part.
    prompt = small["prompt"]
    assert prompt.startswith("<s><|repo_name|>") and prompt.count("<|file_sep|>") == 2
    assert prompt.index("<|file_sep|>") < prompt.index("<|fim_prefix|>") and small["truncated"] is False
    big = infill(
        tiny.url,
        input_prefix=PREFIX,
        input_suffix=SUFFIX,
        input_extra=[{"filename": f"f{i}.py", "text": "w5 " * 100} for i in range(8)],  # thousands of tokens
        n_predict=8,
    ).json()
    assert big["truncated"] is True and big["tokens_evaluated"] == TINY_CTX - 8  # filled to the answer's room
    assert "<|repo_name|>" not in big["prompt"] and big["prompt"].endswith("<|fim_middle|>")
    assert big["tokens_predicted"] >= 1


def test_a_long_prefix_is_cut_on_infill_but_refused_on_completions(tiny):
    long = "w4 " * 200  # several tokens a word on this vocabulary: beyond the context
    cut = infill(tiny.url, input_prefix=long, input_suffix=SUFFIX, n_predict=4).json()
    whole = infill(tiny.url, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=4).json()
    # Filled to the answer's room, the prefix cut from its start and the short suffix kept whole.
    assert cut["truncated"] is True and cut["tokens_evaluated"] == TINY_CTX - 4 and cut["tokens_predicted"] >= 1
    assert cut["prompt"].startswith("<s><|fim_prefix|>") and whole["truncated"] is False
    assert cut["prompt"].partition("<|fim_suffix|>")[2] == whole["prompt"].partition("<|fim_suffix|>")[2]
    refused = httpx.post(tiny.url + "/v1/completions", json={"prompt": long, "suffix": SUFFIX, "max_tokens": 4})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"


HUGE = "x" * 20_000  # more bytes than the tiny context's 512 tokens of its longest token could hold


@pytest.mark.parametrize(
    "path, body, param, says",
    [
        ("/v1/completions", {"prompt": "w1", "suffix": 42}, "suffix", "expected a string"),
        ("/v1/completions", {"prompt": "w1", "suffix": ["w2"]}, "suffix", "expected a string"),
        ("/v1/completions", {"prompt": "w1", "suffix": "\ud800"}, "suffix", "lone surrogate"),
        ("/v1/completions", {"prompt": "w1", "suffix": HUGE}, "suffix", "context can hold"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "suffix": "w2"}, "suffix", "only"),
        ("/infill", {"input_suffix": "w2"}, "input_prefix", "is required"),
        ("/infill", {"input_prefix": "w1"}, "input_suffix", "is required"),
        ("/infill", {"input_prefix": "w1", "input_suffix": "w2", "prompt": 7}, "prompt", "expected a string"),
        ("/infill", {"input_prefix": "w1", "input_suffix": "w2", "input_extra": "w3"}, "input_extra", "a list"),
        (
            "/infill",
            {"input_prefix": "w1", "input_suffix": "w2", "input_extra": [{"text": "w"}] * (MAX_EXTRA_CHUNKS + 1)},
            "input_extra",
            f"up to {MAX_EXTRA_CHUNKS}",
        ),
        (
            "/infill",
            {"input_prefix": "w1", "input_suffix": "w2", "input_extra": [{"filename": "a.py"}]},
            "input_extra[0]",
            '"text": string',
        ),
        (
            "/infill",
            {"input_prefix": "w1", "input_suffix": "w2", "input_extra": [{"text": "w3", "filename": 5}]},
            "input_extra[0].filename",
            "expected a string",
        ),
        (
            "/infill",
            {"input_prefix": "w1", "input_suffix": "w2", "input_extra": [{"text": "w3", "filename": "f" * 5000}]},
            "input_extra[0].filename",
            "at most 4096",
        ),
        (
            "/infill",
            {"input_prefix": "w1", "input_suffix": "w2", "input_extra": [{"text": "ok"}, {"text": "a\udfffb"}]},
            "input_extra[1].text",
            "lone surrogate",
        ),
        (
            "/infill",
            {"input_prefix": "w1", "input_suffix": "w2", "input_extra": [{"text": HUGE}]},
            "input_extra[0].text",
            "context can hold",
        ),
        ("/infill", {"input_prefix": "w1", "input_suffix": HUGE}, "input_suffix", "context can hold"),
        ("/infill", {"input_prefix": "w1", "input_suffix": "w2", "n_predict": 0}, "n_predict", "-1 (no limit)"),
        ("/infill", {"input_prefix": "w1", "input_suffix": "w2", "temperature": "hot"}, "temperature", "a number"),
    ],
)
def test_a_malformed_or_oversized_suffix_or_input_extra_is_a_clear_400(tiny, tiny_client, path, body, param, says):
    raw = json.dumps(body).encode()  # lone surrogates as \\u escapes, as a client can send them
    response = httpx.post(tiny.url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=120)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert error["type"] == "invalid_request_error"
    reply = tiny_client.completions.create(model="tiny", prompt="w1", suffix="w2", max_tokens=2)  # still serving
    assert reply.usage.completion_tokens >= 1


@pytest.fixture(scope="module")
def smollm():
    service, model = start(parallel=1)
    yield service
    service.stop()
    model.close()


def test_a_model_without_fim_tokens_gets_a_400_that_says_so(smollm):
    client = openai.OpenAI(base_url=smollm.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="smollm2", prompt="def add(a, b):\n", suffix="\nprint(add(1, 2))\n")
    assert refused.value.status_code == 400 and NO_FIM in refused.value.message
    assert refused.value.body["param"] == "suffix" and refused.value.body["code"] == "fim_not_supported"
    response = infill(smollm.url, input_prefix="def add(a, b):\n", input_suffix="\nprint(add(1, 2))\n")
    assert response.status_code == 400 and NO_FIM in response.json()["error"]["message"]
    assert httpx.get(smollm.url + "/v1/models").json()["data"][0]["meta"]["fill_in_middle"] is False
    plain = client.completions.create(model="smollm2", prompt="def add(a, b):\n", max_tokens=8, temperature=0)
    assert plain.choices[0].text and plain.usage.completion_tokens >= 1  # a prompt without a suffix still completes


def test_gemma_has_no_fim_tokens_either(gemma_path):
    from engine.serving.fill_in_middle import has_fim

    model = Model(gemma_path, vocab_only=True)
    try:
        assert not has_fim(model)
    finally:
        model.close()


# --- the real Qwen2.5-Coder 1.5B Instruct, where the pair is fetched (python -m engine.measure.real_pair) ---------
COLOURS = ["red", "orange", "yellow", "green", "blue", "indigo", "violet"]
RAINBOW_PREFIX = "# the colours of the rainbow, in order\nCOLOURS = [\n"
RAINBOW_SUFFIX = (
    "]\n\n# the same list, spelled out for the test\nEXPECTED = [\n"
    + "".join(f"    '{c}',\n" for c in COLOURS)
    + "]\nassert COLOURS == EXPECTED\n"
)


@pytest.fixture(scope="module")
def coder():
    path = pair_dir() / TARGET.file_name
    if not path.is_file():  # only a verified file gets its final name
        pytest.skip("the Qwen2.5-Coder pair is not fetched (python -m engine.measure.real_pair)")
    model = Model(path, LoadSettings(n_ctx=1024, threads=2, n_seq_max=1))
    # Not adaptive: every lookup proposal is drafted, so what lookup found is verified whatever this machine's speed.
    speculation = SpeculationConfig(max_draft=8, adaptive=False)
    service = Service(model, LookupProposer(), speculation, ServeOptions(port=0, parallel=1), model_id="coder").start()
    yield service
    service.stop()
    model.close()


@pytest.mark.slow
def test_qwen_coder_fills_the_middle_and_lookup_copies_it_from_the_suffix(coder):
    client = openai.OpenAI(base_url=coder.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    assert httpx.get(coder.url + "/v1/models").json()["data"][0]["meta"]["fill_in_middle"] is True
    reply = client.completions.create(
        model="coder", prompt=RAINBOW_PREFIX, suffix=RAINBOW_SUFFIX, max_tokens=80, temperature=0
    )
    text = reply.choices[0].text
    assert [c for c in COLOURS if f"'{c}'" in text] == COLOURS and "EXPECTED" not in text, text  # the middle only
    assert [text.index(f"'{c}'") for c in COLOURS] == sorted(text.index(f"'{c}'") for c in COLOURS)
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens < 80
    assert reply.usage.prompt_tokens > 60
    lookup = reply.model_extra["timings"]["by_proposer"]["lookup"]
    assert lookup["accepted"] > 0, lookup  # the list is in the suffix only: lookup found it there
    answer = infill(coder.url, input_prefix=RAINBOW_PREFIX, input_suffix=RAINBOW_SUFFIX, n_predict=80, temperature=0)
    assert all(f"'{c}'" in answer.json()["content"] for c in COLOURS)
