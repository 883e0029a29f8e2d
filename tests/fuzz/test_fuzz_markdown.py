"""Fuzz: the Markdown renderer's input (app/chat/render.py through the message text path, app/chat/message_text.py).
Hostile Markdown and HTML (deep nesting, huge tables, images and links to file://, unmatched fences, controls,
bidi characters, lone surrogates, draft spans) renders offscreen without an exception, and nothing it names is
loaded: every resource Qt asks for goes to SafeTextBrowser.loadResource, which answers a placeholder (an image)
or nothing, so a real image file named in the text is never read."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import QUrl
from PySide6.QtGui import QImage, QTextDocument
from PySide6.QtWidgets import QTextBrowser

from app.chat.message_text import ResponseText
from app.conversations.store import Message
from app.safe_text import SafeTextBrowser, placeholder_image

from support.fuzz_watchdog import bounded

FUZZ = settings.get_profile("specchat-fuzz")
PROBE_SIZE = (37, 23)  # the real image's size (not the placeholder's)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "probe.png"
    image = QImage(*PROBE_SIZE, QImage.Format.Format_ARGB32)
    image.fill(0xFF00FF00)
    assert image.save(str(path))
    return path


def fragment_list(probe) -> list[str]:
    url, name = probe.as_uri(), str(probe)
    return [
        f"![img]({url})",
        f"![img]({name})",
        f'<img src="{url}">',
        f"<img src='{name}' width=99999 height=99999>",
        f'<img src="{url}"/><img src="probe.png">',
        "![x](file:///dev/zero)",
        '<img src="/dev/stdin">',
        f"[link]({url})",
        "[js](javascript:alert(1))",
        "<a href='file:///etc/passwd'>x</a>",
        "<https://a.b/c>",
        f'<link rel="stylesheet" href="{url}">',
        '<style>@import url("file:///etc/passwd");</style>',
        '<table background="file:///dev/zero"><tr><td background="x.png">c</td></tr></table>',
        "```",
        "```python\n",
        "~~~\n",
        "````\n```\n",
        "`",
        "``` ```",
        "\n\n",
        "\n",
        "    code\n",
        "| a | b |\n|---|---|\n",
        "| x | y |\n",
        "|" * 50 + "\n",
        "> ",
        "- ",
        "1. ",
        "* ",
        "  ",
        "# ",
        "###### ",
        "**",
        "_",
        "~~",
        "<b>",
        "</b>",
        "<div>",
        "</div>",
        "<table><tr><td>",
        "</td></tr></table>",
        "<ul><li>",
        "<pre>",
        "<font size=100>",
        "<span style='font-size:2000px'>x</span>",
        "&#xD800;",
        "&#0;",
        "&nbsp;",
        "<think>",
        "</think>",
        "\x00",
        "\x01\x07\x1b[31m",
        "\u202e\u2066\u2069\u200f",
        "\ufeff\u200b",
        "\ud800",
        "\udfff",
        "\U0001f600",
        "\u2028\u2029",
        "\r",
        "\t",
        "e\u0301" * 3,
        "x" * 5000,
        "\ufdd0\ufdd1",
    ]


@st.composite
def hostile(draw, probe) -> str:
    parts = draw(
        st.lists(
            st.one_of(
                st.sampled_from(fragment_list(probe)), st.text(max_size=10), st.integers(0xD800, 0xDFFF).map(chr)
            ),
            max_size=30,
        )
    )
    n = draw(st.integers(0, 400))
    kind = draw(st.sampled_from(["none", "quote", "list", "emph", "html", "table", "fences", "lines"]))
    deep = {
        "none": "",
        "quote": "> " * n + "deep\n",
        "list": "".join("  " * i + "- x\n" for i in range(n)),
        "emph": "*" * n + "x" + "*" * n,
        "html": "<div>" * n + "x" + "</div>" * n,
        "table": "| a | b |\n|---|---|\n" + "| 1 | 2 |\n" * (n * 5),
        "fences": "```\n" * n,
        "lines": "l\n" * (n * 10),
    }[kind]
    parts.insert(draw(st.integers(0, len(parts))), deep)
    return "".join(parts)


@st.composite
def spans_for(draw, text: str) -> list:
    points = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=8))))
    pairs = [p for p in zip(points[::2], points[1::2]) if p[0] < p[1]]
    return [[a, b, *draw(st.sampled_from([[], ["lookup"], ["draft"]]))] for a, b in pairs]


def image_names(doc: QTextDocument) -> list[str]:
    """The name of every image the document holds."""
    names, block = [], doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            if fmt.isImageFormat():
                names.append(fmt.toImageFormat().name())
            it += 1
        block = block.next()
    return names


def read_from_disk(doc: QTextDocument, names) -> list[str]:
    """The names whose resource is anything but SafeTextBrowser's placeholder: a real image, or a file's bytes
    (what QTextBrowser's own loadResource hands back). QTextDocument keeps what it loaded; resource() answers from
    that, or asks the browser's loadResource, as layout did."""
    placeholder = placeholder_image()
    read = []
    for name in names:
        found = doc.resource(QTextDocument.ResourceType.ImageResource.value, QUrl(name))
        if not (isinstance(found, QImage) and found.size() == placeholder.size()):
            read.append(name)
    return read


def rendered(widget: ResponseText, text: str, spans: list, color_drafts: bool, streaming: bool) -> None:
    m = Message(None, "assistant", text, status="streaming" if streaming else "done", draft_spans=spans)
    widget.set_message(m, color_drafts)
    widget.thought._toggled(True)  # a thought is rendered too, as when its fold is opened
    widget.resize(600, 400)
    widget.grab()  # laid out and painted: every image it names is asked for now


@pytest.fixture(scope="module")
def widget(qapp):
    w = ResponseText()
    yield w
    w.deleteLater()


def test_hostile_markdown_renders_and_loads_nothing_it_names(qapp, widget, probe):
    @settings(FUZZ, max_examples=60)
    @given(st.data())
    @example(None)
    def check(data):
        if data is None:  # every fragment at once, drafts shaded
            text, spans, color, streaming = "\n".join(fragment_list(probe)), [[0, 5], [9, 400]], True, False
        else:
            text = data.draw(hostile(probe), label="text")
            spans = data.draw(spans_for(text), label="spans")
            color, streaming = data.draw(st.booleans(), label="color_drafts"), data.draw(st.booleans())
        with bounded("the Markdown renderer"):
            rendered(widget, text, spans, color, streaming)
            browsers = widget.findChildren(SafeTextBrowser)
            for browser in browsers:
                browser.toPlainText()
                names = image_names(browser.document())
                assert not read_from_disk(browser.document(), names)  # placeholders only
                if data is None and probe.as_uri() in names:  # the control: a plain browser does read the file
                    plain = QTextBrowser()
                    plain.setHtml(browser.document().toHtml())
                    assert read_from_disk(plain.document(), [probe.as_uri()]), "the check would miss a read"
                    controlled.append(True)
                    plain.deleteLater()

    controlled = []
    check()
    assert controlled  # the control ran


def test_a_draft_span_over_an_empty_code_blocks_fences_renders(qapp, widget):
    """Found by this fuzzer: a span from the opening fence, shifted into the code, started at -4 (IndexError)."""
    with bounded("the Markdown renderer"):
        rendered(widget, "```\n```\n", [[0, 5]], True, False)
