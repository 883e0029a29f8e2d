"""The synthetic models with a built-in drafter (engine/measure/synthetic.py, issue 65): they load in llama.cpp,
decode greedily as designed, `inspect` names their drafter, and their MTP heads draft what their names say when
driven as `--method mtp` drives them: the bench's decoder (loader.build_decoder), the step loop and MtpProposer
(catch-up, drafts, accept) over llama.cpp's own MTP graph. Drafts are of a fixed length (no planner, p_min 0), so
what each head drafts and what the target keeps follow from the design alone."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass

import llama_cpp
import numpy as np
import pytest

from engine import models
from engine.decoding.loader import DecoderSettings, build_decoder, require_rollback
from engine.decoding.mtp_check import mtp_problem
from engine.decoding.proposers.mtp import MtpProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams
from engine.errors import EngineError, SpeculationUnavailable
from engine.measure import synthetic
from engine.modelfiles.gguf_header import TensorInfo, metadata_problem, read_gguf_metadata
from engine.modelfiles.model_inspect import drafter_of

from support.rollback import keep_recurrent_state_on_rollback

PROMPT = "Hello there, how are you?"
STEPS = 64
DRAFT = 3  # drafts a step, every step: llama-server's draft-mtp default (n_max 3)


@pytest.fixture(scope="session")
def synthetic_files(tmp_path_factory):
    """The writer's files, written once through its command line (the last stdout line is the JSON map)."""
    out = tmp_path_factory.mktemp("synthetic")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert synthetic.main([str(out), "--json"]) == 0
    lines = buffer.getvalue().splitlines()
    return json.loads(lines[-1])


@pytest.fixture(scope="session")
def design():
    return synthetic.build()[0]


def _prompt_tokens(path: str) -> list[int]:
    vocab = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    return vocab.tokenize(PROMPT.encode())


def test_the_writer_names_each_head_and_writes_a_sane_header(synthetic_files):
    assert {"mtp-agreeing", "mtp-random", "mtp-half", "mtp-half-context"} <= set(synthetic_files)
    for path in (synthetic_files[name] for name in synthetic.MTP_FILES):
        meta = read_gguf_metadata(path)
        assert metadata_problem(meta, path) is None  # no duplicate token strings, sane counts
        assert meta["qwen35.context_length"] >= 4096
        assert meta["qwen35.nextn_predict_layers"] == 1
        assert meta["qwen35.block_count"] == 3


@pytest.mark.parametrize("name", synthetic.HEADS)
def test_each_file_loads_tokenizes_any_text_and_decodes_greedily_as_designed(synthetic_files, design, name):
    path = synthetic_files[name]
    llm = llama_cpp.Llama(path, n_ctx=4096, verbose=False, seed=7)
    assert llm.n_ctx() >= 4096
    text = "héllo wörld: 日本語 🙂 \t\n\x01 end"
    tokens = llm.tokenize(text.encode(), add_bos=False)
    # byte fallback covers every UTF-8 byte; SentencePiece puts its space before the text
    assert llm.detokenize(tokens).decode() == " " + text
    prompt = llm.tokenize(PROMPT.encode())
    first = llm.create_completion(PROMPT, max_tokens=24, temperature=0.0)["choices"][0]["text"]
    again = llm.create_completion(PROMPT, max_tokens=24, temperature=0.0)["choices"][0]["text"]
    assert first == again
    expected, last = [], prompt[-1]
    for _ in range(24):
        last = int(design.next_token[last])
        expected.append(last)
    assert first == llm.detokenize(expected).decode()  # printable pieces only, never the end of text


@pytest.mark.parametrize("name", synthetic.MTP_FILES)
def test_inspect_names_the_mtp_drafter(synthetic_files, capsys, name):
    assert models.main(["inspect", synthetic_files[name], "--json"]) == 0
    info = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert info["drafter"] == {"kind": "mtp", "layers": 1}
    assert info["architecture"] == "qwen35"
    assert info["vocabulary"]["type"] == "SPM"
    assert info["context"] >= 4096


