"""A request's body, from bytes to a JSON object, where every way a client can get it wrong is a 4xx in OpenAI's
error shape, never the 500 an exception escaping a route becomes (issue 63): a Content-Length over the limit or
not a number, a body that stops coming or passes the limit (413), bytes that are not UTF-8, JSON that is not
valid or nests deeper than the parser's recursion allows, and a body that is not an object (400)."""

from __future__ import annotations

import json
import sys
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .api_schema import ApiError, checked_text


def declared_length(value: str | None) -> int | None:
    """A Content-Length header's byte count; None when absent. Only ASCII digits count ('²'.isdigit() is true)."""
    if value is None:
        return None
    value = value.strip()
    if not (value.isascii() and value.isdigit()):
        raise ApiError(
            400,
            f"Content-Length {value[:40]!r} is not a byte count.",
            code="bad_content_length",
            headers={"Connection": "close"},
        )
    # More digits than any size: int() of over 4,300 digits raises, so such a count is "too large" unread.
    return int(value) if len(value) <= 18 else sys.maxsize


def too_large(size: int | None, cap: int) -> ApiError:
    said = f"{size:,} bytes" if size is not None else "over the limit"
    return ApiError(
        413,
        f"The request body is {said}; this server takes at most {cap:,}.",
        code="request_too_large",
        headers={"Connection": "close"},
    )


async def read_capped(request: Request, cap: int) -> bytes | None:
    """The body, or None as soon as it passes cap bytes (what came is dropped, the rest never read)."""
    parts, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                return None
            parts.append(chunk)
    except ClientDisconnect:  # nobody reads this answer; the record says why the request ended
        raise ApiError(499, "The client closed the connection before its body arrived.") from None
    return b"".join(parts)


_KINDS = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object with a text-or-absent `model`. On a worker thread: a few MB is tens of ms."""
    try:
        body = json.loads(raw)
    except RecursionError:  # e.g. 100,000 '[': the C parser recurses once per level
        raise ApiError(400, "The request body nests JSON arrays or objects too deeply.") from None
    except (ValueError, UnicodeDecodeError) as exc:  # bad bytes, bad JSON, an integer of over 4300 digits
        raise ApiError(400, f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"The request body must be a JSON object, not {_KINDS.get(type(body), 'that')}.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model': expected a string", param="model")
    if model is not None:
        checked_text(model, "model")
    return body
