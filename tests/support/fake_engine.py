"""EngineClient as the chat uses it and nothing else: generate() records the request, and the test plays the
engine's signals (the chat controller's tests and the answer path's one-send test share it)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.answers import GenerationRequest


class FakeEngine(QObject):
    started = Signal(int)
    progress = Signal(int, object, object)
    finished = Signal(int, object)
    failed = Signal(int, str, object)

    def __init__(self):
        super().__init__()
        self.sent: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> GenerationRequest:
        self.sent.append(request)
        return request

    def answer(self, text: str, **stats) -> None:
        """The last request answered with text, then finished."""
        rid = self.sent[-1].id
        self.progress.emit(rid, [(text, False)], {"generated": 1})
        self.finished.emit(rid, {"finish_reason": "stop", **stats})
