"""The "Get a pair" tab: the catalog's model pairs, what each holds, and downloading one (target and
draft as one job) with a progress bar per file, shown only while a download runs, cancel and resume.
An entry whose model drafts with its own MTP layers is one file; its header is read on the hub first
(engine.modelfiles.hub_drafters.confirm_drafter, in the background) and the download starts only if the layers
are there."""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import QFormLayout, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.background import Job
from app.models.download_worker import start_download
from app.models.tables import make_table, selected_key, set_row
from app.models.task_worker import STOP_WAIT_S, Tasks
from engine.methods import MTP as MTP_METHOD
from engine.modelfiles import model_store
from engine.modelfiles.catalog import MTP, CatalogPair
from engine.modelfiles.downloads import Progress, format_bytes
from engine.modelfiles.hub_drafters import confirm_drafter
from engine.modelfiles.model_folder import partial_bytes

BAR_STEPS = 1000
WORD_JOINER = "\u2060"  # invisible; forbids a line break on either side
CHAT_TOKEN = re.compile(r"<[^\s<>]+>")  # <|im_end|>, <start_of_turn>, <think>


def keep_tokens_whole(text: str) -> str:
    """Chat-format tokens are read as one thing, but Qt breaks lines after their '|' ("<|im_end|" then
    ">"): word joiners between their characters leave breaks only at the spaces around them."""
    return CHAT_TOKEN.sub(lambda token: WORD_JOINER.join(token.group()), text)


def escape_keeping_tokens_whole(text: str) -> str:
    return html.escape(keep_tokens_whole(text))


