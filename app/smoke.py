"""--smoke-test: the real window sends one message (a built-in passage to copy, or --prompt TEXT) to the
embedded model with prompt lookup, or with --engine-url to that server, and prints the response's figures, its
text and the model's name as one JSON line. Exit 0 on success, 1 on any failure, 2 on timeout."""

from __future__ import annotations

import json
import sys

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

from app.remote_answer import use_key_for_this_run
from app.settings.values import AppSettings
from engine.remote.endpoint import Endpoint

# Copying a passage gives prompt lookup real material, so the figures show speculation at work.
PROMPT = (
    "Passage: The lighthouse at Point Arden was built in 1871 from granite quarried on the island itself. "
    "For ninety years its keepers climbed one hundred and twelve steps every evening to light the lamp.\n\n"
    "Copy the passage above word for word."
)
KEYS = (
    "tokens_per_s",
    "ttft_s",
    "drafted",
    "accepted",
    "acceptance_rate",
    "mean_acceptance_length",
    "memory_bytes",
    "memory_kind",
    "memory_label",
    "backend",
    "speedup_vs_plain",
    "guard",
)


def smoke_settings() -> AppSettings:
    # The default embedded model (SmolLM2-135M-Instruct), greedy so that the same prompt gets the same answer.
    return AppSettings(model="embedded", speculation=True, method="lookup", temperature=0.0, max_tokens=96, n_ctx=2048)


class SmokeTest(QObject):
    def __init__(self, window, timeout_s: float, prompt: str | None = None, engine: Endpoint | None = None):
        super().__init__(window)
        self.window = window
        self.prompt = prompt or PROMPT
        self.engine = engine
        self.done = False
        if engine is None:  # a remote engine answers whatever this machine's model does
            window.modelFailed.connect(lambda msg: self._fail(f"model failed to load: {msg}"))
        elif engine.api_key:
            use_key_for_this_run(engine.url, engine.api_key)
        window.session.responseFinished.connect(self._finished)
        window.session.responseFailed.connect(lambda msg: self._fail(f"response failed: {msg}"))
        QTimer.singleShot(int(timeout_s * 1000), lambda: self._fail(f"no answer within {timeout_s:.0f} s", code=2))
        QTimer.singleShot(0, self._send)

    def _send(self) -> None:
        self.window.new_chat()
        if self.engine is not None:
            self.window.session.set_conversation_settings(
                {"engine_url": self.engine.url, "engine_model": self.engine.model}
            )
        if not self.window.session.send(self.prompt):
            self._fail("the message could not be sent")

    def _finished(self, stats: dict) -> None:
        items = self.window.session.model.items
        shown = self.window.view.widget_for(len(items) - 1)
        text = items[-1].content if items else ""
        if not text.strip() or shown is None or not shown.text.toPlainText().strip():
            return self._fail("the response has no text in the window")
        if (stats.get("generated") or 0) < 2:
            return self._fail(f"only {stats.get('generated')} token(s) generated: no speed can be measured")
        out = {k: stats.get(k) for k in KEYS}
        out.update(
            generated=stats.get("generated"),
            method=stats.get("method"),
            exact_greedy=self.window.settings.exact_greedy,
            finish_reason=stats.get("finish_reason"),
            text=text,
            model=items[-1].model if self.engine else self.window.session.model_name,
        )
        print(json.dumps(out), flush=True)
        self._exit(0)

    def _fail(self, why: str, code: int = 1) -> None:
        if self.done:
            return
        print(f"smoke test failed: {why}", file=sys.stderr, flush=True)
        self._exit(code)

    def _exit(self, code: int) -> None:
        self.done = True
        self.window.close()
        QApplication.exit(code)
