"""The synthetic models with a built-in drafter (engine/measure/synthetic.py, issue 65): they load in llama.cpp,
decode greedily as designed, `inspect` names their drafter, and their MTP heads agree with the target as their
names say when driven through llama.cpp's own MTP graph (engine/decoding/mtp_head.py)."""

from __future__ import annotations

import contextlib
import io
import json

import llama_cpp
import numpy as np
import pytest

from engine import models
from engine.decoding.mtp_head import MtpModel, head_agreement, mtp_problem, speculative_greedy
from engine.errors import SpeculationUnavailable
from engine.measure import synthetic
from engine.modelfiles.gguf_header import TensorInfo, metadata_problem, read_gguf_metadata
from engine.modelfiles.model_inspect import drafter_of

PROMPT = "Hello there, how are you?"
STEPS = 64


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
    assert set(synthetic_files) == {"mtp-agreeing", "mtp-random", "mtp-half"}
    for path in synthetic_files.values():
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


@pytest.mark.parametrize("name", synthetic.HEADS)
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


@pytest.fixture(scope="module")
def agreement(synthetic_files):
    """Each head's guesses along one plain greedy answer, through llama.cpp's MTP graph."""
    rates = {}
    for name, path in synthetic_files.items():
        with MtpModel(path, n_ctx=4096, threads=1) as model:
            rates[name] = head_agreement(model, _prompt_tokens(path), STEPS)
    return rates


def test_the_agreeing_head_predicts_the_targets_next_token(agreement, design):
    result = agreement["mtp-agreeing"]
    assert result.rate >= 0.9
    assert result.rate == 1.0  # built to agree exactly: anything less is a protocol slip
    assert all(int(design.next_token[a]) == b for a, b in zip(result.target_tokens, result.target_tokens[1:]))


def test_the_random_head_rarely_agrees(agreement):
    assert agreement["mtp-random"].rate <= 0.1


def test_the_half_head_agrees_about_half_the_time(agreement, design):
    result = agreement["mtp-half"]
    assert 0.3 <= result.rate <= 0.7
    # and exactly where its table says it is right: on the answer's tokens whose designed guess is the next token
    table = design.head_tables["mtp-half"]
    expected = sum(int(table[t]) == int(design.next_token[t]) for t in result.target_tokens)
    assert result.agreed == expected


def test_every_head_sees_the_same_plain_answer(agreement):
    answers = {tuple(result.target_tokens) for result in agreement.values()}
    assert len(answers) == 1  # the head never changes what the target says


@pytest.mark.parametrize(
    ("name", "low", "high"), [("mtp-agreeing", 1.0, 1.0), ("mtp-random", 0.0, 0.05), ("mtp-half", 0.2, 0.4)]
)
def test_speculative_greedy_with_each_head_is_plain_decoding(synthetic_files, agreement, name, low, high):
    """3 drafts a step, verified in one target batch, rejected ones rolled back (n_rs_seq): the answer is plain
    decoding's; acceptance 1 with the agreeing head, ~0 with the random one, and with the half one what a coin
    per draft gives (0.5 + 0.25 + 0.125 of 3 drafted: 0.29)."""
    path = synthetic_files[name]
    with MtpModel(path, n_ctx=4096, n_rs_seq=3, threads=1) as model:
        run = speculative_greedy(model, _prompt_tokens(path), STEPS, n_draft=3)
    assert run.tokens == agreement[name].target_tokens
    assert run.drafted > 0
    assert low <= run.acceptance <= high


def test_a_hybrid_target_without_snapshots_refuses_to_roll_back(synthetic_files):
    path = synthetic_files["mtp-half"]
    with MtpModel(path, n_ctx=4096, n_rs_seq=0, threads=1) as model, pytest.raises(SpeculationUnavailable):
        speculative_greedy(model, _prompt_tokens(path), STEPS, n_draft=3)


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
    with pytest.raises(SpeculationUnavailable, match="no MTP"):
        MtpModel(smollm_path, n_ctx=512, threads=1)


def test_the_design_tables_are_what_the_names_say(design):
    pieces = design.vocab.pieces
    right = np.mean([design.head_tables["mtp-half"][p] == design.next_token[p] for p in pieces])
    assert right == pytest.approx(0.5, abs=0.01)
    assert all(design.next_token[p] in pieces for p in range(len(design.vocab.tokens)))
