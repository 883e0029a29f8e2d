"""Compare plain vs speculation: one prompt decoded by the app's own engine in pairs of runs — plain, and with
the current speculation settings — measured like a benchmark (app/compare/series.py: at least three pairs, the order
alternating, more while they disagree), then a verdict (app/compare/words.py): at temperature 0, whether the texts
are the same, and the median speed-up with its range, or "noisy" when the pairs disagree or the machine is busy.

The runs are GenerationRequests sent one after the other to the engine's worker thread (each when the one before
has finished), so the window never waits and Cancel stops the run in progress within a step. A plain run swaps
speculation off for itself alone (GenerationRequest.plain).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.chat.session import storable
from app.compare.cpu_load import OthersMeter
from app.compare.pairs_table import PairsTable
from app.compare.pane import RunPane
from app.compare.series import MAX_PAIRS, MIN_PAIRS, PLAIN, SPECULATIVE, TIME_CAP_S, Run, Series
from app.compare.words import MIN_SPEED_TOKENS, noise_reasons, verdict
from app.settings.presets import Preset
from app.settings.values import METHOD_LABELS, AppSettings
from app.worker import EngineClient, GenerationRequest
from engine.decoding.sampling import SamplingParams

SAME_STYLE = "background: rgba(46, 125, 50, 40); border-radius: 4px; padding: 8px;"
DIFFERENT_STYLE = "background: rgba(255, 160, 0, 50); border-radius: 4px; padding: 8px;"
SAMPLED_STYLE = "background: rgba(127, 127, 127, 40); border-radius: 4px; padding: 8px;"
DEFAULT_TOKENS = 128  # twice MIN_SPEED_TOKENS: long enough to compare speeds, and six runs stay short


class CompareWindow(QWidget):
    """Ask once, get pairs of answers: plain and speculative, with measured figures and a verdict."""

    # {"same": bool | None, "verdict": str, "plain": stats, "speculative": stats (the pair shown), "pairs": [{"first",
    #  "plain", "speculative", "ratio", "others_share"}], "median", "low", "high", "noisy": bool, "others_share"}
    comparisonFinished = Signal(object)
    comparisonCancelled = Signal()
    comparisonFailed = Signal(str)

    def __init__(
        self,
        engine: EngineClient,
        settings: Callable[[], AppSettings],
        parent=None,
        *,
        chat_settings: Callable[[], Preset] | None = None,
    ):
        """settings: the app's (speculation); chat_settings: the open chat's system prompt and sampling
        (a Preset; the app's settings when not given)."""
        super().__init__(parent)
        self.setWindowFlag(Qt.WindowType.Window)
        self.setWindowTitle("Compare plain vs speculation")
        self.engine = engine
        self.settings = settings
        self.chat_settings = chat_settings or settings
        self.comparisons = 0  # how many were started
        self.series = Series()
        self.meter = OthersMeter()
        self._run = Run()
        self._kind = PLAIN
        self._request: GenerationRequest | None = None
        self._cancelled = False
        self._greedy = True
        self._sampling = SamplingParams(temperature=0.0)
        self._messages: list[dict] = []
        self._remote_note = ""
        self._build()
        w = engine.worker  # bound methods of this GUI-thread object: delivered on the GUI thread
        w.started.connect(self._on_started)
        w.progress.connect(self._on_progress)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        self._set_running(False)

    def _build(self) -> None:
        options = self._build_options()
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.plain_pane, self.spec_pane = RunPane(PLAIN), RunPane(SPECULATIVE)
        self.panes = {PLAIN: self.plain_pane, SPECULATIVE: self.spec_pane}
        sides = QHBoxLayout()
        sides.addWidget(self.plain_pane, 1)
        sides.addWidget(self.spec_pane, 1)
        self.pairs_table = PairsTable()
        self._build_verdict()
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Prompt"))
        layout.addWidget(self.prompt_edit)
        layout.addLayout(options)
        layout.addWidget(self.status)
        layout.addLayout(sides, 2)
        layout.addWidget(self.pairs_table, 1)
        layout.addWidget(self.verdict)
        self.resize(1100, 820)
        self._titles()
        self.status.setText(self._plan_words())

    def _build_options(self) -> QHBoxLayout:
        """The prompt, and the row under it: tokens per run, greedy, Run and Cancel."""
        self.prompt_edit = QPlainTextEdit()
        self.prompt_edit.setPlaceholderText(
            "A prompt to answer in pairs of runs. Prompt lookup pays where the answer "
            "repeats given text: copying, quoting, editing code, reformatting."
        )
        self.prompt_edit.setMaximumHeight(110)
        self.max_tokens = QSpinBox(minimum=1, maximum=8192, value=DEFAULT_TOKENS)
        self.max_tokens.setToolTip(
            f"The most tokens each run may write. Speeds are compared only when every run "
            f"writes at least {MIN_SPEED_TOKENS}."
        )
        self.greedy = QCheckBox("Greedy (temperature 0), so the texts can be compared")
        self.greedy.setChecked(True)
        self.greedy.setToolTip(
            "Off: both sides sample as this chat's settings say; the texts then differ "
            "by chance, and only the speeds compare."
        )
        self.run_button = QPushButton("Run pairs")
        self.run_button.setToolTip(
            f"At least {MIN_PAIRS} pairs of runs, plain and speculative, the order alternating; "
            f"more (up to {MAX_PAIRS}, none begun after {TIME_CAP_S:g} s) while they disagree."
        )
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        options = QHBoxLayout()
        options.addWidget(QLabel("Tokens per run"))
        options.addWidget(self.max_tokens)
        options.addWidget(self.greedy)
        options.addStretch(1)
        options.addWidget(self.run_button)
        options.addWidget(self.cancel_button)
        return options

    def _build_verdict(self) -> None:
        """The verdict under the pairs, in large type, shown once there is one."""
        self.verdict = QLabel("")
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.TextFormat.PlainText)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        font = self.verdict.font()
        font.setPointSizeF(font.pointSizeF() * 1.25)
        self.verdict.setFont(font)
        self.verdict.hide()

    # --- what is compared ---------------------------------------------------------------------
    def speculation_words(self) -> str:
        s = self.settings()
        if s.effective_method == "none":
            return "speculation off"
        words = METHOD_LABELS.get(s.method, s.method).lower()
        if s.method == "draft" and s.draft:
            words += f" ({Path(s.draft).name})"
        return f"{words}, up to {s.max_draft} draft tokens, {'adaptive' if s.adaptive else 'fixed'} length"

    def _titles(self, pair: int | None = None) -> None:
        for kind, pane in self.panes.items():
            name = "Plain decoding" if kind == PLAIN else f"Speculative: {self.speculation_words()}"
            pane.setTitle(f"{name}  ·  pair {pair}" if pair else name)

    @staticmethod
    def _plan_words() -> str:
        return (
            f"Runs at least {MIN_PAIRS} pairs, plain and speculative, the order alternating from pair to pair; "
            f"more while their ratios disagree (up to {MAX_PAIRS} pairs, none begun after {TIME_CAP_S:g} s)."
        )

    def showEvent(self, event) -> None:
        if not self.running and self.comparisons == 0:
            self._titles()  # the settings may have changed since the window was made
        super().showEvent(event)

    def set_prompt(self, text: str) -> None:
        if text.strip():
            self.prompt_edit.setPlainText(text)

    # --- running ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._request is not None

    def start(self) -> None:
        if self.running:
            return
        prompt = storable(self.prompt_edit.toPlainText()).strip()
        if not prompt:
            self.status.setText("Write a prompt first: every run answers it.")
            return
        if self.settings().effective_method == "none":
            self.status.setText(
                "Speculation is off in Model → Settings…: both sides would be plain decoding. "
                "Turn it on (prompt lookup or a draft model) to compare."
            )
            return
        chat = self.chat_settings()
        messages = [{"role": "user", "content": prompt}]
        if chat.system_prompt.strip():
            messages.insert(0, {"role": "system", "content": storable(chat.system_prompt.strip())})
        self._greedy = self.greedy.isChecked()
        sampling = chat.sampling()
        self._sampling = replace(sampling, temperature=0.0) if self._greedy else sampling
        self._messages = messages
        self.comparisons += 1
        self.series, self.meter = Series(), OthersMeter()
        self._cancelled = False
        # the chat's server cannot be told to skip its own speculation for one request
        self._remote_note = (
            (
                f" This chat is answered by {chat.engine_url}; Compare measures this machine's engine "
                "with the chat's prompt and sampling."
            )
            if chat.engine_url  # (a Preset's remote; the app's settings, the default chat_settings, have no remote)
            else ""
        )
        for pane in self.panes.values():
            pane.reset()
        self.pairs_table.show_pairs([])
        self.verdict.hide()
        self._set_running(True)
        self._send_next()

    def _send_next(self) -> None:
        kind = self.series.next_kind()
        if kind is None:
            self._conclude()
            return
        self._kind, self._run = kind, Run()
        pair = len(self.series.pairs)
        self._titles(pair)
        self.panes[kind].reset()
        self.pairs_table.show_pairs(self.series.pairs)
        what = "plain decoding" if kind == PLAIN else "speculative decoding"
        of = f"of at least {MIN_PAIRS}" if pair <= MIN_PAIRS else f"(more while the pairs disagree, up to {MAX_PAIRS})"
        self.status.setText(f"Pair {pair} {of}: {what}…{self._remote_note}")
        self.meter.start()
        self._request = self.engine.generate(
            GenerationRequest(
                messages=self._messages,
                sampling=self._sampling,
                max_tokens=self.max_tokens.value(),
                plain=kind == PLAIN,
            )
        )

    def cancel(self) -> None:
        if self._request is not None:
            self._cancelled = True
            self._request.cancel.set()
            self.status.setText("Cancelling…")

    def _set_running(self, running: bool) -> None:
        for w in (self.run_button, self.prompt_edit, self.max_tokens, self.greedy):
            w.setEnabled(not running)
        self.cancel_button.setEnabled(running)

    def _mine(self, rid: int) -> bool:
        return self._request is not None and rid == self._request.id

    @Slot(int)
    def _on_started(self, rid: int) -> None:
        if self._mine(rid):
            self.panes[self._kind].figures.setText("Processing the prompt…")

    @Slot(int, object, object)
    def _on_progress(self, rid: int, segments, stats) -> None:
        if self._mine(rid):
            pane = self.panes[self._kind]
            pane.add(segments)
            pane.show_stats(stats)

    @Slot(int, object)
    def _on_finished(self, rid: int, stats) -> None:
        if not self._mine(rid):
            return
        pane = self.panes[self._kind]
        pane.show_stats(stats)
        self._request = None
        share = self.meter.stop()
        if self._cancelled or stats.get("finish_reason") == "cancelled":
            self._end_cancelled()
            return
        self.series.record(self._kind, Run(list(pane.segments), dict(pane.stats), share))
        self.pairs_table.show_pairs(self.series.pairs)
        self._send_next()

    @Slot(int, str, object)
    def _on_failed(self, rid: int, message: str, stats) -> None:
        if not self._mine(rid):
            return
        self._request = None
        self.meter.stop()
        if stats:
            self.panes[self._kind].show_stats(stats)
        self._set_running(False)
        self.status.setText(f"The comparison stopped: {message}")
        self.comparisonFailed.emit(message)

    def _end_cancelled(self) -> None:
        self._set_running(False)
        done = len(self.series.done_pairs)
        self.status.setText(
            f"Cancelled after {done} complete pair{'s' * (done != 1)}: nothing was concluded. What "
            "each side wrote last is shown; Run pairs starts again."
        )
        self.comparisonCancelled.emit()

    def _conclude(self) -> None:
        self._set_running(False)
        series = self.series
        text, same = verdict(series, self._greedy, self._sampling.temperature, self.meter.share)
        # Show the first pair whose texts part (shaded from there), else the last pair, as it streamed.
        parted = next(((i, p) for i, p in enumerate(series.done_pairs, 1) if p.parted is not None), None)
        shown, pair = parted or (len(series.done_pairs), series.done_pairs[-1])
        cut = pair.parted if parted else None  # where the texts of the pair shown part
        for kind, pane in self.panes.items():
            if cut is not None:
                pane.show_run(pair.runs[kind].segments, pair.runs[kind].stats)
                pane.mark_from(cut[1])
        self._titles(shown)
        self.verdict.setText(text)
        self.verdict.setStyleSheet(SAMPLED_STYLE if same is None else SAME_STYLE if same else DIFFERENT_STYLE)
        self.verdict.show()
        self.status.setText(
            f"Done: {len(series.done_pairs)} pairs, the order alternating (plain ran first in odd "
            f"pairs). Shown: pair {shown}. tokens/s counts only the time after the first token."
            f"{self._remote_note}"
        )
        self.comparisonFinished.emit(self._result(text, same, pair))

    def _result(self, text: str, same: bool | None, shown) -> dict:
        series = self.series
        return {
            "same": same,
            "verdict": text,
            "plain": shown.runs[PLAIN].stats,
            "speculative": shown.runs[SPECULATIVE].stats,
            "pairs": [
                {
                    "first": p.first,
                    "plain": p.runs[PLAIN].stats,
                    "speculative": p.runs[SPECULATIVE].stats,
                    "ratio": p.ratio,
                    "others_share": p.others_share,
                }
                for p in series.done_pairs
            ],
            "median": series.median,
            "low": series.low,
            "high": series.high,
            "noisy": bool(noise_reasons(series, self.meter.share)),
            "others_share": self.meter.share,
        }

    def closeEvent(self, event) -> None:
        """Closing cancels a comparison in progress; the window can be opened and run again."""
        self.cancel()
        super().closeEvent(event)
