"""The Settings dialog: edits a copy of AppSettings and returns it only when it is valid.

Sampling and the system prompt are per chat (app/chat/settings_panel.py); the app settings' values
only seed the built-in Default preset. Every long explanation is a word-wrapped hint or a tooltip,
so the dialog fits its default width without scrolling sideways.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.settings.values import METHOD_LABELS, AppSettings
from engine.errors import InvalidSettingError
from engine.hardware import gpu_offload_supported
from engine.methods import DRAFT_METHODS, MAX_DRAFT_RANGE, MIN_DRAFT_RANGE, P_MIN_RANGE
from engine.modelfiles.embedded import DESCRIPTION, EMBEDDED, EMBEDDED_GEMMA

GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"
DEFAULT_SIZE = (560, 720)
FLASH_ATTENTION = {"automatic": None, "on": True, "off": False}  # the combo's labels and AppSettings' values
METHODS = ("auto", "draft", "lookup")  # "none" is the speculation check box, not a second way to say off
NO_GPU_BACKEND = "n/a: this llama.cpp build has no GPU backend"


def spin_box(lo: int, hi: int, tip: str) -> QSpinBox:
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setToolTip(tip)
    return s


def double_spin_box(lo: float, hi: float, step: float, decimals: int, tip: str) -> QDoubleSpinBox:
    s = QDoubleSpinBox()
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setDecimals(decimals)
    s.setToolTip(tip)
    return s


def hint(text: str) -> QLabel:
    """A word-wrapped explanation in the placeholder colour: it takes the width it is given."""
    label = QLabel(text)
    label.setWordWrap(True)
    label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
    return label


def form() -> QFormLayout:
    """A form whose long rows put the field under its label instead of widening the dialog."""
    f = QFormLayout()
    f.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
    f.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    return f


class ModelPicker(QWidget):
    """A GGUF path with Browse, plus 'embedded' (target) or none (draft)."""

    def __init__(self, allow_embedded: bool, parent=None):
        super().__init__(parent)
        self.allow_embedded = allow_embedded
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("embedded demo model" if allow_embedded else "none")
        self.edit.setClearButtonEnabled(True)
        self.edit.setMinimumWidth(120)
        self.browse = QPushButton("Browse…")
        self.browse.clicked.connect(self._browse)
        row.addWidget(self.edit, 1)
        row.addWidget(self.browse)

    def _browse(self) -> None:
        start = str(Path(self.edit.text()).expanduser().parent) if self.edit.text() else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model", start, GGUF_FILTER)
        if path:
            self.edit.setText(path)

    def value(self) -> str | None:
        text = self.edit.text().strip()
        if not text:
            return EMBEDDED if self.allow_embedded else None
        return text  # a path, or "embedded" (the demo model also serves as a draft, for trying things out)

    def set_value(self, value: str | None) -> None:
        self.edit.setText("" if value is None or (value == EMBEDDED and self.allow_embedded) else value)


# Settings this dialog does not show: Restore defaults keeps them (the window's layout, its theme, a folder).
NOT_SHOWN = ("window_geometry", "splitter_state", "theme", "last_folder")


class SettingsDialog(QDialog):
    scroll: QScrollArea  # type: ignore[assignment]  # an attribute that shadows QWidget.scroll(); the tests read it

    def __init__(self, settings: AppSettings, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.original = settings
        self.result_settings: AppSettings | None = None
        self._make_model_fields()
        self._make_speculation_fields()
        gpu_layers = self._make_runtime_fields()
        self._lay_out(self._groups(gpu_layers))
        self._connect()
        self.setMinimumWidth(420)
        self.resize(*DEFAULT_SIZE)
        self.load(settings)
        self._draft_before = self.draft.value()
        self.draft.edit.textChanged.connect(self._draft_chosen)

    def _make_model_fields(self) -> None:
        self.target = ModelPicker(True)
        self.target.setToolTip(f"Empty means the embedded model: {DESCRIPTION}")
        self.draft = ModelPicker(False)
        self.draft.setToolTip(
            "A small model with the same vocabulary as the target, used by the draft-model and auto methods."
        )

    def _make_speculation_fields(self) -> None:
        self.speculation = QCheckBox("Speed up responses with speculative decoding")
        self.method = QComboBox()
        for key in METHODS:
            self.method.addItem(METHOD_LABELS[key], key)
        self.max_draft = spin_box(*MAX_DRAFT_RANGE, "The most tokens drafted before the target model checks them.")
        self.min_draft = spin_box(*MIN_DRAFT_RANGE, "Shorter drafts are not worth checking: decode normally instead.")
        # two decimals, so the largest below P_MIN_RANGE's open end is 0.99
        self.p_min = double_spin_box(
            P_MIN_RANGE[0],
            P_MIN_RANGE[1] - 0.01,
            0.05,
            2,
            "Draft model stops drafting when its top token's probability falls below this.",
        )
        self.exact_greedy = QCheckBox("Exact greedy")
        self.exact_greedy.setToolTip(
            "At temperature 0, answers identical to plain decoding's. llama.cpp rounds a "
            "batch of rows differently from one row beyond some width, so at a near-tie greedy speculation can pick another token. This verifies only as "
            "many rows at once as this build computes bit for bit like one-row steps "
            "(measured per model): identical answers, less speed."
        )
        self.adaptive = QCheckBox("Adaptive draft length")
        self.adaptive.setToolTip(
            "The draft length follows what pays off (measured acceptance and step times), and "
            "speculation pauses while it would be slower than plain decoding."
        )

    def _make_runtime_fields(self) -> QWidget:
        """The runtime fields; returns the GPU layers row (the spin box, or why there is none)."""
        self.n_ctx = spin_box(
            0,
            1 << 20,
            "Tokens the model can see at once (prompt + answer). "
            "0 uses the model's own. Changing it reloads the model.",
        )
        self.n_ctx.setSingleStep(1024)
        self.n_gpu_layers = spin_box(-1, 1000, "-1 offloads every layer the GPU build can; 0 runs on the CPU.")
        self.threads = spin_box(0, 512, "0 uses the physical cores.")
        self.threads.setSpecialValueText("automatic")
        self.n_gpu_layers.setSpecialValueText("all")
        # A CPU-only build ignores GPU layers: say so, and keep the saved value (hidden) for a GPU build.
        self.no_gpu_backend = hint(NO_GPU_BACKEND)
        self.no_gpu_backend.setToolTip(
            "Models run on the CPU. A llama.cpp build with CUDA, Metal or Vulkan can "
            "offload layers to a GPU; the saved GPU layers value is kept for it."
        )
        gpu_layers = QWidget()
        gpu_row = QHBoxLayout(gpu_layers)
        gpu_row.setContentsMargins(0, 0, 0, 0)
        gpu_row.addWidget(self.n_gpu_layers, 1)
        gpu_row.addWidget(self.no_gpu_backend, 1)
        has_gpu_backend = gpu_offload_supported()
        self.n_gpu_layers.setVisible(has_gpu_backend)
        self.n_gpu_layers.setEnabled(has_gpu_backend)
        self.no_gpu_backend.setVisible(not has_gpu_backend)
        self.flash_attention = QComboBox()
        for label in FLASH_ATTENTION:
            self.flash_attention.addItem(label)
        self.flash_attention.setToolTip(
            "Automatic: llama.cpp's choice. Off can be much faster on a CPU as the context "
            "grows, but greedy answers with speculation then part from plain decoding's "
            "at near-ties more often."
        )
        return gpu_layers

    def _groups(self, gpu_layers: QWidget) -> list[tuple[str, QFormLayout]]:
        models = form()
        models.addRow("Target model", self.target)
        models.addRow("Draft model", self.draft)
        models.addRow(hint("Draft and target must share a vocabulary: Model → Models… offers pairs."))
        spec = form()
        spec.addRow(self.speculation)
        spec.addRow(
            hint(
                "The target model checks every drafted token, so answers follow it as without speculation "
                "(a greedy answer may part where two tokens nearly tie)."
            )
        )
        spec.addRow("Method", self.method)
        spec.addRow("Max draft tokens", self.max_draft)
        spec.addRow("Min draft tokens", self.min_draft)
        spec.addRow("Draft confidence cutoff", self.p_min)
        checks = QHBoxLayout()  # one row for both: the dialog fits its default size without scrolling
        checks.addWidget(self.adaptive)
        checks.addWidget(self.exact_greedy)
        checks.addStretch(1)
        spec.addRow(checks)
        sampling = form()
        sampling.addRow(
            hint(
                "Temperature, the system prompt and the other sampling values are set per chat: "
                "the Preset button under the conversation (File → Chat settings…) picks a preset "
                "and changes it for that chat. New chats start from the default preset."
            )
        )
        runtime = form()
        runtime.addRow("Context size", self.n_ctx)
        runtime.addRow("GPU layers", gpu_layers)
        runtime.addRow("Threads", self.threads)
        runtime.addRow("Flash attention", self.flash_attention)
        return [
            ("Models", models),
            ("Speculative decoding", spec),
            ("Sampling", sampling),
            ("Runtime (changes reload the model)", runtime),
        ]

    def _lay_out(self, groups: list[tuple[str, QFormLayout]]) -> None:
        body = QWidget()
        column = QVBoxLayout(body)
        for title, rows in groups:
            box = QGroupBox(title)
            box.setLayout(rows)
            column.addWidget(box)
        column.addStretch(1)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setWidget(body)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c62828;")
        self.error.hide()
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok
            | QDialogButtonBox.StandardButton.Cancel
            | QDialogButtonBox.StandardButton.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(
            lambda: self.load(replace(AppSettings(), **{k: getattr(self.original, k) for k in NOT_SHOWN}))
        )
        layout = QVBoxLayout(self)
        layout.addWidget(self.scroll, 1)
        layout.addWidget(self.error)
        layout.addWidget(buttons)

    def _connect(self) -> None:
        self.speculation.toggled.connect(self._enable)
        self.method.currentIndexChanged.connect(self._enable)
        for changed in (
            self.target.edit.textChanged,
            self.draft.edit.textChanged,
            self.speculation.toggled,
            self.method.currentIndexChanged,
            self.max_draft.valueChanged,
            self.min_draft.valueChanged,
            self.p_min.valueChanged,
            self.adaptive.toggled,
            self.exact_greedy.toggled,
            self.n_ctx.valueChanged,
            self.n_gpu_layers.valueChanged,
            self.threads.valueChanged,
            self.flash_attention.currentIndexChanged,
        ):
            changed.connect(self._recheck)

    def _enable(self) -> None:
        on = self.speculation.isChecked()
        for w in (self.method, self.max_draft, self.min_draft, self.adaptive, self.exact_greedy):
            w.setEnabled(on)
        self.p_min.setEnabled(on and self.method.currentData() in DRAFT_METHODS)

    def _uses_draft_model(self) -> bool:
        return self.speculation.isChecked() and self.method.currentData() in DRAFT_METHODS

    def _draft_chosen(self, text: str) -> None:
        """A draft chosen where there was none: auto is then the method (lookup's copies and the draft's
        guesses, each where it pays), as a pair from the Models window gets."""
        if text and not self._draft_before and self.method.currentData() == "lookup":
            self.method.setCurrentIndex(self.method.findData("auto"))
        self._draft_before = text

    def _recheck(self) -> None:
        """A shown error goes as soon as what it was about is fixed, or no longer used."""
        if self.error.isHidden():
            return
        try:
            self.collect()
        except InvalidSettingError as exc:
            self.error.setText(str(exc))
        else:
            self.error.hide()

    def load(self, s: AppSettings) -> None:
        self.target.set_value(s.model)
        self.draft.set_value(s.draft)
        # Method "none" (an older file's "Off", or the lab's advice) is speculation off; the combo then
        # shows the default method, the one a person gets by ticking the box.
        self.speculation.setChecked(s.effective_method != "none")
        method = self.method.findData(s.method)
        self.method.setCurrentIndex(method if method >= 0 else self.method.findData(AppSettings.method))
        self.max_draft.setValue(s.max_draft)
        self.min_draft.setValue(s.min_draft)
        self.p_min.setValue(s.p_min)
        self.adaptive.setChecked(s.adaptive)
        self.exact_greedy.setChecked(s.exact_greedy)
        self.n_ctx.setValue(s.n_ctx)
        self.n_gpu_layers.setValue(s.n_gpu_layers)
        self.threads.setValue(s.threads or 0)
        self.flash_attention.setCurrentIndex(list(FLASH_ATTENTION.values()).index(s.flash_attention))
        self._enable()

    def collect(self) -> AppSettings:
        """The settings the dialog shows; raises InvalidSettingError with a message for a person."""
        target = self.target.value()
        assert target is not None  # the target's picker allows the embedded model: it answers that when empty
        checked: list[tuple[str, str | None]] = [("target", target)]
        if self._uses_draft_model():  # a draft path kept for later is not an error while another method runs
            checked.append(("draft", self.draft.value()))
        for label, path in checked:
            if path not in (None, EMBEDDED, EMBEDDED_GEMMA) and not Path(path).expanduser().is_file():
                raise InvalidSettingError(f"The {label} model file does not exist: {path}")
        return replace(
            self.original,
            model=target,
            draft=self.draft.value(),
            speculation=self.speculation.isChecked(),
            method=self.method.currentData(),
            max_draft=self.max_draft.value(),
            min_draft=self.min_draft.value(),
            p_min=round(self.p_min.value(), 4),
            adaptive=self.adaptive.isChecked(),
            exact_greedy=self.exact_greedy.isChecked(),
            n_ctx=self.n_ctx.value(),
            n_gpu_layers=self.n_gpu_layers.value(),
            threads=self.threads.value() or None,
            flash_attention=FLASH_ATTENTION[self.flash_attention.currentText()],
        ).validated()

    def accept(self) -> None:
        try:
            self.result_settings = self.collect()
        except InvalidSettingError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        super().accept()
