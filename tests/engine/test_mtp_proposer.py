"""`--method mtp`: a target's own MTP head drafts inside the one step loop (proposers/mtp.py), on the synthetic
qwen35 files (engine/measure/synthetic.py: a hybrid target, so rejected drafts roll back through n_rs_seq). Decoders
are built as the bench builds them (loader.build_decoder), step and draft costs pinned so the planner's choices
follow acceptance alone, not this machine's load (on these tiny files the head's decode costs about what a target
step does, so unpinned the planner rightly declines it)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.decoding.loader import DecoderSettings, build_decoder, load_target
from engine.decoding.proposers.mtp import MtpProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams, filter_logits
from engine.errors import EngineError, InvalidSettingError
from engine.measure import synthetic

from support.distributions import chi_square_p_value
from support.step_costs import ONE_ROW_S, pin_draft_costs, pin_step_costs

PROMPT = "Hello there, how are you?"
TOKENS = 64
GREEDY = SamplingParams(temperature=0.0)
# A GPU-like target (a verified row costs a tenth of a step) and a head a tenth of a target step: drafting pays
# wherever the head is right.
STEP_COST = {1: 1.0, 2: 1.1, 9: 1.8, 17: 2.6}


@pytest.fixture(scope="session")
def heads(tmp_path_factory):
    return {name: str(path) for name, path in synthetic.write_all(tmp_path_factory.mktemp("mtp-heads")).items()}


@pytest.fixture
def pinned(monkeypatch):
    pin_step_costs(monkeypatch, STEP_COST)
    pin_draft_costs(monkeypatch, ONE_ROW_S / 10, ONE_ROW_S / 50)


def answer(path, method, sampling=GREEDY, seeds=(0,), tokens=TOKENS, **settings):
    """Each seed's answer to PROMPT through one decoder (the bench's), and the last answer's stats."""
    decoder = build_decoder(DecoderSettings(model=path, method=method, threads=1, remember_requests=False, **settings))
    try:
        decoder.calibrate()
        prompt = decoder.target.tokenize(PROMPT)
        answers = []
        for seed in seeds:
            params = SamplingParams(**{**sampling.__dict__, "seed": seed})
            deltas = decoder.generate(prompt, params, max_tokens=tokens, ignore_eos=True)
            answers.append([t for d in deltas for t in d.tokens])
        return answers, decoder.stats
    finally:
        decoder.target.close()


@pytest.mark.parametrize("name", synthetic.HEADS)
def test_greedy_mtp_is_plain_decoding_with_every_head(heads, pinned, name):
    [plain], _ = answer(heads[name], "none")
    [drafted], stats = answer(heads[name], "mtp", p_min=0.0)
    assert stats.method == "mtp"
    assert drafted == plain


def test_the_agreeing_head_drafts_most_of_the_answer_and_is_kept(heads, pinned):
    _, stats = answer(heads["mtp-agreeing"], "mtp")
    assert stats.drafted >= TOKENS // 2, stats.to_dict()
    assert stats.accepted / stats.drafted >= 0.9


def test_the_stats_count_the_heads_drafts_as_its_own_not_a_draft_models(heads, pinned):
    """by_proposer names the built-in drafter "mtp", with every draft and every kept token; no draft model's
    weights are counted (the head's are the target's)."""
    _, stats = answer(heads["mtp-agreeing"], "mtp")
    assert stats.drafted > 0
    counts = {"drafted": stats.drafted, "accepted": stats.accepted, "steps": stats.speculative_steps}
    assert stats.by_proposer == {"mtp": counts}, stats.by_proposer
    assert stats.draft_model_bytes is None


def test_the_planner_stops_drafting_from_the_random_head(heads, pinned):
    """p_min 0: the head never stops on its own; the cost model must, from its acceptance."""
    [tokens], stats = answer(heads["mtp-random"], "mtp", p_min=0.0)
    assert len(tokens) == TOKENS
    assert stats.drafted <= TOKENS // 4, stats.to_dict()


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_half_head_is_partly_kept_and_its_rejections_roll_back(heads, pinned, adaptive):
    """Fixed drafts of 3 reject at most steps: each rejection rolls the hybrid target's recurrent state back."""
    [plain], _ = answer(heads["mtp-half"], "none")
    [tokens], stats = answer(heads["mtp-half"], "mtp", p_min=0.0, adaptive=adaptive, max_draft=3)
    assert tokens == plain
    assert 0 < stats.accepted < stats.drafted, stats.to_dict()


def test_sampled_mtp_keeps_the_targets_answer_for_each_seed(heads, pinned):
    """Point-mass drafts are verified by draws fixed by (seed, position): a seed gives plain sampling's answer."""
    t1 = SamplingParams(temperature=1.0)
    plain, _ = answer(heads["mtp-half"], "none", t1, seeds=range(4), tokens=24)
    drafted, stats = answer(heads["mtp-half"], "mtp", t1, seeds=range(4), tokens=24, adaptive=False, max_draft=3)
    assert drafted == plain
    assert stats.drafted > 0


