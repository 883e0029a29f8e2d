"""Which engine answers a chat, in its settings dialog: this machine's, or an OpenAI-compatible server (vLLM,
llama-server, a SpecChat server elsewhere) with its URL, a model from its /v1/models (asked on a thread of its
own) and an API key, which goes to the system keyring (engine/remote/keys.py), never into SpecChat's files."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLineEdit, QPushButton, QWidget

from app.background import run_in_background
from app.remote_answer import ask_server, use_key_for_this_run
from app.settings.dialog import hint
from engine.errors import EngineError, InvalidSettingError
from engine.remote.endpoint import Endpoint, normalised_url, url_warning
from engine.remote.keys import save_key

THIS_MACHINE, REMOTE = "", "remote"
WARNING_STYLE = "color: #c62828;"


class EnginePicker(QGroupBox):
    changed = Signal()  # what values() gives may differ

    def __init__(self, parent=None):
        super().__init__("Engine", parent)
        self.engine = QComboBox()
        self.engine.addItem("This machine", THIS_MACHINE)
        self.engine.addItem("A server (OpenAI-compatible: vLLM, llama-server, SpecChat)", REMOTE)
        self.engine.setToolTip(
            "Who writes this chat's answers. A server elsewhere keeps your conversations here, "
            "with its speed measured here and its speculation figures where it reports them."
        )
        self.url = QLineEdit()
        self.url.setPlaceholderText("e.g. http://127.0.0.1:8000 (vLLM), :8080 (llama-server)")
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.lineEdit().setPlaceholderText("the first model it serves")
        self.list_models = QPushButton("List models")
        self.list_models.setToolTip("Ask the server for its models (/v1/models).")
        self.list_models.clicked.connect(lambda: self.ask_for_models())
        self.model_row = QWidget()
        row = QHBoxLayout(self.model_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.model, 1)
        row.addWidget(self.list_models)
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("unchanged (none, or the one saved for this server)")
        self.api_key.setToolTip("Kept in your system's keyring for this server's URL, never in SpecChat's files.")
        self.note = hint("")
        form = QFormLayout(self)
        form.addRow("Answered by", self.engine)
        form.addRow("Server URL", self.url)
        form.addRow("Model", self.model_row)
        form.addRow("API key", self.api_key)
        form.addRow(self.note)
        for signal in (self.engine.currentIndexChanged, self.url.textChanged, self.model.currentTextChanged):
            signal.connect(self._show_state)
            signal.connect(self.changed)
        self._show_state()

    @property
    def remote(self) -> bool:
        return self.engine.currentData() == REMOTE

    def show_values(self, url: str, model: str) -> None:
        self.engine.setCurrentIndex(self.engine.findData(REMOTE if url else THIS_MACHINE))
        self.url.setText(url)
        self.model.setCurrentText(model)

    def values(self) -> dict:
        """{"engine_url", "engine_model"} as chosen; raises InvalidSettingError for a URL that cannot be used."""
        if not self.remote:
            return {"engine_url": "", "engine_model": ""}
        return {"engine_url": normalised_url(self.url.text()), "engine_model": self.model.currentText().strip()}

    def _show_state(self, *_args) -> None:
        """The server's fields only for a server; what to know about its URL under them."""
        for widget in (self.url, self.model_row, self.api_key):
            widget.setEnabled(self.remote)
        note = ""
        if self.remote and self.url.text().strip():
            try:
                note = url_warning(normalised_url(self.url.text()))
            except InvalidSettingError as exc:
                note = str(exc)
        self._say(note, warning=bool(note))

    def _say(self, text: str, warning: bool = False) -> None:
        self.note.setText(text)
        self.note.setStyleSheet(WARNING_STYLE if warning else "")

    def ask_for_models(self) -> None:
        """The server's models, asked on a thread of its own (a server far away must not freeze the window)."""
        try:
            url = normalised_url(self.url.text())
        except InvalidSettingError as exc:
            return self._say(str(exc), warning=True)
        key = self.api_key.text().strip() or None
        self.list_models.setEnabled(False)
        self._say(f"Asking {url} for its models…")
        ask_server(
            Endpoint(url, "", key),
            lambda remote: [m.id for m in remote.models()],
            lambda listed: self._models_listed(url, listed),
            "list-models",
            owner=self,
        )

    def _models_listed(self, url: str, ids) -> None:
        self.list_models.setEnabled(True)
        if isinstance(ids, str):  # why the server could not be asked
            return self._say(ids, warning=True)
        typed = self.model.currentText().strip()
        self.model.clear()
        self.model.addItems(ids)
        self.model.setCurrentText(typed if typed in ids else ids[0])
        self._say(f"{url} serves {len(ids)} model{'s' if len(ids) != 1 else ''}.")

    def keep_api_key(self, warn: Callable[[str], None], owner: QObject | None = None) -> None:
        """A typed key is used at once, and saved in the system keyring off the GUI thread (a keyring may wait for
        the person to unlock it: a daemon job, app.background); where there is none, warn(why) follows on the GUI
        thread (unless owner is gone by then), and the key lasts until SpecChat quits."""
        key = self.api_key.text().strip()
        if not key or not self.remote:
            return
        url = normalised_url(self.url.text())
        use_key_for_this_run(url, key)

        def save() -> str:
            try:
                save_key(url, key)
            except EngineError as exc:
                return str(exc)
            return ""

        def saved(why: str) -> None:
            if why:
                warn(why)

        run_in_background(save, done=saved, owner=owner, daemon=True, name="save-api-key")
