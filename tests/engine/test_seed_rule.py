"""One seed rule (issue 64): the same request with the same seed gives the same sampled answer whichever path runs it,
the bench's and the chat's (SpeculativeDecoder.generate), the lab's (BatchDecoder.run) and the server's (a real
in-process server, answered through the `openai` client). Each builds its Job with jobs.job_for, whose streams are
stream_seeds(request_seed(sampling), index); before, the bench seeded its verifier with the seed itself and gave
another answer for the same seed. Plain decoding on every path, so each token is one one-row step's sample."""

import openai
import pytest

from engine.decoding.batch_decode import BatchDecoder, BatchRequest
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.proposers.base import NoProposer
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.serving.service import ServeOptions, Service

pytestmark = pytest.mark.slow  # the bench, the lab and a server each answer on the real model

PROMPT = "The old lighthouse keeper climbed the stairs every evening, and"
TOKENS = 24
SEEDS = (1234, 98765)
SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)  # the server's defaults, said on every path


def prompt_tokens(target) -> list[int]:
    """The prompt as /v1/completions tokenizes it."""
    return target.tokenize(PROMPT, add_bos=target.adds_bos, special=False)


def bench(target, seed: int) -> tuple[list[int], str]:
    decoder = SpeculativeDecoder(target, NoProposer(), SpeculationConfig())
    decoder.forget()
    deltas = list(
        decoder.generate(prompt_tokens(target), SamplingParams(**SAMPLING, seed=seed), TOKENS, ignore_eos=True)
    )
    return [t for d in deltas for t in d.tokens], "".join(d.text for d in deltas)


def lab(target, seed: int) -> list[int]:
    result = BatchDecoder(target, NoProposer(), SpeculationConfig()).run(
        [BatchRequest("seeded", prompt_tokens(target))], 1, SamplingParams(**SAMPLING, seed=seed), TOKENS, True
    )
    return result.runs[0].tokens


@pytest.fixture(scope="module")
def benched(target):
    """The bench's answer for each seed."""
    return {seed: bench(target, seed) for seed in SEEDS}


@pytest.fixture(scope="module")
def served(target):
    """The server's answer for each seed, each from an empty cache as the bench's and the lab's are (the session's
    target, served for one request and given back). A server keeps a finished request's cache for the next turn of
    its conversation: the same prompt again would decode only its last token alone, and a token decoded alone
    rounds apart from one decoded in the prompt's batch (as exact greedy knows), which can tip a sampled token on
    one machine and not on another."""
    return {seed: serve_once(target, seed) for seed in SEEDS}


def serve_once(target, seed: int) -> str:
    target.forget_all()
    service = Service(target, NoProposer(), SpeculationConfig(), ServeOptions(port=0, parallel=1), model_id="gemma")
    service.start()
    try:
        client = openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        extra = {"top_k": SAMPLING["top_k"], "min_p": SAMPLING["min_p"], "ignore_eos": True}
        reply = client.completions.create(
            model="gemma",
            prompt=PROMPT,
            max_tokens=TOKENS,
            temperature=SAMPLING["temperature"],
            top_p=SAMPLING["top_p"],
            seed=seed,
            extra_body=extra,
        )
        return reply.choices[0].text
    finally:
        service.stop()


@pytest.mark.parametrize("seed", SEEDS)
def test_the_bench_the_lab_and_the_server_give_one_answer_for_a_seed(target, benched, served, seed):
    tokens, text = benched[seed]
    assert len(tokens) == TOKENS
    assert lab(target, seed) == tokens
    assert served[seed] == text == target.detokenize(tokens)


def test_another_seed_gives_another_answer(benched, served):
    (first, first_text), (second, second_text) = (benched[seed] for seed in SEEDS)
    assert first != second and first_text != second_text
    assert served[SEEDS[0]] != served[SEEDS[1]]
