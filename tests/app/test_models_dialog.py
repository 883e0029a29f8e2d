"""The Models dialog against a local hub: a pair downloads with visible progress, survives a cut
connection, can be cancelled and resumed, and shows up as selectable; the draft picker offers only
compatible drafts and says why the others are not usable."""

import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.models.builtin_models import gemma_assembled
from app.models.dialog import BAR_STEPS, ModelsDialog
from app.models.model_names import NO_QUANT
from engine.decoding import pair_check
from engine.modelfiles import downloads, model_folder, model_store
from engine.modelfiles.catalog import CatalogPair, ModelFile
from engine.modelfiles.embedded import DISPLAY_NAMES, EMBEDDED, EMBEDDED_GEMMA, embedded_model_path
from engine.modelfiles.hub_files import FileRequest

from support.hub_server import Fault, LocalHub
from support.tiny import default_tokens, write_tiny_gguf

TARGET_REPO, DRAFT_REPO = "tester/tiny-target-GGUF", "tester/tiny-draft-GGUF"
BUILT_IN = set(DISPLAY_NAMES.values())  # listed first in the Installed tab


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dialog")
    other = default_tokens()
    other[7] = "\u2581other"
    return {
        "target": write_tiny_gguf(folder / "target.gguf", payload_bytes=3_000_000, seed=1),
        "draft": write_tiny_gguf(folder / "draft.gguf", payload_bytes=1_000_000, seed=2),
        "mismatch": write_tiny_gguf(folder / "mismatch.gguf", tokens=other, seed=3),
    }


@pytest.fixture
def hub(files, tmp_path, monkeypatch):
    hub = LocalHub().start()
    hub.add_file(TARGET_REPO, "target.gguf", files["target"])
    hub.add_file(DRAFT_REPO, "draft.gguf", files["draft"])
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr(downloads, "_PROGRESS_INTERVAL_S", 0.0)  # loopback is fast: show every piece
    yield hub
    hub.stop()


@pytest.fixture
def catalog(files):
    return [
        CatalogPair(
            id="tiny",
            name="Tiny pair",
            family="Tiny",
            chat_template="none",
            note="For tests.",
            verified=True,
            target=ModelFile(TARGET_REPO, "target.gguf", "F32", files["target"].stat().st_size),
            draft=ModelFile(DRAFT_REPO, "draft.gguf", "F32", files["draft"].stat().st_size),
        )
    ]


def open_dialog(qtbot, target=EMBEDDED, draft=None, catalog=None):
    dialog = ModelsDialog(target, draft, catalog=catalog)
    qtbot.addWidget(dialog)
    dialog.show()
    wait_for_check(qtbot, dialog)
    return dialog


def wait_for_check(qtbot, dialog):
    qtbot.waitUntil(dialog.apply_button.isEnabled, timeout=30_000)


def drafts(dialog):
    model = dialog.draft_model
    items = [model.item(i) for i in range(model.rowCount())]
    return (
        [i.data(Qt.UserRole) for i in items if i.isEnabled()],
        {i.data(Qt.UserRole): i.text() for i in items if not i.isEnabled()},
    )


@pytest.mark.slow
def test_a_pair_downloads_with_progress_survives_a_cut_and_becomes_selectable(qtbot, hub, catalog, files):
    hub.add_fault("target.gguf", Fault(cut_after=1_000_000))
    dialog = open_dialog(qtbot, catalog=catalog)
    assert dialog.pairs_table.item(0, 2).text() == "Not downloaded"
    seen = []
    dialog.target_bar.valueChanged.connect(seen.append)
    dialog.pairs_table.selectRow(0)

    with qtbot.waitSignal(dialog.downloadFinished, timeout=30_000) as finished:
        qtbot.mouseClick(dialog.download_button, Qt.LeftButton)
    target, draft = finished.args[0]
    assert any(0 < v < BAR_STEPS for v in seen)  # the bar moved while the file was arriving
    assert dialog.target_bar.value() == dialog.draft_bar.value() == BAR_STEPS
    assert not dialog.target_bar.isVisible()  # the bars show only while a download runs
    assert "Installed Tiny pair" in dialog.status_label.text()
    resumed = hub.byte_requests("target.gguf")
    assert len(resumed) == 2 and resumed[1].range.startswith("bytes=")  # the cut was resumed, not restarted
    assert Path(target).read_bytes() == files["target"].read_bytes()

    assert dialog.pairs_table.item(0, 2).text() == "Installed"
    rows = {dialog.installed_table.item(r, 0).text(): r for r in range(dialog.installed_table.rowCount())}
    named = {f"{n} · {NO_QUANT}": n for n in ("target.gguf", "draft.gguf")}  # the tiny files say no quantization
    assert set(rows) == BUILT_IN | set(named)
    draft_row = rows[f"draft.gguf · {NO_QUANT}"]
    assert dialog.installed_table.item(draft_row, 3).text() == str(Path(draft).parent)
    assert dialog.installed_table.item(draft_row, 4).text() == DRAFT_REPO

    wait_for_check(qtbot, dialog)
    assert dialog.target_combo.currentData() == target
    assert dialog.draft_combo.currentData() == draft  # the pair's draft, checked and preselected
    with qtbot.waitSignal(dialog.modelsChosen) as chosen:
        qtbot.mouseClick(dialog.apply_button, Qt.LeftButton)
    assert chosen.args == [target, draft]


