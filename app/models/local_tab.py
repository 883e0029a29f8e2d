"""The "On this machine" tab: GGUF models other apps already keep (the Hugging Face cache, LM Studio, Ollama, Jan,
GPT4All), found by reading headers only (engine.modelfiles.local_discovery, on a worker thread). Adding one
remembers it where it is, checked like any added file: nothing is copied. The selected one's built-in drafter (MTP
layers, or a file that is an EAGLE-3 / DFlash draft head) is read from its header in the background and said."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QHeaderView, QLabel, QPushButton, QVBoxLayout, QWidget

from app.models.drafter_note import drafter_sentence, read_drafters
from app.models.tables import make_table, selected_key, set_row
from app.models.task_worker import Tasks
from engine.errors import EngineError
from engine.modelfiles import model_store
from engine.modelfiles.downloads import format_bytes
from engine.modelfiles.local_discovery import Discovery, FoundModel, discover_models
from engine.text_rules import plain_name

SOURCE_NAMES = {
    "huggingface": "Hugging Face cache",
    "lmstudio": "LM Studio",
    "ollama": "Ollama",
    "jan": "Jan",
    "gpt4all": "GPT4All",
}


class LocalTab(QWidget):
    added = Signal(str)  # the path of a model now in the list of models
    looked = Signal()  # the list is drawn (tests wait on it)
    drafterRead = Signal()  # the selected model's drafter is said (tests wait on it)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.tasks = Tasks(self)
        self.found: list[FoundModel] = []
        self._looked_once = False
        self.table = make_table(["Model", "Found in", "Size", "Where"])
        header = self.table.horizontalHeader()  # the names whole; long folders shortened in their middle
        header.setSectionResizeMode(0, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(3, QHeaderView.Stretch)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.ElideMiddle)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.doubleClicked.connect(self.add_selected)
        self.look_button = QPushButton("Look again")
        self.look_button.clicked.connect(self.look)
        self.add_button = QPushButton("Use from where it is")
        self.add_button.setToolTip("Adds the model to your models without copying it.")
        self.add_button.clicked.connect(self.add_selected)
        self.status_label, self.drafter_label = QLabel(""), QLabel("")
        for label in (self.status_label, self.drafter_label):
            label.setWordWrap(True)
            label.setTextFormat(Qt.PlainText)  # names and headers come from files: never markup
            label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.table.itemSelectionChanged.connect(self._read_drafter)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.look_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.drafter_label)
        layout.addLayout(buttons)
        layout.addWidget(self.status_label)
        self._update_buttons()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if not self._looked_once:  # the first time the tab is opened, not every time the dialog is
            self.look()

    def look(self) -> None:
        self._looked_once = True
        self.status_label.setText("Looking for models other apps keep…")
        self.tasks.start("look", lambda cancelled: discover_models(), self._show, self._failed)
        self._update_buttons()

    def _show(self, discovery: Discovery) -> None:
        self.found = discovery.models
        self.table.setRowCount(len(self.found))
        for row, model in enumerate(self.found):
            source = SOURCE_NAMES.get(model.source, model.source)
            set_row(
                self.table,
                row,
                [plain_name(model.name), source, format_bytes(model.size_bytes), str(model.path.parent)],
                data=str(model.path),
                tooltip=str(model.path),
            )
        sources = sorted({SOURCE_NAMES.get(m.source, m.source) for m in self.found})
        text = (
            f"Found {len(self.found)} models ({', '.join(sources)}). They are used where they are: nothing is copied."
            if self.found
            else "No models found in the Hugging Face cache, LM Studio, Ollama, Jan or GPT4All folders."
        )
        if discovery.problems:
            text += "\n\nSkipped:\n" + "\n".join(discovery.problems)
        self.status_label.setText(text)
        self._update_buttons()
        self.looked.emit()

    def _failed(self, message: str) -> None:
        self.status_label.setText(message)
        self._update_buttons()

    def selected(self) -> FoundModel | None:
        path = selected_key(self.table)
        return next((m for m in self.found if str(m.path) == path), None) if path else None

    def _read_drafter(self) -> None:
        model = self.selected()
        self.tasks.cancel("drafter")
        if model is None:
            self.drafter_label.setText("")
            return
        path, name = str(model.path), plain_name(model.name)
        self.drafter_label.setText(f"{name}: reading its header…")
        self.tasks.start(
            "drafter",
            lambda stopped: read_drafters([path], stopped).get(path),
            lambda found: self._show_drafter(name, found),
            lambda message: self._show_drafter(name, message),
        )

    def _show_drafter(self, name: str, found: object) -> None:
        if isinstance(found, str):
            self.drafter_label.setText(f"{name}: its header could not be read: {found}")
        else:
            self.drafter_label.setText(f"{name}: {drafter_sentence(found if isinstance(found, dict) else None)}")
        self.drafterRead.emit()

    def add_selected(self) -> None:
        model = self.selected()
        if model is None:
            return
        try:
            added = model_store.add_local_model(model.path, name=model.name)
        except EngineError as exc:
            self.status_label.setText(f"{model.name} was not added: {exc}")
            return
        self.status_label.setText(
            f"{model.name} is in your models, used from {model.path}. It is selected "
            "below: press “Use these models” to chat with it."
        )
        self.added.emit(str(added.path))

    def _update_buttons(self) -> None:
        self.add_button.setEnabled(self.selected() is not None)
        self.look_button.setEnabled(not self.tasks.busy("look"))

    def stop(self) -> None:
        self.tasks.stop_all()
