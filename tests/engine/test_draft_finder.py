"""A draft for any target (issue 53), against the local hub serving real GGUF files: the family's smaller files
are checked with llama.cpp's vocabulary rules from their headers alone (range reads, nothing downloaded), a
decoy of another vocabulary is marked as not fitting with the reason, and the same comes out of
`python -m engine.models search` and `drafts` with --json."""

import json

import pytest

from engine.measure.real_pair import DRAFT, TARGET, pair_dir
from engine.modelfiles import model_store
from engine.modelfiles.draft_finder import family_of, find_drafts
from engine.modelfiles.embedded import embedded_gemma_path, embedded_model_path
from engine.modelfiles.gguf_header import read_gguf_metadata
from engine.models import main

from support.hub_server import LocalHub
from support.tiny import write_tiny_gguf

SMOL_REPO, SMOL_FILE = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf"
GEMMA_REPO, GEMMA_FILE = "ggml-org/gemma-3-270m-GGUF", "gemma-3-270m-Q4_K_M.gguf"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finder")
    smol, gemma = embedded_model_path(), embedded_gemma_path()
    hub = LocalHub().start()
    hub.add_file(SMOL_REPO, SMOL_FILE, smol)
    hub.set_info(SMOL_REPO, downloads=900)
    hub.add_file("second/SmolLM2-135M-Instruct-GGUF", SMOL_FILE, smol)
    hub.add_file(
        "decoy/SmolLM2-135M-Instruct-GGUF",
        "smollm2-tiny-q8_0.gguf",
        write_tiny_gguf(folder / "decoy.gguf", payload_bytes=100_000),
    )
    hub.add_file(
        "bigger/SmolLM2-1.7B-Instruct-GGUF",
        "smollm2-1.7b-instruct-q4_k_m.gguf",
        write_tiny_gguf(folder / "big.gguf", payload_bytes=smol.stat().st_size + 1),
    )
    hub.add_file(GEMMA_REPO, GEMMA_FILE, gemma)
    hub.add_file("unsloth/gemma-3-270m-it-GGUF", "gemma-3-270m-it-Q4_K_M.gguf", gemma)
    hub.add_file("decoy/gemma-3-270m-GGUF", "gemma-3-270m-Q2_K.gguf", smol)  # SmolLM2's vocabulary
    target, draft = pair_dir() / TARGET.file_name, pair_dir() / DRAFT.file_name
    if target.is_file() and draft.is_file():
        hub.add_file("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", TARGET.file_name, target)
        hub.add_file("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", DRAFT.file_name, draft)
        hub.add_file("decoy/Qwen2.5-Coder-0.5B-Instruct-GGUF", DRAFT.file_name, smol)
    yield hub
    hub.stop()


