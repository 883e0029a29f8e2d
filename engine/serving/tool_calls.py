"""OpenAI's tool calling on /v1/chat/completions: `tools`, `tool_choice` and `parallel_tool_calls` checked here,
history messages with `tool_calls` and `tool` turns checked here, and the model's answer read back into
`tool_calls` (whole, or streamed as OpenAI streams them).

The tools reach the model through its own chat template (engine/chat_format/tool_prompt.py). What it writes is read
in the formats models are trained on:
  - Hermes / Qwen2.5 / SmolLM2-style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number;
  - Llama 3.x: `<|python_tag|>{"name": ..., "parameters": {...}}` (`;` between calls), or the whole answer one
    such JSON object;
  - Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or v11's `[TOOL_CALLS]name[ARGS]{...}`.
A marker that is a control token in the model's vocabulary is not in the answer's text (the engine writes control
tokens as nothing), so a whole answer that is a JSON call object, or a list of them, naming only declared tools,
counts too. A call is the model's words: its JSON is parsed, never run; a block that does not parse as a call
(no name, arguments not an object) stays in `content` as written.

Nothing constrains what the model writes: `tool_choice: "required"` or a named function is asked for in the prompt
only, and an answer that does not follow it comes back as it is, with a `warnings` entry saying so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .api_schema import ApiError, checked_text, shown
from .tool_call_reading import (
    _READERS,
    HERMES_CLOSE,
    HERMES_OPEN,
    MARKERS,
    Answer,
    _hermes,
    _Outside,
    could_be_bare,
    parse_answer,
)

MAX_TOOLS = 128  # as OpenAI allows
MAX_TOOLS_CHARS = 256 * 1024  # all tools' JSON: a prompt's worth of schema, far beyond any real tool set
MAX_SCHEMA_DEPTH = 32  # nesting of one tool's parameters schema
MAX_TOOL_CALLS = 128  # calls in one history message
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
CHOICE_SHAPE = '"auto", "none", "required" or {"type": "function", "function": {"name": ...}}'


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}': {message}", param=param)


@dataclass
class ToolRequest:
    """A request's tools, checked. choice: "auto", "none", "required", or a function's name."""

    tools: list[dict[str, Any]]
    choice: str = "auto"
    parallel: bool = True

    @property
    def active(self) -> bool:
        """The tools are rendered and the answer read for calls ("none": neither)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    @property
    def asked(self) -> str | None:
        """What the fallback prompt says the answer must do: "required", a name, or nothing."""
        return None if self.choice == "auto" else self.choice


def parse_tools(body: dict[str, Any], chat: bool = True) -> ToolRequest | None:
    """The request's tools, or None when it has none; a 400 naming what is wrong. chat: /v1/chat/completions
    (/v1/completions takes no tools)."""
    if not chat:
        for name in ("tools", "tool_choice", "functions"):
            if body.get(name):
                raise _bad(name, "is for /v1/chat/completions (a raw prompt has no template to write tools in)")
        return None
    if body.get("functions") or body.get("function_call"):
        name = "functions" if body.get("functions") else "function_call"
        raise _bad(name, "the deprecated functions API is not supported; send 'tools' and 'tool_choice'")
    raw = body.get("tools")
    choice_raw = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", f"expected true or false, got {shown(parallel)}")
    if raw is None or raw == []:
        if choice_raw not in (None, "none", "auto"):
            raise _bad("tool_choice", "needs 'tools'")
        return None
    if not isinstance(raw, list):
        raise _bad("tools", f"expected a list of tools, got {shown(raw)}")
    if len(raw) > MAX_TOOLS:
        raise _bad("tools", f"{len(raw):,} tools; at most {MAX_TOOLS}")
    try:
        size = len(json.dumps(raw, ensure_ascii=False))
    except (ValueError, RecursionError):
        raise _bad("tools", "cannot be written as JSON") from None
    if size > MAX_TOOLS_CHARS:
        raise _bad("tools", f"{size:,} characters of JSON; at most {MAX_TOOLS_CHARS:,}")
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(raw)]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise _bad("tools", "two tools have the same name")
    return ToolRequest(tools, _choice(choice_raw, set(names)), parallel is not False)


