"""Catalog entries whose model drafts with its own MTP layers (issue 65 item 4): one file, no draft; each says where
its names were confirmed; and before a download the file's header is read on the hub (ranges only) and a file
without MTP layers is refused, nothing downloaded."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine import models as models_cli
from engine.measure import synthetic
from engine.modelfiles import model_store
from engine.modelfiles.catalog import MTP, CatalogError, CatalogPair, ModelFile, load_catalog
from engine.modelfiles.hub_drafters import confirm_drafter
from engine.modelfiles.remote_gguf import MAX_HEADER_BYTES

from support.hub_server import LocalHub
from support.tiny import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
REPO, FILE = "test/Synthetic-MTP-GGUF", "synthetic-mtp-f32.gguf"
PLAIN_REPO, PLAIN_FILE = "test/Plain-GGUF", "plain-q8_0.gguf"


def mtp_entry(repo_id: str = REPO, filename: str = FILE) -> CatalogPair:
    return CatalogPair(
        id="synthetic-mtp",
        name="Synthetic with its MTP layer",
        family="Synthetic",
        chat_template="plain",
        note="a test entry",
        verified=True,
        target=ModelFile(repo_id, filename, "F32", 700_000),
        draft=None,
        drafter=MTP,
        confirmed_by="written by the test",
    )


def test_the_catalog_offers_models_that_draft_with_their_mtp_layers():
    entries = [p for p in load_catalog() if p.drafter == MTP]
    assert {p.target.repo_id for p in entries} >= {"unsloth/Qwen3.5-9B-MTP-GGUF", "unsloth/Qwen3.6-27B-MTP-GGUF"}
    for pair in entries:
        assert pair.draft is None and pair.files == (pair.target,) and pair.size_bytes == pair.target.size_bytes
        assert pair.verified and "not reachable" in pair.confirmed_by  # how the names were confirmed is said
        assert pair.target.filename.endswith(".gguf") and pair.target.quantization in pair.target.filename


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda e: e.update(drafter="eagle3"), "'drafter' must be one of draft, mtp"),
        (lambda e: e.update(drafter="mtp"), "has no 'draft' file"),  # a pair's entry keeps its draft: refused
        (lambda e: e.update(confirmed_by=3), "'confirmed_by' must be text"),
        (lambda e: e.pop("draft"), "draft is missing"),  # a plain pair still needs its draft
    ],
)
def test_malformed_drafter_entries_are_refused_with_the_reason(tmp_path, edit, message):
    raw = json.loads((ROOT / "resources" / "catalog.json").read_text())
    edit(raw["pairs"][0])
    (tmp_path / "c.json").write_text(json.dumps(raw))
    with pytest.raises(CatalogError, match=message):
        load_catalog(tmp_path / "c.json")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    written = synthetic.write_all(tmp_path / "files", ["mtp-agreeing"])
    hub = LocalHub().start()
    hub.add_file(REPO, FILE, written["mtp-agreeing"])
    hub.add_file(PLAIN_REPO, PLAIN_FILE, write_tiny_gguf(tmp_path / "plain.gguf", payload_bytes=200_000))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    yield hub
    hub.stop()


def only_header_reads(hub) -> bool:
    for request in hub.byte_requests():
        start, _, end = (request.range or "bytes=0-").removeprefix("bytes=").partition("-")
        if not end or int(end) - int(start) >= MAX_HEADER_BYTES:
            return False
    return True


def test_an_mtp_entry_is_confirmed_from_its_header_before_download(hub):
    assert confirm_drafter(mtp_entry()) == ""
    problem = confirm_drafter(mtp_entry(PLAIN_REPO, PLAIN_FILE))
    assert "carries no MTP layers" in problem and "nothing was downloaded" in problem
    assert "could not be read" in confirm_drafter(mtp_entry(REPO, "missing.gguf"))
    assert only_header_reads(hub) and hub.byte_requests()
    pair = load_catalog()[0]
    hub.requests.clear()
    assert confirm_drafter(pair) == "" and hub.requests == []  # a pair with a draft file: nothing to read


def test_the_cli_downloads_an_mtp_entry_and_refuses_one_without_the_layers(hub, monkeypatch, capsys):
    entries = {"good": mtp_entry(), "bad": replace(mtp_entry(PLAIN_REPO, PLAIN_FILE), id="bad")}
    monkeypatch.setattr(models_cli, "find_pair", lambda pair_id: entries[pair_id])
    assert models_cli.main(["download-pair", "bad"]) == 1
    assert "carries no MTP layers" in capsys.readouterr().err
    assert only_header_reads(hub) and model_store.list_models() == []
    assert models_cli.main(["download-pair", "good"]) == 0
    out = capsys.readouterr().out
    assert "the target drafts with its MTP layers" in out
    assert [m.path.name for m in model_store.list_models()] == [FILE]
    ready = model_store.installed_pairs([entries["good"]])
    assert len(ready) == 1 and ready[0].draft is None and ready[0].target.name == FILE
