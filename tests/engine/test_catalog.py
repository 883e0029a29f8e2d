"""The pair catalog, installed models and the pair compatibility check (llama.cpp's rules)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.decoding import pair_check
from engine.errors import ModelFileError
from engine.modelfiles import model_store
from engine.modelfiles.catalog import CatalogError, find_pair, load_catalog
from engine.modelfiles.downloads import DownloadJob
from engine.modelfiles.embedded import embedded_gemma_path
from engine.modelfiles.model_folder import local_path

from support.hub_server import LocalHub
from support.tiny import default_tokens, write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory):
    """Two files with one vocabulary, and one whose token 7 differs."""
    folder = tmp_path_factory.mktemp("vocab")
    other = default_tokens()
    other[7] = "\u2581other"
    return {
        "a": write_tiny_gguf(folder / "a.gguf", seed=1),
        "a_twin": write_tiny_gguf(folder / "a_twin.gguf", payload_bytes=4096, seed=2),
        "b": write_tiny_gguf(folder / "b.gguf", tokens=other, seed=3),
    }


# --- the catalog ---------------------------------------------------------------------------------
def test_the_catalog_has_the_pairs_the_app_offers():
    pairs = {p.id: p for p in load_catalog()}
    assert len(pairs) >= 6
    wanted = {
        "qwen2.5-7b-instruct": ("Qwen2.5-7B-Instruct", "qwen2.5-0.5b-instruct"),
        "llama-3.1-8b-instruct": ("Meta-Llama-3.1-8B-Instruct", "Llama-3.2-1B-Instruct"),
        "qwen2.5-coder-7b-instruct": ("qwen2.5-coder-7b-instruct", "qwen2.5-coder-0.5b-instruct"),
        "gemma-3-4b-it": ("gemma-3-4b-it", "gemma-3-270m-it"),
        "qwen3-8b": ("Qwen3-8B", "Qwen3-0.6B"),
        "smollm2-1.7b-instruct": ("smollm2-1.7b-instruct", "smollm2-135m-instruct"),  # the embedded model's family
    }
    for pair_id, (target, draft) in wanted.items():
        pair = pairs[pair_id]
        assert pair.target.filename.startswith(target) and pair.draft.filename.startswith(draft)
        assert pair.target.size_bytes > 3 * pair.draft.size_bytes  # the draft is the small one
        assert pair.family and pair.chat_template and pair.note and pair.target.quantization
    for pair in pairs.values():
        for f in pair.files:
            local_path(f.repo_id, f.filename, Path("/tmp/specchat-catalog-check"))  # safe names only


def test_unverified_entries_are_marked_as_such(tmp_path):
    raw = json.loads((ROOT / "resources" / "catalog.json").read_text())
    raw["pairs"][0]["verified"] = False
    (tmp_path / "c.json").write_text(json.dumps(raw))
    assert not load_catalog(tmp_path / "c.json")[0].verified
    del raw["pairs"][0]["verified"]
    (tmp_path / "c.json").write_text(json.dumps(raw))
    with pytest.raises(CatalogError, match="'verified' must be true or false"):
        load_catalog(tmp_path / "c.json")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["pairs"][0]["target"].update(filename="model.bin"), "not a .gguf file"),
        (lambda c: c["pairs"][0]["draft"].pop("repo_id"), "draft: 'repo_id' must be a non-empty string"),
        (lambda c: c["pairs"][0]["target"].update(repo_id="no-owner"), "must look like owner/name"),
        (lambda c: c["pairs"][0]["target"].update(size_bytes=-1), "size_bytes must be a positive"),
        (lambda c: c["pairs"].append(dict(c["pairs"][0])), "repeats pair ids"),
        (lambda c: c.pop("pairs"), "no list of 'pairs'"),
    ],
)
def test_a_malformed_catalog_is_refused_with_a_clear_message(tmp_path, edit, message):
    raw = json.loads((ROOT / "resources" / "catalog.json").read_text())
    edit(raw)
    (tmp_path / "c.json").write_text(json.dumps(raw))
    with pytest.raises(CatalogError, match=message):
        load_catalog(tmp_path / "c.json")


def test_a_missing_or_unreadable_catalog_is_named(tmp_path):
    with pytest.raises(CatalogError, match="missing"):
        load_catalog(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CatalogError, match="cannot be read"):
        load_catalog(tmp_path / "bad.json")
    with pytest.raises(CatalogError, match="No pair 'nope'"):
        find_pair("nope")


# --- a catalog pair, downloaded and listed ---------------------------------------------------------
def test_a_catalog_pair_downloads_from_the_hub_and_becomes_a_ready_pair(data_dir, vocab_files, monkeypatch):
    pair = find_pair("qwen3-8b")
    hub = LocalHub().start()
    try:
        hub.add_file(pair.target.repo_id, pair.target.filename, vocab_files["a"])
        hub.add_file(pair.draft.repo_id, pair.draft.filename, vocab_files["a_twin"])
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert model_store.pair_state(pair) == "absent"
        DownloadJob(model_store.catalog_requests(pair)[:1]).run()
        assert model_store.pair_state(pair) == "partial"
        target, draft = DownloadJob(model_store.catalog_requests(pair)).run()
    finally:
        hub.stop()
    assert model_store.pair_state(pair) == "installed"
    [ready] = model_store.installed_pairs()
    assert (ready.pair.id, ready.target, ready.draft) == ("qwen3-8b", target, draft)
    listed = {m.name: m for m in model_store.list_models()}
    assert listed[pair.draft.filename].repo_id == pair.draft.repo_id
    assert listed[pair.draft.filename].size_bytes == vocab_files["a_twin"].stat().st_size

    result = subprocess.run(
        [sys.executable, "-m", "engine.models", "list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
    )
    assert result.returncode == 0, result.stderr
    assert "Ready pairs (1)" in result.stdout and pair.target.filename in result.stdout and str(draft) in result.stdout


# --- installed models --------------------------------------------------------------------------
def test_adding_a_local_gguf_remembers_it_and_a_bad_file_changes_nothing(data_dir, vocab_files, tmp_path):
    added = model_store.add_local_model(vocab_files["b"])
    assert added.origin == model_store.LOCAL and added.path == vocab_files["b"]
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + b"\0" * 2000)
    with pytest.raises(ModelFileError, match="not a GGUF model"):
        model_store.add_local_model(not_gguf)
    with pytest.raises(ModelFileError, match="not found"):
        model_store.add_local_model(tmp_path / "missing.gguf")
    assert [m.path for m in model_store.list_models()] == [vocab_files["b"]]
    model_store.add_local_model(vocab_files["b"])  # twice is once
    assert len(model_store.list_models()) == 1


def test_deleting_forgets_a_local_file_but_keeps_it_and_deletes_a_download(data_dir, vocab_files):
    model_store.add_local_model(vocab_files["a"])
    assert model_store.delete_model(vocab_files["a"]) is False
    assert vocab_files["a"].is_file() and model_store.list_models() == []

    downloaded = local_path("tester/tiny-GGUF", "x.gguf")
    downloaded.parent.mkdir(parents=True)
    downloaded.write_bytes(vocab_files["a"].read_bytes())
    assert [m.origin for m in model_store.list_models()] == [model_store.DOWNLOADED]
    assert model_store.delete_model(downloaded) is True
    assert not downloaded.exists() and not downloaded.parent.exists()
    with pytest.raises(ModelFileError, match="not an installed model"):
        model_store.delete_model(vocab_files["b"])


def test_a_damaged_list_of_added_models_is_reported_not_overwritten(data_dir, vocab_files):
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / model_store.REGISTRY_FILE).write_text("[broken")
    with pytest.raises(ModelFileError, match="cannot be read"):
        model_store.add_local_model(vocab_files["a"])
    assert (data_dir / model_store.REGISTRY_FILE).read_text() == "[broken"


# --- compatibility ---------------------------------------------------------------------------------
def test_the_embedded_gemma_is_a_matching_pair_with_itself():
    gemma = embedded_gemma_path()
    assert pair_check.check_pair(gemma, gemma).ok


@pytest.mark.slow
def test_a_different_vocabulary_is_refused_with_the_first_differing_token(vocab_files):
    assert pair_check.check_pair(vocab_files["a"], vocab_files["a_twin"]).ok
    result = pair_check.check_pair(vocab_files["a"], vocab_files["b"])
    assert not result.ok and result.reason.startswith("token 7 differs")


def test_drafts_are_checked_against_one_target_load_and_unreadable_ones_say_why(vocab_files, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\xff" * 100)
    results = pair_check.check_drafts(embedded_gemma_path(), [vocab_files["a"], broken])
    assert not results[vocab_files["a"]].ok and "BOS" in results[vocab_files["a"]].reason
    assert not results[broken].ok and results[broken].reason.startswith("cannot be read")


@pytest.mark.slow
def test_the_cli_check_reports_both_outcomes(vocab_files):
    ok = subprocess.run(
        [sys.executable, "-m", "engine.models", "check", str(vocab_files["a"]), str(vocab_files["a_twin"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    bad = subprocess.run(
        [sys.executable, "-m", "engine.models", "check", str(vocab_files["a"]), str(vocab_files["b"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and ok.stdout.startswith("compatible")
    assert bad.returncode == 1 and "token 7 differs" in bad.stdout
