"""File → Export conversation… and Import conversation…: the open conversation to a file (JSON with every branch,
or Markdown), and a JSON export back as a new conversation, read, checked and stored off the GUI thread
(app.conversations.importing). The file dialogs start in the folder of the last file chosen."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QFileDialog

from app.conversations.imported_settings import use_imported_settings
from app.conversations.importing import ConversationImport

if TYPE_CHECKING:
    from app.main_window import MainWindow


class ConversationFiles:
    def __init__(self, window: MainWindow):
        self.window = window
        self.closed = False  # the window closed: an import that ends later shows nothing
        self.imports = ConversationImport(
            window.store,
            lambda: window.presets.default,
            lambda name, carried: use_imported_settings(window, name, carried),
            window,
        )

    def _folder(self) -> Path:
        """Where the export and import dialogs start: the folder of the last file chosen, while it exists."""
        last = self.window.settings.last_folder
        folder = Path(last) if last else None
        return folder if folder is not None and folder.is_dir() else Path.home()

    def _remember_folder(self, path: str) -> None:
        folder = str(Path(path).parent)
        if folder != self.window.settings.last_folder:
            self.window.store_settings(self.window.settings.merged({"last_folder": folder}))

    def export_conversation(self, path: str | Path | None = None) -> bool:
        """The open conversation to a file: .json holds every branch, anything else is Markdown. Without
        a path, asks for one."""
        from app.conversations.files import export_json, export_markdown, suggested_file_name

        window = self.window
        cid = window.session.conversation_id
        if cid is None:
            window.statusBar().showMessage("Open a conversation to export it.", 4000)
            return False
        if path is None:
            markdown, everything = "Markdown, the branch shown (*.md)", "JSON, every branch (*.json)"
            conversation = window.store.conversation(cid)
            if conversation is None:  # deleted under the window (deleting one closes it: not expected)
                window.statusBar().showMessage("Open a conversation to export it.", 4000)
                return False
            start = str(self._folder() / suggested_file_name(conversation.title, ".md"))
            path, chosen = QFileDialog.getSaveFileName(
                window, "Export conversation", start, f"{markdown};;{everything}"
            )
            if not path:
                return False
            if not Path(path).suffix:
                path += ".json" if chosen == everything else ".md"
            self._remember_folder(path)
        path = Path(path)
        try:
            (export_json if path.suffix.lower() == ".json" else export_markdown)(window.store, cid, path)
        except OSError as exc:
            window.notices.show_notice(
                f"The conversation could not be written to {path}: {exc.strerror or exc}.", "error", key="export"
            )
            return False
        window.statusBar().showMessage(f"Exported to {path}", 6000)
        return True

    def import_conversation(self, path: str | Path | None = None) -> int | None:
        """A JSON export as a new conversation, opened; its id, or None if refused. Without a path, asks. The file
        is read, checked and stored on the import lane (app.conversations.importing); this returns when that is
        done, the window live meanwhile. Settings in it that would change where messages go or what goes with
        them are used only if the person says so."""
        window = self.window
        importing = self.imports.path  # not None while busy
        if importing is not None:
            window.notices.show_notice(
                f"{Path(importing).name} is still being imported; import the next file once it is done.",
                "info",
                key="import-busy",
            )
            return None
        if path is None:
            path, _ = QFileDialog.getOpenFileName(
                window, "Import conversation", str(self._folder()), "SpecChat conversation (*.json);;All files (*)"
            )
            if not path:
                return None
            self._remember_folder(path)
        window.statusBar().showMessage(f"Importing {Path(path).name}…")
        result = self.imports.run(str(path))
        if self.closed:
            return None
        window.statusBar().clearMessage()
        if isinstance(result, str):
            window.notices.show_notice(result, "error", key="import")
            return None
        window.notices.clear("import")
        window.panel.reload(result)
        window.open_conversation(result)
        return result

    def close(self) -> None:
        """The window closes: an import under way ends its wait (ConversationImport.abandon) and shows nothing."""
        self.closed = True
        self.imports.abandon()
