"""Compare plain vs speculation: one prompt decoded twice by the app's own engine — plain, and with
the current speculation settings — side by side with measured figures, then a verdict: at
temperature 0, whether the two texts are the same, and how much faster speculation was.

The two runs are GenerationRequests sent one after the other to the engine's worker thread (the
second when the first has finished), so the window never waits and Cancel stops the run in progress
within a step. The plain run swaps speculation off for itself alone (GenerationRequest.plain). The
order alternates from one comparison to the next; whichever runs second finds the prompt already
processed, so its time to first token is the smaller one, and the window says which ran first.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QCheckBox, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSpinBox,
                               QTextEdit, QVBoxLayout, QWidget)

from engine.decoding.sampling import SamplingParams

from app.chat.session import storable
from app.settings.presets import Preset
from app.chat.render import DRAFT_COLOR
from app.settings.values import METHOD_LABELS, AppSettings
from app.chat.stats_view import stat_items
from app.worker import EngineClient, GenerationRequest

PLAIN, SPECULATIVE = "plain", "speculative"
DIFFERENCE_COLOR = QColor(198, 40, 40, 60)  # translucent red: readable on light and dark themes
SAME_STYLE = "background: rgba(46, 125, 50, 40); border-radius: 4px; padding: 8px;"
DIFFERENT_STYLE = "background: rgba(255, 160, 0, 50); border-radius: 4px; padding: 8px;"
SAMPLED_STYLE = "background: rgba(127, 127, 127, 40); border-radius: 4px; padding: 8px;"
SAME_SPEED = 0.05  # within 5% the two speeds are called the same
LITTLE_GAIN = 1.1  # fewer tokens per target step than this: speculation cannot be what made it faster
DEFAULT_TOKENS = 256
# Fewer tokens than this on either side and the ratio is shown without a speed claim. tokens/s counts only the
# time after the first token: plain decoding's 10-token answer is 9 timed steps, and one step slowed to double
# (another program on the cores) moves its rate by ~10%, twice SAME_SPEED. At 64 tokens such a step moves it
# by under 2%. A quarter of DEFAULT_TOKENS, so the default run is long enough unless the answer ends early.
MIN_SPEED_TOKENS = 64


def first_difference(a: list[tuple[str, bool]], b: list[tuple[str, bool]]) -> tuple[int, int] | None:
    """Where two streamed texts part: (token index in a, character offset), or None if they are equal.
    Segments are the engine's (text, from_draft) pairs, one per token (text held back while it might
    begin a stop string arrives joined, so the index can be a token early there)."""
    text_a, text_b = "".join(t for t, _ in a), "".join(t for t, _ in b)
    if text_a == text_b:
        return None
    chars = next((i for i, (x, y) in enumerate(zip(text_a, text_b)) if x != y), min(len(text_a), len(text_b)))
    token, end = 0, 0
    for text, _ in a:
        end += len(text)
        if end > chars:
            break
        token += 1
    return token, chars


def speed_ratio(plain: dict, speculative: dict) -> float | None:
    p, s = plain.get("tokens_per_s"), speculative.get("tokens_per_s")
    return s / p if p and s else None


def speed_words(ratio: float | None, tokens: int | None = None) -> str:
    """The speed comparison in words; tokens: the fewer either run generated (None: not known)."""
    if ratio is None:
        return "too few tokens to measure the speed"
    if tokens is not None and tokens < MIN_SPEED_TOKENS:
        return (f"{ratio:.2f}× plain decoding's tokens/s over only {tokens} tokens, too short a run to compare "
                f"speed (that takes {MIN_SPEED_TOKENS} or more per run: raise “Tokens per run”, or ask for a longer "
                "answer)")
    if abs(ratio - 1) < SAME_SPEED:
        return f"at the same speed ({ratio:.2f}×)"
    if ratio > 1:
        return f"{ratio:.1f}× faster"
    return f"but {ratio:.2f}× the speed: plain decoding was faster for this prompt"


def verdict(plain: RunPane, speculative: RunPane, greedy: bool, temperature: float) -> tuple[str, bool | None]:
    """(what the comparison showed, in words; whether the texts are the same, None when sampled)."""
    spec = speculative.stats
    shortest = min(plain.stats.get("generated") or 0, spec.get("generated") or 0)
    speed = speed_words(speed_ratio(plain.stats, spec), shortest)
    note = ""
    if spec.get("method", "none") == "none":
        note = " Speculation was not available for this model (see the notices in the chat window), so both runs " \
               "decoded plainly."
    elif not spec.get("drafted"):
        note = " Nothing was drafted (no text to copy, or the adaptive length measured plain decoding as faster), " \
               "so both runs decoded plainly: the speeds differ by how busy the machine was."
    elif (spec.get("mean_acceptance_length") or 1.0) < LITTLE_GAIN:
        note = (f" Speculation gained little here ({spec['mean_acceptance_length']:.2f} tokens per target step), so "
                "the difference in speed is mostly not its doing.")
    if not greedy:
        return (f"Sampled at temperature {temperature:g}: the two texts are separate samples, not expected to match "
                f"(tick “Greedy” to compare texts). Speculative was {speed}.{note}"), None
    parted = first_difference(plain.segments, speculative.segments)
    if parted is None:
        return f"Same answer, {speed}.{note}", True
    return (f"The texts differ from token {parted[0] + 1}: near-ties in the model's arithmetic (verifying drafts "
            "in one batch rounds slightly differently from decoding one token at a time), see README, "
            f"“Compare plain vs speculation”. Speculative was {speed}.{note}"), False


class RunPane(QGroupBox):
    """One side: the streamed text, its tokens/s in large type, and the other measured figures."""

    def __init__(self, kind: str, parent=None):
        super().__init__(parent)
        self.kind = kind
        self.segments: list[tuple[str, bool]] = []
        self.stats: dict = {}
        self.second = False  # ran after the other side, so its prompt was already processed
        self.text = QPlainTextEdit(readOnly=True)
        self.speed = QLabel("–")  # before a run too: the space above the text is not left blank
        font = self.speed.font()
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        self.speed.setFont(font)
        self.figures = QLabel("Not run yet.")
        self.figures.setWordWrap(True)
        self.figures.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.legend = QLabel("Shaded: tokens that came from accepted drafts." if kind == SPECULATIVE else "")
        self.legend.setVisible(kind == SPECULATIVE)
        layout = QVBoxLayout(self)
        layout.addWidget(self.speed)
        layout.addWidget(self.figures)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.legend)

    def reset(self, second: bool) -> None:
        self.segments, self.stats, self.second = [], {}, second
        self.text.clear()
        self.text.setExtraSelections([])
        self.speed.setText("–")
        self.figures.setText("Waiting for the other run…" if second else "Waiting for the engine…")

    def add(self, segments: list[tuple[str, bool]]) -> None:
        self.segments += segments
        cursor = self.text.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for text, from_draft in segments:
            fmt = QTextCharFormat()
            if from_draft and self.kind == SPECULATIVE:
                fmt.setBackground(DRAFT_COLOR)
            cursor.insertText(text, fmt)

    def show_stats(self, stats: dict) -> None:
        self.stats = stats or {}
        items = {key: text for key, text, _ in stat_items({**self.stats, "memory_label": ""})}
        self.speed.setText(items["speed"])
        ttft = items["ttft"]
        if self.second and self.stats.get("prompt_tokens") and \
                self.stats.get("reused_prompt_tokens") == self.stats.get("prompt_tokens"):
            ttft += " (prompt already processed by the first run)"
        parts = [ttft, f"{self.stats.get('generated', 0)} tokens"]
        if self.kind == SPECULATIVE:
            parts += [items.get("acceptance", "accepted n/a"), items.get("mean_length", "n/a tok/step")]
            if self.stats.get("speculation_paused"):
                parts.append("drafting paused (plain decoding predicted faster)")
        if items.get("finish"):
            parts.append(items["finish"])
        self.figures.setText("  ·  ".join(parts))

    def plain_text(self) -> str:
        return "".join(t for t, _ in self.segments)

    def mark_from(self, chars: int) -> None:
        """Shade the text from this character on, where the two sides part."""
        utf16 = len(self.plain_text()[:chars].encode("utf-16-le")) // 2  # Qt counts UTF-16 units
        selection = QTextEdit.ExtraSelection()
        selection.format.setBackground(DIFFERENCE_COLOR)
        cursor = QTextCursor(self.text.document())
        cursor.setPosition(min(utf16, self.text.document().characterCount() - 1))
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        selection.cursor = cursor
        self.text.setExtraSelections([selection])


class CompareWindow(QWidget):
    """Ask once, get two answers: plain and speculative, with measured figures and a verdict."""

    comparisonFinished = Signal(object)  # {"same": bool | None, "verdict": str, "plain": stats, "speculative": stats}
    comparisonCancelled = Signal()
    comparisonFailed = Signal(str)

    def __init__(self, engine: EngineClient, settings: Callable[[], AppSettings], parent=None, *,
                 chat_settings: Callable[[], Preset] | None = None):
        """settings: the app's (speculation); chat_settings: the open chat's system prompt and sampling
        (a Preset; the app's settings when not given)."""
        super().__init__(parent)
        self.setWindowFlag(Qt.WindowType.Window)
        self.setWindowTitle("Compare plain vs speculation")
        self.engine = engine
        self.settings = settings
        self.chat_settings = chat_settings or settings
        self.comparisons = 0  # how many were started: the order alternates with it
        self._queue: list[str] = []  # the runs still to send, in order
        self._request: GenerationRequest | None = None
        self._cancelled = False
        self._greedy = True
        self._sampling = SamplingParams(temperature=0.0)
        self._messages: list[dict] = []
        self._build()
        w = engine.worker  # bound methods of this GUI-thread object: delivered on the GUI thread
        w.started.connect(self._on_started)
        w.progress.connect(self._on_progress)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        self._set_running(False)

    def _build(self) -> None:
        self.prompt_edit = QPlainTextEdit()
        self.prompt_edit.setPlaceholderText("A prompt to answer twice. Prompt lookup pays where the answer repeats "
                                            "given text: copying, quoting, editing code, reformatting.")
        self.prompt_edit.setMaximumHeight(110)
        self.max_tokens = QSpinBox(minimum=1, maximum=8192, value=DEFAULT_TOKENS)
        self.max_tokens.setToolTip(f"The most tokens each run may write. Speeds are compared only when both runs "
                                   f"write at least {MIN_SPEED_TOKENS}.")
        self.greedy = QCheckBox("Greedy (temperature 0), so the texts can be compared")
        self.greedy.setChecked(True)
        self.greedy.setToolTip("Off: both runs sample as this chat's settings say; the texts then differ "
                               "by chance, and only the speeds compare.")
        self.run_button = QPushButton("Run both")
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
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.plain_pane, self.spec_pane = RunPane(PLAIN), RunPane(SPECULATIVE)
        self.panes = {PLAIN: self.plain_pane, SPECULATIVE: self.spec_pane}
        sides = QHBoxLayout()
        sides.addWidget(self.plain_pane, 1)
        sides.addWidget(self.spec_pane, 1)
        self.verdict = QLabel("")
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        font = self.verdict.font()
        font.setPointSizeF(font.pointSizeF() * 1.25)
        self.verdict.setFont(font)
        self.verdict.hide()
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Prompt"))
        layout.addWidget(self.prompt_edit)
        layout.addLayout(options)
        layout.addWidget(self.status)
        layout.addLayout(sides, 1)
        layout.addWidget(self.verdict)
        self.resize(1100, 720)
        self._titles(first=PLAIN)

    # --- what is compared ---------------------------------------------------------------------
    def speculation_words(self) -> str:
        s = self.settings()
        if s.effective_method == "none":
            return "speculation off"
        words = METHOD_LABELS.get(s.method, s.method).lower()
        if s.method == "draft" and s.draft:
            words += f" ({Path(s.draft).name})"
        return f"{words}, up to {s.max_draft} draft tokens, {'adaptive' if s.adaptive else 'fixed'} length"

    def _titles(self, first: str) -> None:
        for kind, pane in self.panes.items():
            name = "Plain decoding" if kind == PLAIN else f"Speculative: {self.speculation_words()}"
            pane.setTitle(f"{name}  ·  runs {'first' if kind == first else 'second'}")
        self.status.setText(f"Runs {self._order_words(first)}. The order alternates from one comparison to the next.")

    def showEvent(self, event) -> None:
        if not self.running and self.comparisons == 0:
            self._titles(PLAIN)  # the settings may have changed since the window was made
        super().showEvent(event)

    @staticmethod
    def _order_words(first: str) -> str:
        return "plain decoding first, then speculative" if first == PLAIN else "speculative first, then plain decoding"

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
            self.status.setText("Write a prompt first: both runs answer it.")
            return
        settings = self.settings()
        if settings.effective_method == "none":
            self.status.setText("Speculation is off in Model → Settings…: both runs would be plain decoding. "
                                "Turn it on (prompt lookup or a draft model) to compare.")
            return
        chat = self.chat_settings()
        messages = [{"role": "user", "content": prompt}]
        if chat.system_prompt.strip():
            messages.insert(0, {"role": "system", "content": storable(chat.system_prompt.strip())})
        self._greedy = self.greedy.isChecked()
        sampling = chat.sampling()
        self._sampling = replace(sampling, temperature=0.0) if self._greedy else sampling
        self._messages = messages
        first = PLAIN if self.comparisons % 2 == 0 else SPECULATIVE
        self.comparisons += 1
        self._queue = [first, SPECULATIVE if first == PLAIN else PLAIN]
        self._cancelled = False
        self._titles(first)
        if chat.remote:  # the chat's server cannot be told to skip its own speculation for one request
            self.status.setText(f"{self.status.text()} This chat is answered by {chat.engine_url}; Compare measures "
                                "this machine's engine with the chat's prompt and sampling.")
        for kind, pane in self.panes.items():
            pane.reset(second=kind != first)
        self.verdict.hide()
        self._set_running(True)
        self._send_next()

    def _send_next(self) -> None:
        kind = self._queue.pop(0)
        self._kind = kind
        self._request = self.engine.generate(GenerationRequest(
            messages=self._messages, sampling=self._sampling, max_tokens=self.max_tokens.value(),
            plain=kind == PLAIN))
        if self.panes[kind].second:
            self.panes[kind].figures.setText("Waiting for the engine…")

    def cancel(self) -> None:
        if self._request is not None:
            self._cancelled = True
            self._queue.clear()
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
            step = 1 if self._queue else 2
            what = "plain decoding" if self._kind == PLAIN else "speculative decoding"
            self.status.setText(f"Run {step} of 2: {what}…")
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
        self.panes[self._kind].show_stats(stats)
        self._request = None
        if self._cancelled or stats.get("finish_reason") == "cancelled":
            self._end_cancelled()
        elif self._queue:
            self._send_next()
        else:
            self._conclude()

    @Slot(int, str, object)
    def _on_failed(self, rid: int, message: str, stats) -> None:
        if not self._mine(rid):
            return
        self._request, self._queue = None, []
        if stats:
            self.panes[self._kind].show_stats(stats)
        self._set_running(False)
        self.status.setText(f"The comparison stopped: {message}")
        self.comparisonFailed.emit(message)

    def _end_cancelled(self) -> None:
        self._queue = []
        self._set_running(False)
        self.status.setText("Cancelled: nothing was compared. What each side wrote so far is shown; "
                            "Run both starts again.")
        self.comparisonCancelled.emit()

    def _conclude(self) -> None:
        self._set_running(False)
        first = PLAIN if not self.plain_pane.second else SPECULATIVE
        text, same = verdict(self.plain_pane, self.spec_pane, self._greedy, self._sampling.temperature)
        if same is False:
            parted = first_difference(self.plain_pane.segments, self.spec_pane.segments)
            for pane in self.panes.values():
                pane.mark_from(parted[1])
        self.verdict.setText(text)
        self.verdict.setStyleSheet({True: SAME_STYLE, False: DIFFERENT_STYLE}.get(same, SAMPLED_STYLE))
        self.verdict.show()
        self.status.setText(f"Done: {self._order_words(first)}. The second run found the prompt already "
                            "processed, so its time to first token is the lower one; tokens/s counts only "
                            "the time after the first token.")
        self.comparisonFinished.emit({"same": same, "verdict": text,
                                      "plain": self.plain_pane.stats, "speculative": self.spec_pane.stats})

    def closeEvent(self, event) -> None:
        """Closing cancels a comparison in progress; the window can be opened and run again."""
        self.cancel()
        super().closeEvent(event)