@pytest.fixture
def on_hub(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    hub.requests.clear()
    return hub


def by_repo(search):
    return {c.repo_id: c for c in search.candidates if c.repo_id}


def no_file_was_downloaded(hub) -> bool:
    for request in hub.byte_requests():
        start, _, end = (request.range or "bytes=0-").removeprefix("bytes=").partition("-")
        if not end or int(end) - int(start) > 64 * 2**20:
            return False
    return True


def test_the_family_comes_from_the_header_else_the_repo_name():
    assert family_of(read_gguf_metadata(embedded_model_path())) == "smollm2"
    assert family_of({"general.architecture": b"llama"}, "someone/Mistral-7B-Instruct-v0.3-GGUF") == "Mistral"
    assert family_of({}, "bartowski/Llama-3.2-3B-Instruct-GGUF") == "Llama-3.2"
    assert family_of({}, "microsoft/phi-4-GGUF") == "phi-4"


def test_smollm2s_drafts_are_checked_from_headers_and_the_decoy_is_refused(on_hub):
    found = find_drafts(SMOL_REPO, SMOL_FILE, installed=[embedded_gemma_path()])
    hub_drafts = by_repo(found)
    twin = hub_drafts["second/SmolLM2-135M-Instruct-GGUF"]
    assert twin.compatible and "little to gain" in twin.reason  # the same size as its target
    decoy = hub_drafts["decoy/SmolLM2-135M-Instruct-GGUF"]
    assert decoy.compatible is False and "differ" in decoy.reason, decoy.reason
    bigger = hub_drafts["bigger/SmolLM2-1.7B-Instruct-GGUF"]
    assert bigger.compatible is False and "larger than the target" in bigger.reason and bigger.bytes_read == 0
    gemma = next(c for c in found.candidates if c.path is not None)
    assert gemma.compatible is False  # on this machine, larger and of another vocabulary
    assert found.candidates[0] is twin  # usable ones first
    assert no_file_was_downloaded(on_hub)
    size = embedded_model_path().stat().st_size
    assert 0 < found.bytes_read < size / 5, (found.bytes_read, size)
    print(f"SmolLM2: {found.bytes_read} bytes of headers read for {len(found.candidates)} candidates")


def test_gemmas_drafts_by_the_same_rules(on_hub):
    found = find_drafts(GEMMA_REPO, GEMMA_FILE)
    hub_drafts = by_repo(found)
    assert found.family == "gemma-3"
    assert hub_drafts["unsloth/gemma-3-270m-it-GGUF"].compatible
    assert hub_drafts["decoy/gemma-3-270m-GGUF"].compatible is False
    assert no_file_was_downloaded(on_hub)


def test_the_real_pairs_draft_is_proposed_before_download(on_hub):
    target = pair_dir() / TARGET.file_name
    if not target.is_file():
        pytest.skip("the Qwen2.5-Coder pair is not fetched (python -m engine.measure.real_pair)")
    found = find_drafts("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", TARGET.file_name)
    assert found.candidates[0].repo_id == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF" and found.candidates[0].compatible
    assert by_repo(found)["decoy/Qwen2.5-Coder-0.5B-Instruct-GGUF"].compatible is False
    assert no_file_was_downloaded(on_hub)
    files = TARGET.size + DRAFT.size + embedded_model_path().stat().st_size
    assert found.bytes_read < files / 20
    print(f"Qwen pair: {found.bytes_read} bytes of headers read, of {files} bytes in those files")


def test_the_cli_searches_and_lists_drafts_as_json(on_hub, capsys):
    assert main(["search", "smollm2", "135m", "--json"]) == 0
    repos = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    smol = next(r for r in repos if r["repo_id"] == SMOL_REPO)
    assert smol["downloads"] == 900
    assert smol["files"] == [
        {
            "filename": SMOL_FILE,
            "parts": [SMOL_FILE],
            "quantization": "Q4_1",
            "size": embedded_model_path().stat().st_size,
        }
    ]

    assert main(["drafts", SMOL_REPO, SMOL_FILE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    verdicts = {(c["repo_id"], c["filename"]): c["compatible"] for c in out["candidates"]}
    assert verdicts[("second/SmolLM2-135M-Instruct-GGUF", SMOL_FILE)] is True
    assert verdicts[("decoy/SmolLM2-135M-Instruct-GGUF", "smollm2-tiny-q8_0.gguf")] is False
    assert all({"repo_id", "filename", "size", "compatible", "reason"} <= set(c) for c in out["candidates"])
    assert out["bytes_read"] > 0


def test_the_cli_says_what_went_wrong(on_hub, capsys):
    on_hub.api_fault = "html"
    try:
        assert main(["search", "smollm2"]) == 1
    finally:
        on_hub.api_fault = None
    assert "Hugging Face hub" in capsys.readouterr().err
    assert main(["drafts", SMOL_REPO, "no-such-file.gguf"]) == 1
    assert "no-such-file.gguf" in capsys.readouterr().err
    assert model_store.list_models() == []  # nothing was installed by looking
