"""The "Installed" tab: the built-in models, the models on disk (downloaded, or added from where they are),
adding GGUF files and deleting (or, for added files, forgetting) one. Built-in models cannot be deleted.

Each file's built-in drafter (MTP layers, or a file that is an EAGLE-3 / DFlash draft head) is read from its header
on a background thread (app.models.drafter_note) and shown in its row and, for the selected one, in words."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QMessageBox, QPushButton, QVBoxLayout, QWidget

from app.models.builtin_models import CANNOT_DELETE, BuiltinModel
from app.models.drafter_note import NOT_READ, drafter_sentence, drafter_short, read_drafters
from app.models.model_names import model_label
from app.models.tables import make_table, selected_key, set_row
from app.models.task_worker import Tasks
from engine.errors import EngineError
from engine.modelfiles import model_store
from engine.modelfiles.downloads import format_bytes

GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"
DRAFTER_COLUMN = 2
BUILTIN_DRAFTER = "none"  # the built-in SmolLM2 and Gemma 3 270M carry no MTP layers; Gemma's file may not exist yet


class InstalledTab(QWidget):
    changed = Signal()  # a model was added or removed: the dialog reads the list again
    draftersRead = Signal()  # every file's drafter is shown (tests wait on it)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.tasks = Tasks(self)
        self.installed: list[model_store.InstalledModel] = []
        self.builtins: list[BuiltinModel] = []
        self.drafters: dict[str, dict | str | None] = {}  # path -> drafter, or why its header could not be read
        self.table = make_table(["Model", "Size", "Built-in drafter", "Location", "Source"])
        self.table.itemSelectionChanged.connect(self._selected)
        self.add_button = QPushButton("Add GGUF file…")
        self.add_button.clicked.connect(self.add_local_files)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_selected)
        self.drafter_label = QLabel("")
        self.drafter_label.setWordWrap(True)
        self.drafter_label.setTextFormat(Qt.TextFormat.PlainText)  # built from a file's header: never markup
        self.drafter_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.delete_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.drafter_label)
        layout.addLayout(buttons)

    def show_models(self, installed: list[model_store.InstalledModel], builtins: list[BuiltinModel]) -> None:
        self.installed, self.builtins = installed, builtins
        self.table.setRowCount(len(builtins) + len(installed))
        for row, builtin in enumerate(builtins):
            size = format_bytes(builtin.size_bytes) if builtin.size_bytes is not None else "—"
            set_row(
                self.table,
                row,
                [builtin.name, size, BUILTIN_DRAFTER, builtin.location, "built in"],
                data=builtin.spec,
                tooltip=builtin.about,
            )
        for row, model in enumerate(installed, start=len(builtins)):
            source = (model.repo_id or "") if model.origin == model_store.DOWNLOADED else "added from disk"
            set_row(
                self.table,
                row,
                [
                    model_label(str(model.path), installed),
                    format_bytes(model.size_bytes),
                    "reading…",
                    str(model.location),
                    source,
                ],
                data=str(model.path),
                tooltip=str(model.path),
            )
        self.drafters = {}
        paths = [str(m.path) for m in installed]
        self.tasks.start("drafters", lambda stopped: read_drafters(paths, stopped), self._show_drafters, self._failed)
        self._selected()

    def _show_drafters(self, drafters: dict) -> None:
        self.drafters = drafters
        for row, model in enumerate(self.installed, start=len(self.builtins)):
            found = drafters.get(str(model.path))
            item = self.table.item(row, DRAFTER_COLUMN)
            item.setText(NOT_READ if isinstance(found, str) else drafter_short(found))
            item.setToolTip(
                f"Its header could not be read: {found}" if isinstance(found, str) else drafter_sentence(found)
            )
        self._selected()
        self.draftersRead.emit()

    def _failed(self, message: str) -> None:
        self.drafter_label.setText(f"The models' drafters could not be read: {message}")

    def selected_model(self) -> model_store.InstalledModel | None:
        path = selected_key(self.table)
        return next((m for m in self.installed if str(m.path) == path), None) if path is not None else None

    def selected_builtin(self) -> BuiltinModel | None:
        spec = selected_key(self.table)
        return next((b for b in self.builtins if b.spec == spec), None) if spec is not None else None

    def _selected(self) -> None:
        model = self.selected_model()
        local = model is not None and model.origin == model_store.LOCAL
        self.delete_button.setText("Remove from list" if local else "Delete")
        self.delete_button.setEnabled(model is not None)
        self.delete_button.setToolTip(CANNOT_DELETE if self.selected_builtin() is not None else "")
        self.drafter_label.setText(self._drafter_text(model))

    def _drafter_text(self, model: model_store.InstalledModel | None) -> str:
        builtin = self.selected_builtin()
        if builtin is not None:
            return f"{builtin.name}: {drafter_sentence(None)}"
        if model is None:
            return ""
        if str(model.path) not in self.drafters:
            return f"{model.name}: reading its header…" if self.tasks.busy("drafters") else ""
        found = self.drafters[str(model.path)]
        return f"{model.name}: " + (
            f"its header could not be read: {found}" if isinstance(found, str) else drafter_sentence(found)
        )

    def stop(self) -> None:
        self.tasks.stop_all()

    def add_local_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add GGUF models", str(Path.home()), GGUF_FILTER)
        problems = []
        for path in paths:
            try:
                model_store.add_local_model(path)
            except EngineError as exc:
                problems.append(str(exc))
        self.changed.emit()
        if problems:
            QMessageBox.warning(self, "Add GGUF file", "Not added:\n\n" + "\n\n".join(problems))

    def delete_selected(self) -> None:
        builtin = self.selected_builtin()
        if builtin is not None:  # the button is disabled for them; this covers any other way here
            QMessageBox.information(self, "Models", f"{builtin.name}: {CANNOT_DELETE}")
            return
        model = self.selected_model()
        if model is None:
            return
        if model.origin == model_store.LOCAL:
            question = f"Remove {model.name} from the list?\n\nThe file stays where it is:\n{model.path}"
        else:
            question = f"Delete {model.name} ({format_bytes(model.size_bytes)}) from disk?\n\n{model.path}"
        if QMessageBox.question(self, "Models", question) != QMessageBox.StandardButton.Yes:
            return
        try:
            model_store.delete_model(model.path)
        except (EngineError, OSError) as exc:
            QMessageBox.warning(self, "Models", f"{model.name} could not be removed: {exc}")
        self.changed.emit()
