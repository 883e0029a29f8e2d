"""Text files in a message: read and checked, shown as chips, and written into the message itself.

An attached file goes into the message as a fenced block under its name, so the model reads it and
prompt lookup can copy from it (editing a file is where lookup pays most). The saved message is
plain text; split_attachments finds the blocks again, so a sent message shows chips, not the file:

    <what you typed>

    File: notes.py
    ```py
    <the file's text>
    ```

Only text is accepted: known binary types, files with NUL bytes and files that are not UTF-8 are
refused with a message, and so are files too large for the model's context.

Only regular files are read, and never on the GUI thread: a link is resolved first, then anything that is
not a regular file (a FIFO would block the read until a writer came; /dev/zero never ends) is refused
before it is opened, and a file is read to at most MAX_FILE_BYTES (plus one chunk) whatever its size says
(it may grow; /proc files say 0): engine/safe_files.py does that, for every file the app is given. The read
runs on a worker thread (app/background.py) and the tray hears back through Qt.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFontDatabase, QIcon, QPainter, QPainterPath, QPen, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QPlainTextEdit,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from app.background import run_in_background
from engine import safe_files
from engine.safe_files import FileRefused, Wording, human_size
from engine.text_rules import plain_name

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 8 << 20  # beyond any context SpecChat runs; a bigger file is not even read
BYTES_PER_TOKEN_BOUND = 8  # no tokenizer packs text denser than this on average: the bound with no model loaded
BINARY_SUFFIXES = frozenset(
    [
        ".png",
        ".jpg",
        ".jpeg",
        ".gif",
        ".bmp",
        ".webp",
        ".ico",
        ".tif",
        ".tiff",
        ".heic",
        ".psd",
        ".pdf",
        ".zip",
        ".gz",
        ".tgz",
        ".bz2",
        ".xz",
        ".zst",
        ".7z",
        ".rar",
        ".tar",
        ".exe",
        ".dll",
        ".so",
        ".dylib",
        ".o",
        ".a",
        ".lib",
        ".class",
        ".jar",
        ".pyc",
        ".whl",
        ".gguf",
        ".bin",
        ".safetensors",
        ".pt",
        ".pth",
        ".onnx",
        ".npy",
        ".npz",
        ".mp3",
        ".mp4",
        ".m4a",
        ".wav",
        ".flac",
        ".ogg",
        ".mov",
        ".avi",
        ".mkv",
        ".webm",
        ".doc",
        ".docx",
        ".xls",
        ".xlsx",
        ".ppt",
        ".pptx",
        ".odt",
        ".ods",
        ".sqlite",
        ".sqlite3",
        ".db",
        ".woff",
        ".woff2",
        ".ttf",
        ".otf",
        ".iso",
        ".dmg",
        ".wasm",
    ]
)
# engine.safe_files checks and reads the file; these are its refusals in an attachment's words.
ATTACHING = Wording(
    folder="{label} is a folder. Attach the files in it one by one.",
    special=(
        "{label} is {kind}, not a regular file, so it was not read (it could wait for ever or never end). "
        "Only regular files can be attached."
    ),
    too_large=("{label} is {size} ({bytes:,} bytes): too large to put into a message (at most {limit:,} bytes)."),
    grew=(
        "{label} is over {limit:,} bytes (more than its size said): too large to put into a message (at most "
        "{limit:,} bytes)."
    ),
)
_HEADER = re.compile(r"File: (?P<name>[^\n]+)\n(?P<fence>`{3,})[^\n`]*\n")
_BLOCK_START = re.compile(r"(?:^|\n\n)(?=File: )")


class AttachmentRefused(Exception):
    """A file that cannot go into a message; the text says why, for a person."""


@dataclass(frozen=True)
class Attachment:
    name: str
    text: str

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8"))

    def block(self) -> str:
        """The file as it goes into the message: its name, then its text in a fence longer than any
        backtick run at the start of its lines (so the text cannot close the fence early)."""
        runs = [len(m[0]) for m in re.finditer(r"^`+", self.text, re.M)]
        fence = "`" * max(3, max(runs, default=0) + 1)
        language = Path(self.name).suffix.lstrip(".").lower()
        return f"File: {self.name}\n{fence}{language}\n{self.text.removesuffix(chr(10))}\n{fence}"


def read_attachment(path: str | Path) -> Attachment:
    """The file's text, or AttachmentRefused saying why it cannot be attached. It reads the disk (and may be
    slow): call it off the GUI thread, as AttachmentTray does."""
    path = Path(path)
    name = path.name
    _refuse_binary_suffix(name, path.suffix)
    try:
        target = safe_files.resolve(path, ATTACHING)  # links first: what is checked and read is the file itself
        if target.real.name != name:
            _refuse_binary_suffix(target.label, target.real.suffix)
        data = safe_files.read_bytes(target, MAX_FILE_BYTES, ATTACHING)
    except FileRefused as exc:
        raise AttachmentRefused(str(exc)) from exc
    if b"\0" in data:
        raise AttachmentRefused(
            f"{name} is a binary file (it contains NUL bytes), not text. Only text files can be attached."
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AttachmentRefused(
            f"{name} is not UTF-8 text (byte {exc.start} cannot be read). Only UTF-8 text "
            "files can be attached; convert it first."
        ) from exc
    return Attachment(name, text.replace("\r\n", "\n"))


def _refuse_binary_suffix(label: str, suffix: str) -> None:
    if suffix.lower() in BINARY_SUFFIXES:
        raise AttachmentRefused(
            f"{label} is a {suffix.lower()} file, not text. Only text files (code, "
            "Markdown, CSV, logs, …) can be attached."
        )


def _read_or_refusal(path: str) -> Attachment | AttachmentRefused:
    """read_attachment on a worker thread: its answer, or why not (nothing raised goes unsaid)."""
    try:
        return read_attachment(path)
    except AttachmentRefused as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a file must never vanish without a word
        log.exception("reading an attached file")
        return AttachmentRefused(f"{Path(path).name} could not be read: {str(exc) or type(exc).__name__}.")


READER_LANE = "attachment-reader"  # one at a time: files arrive in the order they were given


def compose(text: str, attachments: list[Attachment]) -> str:
    """The message to send: what was typed, then each file's block."""
    parts = [text.strip()] if text.strip() else []
    return "\n\n".join(parts + [a.block() for a in attachments])