def test_a_download_can_be_cancelled_and_resumed(qtbot, hub, catalog, files):
    hub.add_fault("draft.gguf", Fault(hold_after=300_000))
    dialog = open_dialog(qtbot, catalog=catalog)
    dialog.pairs_table.selectRow(0)
    qtbot.mouseClick(dialog.download_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dialog.draft_bar.value() > 0, timeout=30_000)
    assert dialog.cancel_button.isEnabled() and not dialog.download_button.isEnabled()
    assert dialog.target_bar.isVisible() and dialog.draft_bar.isVisible()

    with qtbot.waitSignal(dialog.downloadStopped, timeout=30_000):
        qtbot.mouseClick(dialog.cancel_button, Qt.LeftButton)
        hub.release()  # the held bytes arrive and the worker notices the cancel
    assert "kept" in dialog.status_label.text()
    assert not dialog.draft_bar.isVisible()  # a stopped download leaves no half-full bar behind
    assert dialog.download_button.text() == "Resume"
    assert dialog.pairs_table.item(0, 2).text().startswith("Partly downloaded")
    kept = model_folder.partial_bytes(FileRequest(DRAFT_REPO, "draft.gguf"))
    assert kept > 0

    with qtbot.waitSignal(dialog.downloadFinished, timeout=30_000):
        qtbot.mouseClick(dialog.download_button, Qt.LeftButton)
    assert hub.byte_requests("draft.gguf")[-1].range == f"bytes={kept}-"
    assert len(hub.byte_requests("target.gguf")) == 1  # the finished target was not fetched again


@pytest.mark.slow
def test_the_draft_picker_offers_only_compatible_drafts_and_says_why_not(qtbot, hub, files):
    for name in ("target", "draft", "mismatch"):
        model_store.add_local_model(files[name])
    dialog = open_dialog(qtbot, target=str(files["target"]))

    usable, unusable = drafts(dialog)
    assert usable == [None, str(files["draft"])]
    assert "token 7 differs" in unusable[str(files["mismatch"])]
    assert "vocabulary types" in unusable[EMBEDDED]  # the embedded SmolLM2 is BPE, the tiny files SentencePiece
    assert "token 7 differs" in dialog.draft_note.text()

    dialog.target_combo.setCurrentIndex(dialog.target_combo.findData(EMBEDDED))
    wait_for_check(qtbot, dialog)
    usable, unusable = drafts(dialog)
    gemma = {EMBEDDED_GEMMA} if gemma_assembled() else set()  # offered once its file is there
    assert usable == [None] and set(unusable) == {str(files[n]) for n in ("target", "draft", "mismatch")} | gemma


def test_adding_local_files_reports_bad_ones_and_removing_keeps_the_file(qtbot, hub, files, tmp_path, monkeypatch):
    bad = tmp_path / "bad.gguf"
    bad.write_text("this is not a model" * 100)
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(files["draft"]), str(bad)], ""))
    warnings = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: warnings.append(text))
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    dialog = open_dialog(qtbot)

    qtbot.mouseClick(dialog.add_button, Qt.LeftButton)
    added = len(BUILT_IN)  # the row after the built-in models
    assert dialog.installed_table.rowCount() == added + 1
    assert dialog.installed_table.item(added, 4).text() == "added from disk"
    assert "bad.gguf is not a GGUF model" in warnings[0]

    dialog.installed_table.selectRow(added)
    assert dialog.delete_button.text() == "Remove from list"
    qtbot.mouseClick(dialog.delete_button, Qt.LeftButton)
    assert dialog.installed_table.rowCount() == added and files["draft"].is_file()
    wait_for_check(qtbot, dialog)


def test_closing_during_a_download_stops_it_and_keeps_what_arrived(qtbot, hub, catalog):
    hub.add_fault("target.gguf", Fault(hold_after=300_000))
    dialog = open_dialog(qtbot, catalog=catalog)
    dialog.pairs_table.selectRow(0)
    qtbot.mouseClick(dialog.download_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: dialog.target_bar.value() > 0, timeout=30_000)
    threading.Timer(0.3, hub.release).start()
    dialog.close()  # waits for the worker, which stops at the next piece of data
    assert not dialog.isVisible()
    assert model_folder.partial_bytes(FileRequest(TARGET_REPO, "target.gguf")) > 0
    assert not model_folder.local_path(TARGET_REPO, "target.gguf").exists()


