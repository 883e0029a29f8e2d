"""Tools and tool-call history for a chat prompt (OpenAI's `tools`, assistant `tool_calls`, `tool` messages).

A template that mentions `tools` (Qwen2.5, Llama 3.1+, Mistral, Hermes and most tool-trained GGUFs) gets them as
the `tools` variable and the messages as OpenAI sends them (assistant `tool_calls` with arguments as an object,
as Hugging Face's templates expect; `tool` messages with `tool_call_id`), all inside the template sandbox.

Any other template (SmolLM2's, Gemma's, a refused one, the plain transcript) gets plain messages: the tools described
in a system message in the Hermes / Qwen2.5 style, earlier calls written back as `<tool_call>` blocks in the
assistant's text and tool results as a user turn of `<tool_response>` blocks, which is how those models were trained
to see them. Such a model may still not call tools well; that is the model's limit, not hidden here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

_MENTIONS_TOOLS = re.compile(r"\btools\b")

FALLBACK_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
FALLBACK_HOW = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def mentions_tools(template: str | None) -> bool:
    """The template reads a `tools` variable (llama.cpp decides the same way, from the template's text)."""
    return bool(template) and _MENTIONS_TOOLS.search(template or "") is not None


def has_tool_parts(messages: Sequence[dict]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def arguments_value(arguments: str) -> Any:
    """A call's arguments as a template takes them: the JSON object they spell, else the text as sent."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    return value if isinstance(value, dict) else arguments


def template_messages(messages: Sequence[dict]) -> list[dict]:
    """Messages for a template that knows tools: OpenAI's shape, each call's arguments as an object."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": arguments_value(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def fallback_system(tools: Sequence[dict], choice: str | None = None) -> str:
    text = FALLBACK_INTRO + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + FALLBACK_HOW
    if choice == "required":
        text += "\n\nAnswer with at least one function call."
    elif choice:
        text += f"\n\nAnswer by calling the function {choice}."
    return text


def plain_messages(messages: Sequence[dict], tools: Sequence[dict] | None, choice: str | None = None) -> list[dict]:
    """role/content messages for a template (or format) that knows no tools: see the module docstring."""
    out: list[dict] = []
    if tools:
        described = fallback_system(tools, choice)
        if messages and messages[0].get("role") == "system":
            first = messages[0]["content"]
            out.append({"role": "system", "content": f"{first}\n\n{described}" if first else described})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": described})
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_responses"):  # results of one turn's calls share one user turn, as Qwen's
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_responses": True})
            continue
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                "<tool_call>\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": arguments_value(c["function"]["arguments"])},
                    ensure_ascii=False,
                )
                + "\n</tool_call>"
                for c in m["tool_calls"]
            )
            content = f"{content}\n{calls}" if content else calls
        out.append({"role": role, "content": content})
    return [{"role": m["role"], "content": m["content"]} for m in out]


def hide_strings(value: Any, hide: Callable[[str], str]) -> Any:
    """value with every string in it (keys too) passed through hide: control-token text in a tool's schema or a
    call's arguments is hidden as message text is (chat_format._Hidden), so it never becomes a control token."""
    if isinstance(value, str):
        return hide(value)
    if isinstance(value, list):
        return [hide_strings(v, hide) for v in value]
    if isinstance(value, dict):
        return {hide(k) if isinstance(k, str) else k: hide_strings(v, hide) for k, v in value.items()}
    return value


def tool_text_size(messages: Sequence[dict], tools: Sequence[dict] | None) -> list[str]:
    """The text tools and calls add to a prompt, for the size checks that count message text."""
    texts = [json.dumps(tools, ensure_ascii=False)] if tools else []
    for m in messages:
        for c in m.get("tool_calls") or ():
            texts.append(c["function"]["name"] + c["function"]["arguments"])
    return texts