def split_attachments(content: str) -> tuple[str, list[Attachment]]:
    """(typed text, attachments) of a message compose() wrote; ("content", []) for any other message."""
    for start in _BLOCK_START.finditer(content):
        files = _blocks(content, start.end())
        if files:
            return content[: start.start()], files
    return content, []


def _blocks(content: str, pos: int) -> list[Attachment] | None:
    """The file blocks from pos to the end of content, or None if anything else is there."""
    files = []
    while pos < len(content):
        header = _HEADER.match(content, pos)
        if header is None:
            return None
        fence = header["fence"]
        close = content.find("\n" + fence, header.end() - 1)
        end = close + 1 + len(fence)
        if close < 0 or (end < len(content) and not content.startswith("\n\n", end)):
            return None
        files.append(Attachment(header["name"], content[header.end() : max(close, header.end())]))
        pos = end + 2
    return files or None


def local_files(mime) -> list[str]:
    """The local file paths in dragged or dropped data (none for text or web links)."""
    if not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile()]


class FileDrops(QObject):
    """Lets a widget take dropped files: on_files(paths) is called with the local files dropped on it."""

    def __init__(self, widget: QWidget, on_files: Callable[[list[str]], None]):
        super().__init__(widget)
        self.on_files = on_files
        widget.setAcceptDrops(True)
        widget.installEventFilter(self)

    def eventFilter(self, _obj, event) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove) and local_files(event.mimeData()):
            event.acceptProposedAction()
            return True
        if kind == QEvent.Type.Drop and local_files(event.mimeData()):
            event.acceptProposedAction()
            self.on_files(local_files(event.mimeData()))
            return True
        return False


