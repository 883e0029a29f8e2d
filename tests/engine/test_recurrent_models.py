"""Recurrent models (here a real one-layer Mamba that llama.cpp runs) keep a state that cannot be
cut back part-way: they decode without speculation, say why, and reuse their cache only forwards."""

import pytest

from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.loader import DecoderSettings, build_decoder, make_proposer
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.errors import EngineError, SpeculationUnavailable

from support.damaged_models import write_tiny_mamba

GREEDY = SamplingParams(temperature=0)
# Lookup drafts 14 after 138 and 16 after 299; this model continues otherwise, so a guess is rejected.
PROMPT = [1, 138, 14, 299, 16, 13, 9, 18, 17, 19, 11]


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    path = write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")
    model = Model(path, LoadSettings(n_ctx=256, threads=1))
    yield model
    model.close()


def run(decoder, prompt, n=20):
    return [t for d in decoder.generate(prompt, GREEDY, max_tokens=n) for t in d.tokens]


def test_llama_cpp_says_it_is_recurrent_and_cannot_roll_back(mamba):
    assert not mamba.can_roll_back
    mamba.forget_all()
    mamba.prefill(PROMPT[:5])
    mamba.decode(PROMPT[5:8], 5, 3)
    with pytest.raises(EngineError, match="could not roll"):
        mamba.forget_from(6)
    mamba.forget_all()


def test_speculation_on_a_recurrent_model_decodes_plainly(mamba):
    plain = run(SpeculativeDecoder(mamba), PROMPT)
    decoder = SpeculativeDecoder(mamba, LookupProposer(), SpeculationConfig(max_draft=4, adaptive=False))
    assert run(decoder, PROMPT) == plain
    assert decoder.stats.method == "none" and decoder.stats.drafted == 0


def test_a_changed_conversation_starts_the_state_again(mamba):
    decoder = SpeculativeDecoder(mamba)
    first = run(decoder, PROMPT, 6)
    edited = PROMPT[:6] + [40, 41]  # the same start, then other text: the cache cannot be cut back to it
    again = run(decoder, edited, 6)
    assert again == run(SpeculativeDecoder(mamba), edited, 6)
    assert run(decoder, PROMPT, 6) == first  # the same prompt again (regenerate)


def test_the_loader_says_why_there_is_no_speculation(mamba):
    with pytest.raises(SpeculationUnavailable, match="recurrent or hybrid"):
        make_proposer(DecoderSettings(model=str(mamba.path), method="lookup"), mamba, None)
    assert make_proposer(DecoderSettings(model=str(mamba.path), method="none"), mamba, None).name == "none"
    decoder = build_decoder(DecoderSettings(model=str(mamba.path), method="lookup", n_ctx=256, threads=1))
    assert decoder.proposer.name == "none"
    decoder.target.close()


def test_gemma_can_roll_back(target):
    assert target.can_roll_back


class StopAfter:
    """A cancel flag that reads as set from its n-th look on (prefill looks once per chunk)."""

    def __init__(self, looks: int):
        self.looks = looks

    def is_set(self) -> bool:
        self.looks -= 1
        return self.looks < 0


def test_the_turn_after_an_answer_that_ended_on_its_own(tmp_path):
    # 138 is a token this model writes: as its end token, answers end by themselves.
    model = Model(write_tiny_mamba(tmp_path / "eos-mamba.gguf", eos=138), LoadSettings(n_ctx=256, threads=1))
    decoder = SpeculativeDecoder(model)
    answer = run(decoder, PROMPT)
    assert decoder.stats.finish_reason == "stop"
    follow_up = PROMPT + answer + [40, 41, 42]
    assert run(decoder, follow_up, 6) == run(SpeculativeDecoder(model), follow_up, 6)
    model.close()


def test_stop_during_a_long_prompt_cancels_cleanly(tmp_path):
    model = Model(write_tiny_mamba(tmp_path / "mamba.gguf"), LoadSettings(n_ctx=256, n_batch=32, threads=1))
    decoder = SpeculativeDecoder(model)
    prompt = [1] + [3 + i % 290 for i in range(120)]  # four prefill chunks of 32
    run(decoder, prompt[:20], 1)  # the cache holds its start: the long prompt is read on from there
    assert list(decoder.generate(prompt, GREEDY, max_tokens=4, cancel=StopAfter(1))) == []
    assert decoder.stats.finish_reason == "cancelled"
    assert run(decoder, prompt, 6) == run(SpeculativeDecoder(model), prompt, 6)
    model.close()
