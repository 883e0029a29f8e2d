"""OpenAI's Predicted Outputs (`prediction`) on the real server with the embedded SmolLM2, through the `openai` client:
a request's predicted answer drafts along its tokens (engine/decoding/proposers/prediction.py), re-aligning where the
answer departs from it, and never changes the answer; usage says how many predicted tokens were kept and rejected.

The rename: the answer is a 41-line file with `self.items` renamed `self.stock` (11 places), predicted as the file
before the rename, as an editor sends it. SmolLM2 135M cannot be asked to rename reliably, so the prompt shows it the
renamed file twice and it writes it a third time (a copy it is sure of: every token after the first is at least 1.5
logits ahead of the next, where a wider verify batch moves SmolLM2's logits by under one here, so it cannot turn one
of them). Its answer
leaves the prediction at every renamed word and must be drafted on from the prediction after each."""

import json

import httpx
import numpy as np
import openai
import pytest

from engine.decoding.proposers.auto import AutoProposer
from engine.decoding.proposers.draft_model import DraftModelProposer
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.proposers.prediction import PredictionProposer, suffix_match
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.speculation_config import SpeculationConfig
from engine.modelfiles.embedded import embedded_model_path
from engine.serving.service import ServeOptions, Service

from support.serving import COUNTING

ORIGINAL = '''import json
from pathlib import Path

class Inventory:
    """Items in a shop's store room, saved as JSON."""

    def __init__(self, path):
        self.path = Path(path)
        self.items = {}

    def load(self):
        if self.path.exists():
            self.items = json.loads(self.path.read_text())
        return self.items

    def save(self):
        self.path.write_text(json.dumps(self.items, indent=2))

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count
        self.save()

    def remove(self, name, count):
        left = self.items.get(name, 0) - count
        if left < 0:
            raise ValueError("not enough " + name + " in stock")
        self.items[name] = left
        self.save()

    def total(self):
        return sum(self.items.values())

    def count_of(self, name):
        return self.items.get(name, 0)

    def clear(self):
        self.items = {}
        self.save()

if __name__ == "__main__":
    print(Inventory("stock.json").load())
'''
RENAMED = ORIGINAL.replace("self.items", "self.stock")
PROMPT = f"{RENAMED}\n---\n{RENAMED}\n---\n"
STOP = ["\n---"]
# A prediction of the right text in the wrong order: it shares every line with the answer, so it is drafted from
# (and mostly rejected), and a verification that let a draft through would show in the answer.
WRONG = "\n".join(reversed(ORIGINAL.splitlines()))
LONE_SURROGATE = {"type": "content", "content": "\ud800"}  # JSON can spell it; UTF-8 cannot
COUNTED = ", ".join(str(i) for i in range(1, 31))


def predicted(text: str | list) -> dict:
    return {"type": "content", "content": text}


def serve(adaptive: bool) -> tuple[Service, Model]:
    model = Model(embedded_model_path(), LoadSettings(n_ctx=2048, threads=2, n_seq_max=1))
    speculation = SpeculationConfig(max_draft=8, adaptive=adaptive)
    service = Service(model, LookupProposer(), speculation, ServeOptions(port=0, parallel=1), model_id="smollm2")
    return service.start(), model


@pytest.fixture(scope="module")
def server():
    """Fixed draft lengths (every proposal drafted up to 8 tokens), so what is drafted and kept depends on the tokens
    alone, not on the step times the cost model would weigh on a loaded machine. One slot, so every request after
    the first finds the same cache: the prompt less its last token, kept from the first (a token decoded alone
    rounds apart from one decoded in the prompt's batch)."""
    service, model = serve(adaptive=False)
    yield service
    service.stop()
    model.close()


@pytest.fixture(scope="module")
def bare(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def client(bare):
    bare.completions.create(model="smollm2", prompt=PROMPT, max_tokens=1, temperature=0)  # the cache's prompt
    return bare


def complete(client, prediction: str | None = None, **options):
    extra = {} if prediction is None else {"prediction": predicted(prediction)}
    options = {"temperature": 0, **options}
    return client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=400, stop=STOP, extra_body=extra, **options
    )


