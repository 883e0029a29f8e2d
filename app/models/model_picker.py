"""The "Use these models" box: a target and a draft for it. The draft picker offers only drafts that
pass llama.cpp's vocabulary check against the chosen target (run in the background, app.background); the others are
listed greyed out, with the reason. Under the target, its built-in drafter (MTP layers), or that the file is a
draft head and not a model to chat with, read from its header in the background (app.models.drafter_note)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from app.background import Job
from app.models.builtin_models import BuiltinModel, gemma_assembled
from app.models.drafter_note import drafter_sentence, read_drafters
from app.models.model_names import model_label
from app.models.task_worker import STOP_WAIT_S, Tasks
from engine.decoding import pair_check
from engine.modelfiles import model_store
from engine.modelfiles.downloads import format_bytes
from engine.modelfiles.embedded import EMBEDDED, EMBEDDED_GEMMA, resolve_model
from engine.modelfiles.header_peek import vocab_type
from engine.modelfiles.vocab_check import Compatibility

log = logging.getLogger(__name__)
TYPES_DIFFER = "different vocabulary types (e.g. SentencePiece vs BPE)"  # vocab_check's words for the same rule


def check_compatibility(target_spec: str, drafts: list[str], stopped: Callable[[], bool]) -> dict:
    """{draft spec: Compatibility} with the target, in the background (app.background): never raises, a failure is
    each draft's reason."""
    try:
        target = resolve_model(target_spec)
        paths = {spec: resolve_model(spec) for spec in drafts}
        # Vocabulary types from the headers first (0.1 s): llama.cpp's check refuses those pairs anyway, and
        # loading a 262k-token vocabulary (the built-in Gemma's) to be told so took 1.5 s per target.
        results = {
            spec: Compatibility(False, TYPES_DIFFER) for spec, path in paths.items() if _types_differ(target, path)
        }
        loaded = {spec: path for spec, path in paths.items() if spec not in results}
        found = pair_check.check_drafts(target, loaded.values(), stopped)
        results.update({spec: found[path] for spec, path in loaded.items() if path in found})
    except Exception as exc:  # noqa: BLE001 - report as a reason, never crash the dialog
        log.exception("compatibility check")
        results = {spec: Compatibility(False, f"could not be checked: {exc}") for spec in drafts}
    return results


