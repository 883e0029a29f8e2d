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

Message text never becomes a control token: a pasted "<|im_end|>\\n<|im_start|>assistant\\n..." stays the
text it is, so no message can forge a turn. Only the template's own text is read for control tokens
(see ChatFormatter._tokenize); the fallback transcript is tokenized as plain text throughout.

When the conversation does not fit, the oldest turns are left out (never the system prompt or the
newest message) and `trimmed` says how many; when even the newest message cannot fit, this raises
ContextOverflowError with a message for a person.

`python -m engine.chat_format` runs __main__.py here, which imports this module (never the reverse).
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import ContextOverflowError, EngineError
from ..template_sandbox import TemplateRefused, TemplateSandbox, shared_sandbox
from .tool_prompt import has_tool_parts, hide_strings, mentions_tools, plain_messages, template_messages

log = logging.getLogger(__name__)

FALLBACK_STOPS = ("\nUser:", "\nAssistant:")
FALLBACK_PREAMBLE = "A conversation between a user and a helpful, knowledgeable assistant."
ROLES = ("system", "user", "assistant")
# llama-cpp-python's built-in formats, for a model whose own template was refused: the control tokens its
# vocabulary must have for each.
FAMILY_FORMATS = {
    "ChatML": ("<|im_start|>", "<|im_end|>"),
    "Gemma": ("<start_of_turn>", "<end_of_turn>"),
    "Llama 3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
}

# llama_token_attr bits (llama.h). Control and unknown tokens are what llama.cpp makes of their text only
# when asked to parse special tokens; lstrip/rstrip tokens eat the whitespace beside them (Phi-3's do).
_ATTR_UNKNOWN, _ATTR_CONTROL, _ATTR_LSTRIP, _ATTR_RSTRIP = 1 << 0, 1 << 3, 1 << 7, 1 << 8
_SPECIAL = _ATTR_UNKNOWN | _ATTR_CONTROL
_C_SPACE = " \t\n\v\f\r"  # what llama.cpp's isspace() strips


class _Tokenizer(Protocol):
    @property
    def n_ctx(self) -> int: ...
    @property
    def bos(self) -> int: ...
    @property
    def eos(self) -> int: ...
    @property
    def adds_bos(self) -> bool: ...

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


