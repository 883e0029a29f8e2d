"""The lab's "Experiment" form: models, methods, concurrency levels, prompts and run options, and
the LabConfig they make; or, with Engine set to servers, their URLs and client counts (a RemoteLabConfig)."""

from __future__ import annotations

from argparse import ArgumentTypeError

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from engine.errors import InvalidSettingError
from engine.lab.cli import _int_list
from engine.lab.local import LabConfig
from engine.lab.remote import RemoteLabConfig, parse_servers
from engine.lab.report import METHOD_WORDS
from engine.methods import DEFAULT_MAX_DRAFT, DRAFT_METHODS, MAX_DRAFT_LIMIT, METHODS, method_words
from engine.modelfiles.embedded import DISPLAY_NAMES, EMBEDDED
from engine.paths import resources_dir

PROMPT_SETS = {"grounded": "Grounded and editing tasks", "open": "Open-ended chat"}
CUSTOM = "custom"
LEVELS = (1, 2, 4, 8, 16)
# Short words where four checkboxes share a row of the form (the report's words are their tooltips).
BOX_WORDS = method_words("box")
THIS_MACHINE, SERVERS = "local", "servers"


class LabForm(QGroupBox):
    def __init__(self, parent=None):
        super().__init__("Experiment", parent)
        self.form = QFormLayout(self)
        self._engine_rows()
        model_row, draft_row = self._model_rows()
        methods = self._method_row()
        levels = self._level_row()
        self._prompt_row()
        drafting = self._run_rows()
        # The rows only this machine's models use, and the rows only servers use (QFormLayout finds a row by its field).
        self._local_rows = (model_row, draft_row, methods, levels, drafting, self.threads)
        self._server_rows = (self.servers_edit, self.clients_edit)
        self.engine.currentIndexChanged.connect(self._show_engine)
        self._show_engine()

    def _engine_rows(self) -> None:
        """Which engine is measured: this machine's models, or servers (their addresses, and how many clients)."""
        form = self.form
        self.engine = QComboBox()
        self.engine.addItem("This machine", THIS_MACHINE)
        self.engine.addItem("Servers (OpenAI-compatible)", SERVERS)
        self.engine.setToolTip(
            "Measure this machine's models, or servers that are already running (vLLM, "
            "llama-server, SpecChat elsewhere), each server being one method."
        )
        form.addRow("Engine", self.engine)
        self.servers_edit = QLineEdit()
        self.servers_edit.setPlaceholderText("none=http://gpu:8000, ngram=http://gpu:8001")
        self.servers_edit.setToolTip(
            "NAME=URL for each server, separated by commas. Name the plain one none= to get "
            "speed-ups and the crossover. Their API keys are the ones saved for chats."
        )
        form.addRow("Servers", self.servers_edit)
        self.clients_edit = QLineEdit("1,2,4,8,16,32,64,128,256")
        self.clients_edit.setToolTip("Concurrent clients per level, up to 1024.")
        form.addRow("Clients", self.clients_edit)

    def _model_rows(self) -> tuple[QHBoxLayout, QHBoxLayout]:
        """The target and the draft: the built-in models by their display names (the run gets their keys), or a
        typed or browsed GGUF path."""
        self.model_edit = QComboBox(editable=True)
        self.model_edit.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        for key, name in DISPLAY_NAMES.items():
            self.model_edit.addItem(name, key)
        self.model_edit.setCurrentIndex(self.model_edit.findData(EMBEDDED))
        self.model_edit.setToolTip("A built-in model, or the path of a GGUF file (Browse…).")
        model_row = self._with_browse(self.model_edit)
        self.form.addRow("Target model", model_row)
        self.draft_edit = QLineEdit()
        self.draft_edit.setPlaceholderText("none (needed for the draft model and auto)")
        self.draft_edit.textChanged.connect(self._draft_changed)
        draft_row = self._with_browse(self.draft_edit)
        self.form.addRow("Draft model", draft_row)
        return model_row, draft_row

    def _method_row(self) -> QGridLayout:
        self.method_boxes = {}
        methods = QGridLayout()  # three a row: the form stays narrow enough for the results table beside it
        for index, method in enumerate(METHODS):
            box = QCheckBox(BOX_WORDS[method])
            box.setToolTip(METHOD_WORDS[method][0].upper() + METHOD_WORDS[method][1:] + ".")
            box.setChecked(method in ("none", "lookup"))
            box.setEnabled(method not in DRAFT_METHODS)
            self.method_boxes[method] = box
            methods.addWidget(box, *divmod(index, 3))
        self.method_boxes["none"].setEnabled(False)  # the baseline every speed-up is measured against
        self.method_boxes["none"].setToolTip("Plain decoding is always run: it is the baseline.")
        self.form.addRow("Methods", methods)
        return methods

    def _level_row(self) -> QHBoxLayout:
        self.level_boxes = {}
        levels = QHBoxLayout()
        for level in LEVELS:
            box = QCheckBox(str(level))
            box.setChecked(level <= 8)
            self.level_boxes[level] = box
            levels.addWidget(box)
        self.form.addRow("Concurrency", levels)
        return levels

    def _prompt_row(self) -> None:
        self.prompt_combo = QComboBox()
        for key, label in PROMPT_SETS.items():
            self.prompt_combo.addItem(label, key)
        self.prompt_combo.addItem("Custom file…", CUSTOM)
        self.prompt_file = QLineEdit()
        self.prompt_file.setPlaceholderText('JSON lines of {"id", "prompt"}')
        self.prompt_file.setVisible(False)
        self.prompt_combo.currentIndexChanged.connect(
            lambda: self.prompt_file.setVisible(self.prompt_combo.currentData() == CUSTOM)
        )
        prompts = QVBoxLayout()
        prompts.addWidget(self.prompt_combo)
        prompts.addWidget(self.prompt_file)
        self.form.addRow("Prompts", prompts)

    def _run_rows(self) -> QHBoxLayout:
        """How each cell runs: tokens per request, draft length, threads, repeats. The draft length's row."""
        self.max_tokens = QSpinBox(minimum=4, maximum=2048, value=128)
        self.max_draft = QSpinBox(minimum=1, maximum=MAX_DRAFT_LIMIT, value=DEFAULT_MAX_DRAFT)  # the chat's default
        self.adaptive = QCheckBox("adaptive (as in the chat)")
        self.adaptive.setChecked(True)
        self.adaptive.setToolTip(
            "On: measured acceptance and step times pick each step's draft lengths.\n"
            "Off: every sequence always drafts up to the maximum — speculation itself."
        )
        self.threads = QSpinBox(minimum=0, maximum=256, value=0)
        self.threads.setSpecialValueText("auto")
        self.repeats = QSpinBox(minimum=1, maximum=20, value=1)
        self.repeats.setToolTip(
            "Runs per cell, methods alternating; the fastest is kept.\n"
            "Raise it when other programs keep the machine busy."
        )
        self.form.addRow("Tokens per request", self.max_tokens)
        drafting = QHBoxLayout()
        drafting.addWidget(self.max_draft)
        drafting.addWidget(self.adaptive)
        self.form.addRow("Max draft tokens", drafting)
        self.form.addRow("Threads", self.threads)
        self.form.addRow("Repeats", self.repeats)
        return drafting

    @property
    def remote(self) -> bool:
        return self.engine.currentData() == SERVERS

    def _show_engine(self, *_args) -> None:
        """Only the rows that mean something for the chosen engine."""
        for field in self._local_rows:
            self.form.setRowVisible(field, not self.remote)
        for field in self._server_rows:
            self.form.setRowVisible(field, self.remote)

    def _with_browse(self, edit: QComboBox | QLineEdit) -> QHBoxLayout:
        row = QHBoxLayout()
        row.addWidget(edit, 1)
        browse = QPushButton("Browse…")
        browse.clicked.connect(lambda: self._browse_gguf(edit))
        row.addWidget(browse)
        return row

    def _browse_gguf(self, edit: QComboBox | QLineEdit) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            (edit.setEditText if isinstance(edit, QComboBox) else edit.setText)(path)

    def model(self) -> str:
        """What the run loads: a built-in model's key ('embedded', 'embedded-gemma') or a GGUF path."""
        text = self.model_edit.currentText().strip()
        keys = {name: key for key, name in DISPLAY_NAMES.items()}
        return keys.get(text, text) or EMBEDDED

    def _draft_changed(self, text: str) -> None:
        """The methods that need a draft model come and go with it; auto, the chat's default with a draft, is
        ticked when a draft first appears."""
        had = self.method_boxes["auto"].isEnabled()
        for method in DRAFT_METHODS:
            box = self.method_boxes[method]
            box.setEnabled(bool(text.strip()))
            if not text.strip():
                box.setChecked(False)
        if text.strip() and not had:
            self.method_boxes["auto"].setChecked(True)

    def use_chat(self, chat) -> None:
        """Start on the chat's models and drafting (an app.lab.scope.ChatModels): its target, its draft, its method
        ticked beside plain decoding, its draft cap and adaptive mode."""
        self.engine.setCurrentIndex(self.engine.findData(THIS_MACHINE))
        index = self.model_edit.findData(chat.target)
        if index >= 0:
            self.model_edit.setCurrentIndex(index)
        else:
            self.model_edit.setEditText(str(chat.target))
        self.draft_edit.setText(str(chat.draft or ""))
        if chat.method in self.method_boxes and self.method_boxes[chat.method].isEnabled():
            self.method_boxes[chat.method].setChecked(True)
        if chat.max_draft:
            self.max_draft.setValue(chat.max_draft)
        if chat.adaptive is not None:
            self.adaptive.setChecked(chat.adaptive)

    def set_running(self, running: bool) -> None:
        """The models and servers cannot change under a run; the rest is read only when a run starts."""
        for w in (self.engine, self.model_edit, self.draft_edit, self.servers_edit):
            w.setEnabled(not running)

    def config(self) -> LabConfig | RemoteLabConfig:
        """The experiment as chosen; raises InvalidSettingError (an EngineError) when it cannot run."""
        key = self.prompt_combo.currentData()
        prompts = (
            self.prompt_file.text().strip() if key == CUSTOM else str(resources_dir() / "prompts" / f"{key}.jsonl")
        )
        if not prompts:
            raise InvalidSettingError("Choose a prompts file.")
        if self.remote:
            try:
                clients = _int_list(self.clients_edit.text())
            except ArgumentTypeError:
                raise InvalidSettingError(
                    f"Clients: numbers separated by commas, not “{self.clients_edit.text()}”."
                ) from None
            specs = [spec.strip() for spec in self.servers_edit.text().split(",") if spec.strip()]
            return RemoteLabConfig(
                prompts=prompts,
                servers=parse_servers(specs),
                concurrency=clients,
                max_tokens=self.max_tokens.value(),
                repeats=self.repeats.value(),
            )
        return LabConfig(
            prompts=prompts,
            model=self.model(),
            draft=self.draft_edit.text().strip() or None,
            methods=tuple(m for m, box in self.method_boxes.items() if box.isChecked()),
            concurrency=tuple(level for level, box in self.level_boxes.items() if box.isChecked()),
            max_tokens=self.max_tokens.value(),
            max_draft=self.max_draft.value(),
            adaptive=self.adaptive.isChecked(),
            threads=self.threads.value() or None,
            repeats=self.repeats.value(),
        )
