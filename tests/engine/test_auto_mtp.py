"""`--method auto` on a target with its own MTP layers: lookup, the MTP head and (where given) a draft model weighed
per sequence and step by one cost model (drafting.py's AutoDrafting), on the synthetic qwen35 files. Step and draft
costs are pinned as in test_mtp_proposer.py, so the choices follow acceptance, not this machine's load."""

from __future__ import annotations

import pytest

from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.loader import DecoderSettings, build_decoder, load_target, loads_mtp, needs_draft_model
from engine.decoding.proposers.auto import AutoProposer
from engine.decoding.proposers.draft_model import DraftModelProposer
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.proposers.mtp import MtpProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams
from engine.errors import InvalidSettingError
from engine.measure import synthetic

from support.step_costs import ONE_ROW_S, pin_draft_costs, pin_step_costs

# No repeated text: lookup has little to copy until the answer's own cycle comes round.
PROMPT = "Hello there, how are you?"
TOKENS = 64
GREEDY = SamplingParams(temperature=0.0)
STEP_COST = {1: 1.0, 2: 1.1, 9: 1.8, 17: 2.6}  # a GPU-like target: a verified row costs a tenth of a step


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    return {name: str(path) for name, path in synthetic.write_all(tmp_path_factory.mktemp("auto-mtp")).items()}


@pytest.fixture
def pinned(monkeypatch):
    pin_step_costs(monkeypatch, STEP_COST)
    pin_draft_costs(monkeypatch, ONE_ROW_S / 10, ONE_ROW_S / 50)


def answer(path, method, draft=None, **settings):
    """The greedy answer to PROMPT and the decoder (closed), through the bench's decoder builder."""
    decoder = build_decoder(
        DecoderSettings(model=path, draft=draft, method=method, threads=1, remember_requests=False, **settings)
    )
    try:
        decoder.calibrate()
        deltas = decoder.generate(decoder.target.tokenize(PROMPT), GREEDY, max_tokens=TOKENS, ignore_eos=True)
        return [t for d in deltas for t in d.tokens], decoder
    finally:
        draft_model = getattr(decoder.loop.proposer, "model", None)  # auto's draft model, where it has one
        decoder.target.close()
        if draft_model is not None:
            draft_model.close()


def test_auto_loads_the_mtp_layers_of_a_file_that_has_them_and_needs_no_draft_model(heads, smollm_path):
    assert loads_mtp("auto", heads["mtp-agreeing"]) and not needs_draft_model("auto", heads["mtp-agreeing"])
    assert not loads_mtp("auto", str(smollm_path)) and needs_draft_model("auto", str(smollm_path))
    assert not loads_mtp("lookup", heads["mtp-agreeing"])  # only the methods that may draft with the head
    with pytest.raises(InvalidSettingError, match="auto method needs a draft model"):
        DecoderSettings(model=str(smollm_path), method="auto")


def test_auto_drafts_with_the_agreeing_head_and_credits_it(heads, pinned):
    plain, _ = answer(heads["mtp-agreeing"], "none")
    tokens, decoder = answer(heads["mtp-agreeing"], "auto")
    stats = decoder.stats
    assert tokens == plain
    assert decoder.loop.proposer_names == ("lookup", "mtp")
    mtp = stats.by_proposer.get("mtp", {"drafted": 0, "accepted": 0})
    assert mtp["drafted"] > 0 and mtp["accepted"] / mtp["drafted"] >= 0.9, stats.by_proposer
    assert stats.drafted >= TOKENS // 2, stats.to_dict()


def test_auto_stops_asking_the_random_head(heads, pinned, monkeypatch):
    """p_min 0, so the head never declines on its own: the cost model must stop it, and a head that wins no
    sequence is not asked at all (an idle drafter costs nothing)."""
    asked = []
    propose = MtpProposer.propose
    monkeypatch.setattr(MtpProposer, "propose", lambda self, wants: asked.append(len(wants)) or propose(self, wants))
    plain, _ = answer(heads["mtp-random"], "none")
    tokens, decoder = answer(heads["mtp-random"], "auto", p_min=0.0)
    assert tokens == plain
    mtp = decoder.stats.by_proposer.get("mtp", {"drafted": 0})
    assert mtp["drafted"] <= TOKENS // 4, decoder.stats.by_proposer
    assert len(asked) <= TOKENS // 4 and all(asked)


def test_auto_weighs_a_draft_model_and_the_head_together(heads, pinned):
    """Given a draft model too, auto has three proposers: the answer is plain decoding's, every proposal credited to
    one of them. The draft is the agreeing file's trunk (a hybrid, so it keeps recurrent snapshots to roll back)."""
    plain, _ = answer(heads["mtp-half"], "none")
    settings = DecoderSettings(model=heads["mtp-half"], method="auto", threads=1, max_draft=3, remember_requests=False)
    target = load_target(settings)
    draft = Model(heads["mtp-agreeing"], LoadSettings(n_ctx=target.n_ctx, threads=1, n_rs_seq=4))
    try:
        proposer = AutoProposer(
            LookupProposer(remember_requests=False), DraftModelProposer(draft, target), MtpProposer(target)
        )
        decoder = SpeculativeDecoder(target, proposer, settings.speculation())
        decoder.calibrate()
        deltas = decoder.generate(target.tokenize(PROMPT), GREEDY, max_tokens=TOKENS, ignore_eos=True)
        assert [t for d in deltas for t in d.tokens] == plain
    finally:
        target.close()
        draft.close()
    assert decoder.loop.proposer_names == ("lookup", "draft", "mtp")
    stats = decoder.stats
    assert set(stats.by_proposer) <= {"lookup", "draft", "mtp"}
    assert sum(p["drafted"] for p in stats.by_proposer.values()) == stats.drafted
    # Both drafters are right every time the head is (the draft's trunk is the target's): each wins some steps.
    assert stats.by_proposer.get("draft", {"drafted": 0})["drafted"] > 0, stats.by_proposer
