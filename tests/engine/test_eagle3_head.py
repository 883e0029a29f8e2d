"""An EAGLE-3 head given as the draft drafts from the target's layer inputs (proposers/eagle3.py), on the synthetic
files (engine/measure/synthetic.py's qwen35 target, synthetic_eagle3.py's heads). The target is hybrid, so it is
loaded with recurrent-state snapshots (n_rs_seq) for rejected drafts to roll back; step and draft costs are pinned
as in test_mtp_proposer.py, so the planner's choices follow acceptance, not this machine's load. A DFlash head, which
SpecChat does not drive, is refused with model_inspect.HEAD_SUPPORT's sentence."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.layer_inputs import layer_input_problem
from engine.decoding.loader import DecoderSettings, make_proposer
from engine.decoding.pair_check import check_pair
from engine.decoding.proposers.eagle3 import Eagle3Proposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams
from engine.errors import InvalidSettingError
from engine.measure import synthetic, synthetic_eagle3
from engine.methods import MTP_MAX_DRAFT
from engine.modelfiles.model_inspect import HEAD_SUPPORT, inspect_model

from support.step_costs import ONE_ROW_S, pin_draft_costs, pin_step_costs

PROMPT = "Hello there, how are you?"
TOKENS = 64
GREEDY = SamplingParams(temperature=0.0)
STEP_COST = {1: 1.0, 2: 1.1, 9: 1.8, 17: 2.6}  # a GPU-like target: a verified row costs a tenth of a step
LOAD = LoadSettings(n_ctx=1024, n_gpu_layers=0, threads=1, n_rs_seq=MTP_MAX_DRAFT)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    names = ["mtp-agreeing", *synthetic.EAGLE3_HEADS]
    return {n: str(p) for n, p in synthetic.write_all(tmp_path_factory.mktemp("eagle3"), names).items()}


@pytest.fixture
def pinned(monkeypatch):
    pin_step_costs(monkeypatch, STEP_COST)
    pin_draft_costs(monkeypatch, ONE_ROW_S / 10, ONE_ROW_S / 50)


def answer(files, method, head="eagle3-agreeing", sampling=GREEDY, seeds=(0,), tokens=TOKENS, **settings):
    """Each seed's answer to PROMPT with the head as the draft (the bench's proposer builder), and the stats."""
    config = DecoderSettings(
        model=files["mtp-agreeing"], draft=files[head], method=method, remember_requests=False, **settings
    )
    target, draft = Model(files["mtp-agreeing"], LOAD), Model(files[head], LOAD)
    try:
        decoder = SpeculativeDecoder(target, make_proposer(config, target, draft), config.speculation())
        decoder.calibrate()
        answers = []
        for seed in seeds:
            params = SamplingParams(**{**sampling.__dict__, "seed": seed})
            deltas = decoder.generate(target.tokenize(PROMPT), params, max_tokens=tokens, ignore_eos=True)
            answers.append([t for d in deltas for t in d.tokens])
        return answers, decoder.stats
    finally:
        target.close()
        draft.close()


def test_a_head_file_is_known_from_its_header_and_drafts_as_the_draft(files):
    assert inspect_model(files["eagle3-agreeing"])["drafter"] == {"kind": "eagle3", "target_layers": [0, 1, 1]}
    assert HEAD_SUPPORT["eagle3"] is None
    target, head = Model(files["mtp-agreeing"], LOAD), Model(files["eagle3-agreeing"], LOAD)
    try:
        assert head.head_kind == "eagle3" and target.head_kind is None
        config = DecoderSettings(model=files["mtp-agreeing"], draft=files["eagle3-agreeing"], method="draft")
        proposer = make_proposer(config, target, head)
        assert isinstance(proposer, Eagle3Proposer) and proposer.source == "eagle3" and proposer.model is head
    finally:
        target.close()
        head.close()


def test_the_target_keeps_its_layer_inputs_and_the_head_encodes_them(files):
    """Every layer of the synthetic target is fed the token's embedding (its trunk adds nothing): the rows kept for
    the head are E[t] three times, and the agreeing head's fc passes layer 0's on, so g is E[t]."""
    design, tensors = synthetic.build()
    embed = tensors["mtp-agreeing"]["token_embd.weight"]
    target, head = Model(files["mtp-agreeing"], LOAD), Model(files["eagle3-agreeing"], LOAD)
    try:
        proposer = Eagle3Proposer(head, target)
        tokens = target.tokenize(PROMPT)
        target.prefill(tokens)
        features = target.layer_inputs.rows.rows(0, 0, len(tokens))
        assert features.shape == (len(tokens), 3 * synthetic.N_EMBD)
        expected = np.tile(embed[tokens], 3)
        assert np.allclose(features, expected, atol=1e-5)
        assert np.allclose(proposer.head.encode(features), embed[tokens], atol=1e-4)
        target.forget_from(0)
        assert target.layer_inputs.rows.rows(0, 0, 1) is None  # the rows follow the KV cache
    finally:
        target.close()
        head.close()


def test_a_reopened_target_context_gets_a_new_head_context(files):
    """The head borrows the target's context (ctx_other): a reopen closes it first, and the next proposal opens a
    new one that drafts as before (NEXT after NEXT: the target's own greedy answer)."""
    import torch

    design, _ = synthetic.build()
    target, head = Model(files["mtp-agreeing"], LOAD), Model(files["eagle3-agreeing"], LOAD)
    try:
        proposer = Eagle3Proposer(head, target, p_min=0.0)
        prompt = target.tokenize(PROMPT)
        history = [*prompt, int(design.next_token[prompt[-1]])]
        drafts = []
        for n_seq in (1, 2):
            target.reopen(n_seq)
            proposer.start(0, prompt, GREEDY, torch.device("cpu"), 0)
            target.prefill(history[:-1])
            [proposal] = proposer.propose([(0, history, 3)])
            drafts.append(proposal.tokens)
        first = int(design.next_token[history[-1]])
        assert (
            drafts[0]
            == drafts[1]
            == [first, int(design.next_token[first]), int(design.next_token[design.next_token[first]])]
        )
    finally:
        target.close()
        head.close()


@pytest.mark.parametrize("head", synthetic.EAGLE3_HEADS)
def test_greedy_with_either_head_is_plain_decoding(files, pinned, head):
    [plain], _ = answer(files, "none", head)
    [drafted], stats = answer(files, "draft", head, p_min=0.0)
    assert stats.drafted > 0
    assert drafted == plain


def test_the_agreeing_head_drafts_most_of_the_answer_and_is_kept(files, pinned):
    _, stats = answer(files, "draft")
    assert stats.drafted >= TOKENS // 2, stats.to_dict()
    assert stats.accepted / stats.drafted >= 0.9, stats.to_dict()


def test_the_stats_count_the_heads_drafts_under_its_own_name(files, pinned):
    _, stats = answer(files, "draft")
    counts = {"drafted": stats.drafted, "accepted": stats.accepted, "steps": stats.speculative_steps}
    assert stats.by_proposer == {"eagle3": counts}, stats.by_proposer
    assert stats.draft_model_bytes and stats.draft_model_bytes > 0  # the head's weights are its own


def test_the_planner_stops_drafting_from_the_random_head(files, pinned):
    [tokens], stats = answer(files, "draft", "eagle3-random", p_min=0.0)
    assert len(tokens) == TOKENS
    assert stats.drafted <= TOKENS // 4, stats.to_dict()
    assert stats.accepted <= stats.drafted // 4, stats.to_dict()


def test_sampled_drafting_keeps_the_targets_answer_for_each_seed(files, pinned):
    """Point-mass drafts are verified by draws fixed by (seed, position): a seed gives plain sampling's answer."""
    hot = SamplingParams(temperature=1.0)
    plain, _ = answer(files, "none", sampling=hot, seeds=range(3), tokens=24)
    drafted, stats = answer(files, "draft", sampling=hot, seeds=range(3), tokens=24, p_min=0.0)
    assert drafted == plain
    assert stats.drafted > 0


def test_auto_drafts_with_the_head_beside_lookup(files, pinned):
    [plain], _ = answer(files, "none")
    [drafted], stats = answer(files, "auto")
    assert drafted == plain
    assert stats.by_proposer.get("eagle3", {}).get("drafted", 0) > 0, stats.by_proposer


def test_a_head_for_layers_the_target_lacks_is_refused_with_a_sentence(files, tmp_path, monkeypatch):
    """llama.cpp aborts on a layer past the target's: the head is refused before a layer is switched on."""
    monkeypatch.setattr(synthetic_eagle3, "TARGET_LAYERS", (0, 1, 5))
    path = tmp_path / "eagle3-deep.gguf"
    synthetic_eagle3.write(path, "eagle3-agreeing", synthetic.SEED)
    target, head = Model(files["mtp-agreeing"], LOAD), Model(path, LOAD)
    try:
        with pytest.raises(InvalidSettingError, match="reads layer 5; the target's layers are 0 to 1"):
            Eagle3Proposer(head, target)
        assert target.layer_inputs is None
    finally:
        target.close()
        head.close()


def test_targets_whose_layers_llama_cpp_cannot_show_are_named():
    assert layer_input_problem("qwen35", 2, [0, 1, 1]) is None
    assert "gemma3" in (layer_input_problem("gemma3", 26, [2, 13, 23]) or "")
    assert "layer 26" in (layer_input_problem("llama", 26, [2, 13, 26]) or "")


def write_dflash_head(path):
    """A DFlash head for the synthetic target (random weights, llama.cpp's keys and tensors): llama.cpp loads it and
    can drive it; SpecChat does not draft with DFlash heads."""
    import gguf

    rng = np.random.default_rng(1)
    n, ff, heads, dim = synthetic.N_EMBD, synthetic.N_FF, 2, 32

    def rand(*shape):
        return rng.normal(0.0, 1.0 / np.sqrt(shape[-1]), size=shape).astype(np.float32)

    ones = {k: np.ones(w, dtype=np.float32) for k, w in [("enc.output_norm", n), ("output_norm", n)]}
    ones |= {f"blk.0.{k}": np.ones(w, dtype=np.float32) for k, w in [("attn_norm", n), ("ffn_norm", n)]}
    ones |= {f"blk.0.{k}": np.ones(dim, dtype=np.float32) for k in ("attn_q_norm", "attn_k_norm")}
    tensors = {"fc": rand(n, 2 * n), **{f"blk.0.attn_{k}": rand(heads * dim, n) for k in "qkv"}}
    tensors |= {"blk.0.attn_output": rand(n, heads * dim), "blk.0.ffn_gate": rand(ff, n), "blk.0.ffn_up": rand(ff, n)}
    tensors |= {"blk.0.ffn_down": rand(n, ff), **ones}
    writer = gguf.GGUFWriter(str(path), "dflash")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(synthetic.CONTEXT)
    writer.add_embedding_length(n)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_key_length(dim)
    writer.add_value_length(dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_array("dflash.target_layers", [0, 1])
    writer.add_uint32("dflash.target_hidden_size", n)
    writer.add_uint32("dflash.block_size", 4)
    synthetic._add_vocab(writer, synthetic.build_vocab())
    for name, array in tensors.items():
        writer.add_tensor(f"{name}.weight", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("method", ["draft", "auto"])
def test_a_dflash_head_is_refused_with_the_sentence_the_models_window_shows(files, tmp_path, method):
    path = write_dflash_head(tmp_path / "dflash-random.gguf")
    sentence = HEAD_SUPPORT["dflash"]
    assert sentence and inspect_model(path)["drafter"] == {"kind": "dflash", "target_layers": [0, 1]}
    assert check_pair(files["mtp-agreeing"], path).reason == sentence
    target, head = Model(files["mtp-agreeing"], LOAD), Model(path, LOAD)  # llama.cpp loads it: no abort
    try:
        assert head.head_kind == "dflash"
        config = DecoderSettings(model=files["mtp-agreeing"], draft=str(path), method=method)
        with pytest.raises(InvalidSettingError, match=re.escape(sentence)):
            make_proposer(config, target, head)
        assert target.layer_inputs is None
    finally:
        target.close()
        head.close()


def test_the_bench_and_server_loader_gives_a_hybrid_target_room_to_roll_back_a_heads_drafts(files, pinned):
    """build_decoder (the bench's, the server's): the head given as --draft on a hybrid target loads the target with
    recurrent snapshots, so it drafts (without them, speculation would be off for the whole answer)."""
    from engine.decoding.loader import build_decoder

    decoder = build_decoder(
        DecoderSettings(
            model=files["mtp-agreeing"], draft=files["eagle3-agreeing"], method="draft", threads=1, max_draft=4
        )
    )
    try:
        assert decoder.target.max_rollback == 4
        decoder.calibrate()
        for _ in decoder.generate(decoder.target.tokenize(PROMPT), GREEDY, max_tokens=TOKENS, ignore_eos=True):
            pass
        assert decoder.stats.by_proposer.get("eagle3", {}).get("accepted", 0) >= TOKENS // 2, decoder.stats.to_dict()
    finally:
        draft = decoder.loop.proposer.model
        decoder.target.close()
        if draft is not None:
            draft.close()