def paperclip_icon(color: QColor) -> QIcon:
    """A paperclip, drawn (an emoji needs a font that many systems lack)."""
    icon = QIcon()
    for size in (16, 24, 32, 48):
        pixmap = QPixmap(size, size)
        pixmap.fill(Qt.GlobalColor.transparent)
        p = QPainter(pixmap)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.scale(size / 24, size / 24)
        p.translate(12, 12)
        p.rotate(40)
        p.translate(-12, -12)
        path = QPainterPath(QPointF(10.5, 7))  # the inner leg, then round and out, three legs in all
        path.lineTo(10.5, 16.5)
        path.arcTo(QRectF(10.5, 14.5, 4, 4), 180, 180)
        path.lineTo(14.5, 5.5)
        path.arcTo(QRectF(6.5, 1.5, 8, 8), 0, 180)
        path.lineTo(6.5, 18)
        path.arcTo(QRectF(6.5, 14, 10, 8), 180, 180)
        path.lineTo(16.5, 9)
        p.setPen(QPen(color, 1.6, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap))
        p.drawPath(path)
        p.end()
        icon.addPixmap(pixmap)
    return icon


# --- chips ----------------------------------------------------------------------------------------
class AttachmentChip(QFrame):
    """A file as a small box: its name and size, to view it and (before sending) ✕ to remove it."""

    removeRequested = Signal()

    def __init__(self, attachment: Attachment, removable: bool, parent=None):
        super().__init__(parent)
        self.attachment = attachment
        self.setFrameShape(QFrame.Shape.StyledPanel)
        row = QHBoxLayout(self)
        row.setContentsMargins(6, 1, 2, 1)
        row.setSpacing(2)
        self.view_button = QToolButton()
        self.view_button.setAutoRaise(True)
        self.view_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_FileIcon))
        self.view_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        name = plain_name(attachment.name)  # a file's name, as it reads: no bidi control obeyed
        self.view_button.setText(f"{name}  ·  {human_size(attachment.size)}")
        self.view_button.setToolTip(f"Show {name}")
        self.view_button.clicked.connect(self.show_file)
        row.addWidget(self.view_button)
        self.remove_button = None
        if removable:
            self.remove_button = QToolButton()
            self.remove_button.setAutoRaise(True)
            self.remove_button.setText("✕")
            self.remove_button.setToolTip(f"Remove {name} from this message")
            self.remove_button.clicked.connect(self.removeRequested)
            row.addWidget(self.remove_button)
        self.dialog: QDialog | None = None

    def show_file(self) -> None:
        """The file's text, read-only, in a window of its own."""
        if self.dialog is None:
            self.dialog = QDialog(self.window())
            self.dialog.setWindowTitle(plain_name(self.attachment.name))
            self.dialog.resize(760, 560)
            layout = QVBoxLayout(self.dialog)
            text = QPlainTextEdit()
            text.setReadOnly(True)
            text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
            text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            text.setPlainText(self.attachment.text)
            layout.addWidget(text)
            buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
            buttons.rejected.connect(self.dialog.close)
            layout.addWidget(buttons)
        self.dialog.show()
        self.dialog.raise_()


