"""Built-in drafters in the Models window (issue 65 item 4): the Installed tab says which model carries MTP layers
(the synthetic MTP model) and which file is an EAGLE-3 draft head, and whether SpecChat can draft with it; the hub
search marks the repo whose model carries MTP layers, from its header's tensor names, and lists a draft head for
a target beside its drafts. Headers are read in the background; nothing is downloaded."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.models.dialog import ModelsDialog
from app.models.search_tab import DRAFTER_COLUMN as REPO_DRAFTER_COLUMN
from app.models.search_tab import NOT_CHECKED
from engine.measure import synthetic
from engine.methods import MTP
from engine.modelfiles import model_store
from engine.modelfiles.catalog import MTP as CATALOG_MTP
from engine.modelfiles.catalog import CatalogPair, ModelFile
from engine.modelfiles.hub_drafters import MAX_MARKED
from engine.modelfiles.model_inspect import HEAD_SUPPORT
from engine.modelfiles.remote_gguf import MAX_HEADER_BYTES

from support.heads import write_head_gguf
from support.hub_server import LocalHub
from support.tiny import write_tiny_gguf

INSTALLED_DRAFTER_COLUMN = 2
MTP_REPO, MTP_FILE = "test/Synthetic-0.7M-GGUF", "synthetic-0.7m-f32.gguf"
LATE_MTP_REPO = "test/Synthetic-Late-0.7M-GGUF"  # the least downloaded: past the repos a search reads
EAGLE_REPO, EAGLE_FILE = "test/Synthetic-0.7M-EAGLE3-GGUF", "synthetic-eagle3-f32.gguf"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("drafters")
    written = synthetic.write_all(folder, ["mtp-agreeing"])
    return {
        "mtp": written["mtp-agreeing"],
        "eagle": write_head_gguf(folder / "qwen-eagle3-head.gguf", "eagle3", (0, 1, 2), synthetic.N_EMBD),
        "plain": write_tiny_gguf(folder / "plain.gguf", payload_bytes=10_000),
    }


def open_dialog(qtbot):
    dialog = ModelsDialog("embedded", None)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def row_of(table, key):
    return next((r for r in range(table.rowCount()) if table.item(r, 0).data(Qt.UserRole) == key), None)


def shot(widget, path):
    """The window as drawn (offscreen), saved for a look."""
    QApplication.processEvents()  # the new texts' sizes reach the layout
    image = widget.grab()
    assert not image.isNull() and image.save(str(path))


def test_the_installed_tab_names_the_mtp_model_and_the_draft_head(qtbot, dirs, models, tmp_path):
    model_store.add_local_model(models["mtp"])
    model_store.add_local_model(models["eagle"])
    model_store.add_local_model(models["plain"])
    dialog = open_dialog(qtbot)
    tab = dialog.installed_tab
    dialog.tabs.setCurrentWidget(tab)
    qtbot.waitUntil(lambda: not tab.tasks.busy("drafters"), timeout=30_000)
    cells = {
        tab.table.item(r, 0).data(Qt.UserRole): tab.table.item(r, INSTALLED_DRAFTER_COLUMN).text()
        for r in range(tab.table.rowCount())
    }
    assert cells[str(models["mtp"])] == "MTP, 1 layer"
    assert cells[str(models["eagle"])] == "EAGLE-3 head"
    assert cells[str(models["plain"])] == "none"

    tab.table.selectRow(row_of(tab.table, str(models["mtp"])))
    assert f"Built-in drafter: MTP, 1 layer (choose “{MTP.label}” in the chat settings)." in tab.drafter_label.text()
    shot(dialog, tmp_path / "installed-mtp.png")

    tab.table.selectRow(row_of(tab.table, str(models["eagle"])))
    said = tab.drafter_label.text()
    assert "An EAGLE-3 draft head for a target model, not a model to chat with" in said, said
    assert "reads its target's layers 0, 1, 2" in said
    assert (HEAD_SUPPORT["eagle3"] or "SpecChat can draft with it") in said
    shot(dialog, tmp_path / "installed-eagle3.png")

    picker = dialog.picker  # chosen as the target, each says what it is under the target's name
    with qtbot.waitSignal(picker.targetDrafterRead, timeout=30_000):
        dialog.target_combo.setCurrentIndex(dialog.target_combo.findData(str(models["mtp"])))
    assert picker.target_note.text().startswith("Built-in drafter: MTP, 1 layer") and picker.target_note.isVisible()
    with qtbot.waitSignal(picker.targetDrafterRead, timeout=30_000):
        dialog.target_combo.setCurrentIndex(dialog.target_combo.findData(str(models["eagle"])))
    assert "not a model to chat with" in picker.target_note.text()
    shot(dialog, tmp_path / "picker-eagle3.png")
    with qtbot.waitSignal(picker.targetDrafterRead, timeout=30_000):
        dialog.target_combo.setCurrentIndex(dialog.target_combo.findData(str(models["plain"])))
    assert not picker.target_note.isVisible()  # nothing to say for a model without a drafter


@pytest.fixture
def hub(models, monkeypatch, dirs):
    hub = LocalHub().start()
    hub.add_file(MTP_REPO, MTP_FILE, models["mtp"])
    hub.set_info(MTP_REPO, downloads=1000)
    for i in range(MAX_MARKED):  # the first MAX_MARKED after the MTP repo: plain models
        hub.add_file(f"test/Synthetic-Plain{i}-0.1M-GGUF", "plain-q8_0.gguf", models["plain"])
        hub.set_info(f"test/Synthetic-Plain{i}-0.1M-GGUF", downloads=500 - i)
    hub.add_file(LATE_MTP_REPO, "late-f32.gguf", models["mtp"])
    hub.add_file(EAGLE_REPO, EAGLE_FILE, models["eagle"])
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    yield hub
    hub.stop()


def test_the_hub_search_marks_mtp_repos_and_lists_a_head_for_a_target(qtbot, hub, tmp_path):
    dialog = open_dialog(qtbot)
    tab = dialog.search_tab
    dialog.tabs.setCurrentWidget(tab)
    tab.query_edit.setText("synthetic")
    with qtbot.waitSignal(tab.marksShown, timeout=60_000):
        qtbot.keyClick(tab.query_edit, Qt.Key.Key_Return)
    cells = {
        tab.repos_table.item(r, 0).data(Qt.UserRole): tab.repos_table.item(r, REPO_DRAFTER_COLUMN).text()
        for r in range(tab.repos_table.rowCount())
    }
    assert cells[MTP_REPO] == "MTP, 1 layer"
    assert cells["test/Synthetic-Plain0-0.1M-GGUF"] == "none"
    assert list(cells).index(LATE_MTP_REPO) >= MAX_MARKED and cells[LATE_MTP_REPO] == NOT_CHECKED
    late_sha = hub.repos[LATE_MTP_REPO]["late-f32.gguf"].sha256
    read = {r.path.split("/")[2] for r in hub.byte_requests()}
    assert len(read) <= MAX_MARKED  # one header per repo read, the plain copies share one blob
    assert all(_closed_range_within_cap(r.range) for r in hub.byte_requests())  # headers only
    assert "1 found" in tab.status_label.text(), tab.status_label.text()
    shot(dialog, tmp_path / "search-marked.png")

    tab.repos_table.selectRow(row_of(tab.repos_table, LATE_MTP_REPO))  # chosen: its header is read now
    qtbot.waitUntil(lambda: tab.repos_table.item(row_of(tab.repos_table, LATE_MTP_REPO), 4).text() != NOT_CHECKED)
    assert tab.repos_table.item(row_of(tab.repos_table, LATE_MTP_REPO), 4).text() == "MTP, 1 layer"
    assert late_sha in {r.path.split("/")[2] for r in hub.byte_requests()}
    qtbot.waitUntil(lambda: "Built-in drafter: MTP" in tab.status_label.text(), timeout=30_000)

    tab.repos_table.selectRow(row_of(tab.repos_table, MTP_REPO))
    qtbot.waitUntil(lambda: row_of(tab.files_table, MTP_FILE) is not None, timeout=30_000)
    with qtbot.waitSignal(tab.draftsFound, timeout=60_000):
        tab.files_table.selectRow(row_of(tab.files_table, MTP_FILE))
    rows = {tab.drafts_table.item(r, 0).text(): r for r in range(tab.drafts_table.rowCount())}
    head_row = rows[f"{EAGLE_REPO} / {EAGLE_FILE}"]
    assert tab.drafts_table.item(head_row, 2).text() == "yes (EAGLE-3 head)"
    assert "reads its layers 0, 1, 2" in tab.drafts_table.item(head_row, 3).text()
    tab.drafts_table.selectRow(head_row)
    if HEAD_SUPPORT["eagle3"]:  # a head SpecChat cannot draft with is said so, and not downloaded as the draft
        assert f"1 draft head fits it. {HEAD_SUPPORT['eagle3']}" in tab.status_label.text(), tab.status_label.text()
        assert tab.selected_draft() is None and tab.download_button.text() == "Download target"
    else:  # SpecChat drafts with it: it is downloaded with the target, as a draft model is
        assert tab.selected_draft().head == "eagle3" and tab.download_button.text() == "Download target + draft"
    shot(dialog, tmp_path / "search-head.png")
    assert all(_closed_range_within_cap(r.range) for r in hub.byte_requests())


def _closed_range_within_cap(range_header: str | None) -> bool:
    start, _, end = (range_header or "bytes=0-").removeprefix("bytes=").partition("-")
    return bool(end) and int(end) - int(start) < MAX_HEADER_BYTES


def test_models_other_apps_keep_say_their_drafter_when_chosen(qtbot, dirs, models, monkeypatch, tmp_path):
    home = tmp_path / "home"
    folder = home / ".lmstudio" / "models" / "someone" / "Synthetic-GGUF"
    folder.mkdir(parents=True)
    for name in ("mtp", "eagle"):
        (folder / models[name].name).symlink_to(models[name])
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hf"))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    dialog = open_dialog(qtbot)
    tab = dialog.local_tab
    with qtbot.waitSignal(tab.looked, timeout=30_000):
        dialog.tabs.setCurrentWidget(tab)
    rows = {tab.table.item(r, 0).data(Qt.UserRole): r for r in range(tab.table.rowCount())}
    with qtbot.waitSignal(tab.drafterRead, timeout=30_000):
        tab.table.selectRow(rows[str(folder / models["mtp"].name)])
    assert "Built-in drafter: MTP, 1 layer" in tab.drafter_label.text()
    with qtbot.waitSignal(tab.drafterRead, timeout=30_000):
        tab.table.selectRow(rows[str(folder / models["eagle"].name)])
    assert "An EAGLE-3 draft head for a target model" in tab.drafter_label.text()
    shot(dialog, tmp_path / "local-eagle3.png")


def mtp_pair(pair_id: str, repo_id: str, filename: str) -> CatalogPair:
    return CatalogPair(
        id=pair_id,
        name=f"{pair_id} with its MTP layer",
        family="Synthetic",
        chat_template="plain",
        note="One file whose MTP layer drafts for it.",
        verified=True,
        target=ModelFile(repo_id, filename, "F32", 700_000),
        draft=None,
        drafter=CATALOG_MTP,
        confirmed_by="Written by the test.",
    )


def test_a_catalog_model_with_mtp_layers_is_checked_on_the_hub_then_downloaded_alone(qtbot, hub, models, tmp_path):
    hub.add_file("test/Plain-Labelled-MTP-GGUF", "plain.gguf", models["plain"])
    catalog = [
        mtp_pair("synthetic-mtp", MTP_REPO, MTP_FILE),
        mtp_pair("not-mtp", "test/Plain-Labelled-MTP-GGUF", "plain.gguf"),  # the catalog is wrong about this one
    ]
    dialog = ModelsDialog("embedded", None, catalog=catalog)
    qtbot.addWidget(dialog)
    dialog.show()
    tab = dialog.pairs
    tab.table.selectRow(1)
    with qtbot.waitSignal(dialog.downloadStopped, timeout=60_000) as stopped:
        qtbot.mouseClick(tab.download_button, Qt.LeftButton)
    assert "carries no MTP layers" in stopped.args[0] and "#b00020" in tab.status_label.styleSheet()
    assert all(_closed_range_within_cap(r.range) for r in hub.byte_requests())  # its header only
    assert model_store.list_models() == []

    tab.table.selectRow(0)
    assert f"Drafter: the target's own MTP layers (choose “{MTP.label}”" in tab.details.text()
    assert not tab.draft_bar.isVisibleTo(tab)  # one file, one bar
    with qtbot.waitSignal(dialog.downloadFinished, timeout=120_000) as finished:
        qtbot.mouseClick(tab.download_button, Qt.LeftButton)
    target, draft = finished.args[0]
    assert draft is None and target.endswith(MTP_FILE)
    qtbot.waitUntil(lambda: dialog.picker.target() == target, timeout=30_000)
    assert f"then choose “{MTP.label}” in the chat settings" in tab.status_label.text()
    assert tab.table.item(0, 2).text() == "Installed"
    shot(dialog, tmp_path / "pairs-mtp.png")
    qtbot.waitUntil(lambda: not dialog.installed_tab.tasks.busy("drafters"), timeout=30_000)
    row = row_of(dialog.installed_table, target)
    assert dialog.installed_table.item(row, INSTALLED_DRAFTER_COLUMN).text() == "MTP, 1 layer"
