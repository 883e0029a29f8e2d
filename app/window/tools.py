"""The main window's other windows: Model → Settings, Models, the speculation lab, Compare, the server, and Help →
System check. Each opens once and is shown again (a download, a lab run or a server goes on while it is hidden);
they are imported when first opened, and one that cannot open says why without ending the app."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QMessageBox

from engine.methods import DRAFT_METHODS

if TYPE_CHECKING:
    from app.compare.window import CompareWindow
    from app.doctor.dialog import SystemCheckDialog
    from app.lab.window import LabWindow
    from app.main_window import MainWindow
    from app.models.dialog import ModelsDialog
    from app.server.panel import ServerPanel

log = logging.getLogger(__name__)


class ToolWindows:
    """The windows opened from the main window, each None until first opened."""

    def __init__(self, window: MainWindow):
        self.window = window
        self.lab: LabWindow | None = None
        self.compare: CompareWindow | None = None
        self.system_check: SystemCheckDialog | None = None
        self.server: ServerPanel | None = None
        self.models_dialog: ModelsDialog | None = None

    def open_settings(self) -> None:
        from app.settings.dialog import SettingsDialog

        dialog = SettingsDialog(self.window.settings, self.window)
        if dialog.exec() and dialog.result_settings is not None:
            self.window.apply_settings(dialog.result_settings)

    def open_models_dialog(self) -> None:
        if self.models_dialog is not None and self.models_dialog.isVisible():
            self.models_dialog.raise_()  # it may be downloading: never open a second one
            self.models_dialog.activateWindow()
            return
        window = self.window
        try:
            from app.models.dialog import ModelsDialog

            dialog = ModelsDialog(window.settings.model, window.settings.draft, window)
        except Exception as exc:  # noqa: BLE001 - an optional part missing or broken must not end the app
            log.exception("models dialog")
            QMessageBox.warning(
                window,
                "Models",
                f"The model manager could not be opened: {exc}\n\n"
                "You can still choose GGUF files in Model → Settings….",
            )
            return
        dialog.modelsChosen.connect(window.models.use_models)
        self.models_dialog = dialog
        dialog.show()

    def open_lab(self) -> None:
        try:
            from app.lab.window import LabWindow

            if self.lab is None:
                self.lab = LabWindow()
                self.lab.applySettings.connect(self.window.models.apply_recommendation)
        except Exception as exc:  # noqa: BLE001
            log.exception("lab window")
            QMessageBox.warning(self.window, "Speculation lab", f"The speculation lab could not be opened: {exc}")
            return
        self.tell_lab()
        self.lab.show()
        self.lab.raise_()

    def tell_lab(self) -> None:
        """The lab measures, and offers to apply, for the chat's own models and speculation."""
        if self.lab is not None:
            s = self.window.settings
            self.lab.set_chat_models(s.model, s.draft, s.effective_method, s.max_draft, s.adaptive)

    def open_server(self) -> None:
        """The OpenAI-compatible server on this window's engine."""
        from app.server.panel import ServerPanel

        window = self.window
        if self.server is None:
            self.server = ServerPanel(window.engine, window.settings, window)
            self.server.optionsChanged.connect(lambda values: window.store_settings(window.settings.merged(values)))
        self.server.show()
        self.server.raise_()

    def open_compare(self) -> None:
        """The Compare view, on this window's engine; it starts with the text being typed, or the last question."""
        from app.compare.window import CompareWindow

        window = self.window
        if self.compare is None:
            self.compare = CompareWindow(
                window.engine, lambda: window.settings, window, chat_settings=window.session.chat_settings
            )
        if not self.compare.running:
            users = [m.content for m in window.session.model.items if m.role == "user"]
            self.compare.set_prompt(window.input.toPlainText() or (users[-1] if users else ""))
        self.compare.show()
        self.compare.raise_()

    def open_system_check(self) -> None:
        """engine.doctor's report: the build, the devices, the VRAM reader, and a bench on this window's model."""
        from app.doctor.dialog import SystemCheckDialog

        if self.system_check is None:
            self.system_check = SystemCheckDialog(self._doctor_arguments, self.window)
        self.system_check.show()
        self.system_check.raise_()

    def _doctor_arguments(self) -> list[str]:
        s = self.window.settings
        draft = ["--draft", s.draft] if s.draft and s.effective_method in DRAFT_METHODS else []
        threads = ["--threads", str(s.threads)] if s.threads else []
        return ["--model", s.model, *draft, "--gpu-layers", str(s.n_gpu_layers), *threads]

    def close_all(self) -> None:
        """The main window closes: so do these (a Compare run is cancelled too, and a system check's child stopped).
        The server panel is the window's own child, and the engine's shutdown stops the server."""
        for window in (self.lab, self.models_dialog, self.compare, self.system_check):
            if window is not None:
                window.close()
