"""Model → Server…: serve the loaded model to editors and scripts through the OpenAI-compatible API, on
the window's own engine (its chat joins the same batch), with a live log of every request."""

from __future__ import annotations

import secrets
import time

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from engine.errors import InvalidSettingError
from engine.figures import FIGURE, NA

RATE_MEANING = (
    "tok/s (API): the response's timings.predicted_per_second, counted as llama.cpp's server counts "
    "it: every answer token, the first included, ÷ the time from the first token to the last. The chat's "
    "stats line leaves the first token out (tokens after the first ÷ the same time), so it reads lower, "
    "most on short answers."
)


class RequestLogModel(QAbstractTableModel):
    """The API's requests, newest last: each row one engine.serving.api_config.RequestRecord."""

    # The figures' columns are named as the stats line names them (engine.figures); tok/s is the API's own figure,
    # which counts the first token too, so it is labelled as that one (RATE_MEANING), not as the stats line's.
    COLUMNS = (
        "Time",
        "Client",
        "Endpoint",
        "Prompt",
        "Answer",
        f"{FIGURE['tokens_per_s'].unit} (API)",
        FIGURE["acceptance_rate"].short.capitalize(),
        FIGURE["ttft_s"].short,
        FIGURE["method"].label.capitalize(),
        FIGURE["finish_reason"].label.capitalize(),
    )
    RATE_COLUMN = 5
    KEEP = 500

    def __init__(self, parent=None):
        super().__init__(parent)
        self.records: list = []

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.records)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):
        if orientation != Qt.Horizontal:
            return None
        if role == Qt.DisplayRole:
            return self.COLUMNS[section]
        if role == Qt.ItemDataRole.ToolTipRole and section == self.RATE_COLUMN:
            return RATE_MEANING
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid() or role not in (Qt.DisplayRole, Qt.TextAlignmentRole):
            return None
        if role == Qt.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignVCenter) if 3 <= index.column() <= 7 else None
        r = self.records[index.row()]
        end = r.finish or "-"
        if r.status != 200:
            end = f"{r.status} {end}" if r.finish else str(r.status)
        ttft = NA if r.ttft_s is None else f"{1000 * r.ttft_s:.0f} ms"  # ms: a server's TTFT is short
        return (
            time.strftime("%H:%M:%S", time.localtime(r.started)),
            r.client,
            r.endpoint,
            str(r.prompt_tokens),
            str(r.completion_tokens),
            FIGURE["tokens_per_s"].value_text(r.tokens_per_s),
            FIGURE["acceptance_rate"].value_text(r.acceptance_rate),
            ttft,
            r.method,
            end,
        )[index.column()]

    def add(self, record) -> None:
        if len(self.records) >= self.KEEP:
            self.beginRemoveRows(QModelIndex(), 0, 0)
            self.records.pop(0)
            self.endRemoveRows()
        self.beginInsertRows(QModelIndex(), len(self.records), len(self.records))
        self.records.append(record)
        self.endInsertRows()


