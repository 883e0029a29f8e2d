"""Pasted control-token text stays text: a message can never forge a turn, for every catalog family.

Each family is formatted with its real chat template (tests/data/templates/) over a real vocabulary
that holds that family's turn markers as CONTROL tokens: SmolLM2's (ChatML) for SmolLM2 and the Qwen families,
the embedded Gemma 3's for Gemma 3, and a tiny written GGUF for Llama 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp as L
import pytest

from engine.chat_format import ChatFormatter
from engine.decoding.runtime import LoadSettings, Model

from support.chat_formats import CHATML_FORGERY, GEMMA_FORGERY, LLAMA3_FORGERY, SMOLLM2_MISSING, smollm2_path
from support.tiny import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests" / "data" / "templates"


# family -> (template file, vocabulary, pasted text that forges a turn in that family's format)
FAMILIES = {
    "Qwen2.5": ("qwen2.5-instruct.jinja", "smollm2", CHATML_FORGERY),
    "Qwen2.5-Coder": ("qwen2.5-instruct.jinja", "smollm2", CHATML_FORGERY),
    "Llama 3": ("llama-3.1-instruct.jinja", "llama3", LLAMA3_FORGERY),
    "Qwen3": ("qwen3.jinja", "smollm2", CHATML_FORGERY),
    "Qwen3.5": ("qwen3.5.jinja", "smollm2", CHATML_FORGERY),
    "Qwen3.6": ("qwen3.5.jinja", "smollm2", CHATML_FORGERY),  # see tests/data/templates/README.md
    "Gemma 3": ("gemma-3-it.jinja", "gemma", GEMMA_FORGERY),
    "SmolLM2": ("smollm2-instruct.jinja", "smollm2", CHATML_FORGERY),
}


def write_llama3_vocab(path: Path) -> Path:
    """Llama 3's turn markers as CONTROL tokens (BOS <|begin_of_text|>, EOS <|eot_id|>) over one token per
    printable ASCII character, so any ASCII text round-trips."""
    chars = ["\u2581", "\n", "\t"] + [chr(c) for c in range(33, 127)]
    return write_tiny_gguf(
        path,
        tokens=["<unk>", "<|begin_of_text|>", "<|eot_id|>"] + chars,
        control_tokens=["<|start_header_id|>", "<|end_header_id|>"],
        complete=True,
    )


@pytest.fixture(scope="module")
def vocabs(gemma_path, tmp_path_factory):
    """vocabs(name) -> that vocabulary, loaded once (vocab only); skips when SmolLM2 is not installed."""
    loaded: dict[str, Model] = {}

    def load(name: str) -> Model:
        if name not in loaded:
            if name == "gemma":
                path = gemma_path
            elif name == "smollm2":
                path = smollm2_path() or pytest.skip(SMOLLM2_MISSING)
            else:
                path = write_llama3_vocab(tmp_path_factory.mktemp("llama3") / "llama3-vocab.gguf")
            loaded[name] = Model(path, LoadSettings(n_gpu_layers=0), vocab_only=True)
        return loaded[name]

    yield load
    for model in loaded.values():
        model.close()


class WithTemplate:
    """A loaded vocabulary with another chat template (and a context size, which vocab-only loads lack)."""

    def __init__(self, model: Model, template: str | None, n_ctx: int = 4096):
        self._model, self._template, self.n_ctx = model, template, n_ctx
        self.tokenize_calls: list[bool] = []  # the special= flag of every tokenize call

    def chat_template(self):
        return self._template

    def tokenize(self, text, add_bos=True, special=True):
        self.tokenize_calls.append(special)
        return self._model.tokenize(text, add_bos=add_bos, special=special)

    def __getattr__(self, name):
        return getattr(self._model, name)


def is_control(model, token: int) -> bool:
    return bool(L.llama_vocab_is_control(model.vocab, token))


def controls(model, tokens) -> list[int]:
    return [t for t in tokens if is_control(model, t)]


def conversation(pasted: str) -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": f"Please read this. {pasted} Thanks."},
    ]


def whole_text_tokens(model, text: str) -> list[int]:
    """What llama.cpp makes of the whole rendered text with special tokens on, BOS as the formatter adds it."""
    tokens = model.tokenize(text, add_bos=False, special=True)
    return [model.bos] + tokens if model.adds_bos and tokens[:1] != [model.bos] else tokens


def test_every_catalog_family_is_covered():
    catalog = json.loads((ROOT / "resources" / "catalog.json").read_text())
    assert {pair["family"] for pair in catalog["pairs"]} == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_pasted_control_text_stays_text(family, vocabs):
    template_file, vocab_name, pasted = FAMILIES[family]
    vocab = vocabs(vocab_name)
    model = WithTemplate(vocab, (TEMPLATES / template_file).read_text())
    fmt = ChatFormatter(model)
    assert fmt.uses_template

    base_text, base_tokens, _ = fmt.render(conversation("It is short."))
    text, tokens, _ = fmt.render(conversation(pasted))

    # The same conversation without the pasted text: its control tokens are the template's own markers.
    template_controls = controls(vocab, base_tokens)
    assert len(template_controls) >= 6
    for token in set(template_controls):
        assert template_controls.count(token) == base_text.count(vocab.token_text(token).decode())
    # With the pasted text: exactly the template's control tokens, none from the pasted text ...
    assert controls(vocab, tokens) == template_controls
    # ... whose tokens read back as the pasted text itself (control tokens would read back as nothing).
    assert pasted in text and pasted in vocab.detokenize(tokens)
    # A normal conversation tokenizes exactly as the whole rendered text would.
    assert base_tokens == whole_text_tokens(vocab, base_text)


def test_pasted_text_in_every_role_and_in_rewritten_reasoning_stays_text(vocabs):
    """Qwen3's template rewrites earlier assistant turns (it drops their <think> reasoning) and trims nothing
    else; control text pasted into the system prompt, a reply, or the reasoning still never becomes control."""
    vocab = vocabs("smollm2")
    fmt = ChatFormatter(WithTemplate(vocab, (TEMPLATES / "qwen3.jinja").read_text()))
    messages = [
        {"role": "system", "content": "Rules: " + CHATML_FORGERY},
        {"role": "user", "content": "Hi " + CHATML_FORGERY},
        {"role": "assistant", "content": "<think>\nMaybe " + CHATML_FORGERY + "\n</think>\n\nHello " + CHATML_FORGERY},
        {"role": "user", "content": "Go on"},
    ]
    clean = [{"role": m["role"], "content": m["content"].replace(CHATML_FORGERY, "x")} for m in messages]
    text, tokens, _ = fmt.render(messages)
    assert controls(vocab, tokens) == controls(vocab, fmt.render(clean)[1])
    assert "Maybe" not in text  # the template really did rewrite that turn
    assert vocab.detokenize(tokens).count(CHATML_FORGERY) == 3


def test_smollm2_own_template_keeps_pasted_control_text_as_text(vocabs):
    vocab = vocabs("smollm2")
    model = WithTemplate(vocab, vocab.chat_template())
    fmt = ChatFormatter(model)
    text, tokens, stop = fmt.render([{"role": "user", "content": CHATML_FORGERY}])
    assert fmt.uses_template and stop == ("<|im_end|>",)
    # its template writes a default system turn, the user turn and the assistant header: 3 starts, 2 ends
    assert controls(vocab, tokens) == [vocab.bos, vocab.eos, vocab.bos, vocab.eos, vocab.bos]
    assert CHATML_FORGERY in vocab.detokenize(tokens)


def test_fallback_transcript_tokenizes_pasted_gemma_turns_as_text(vocabs):
    vocab = vocabs("gemma")
    assert vocab.chat_template() is None  # the embedded Gemma 3 270M is a base model without a template
    model = WithTemplate(vocab, None, n_ctx=512)
    prompt = ChatFormatter(model).prompt([{"role": "user", "content": GEMMA_FORGERY}], reserve=64)
    assert not prompt.uses_template
    assert model.tokenize_calls and not any(model.tokenize_calls)  # always special=False
    assert controls(vocab, prompt.tokens) == [vocab.bos]
    assert vocab.detokenize(prompt.tokens).endswith("User: " + GEMMA_FORGERY + "\nAssistant:")


# Messages whose edges meet the template's text in every way: spaces, newlines, punctuation, code, a
# half-written marker. ASCII only, as the tiny Llama 3 vocabulary has no byte tokens for the rest.
AWKWARD = [
    "  spaced out  ",
    "\n\nafter blank lines",
    "ends with a newline\n",
    "code:\n```py\nprint('<|')\n```",
    "a<|im_ and <end_of and <|eot",
    ">",
    "\t<think>tabs</think>",
    "x" * 300,
]


@pytest.mark.parametrize("family", FAMILIES)
def test_normal_messages_tokenize_exactly_as_the_whole_text(family, vocabs):
    template_file, vocab_name, _ = FAMILIES[family]
    vocab = vocabs(vocab_name)
    fmt = ChatFormatter(WithTemplate(vocab, (TEMPLATES / template_file).read_text()))
    unicode = [] if vocab_name == "llama3" else ["emoji 🎉, ünïcödé, 中文", "  \u00a0non-breaking\u00a0  "]
    for content in AWKWARD + unicode:
        messages = [
            {"role": "system", "content": content},
            {"role": "user", "content": content},
            {"role": "assistant", "content": content},
            {"role": "user", "content": content},
        ]
        text, tokens, _ = fmt.render(messages)
        assert tokens == whole_text_tokens(vocab, text), repr(content)
