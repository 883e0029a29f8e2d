"""Any model, any pair, through the window (issue 53): Model → Models… → "Search the hub" finds a repo on a
local hub serving real GGUF files, picking a file proposes drafts checked from their headers alone (a decoy
repo with another vocabulary marked as not fitting), and downloading target and draft lets the chat answer
with auto. "On this machine" lists models other apps keep, and one added from there loads where it is.

The Qwen2.5-Coder 1.5B + 0.5B pair is used where it has been fetched (python -m engine.measure.real_pair);
SmolLM2 135M (whose second copy stands in as its draft) and Gemma 3 270M otherwise, as on CI."""

import json
import os
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.models import search_tab as search_tab_module
from app.models.dialog import ModelsDialog
from engine.measure.real_pair import DRAFT, TARGET, pair_dir
from engine.modelfiles import downloads
from engine.modelfiles.embedded import embedded_model_path

from support.hub_server import LocalHub
from support.tiny import write_tiny_gguf
from support.window import PASSAGE, WhereItRan

pytestmark = pytest.mark.slow  # downloads from a local hub, then real answers

SMOL_REPO, SMOL_FILE = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf"
SMOL_TWIN = "second-uploader/SmolLM2-135M-Instruct-GGUF"  # the same file from another uploader: a usable draft
SMOL_DECOY = "decoy/SmolLM2-135M-Instruct-GGUF"  # a smaller file of another vocabulary under the family's name
QWEN_TARGET, QWEN_DRAFT = "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
QWEN_DECOY = "decoy/Qwen2.5-Coder-0.5B-Instruct-GGUF"


def qwen_pair():
    target, draft = pair_dir() / TARGET.file_name, pair_dir() / DRAFT.file_name
    return (target, draft) if target.is_file() and draft.is_file() else None


@pytest.fixture
def hub(tmp_path, monkeypatch, dirs):
    smol = embedded_model_path()
    decoy = write_tiny_gguf(tmp_path / "decoy.gguf", payload_bytes=200_000)
    hub = LocalHub().start()
    hub.add_file(SMOL_REPO, SMOL_FILE, smol)
    hub.set_info(SMOL_REPO, downloads=5000, likes=40)
    hub.add_file(SMOL_TWIN, SMOL_FILE, smol)
    hub.set_info(SMOL_TWIN, downloads=300)
    hub.add_file(SMOL_DECOY, "smollm2-135m-instruct-q2_k.gguf", decoy)
    pair = qwen_pair()
    if pair:
        hub.add_file(QWEN_TARGET, TARGET.file_name, pair[0])
        hub.set_info(QWEN_TARGET, downloads=90_000)
        hub.add_file(QWEN_DRAFT, DRAFT.file_name, pair[1])
        hub.add_file(QWEN_DECOY, DRAFT.file_name, smol)  # SmolLM2's 49k vocabulary under the 0.5B's name
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr(downloads, "_PROGRESS_INTERVAL_S", 0.0)
    yield hub
    hub.stop()


def search_tab(dialog, qtbot):
    dialog.tabs.setCurrentWidget(dialog.search_tab)
    return dialog.search_tab


def search_and_pick(qtbot, tab, query: str, repo_id: str, filename: str):
    """Type a query, press Enter, choose the repo and the file, wait for the drafts: as a person does."""
    tab.query_edit.setText(query)
    qtbot.keyClick(tab.query_edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: _row_of(tab.repos_table, repo_id) is not None, timeout=20_000)
    tab.repos_table.selectRow(_row_of(tab.repos_table, repo_id))
    qtbot.waitUntil(lambda: _row_of(tab.files_table, filename) is not None, timeout=30_000)
    with qtbot.waitSignal(tab.draftsFound, timeout=60_000):
        tab.files_table.selectRow(_row_of(tab.files_table, filename))
    return {
        tab.drafts_table.item(r, 0).text(): (tab.drafts_table.item(r, 2).text(), tab.drafts_table.item(r, 3).text())
        for r in range(tab.drafts_table.rowCount())
    }


def _row_of(table, key: str):
    for row in range(table.rowCount()):
        if table.item(row, 0).data(Qt.UserRole) == key:
            return row
    return None


def full_reads(hub) -> list:
    """CDN requests that asked for a whole file or a range reaching past 64 MiB: a download, not a header read."""
    out = []
    for request in hub.byte_requests():
        start, _, end = (request.range or "bytes=0-").removeprefix("bytes=").partition("-")
        if not end or int(end) - int(start) > 64 * 2**20:
            out.append(request)
    return out


