"""engine/chat_format.py: the fallback transcript, templates through llama-cpp-python, trimming."""

import pytest

from engine.chat_format import FALLBACK_PREAMBLE, FALLBACK_STOPS, ChatFormatter, fallback_prompt
from engine.errors import ContextOverflowError, EngineError

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class WordModel:
    """A stand-in tokenizer (one token per word) for the formatting logic alone."""

    bos, eos, adds_bos = 1, 2, True

    def __init__(self, n_ctx=64, template=None):
        self.n_ctx, self.template = n_ctx, template

    def tokenize(self, text, add_bos=True, special=True):
        special_ids = {"<s>": self.bos, "</s>": self.eos} if special else {}
        return ([self.bos] if add_bos else []) + [special_ids.get(w, sum(map(ord, w)) + 10) for w in text.split()]

    def token_text(self, token):
        return {1: b"<s>", 2: b"</s>"}[token]

    def token_attr(self, token):
        return 8 if token in (self.bos, self.eos) else 4  # llama.cpp's CONTROL and NORMAL bits

    def chat_template(self):
        return self.template


def conversation(turns):
    out = []
    for i in range(turns):
        out += [
            {"role": "user", "content": f"question {i} " + "word " * 5},
            {"role": "assistant", "content": f"answer {i} " + "word " * 5},
        ]
    return out + [{"role": "user", "content": "the newest question"}]


def test_fallback_transcript_is_the_documented_one():
    text = fallback_prompt(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert text == "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:"
    assert fallback_prompt([{"role": "user", "content": "Hi"}]).startswith(FALLBACK_PREAMBLE + "\n\n")


def test_model_without_template_uses_fallback_with_stops():
    fmt = ChatFormatter(WordModel())
    prompt = fmt.prompt([{"role": "user", "content": "hello there"}], reserve=8)
    assert not prompt.uses_template and prompt.stop == FALLBACK_STOPS
    assert prompt.tokens[0] == 1 and prompt.text.endswith("User: hello there\nAssistant:")


def test_template_is_rendered_by_llama_cpp_formatter_with_one_bos():
    fmt = ChatFormatter(WordModel(template=CHATML))
    prompt = fmt.prompt([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}], reserve=8)
    assert prompt.uses_template
    assert prompt.text == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.tokens.count(1) == 1 and prompt.tokens[0] == 1  # the template has no BOS; the model needs one
    assert prompt.stop == ("</s>",)
    with_bos = ChatFormatter(WordModel(template="{{ bos_token }} " + CHATML))
    tokens = with_bos.prompt([{"role": "user", "content": "hi"}], reserve=8).tokens
    assert tokens[0] == 1 and tokens.count(1) == 1  # the template wrote BOS: none is added


def test_oldest_turns_are_trimmed_whole_with_a_notice():
    model = WordModel(n_ctx=64)
    fmt = ChatFormatter(model)
    msgs = [{"role": "system", "content": "keep me"}] + conversation(6)
    full = len(fmt.render(msgs)[1])
    assert full > 64 - 16
    prompt = fmt.prompt(msgs, reserve=16)
    assert len(prompt.tokens) <= 64 - 16
    assert prompt.trimmed > 0 and prompt.trimmed % 2 == 0  # whole question/answer pairs
    assert prompt.text.startswith("keep me") and "the newest question" in prompt.text
    assert f"{prompt.trimmed} oldest messages" in prompt.notices[0]
    # as little as possible was dropped: one more exchange would not have fitted
    kept_more = [msgs[0]] + msgs[1 + prompt.trimmed - 2 :]
    assert len(fmt.render(kept_more)[1]) > 64 - 16


def test_a_message_that_cannot_fit_is_refused_clearly():
    fmt = ChatFormatter(WordModel(n_ctx=32))
    with pytest.raises(ContextOverflowError, match="Shorten the message"):
        fmt.prompt([{"role": "user", "content": "word " * 40}], reserve=8)
    with pytest.raises(EngineError, match="no user message"):
        fmt.prompt([{"role": "assistant", "content": "hi"}], reserve=8)


@pytest.mark.slow
def test_real_embedded_model_has_no_template_and_gets_bos(gemma_path):
    from engine.decoding.runtime import LoadSettings, Model

    with Model(gemma_path, LoadSettings(n_ctx=256, threads=1), vocab_only=True) as vocab:
        vocab.n_ctx = 256  # a vocab-only load has no context; the formatter only needs the size
        prompt = ChatFormatter(vocab).prompt([{"role": "user", "content": "Hello <eos> there"}], reserve=32)
        assert not prompt.uses_template
        assert prompt.tokens[0] == vocab.bos and vocab.eos not in prompt.tokens  # user text is never a control token
        assert vocab.detokenize(prompt.tokens).endswith("User: Hello <eos> there\nAssistant:")


def test_control_text_in_a_message_stays_text():
    fmt = ChatFormatter(WordModel(template="{{ bos_token }} " + CHATML))
    text, tokens, _ = fmt.render(
        [{"role": "system", "content": "rules </s> ok"}, {"role": "user", "content": "hi </s> <s> bye"}]
    )
    assert "hi </s> <s> bye" in text
    assert tokens.count(1) == 1 and tokens[0] == 1 and 2 not in tokens  # only the template's BOS
    assert tokens.count(sum(map(ord, "</s>")) + 10) == 2  # the pasted "</s>"s as text


@pytest.mark.parametrize("content_filter", ["| upper", "[:9]", "| replace('<', '[')", "| trim | reverse"])
def test_a_template_that_rewrites_content_never_turns_it_into_control_tokens(content_filter):
    template = "{{ bos_token }} {% for m in messages %}{{ m['content'] " + content_filter + " }} </s> {% endfor %}"
    fmt = ChatFormatter(WordModel(template=template))
    text, tokens, _ = fmt.render([{"role": "user", "content": "ok </s> <s> </s> tail"}])
    assert tokens[0] == 1 and tokens.count(1) == 1 and tokens.count(2) == 1  # the template's own, once each
