"""Built-in drafters and draft heads before download (issue 65 item 4), against the local hub look-alike: the
draft finder lists EAGLE-3 / DFlash heads beside draft models, each checked from its header against the target's
layers, hidden size and vocabulary (a head that does not fit says why); a head on this machine is checked the same
way; and a repo whose model carries MTP layers is told from its header's tensor names, read by range requests."""

import json

import pytest

from engine.measure import synthetic
from engine.modelfiles import draft_finder, hub_drafters
from engine.modelfiles.draft_finder import find_drafts
from engine.modelfiles.hub_search import search_repos
from engine.modelfiles.model_inspect import HEAD_SUPPORT
from engine.modelfiles.remote_gguf import MAX_HEADER_BYTES
from engine.models import main

from support.heads import write_head_gguf
from support.hub_server import LocalHub
from support.tiny import write_tiny_gguf

TARGET_REPO, TARGET_FILE = "test/Synthetic-0.7M-GGUF", "synthetic-0.7m-f32.gguf"
DRAFT_REPO = "test/Synthetic-0.6M-GGUF"  # the same vocabulary: a draft model that fits
EAGLE_REPO, EAGLE_FILE = "test/Synthetic-0.7M-EAGLE3-GGUF", "synthetic-eagle3-f32.gguf"
WRONG_WIDTH_REPO = "test/Synthetic-0.7M-Wide-Eagle3-GGUF"  # made for a target of another hidden size
WRONG_LAYERS_REPO = "test/Synthetic-Deep-DFlash-GGUF"  # reads a layer the target does not have
PLAIN_REPO = "test/Plain-Tiny-GGUF"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("heads")
    written = synthetic.write_all(folder, ["mtp-agreeing", "mtp-random"])
    return {
        "target": written["mtp-agreeing"],
        "draft": written["mtp-random"],
        "eagle": write_head_gguf(folder / "eagle.gguf", "eagle3", (0, 1, 2), synthetic.N_EMBD),
        "wide": write_head_gguf(folder / "wide.gguf", "eagle3", (0, 1, 2), 4096, width=4),  # smaller than its target
        "deep": write_head_gguf(folder / "deep.gguf", "dflash", (1, 30), synthetic.N_EMBD),
        "plain": write_tiny_gguf(folder / "plain.gguf", payload_bytes=10_000),
    }


@pytest.fixture
def hub(files, monkeypatch, tmp_path):
    hub = LocalHub().start()
    hub.add_file(TARGET_REPO, TARGET_FILE, files["target"])
    hub.set_info(TARGET_REPO, downloads=1000)
    hub.add_file(DRAFT_REPO, "synthetic-0.6m-f32.gguf", files["draft"])
    hub.add_file(EAGLE_REPO, EAGLE_FILE, files["eagle"])
    hub.add_file(WRONG_WIDTH_REPO, "wide-eagle3.gguf", files["wide"])
    hub.add_file(WRONG_LAYERS_REPO, "deep-dflash.gguf", files["deep"])
    hub.add_file(PLAIN_REPO, "plain-q8_0.gguf", files["plain"])
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    yield hub
    hub.stop()


def header_reads_only(hub) -> bool:
    """Every byte request was a closed range within the header cap: nothing was downloaded."""
    for request in hub.byte_requests():
        start, _, end = (request.range or "bytes=0-").removeprefix("bytes=").partition("-")
        if not end or int(end) - int(start) >= MAX_HEADER_BYTES:
            return False
    return True