class AttachmentRow(QWidget):
    """Chips in rows of PER_ROW."""

    removed = Signal(int)  # index of the chip whose ✕ was clicked

    PER_ROW = 4

    def __init__(self, removable: bool = False, parent=None):
        super().__init__(parent)
        self.removable = removable
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.box: QWidget | None = None
        self.chips: list[AttachmentChip] = []
        self.setVisible(False)

    def set_attachments(self, attachments: list[Attachment]) -> None:
        if [c.attachment for c in self.chips] == list(attachments):
            return
        if self.box is not None:  # a fresh box each time: simpler than moving chips between rows
            self.box.hide()
            self.box.deleteLater()
        self.box = QWidget()
        grid = QGridLayout(self.box)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(4)
        self.chips = []
        for i, attachment in enumerate(attachments):
            chip = AttachmentChip(attachment, self.removable)
            chip.removeRequested.connect(lambda i=i: self.removed.emit(i))
            grid.addWidget(chip, i // self.PER_ROW, i % self.PER_ROW)
            self.chips.append(chip)
        grid.setColumnStretch(self.PER_ROW, 1)
        self.column.addWidget(self.box)
        self.setVisible(bool(attachments))


def _count(counter, text: str):
    """The tokens of text, or -1 when counting failed (the safe byte bound decides then)."""
    try:
        return counter.count_text(text)
    except Exception:  # noqa: BLE001 - a file must never vanish without a word
        log.exception("counting an attached file's tokens")
        return -1


class AttachmentTray(AttachmentRow):
    """The files to go with the message being written. add_files checks each one first: a refused file
    is reported through `refused`, with the reason, and nothing else changes."""

    changed = Signal()
    refused = Signal(str)

    def __init__(self, counter=None, budget: Callable[[], int | None] = lambda: None, parent=None):
        """counter: a context_meter.TokenCounter, to size files in the loaded model's tokens; budget():
        the tokens a message may take (the context less what is kept for the answer), None if unknown."""
        super().__init__(removable=True, parent=parent)
        self.counter = counter
        self.budget = budget
        self.attachments: list[Attachment] = []
        self.pending = 0  # files still being counted: the message waits for them
        self.removed.connect(self.remove)

    def add_files(self, paths: list[str]) -> None:
        """Reads and checks each file off the GUI thread; each is added (or refused) when its read is done,
        and until then counts as pending, so the message waits for it."""
        for path in paths:
            self.pending += 1
            run_in_background(_read_or_refusal, str(path), lane=READER_LANE, done=self._read, owner=self)

    def _read(self, result: Attachment | AttachmentRefused) -> None:
        if not isValid(self):  # the window closed while the file was read
            return
        self.pending -= 1
        if isinstance(result, AttachmentRefused):
            self.refused.emit(str(result))
            return
        attachment = result
        budget = self.budget()
        if budget is None:
            self._add(attachment)
        elif self.counter is not None and self.counter.available:
            block = attachment.block()
            self.pending += 1
            self.counter.submit(
                lambda f, block=block: _count(f, block),
                lambda tokens, a=attachment, b=budget: self._sized(a, tokens, b),
            )
        elif attachment.size > budget * BYTES_PER_TOKEN_BOUND:
            self.refused.emit(self._too_large(attachment, f"{human_size(attachment.size)}", budget))
        else:
            self._add(attachment)

    def _sized(self, attachment: Attachment, tokens, budget: int) -> None:
        self.pending -= 1
        if tokens > budget:
            self.refused.emit(self._too_large(attachment, f"{tokens:,} tokens", budget))
        elif tokens < 0 and attachment.size > budget * BYTES_PER_TOKEN_BOUND:
            self.refused.emit(self._too_large(attachment, f"{human_size(attachment.size)}", budget))  # uncounted
        else:
            self._add(attachment)

    @staticmethod
    def _too_large(attachment: Attachment, size: str, budget: int) -> str:
        return (
            f"{attachment.name} is too large for the model's context: it is {size}, and a message can take "
            f"at most {budget:,} tokens (the rest of the context is kept for the answer). Attach a smaller "
            "file or part of it, or raise the context size in Settings."
        )

    def _add(self, attachment: Attachment) -> None:
        self.attachments.append(attachment)
        self.set_attachments(self.attachments)
        self.changed.emit()

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.attachments):
            del self.attachments[index]
            self.set_attachments(self.attachments)
            self.changed.emit()

    def set_files(self, attachments: list[Attachment]) -> None:
        self.attachments = list(attachments)
        self.set_attachments(self.attachments)
        self.changed.emit()

    def clear(self) -> None:
        self.set_files([])
