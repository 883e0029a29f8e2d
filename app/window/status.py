"""What the main window's status bar says: the model (loading, loaded, none), what the engine is busy with,
speculation, the server, and the open chat's remote engine. The words only: app/status_bar.py lays them out."""

from __future__ import annotations

from app.notices import NoticeArea
from app.settings.values import METHOD_LABELS
from app.status_bar import StatusBar
from engine.methods import DRAFT_METHODS
from engine.remote.endpoint import Endpoint


class WindowStatus:
    def __init__(self, bar: StatusBar, notices: NoticeArea):
        self.bar, self.notices = bar, notices

    def busy(self, busy: bool) -> None:
        """The progress bar shows while a model loads or the engine works on something."""
        self.bar.progress.setVisible(busy)

    def working(self, what: str) -> None:
        """What the engine works on that a message sent now would wait for (timing its steps); "" when done."""
        if what:
            self.bar.showMessage(what)
        else:
            self.bar.clearMessage()

    def loading(self, what: str) -> None:
        self.bar.progress.show()
        self.bar.model_label.setText(f"Loading {what}…")

    def loaded(self, info: dict) -> None:
        fmt = "chat template" if info["chat_template"] else "plain transcript format (no chat template)"
        self.bar.model_label.setText(f"{info['name']}  ·  {info['backend']}  ·  {info['n_ctx']} ctx  ·  {fmt}")
        self.bar.model_label.setToolTip(info["path"])

    def no_model(self) -> None:
        self.bar.progress.hide()
        self.bar.model_label.setText("No model loaded")
        self.bar.spec_label.setText("")

    def speculation(self, info: dict) -> None:
        method = info.get("method", "none")
        text = f"Speculation: {METHOD_LABELS.get(method, method).lower()}"
        if method in DRAFT_METHODS and info.get("draft_name"):
            text += f" ({info['draft_name']})"
        self.bar.spec_label.setText(text)

    def serving(self, url: str | None) -> None:
        """The server's address while it serves; None once it stopped."""
        if url is None:
            self.bar.server_label.hide()
            return
        self.bar.server_label.setText(f"Serving at {url}")
        self.bar.server_label.show()

    def chat_engine(self, remote: Endpoint | None) -> None:
        """The model and speculation shown are this machine's; a chat on a server says so beside them."""
        label = self.bar.engine_label
        label.setText(f"This chat: remote engine at {remote.host}" if remote else "")
        label.setToolTip(
            f"{remote.url} answers this chat (its chat settings); the model and "
            "speculation on the left are this machine's."
            if remote
            else ""
        )
        label.setVisible(remote is not None)
        self.notices.set_hidden("embedded", remote is not None)  # the demo model does not answer this chat
