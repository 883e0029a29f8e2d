"""The "Search the hub" tab: find GGUF repos on Hugging Face, see each file's quantization, size and whether it
fits this machine (an estimate from its header), pick one, get the drafts and draft heads that fit it
(checked from their headers before anything is downloaded) and download target and draft as one job. Repos whose
models carry a built-in drafter (MTP layers) are marked, from one header each (engine.modelfiles.hub_drafters):
the first MAX_MARKED of a search, and any repo when it is chosen.

Every hub call runs on a worker thread (app/models/task_worker.py); the window only draws answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.background import Job
from app.models.download_worker import start_download
from app.models.drafter_note import NOT_READ, drafter_sentence, drafter_short
from app.models.pairs_tab import BAR_STEPS
from app.models.tables import make_table, selected_key, set_row
from app.models.task_worker import STOP_WAIT_S, Tasks
from engine.errors import EngineError
from engine.hardware import free_gpu_memory
from engine.modelfiles import model_store
from engine.modelfiles.downloads import Progress, format_bytes
from engine.modelfiles.draft_finder import DraftCandidate, DraftSearch, find_drafts
from engine.modelfiles.embedded import embedded_model_path
from engine.modelfiles.head_check import HEAD_NAMES
from engine.modelfiles.hub_drafters import MAX_MARKED, RepoDrafter, drafter_in, header_file, mark_drafters
from engine.modelfiles.hub_files import FileRequest
from engine.modelfiles.hub_search import GGUFFile, RepoResult, repo_files, search_repos
from engine.modelfiles.memory_fit import estimate_fit
from engine.modelfiles.model_inspect import HEAD_SUPPORT
from engine.modelfiles.remote_gguf import read_remote_metadata
from engine.text_rules import plain_name

SORTS = (("Most downloaded", "downloads"), ("Most liked", "likes"), ("Recently updated", "recent"))
DEFAULT_CONTEXT = 4096
HUB_TIMEOUT_S = 15.0  # a hub that stops answering is given up on after this, and said so
DRAFTER_COLUMN = 4
DRAFT_NAME_WIDTH = 380  # px: the draft's name column; the reason gets the rest
NOT_CHECKED = "when chosen"  # a repo past the first MAX_MARKED: its header is read when it is chosen


@dataclass(frozen=True)
class RepoFacts:
    """What choosing a repo reads, off the GUI thread: its files, one header (for the fit estimates and the
    built-in drafter), and the GPU's free memory."""

    repo: RepoResult
    metadata: dict[str, Any] | None
    note: str  # why the header is missing, or ""
    free_vram: int | None
    drafter: RepoDrafter | None