class ModelPicker(QGroupBox):
    """Target and draft combos; apply_button is enabled once the drafts for this target are checked."""

    compatibilityChecked = Signal()
    targetDrafterRead = Signal()  # the target's drafter is said (tests wait on it)

    def __init__(self, current_target: str, current_draft: str | None, parent=None):
        super().__init__("Use these models", parent)
        self._current_target = current_target
        self._current_draft = current_draft
        self.installed: list[model_store.InstalledModel] = []
        self._check: Job | None = None
        self._compat: dict[str, Compatibility] = {}
        self._compat_target: str | None = None
        self._compat_generation = 0  # bumps whenever the target or the candidates change
        self._target_moved = False  # a target other than the one the dialog opened with was chosen
        self._none_chosen = False  # the person picked "None" here: no draft is preselected for them

        self.target_combo = QComboBox()
        self.target_combo.currentIndexChanged.connect(self._target_changed)
        self.draft_combo = QComboBox()
        self.draft_model = QStandardItemModel(self.draft_combo)
        self.draft_combo.setModel(self.draft_model)
        self.draft_combo.activated.connect(self._draft_picked)
        self.draft_note = QLabel("")
        self.draft_note.setWordWrap(True)
        self.target_note = QLabel("")  # the target's built-in drafter; empty for a model without one
        self.target_note.setWordWrap(True)
        self.target_note.setTextFormat(Qt.TextFormat.PlainText)
        self.target_note.hide()
        self.tasks = Tasks(self)
        self.apply_button = QPushButton("Use these models")
        self.apply_button.setDefault(True)
        self.close_button = QPushButton("Close")
        form = QFormLayout()
        form.addRow("Target", self.target_combo)
        form.addRow("", self.target_note)
        form.addRow("Draft", self.draft_combo)
        form.addRow("", self.draft_note)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)

    def target(self) -> str:
        return self.target_combo.currentData() or EMBEDDED

    def draft(self) -> str | None:
        return self.draft_combo.currentData()

    def prefer_draft(self, spec: str) -> None:
        """Preselect this draft once its compatibility is confirmed (a pair just downloaded)."""
        self._current_draft = spec

    def show_models(
        self, installed: list[model_store.InstalledModel], builtins: list[BuiltinModel], select: str | None = None
    ) -> None:
        """Offer the built-in and installed models as targets; keep the target unless told another."""
        self.installed = installed
        keep = select or self.target_combo.currentData() or self._current_target
        self.target_combo.blockSignals(True)
        self.target_combo.clear()
        for builtin in builtins:
            self.target_combo.addItem(builtin.name, builtin.spec)
            self.target_combo.setItemData(self.target_combo.count() - 1, builtin.about, Qt.ItemDataRole.ToolTipRole)
        for model in installed:
            self.target_combo.addItem(
                f"{model_label(str(model.path), installed)} ({format_bytes(model.size_bytes)})", str(model.path)
            )
        if self.target_combo.findData(keep) < 0:
            self.target_combo.addItem(f"{model_label(keep)} (current)", keep)  # e.g. chosen in Settings
        self.target_combo.setCurrentIndex(max(self.target_combo.findData(keep), 0))
        self.target_combo.blockSignals(False)
        self._target_changed()

    def _draft_candidates(self, target: str) -> list[str]:
        # The built-in Gemma base model only once its file is there (or as the current draft): listing it must not
        # assemble its 250 MB file; its 262k-token vocabulary is loaded only for a target of the same vocabulary
        # type (CompatibilityWorker reads the types from the headers first).
        candidates = (
            [EMBEDDED] + ([EMBEDDED_GEMMA] if gemma_assembled() else []) + [str(m.path) for m in self.installed]
        )
        if self._current_draft and self._current_draft not in candidates:
            candidates.append(self._current_draft)
        return [c for c in candidates if c != target]

    def _target_changed(self) -> None:
        target = self.target_combo.currentData()
        if target is None:
            return
        self._target_moved = self._target_moved or (self._compat_target is not None and target != self._compat_target)
        self._compat, self._compat_target = {}, target
        self._compat_generation += 1
        self._fill_drafts(checking=True)
        self._start_check()
        self.apply_button.setEnabled(self._check is None)
        self._read_target_drafter(target)

    def _read_target_drafter(self, target: str) -> None:
        self._set_target_note(None)
        self.tasks.cancel("drafter")
        if target in (EMBEDDED, EMBEDDED_GEMMA):  # the built-in models carry no drafter; Gemma's file may not exist
            return
        self.tasks.start(
            "drafter", lambda stopped: read_drafters([target], stopped).get(target), self._show_drafter, lambda _: None
        )

    def _show_drafter(self, found: object) -> None:
        self._set_target_note(found)
        self.targetDrafterRead.emit()

    def _set_target_note(self, found: object) -> None:
        """The drafter's sentence under the target; hidden for a model without one (or not read yet)."""
        self.target_note.setText(drafter_sentence(found) if isinstance(found, dict) else "")
        self.target_note.setVisible(isinstance(found, dict))

    def _draft_picked(self) -> None:
        self._current_draft = self.draft_combo.currentData()  # kept across target changes if still usable
        self._none_chosen = self._current_draft is None

    def _fill_drafts(self, checking: bool = False) -> None:
        previous = self._current_draft
        self.draft_model.clear()
        self.draft_model.appendRow(_item("None (no draft model)", None))
        unusable = []
        for spec in self._draft_candidates(self._compat_target or EMBEDDED):
            result = self._compat.get(spec)
            name = model_label(spec, self.installed)
            if result is None:
                continue
            if result.ok:
                self.draft_model.appendRow(_item(name, spec))
            else:
                unusable.append(f"{name}: {result.reason}")
                self.draft_model.appendRow(_item(f"{name} (not usable: {result.reason})", spec, enabled=False))
        index = self.draft_combo.findData(previous) if previous else 0
        usable = index >= 0 and bool(self.draft_model.item(index).isEnabled())
        index = index if usable else 0
        if index == 0 and self._target_moved and not self._none_chosen:
            index = self._sole_usable_draft()
        self.draft_combo.setCurrentIndex(index)
        if checking:
            self.draft_note.setText("Checking which drafts can serve this target…")
        elif unusable:
            self.draft_note.setText(
                "Not usable with this target (llama.cpp's vocabulary rules):\n" + "\n".join(unusable)
            )
        else:
            self.draft_note.setText("")

    def _sole_usable_draft(self) -> int:
        """The row of the one draft that passed the check for this target, or 0 (None) if not exactly one."""
        rows = [r for r in range(1, self.draft_model.rowCount()) if self.draft_model.item(r).isEnabled()]
        return rows[0] if len(rows) == 1 else 0

    def _start_check(self) -> None:
        if self._check is not None:
            self._check.stop()  # its answer is out of date; _check_done starts the next check
            return
        target, generation = self._compat_target, self._compat_generation
        if target is None:  # no target chosen yet: nothing to check against
            return
        job = Job(owner=self, name="compatibility-check", done=lambda results: self._check_done(generation, results))
        self._check = job.start(check_compatibility, target, self._draft_candidates(target), job.stopped)

    def _check_done(self, generation: int, results: dict) -> None:
        self._check = None
        if generation != self._compat_generation:
            self._start_check()
            return
        self._compat = results
        self._fill_drafts()
        self.apply_button.setEnabled(True)
        self.compatibilityChecked.emit()

    def stop(self) -> None:
        """The window is closing: stop a check in progress and wait (a while) for it to end."""
        self.tasks.stop_all()
        if self._check is not None:
            self._check.stop()
            self._check.wait(STOP_WAIT_S)


def _types_differ(target: Path, draft: Path) -> bool:
    """Both headers name their vocabulary type, and the types differ (unknown or unreadable: llama.cpp decides)."""
    a, b = vocab_type(target), vocab_type(draft)
    return a is not None and b is not None and a != b


def _item(text: str, data, enabled: bool = True) -> QStandardItem:
    item = QStandardItem(text)
    item.setData(data, Qt.ItemDataRole.UserRole)
    item.setToolTip(text)
    item.setEnabled(enabled)
    return item
