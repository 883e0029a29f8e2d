"""Chat messages → prompt tokens for one model, trimmed to fit its context.

A model with a chat template in its GGUF metadata is formatted by llama-cpp-python's own
Jinja2ChatFormatter, with the model's BOS/EOS token text, exactly as llama-cpp-python's chat
completion does. A model without one (the embedded Gemma 270M is a base model with none) gets
the documented fallback transcript below, which a base model simply continues:

    <system prompt, or FALLBACK_PREAMBLE when there is none>

    User: <message>
    Assistant: <reply>
    User: <message>
    Assistant:

The answer stops at the model's end-of-generation token or where it starts the next turn itself
("\\nUser:" / "\\nAssistant:").

When the conversation does not fit, the oldest turns are left out (never the system prompt or the
newest message) and `trimmed` says how many; when even the newest message cannot fit, this raises
ContextOverflowError with a message for a person.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from .errors import ContextOverflowError, EngineError

FALLBACK_STOPS = ("\nUser:", "\nAssistant:")
FALLBACK_PREAMBLE = "A conversation between a user and a helpful, knowledgeable assistant."
ROLES = ("system", "user", "assistant")


class _Tokenizer(Protocol):
    n_ctx: int
    bos: int
    eos: int
    adds_bos: bool

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]: ...
    def token_text(self, token: int) -> bytes: ...
    def chat_template(self) -> str | None: ...


@dataclass
class ChatPrompt:
    tokens: list[int]
    text: str
    stop: tuple[str, ...] = ()
    trimmed: int = 0  # messages left out from the start of the conversation
    uses_template: bool = True
    notices: list[str] = field(default_factory=list)


def fallback_prompt(messages: Sequence[dict]) -> str:
    """The transcript format for models without a chat template (see the module docstring)."""
    system = next((m["content"].strip() for m in messages if m["role"] == "system"), "")
    parts: list[str] = [(system or FALLBACK_PREAMBLE) + "\n\n"]
    for m in messages:
        if m["role"] != "system":
            who = "User" if m["role"] == "user" else "Assistant"
            parts.append(f"{who}: {m['content'].strip()}\n")
    parts.append("Assistant:")
    return "".join(parts)


class ChatFormatter:
    """Formats conversations for one loaded model."""

    def __init__(self, model: _Tokenizer):
        self.model = model
        self.template = model.chat_template()
        self._jinja = None
        self.template_error: str | None = None
        if self.template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            self._bos_text = _text(model, model.bos)
            eos_text = _text(model, model.eos)
            try:
                self._jinja = Jinja2ChatFormatter(template=self.template, eos_token=eos_text,
                                                  bos_token=self._bos_text, add_generation_prompt=True)
            except Exception as exc:  # a template jinja2 cannot parse: use the fallback, say so
                self._jinja = None
                self.template_error = f"The model's chat template could not be read ({exc}); using a plain format."
            self._stops = (eos_text,) if eos_text else ()

    @property
    def uses_template(self) -> bool:
        return self._jinja is not None

    def render(self, messages: Sequence[dict]) -> tuple[str, list[int], tuple[str, ...]]:
        """Prompt text, tokens and stop strings for these messages, untrimmed."""
        _check(messages)
        if self._jinja is None:
            text = fallback_prompt(messages)
            return text, self.model.tokenize(text, add_bos=self.model.adds_bos, special=False), FALLBACK_STOPS
        try:
            result = self._jinja(messages=[{"role": m["role"], "content": m["content"]} for m in messages])
        except Exception as exc:  # templates raise for e.g. roles they do not support
            raise EngineError(f"The model's chat template rejected this conversation: {exc}") from exc
        text = result.prompt
        # The template writes BOS itself when it wants one (llama-cpp-python tokenizes with add_bos=False);
        # a template that forgets it, for a model that needs one, still gets exactly one.
        tokens = self.model.tokenize(text, add_bos=False, special=True)
        if self.model.adds_bos and (not tokens or tokens[0] != self.model.bos):
            tokens.insert(0, self.model.bos)
        return text, tokens, self._stops

    def prompt(self, messages: Sequence[dict], reserve: int) -> ChatPrompt:
        """Tokens for messages, leaving out the oldest turns until `reserve` tokens remain for the answer."""
        messages = list(messages)
        system = [m for m in messages[:1] if m["role"] == "system"]
        turns = messages[len(system):]
        if not turns or turns[-1]["role"] != "user":
            raise EngineError("There is no user message to answer.")
        budget = self.model.n_ctx - reserve
        # Kept parts start at a user turn; fewer turns never need more tokens, so search the start.
        starts = [i for i, m in enumerate(turns) if m["role"] == "user"]
        lo, hi, best = 0, len(starts) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            rendered = self.render(system + turns[starts[mid]:])
            if len(rendered[1]) <= budget:
                best, hi = (starts[mid], rendered), mid - 1
            else:
                lo = mid + 1
        if best is None:
            raise ContextOverflowError(
                f"Your message is {len(rendered[1])} tokens with the system prompt, and the {self.model.n_ctx}-token "
                f"context must keep {reserve} tokens for the answer. Shorten the message, lower "
                "'Max response tokens', or raise the context size in Settings."
            )
        trimmed, (text, tokens, stops) = best
        prompt = ChatPrompt(tokens=tokens, text=text, stop=stops, trimmed=trimmed, uses_template=self.uses_template)
        if trimmed:
            prompt.notices.append(
                f"The {trimmed} oldest message{'s' if trimmed != 1 else ''} of this conversation did not fit the "
                f"{self.model.n_ctx}-token context and {'were' if trimmed != 1 else 'was'} left out of what the "
                "model sees (they stay saved here)."
            )
        return prompt


def _check(messages: Sequence[dict]) -> None:
    for m in messages:
        if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise EngineError(f"Malformed chat message: {m!r}")


def _text(model: _Tokenizer, token: int) -> str:
    if token is None or token < 0:
        return ""
    return model.token_text(token).decode("utf-8", "replace")