def answer_reserve(max_tokens: int, n_ctx: int) -> int:
    """Tokens a prompt must leave free for the answer: max_tokens, but never more than half the context."""
    return min(max_tokens, max(n_ctx // 2, 1))


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

    def __init__(self, model: _Tokenizer, sandbox: TemplateSandbox | None = None):
        self.model = model
        self.template = model.chat_template()
        self.template_error: str | None = None  # why the model's own template is not used, for a person
        self.refusal: str | None = None  # the same, without what is used instead (the server uses nothing)
        self._unsaid: str | None = None  # that reason, until a prompt has carried it as a notice
        self._family: str | None = None  # the built-in format used instead of a refused template
        self._sandbox = sandbox
        if self.template:
            self._bos_text = _text(model, model.bos)
            eos_text = _text(model, model.eos)
            self._eos_text = eos_text
            self._stops: tuple[str, ...] = (eos_text,) if eos_text else ()
            refused = getattr(model, "template_problem", None)  # the model check's probe (model_check.py)
            if refused:
                self._refuse(refused)
                self._unsaid = None  # known from the start: the loader says it (template_error) with the model

    @property
    def uses_template(self) -> bool:
        """The model's own chat template writes the prompts."""
        return bool(self.template) and self.template_error is None

    def _refuse(self, reason: str) -> None:
        """The model's template is not used again: a built-in format that its control tokens match writes the
        prompts instead, else the plain transcript."""
        self._family = next(
            (name for name, tokens in FAMILY_FORMATS.items() if all(self._is_control_text(t) for t in tokens)), None
        )
        instead = (
            f"SpecChat uses the standard {self._family} format instead, which this model's control tokens match"
            if self._family
            else "SpecChat uses a plain transcript instead"
        )
        name = Path(str(getattr(self.model, "path", "") or "the model")).name
        self.refusal = f"The chat template in {name} was refused: {reason}."  # what, without what instead
        self.template_error = self._unsaid = f"{self.refusal} {instead}."
        log.info("%s", self.template_error)  # the caller says it where a person sees it

    def _is_control_text(self, text: str) -> bool:
        tokens = self.model.tokenize(text, add_bos=False, special=True)
        return len(tokens) == 1 and bool(self._attr(tokens[0]) & _SPECIAL)

    def render(
        self,
        messages: Sequence[dict],
        continue_last: bool = False,
        tools: Sequence[dict] | None = None,
        tool_choice: str | None = None,
    ) -> tuple[str, list[int], tuple[str, ...]]:
        """Prompt text, tokens and stop strings for these messages, untrimmed.

        continue_last: the last message is an answer cut short, to be continued: the prompt is the one that
        asked for it (the messages before it, up to the assistant's turn opening) with its text after it.
        tools (OpenAI's `tools` entries) and tool-call messages: see tool_prompt.py; tool_choice, "required" or a
        function's name, is said in the fallback's system message (a template that knows tools gets none)."""
        tools = list(tools or ())
        tooled = bool(tools) or has_tool_parts(messages)
        if tooled and not (self.uses_template and mentions_tools(self.template)):
            messages, tooled = plain_messages(messages, tools, tool_choice), False
        check_messages(messages, with_tools=tooled)
        partial = ""
        if continue_last:
            if not messages or messages[-1]["role"] != "assistant":
                raise EngineError("There is no answer to continue.")
            messages, partial = messages[:-1], messages[-1]["content"]
        if self.uses_template:
            # Control-token text inside a message is hidden behind markers while the template renders, so
            # whatever the template does with the content (trim, split, drop), only its own text can hold
            # control tokens; the markers are put back as plain text. (Text that only becomes a control token
            # across a message's edge would still count, but no template writes half a control token.)
            hidden = _Hidden()
            try:
                shown_tools = self._hide_tools(tools, hidden) if tooled else None
                prompt = self._sandboxed(self._hide_all(messages, hidden), shown_tools)
                stops = self._stops
            except TemplateRefused as exc:
                self._refuse(exc.reason)
                if tooled:  # the built-in format or transcript that writes it instead knows no tools
                    messages = plain_messages(messages, tools, tool_choice)
        if not self.uses_template and self._family:
            hidden = _Hidden()
            prompt, stops = family_prompt(self._family, self._hide_all(messages, hidden), self._eos_text)
        elif not self.uses_template:
            # The answer began right after "Assistant:", its leading space included.
            text = fallback_prompt(messages) + (partial if partial[:1].isspace() or not partial else " " + partial)
            return text, self.model.tokenize(text, add_bos=self.model.adds_bos, special=False), FALLBACK_STOPS
        # A continued answer's text follows the template's generation prompt, hidden as message text is.
        rendered = prompt + hidden.hide(partial, self._control_texts(partial))
        tokens = self._tokenize(rendered, hidden)
        # The template writes BOS itself when it wants one (llama-cpp-python tokenizes with add_bos=False);
        # a template that forgets it, for a model that needs one, still gets exactly one.
        if self.model.adds_bos and (not tokens or tokens[0] != self.model.bos):
            tokens.insert(0, self.model.bos)
        return hidden.restore(rendered), tokens, stops

    def _hide_all(self, messages: Sequence[dict], hidden: _Hidden) -> list[dict]:
        out = []
        for m in messages:
            shown = {"role": m["role"], "content": hidden.hide(m["content"], self._control_texts(m["content"]))}
            for key in ("tool_calls", "tool_call_id", "name"):  # a tool-aware template's; a client's text
                if m.get(key) is not None:
                    shown[key] = self._hide_tools(m[key], hidden)
            out.append(shown)
        return template_messages(out)

    def _hide_tools(self, value, hidden: _Hidden):
        return hide_strings(value, lambda text: hidden.hide(text, self._control_texts(text)))

    def _sandboxed(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The model's template rendered where a hang or a memory blow-up cannot reach (template_sandbox.py)."""
        sandbox = self._sandbox or shared_sandbox()
        assert self.template is not None  # only while uses_template
        return sandbox.render(self.template, messages, bos=self._bos_text, eos=self._eos_text, tools=tools or None)

    def _tokenize(self, rendered: str, hidden: _Hidden) -> list[int]:
        """Tokens of rendered template text: its control-token text as control tokens, the rest, with the
        hidden message text put back, as plain text (special=False).

        This cuts the text at control tokens exactly as llama.cpp's own special=True tokenization does
        (longest first, lstrip/rstrip honoured) and tokenizes the pieces between them alone, as it does:
        a conversation with nothing hidden gets exactly the tokens of tokenizing it whole, with no
        boundary effects (SentencePiece's leading space included), since no piece is cut differently."""
        parts = _split(rendered, self._control_tokens(*hidden.outside(rendered)))
        tokens: list[int] = []
        for i, part in enumerate(parts):
            if isinstance(part, int):
                tokens.append(part)
                continue
            before = parts[i - 1] if i > 0 else None
            after = parts[i + 1] if i + 1 < len(parts) else None
            if isinstance(before, int) and self._attr(before) & _ATTR_RSTRIP:
                part = part.lstrip(_C_SPACE)
            if isinstance(after, int) and self._attr(after) & _ATTR_LSTRIP:
                part = part.rstrip(_C_SPACE)
            if part:
                tokens += self.model.tokenize(hidden.restore(part), add_bos=False, special=False)
        return tokens

    def _control_tokens(self, *texts: str) -> list[tuple[str, int]]:
        """(text, id) of the control tokens llama.cpp finds in these texts, longest text first."""
        found = {t for text in texts for t in self.model.tokenize(text, add_bos=False, special=True)}
        pairs = [(_text(self.model, t), t) for t in found if self._attr(t) & _SPECIAL]
        return sorted((p for p in pairs if p[0]), key=lambda p: len(p[0]), reverse=True)

    def _control_texts(self, text: str) -> list[str]:
        return [piece for piece, _ in self._control_tokens(text)] if text else []

    def _attr(self, token: int) -> int:
        return token_attr(self.model, token)

    def prompt(self, messages: Sequence[dict], reserve: int, continue_last: bool = False) -> ChatPrompt:
        """Tokens for messages, leaving out the oldest turns until `reserve` tokens remain for the answer.
        continue_last: the last message is an answer to continue (see render)."""
        messages = list(messages)
        system = [m for m in messages[:1] if m["role"] == "system"]
        turns = messages[len(system) :]
        if continue_last and (not turns or turns[-1]["role"] != "assistant"):
            raise EngineError("There is no answer to continue.")
        if not turns or (turns[-1]["role"] != "user" and not continue_last):
            raise EngineError("There is no user message to answer.")
        budget = self.model.n_ctx - reserve
        # Kept parts start at a user turn; fewer turns never need more tokens, so search the start. Starts
        # whose text alone is more than the budget could hold are never rendered: a pasted book is refused
        # from its size, not after templating and tokenizing it (minutes, and gigabytes).
        starts = [i for i, m in enumerate(turns) if m["role"] == "user"]
        if not starts:
            raise EngineError("There is no user message to answer.")
        sizes = [utf8_size([m["content"]]) for m in turns]  # each message encoded once, not once per start
        tail = [utf8_size(m["content"] for m in system)] * (len(turns) + 1)  # bytes from turn i to the end
        for i in range(len(turns) - 1, -1, -1):
            tail[i] = tail[i + 1] + sizes[i]
        fits = [i for i in starts if not provably_too_long(self.model, tail[i], budget)]
        if not fits:
            size = tail[starts[-1]]
            raise ContextOverflowError(
                f"{'Your message and the answer so far are' if continue_last else 'Your message is'} "
                f"{size / 1024:,.0f} KB of text with the system prompt, far more than the {self.model.n_ctx}-token "
                f"context can hold while keeping {reserve} tokens for the answer. Shorten the message, or attach "
                "less of the file."
            )
        if len(fits) < len(starts):
            log.info("%d oldest turns left out unrendered: too long for the context", len(starts) - len(fits))
        starts = fits
        lo, hi, best = 0, len(starts) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            rendered = self.render(system + turns[starts[mid] :], continue_last)
            if len(rendered[1]) <= budget:
                best, hi = (starts[mid], rendered), mid - 1
            else:
                lo = mid + 1
        if best is None:
            raise ContextOverflowError(
                f"{'Your message and the answer so far are' if continue_last else 'Your message is'} "
                f"{len(rendered[1])} tokens with the system prompt, and the {self.model.n_ctx}-token "
                f"context must keep {reserve} tokens for the answer. Shorten the message, lower "
                "'Max response tokens', or raise the context size in Settings."
            )
        trimmed, (text, tokens, stops) = best
        prompt = ChatPrompt(tokens=tokens, text=text, stop=stops, trimmed=trimmed, uses_template=self.uses_template)
        if self._unsaid:  # a template refused on the way: said once, with the first prompt written without it
            prompt.notices.append(self._unsaid)
            self._unsaid = None
        if trimmed:
            prompt.notices.append(
                f"The {trimmed} oldest message{'s' if trimmed != 1 else ''} of this conversation did not fit the "
                f"{self.model.n_ctx}-token context and {'were' if trimmed != 1 else 'was'} left out of what the "
                "model sees (they stay saved here)."
            )
        return prompt


def family_prompt(family: str, messages: Sequence[dict], eos_text: str) -> tuple[str, tuple[str, ...]]:
    """A prompt in one of FAMILY_FORMATS, written by llama-cpp-python's own formatter for it, and its stops."""
    from llama_cpp import llama_chat_format as formats

    messages = list(messages)
    if family == "Gemma" and messages and messages[0]["role"] == "system":
        # Gemma has no system turn: its own template puts the system prompt at the top of the first user turn.
        system, messages = messages[0]["content"], messages[1:]
        if messages and messages[0]["role"] == "user":
            messages[0] = {"role": "user", "content": f"{system}\n\n{messages[0]['content']}"}
        else:
            messages.insert(0, {"role": "user", "content": system})
    write = {"ChatML": formats.format_chatml, "Gemma": formats.format_gemma, "Llama 3": formats.format_llama3}[family]
    result = write(messages=messages)
    stops = [s.strip() for s in ([result.stop] if isinstance(result.stop, str) else result.stop or [])]
    return result.prompt, tuple(dict.fromkeys(s for s in (eos_text, *stops) if s))


def utf8_size(texts: Iterable[str]) -> int:
    return sum(len(t.encode("utf-8", "replace")) for t in texts)


def provably_too_long(model, size: int, tokens: int) -> bool:
    """Text of `size` UTF-8 bytes is more than `tokens` tokens could ever hold (no token stands for more bytes
    than the vocabulary's longest token text): known without tokenizing it."""
    longest = getattr(model, "max_token_bytes", None)
    return longest is not None and size > max(tokens, 0) and size > max(tokens, 0) * longest()


def check_messages(messages: Sequence[dict], with_tools: bool = False) -> None:
    """with_tools: `tool` messages and assistant `tool_calls` too (already checked by the server's parser)."""
    roles = (*ROLES, "tool") if with_tools else ROLES
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in roles or not isinstance(m.get("content"), str):
            raise EngineError(
                f'Malformed chat message (expected {{"role": {"|".join(roles)}, "content": text}}): ' + repr(m)[:200]
            )


def token_attr(model, token: int) -> int:
    """llama.cpp's attribute bits of one token (a stand-in model may answer itself)."""
    own = getattr(model, "token_attr", None)
    if own is not None:
        return own(token)
    import llama_cpp

    return int(llama_cpp.llama_vocab_get_attr(model.vocab, token))


def is_special(model, token: int) -> bool:
    """A control (or unknown) token: what text becomes only when special tokens are parsed."""
    return bool(token_attr(model, token) & _SPECIAL)


class _Hidden:
    """Control-token text taken out of messages while the template renders, and put back after."""

    def __init__(self) -> None:
        # A random tag nobody can paste on purpose; digits and ':' survive upper(), lower() and trim.
        self._tag = f"\ue000{secrets.randbelow(10**12)}:"
        self._marker = re.compile(re.escape(self._tag) + r"(\d+)\ue001")
        self.texts: list[str] = []

    def hide(self, content: str, control_texts: Sequence[str]) -> str:
        for text in control_texts:  # longest first, as llama.cpp matches them
            if text in content:
                self.texts.append(text)
                content = content.replace(text, f"{self._tag}{len(self.texts) - 1}\ue001")
        return content

    def outside(self, text: str) -> list[str]:
        """The text between markers (markers themselves are never tokenized: a vocabulary may lack them)."""
        return self._marker.split(text)[::2] if self.texts else [text]

    def restore(self, text: str) -> str:
        if not self.texts:
            return text
        return self._marker.sub(lambda m: self.texts[int(m[1])] if int(m[1]) < len(self.texts) else m[0], text)


def _split(text: str, control_tokens: Sequence[tuple[str, int]]) -> list[str | int]:
    """text cut at each control token's text, longest first as llama.cpp does: a list of str and token ids."""
    parts: list[str | int] = [text]
    for piece, token in control_tokens:
        cut: list[str | int] = []
        for part in parts:
            if isinstance(part, int) or piece not in part:
                cut.append(part)
                continue
            for j, chunk in enumerate(part.split(piece)):
                if j:
                    cut.append(token)
                if chunk:
                    cut.append(chunk)
        parts = cut
    return parts


def _text(model: _Tokenizer, token: int) -> str:
    if token is None or token < 0:
        return ""
    return model.token_text(token).decode("utf-8", "replace")
