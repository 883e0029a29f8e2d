"""Hostile chat templates (a loop, gigabytes, megabytes of output, recursion, an escape) and tiny GGUF files that
carry them, for the sandbox, model-check, server and window tests, and hostile_figures."""

from __future__ import annotations

from pathlib import Path

import psutil

from .tiny import default_tokens, write_tiny_gguf

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Each within the Jinja sandbox's own rules (range() under its 100,000 cap, no attribute escapes).
SPINS = "{% for i in range(99999) %}{% for j in range(99999) %}{% set x = i * j %}{% endfor %}{% endfor %}"
# Writes a character every 100 turns: written every turn, its output filled the 512 MB before 3 s had passed on a
# faster machine (the memory limit then refused it, rightly, but this one is the time limit's case).
SPINS_WRITING = (
    "{% for i in range(99999) %}{% for j in range(99999) %}{% if j % 100 == 0 %}x{% endif %}{% endfor %}{% endfor %}"
)
HOGS = "{{ 'x' * 8000000000 }}"
CENTRES = "{{ 'x' | center(4000000000) }}"
WRITES_MEGABYTES = "{{ 'x' * 50000000 }}"
RECURSES = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
ESCAPES = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
UNREADABLE = "{% for %}"
HOSTILE = {
    "spins": SPINS,
    "spins writing": SPINS_WRITING,
    "hogs memory": HOGS,
    "centres": CENTRES,
    "writes megabytes": WRITES_MEGABYTES,
    "recurses": RECURSES,
    "escapes": ESCAPES,
    "unreadable": UNREADABLE,
}
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
CONTROL = ["<|im_start|>", "<|im_end|>"]
# With byte tokens: llama.cpp's SentencePiece tokenizer aborts on a character it has no token for.
BYTES = default_tokens() + [f"<0x{b:02X}>" for b in range(256)]


def hostile_gguf(path: Path, template: str, control=CONTROL, complete=False) -> Path:
    return write_tiny_gguf(
        path, tokens=BYTES, control_tokens=control, chat_template=template, complete=complete, context_length=512
    )


def tree_rss() -> int:
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)] if p.is_running())