def test_search_pick_a_file_and_see_which_drafts_fit_from_headers_alone(qtbot, hub):
    dialog = ModelsDialog("embedded", None)
    qtbot.addWidget(dialog)
    dialog.show()
    tab = search_tab(dialog, qtbot)
    drafts = search_and_pick(qtbot, tab, "smollm2 135m", SMOL_REPO, SMOL_FILE)

    assert drafts[f"{SMOL_TWIN} / {SMOL_FILE}"][0] == "yes"
    decoy = drafts[f"{SMOL_DECOY} / smollm2-135m-instruct-q2_k.gguf"]
    assert decoy[0] == "no" and "differ" in decoy[1], decoy  # llama.cpp's rule that failed, in words
    assert not full_reads(hub), "a header check downloaded a file"
    note = tab.drafts_note.text()
    assert "headers only" in note and "nothing downloaded" in note, note
    assert tab.drafts.bytes_read < embedded_model_path().stat().st_size / 10
    # The memory each file would take, labelled as an estimate, for the context chosen.
    fit = tab.files_table.item(_row_of(tab.files_table, SMOL_FILE), 3).text()
    assert "estimate" in fit and "4096" in fit, fit
    tab.context_spin.setValue(16384)
    assert "16384" in tab.files_table.item(_row_of(tab.files_table, SMOL_FILE), 3).text()


def test_downloading_target_and_draft_lets_the_chat_answer_with_auto(
    qtbot, hub, make_window, quick_settings, wait_response
):
    window = make_window(quick_settings)
    window.tools.open_models_dialog()
    dialog = window.tools.models_dialog
    tab = search_tab(dialog, qtbot)
    pair = qwen_pair()
    if pair:  # the real pair: the 0.5B fits the 1.5B, the decoy with SmolLM2's vocabulary does not
        drafts = search_and_pick(qtbot, tab, "qwen2.5 coder 1.5b", QWEN_TARGET, TARGET.file_name)
        assert drafts[f"{QWEN_DRAFT} / {DRAFT.file_name}"][0] == "yes"
        assert drafts[f"{QWEN_DECOY} / {DRAFT.file_name}"][0] == "no"
        expected = (QWEN_TARGET, QWEN_DRAFT)
        draft = tab.selected_draft()
        assert draft is not None and draft.repo_id == QWEN_DRAFT, "the best fitting draft is preselected"
    else:  # SmolLM2's only drafts are copies of itself: the built-in one comes first (nothing to download) ...
        drafts = search_and_pick(qtbot, tab, "smollm2 135m", SMOL_REPO, SMOL_FILE)
        assert tab.selected_draft() is not None and tab.selected_draft().path is not None
        assert drafts[f"{SMOL_TWIN} / {SMOL_FILE}"][0] == "yes"
        tab.drafts_table.selectRow(
            _row_of(
                tab.drafts_table,
                next(  # ... and a person picks the hub's copy
                    i for i, c in enumerate(tab.drafts.candidates) if c.repo_id == SMOL_TWIN
                ),
            )
        )
        expected = (SMOL_REPO, SMOL_TWIN)
    assert tab.download_button.text() == "Download target + draft"
    with qtbot.waitSignal(dialog.downloadFinished, timeout=300_000) as done:
        qtbot.mouseClick(tab.download_button, Qt.MouseButton.LeftButton)
    target_path, draft_path = done.args[0]
    assert expected[0].replace("/", "_") in target_path.replace("/", "_")
    assert Path(target_path).is_file() and Path(draft_path).is_file()
    qtbot.waitUntil(lambda: dialog.picker.draft() == draft_path, timeout=60_000)
    assert dialog.picker.target() == target_path
    qtbot.waitUntil(dialog.apply_button.isEnabled, timeout=60_000)
    with qtbot.waitSignal(window.modelLoaded, timeout=180_000):
        qtbot.mouseClick(dialog.apply_button, Qt.MouseButton.LeftButton)
    assert (window.settings.model, window.settings.draft, window.settings.method) == (target_path, draft_path, "auto")
    window.input.setPlainText(PASSAGE)
    qtbot.keyClick(window.input, Qt.Key.Key_Return)
    reply = wait_response(window, timeout=180_000)
    assert reply.status == "done" and reply.stats["method"] == "auto", reply.stats


def test_hub_problems_are_said_in_the_tab_and_never_block_it(qtbot, hub):
    dialog = ModelsDialog("embedded", None)
    qtbot.addWidget(dialog)
    dialog.show()
    tab = search_tab(dialog, qtbot)
    hub.api_fault = "html"
    tab.query_edit.setText("smollm2")
    tab.search_button.click()
    qtbot.waitUntil(lambda: "Hugging Face hub" in tab.status_label.text(), timeout=20_000)
    assert "#b00020" in tab.status_label.styleSheet()  # shown as an error
    hub.api_fault = None
    hub.set_info("empty/NoGGUF-Here", downloads=1, tags=["gguf"])  # tagged, but holding no .gguf file
    tab.query_edit.setText("nogguf")
    tab.search_button.click()
    qtbot.waitUntil(lambda: _row_of(tab.repos_table, "empty/NoGGUF-Here") is not None, timeout=20_000)
    tab.repos_table.selectRow(_row_of(tab.repos_table, "empty/NoGGUF-Here"))
    qtbot.waitUntil(lambda: "no GGUF" in tab.status_label.text(), timeout=20_000)