class PairsTab(QWidget):
    downloadFinished = Signal(list)  # local paths: target, draft
    downloadEnded = Signal(str)  # cancelled or failed, with the message shown

    def __init__(self, catalog: list[CatalogPair], catalog_error: str = "", parent=None):
        super().__init__(parent)
        self.catalog = catalog
        self.tasks = Tasks(self)
        self._download: Job | None = None
        self._download_pair: CatalogPair | None = None
        self.table = make_table(["Pair", "Download size", "Status"])
        self.table.itemSelectionChanged.connect(self._pair_selected)
        self.details = QLabel()
        self.details.setTextFormat(Qt.TextFormat.RichText)  # our markup around escaped names (see below)
        self.details.setText(html.escape(catalog_error or "Choose a pair to see what it contains."))
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.download_button = QPushButton("Download pair")
        self.download_button.setToolTip(
            "Downloads the target and its draft. Closing this window stops the download; it resumes where it stopped."
        )
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_download)
        self.target_bar, self.draft_bar = QProgressBar(), QProgressBar()
        self.target_bar_label, self.draft_bar_label = QLabel("Target"), QLabel("Draft")
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QHBoxLayout()
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.cancel_button)
        buttons.addStretch(1)
        # Empty bars look like text boxes: they show only while a download runs; the table says each pair's state.
        self.progress_box = QWidget()
        bars = QFormLayout(self.progress_box)
        bars.setContentsMargins(0, 0, 0, 0)
        bars.addRow(self.target_bar_label, self.target_bar)
        bars.addRow(self.draft_bar_label, self.draft_bar)
        self.progress_box.hide()
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.details)
        layout.addLayout(buttons)
        layout.addWidget(self.progress_box)
        layout.addWidget(self.status_label)

    @property
    def downloading(self) -> bool:
        return self._download is not None or self.tasks.busy("confirm")

    def refresh(self) -> None:
        """Redraw each pair's status (installed, partly downloaded, not downloaded) and the buttons."""
        selected = self.selected_pair()
        self.table.setRowCount(len(self.catalog))
        for row, pair in enumerate(self.catalog):
            name = pair.name if pair.verified else f"{pair.name} (file names not verified)"
            set_row(
                self.table,
                row,
                [name, f"about {format_bytes(pair.size_bytes)}", self._pair_status(pair)],
                data=pair.id,
                tooltip=pair.note,
            )
            if selected is not None and pair.id == selected.id:
                self.table.selectRow(row)
        self._update_buttons()

    def _pair_status(self, pair: CatalogPair) -> str:
        state = model_store.pair_state(pair)
        if state == "installed":
            return "Installed"
        if state == "partial":
            done = sum(partial_bytes(r) for r in model_store.catalog_requests(pair))
            return f"Partly downloaded ({format_bytes(done)} so far)" if done else "Partly downloaded"
        return "Not downloaded"

    def selected_pair(self) -> CatalogPair | None:
        pair_id = selected_key(self.table)
        return next((p for p in self.catalog if p.id == pair_id), None) if pair_id is not None else None

    def _pair_selected(self) -> None:
        pair = self.selected_pair()
        if pair is not None:
            e = escape_keeping_tokens_whole
            files = "<br>".join(
                f"{role}: {e(f.repo_id)} / {e(f.filename)} ({e(f.quantization)}, about {format_bytes(f.size_bytes)})"
                for role, f in zip(("Target", "Draft"), pair.files, strict=False)
            )
            if pair.drafter == MTP:
                files += (
                    f"<br>Drafter: the target's own MTP layers (choose “{e(MTP_METHOD.label)}” in the chat settings)"
                )
            verified = "" if pair.verified else "<br><i>These file names were not verified.</i>"
            confirmed = f"<br><i>{e(pair.confirmed_by)}</i>" if pair.confirmed_by else ""
            self.details.setText(
                f"<b>{e(pair.name)}</b> — {e(pair.family)}, chat format: "
                f"{e(pair.chat_template)}<br>{e(pair.note)}<br>{files}{verified}{confirmed}"
            )
            self.target_bar_label.setText(f"Target: {pair.target.filename}")
            self.draft_bar_label.setText(f"Draft: {pair.draft.filename}" if pair.draft else "")
            for part in (self.draft_bar_label, self.draft_bar):  # one file: one bar
                part.setVisible(pair.draft is not None)
        self._update_buttons()

    # --- the download -------------------------------------------------------------------------
    def start_download(self) -> None:
        pair = self.selected_pair()
        if pair is None or self.downloading:
            return
        if pair.drafter == MTP:  # its MTP layers are checked in its header on the hub before gigabytes are fetched
            self.show_status(f"Reading the header of {pair.target.filename} on the hub to check its MTP layers…")
            self.tasks.start(
                "confirm",
                lambda cancelled: confirm_drafter(pair, cancelled=cancelled),
                lambda problem: self._confirmed(pair, str(problem)),
                self._download_failed,
            )
            self._update_buttons()
            return
        self._start(pair)

    def _confirmed(self, pair: CatalogPair, problem: str) -> None:
        if problem:
            self._download_failed(problem)
        else:
            self._start(pair)

    def _start(self, pair: CatalogPair) -> None:
        self._download_pair = pair
        for bar in (self.target_bar, self.draft_bar):
            bar.setRange(0, BAR_STEPS)
            bar.setValue(0)
        self.show_status(f"Asking the hub about {pair.name}…")
        self._download = start_download(
            model_store.catalog_requests(pair),
            self,
            progress=self._download_progress,
            finished=self._download_finished,
            failed=self._download_failed,
            stopped=self._download_stopped,
        )
        self.progress_box.show()
        self._update_buttons()

    def cancel_download(self) -> None:
        if self.tasks.busy("confirm"):  # still reading the header: nothing to keep
            self.tasks.cancel("confirm")
            self._download_stopped("Stopped before anything was downloaded.")
            return
        if self._download is not None:
            self._download.stop()
            self.show_status("Stopping…")
            self.cancel_button.setEnabled(False)

    def stop(self) -> None:
        """The window is closing: stop the download, keeping what arrived, and wait (a while) for it to end."""
        self.tasks.stop_all()
        if self._download is not None:
            self._download.stop()
            self._download.wait(STOP_WAIT_S)

    @Slot(object)
    def _download_progress(self, p: Progress) -> None:
        bars = (self.target_bar, self.draft_bar)
        if p.phase != "checking":  # files arrive in order once the hub has been asked about all of them
            for bar in bars[: p.file_index]:
                bar.setValue(BAR_STEPS)
            if p.file_total:
                bars[min(p.file_index, 1)].setValue(int(BAR_STEPS * p.file_done / p.file_total))
        total = format_bytes(p.total_bytes) if p.total_bytes else "?"
        if p.phase == "checking":
            text = f"Asking the hub about {p.filename}…"
        elif p.phase == "verifying":
            text = f"Checking the sha256 of {p.filename}…"
        elif p.phase == "done":
            text = "Done."
        else:
            text = f"Downloading {p.filename}: {format_bytes(p.done_bytes)} of {total}"
            if p.speed_bps:
                text += f" · {format_bytes(p.speed_bps)}/s"
            if p.eta_s is not None:
                text += f" · {p.eta_text} left"
        self.show_status(text)

    @Slot(list)
    def _download_finished(self, paths: list) -> None:
        self._end_download()
        for bar in (self.target_bar, self.draft_bar):
            bar.setValue(BAR_STEPS)
        pair = self._download_pair  # set by start_download
        name = pair.name if pair is not None else "the models"
        then = f", then choose “{MTP_METHOD.label}” in the chat settings" if len(paths) == 1 else ""
        self.show_status(f"Installed {name}. It is selected below: press “Use these models”{then} to chat with it.")
        self.downloadFinished.emit(list(paths) if len(paths) > 1 else [paths[0], None])  # [target, draft or None]

    @Slot(str)
    def _download_failed(self, message: str) -> None:
        self._download_ended(message, error=True)

    @Slot(str)
    def _download_stopped(self, message: str) -> None:
        self._download_ended(message, error=False)

    def _download_ended(self, message: str, error: bool) -> None:
        self._end_download()
        self.show_status(message, error=error)
        self.downloadEnded.emit(message)

    def _end_download(self) -> None:
        self._download = None
        self.progress_box.hide()  # the status line says how it ended

    def _update_buttons(self) -> None:
        downloading = self.downloading
        pair = self.selected_pair()
        self.download_button.setEnabled(pair is not None and not downloading)
        if pair is not None and not downloading:
            state = model_store.pair_state(pair)
            self.download_button.setText(
                {"installed": "Check for updates", "partial": "Resume"}.get(
                    state, "Download pair" if pair.draft is not None else "Download model"
                )
            )
        self.cancel_button.setEnabled(downloading)

    def show_status(self, text: str, error: bool = False) -> None:
        self.status_label.setStyleSheet("color: #b00020;" if error else "")
        self.status_label.setText(text)