def test_the_finder_lists_heads_beside_drafts_checked_from_their_headers(hub, files):
    found = find_drafts(TARGET_REPO, TARGET_FILE, installed=[files["wide"]])
    by_repo = {c.repo_id: c for c in found.candidates if c.repo_id}
    draft, eagle = by_repo[DRAFT_REPO], by_repo[EAGLE_REPO]
    assert draft.head is None and draft.compatible and draft.usable
    assert eagle.head == "eagle3" and eagle.compatible is True
    assert "EAGLE-3 head for this target (reads its layers 0, 1, 2)" in eagle.reason
    assert eagle.usable is (HEAD_SUPPORT["eagle3"] is None)
    if HEAD_SUPPORT["eagle3"]:  # fits, but SpecChat cannot draft with it yet: said, and not offered as the draft
        assert HEAD_SUPPORT["eagle3"] in eagle.reason and eagle not in found.compatible
    wide = by_repo[WRONG_WIDTH_REPO]
    assert wide.head == "eagle3" and wide.compatible is False
    assert "hidden size 4096" in wide.reason and str(synthetic.N_EMBD) in wide.reason, wide.reason
    deep = by_repo[WRONG_LAYERS_REPO]
    assert deep.head == "dflash" and deep.compatible is False and "layer 30" in deep.reason, deep.reason
    on_disk = next(c for c in found.candidates if c.path == files["wide"])  # a head on this machine, same rules
    assert on_disk.head == "eagle3" and on_disk.compatible is False and "hidden size 4096" in on_disk.reason
    first = found.candidates[0]  # what can draft comes first: the draft, or the head where SpecChat drafts with it
    assert first is draft or (first is eagle and eagle.usable)
    assert found.candidates.index(draft) < found.candidates.index(wide)
    assert header_reads_only(hub)


def test_heads_are_looked_up_by_name_even_when_the_familys_search_misses_them(hub, monkeypatch):
    monkeypatch.setattr(draft_finder, "SEARCH_LIMIT", 1)  # the family's search returns the target alone
    found = find_drafts(TARGET_REPO, TARGET_FILE)
    repos = {c.repo_id for c in found.candidates}
    assert {EAGLE_REPO, WRONG_WIDTH_REPO, WRONG_LAYERS_REPO} <= repos
    assert DRAFT_REPO not in repos  # only the head words brought these in


def test_the_cli_says_which_candidates_are_heads(hub, capsys):
    assert main(["drafts", TARGET_REPO, TARGET_FILE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    heads = {c["repo_id"]: c for c in out["candidates"] if c["head"]}
    assert heads[EAGLE_REPO]["compatible"] is True and heads[EAGLE_REPO]["head"] == "eagle3"
    assert heads[EAGLE_REPO]["usable"] is (HEAD_SUPPORT["eagle3"] is None)
    assert heads[WRONG_WIDTH_REPO]["compatible"] is False


def test_a_search_marks_the_repo_whose_model_carries_mtp_layers(hub):
    repos = search_repos("synthetic")
    marks = {m.repo_id: m for m in hub_drafters.mark_drafters(repos, limit=len(repos))}
    assert marks[TARGET_REPO].drafter == {"kind": "mtp", "layers": 1}
    assert marks[DRAFT_REPO].drafter == {"kind": "mtp", "layers": 1}  # mtp-random carries its layer too
    assert marks[EAGLE_REPO].drafter == {"kind": "eagle3", "target_layers": [0, 1, 2]}
    plain = hub_drafters.mark_drafters(search_repos("plain"))[0]
    assert plain.drafter is None and not plain.problem and plain.filename == "plain-q8_0.gguf"
    assert header_reads_only(hub)


def test_marking_reads_at_most_the_limit_one_header_each(hub):
    repos = search_repos("synthetic")
    assert len(repos) == 5
    hub.requests.clear()
    marks = hub_drafters.mark_drafters(repos, limit=2)
    assert [m.repo_id for m in marks] == [r.repo_id for r in repos[:2]]
    read = {r.path.split("/")[2] for r in hub.byte_requests()}  # the blobs whose bytes were asked for
    assert len(read) == 2
    assert sum(m.bytes_read for m in marks) < sum(f.stat().st_size for f in (hub_files(hub, repos[:2])))


def test_a_repo_that_cannot_be_read_is_said_not_raised(hub):
    hub.set_info("test/Synthetic-Empty-GGUF", tags=["gguf"])  # tagged, but no .gguf file
    mark = hub_drafters.repo_drafter(next(r for r in search_repos("empty") if "Empty" in r.repo_id))
    assert mark.drafter is None and "no GGUF" in mark.problem


def hub_files(hub, repos):
    return [f.source for r in repos for f in hub.repos[r.repo_id].values()]