@pytest.fixture(scope="module")
def unpredicted(client):
    return complete(client)


def counts(reply) -> tuple[int, int]:
    details = reply.usage.completion_tokens_details
    return details.accepted_prediction_tokens, details.rejected_prediction_tokens


# --- the proposer, on token lists ------------------------------------------------------------------------------
def aligned(prediction, prompt=(100, 101)):
    proposer = PredictionProposer()
    proposer.start(0, len(prompt), prediction)
    return proposer, list(prompt)


def test_it_drafts_the_prediction_while_the_answer_follows_it():
    proposer, history = aligned([1, 2, 3, 4, 5, 6])
    history.append(1)
    proposal = proposer.propose_one(0, history, 3)
    assert proposal.tokens == [2, 3, 4] and proposal.source == "prediction" and proposal.match_length == 1
    history += [2, 3]
    proposal = proposer.propose_one(0, history, 8)
    assert proposal.tokens == [4, 5, 6] and proposal.match_length == 3


def test_after_a_renamed_word_it_drafts_the_rest_of_the_prediction():
    # "a = x ; b = x ;" with x renamed y (two tokens: 7 8): the answer rejoins at ";" and the draft goes on from there
    prediction = [10, 11, 5, 12, 13, 11, 5, 12, 14]
    proposer, history = aligned(prediction)
    history += [10, 11]
    assert proposer.propose_one(0, history, 2).tokens == [5, 12]
    history += [7, 8]  # the renamed word: nothing in the prediction follows it
    assert proposer.propose_one(0, history, 4).tokens == []
    history.append(12)  # ";" recurs: the one after the cursor, not an earlier one
    assert proposer.propose_one(0, history, 4).tokens == [13, 11, 5, 12]


def test_a_word_written_in_place_of_the_predicted_one_is_taken_for_a_rename():
    # The new word (9) occurs further on in the prediction: a one-token match there is not trusted over the rename.
    proposer, history = aligned([1, 2, 3, 4, 5, 6, 9, 7])
    history += [1, 2]
    assert proposer.propose_one(0, history, 1).tokens == [3]
    history.append(9)  # written where 3 was predicted
    assert proposer.propose_one(0, history, 4).tokens == [4, 5, 6, 9]
    history += [4, 5, 8]  # and again, a token later: the place is kept
    assert proposer.propose_one(0, history, 4).tokens == [9, 7]


def test_a_run_that_recurs_does_not_send_the_draft_back_unless_clearly_longer():
    line = [20, 21, 22]
    proposer, history = aligned([*line, 1, *line, 2, 3, 4, 5, 6, 7, 8, 9])
    history += [*line, 1, 30, 21, 22]  # left the prediction in the second line, rejoined on two tokens of it
    assert proposer.propose_one(0, history, 2).tokens == [2, 3]
    proposer, history = aligned([1, 2, 3, 4, 5, 6, 7, 40, 41, 42, 43])
    history += [1, 2, 3, 4, 5, 6, 7, 40, 41, 42, 43, 1, 2, 3, 4, 5]  # the answer goes back and copies itself again
    assert proposer.propose_one(0, history, 2).tokens == [6, 7]


def test_a_request_without_a_prediction_gets_nothing_from_it():
    proposer = PredictionProposer()
    proposer.start(3, 2, [])
    assert not proposer and proposer.propose_one(3, [1, 2, 3], 4).tokens == []
    proposer.start(3, 2, [3, 4])
    assert proposer and proposer.propose_one(3, [1, 2, 3], 4).tokens == [4]
    proposer.finish(3)
    assert not proposer


def test_suffix_match_agrees_with_brute_force():
    rng = np.random.default_rng(11)
    for _ in range(2000):
        prediction = rng.integers(0, int(rng.integers(2, 5)), int(rng.integers(1, 60))).astype(np.int64)
        tail = rng.integers(0, 4, int(rng.integers(1, 12))).tolist()
        low = int(rng.integers(0, len(prediction) + 1))
        high = int(rng.integers(low, len(prediction) + 1))
        earliest = bool(rng.integers(0, 2))
        best = (0, 0)
        for end in range(low, high) if earliest else range(high - 1, low - 1, -1):
            n = 0
            while n < len(tail) and end - n >= 0 and prediction[end - n] == tail[-1 - n]:
                n += 1
            if n > best[1]:
                best = (end, n)
        assert suffix_match(prediction, tail, low, high, earliest) == best, (prediction, tail, low, high, earliest)