def _tool(tool: object, param: str) -> dict[str, Any]:
    shape = '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {JSON schema}}}'
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise _bad(param, f"expected {shape}, got {shown(tool)}")
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _bad(f"{param}.function.name", f"expected 1 to 64 letters, digits, _ or -, got {shown(name)}")
    out: dict[str, Any] = {"name": name}
    description = fn.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise _bad(f"{param}.function.description", f"expected text, got {shown(description)}")
        out["description"] = checked_text(description, f"{param}.function.description")
    parameters = fn.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise _bad(f"{param}.function.parameters", f"expected a JSON schema object, got {shown(parameters)}")
        if _depth(parameters) > MAX_SCHEMA_DEPTH:
            raise _bad(f"{param}.function.parameters", f"nested deeper than {MAX_SCHEMA_DEPTH} levels")
        _check_strings(parameters, f"{param}.function.parameters")
        out["parameters"] = parameters
    if fn.get("strict") is not None:
        if not isinstance(fn["strict"], bool):
            raise _bad(f"{param}.function.strict", f"expected true or false, got {shown(fn['strict'])}")
        out["strict"] = fn["strict"]
    return {"type": "function", "function": out}


def _depth(value: object) -> int:
    depth, level = 0, [value]
    while level:  # breadth first: no recursion for a client to exhaust
        depth += 1
        if depth > MAX_SCHEMA_DEPTH:
            return depth
        level = [v for x in level if isinstance(x, (dict, list)) for v in (x.values() if isinstance(x, dict) else x)]
    return depth


def _check_strings(value: object, param: str) -> None:
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            checked_text(x, param)
        elif isinstance(x, dict):
            stack += [*x.keys(), *x.values()]
        elif isinstance(x, list):
            stack += x


def _choice(choice: object, names: set[str]) -> str:
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return str(choice)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if isinstance(name, str) and name in names:
            return name
        raise _bad("tool_choice", f"names {shown(name)}, which is not one of the tools")
    raise _bad("tool_choice", f"expected {CHOICE_SHAPE}, got {shown(choice)}")


# --- history messages ---------------------------------------------------------------------------------
def history_message(m: dict[str, Any], i: int, content: object) -> dict[str, Any]:
    """An assistant message with `tool_calls` (content may be null) or a `tool` message, checked; content: the
    message's text as api_schema read it."""
    param = f"messages[{i}]"
    if m["role"] == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(
                f"{param}.tool_call_id", f"a tool message needs the id of the call it answers, got {shown(call_id)}"
            )
        if not isinstance(content, str):
            raise _bad(f"{param}.content", f"expected the tool's result as text, got {shown(content)}")
        return {"role": "tool", "tool_call_id": checked_text(call_id, f"{param}.tool_call_id"), "content": content}
    calls = m.get("tool_calls")
    if not isinstance(calls, list) or not calls or len(calls) > MAX_TOOL_CALLS:
        raise _bad(f"{param}.tool_calls", f"expected a list of 1 to {MAX_TOOL_CALLS} calls, got {shown(calls)}")
    out = []
    for j, c in enumerate(calls):
        where = f"{param}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not (
            isinstance(c, dict)
            and c.get("type", "function") == "function"
            and isinstance(c.get("id"), str)
            and isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments"), str)
        ):
            raise _bad(
                where,
                f'expected {{"id": ..., "type": "function", "function": {{"name": ..., "arguments": "{{...}}"}}}}, got {shown(c)}',
            )
        out.append(
            {
                "id": checked_text(c["id"], f"{where}.id"),
                "type": "function",
                "function": {
                    "name": checked_text(fn["name"], f"{where}.function.name"),
                    "arguments": checked_text(fn["arguments"], f"{where}.function.arguments"),
                },
            }
        )
    if content is not None and not isinstance(content, str):
        raise _bad(f"{param}.content", f"expected text or null, got {shown(content)}")
    return {"role": "assistant", "content": content or "", "tool_calls": out}


# --- the response ---------------------------------------------------------------------------------------
def settle(answer: Answer, request: ToolRequest, reason: str | None) -> tuple[Answer, str | None, list[str]]:
    """The answer as it goes out: calls beyond the first dropped when parallel calls are off, the finish reason
    ("tool_calls" for an answer that ended with calls), and warnings for what the request asked and did not get."""
    warnings = []
    if not request.parallel and len(answer.calls) > 1:
        warnings.append(
            f"The model wrote {len(answer.calls)} tool calls and parallel_tool_calls is false: only the first is "
            "returned."
        )
        answer = Answer(answer.content, answer.calls[:1])
    if answer.calls and reason == "stop":
        reason = "tool_calls"
    if request.choice == "required" and not answer.calls:
        warnings.append(
            "tool_choice is 'required' but the model answered without a tool call (this server does not constrain "
            "the answer to one)."
        )
    elif request.asked not in (None, "required") and (
        not answer.calls or any(c["function"]["name"] != request.choice for c in answer.calls)
    ):
        warnings.append(
            f"tool_choice names {request.choice} but the model did not call only it (this server does not "
            "constrain the answer)."
        )
    return answer, reason, warnings


