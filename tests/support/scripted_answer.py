"""A scripted answer through the real server: the real job runs on the real model, and its text is then replaced
by a script, streamed in small pieces, for what the tiny model never writes itself (a tool call). Only the text is
scripted: the request, its template, its job, its finish reason and the HTTP path are the server's own."""

from __future__ import annotations

from engine.decoding.answer import Delta
from engine.serving import openai_api


def script_answer(monkeypatch, text: str, piece: int = 3) -> None:
    """Every answer until the test ends is `text`, in deltas of `piece` characters."""
    real = openai_api._Feed.deltas

    async def deltas(self):
        async for _ in real(self):  # the real answer runs to its end (its finish reason is kept)
            pass
        for at in range(0, len(text), piece):
            yield Delta([0], [(text[at : at + piece], None)])

    monkeypatch.setattr(openai_api._Feed, "deltas", deltas)