# --- through the server ----------------------------------------------------------------------------------------
@pytest.mark.slow  # a 290-token answer, or several
def test_a_rename_predicted_as_the_original_keeps_the_answer_and_drafts_most_of_it(server, client, unpredicted):
    reply = complete(client, ORIGINAL)
    text = reply.choices[0].text
    assert unpredicted.choices[0].text == RENAMED  # the model wrote the renamed file ...
    assert text == unpredicted.choices[0].text  # ... and with the prediction, the very same
    accepted, rejected = counts(reply)
    tokens = reply.usage.completion_tokens
    print(f"rename: {tokens} tokens, {accepted} accepted from the prediction, {rejected} rejected")
    assert accepted > tokens / 2  # most of the answer came from the prediction ...
    before_first_rename = len(tokens_of(server, RENAMED[: RENAMED.index("self.stock")]))
    assert accepted > 2 * before_first_rename  # ... well past the first place it departed from it
    by_proposer = reply.model_extra["timings"]["by_proposer"]
    assert by_proposer["prediction"]["accepted"] == accepted
    assert by_proposer["prediction"]["drafted"] == accepted + rejected
    assert "prediction" not in unpredicted.model_extra["timings"]["by_proposer"]
    assert unpredicted.usage.completion_tokens_details is None  # a request without one: usage as before


def tokens_of(server, text: str) -> list[int]:
    return httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"]


@pytest.mark.slow  # a 290-token answer, or several
def test_a_wrong_prediction_costs_the_answer_nothing(client, unpredicted):
    reply = complete(client, WRONG)
    assert reply.choices[0].text == unpredicted.choices[0].text
    accepted, rejected = counts(reply)
    print(f"wrong prediction: {accepted} accepted, {rejected} rejected of {reply.usage.completion_tokens} tokens")
    assert rejected > 0  # it was drafted from, and its drafts were turned down