def test_inspect_finds_no_drafter_in_smollm(smollm_path, capsys):
    assert models.main(["inspect", str(smollm_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert info["drafter"] is None
    assert info["architecture"] == "llama"
    assert info["vocabulary"] == {"model": "gpt2", "type": "BPE", "size": 49152}


def _tensor(name: str) -> TensorInfo:
    return TensorInfo(name, 0, (64, 128))


def test_drafter_from_header_facts():
    eagle = {"general.architecture": b"eagle3", "eagle3.target_layers": [2, 15, 28]}
    assert drafter_of(eagle, []) == {"kind": "eagle3", "target_layers": [2, 15, 28]}
    dflash = {"general.architecture": b"dflash", "dflash.target_layers": [1, 9]}
    assert drafter_of(dflash, []) == {"kind": "dflash", "target_layers": [1, 9]}
    claimed = {"general.architecture": b"glm4moe", "glm4moe.block_count": 47, "glm4moe.nextn_predict_layers": 1}
    assert drafter_of(claimed, [_tensor("blk.0.attn_norm.weight")]) is None  # the converter left the head out
    assert drafter_of(claimed, [_tensor("blk.46.nextn.eh_proj.weight")]) == {"kind": "mtp", "layers": 1}
    unkeyed = {"general.architecture": b"qwen35", "qwen35.block_count": 5}
    heads = [_tensor("blk.3.nextn.eh_proj.weight"), _tensor("blk.4.nextn.eh_proj.weight")]
    assert drafter_of(unkeyed, heads) == {"kind": "mtp", "layers": 2}


@dataclass(frozen=True)
class Run:
    tokens: list[int]  # the answer after the prompt
    drafted: int
    accepted: int
    proposals: list[tuple[list[int], list[int]]]  # (the history the head drafted after, its drafts)


def run(path: str, method: str, monkeypatch: pytest.MonkeyPatch | None = None) -> Run:
    """STEPS greedy tokens after PROMPT through the bench's decoder, drafts of DRAFT (no planner, no cutoff), every
    proposal of the MTP head on record."""
    proposals: list[tuple[list[int], list[int]]] = []
    real = MtpProposer.propose

    def propose(self, wants):
        out = real(self, wants)
        proposals.extend((list(history), list(p.tokens)) for (_, history, _), p in zip(wants, out))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MtpProposer, "propose", propose)
        settings = DecoderSettings(
            model=path, method=method, threads=1, remember_requests=False, adaptive=False, max_draft=DRAFT, p_min=0.0
        )
        decoder = build_decoder(settings)
        try:
            prompt = decoder.target.tokenize(PROMPT)
            deltas = decoder.generate(prompt, SamplingParams(temperature=0.0), max_tokens=STEPS, ignore_eos=True)
            tokens = [t for d in deltas for t in d.tokens]
            return Run(tokens, decoder.stats.drafted, decoder.stats.accepted, proposals)
        finally:
            decoder.target.close()


def kept(proposal: tuple[list[int], list[int]], said: list[int]) -> int:
    """How many of a proposal's drafts the target keeps, `said` being its whole greedy text (prompt and answer)."""
    history, drafts = proposal
    n = 0
    while n < len(drafts) and drafts[n] == said[len(history) + n]:
        n += 1
    return n


@pytest.fixture(scope="module")
def runs(synthetic_files):
    """Each file's plain greedy answer and its `--method mtp` run."""
    return {
        name: (run(synthetic_files[name], "none").tokens, run(synthetic_files[name], "mtp"))
        for name in synthetic.MTP_FILES
    }


@pytest.mark.parametrize("name", synthetic.MTP_FILES)
def test_greedy_mtp_is_plain_decoding_and_every_kept_draft_is_counted(synthetic_files, runs, name):
    plain, mtp = runs[name]
    assert mtp.tokens == plain
    assert len(plain) == STEPS
    prompt = _prompt_tokens(synthetic_files[name])
    said = prompt + plain
    assert mtp.proposals
    for history, drafts in mtp.proposals:  # fixed lengths: DRAFT, or what the token budget leaves
        assert len(drafts) == min(DRAFT, STEPS - (len(history) - len(prompt)) - 1)
    assert mtp.drafted == sum(len(drafts) for _, drafts in mtp.proposals)
    assert mtp.accepted == sum(kept(p, said) for p in mtp.proposals)


@pytest.mark.parametrize("name", ["mtp-agreeing", "mtp-half", "mtp-half-context"])
def test_each_head_drafts_its_designed_tokens_through_the_step_loop(runs, design, name):
    """After token x the head drafts table[x], then table[table[x]]...: its own drafts fed back in, each one's
    position and row as the catch-up and the drafting give them."""
    table = design.head_tables[name]
    for history, drafts in runs[name][1].proposals:
        expected, token = [], history[-1]
        for _ in drafts:
            token = int(table[token])
            expected.append(token)
        assert drafts == expected, history


def test_the_agreeing_head_is_always_kept(runs):
    mtp = runs["mtp-agreeing"][1]
    assert mtp.drafted >= STEPS // 2
    assert mtp.accepted == mtp.drafted  # built to agree exactly: anything less is a protocol slip


def test_the_random_head_is_almost_never_kept(runs):
    mtp = runs["mtp-random"][1]
    assert mtp.drafted >= STEPS // 2  # fixed lengths: it drafts every step all the same
    assert mtp.accepted / mtp.drafted <= 0.05


def test_the_half_head_is_kept_exactly_where_its_table_agrees_with_the_target(runs, design):
    """The target keeps a draft while the head's chain (table) and the target's (NEXT) agree, from the design alone;
    right on half the pieces, a coin per draft keeps 0.5 + 0.25 + 0.125 of 3 drafted (0.29)."""
    mtp = runs["mtp-half"][1]
    table, nxt = design.head_tables["mtp-half"], design.next_token
    expected = 0
    for history, drafts in mtp.proposals:
        guess = target = history[-1]
        for _ in drafts:
            guess, target = int(table[guess]), int(nxt[target])
            if guess != target:
                break
            expected += 1
    assert mtp.accepted == expected
    assert 0.2 <= mtp.accepted / mtp.drafted <= 0.4


def test_the_context_files_answer_depends_on_earlier_tokens(synthetic_files, runs, design):
    """Its recurrent state decides the next token: a token is followed by different tokens in one answer, and the
    answer is not the context-free successor table's (which the other files follow, test above)."""
    plain, _ = runs["mtp-half-context"]
    said = _prompt_tokens(synthetic_files["mtp-half-context"])[-1:] + plain
    followers: dict[int, set[int]] = {}
    for a, b in zip(said, said[1:]):
        followers.setdefault(a, set()).add(b)
    assert any(len(f) > 1 for f in followers.values())
    assert sum(int(design.next_token[a]) != b for a, b in zip(said, said[1:])) >= STEPS // 4


def test_the_context_files_rejected_drafts_are_rolled_back_and_its_answer_is_plain_decodings(synthetic_files, runs):
    """Most steps reject a draft: each rolls the hybrid target's recurrent state back (n_rs_seq snapshots), and the
    answer is still plain decoding's, which it would not be after a wrong rollback (the test below)."""
    plain, mtp = runs["mtp-half-context"]
    assert mtp.tokens == plain
    said = _prompt_tokens(synthetic_files["mtp-half-context"]) + plain
    rejecting = sum(kept(p, said) < len(p[1]) for p in mtp.proposals)
    assert rejecting >= STEPS // 4, (rejecting, len(mtp.proposals))


def test_a_recurrent_state_left_holding_rejected_drafts_changes_only_the_context_files_answer(
    synthetic_files, runs, monkeypatch
):
    """The failure the test above guards against, made on purpose: a rollback that cuts the KV cache but leaves the
    recurrent state as the rejected drafts left it. The context file's answer changes; mtp-half's cannot."""
    keep_recurrent_state_on_rollback(monkeypatch)
    assert run(synthetic_files["mtp-half-context"], "mtp").tokens != runs["mtp-half-context"][0]
    assert run(synthetic_files["mtp-half"], "mtp").tokens == runs["mtp-half"][0]


def test_a_hybrid_target_without_snapshots_is_not_speculated_on(synthetic_files):
    """With no recurrent snapshots (n_rs_seq 0) a rejected draft could not be undone: speculation is refused before a
    draft is made, and a roll-back into a decode raises rather than let llama.cpp read a state it does not have."""
    target = Model(synthetic_files["mtp-half"], LoadSettings(n_ctx=512, threads=1, mtp=True, n_rs_seq=0))
    try:
        assert target.max_rollback == 0
        with pytest.raises(SpeculationUnavailable):
            require_rollback(target)
        prompt = target.tokenize(PROMPT)
        target.prefill(prompt)
        target.decode_multi([5, 6, 7, 8], range(len(prompt), len(prompt) + 4), [0] * 4, [True] * 4)
        with pytest.raises(EngineError):
            target.forget_from(len(prompt) + 1)
    finally:
        target.close()


def test_no_mtp_context_where_llama_cpp_would_abort(synthetic_files, smollm_path):
    llama_cpp.llama_backend_init()
    for path, why in ((synthetic_files["mtp-agreeing"], "load_mtp"), (str(smollm_path), "no MTP")):
        params = llama_cpp.llama_model_default_params()
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        assert model
        try:
            problem = mtp_problem(model, loaded_with_mtp=False)
            assert problem is not None and why in problem
        finally:
            llama_cpp.llama_model_free(model)


def test_the_design_tables_are_what_the_names_say(design):
    pieces = design.vocab.pieces
    right = np.mean([design.head_tables["mtp-half"][p] == design.next_token[p] for p in pieces])
    assert right == pytest.approx(0.5, abs=0.01)
    assert all(design.next_token[p] in pieces for p in range(len(design.vocab.tokens)))