def test_sampled_tokens_after_a_draft_follow_the_targets_distribution(heads, pinned):
    """Temperature 5 with no other filter (this file's target is near-greedy at 1), drafts of 2 from the half head
    (its draft is wrong half the time, so the rejection draw runs): the token after the first, over many seeds,
    against the target's p after the first token, by chi-square."""
    hot = SamplingParams(temperature=5.0, top_k=0, top_p=1.0, min_p=0.0)
    runs, _ = answer(heads["mtp-half"], "mtp", hot, seeds=range(300), tokens=3, adaptive=False, max_draft=2)
    plain = Model(heads["mtp-half"], LoadSettings(n_ctx=512, threads=1))
    try:
        vocab, rows = plain.n_vocab, {}
        for first in {run[0] for run in runs}:  # its trunk ignores context: p after a token is p after it anywhere
            plain.forget_all()
            logits = torch.from_numpy(plain.decode([first], 0, 1).copy())
            rows[first] = filter_logits(logits, hot).dense_row(0, vocab).double()
    finally:
        plain.close()
    expected = sum(rows[run[0]] for run in runs)
    observed = torch.zeros(vocab, dtype=torch.float64)
    for run in runs:
        observed[run[1]] += 1
    assert chi_square_p_value(observed, expected) > 1e-3


def test_a_model_without_mtp_layers_is_refused_with_a_sentence(smollm_path):
    with pytest.raises(InvalidSettingError, match="has none"):
        build_decoder(DecoderSettings(model=str(smollm_path), method="mtp", threads=1))
    target = Model(smollm_path, LoadSettings(n_ctx=512, threads=1, mtp=True))
    try:
        with pytest.raises(InvalidSettingError, match="no MTP"):
            MtpProposer(target)
    finally:
        target.close()


def test_a_hybrid_target_rolls_back_within_its_last_decode_only(heads):
    """n_rs_seq snapshots reach the rows of the last decode but its first: a deeper roll-back raises rather than
    read a stale snapshot (llama.cpp would take it)."""
    target = load_target(DecoderSettings(model=heads["mtp-half"], method="mtp", threads=1, max_draft=3))
    try:
        assert not target.can_roll_back and target.max_rollback == 3
        prompt = target.tokenize(PROMPT)
        target.prefill(prompt)
        target.decode_multi([5, 6, 7, 8], range(len(prompt), len(prompt) + 4), [0] * 4, [True] * 4)
        assert target.hidden is not None and target.hidden.rows(0, 0, len(prompt) + 4) is not None
        target.forget_from(len(prompt) + 1)  # three drafts rejected
        assert target.next_position() == len(prompt) + 1
        assert target.hidden.rows(0, 0, len(prompt) + 2) is None  # the rows went with the cells
        target.decode_multi([5, 6], range(len(prompt) + 1, len(prompt) + 3), [0] * 2, [True] * 2)
        with pytest.raises(EngineError):
            target.forget_from(len(prompt))  # the whole decode and one more
    finally:
        target.close()


def test_the_lab_runs_mtp_beside_plain_at_every_concurrency(heads, pinned, tmp_path):
    """The lab loads the target once with its MTP layers; each sequence of a level drafts from the head."""
    import json

    from engine.lab.local import LabConfig, run_lab

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate([PROMPT, "abc"])))
    config = LabConfig(str(prompts), model=heads["mtp-agreeing"], methods=("none", "mtp"), concurrency=(1, 2))
    cells = {(c["method"], c["concurrency"]): c for c in run_lab(replace(config, max_tokens=16, threads=1))["cells"]}
    assert set(cells) == {("none", 1), ("mtp", 1), ("none", 2), ("mtp", 2)}
    for level in (1, 2):
        mtp = cells[("mtp", level)]
        assert mtp["generated_tokens"] == cells[("none", level)]["generated_tokens"]
        assert mtp["drafted"] > 0 and mtp["accepted"] / mtp["drafted"] >= 0.9, mtp


def test_the_lab_refuses_mtp_on_a_model_without_mtp_layers_before_loading_it(smollm_path, tmp_path):
    from engine.lab.local import LabConfig, run_lab

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Hello"}\n')
    with pytest.raises(InvalidSettingError, match="MTP"):
        run_lab(LabConfig(str(prompts), model=str(smollm_path), methods=("none", "mtp"), concurrency=(1,)))


def test_the_server_counts_the_heads_drafts_under_their_own_name(heads, pinned):
    """`--method mtp` served: a response's timings count the built-in drafter's drafts as "mtp", through the real
    `openai` client."""
    import openai

    from engine.decoding.speculation_config import SpeculationConfig
    from engine.serving.service import ServeOptions, Service

    model = Model(heads["mtp-agreeing"], LoadSettings(n_ctx=512, threads=1, n_seq_max=2, mtp=True, n_rs_seq=4))
    service = Service(
        model, MtpProposer(model), SpeculationConfig(max_draft=4), ServeOptions(port=0, parallel=2), model_id="tiny"
    ).start()
    try:
        client = openai.OpenAI(base_url=service.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, extra_body={"ignore_eos": True}
        )
        timings = (reply.model_extra or {})["timings"]
    finally:
        service.stop()
        model.close()
    assert timings["method"] == "mtp" and timings["draft_n"] > 0, timings
    mtp = timings["by_proposer"]["mtp"]
    assert set(timings["by_proposer"]) == {"mtp"}, timings
    assert (mtp["drafted"], mtp["accepted"]) == (timings["draft_n"], timings["draft_n_accepted"]), timings
    # the one proposer did every draft: its mean accepted length is the answer's
    assert mtp["steps"] > 0 and mtp["mean_acceptance_length"] == timings["mean_acceptance_length"], timings