class SearchTab(QWidget):
    downloadFinished = Signal(list)  # local paths: target, draft (or None)
    downloadEnded = Signal(str)  # cancelled or failed, with the message shown
    draftsFound = Signal()  # for tests and the status line: the draft list is drawn
    marksShown = Signal()  # a search's repos are marked with their built-in drafters (tests wait on it)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.tasks = Tasks(self)
        self.repos: list[RepoResult] = []
        self.repo: RepoResult | None = None
        self.repo_meta: dict | None = None  # the header of one of the repo's files: sizes its KV cache
        self.free_vram: int | None = None  # read with the repo's files, off the GUI thread (a GPU call)
        self.drafts: DraftSearch | None = None
        self._download: Job | None = None
        self._download_plan: tuple[int, str | None] = (1, None)  # target parts, installed draft path

        self.query_edit = QLineEdit()
        self.query_edit.setPlaceholderText("Search Hugging Face for GGUF models, e.g. qwen2.5 coder 1.5b")
        self.query_edit.returnPressed.connect(self.search)
        self.sort_combo = QComboBox()
        for label, key in SORTS:
            self.sort_combo.addItem(label, key)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        self.repos_table = make_table(["Repository", "Downloads", "Likes", "Updated", "Built-in drafter"])
        self.repos_table.itemSelectionChanged.connect(self._repo_selected)
        self.files_table = make_table(["File", "Quantization", "Size", "On this machine (estimate)"])
        self.files_table.itemSelectionChanged.connect(self._file_selected)
        self.context_spin = QSpinBox()
        self.context_spin.setRange(512, 1_048_576)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setValue(DEFAULT_CONTEXT)
        self.context_spin.setSuffix(" tokens")
        self.context_spin.setToolTip("The memory estimates count the KV cache for this much context.")
        self.context_spin.valueChanged.connect(self._show_fits)
        self.drafts_table = make_table(["Draft or head", "Size", "Fits the target", "Why"])
        self.drafts_table.itemSelectionChanged.connect(self._draft_selected)
        self.drafts_note = _label("")
        self.download_button = QPushButton("Download target + draft")
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_download)
        self.progress = QProgressBar()
        self.progress.setRange(0, BAR_STEPS)
        self.progress.hide()
        self.status_label = _label("Search for a model by name. Nothing is downloaded until you ask.")
        self._lay_out()
        self._update_buttons()

    def _lay_out(self) -> None:
        query = QHBoxLayout()
        query.addWidget(self.query_edit, 1)
        query.addWidget(self.sort_combo)
        query.addWidget(self.search_button)
        context = QHBoxLayout()
        context.addWidget(QLabel("Memory at a context of"))
        context.addWidget(self.context_spin)
        context.addStretch(1)
        files = QWidget()
        files_layout = QVBoxLayout(files)
        files_layout.setContentsMargins(0, 0, 0, 0)
        files_layout.addWidget(self.files_table, 1)
        files_layout.addLayout(context)
        drafts = QWidget()
        drafts_layout = QVBoxLayout(drafts)
        drafts_layout.setContentsMargins(0, 0, 0, 0)
        drafts_layout.addWidget(self.drafts_table, 1)
        drafts_layout.addWidget(self.drafts_note)
        split = QSplitter(Qt.Orientation.Vertical)
        for part, stretch in ((self.repos_table, 2), (files, 2), (drafts, 3)):  # the drafts need the most room
            split.addWidget(part)
            split.setStretchFactor(split.count() - 1, stretch)
        for table in (self.repos_table, self.files_table, self.drafts_table):
            table.setWordWrap(False)
            table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a long repo / file name keeps its start and its end
        drafts_header = self.drafts_table.horizontalHeader()  # a head's long reason takes the room, whole in its tip
        drafts_header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        drafts_header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.drafts_table.setColumnWidth(0, DRAFT_NAME_WIDTH)
        buttons = QHBoxLayout()
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.progress, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(query)
        layout.addWidget(split, 1)
        layout.addLayout(buttons)
        layout.addWidget(self.status_label)

    # --- search -------------------------------------------------------------------------------
    def search(self) -> None:
        query = self.query_edit.text().strip()
        if not query:
            self.show_status("Type part of a model's name first.")
            return
        sort = self.sort_combo.currentData()
        self.show_status(f"Searching the hub for “{query}”…")
        self.tasks.start(
            "search",
            lambda cancelled: search_repos(query, sort=sort, timeout_s=HUB_TIMEOUT_S),
            self._show_repos,
            self._failed,
        )

    def _show_repos(self, repos: list[RepoResult]) -> None:
        self.repos = repos
        self.repos_table.setRowCount(len(repos))
        for row, repo in enumerate(repos):
            gated = " (gated: needs HF_TOKEN)" if repo.gated else ""
            set_row(
                self.repos_table,
                row,
                [
                    plain_name(repo.repo_id) + gated,
                    f"{repo.downloads:,}",
                    f"{repo.likes:,}",
                    (repo.last_modified or "")[:10],
                    "reading…" if row < MAX_MARKED else NOT_CHECKED,
                ],
                data=repo.repo_id,
                tooltip=repo.repo_id,
            )
        self.show_status(
            f"{len(repos)} repositories with GGUF files."
            if repos
            else "No GGUF repositories match. Try fewer or other words."
        )
        if repos:
            self.tasks.start(
                "marks",
                lambda cancelled: mark_drafters(repos, cancelled=cancelled, timeout_s=HUB_TIMEOUT_S),
                self._show_marks,
                self._failed,
            )

    def _show_marks(self, marks: list[RepoDrafter]) -> None:
        for mark in marks:
            self._mark(mark)
        carrying = [m for m in marks if m.drafter is not None]
        if selected_key(self.repos_table) is None:  # once a repo is chosen, the status line speaks of it
            self.show_status(
                f"{len(self.repos)} repositories with GGUF files. Built-in drafters, read from one header of each "
                f"of the first {len(marks)}: {len(carrying)} found. The others are read when chosen."
            )
        self.marksShown.emit()

    def _mark(self, mark: RepoDrafter) -> None:
        """Write a repo's built-in drafter in its row."""
        row = next((r for r, repo in enumerate(self.repos) if repo.repo_id == mark.repo_id), None)
        item = self.repos_table.item(row, DRAFTER_COLUMN) if row is not None else None
        if item is None:
            return
        if mark.problem:
            item.setText(NOT_READ)
            item.setToolTip(f"Its header could not be read: {mark.problem}")
        else:
            item.setText(drafter_short(mark.drafter))
            item.setToolTip(f"{drafter_sentence(mark.drafter)}\nRead from the header of {mark.filename}.")

    def _repo_selected(self) -> None:
        repo_id = selected_key(self.repos_table)
        if repo_id is None:
            return
        self.repo, self.repo_meta, self.drafts = None, None, None
        self.files_table.setRowCount(0)
        self.drafts_table.setRowCount(0)
        self.show_status(f"Reading {repo_id}'s files and one header…")
        self.tasks.start(
            "files", lambda cancelled: _files_and_header(repo_id, cancelled), self._show_files, self._failed
        )
        self._update_buttons()

    def _show_files(self, facts: RepoFacts) -> None:
        self.repo, self.repo_meta, note, self.free_vram = facts.repo, facts.metadata, facts.note, facts.free_vram
        if facts.drafter is not None:
            self._mark(facts.drafter)
        self.files_table.setRowCount(len(self.repo.files))
        for row, f in enumerate(self.repo.files):
            parts = f" ({len(f.parts)} parts)" if len(f.parts) > 1 else ""
            set_row(
                self.files_table,
                row,
                [plain_name(f.filename) + parts, f.quantization, format_bytes(f.size), ""],
                data=f.filename,
                tooltip="\n".join(f.parts),
            )
        self._show_fits()
        if not self.repo.files:
            self.show_status(f"{self.repo.repo_id} holds no GGUF files: SpecChat runs GGUF models only.", error=True)
        else:
            built_in = ""
            if facts.drafter is not None and facts.drafter.drafter is not None:
                built_in = f"{drafter_sentence(facts.drafter.drafter)} (Read from {facts.drafter.filename}.) "
            self.show_status(built_in + (note or "Choose a file: its drafts are checked from their headers."))

    def _show_fits(self) -> None:
        if self.repo is None:
            return
        draft = self.selected_draft()
        draft_bytes = draft.size if draft is not None else 0
        for row, f in enumerate(self.repo.files):
            text = "n/a (no header read)"
            if self.repo_meta is not None:
                text = estimate_fit(
                    self.repo_meta, f.size, self.context_spin.value(), draft_bytes=draft_bytes, free_vram=self.free_vram
                ).text
            item = self.files_table.item(row, 3)
            item.setText(text)
            item.setToolTip(text + ("\nThe draft's size is counted." if draft_bytes else ""))

    # --- drafts -------------------------------------------------------------------------------
    def selected_file(self) -> GGUFFile | None:
        name = selected_key(self.files_table)
        return next((f for f in self.repo.files if f.filename == name), None) if self.repo and name else None

    def _file_selected(self) -> None:
        f = self.selected_file()
        self.drafts = None
        self.drafts_table.setRowCount(0)
        if f is None or self.repo is None:  # (a file is selected only from a repository's files)
            return
        repo_id = self.repo.repo_id
        installed = _installed_paths()
        self.drafts_note.setText("")
        self.show_status(f"Looking for drafts for {f.filename}: reading headers only…")
        self.tasks.start(
            "drafts",
            lambda cancelled: find_drafts(repo_id, f.filename, installed=installed, cancelled=cancelled),
            self._show_drafts,
            self._failed,
        )
        self._update_buttons()

    def _show_drafts(self, search: DraftSearch) -> None:
        self.drafts = search
        rows = search.candidates
        self.drafts_table.setRowCount(len(rows))
        for row, c in enumerate(rows):
            fits = {True: "yes", False: "no", None: "unknown"}[c.compatible]
            if c.head is not None:
                fits += f" ({HEAD_NAMES.get(c.head, c.head)} head)"
            set_row(
                self.drafts_table,
                row,
                [
                    plain_name(c.name),
                    format_bytes(c.size) if c.size else "—",
                    fits,
                    plain_name(c.reason) or "same vocabulary (llama.cpp's rules)",
                ],
                data=row,
                tooltip=c.reason or c.name,
            )
        total = sum(c.size for c in rows if c.bytes_read) + search.target_size
        self.drafts_note.setText(
            f"Checked from GGUF headers only: {format_bytes(search.bytes_read)} read of {format_bytes(total)} "
            f"in those files; nothing downloaded. Family searched: “{search.family}”."
            + ("\n" + "\n".join(search.problems) if search.problems else "")
        )
        usable = next((row for row, c in enumerate(rows) if c.usable), None)
        if usable is not None:
            self.drafts_table.selectRow(usable)
        heads = _heads_note([c for c in rows if c.head is not None and c.compatible and not c.usable])
        self.show_status(
            f"{len(search.compatible)} of {len(rows)} drafts and heads can draft for this target.{heads}"
            if rows
            else "No drafts found for this family; the target alone still works."
        )
        self._update_buttons()
        self.draftsFound.emit()

    def selected_draft(self) -> DraftCandidate | None:
        row = selected_key(self.drafts_table)
        if self.drafts is None or row is None:
            return None
        draft = self.drafts.candidates[row]
        return draft if draft.usable else None

    def _draft_selected(self) -> None:
        self._show_fits()
        self._update_buttons()

    # --- the download -------------------------------------------------------------------------
    def start_download(self) -> None:
        target = self.selected_file()
        if target is None or self.repo is None or self._download is not None:
            return
        draft = self.selected_draft()
        requests = [FileRequest(self.repo.repo_id, part) for part in target.parts]
        installed_draft = str(draft.path) if draft is not None and draft.path is not None else None
        if draft is not None and draft.repo_id:
            requests += [FileRequest(draft.repo_id, part) for part in draft.parts]
        self._download_plan = (len(target.parts), installed_draft)
        self.progress.setValue(0)
        self.progress.show()
        self.show_status(f"Asking the hub about {target.filename}…")
        self._download = start_download(
            requests,
            self,
            progress=self._download_progress,
            finished=self._download_finished,
            failed=self._download_failed,
            stopped=self._download_stopped,
        )
        self._update_buttons()

    def cancel_download(self) -> None:
        if self._download is not None:
            self._download.stop()
            self.show_status("Stopping…")
            self.cancel_button.setEnabled(False)

    @property
    def downloading(self) -> bool:
        return self._download is not None

    @Slot(object)
    def _download_progress(self, p: Progress) -> None:
        if p.total_bytes:
            self.progress.setValue(int(BAR_STEPS * p.done_bytes / p.total_bytes))
        if p.phase == "downloading":
            text = f"Downloading {p.filename}: {format_bytes(p.done_bytes)} of {format_bytes(p.total_bytes or 0)}"
            if p.eta_s is not None:
                text += f" · {p.eta_text} left"
        else:
            text = {
                "checking": f"Asking the hub about {p.filename}…",
                "verifying": f"Checking the sha256 of {p.filename}…",
                "done": "Done.",
            }.get(p.phase, p.phase)
        self.show_status(text)

    @Slot(list)
    def _download_finished(self, paths: list) -> None:
        self._end_download()
        target_parts, installed_draft = self._download_plan
        draft = paths[target_parts] if len(paths) > target_parts else installed_draft
        self.progress.setValue(BAR_STEPS)
        self.show_status("Downloaded and verified. The models are selected below: press “Use these models”.")
        self.downloadFinished.emit([paths[0], draft])

    @Slot(str)
    def _download_failed(self, message: str) -> None:
        self._end_download()
        self.show_status(message, error=True)
        self.downloadEnded.emit(message)

    @Slot(str)
    def _download_stopped(self, message: str) -> None:
        self._end_download()
        self.show_status(message)
        self.downloadEnded.emit(message)

    def _end_download(self) -> None:
        self._download = None
        self.progress.hide()
        self._update_buttons()

    def stop(self) -> None:
        """The window is closing: stop searches and a download (keeping what arrived)."""
        self.tasks.stop_all()
        if self._download is not None:
            self._download.stop()
            self._download.wait(STOP_WAIT_S)

    # --- shared -------------------------------------------------------------------------------
    def _failed(self, message: str) -> None:
        self.show_status(message, error=True)
        self._update_buttons()

    def _update_buttons(self) -> None:
        target, draft = self.selected_file(), self.selected_draft()
        downloading = self._download is not None
        self.download_button.setEnabled(target is not None and not downloading)
        self.download_button.setText(
            "Download target + draft" if draft is not None and draft.repo_id else "Download target"
        )
        self.cancel_button.setEnabled(downloading)

    def show_status(self, text: str, error: bool = False) -> None:
        self.status_label.setStyleSheet("color: #b00020;" if error else "")
        self.status_label.setText(text)


