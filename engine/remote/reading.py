"""Reading what a server sends without trusting it: a body to a cap and a deadline, a person's message for an
HTTP error or a failed connection with the server's own words cut short. The remote client's quick calls
(client.py) and its answers (answer_stream.py) both read through these."""

from __future__ import annotations

import time

import httpx

from .. import text_rules
from ..errors import EngineError

CONNECT_TIMEOUT_S = 10.0
MIB = 1 << 20
MAX_ERROR_BYTES = 64 << 10  # an error's body: only its message is shown
MAX_SHOWN_CHARS = 300  # of a server's own words in a message


def read_capped(response: httpx.Response, limit: int, deadline: float | None = None) -> tuple[bytes, bool]:
    """Up to limit bytes of response's body, and whether it had more (which is not read); TimeoutError once
    time.monotonic() passes deadline (a server sending a byte now and then restarts httpx's read timeout)."""
    body = bytearray()
    for data in response.iter_bytes():
        body += data
        if len(body) > limit:
            return bytes(body[:limit]), True
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError
    return bytes(body), False


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def reach_error(url: str, exc: httpx.HTTPError) -> EngineError:
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE" in str(exc).upper():
        return EngineError(
            f"{url}'s certificate could not be verified ({exc}): SpecChat only talks to https "
            "servers whose certificate checks out."
        )
    if isinstance(exc, httpx.ConnectError):
        return EngineError(f"Could not reach {url} ({exc}). Is the server running, and the address right?")
    if isinstance(exc, httpx.TimeoutException):
        return EngineError(f"{url} did not answer in time ({type(exc).__name__}).")
    return EngineError(f"The connection to {url} failed: {type(exc).__name__}: {cut(str(exc), MAX_SHOWN_CHARS)}")


def status_error(url: str, status: int, text: str) -> str:
    """A person's message for an HTTP error, with the server's own words where it gave some (the body is read to
    MAX_ERROR_BYTES, the words cut to MAX_SHOWN_CHARS)."""
    said = text.strip()
    try:
        body = text_rules.loads(said)
        error = body.get("error", body) if isinstance(body, dict) else body
        said = error.get("message") or error.get("detail") or said if isinstance(error, dict) else str(error)
    except ValueError:
        pass
    said = cut(" ".join(str(said).split()), MAX_SHOWN_CHARS)
    if status == 401 or status == 403:
        return f"{url} refused the API key (HTTP {status}). Set the right key in the chat's settings. {said}".strip()
    return f"{url} answered HTTP {status}" + (f": {said}" if said else ".")