def message(answer: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.calls:
        out["tool_calls"] = answer.calls
    return out


class CallStream:
    """An answer's text, streamed: content deltas as they come, less any text that may still become a call
    (a marker's start, a whole answer that may be a bare call object), and each call's deltas once it is whole:
    {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments": ""}}]} then its arguments, as
    OpenAI streams them. The calls and content streamed are those parse_answer reads from the whole text."""

    def __init__(self, request: ToolRequest):
        self.request = request
        self.text = ""  # all of it so far
        self.done = 0  # text[:done] is settled: shown as content, or read as calls
        self.outside = _Outside()
        self.sent = 0  # calls sent
        self.bare = True  # nothing shown yet, and the text so far may be a bare call answer

    def push(self, text: str) -> list[dict[str, Any]]:
        self.text += text
        if self.bare and could_be_bare(self.text):
            return []
        self.bare = False
        return self._settle(final=False)

    def end(self) -> list[dict[str, Any]]:
        if self.bare:
            answer = parse_answer(self.text, self.request.names)
            if answer.content:
                self.outside.text(answer.content)
            if answer.calls:
                self.outside.call(answer.calls)
            self.outside.end()
            return self._drain()
        return self._settle(final=True)

    def _settle(self, final: bool) -> list[dict[str, Any]]:
        while True:
            found = [(i, m) for m in MARKERS if (i := self.text.find(m, self.done)) >= 0]
            if not found:
                keep = len(self.text) if final else _safe_end(self.text, self.done)
                self.outside.text(self.text[self.done : keep])
                self.done = keep
                if final:
                    self.outside.end()
                return self._drain()
            start, marker = min(found)
            self.outside.text(self.text[self.done : start])
            self.done = start
            if marker == HERMES_OPEN:  # a block ends at its close: its call goes out then
                close = self.text.find(HERMES_CLOSE, start)
                if close < 0 and not final:
                    return self._drain()
                read = _hermes(self.text[: close + len(HERMES_CLOSE)] if close >= 0 else self.text, start)
            elif not final:  # Llama's and Mistral's calls run to the answer's end
                return self._drain()
            else:
                read = _READERS[marker](self.text, start)
            if read is None:
                self.outside.text(marker)
                self.done = start + len(marker)
                continue
            self.outside.call(read[0])
            self.done = read[1]

    def _drain(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"content": text} for text in self.outside.out]
        self.outside.out = []
        limit = len(self.outside.calls) if self.request.parallel else min(1, len(self.outside.calls))
        for index in range(self.sent, limit):
            call = self.outside.calls[index]
            fn = call["function"]
            first = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": fn["name"], "arguments": ""},
            }
            out.append({"tool_calls": [first]})
            out.append({"tool_calls": [{"index": index, "function": {"arguments": fn["arguments"]}}]})
        self.sent = max(self.sent, limit)
        return out

    def settled(self, reason: str | None) -> tuple[str | None, list[str]]:
        """The finish reason and warnings once the stream has ended (as settle() gives them whole)."""
        answer = Answer(self.outside.shown or None, self.outside.calls)
        _, reason, warnings = settle(answer, self.request, reason)
        return reason, warnings


def _safe_end(text: str, start: int) -> int:
    """Where text can be shown up to: before a tail that may be the start of a marker."""
    for cut in range(max(start, len(text) - max(map(len, MARKERS)) + 1), len(text)):
        tail = text[cut:]
        if any(m.startswith(tail) for m in MARKERS):
            return cut
    return len(text)


def chat_texts(messages: Sequence[dict[str, Any]], request: ToolRequest | None) -> list[str]:
    """Text tools and calls add to a conversation, for the server's size check before templating."""
    texts = [json.dumps(request.tools, ensure_ascii=False)] if request and request.active else []
    for m in messages:
        for c in m.get("tool_calls") or ():
            texts.append(c["function"]["name"] + c["function"]["arguments"])
    return texts
