"""The Models dialog: get a catalog pair, search the hub for any model and a draft that fits it, use the models
other apps keep on this machine, see and manage installed models (with each one's built-in drafter), pick target + draft.

Its parts live in app/models/: the pairs tab and its download runner (pairs_tab.py,
download_worker.py), the installed-models tab (installed_tab.py), the target + draft picker with
its compatibility check (model_picker.py), the built-in models both of those list (builtin_models.py), the hub
search with its draft finder (search_tab.py) and the models found on this machine (local_tab.py).
This module puts them together and passes news between them: a finished download is selected in
the picker, an added or removed file redraws all three.

Downloads, searches and compatibility checks run in the background (app.background); the GUI thread only
receives their answers. A download stops (keeping what arrived) when the window closes; Resume continues it
later.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDialog, QTabWidget, QVBoxLayout

from app.models.builtin_models import BuiltinModel, builtin_models
from app.models.installed_tab import GGUF_FILTER, InstalledTab
from app.models.local_tab import LocalTab
from app.models.model_picker import ModelPicker
from app.models.pairs_tab import BAR_STEPS, PairsTab
from app.models.search_tab import SearchTab
from engine.errors import EngineError
from engine.modelfiles import model_store
from engine.modelfiles.catalog import CatalogPair, load_catalog
from engine.modelfiles.embedded import EMBEDDED

__all__ = ["BAR_STEPS", "GGUF_FILTER", "ModelsDialog"]


class ModelsDialog(QDialog):
    modelsChosen = Signal(str, object)  # target path or "embedded", draft path or None
    downloadFinished = Signal(list)
    downloadStopped = Signal(str)  # cancelled or failed, with the message shown
    compatibilityChecked = Signal()

    def __init__(
        self, current_target: str, current_draft: str | None, parent=None, *, catalog: list[CatalogPair] | None = None
    ):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(980, 720)
        catalog_error = ""
        try:
            catalog = load_catalog() if catalog is None else catalog
        except EngineError as exc:
            catalog, catalog_error = [], str(exc)
        self.catalog = catalog
        self.installed: list[model_store.InstalledModel] = []
        self.builtins: list[BuiltinModel] = []
        self.pairs = PairsTab(catalog, catalog_error)
        self.search_tab = SearchTab()
        self.local_tab = LocalTab()
        self.installed_tab = InstalledTab()
        self.picker = ModelPicker(str(current_target or EMBEDDED), current_draft)
        self.pairs.downloadFinished.connect(self._download_finished)
        self.pairs.downloadEnded.connect(self._download_ended)
        self.search_tab.downloadFinished.connect(self._download_finished)
        self.search_tab.downloadEnded.connect(self._download_ended)
        self.local_tab.added.connect(lambda path: self.refresh(select_target=path))
        self.installed_tab.changed.connect(self.refresh)
        self.picker.compatibilityChecked.connect(self.compatibilityChecked)
        self.picker.apply_button.clicked.connect(self.apply)
        self.picker.close_button.clicked.connect(self.close)

        # The parts' widgets under the dialog's own names, as callers and tests have always used them.
        p, i, c = self.pairs, self.installed_tab, self.picker
        self.pairs_table, self.pair_details, self.status_label = p.table, p.details, p.status_label
        self.download_button, self.cancel_button = p.download_button, p.cancel_button
        self.target_bar, self.draft_bar = p.target_bar, p.draft_bar
        self.installed_table, self.add_button, self.delete_button = i.table, i.add_button, i.delete_button
        self.target_combo, self.draft_combo, self.draft_model = c.target_combo, c.draft_combo, c.draft_model
        self.draft_note, self.apply_button = c.draft_note, c.apply_button

        self.tabs = tabs = QTabWidget()
        tabs.addTab(self.pairs, "Get a pair")
        tabs.addTab(self.search_tab, "Search the hub")
        tabs.addTab(self.local_tab, "On this machine")
        tabs.addTab(self.installed_tab, "Installed")
        layout = QVBoxLayout(self)
        layout.addWidget(tabs, 1)
        layout.addWidget(self.picker)
        self.refresh()

    def refresh(self, select_target: str | None = None) -> None:
        """Re-read what is installed and redraw the tables and pickers."""
        try:
            self.installed = model_store.list_models()
        except EngineError as exc:
            self.installed = []
            self.pairs.show_status(str(exc), error=True)
        self.builtins = builtin_models()  # cheap: nothing is assembled or loaded
        self.pairs.refresh()
        self.installed_tab.show_models(self.installed, self.builtins)
        self.picker.show_models(self.installed, self.builtins, select_target)

    def _download_finished(self, paths: list) -> None:
        if paths[1]:
            self.picker.prefer_draft(paths[1])
        self.refresh(select_target=paths[0])
        self.downloadFinished.emit(paths)

    def _download_ended(self, message: str) -> None:
        self.refresh()
        self.downloadStopped.emit(message)

    def apply(self) -> None:
        self.modelsChosen.emit(self.picker.target(), self.picker.draft())
        if not (self.pairs.downloading or self.search_tab.downloading):
            self.accept()
        else:
            for tab in (self.pairs, self.search_tab):
                tab.show_status("Now using the chosen models; the download goes on.")

    def closeEvent(self, event) -> None:
        self._stop_workers()
        super().closeEvent(event)

    def done(self, result: int) -> None:  # Close, Escape and Apply all end here
        self._stop_workers()
        super().done(result)

    def _stop_workers(self) -> None:
        """What runs in the background ends before the window goes; a stopped download keeps what arrived."""
        self.pairs.stop()
        self.search_tab.stop()
        self.local_tab.stop()
        self.installed_tab.stop()
        self.picker.stop()
