"""The main window's models and engine: loading them (and not loading again one that crashed the last run while it
loaded), what the engine says back (loaded, failed, busy, speculation applied, the server), and applying settings,
the Models dialog's choice and the lab's recommendation."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject

from app.settings.values import AppSettings, what_changed
from engine.errors import InvalidSettingError
from engine.methods import DRAFT_METHODS
from engine.modelfiles.embedded import EMBEDDED

if TYPE_CHECKING:
    from app.main_window import MainWindow

log = logging.getLogger(__name__)

EMBEDDED_NOTICE = (
    "**You are chatting with the built-in demo model**, SmolLM2 135M Instruct: a tiny assistant that runs "
    "offline with no set-up. It answers simple questions but often makes mistakes, so check what it says. "
    "For a real assistant, open **Model → Models…** to download a target model with a matching draft model "
    "(a *model pair*), or choose your own GGUF files in **Model → Settings…**."
)
CRASH_ADVICE = (
    "If it ran out of memory, lower the GPU layers or the context size in Model → Settings… before trying it again."
)


class ModelControl(QObject):
    """The window's engine, driven: info is the loaded model's (None while none is).

    A QObject on the GUI thread, connected to the worker's signals by its own methods: Qt queues those calls to this
    thread (a lambda or a plain object's method would run on the worker's thread)."""

    def __init__(self, window: MainWindow):
        super().__init__(window)
        self.window = window
        self.info: dict | None = None
        self.loading = False
        self.working = ""  # what the engine is busy with besides loading, for the status bar
        w = window.engine.worker
        w.loadStarted.connect(self._load_started)
        w.working.connect(self._engine_working)
        w.loaded.connect(self._loaded)
        w.loadFailed.connect(self._load_failed)
        w.speculationApplied.connect(self._speculation_applied)
        w.notice.connect(self._engine_notice)
        w.serverStarted.connect(self._server_started)
        w.serverStopped.connect(self._server_stopped)
        w.serverFailed.connect(self._server_stopped)

    def load_models(self) -> None:
        window = self.window
        try:
            decoder_settings = window.settings.decoder_settings()
        except InvalidSettingError as exc:
            window.notices.show_notice(f"The model settings are not usable: {exc}", "error", key="load")
            return
        window.session.stop()
        self.loading = True
        window.engine.load(decoder_settings)
        if window.settings.model == EMBEDDED:
            window.notices.show_notice(EMBEDDED_NOTICE, "info", key="embedded")
        else:
            window.notices.clear("embedded")

    def skip_model_that_crashed(self) -> bool:
        """After a crash while loading a model, start without it and say so, rather than crash again.
        False when nothing should be loaded now (the model that crashed is the embedded one)."""
        window = self.window
        note = window.engine.worker.marker.left_over()
        if note is None:
            return True
        name = "the embedded demo model" if note["model"] == EMBEDDED else Path(note["model"]).name
        log.warning("the last run ended while loading %s (%s); not loading it again", note["model"], note["role"])
        if note["role"] == "draft":
            window.store_settings(window.settings.merged({"method": "lookup"}))
            said = (
                f"SpecChat closed while loading the draft model {name} last time, so "
                f"speculation uses prompt lookup for now. {CRASH_ADVICE}"
            )
            window.notices.show_notice(said, "warning", key="crashed")
            return True
        if note["model"] == EMBEDDED:
            said = (
                f"SpecChat closed while loading {name} last time, so no model was loaded "
                f"this time. {CRASH_ADVICE} Model → Reload model tries again."
            )
            window.notices.show_notice(said, "error", key="crashed")
            return False
        changes = {"model": EMBEDDED}
        if window.settings.method in DRAFT_METHODS:
            changes["method"] = "lookup"  # its draft was chosen for the model that crashed
        window.store_settings(window.settings.merged(changes))
        said = (
            f"SpecChat closed while loading {name} last time, so it was not loaded again: "
            f"the embedded demo model is loaded instead. {CRASH_ADVICE} Choose it again in "
            "Model → Settings… to retry."
        )
        window.notices.show_notice(said, "warning", key="crashed")
        return True

    # --- what the engine says (slots: called on the GUI thread) ----------------------------------
    def _engine_notice(self, text: str) -> None:
        self.window.notices.show_notice(text, "warning")

    def _engine_working(self, what: str) -> None:
        """The engine works on something a message sent now would wait for (timing its steps): said in the
        status bar, the window usable meanwhile."""
        self.working = what
        self.window.status.busy(self.loading or bool(what))
        self.window.status.working(what)

    def _load_started(self, what: str) -> None:
        self.window.status.loading(what)

    def _loaded(self, info: dict) -> None:
        window = self.window
        self.loading = False
        self.info = info
        window.session.model_name = info["name"]
        window.status.busy(bool(self.working))
        window.notices.clear("load")
        window.status.loaded(info)
        window.counter.load(info["path"], info["n_ctx"])  # the context meter counts in this model's tokens
        self._speculation_applied(info)
        window.modelLoaded.emit(info)

    def _load_failed(self, message: str) -> None:
        window = self.window
        self.loading = False
        self.info = None
        window.counter.unload()
        window.status.no_model()
        window.notices.show_notice(
            f"**The model could not be loaded.** {message}  \nChoose another file in "
            "Model → Settings… (empty target = the embedded demo model).",
            "error",
            key="load",
        )
        window.modelFailed.emit(message)

    def _speculation_applied(self, info: dict) -> None:
        self.window.status.busy(self.loading or bool(self.working))
        self.window.status.speculation(info)
        if self.info is not None:
            self.info.update(method=info.get("method", "none"), draft_name=info.get("draft_name"))
        self.window.speculationChanged.emit(info)

    def _server_started(self, info: dict) -> None:
        self.window.status.serving(info["url"])

    def _server_stopped(self, *_args) -> None:
        self.window.status.serving(None)

    # --- settings -------------------------------------------------------------------------------
    def apply_settings(self, new: AppSettings) -> None:
        """Save new settings and apply them: reload the model, or change speculation, as needed."""
        window = self.window
        change = what_changed(window.settings, new)
        window.store_settings(new)
        if change == "reload":
            self.load_models()
        elif change == "speculation":
            window.engine.apply_speculation(new.decoder_settings())
        window.tools.tell_lab()

    def use_models(self, target: str, draft: str | None) -> None:
        """The Models dialog's choice: a target, and a draft for it or none."""
        s = self.window.settings
        changes: dict[str, object] = {"model": target or EMBEDDED, "draft": draft}
        if draft:  # a pair: lookup and its draft, chosen per step
            changes.update(method="auto", speculation=True)
        elif s.method in DRAFT_METHODS:
            changes.update(method="lookup")
        try:
            self.apply_settings(s.merged(changes).validated())
        except InvalidSettingError as exc:
            self.window.notices.show_notice(f"Those models could not be used: {exc}", "error")

    def apply_recommendation(self, changes: dict) -> None:
        """The lab's recommendation, applied to the chat."""
        changes = dict(changes)
        if changes.get("method") in ("draft", "lookup", "auto"):
            changes.setdefault("speculation", True)
        try:
            new = self.window.settings.merged(changes).validated()
        except (InvalidSettingError, TypeError) as exc:
            self.window.notices.show_notice(f"The lab's recommendation could not be applied: {exc}", "error")
            return
        self.apply_settings(new)
        shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in changes.items())
        self.window.notices.show_notice(
            f"Applied the lab's recommendation ({shown}); it takes effect from the next response.", "info", key="lab"
        )