class ServerPanel(QWidget):
    """Start and stop the server, its options, and the request log. Options are saved in the settings."""

    optionsChanged = Signal(dict)  # settings keys -> values, for the window to save

    def __init__(self, engine, settings, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Server")
        self.setWindowFlag(Qt.Window)
        self.engine = engine
        self.running: dict | None = None  # what serverStarted said
        self.warning: str | None = None  # about the options being started, said beside "Serving …"
        self._build(settings)
        worker = engine.worker
        worker.serverStarted.connect(self._started)
        worker.serverStopped.connect(self._stopped)
        worker.serverFailed.connect(self._failed)
        worker.serverRequest.connect(self.log.add)
        self._set_running(None)

    def _build(self, s) -> None:
        form = self._build_options(s)
        self.start_button = QPushButton("Start server")
        self.start_button.clicked.connect(self.toggle)
        self.copy_button = QPushButton("Copy URL")
        self.copy_button.clicked.connect(self._copy_url)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.copy_button)
        buttons.addStretch(1)
        self._build_log()
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        caption = QLabel(
            "Requests, each as measured: tok/s (API) is the figure the API's response gives "
            "(every answer token ÷ the time from the first token to the last, as llama.cpp's server "
            "counts; the chat's stats line leaves the first token out); n/a where none was read."
        )
        caption.setWordWrap(True)
        caption.setToolTip(RATE_MEANING)
        layout.addWidget(caption)
        layout.addWidget(self.table, 1)
        self.resize(820, 520)

    def _build_options(self, s) -> QFormLayout:
        """The server's options, from the settings s: port, network, API key, CORS, host names, parallel requests."""
        self.port = QSpinBox(minimum=1, maximum=65535, value=s.server_port)
        self.lan = QCheckBox("Serve on the local network (other machines can connect; needs an API key)")
        self.lan.setChecked(s.server_lan)
        self.api_key = QLineEdit(s.server_api_key, placeholderText="none: any local program may connect")
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)  # a secret: not for whoever sees the screen
        self.show_key = QPushButton("Show")
        self.show_key.setCheckable(True)
        self.show_key.setToolTip("Show or hide the API key")
        self.show_key.toggled.connect(self._show_key)
        generate = QPushButton("Generate")
        generate.clicked.connect(lambda: self.api_key.setText(secrets.token_urlsafe(24)))
        key_row = QHBoxLayout()
        key_row.addWidget(self.api_key, 1)
        key_row.addWidget(self.show_key)
        key_row.addWidget(generate)
        self.cors = QLineEdit(s.server_cors, placeholderText="e.g. http://localhost:3000 (comma-separated; * for any)")
        self.hosts = QLineEdit(
            s.server_hosts,
            placeholderText="e.g. mybox.local (comma-separated; this machine's own addresses always work)",
        )
        self.hosts.setToolTip(
            "Host names clients may use to reach the server. Requests addressed to any other name "
            "are refused, so a web page cannot reach it through a name it controls (DNS rebinding)."
        )
        self.parallel = QSpinBox(minimum=1, maximum=16, value=s.server_parallel)
        self.parallel.setToolTip("Requests decoded together in one batch (the chat counts as one); more wait in line.")
        form = QFormLayout()
        form.addRow("Port", self.port)
        form.addRow("", self.lan)
        form.addRow("API key", key_row)
        form.addRow("CORS origins", self.cors)
        form.addRow("Host names", self.hosts)
        form.addRow("Parallel requests", self.parallel)
        return form

    def _build_log(self) -> None:
        """The requests served, one row each as it ends."""
        self.log = RequestLogModel(self)
        self.table = QTableView()
        self.table.setModel(self.log)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.resizeColumnsToContents()  # as wide as the headers: ten columns of 100 px would scroll sideways
        self.log.rowsInserted.connect(self._row_added)

    # --- options ------------------------------------------------------------------------------------
    def _show_key(self, shown: bool) -> None:
        self.api_key.setEchoMode(QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password)
        self.show_key.setText("Hide" if shown else "Show")

    def values(self) -> dict:
        return {
            "server_port": self.port.value(),
            "server_lan": self.lan.isChecked(),
            "server_api_key": self.api_key.text().strip(),
            "server_cors": self.cors.text().strip(),
            "server_hosts": self.hosts.text().strip(),
            "server_parallel": self.parallel.value(),
        }

    def toggle(self) -> None:
        if self.running is not None:
            self.status.setText("Stopping…")
            self.start_button.setText("Stopping…")
            self.start_button.setEnabled(False)  # until the engine says it stopped
            self.engine.stop_server()
            return
        from app.settings.values import AppSettings

        values = self.values()
        try:
            options = AppSettings(**values).serve_options()
        except InvalidSettingError as exc:
            self.status.setText(f"Not started: {exc}")
            return
        self.optionsChanged.emit(values)
        self.warning = options.open_to_every_page
        self.status.setText("Starting…")
        self.start_button.setEnabled(False)
        self.engine.start_server(options)

    # --- what the engine says -------------------------------------------------------------------------
    def _started(self, info: dict) -> None:
        self._set_running(info)

    def _stopped(self, reason: str) -> None:
        self._set_running(None)
        self.status.setText(reason or "Stopped.")

    def _failed(self, message: str) -> None:
        self._set_running(None)
        self.status.setText(f"Not started: {message}")

    def _set_running(self, info: dict | None) -> None:
        self.running = info
        self.start_button.setEnabled(True)
        self.start_button.setText("Stop server" if info else "Start server")
        self.copy_button.setEnabled(info is not None)
        for field in (self.port, self.lan, self.api_key, self.cors, self.hosts, self.parallel):
            field.setEnabled(info is None)
        if info:
            self.status.setText(
                f"Serving {info['model']} at {info['url']}/v1 ({info['method']}, {info['parallel']} in parallel). "
                "OpenAI clients: base_url = that address; the chat in this window joins the same batch."
                + (f"\n{self.warning}" if self.warning else "")
            )

    def _row_added(self, *_args) -> None:
        self.table.resizeColumnsToContents()
        self.table.scrollToBottom()

    def _copy_url(self) -> None:
        if self.running:
            QGuiApplication.clipboard().setText(self.running["url"] + "/v1")