def test_a_hub_that_stops_answering_never_freezes_the_window(qtbot, hub, monkeypatch, stall_probe):
    monkeypatch.setattr(search_tab_module, "HUB_TIMEOUT_S", 2.0)
    dialog = ModelsDialog("embedded", None)
    qtbot.addWidget(dialog)
    dialog.show()
    tab = search_tab(dialog, qtbot)
    hub.api_fault = "hang"
    searching = WhereItRan(search_tab_module.search_repos, stall_probe)  # the call that waits on the hub
    monkeypatch.setattr(search_tab_module, "search_repos", searching)
    stall_probe.start()
    qtbot.wait(50)
    tab.query_edit.setText("smollm2")
    tab.search_button.click()
    qtbot.waitUntil(lambda: "did not answer within" in tab.status_label.text(), timeout=60_000)
    stall = stall_probe.stop()
    # The wait on the hub was off the GUI thread, whose event loop went on turning all along (a wait spends no CPU:
    # the probe's CPU time alone would not see it), and nothing else held the GUI thread long.
    assert searching.threads and not searching.on_gui_thread
    assert searching.ticks_during[0] > 0
    assert stall < stall_probe.LIMIT_S, f"the window's GUI thread worked {stall * 1000:.0f} ms in one go"
    hub.release()


def test_models_other_apps_keep_are_listed_and_one_added_loads_where_it_is(
    qtbot, tmp_path, monkeypatch, dirs, make_window, quick_settings
):
    home = tmp_path / "home"
    smol = embedded_model_path()
    lmstudio = home / ".lmstudio" / "models" / "bartowski" / "SmolLM2-GGUF"
    lmstudio.mkdir(parents=True)
    (lmstudio / "SmolLM2-135M-Instruct-Q4_1.gguf").symlink_to(smol)
    snapshot = home / "hf" / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"
    (snapshot / "blobs").mkdir(parents=True)
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text("c" * 40)
    (snapshot / "snapshots" / ("c" * 40)).mkdir(parents=True)
    os.link(smol, snapshot / "blobs" / ("e" * 64))  # a path of its own: listed apart from LM Studio's link
    (snapshot / "snapshots" / ("c" * 40) / "smollm2-q4_1.gguf").symlink_to(f"../../blobs/{'e' * 64}")
    blobs = home / ".ollama" / "models" / "blobs"
    blobs.mkdir(parents=True)
    digest = "a" * 64
    shutil.copyfile(smol, blobs / f"sha256-{digest}")  # Ollama's own copy, named by its digest
    manifest = home / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": f"sha256:{digest}",
                        "size": smol.stat().st_size,
                    }
                ],
            }
        )
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hf"))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)

    window = make_window(quick_settings)
    window.tools.open_models_dialog()
    dialog = window.tools.models_dialog
    tab = dialog.local_tab
    with qtbot.waitSignal(tab.looked, timeout=30_000):
        dialog.tabs.setCurrentWidget(tab)
    names = {tab.table.item(r, 0).text(): tab.table.item(r, 1).text() for r in range(tab.table.rowCount())}
    assert names.get("smollm2:135m") == "Ollama", names
    assert any(source == "LM Studio" for source in names.values()), names
    assert any(source == "Hugging Face cache" for source in names.values()), names
    tab.table.selectRow(next(r for r in range(tab.table.rowCount()) if tab.table.item(r, 0).text() == "smollm2:135m"))
    qtbot.mouseClick(tab.add_button, Qt.MouseButton.LeftButton)
    blob = str(blobs / f"sha256-{digest}")
    qtbot.waitUntil(lambda: dialog.picker.target() == blob, timeout=10_000)
    assert "smollm2:135m" in dialog.target_combo.currentText()
    qtbot.waitUntil(dialog.apply_button.isEnabled, timeout=60_000)  # its drafts are checked
    with qtbot.waitSignal(window.modelLoaded, timeout=120_000):
        qtbot.mouseClick(dialog.apply_button, Qt.MouseButton.LeftButton)
    assert window.settings.model == blob  # used where Ollama keeps it
    assert "smollm2:135m" in window.model_label.text()  # by the name Ollama gives it, not the GGUF's own
    assert not any(p.name.startswith("sha256-") for p in (dirs / "data").rglob("*")), "the model was copied"
