"""Bad input gets a clear exception type and message, and the process lives on."""

import shutil

import pytest

from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.loader import DecoderSettings
from engine.decoding.proposers.lookup import LookupProposer
from engine.decoding.runtime import LoadSettings, Model
from engine.decoding.sampling import SamplingParams
from engine.decoding.speculation_config import SpeculationConfig
from engine.errors import ContextOverflowError, InvalidSettingError, ModelFileError, VocabMismatchError
from engine.lab.bench import main as bench_main
from engine.modelfiles.embedded import embedded_model_path
from engine.modelfiles.vocab_check import require_compatible

from support.tiny import write_tiny_gguf


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        Model(tmp_path / "nope.gguf")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"<html>404 Not Found</html>" * 100)
    with pytest.raises(ModelFileError, match="not a GGUF"):
        Model(path)


def test_truncated_gguf_is_refused_without_killing_the_process(tmp_path, gemma_path):
    path = tmp_path / "cut.gguf"
    with open(gemma_path, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(5_000_000))  # a download cut short: a valid header, missing tensors
    with pytest.raises(ModelFileError, match="truncated"):
        Model(path)


def test_draft_with_another_vocabulary_is_refused(tmp_path, target):
    draft = Model(write_tiny_gguf(tmp_path / "other-vocab.gguf"), vocab_only=True)
    with pytest.raises(VocabMismatchError, match="cannot draft for"):
        require_compatible(target, draft)
    draft.close()


# Adaptive, as in the chat, with drafts of up to 8: these tests are about the context, and a model loaded with a
# context of its own times every verify size first (up to 49 rows: ~12 s here, 9 rows: ~1.5 s).
SHORT_DRAFTS = SpeculationConfig(max_draft=8)


@pytest.mark.slow
def test_prompt_longer_than_the_context(gemma_path):
    model = Model(gemma_path, LoadSettings(n_ctx=256, threads=2))
    decoder = SpeculativeDecoder(model, LookupProposer(), SHORT_DRAFTS)
    prompt = model.tokenize("word " * 400)
    with pytest.raises(ContextOverflowError, match="context holds 256"):
        list(decoder.generate(prompt, SamplingParams(temperature=0), max_tokens=4))
    # The same decoder still works afterwards.
    assert list(decoder.generate(model.tokenize("Hi"), SamplingParams(temperature=0), max_tokens=2))
    model.close()


@pytest.mark.slow
def test_generation_stops_cleanly_when_the_context_fills():
    model = Model(embedded_model_path(), LoadSettings(n_ctx=64, threads=2))  # SmolLM2: 240 tokens at half Gemma's cost
    decoder = SpeculativeDecoder(model, LookupProposer(), SHORT_DRAFTS)
    out = [
        t
        for d in decoder.generate(
            model.tokenize("Count: 1 2 3 4 5 6 7 8 9 10"),
            SamplingParams(temperature=0),
            max_tokens=500,
            ignore_eos=True,
        )
        for t in d.tokens
    ]
    assert decoder.stats.finish_reason == "context"
    assert decoder.stats.prompt_tokens + len(out) <= model.n_ctx  # llama.cpp rounds n_ctx up to 256
    model.close()


@pytest.mark.parametrize(
    "settings",
    [
        dict(method="draft"),  # no draft model given
        dict(method="medusa"),
        dict(max_draft=-3),
        dict(max_draft=100),
    ],
)
def test_out_of_range_speculation_settings(settings):
    with pytest.raises(InvalidSettingError):
        DecoderSettings(**settings).speculation()


def test_bench_cli_reports_bad_input_and_exits_non_zero(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "Hi"}\n')
    code = bench_main(
        [
            "--model",
            str(tmp_path / "missing.gguf"),
            "--method",
            "none",
            "--max-tokens",
            "4",
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "out.json"),
        ]
    )
    assert code == 2
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow
def test_bench_cli_end_to_end(tmp_path):
    import json

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "One, two, three, one, two, three, one,"}\n')
    out = tmp_path / "out.json"
    shutil.copy(embedded_model_path(), tmp_path / "m.gguf")  # a copy is a new file: checked and timed afresh
    assert (
        bench_main(
            [
                "--model",
                str(tmp_path / "m.gguf"),
                "--method",
                "lookup",
                "--max-tokens",
                "12",
                "--ignore-eos",
                "--threads",
                "2",
                "--max-draft",
                "8",
                "--prompts",
                str(prompts),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    run = json.loads(out.read_text())["runs"][0]
    assert set(run) >= {
        "id",
        "method",
        "text",
        "tokens",
        "decode_tokens_per_s",
        "ttft_s",
        "drafted",
        "accepted",
        "acceptance_rate",
        "mean_acceptance_length",
        "verify_steps",
    }
    assert len(run["tokens"]) == 12 and run["method"] == "lookup" and run["id"] == "a"
