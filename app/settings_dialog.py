"""The Settings dialog: edits a copy of AppSettings and returns it only when it is valid."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog,
                               QFormLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from engine.embedded import DESCRIPTION, EMBEDDED
from engine.errors import InvalidSettingError

from .settings import METHOD_LABELS, AppSettings

GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"


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
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row.addWidget(self.edit, 1)
        row.addWidget(browse)

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


class SettingsDialog(QDialog):
    def __init__(self, settings: AppSettings, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.original = settings
        self.result_settings: AppSettings | None = None

        self.target = ModelPicker(True)
        self.target.setToolTip(f"Empty means the embedded model: {DESCRIPTION}")
        self.draft = ModelPicker(False)
        self.draft.setToolTip("A small model with the same vocabulary as the target, used by the draft-model method.")
        self.speculation = QCheckBox("Speed up responses with speculative decoding (output is unchanged)")
        self.method = QComboBox()
        for key in ("draft", "lookup", "none"):
            self.method.addItem(METHOD_LABELS[key], key)
        self.max_draft = self._spin(0, 64, "The most tokens drafted before the target model checks them.")
        self.min_draft = self._spin(1, 64, "Shorter drafts are not worth checking: decode normally instead.")
        self.p_min = self._dspin(0.0, 0.99, 0.05, 2, "Draft model stops drafting when its top token's "
                                                      "probability falls below this.")
        self.adaptive = QCheckBox("Adapt the draft length to what pays off (pauses speculation when it would be slower)")
        self.temperature = self._dspin(0.0, 5.0, 0.05, 2, "0 always picks the most likely token.")
        self.top_k = self._spin(0, 100000, "0 turns top-k off.")
        self.top_p = self._dspin(0.01, 1.0, 0.01, 2, "1.00 turns top-p off.")
        self.min_p = self._dspin(0.0, 0.99, 0.01, 2, "0.00 turns min-p off.")
        self.seed = QLineEdit()
        self.seed.setPlaceholderText("random")
        self.seed.setToolTip("A whole number makes sampling repeatable; empty picks a new seed each time.")
        self.max_tokens = self._spin(1, 131072, "The longest response, in tokens.")
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Optional instructions the model sees before the conversation")
        self.system_prompt.setFixedHeight(70)
        self.n_ctx = self._spin(0, 1 << 20, "Tokens the model can see at once (prompt + answer). "
                                            "0 uses the model's own. Changing it reloads the model.")
        self.n_ctx.setSingleStep(1024)
        self.n_gpu_layers = self._spin(-1, 1000, "-1 offloads every layer the GPU build can; 0 runs on the CPU.")
        self.threads = self._spin(0, 512, "0 uses the physical cores.")
        self.threads.setSpecialValueText("automatic")
        self.n_gpu_layers.setSpecialValueText("all")

        models = QFormLayout()
        models.addRow("Target model", self.target)
        models.addRow("Draft model", self.draft)
        spec = QFormLayout()
        spec.addRow(self.speculation)
        spec.addRow("Method", self.method)
        spec.addRow("Max draft tokens", self.max_draft)
        spec.addRow("Min draft tokens", self.min_draft)
        spec.addRow("Draft confidence cutoff", self.p_min)
        spec.addRow(self.adaptive)
        sampling = QFormLayout()
        sampling.addRow("Temperature", self.temperature)
        sampling.addRow("Top-k", self.top_k)
        sampling.addRow("Top-p", self.top_p)
        sampling.addRow("Min-p", self.min_p)
        sampling.addRow("Seed", self.seed)
        sampling.addRow("Max response tokens", self.max_tokens)
        sampling.addRow("System prompt", self.system_prompt)
        runtime = QFormLayout()
        runtime.addRow("Context size", self.n_ctx)
        runtime.addRow("GPU layers", self.n_gpu_layers)
        runtime.addRow("Threads", self.threads)

        body = QWidget()
        column = QVBoxLayout(body)
        for title, form in (("Models", models), ("Speculative decoding", spec), ("Sampling", sampling),
                            ("Runtime (changes reload the model)", runtime)):
            box = QGroupBox(title)
            box.setLayout(form)
            column.addWidget(box)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(body)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c62828;")
        self.error.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
                                   | QDialogButtonBox.StandardButton.RestoreDefaults)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults).clicked.connect(
            lambda: self.load(replace(AppSettings(), window_geometry=self.original.window_geometry,
                                      splitter_state=self.original.splitter_state)))
        layout = QVBoxLayout(self)
        layout.addWidget(scroll, 1)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.speculation.toggled.connect(self._enable)
        self.method.currentIndexChanged.connect(self._enable)
        self.resize(560, 720)
        self.load(settings)

    def _spin(self, lo: int, hi: int, tip: str) -> QSpinBox:
        s = QSpinBox()
        s.setRange(lo, hi)
        s.setToolTip(tip)
        return s

    def _dspin(self, lo: float, hi: float, step: float, decimals: int, tip: str) -> QDoubleSpinBox:
        s = QDoubleSpinBox()
        s.setRange(lo, hi)
        s.setSingleStep(step)
        s.setDecimals(decimals)
        s.setToolTip(tip)
        return s

    def _enable(self) -> None:
        on = self.speculation.isChecked() and self.method.currentData() != "none"
        for w in (self.method,):
            w.setEnabled(self.speculation.isChecked())
        for w in (self.max_draft, self.min_draft, self.adaptive):
            w.setEnabled(on)
        self.p_min.setEnabled(on and self.method.currentData() == "draft")

    def load(self, s: AppSettings) -> None:
        self.target.set_value(s.model)
        self.draft.set_value(s.draft)
        self.speculation.setChecked(s.speculation)
        self.method.setCurrentIndex(max(self.method.findData(s.method), 0))
        self.max_draft.setValue(s.max_draft)
        self.min_draft.setValue(s.min_draft)
        self.p_min.setValue(s.p_min)
        self.adaptive.setChecked(s.adaptive)
        self.temperature.setValue(s.temperature)
        self.top_k.setValue(s.top_k)
        self.top_p.setValue(s.top_p)
        self.min_p.setValue(s.min_p)
        self.seed.setText("" if s.seed is None else str(s.seed))
        self.max_tokens.setValue(s.max_tokens)
        self.system_prompt.setPlainText(s.system_prompt)
        self.n_ctx.setValue(s.n_ctx)
        self.n_gpu_layers.setValue(s.n_gpu_layers)
        self.threads.setValue(s.threads or 0)
        self._enable()

    def collect(self) -> AppSettings:
        """The settings the dialog shows; raises InvalidSettingError with a message for a person."""
        seed_text = self.seed.text().strip()
        try:
            seed = int(seed_text) if seed_text else None
        except ValueError:
            raise InvalidSettingError(f"The seed must be a whole number or empty, not “{seed_text}”.") from None
        for label, path in (("target", self.target.value()), ("draft", self.draft.value())):
            if path not in (None, EMBEDDED) and not Path(path).expanduser().is_file():
                raise InvalidSettingError(f"The {label} model file does not exist: {path}")
        return replace(
            self.original, model=self.target.value(), draft=self.draft.value(),
            speculation=self.speculation.isChecked(), method=self.method.currentData(),
            max_draft=self.max_draft.value(), min_draft=self.min_draft.value(), p_min=round(self.p_min.value(), 4),
            adaptive=self.adaptive.isChecked(), temperature=round(self.temperature.value(), 4),
            top_k=self.top_k.value(), top_p=round(self.top_p.value(), 4), min_p=round(self.min_p.value(), 4),
            seed=seed, max_tokens=self.max_tokens.value(), system_prompt=self.system_prompt.toPlainText(),
            n_ctx=self.n_ctx.value(), n_gpu_layers=self.n_gpu_layers.value(), threads=self.threads.value() or None,
        ).validated()

    def accept(self) -> None:
        try:
            self.result_settings = self.collect()
        except InvalidSettingError as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        super().accept()