@pytest.mark.slow  # a 290-token answer, or several
def test_streamed_the_answer_and_its_counts_are_the_whole_ones(client, unpredicted):
    whole = complete(client, ORIGINAL)
    chunks = list(complete(client, ORIGINAL, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == unpredicted.choices[0].text
    details = chunks[-1].usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == counts(whole)
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.usage.completion_tokens_details == details
    assert final.model_extra["timings"]["by_proposer"]["prediction"]["accepted"] == counts(whole)[0] > 0


@pytest.mark.slow
def test_the_chat_endpoint_takes_a_prediction_in_text_parts_and_a_seeded_sample_is_kept(client):
    """Drafts along a prediction are point-mass, verified by noise fixed per position (verifier.py): the seed rule
    gives the sample it gives without them. (A count, which the model is sure of: a logit that a wider verify batch
    moves by a fraction of one could turn a near-even sample, with speculation of any kind.)"""
    parts = [{"type": "text", "text": COUNTED[:40]}, {"type": "text", "text": COUNTED[40:]}]
    replies = {}
    for name, sampling in (("greedy", {"temperature": 0}), ("sampled", {"temperature": 0.5, "seed": 1234})):
        ask = dict(model="smollm2", messages=COUNTING, max_tokens=90, **sampling)
        whole = client.chat.completions.create(**ask)
        reply = replies[name] = client.chat.completions.create(**ask, prediction=predicted(parts))
        assert reply.choices[0].message.content == whole.choices[0].message.content, name
        accepted, rejected = counts(reply)
        print(f"counting, {name}: {accepted} accepted, {rejected} rejected of {reply.usage.completion_tokens}")
        assert accepted + rejected == reply.model_extra["timings"]["by_proposer"]["prediction"]["drafted"]
        assert accepted > 0
    greedy = replies["greedy"]
    assert "1, 2, 3" in greedy.choices[0].message.content and counts(greedy)[0] > greedy.usage.completion_tokens / 2


@pytest.mark.slow
def test_the_cost_model_plans_a_prediction_as_it_plans_lookup():
    """The server as it runs by default: the planner weighs each step's drafts (by step times that vary with the
    machine's load, so no count is asserted, only the answer)."""
    service, model = serve(adaptive=True)
    try:
        client = openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=1, temperature=0)
        plain, guided = complete(client), complete(client, ORIGINAL)
        assert guided.choices[0].text == plain.choices[0].text == RENAMED
        accepted, rejected = counts(guided)
        print(f"adaptive rename: {accepted} accepted, {rejected} rejected of {guided.usage.completion_tokens}")
        assert accepted + rejected == guided.model_extra["timings"]["by_proposer"]["prediction"]["drafted"]
    finally:
        service.stop()
        model.close()


@pytest.mark.slow
def test_under_auto_the_prediction_is_the_copy_that_is_asked_first():
    """--method auto (lookup and a draft model, a second SmolLM2): the prediction drafts before either, and a draft
    model's guess is made only where neither copies."""
    model = Model(embedded_model_path(), LoadSettings(n_ctx=2048, threads=2, n_seq_max=1))
    draft = Model(embedded_model_path(), LoadSettings(n_ctx=2048, threads=2, n_seq_max=1))
    proposer = AutoProposer(LookupProposer(), DraftModelProposer(draft, model, p_min=0.0))
    service = Service(
        model, proposer, SpeculationConfig(max_draft=8, adaptive=False), ServeOptions(port=0, parallel=1), "smollm2"
    ).start()
    try:
        client = openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=1, temperature=0)
        plain, guided = complete(client), complete(client, ORIGINAL)
        assert guided.choices[0].text == plain.choices[0].text == RENAMED
        accepted, rejected = counts(guided)
        by_proposer = guided.model_extra["timings"]["by_proposer"]
        print(
            f"auto rename: {accepted} accepted, {rejected} rejected of {guided.usage.completion_tokens}; {by_proposer}"
        )
        assert guided.model_extra["timings"]["method"] == "auto"
        assert by_proposer["prediction"]["accepted"] == accepted > guided.usage.completion_tokens / 2
    finally:
        service.stop()
        model.close()
        draft.close()


@pytest.mark.parametrize(
    "prediction, param",
    [
        ("just text", "prediction"),
        ({"type": "text", "content": "x"}, "prediction"),
        ({"content": "x"}, "prediction"),
        ({"type": "content"}, "prediction.content"),
        ({"type": "content", "content": 42}, "prediction.content"),
        ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "prediction.content"),
        ({"type": "content", "content": [{"type": "text", "text": 7}]}, "prediction.content"),
        ({"type": "content", "content": [{"type": "text"}] * 1025}, "prediction.content"),
        (LONE_SURROGATE, "prediction.content"),
    ],
)
def test_a_malformed_prediction_is_a_400_naming_it(server, bare, prediction, param):
    body = {"model": "smollm2", "prompt": "Hello", "max_tokens": 2, "prediction": prediction}
    response = httpx.post(
        server.url + "/v1/completions", content=json.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and "prediction" in error["message"]
    if prediction != LONE_SURROGATE:  # which the client cannot send: it encodes its body as UTF-8
        with pytest.raises(openai.BadRequestError, match="prediction"):
            bare.chat.completions.create(model="smollm2", messages=COUNTING, max_tokens=2, prediction=prediction)


def test_a_prediction_longer_than_the_context_is_a_400(bare):
    """Past the context by its tokens, and by its bytes alone (refused before it is tokenized)."""
    for text in ("word " * 2100, "x" * (2048 * 200)):
        with pytest.raises(openai.BadRequestError) as refused:
            bare.chat.completions.create(model="smollm2", messages=COUNTING, max_tokens=2, prediction=predicted(text))
        error = refused.value.body
        assert error["code"] == "prediction_too_long" and error["param"] == "prediction", error
    reply = bare.chat.completions.create(model="smollm2", messages=COUNTING, max_tokens=2)
    assert reply.usage.completion_tokens >= 1  # and the server goes on serving
