"""Message text → a QTextDocument: Qt's own markdown, code shaded, and optionally the characters
that came from accepted drafts highlighted on top of the rendered markdown.

Markdown rendering drops syntax (`**`, list numbers, fences), so the rendered characters are
matched back to the source with `align`, a forward-only search that keeps highlighting right
through any formatting.
"""
from __future__ import annotations

import re
from bisect import bisect_right

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

DRAFT_COLOR = QColor(255, 196, 0, 90)  # amber, translucent: readable on light and dark themes
CODE_COLOR = QColor(127, 127, 127, 40)
LOOKAHEAD = 200  # how far past the last match a rendered character may be found in the source
_SEPARATORS = "\u2029\u2028\ufdd0\ufdd1\n"  # block/line separators and table frame markers


def align(rendered: str, source: str) -> list[int | None]:
    """For each rendered character, the index of the source character it shows (None if none)."""
    out: list[int | None] = []
    j = 0
    for ch in rendered:
        if ch in _SEPARATORS or ch.isspace():
            k = j  # the next source space, past any markdown punctuation (`**`, `_`, backticks)
            while k < len(source) and k < j + 8 and not source[k].isspace() and not source[k].isalnum():
                k += 1
            if k < len(source) and source[k].isspace():
                out.append(k)
                j = k + 1
            else:
                out.append(None)
            continue
        k = source.find(ch, j, j + LOOKAHEAD)
        if k < 0:
            out.append(None)
            continue
        out.append(k)
        j = k + 1
    return out


def in_spans(spans: list[list[int]]):
    """A membership test for character index in sorted [start, end) spans."""
    starts = [s for s, _ in spans]

    def test(i: int | None) -> bool:
        if i is None:
            return False
        k = bisect_right(starts, i) - 1
        return k >= 0 and i < spans[k][1]
    return test


def draft_runs(rendered: str, source: str, spans: list[list[int]]) -> list[tuple[int, int]]:
    """[start, end) ranges of rendered positions whose source characters came from accepted drafts."""
    if not spans:
        return []
    hit = in_spans(spans)
    runs: list[tuple[int, int]] = []
    start = None
    for pos, src in enumerate(align(rendered, source)):
        if hit(src):
            if start is None:
                start = pos
        elif start is not None:
            runs.append((start, pos))
            start = None
    if start is not None:
        runs.append((start, len(rendered)))
    return runs


def split_blocks(source: str) -> list[tuple[int, int]]:
    """Cut markdown into independently renderable chunks, as (start, end) offsets covering all of it.

    A cut goes after a blank line outside any code fence, before a line that starts a new top-level
    block (not indented, not the next item of a list), so lists and code stay whole. While a response
    streams only its last chunk changes, so only that chunk is rendered again.
    """
    cuts = [0]
    in_fence = in_list = blank_before = False
    pos = 0
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        item = bool(_LIST_ITEM.match(line))
        if not in_fence and blank_before and stripped and not line[0].isspace() and not (item and in_list):
            cuts.append(pos)
        if stripped.startswith(("```", "~~~")) and len(line) - len(line.lstrip(" ")) < 4:
            in_fence = not in_fence
        if stripped and not in_fence:
            in_list = item or (in_list and line[0].isspace())  # items and their indented continuations
        blank_before = not stripped
        pos += len(line)
    return [(a, b) for a, b in zip(cuts, cuts[1:] + [len(source)])]


_LIST_ITEM = re.compile(r"([-*+]|\d{1,9}[.)])(\s|$)")


def spans_within(spans: list[list[int]], start: int, end: int) -> list[list[int]]:
    """The parts of sorted, non-overlapping spans inside [start, end), shifted to start at 0."""
    out = []
    i = bisect_right(spans, [start, start])
    if i > 0 and spans[i - 1][1] > start:
        i -= 1
    while i < len(spans) and spans[i][0] < end:
        a, b = max(spans[i][0], start), min(spans[i][1], end)
        if a < b:
            out.append([a - start, b - start])
        i += 1
    return out


def rendered_text(doc: QTextDocument) -> str:
    """The document's characters by position (block and frame separators as newlines)."""
    chars = ["\n"] * max(doc.characterCount(), 0)
    block = doc.begin()
    while block.isValid():
        text = block.text()
        pos = block.position()
        chars[pos:pos + len(text)] = text
        block = block.next()
    return "".join(chars)


def render(doc: QTextDocument, source: str, spans: list[list[int]] | None = None, color_drafts: bool = False,
           markdown: bool = True) -> None:
    """Fill doc with source rendered as markdown (or plain text), shading code and, when asked, drafts."""
    if markdown:
        doc.setMarkdown(source, QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
    else:
        doc.setPlainText(source)
    code_blocks, code_runs = _code_ranges(doc) if markdown else ([], [])
    last = doc.characterCount() - 1  # the final paragraph separator cannot be formatted
    runs = [(a, min(b, last)) for a, b in draft_runs(rendered_text(doc), source, spans) if a < last] \
        if color_drafts and spans else []
    if not (code_blocks or code_runs or runs):
        return
    # Read first, then change: a document must not be edited while its blocks are being walked.
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    for position in code_blocks:
        cursor.setPosition(position)
        fmt = cursor.blockFormat()
        fmt.setBackground(CODE_COLOR)
        cursor.setBlockFormat(fmt)
    for color, ranges in ((CODE_COLOR, code_runs), (DRAFT_COLOR, runs)):
        fmt = QTextCharFormat()
        fmt.setBackground(color)
        for start, end in ranges:
            cursor.setPosition(start)
            cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)
    cursor.endEditBlock()


def _code_ranges(doc: QTextDocument) -> tuple[list[int], list[tuple[int, int]]]:
    """Positions of code-block blocks, and (start, end) of inline code runs."""
    blocks, runs = [], []
    block = doc.begin()
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
            blocks.append(block.position())
        else:
            it = block.begin()
            while not it.atEnd():
                frag = it.fragment()
                if frag.charFormat().fontFixedPitch():
                    runs.append((frag.position(), frag.position() + frag.length()))
                it += 1
        block = block.next()
    return blocks, runs