def _files_and_header(repo_id: str, cancelled) -> RepoFacts:
    """A repo's files, the header and tensor names of its smallest one (every quantization shares the layer and
    head counts that size the KV cache, and the MTP layers), and the GPU's free memory now, which the fit
    estimates compare with."""
    repo = repo_files(repo_id, timeout_s=HUB_TIMEOUT_S)
    chosen = header_file(repo.files)
    if chosen is None:
        return RepoFacts(repo, None, "", None, None)
    free_vram = free_gpu_memory()
    try:
        header = read_remote_metadata(repo_id, chosen.filename, cancelled=cancelled, tensors=True)
    except EngineError as exc:
        problem = RepoDrafter(repo_id, chosen.filename, None, problem=str(exc))
        return RepoFacts(repo, None, f"Memory estimates are not available: {exc}", free_vram, problem)
    drafter = RepoDrafter(repo_id, chosen.filename, drafter_in(header), header.bytes_read)
    return RepoFacts(repo, header.metadata, "", free_vram, drafter)


def _heads_note(heads: list[DraftCandidate]) -> str:
    """ " 1 draft head fits it. <why SpecChat cannot draft with it>" for heads that fit but cannot draft, or ""."""
    if not heads:
        return ""
    why = " ".join(sorted({HEAD_SUPPORT.get(c.head or "") or "" for c in heads}))
    return f" {len(heads)} draft head{'s fit' if len(heads) > 1 else ' fits'} it. {why}".rstrip()


def _installed_paths() -> list:
    """Models on this machine a draft could come from: the built-in SmolLM2 and every installed file."""
    paths = []
    for listing in (lambda: [embedded_model_path()], lambda: [m.path for m in model_store.list_models()]):
        try:
            paths += listing()
        except EngineError:  # a missing package or a damaged list of models: the hub's drafts still count
            pass
    return paths


def _label(text: str) -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)  # names come from the hub: never markup
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label
