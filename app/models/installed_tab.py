"""The "Installed" tab: the built-in models, the models on disk (downloaded, or added from where they are),
adding GGUF files and deleting (or, for added files, forgetting) one. Built-in models cannot be deleted."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QMessageBox, QPushButton, QVBoxLayout, QWidget

from app.models.builtin_models import CANNOT_DELETE, BuiltinModel
from app.models.model_names import model_label
from app.models.tables import make_table, selected_key, set_row
from engine.errors import EngineError
from engine.modelfiles import model_store
from engine.modelfiles.downloads import format_bytes

GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"


class InstalledTab(QWidget):
    changed = Signal()  # a model was added or removed: the dialog reads the list again

    def __init__(self, parent=None):
        super().__init__(parent)
        self.installed: list[model_store.InstalledModel] = []
        self.builtins: list[BuiltinModel] = []
        self.table = make_table(["Model", "Size", "Location", "Source"])
        self.table.itemSelectionChanged.connect(self._selected)
        self.add_button = QPushButton("Add GGUF file…")
        self.add_button.clicked.connect(self.add_local_files)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.delete_selected)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.delete_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)

    def show_models(self, installed: list[model_store.InstalledModel], builtins: list[BuiltinModel]) -> None:
        self.installed, self.builtins = installed, builtins
        self.table.setRowCount(len(builtins) + len(installed))
        for row, builtin in enumerate(builtins):
            size = format_bytes(builtin.size_bytes) if builtin.size_bytes is not None else "—"
            set_row(
                self.table,
                row,
                [builtin.name, size, builtin.location, "built in"],
                data=builtin.spec,
                tooltip=builtin.about,
            )
        for row, model in enumerate(installed, start=len(builtins)):
            source = (model.repo_id or "") if model.origin == model_store.DOWNLOADED else "added from disk"
            set_row(
                self.table,
                row,
                [model_label(str(model.path), installed), format_bytes(model.size_bytes), str(model.location), source],
                data=str(model.path),
                tooltip=str(model.path),
            )
        self._selected()

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