@pytest.mark.slow
def test_models_are_named_by_file_or_added_name_and_quantization_never_their_internal_name(qtbot, hub, tmp_path):
    """SmolLM2's file calls itself "Smollm2 135M 8k Lc100K Mix1 Ep2" inside; copies of it are shown by the name they
    were added with (an Ollama blob's name:tag) or their file's name, with the quantization its header states."""
    import shutil

    blob, renamed = tmp_path / "sha256-0123abcd", tmp_path / "renamed.gguf"  # no quantization in either name
    for path in (blob, renamed):
        shutil.copy(embedded_model_path(), path)
    model_store.add_local_model(blob, name="smollm2:135m")
    model_store.add_local_model(renamed)
    dialog = open_dialog(qtbot)
    want = {"smollm2:135m · Q4_1", "renamed.gguf · Q4_1"}

    installed = {dialog.installed_table.item(r, 0).text() for r in range(dialog.installed_table.rowCount())}
    assert installed == BUILT_IN | want
    targets = {dialog.target_combo.itemText(i) for i in range(dialog.target_combo.count())}
    assert targets >= BUILT_IN and {t.rsplit(" (", 1)[0] for t in targets - BUILT_IN} == want  # "(size)" after a file
    model = dialog.draft_model
    offered = {model.item(r).text() for r in range(1, model.rowCount()) if model.item(r).isEnabled()}
    assert want <= offered  # both copies can draft for the built-in SmolLM2
    shown = " ".join([*installed, *targets, *offered])
    assert "Smollm2 135M 8k" not in shown and "sha256-0123abcd" not in shown


def pick_no_draft(qtbot, dialog):
    """As a person does with the keyboard: Home on the Draft box picks its first row, None."""
    dialog.draft_combo.setFocus()
    qtbot.keyClick(dialog.draft_combo, Qt.Key_Home)
    assert dialog.draft_combo.currentData() is None


def choose_target(qtbot, dialog, spec):
    dialog.target_combo.setCurrentIndex(dialog.target_combo.findData(spec))
    wait_for_check(qtbot, dialog)


def test_choosing_a_target_preselects_its_one_compatible_draft_but_keeps_a_chosen_none(qtbot, hub, files):
    for name in ("target", "draft", "mismatch"):
        model_store.add_local_model(files[name])
    dialog = open_dialog(qtbot)  # the settings' pair: the built-in SmolLM2, no draft
    assert dialog.draft_combo.currentData() is None

    choose_target(qtbot, dialog, str(files["target"]))
    assert dialog.draft_combo.currentData() == str(files["draft"])  # the one that passed the check
    choose_target(qtbot, dialog, EMBEDDED)
    assert dialog.draft_combo.currentData() is None  # no tiny file fits SmolLM2: never an incompatible one

    choose_target(qtbot, dialog, str(files["target"]))
    assert dialog.draft_combo.currentData() == str(files["draft"])
    pick_no_draft(qtbot, dialog)
    choose_target(qtbot, dialog, EMBEDDED)
    choose_target(qtbot, dialog, str(files["target"]))
    assert dialog.draft_combo.currentData() is None  # the person's None is kept
    with qtbot.waitSignal(dialog.modelsChosen) as chosen:
        qtbot.mouseClick(dialog.apply_button, Qt.LeftButton)
    assert chosen.args == [str(files["target"]), None]


@pytest.mark.slow
def test_the_built_in_gemma_drafts_once_assembled_and_costs_nothing_for_other_vocabularies(
    qtbot, hub, gemma_path, tmp_path, monkeypatch
):
    loaded = []
    check = pair_check.check_drafts
    monkeypatch.setattr(
        pair_check, "check_drafts", lambda target, drafts, *a: check(target, loaded.extend(drafts) or drafts, *a)
    )
    model_store.add_local_model(gemma_path)  # a Gemma target: the built-in Gemma (the same file) can draft for it
    gemma = str(gemma_path.resolve())
    dialog = open_dialog(qtbot)
    usable, unusable = drafts(dialog)
    assert "vocabulary types" in unusable[EMBEDDED_GEMMA]  # listed for SmolLM2, and ruled out...
    assert gemma_path.resolve() not in [p.resolve() for p in loaded]  # ...from its header: its vocabulary not loaded

    choose_target(qtbot, dialog, gemma)
    assert dialog.draft_combo.currentData() == EMBEDDED_GEMMA  # the one draft that fits, preselected
    assert dialog.draft_combo.currentText() == DISPLAY_NAMES[EMBEDDED_GEMMA]
    dialog.close()

    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))  # a machine where it was never assembled
    dialog = open_dialog(qtbot)
    usable, unusable = drafts(dialog)
    assert EMBEDDED_GEMMA not in usable and EMBEDDED_GEMMA not in unusable
    assert not list((tmp_path / "cache").rglob("*.gguf"))  # nothing assembled to list it
