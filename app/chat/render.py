"""Message text → a QTextDocument: Qt's own markdown, code shaded, and optionally the characters
that came from accepted drafts highlighted on top of the rendered markdown, in the colour of the proposer
that drafted them (prompt lookup, or the draft model). Fenced code blocks are
rendered on their own (see `code_fence`, `highlight_code`): syntax colours from Pygments.

Markdown rendering drops syntax (`**`, list numbers, fences), so the rendered characters are
matched back to the source with `align`, a forward-only search that keeps highlighting right
through any formatting.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from PySide6.QtCore import QObject, QUrl
from PySide6.QtGui import QColor, QFont, QFontDatabase, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

from app.background import run_in_background
from app.chat.model import span_source
from app.safe_text import LINK_SCHEMES

DRAFT_COLOR = QColor(255, 196, 0, 90)  # amber, translucent: readable on light and dark themes (prompt lookup,
# and drafts whose proposer was not recorded)
DRAFT_MODEL_COLOR = QColor(40, 150, 255, 90)  # blue, translucent: the draft model's tokens, told apart from amber
MTP_COLOR = QColor(148, 103, 189, 90)  # purple, translucent (the MTP method's colour): the built-in drafter's tokens
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


def span_color(span) -> QColor:
    """The shade of a draft span: blue for the draft model's tokens, purple for the built-in drafter's (MTP), amber
    for prompt lookup's (or unknown)."""
    return {"draft": DRAFT_MODEL_COLOR, "eagle3": DRAFT_MODEL_COLOR, "mtp": MTP_COLOR}.get(
        span_source(span) or "", DRAFT_COLOR
    )


def span_at(spans: list[list]):
    """For a character index, the index of the sorted [start, end(, proposer)) span holding it, or None."""
    starts = [s[0] for s in spans]

    def find(i: int | None) -> int | None:
        if i is None:
            return None
        k = bisect_right(starts, i) - 1
        return k if k >= 0 and i < spans[k][1] else None

    return find


def shaded_runs(rendered: str, source: str, spans: list[list]) -> list[tuple[int, int, QColor]]:
    """[start, end) ranges of rendered positions whose source characters came from accepted drafts, each with
    the colour of the proposer that drafted them."""
    if not spans:
        return []
    find = span_at(spans)
    runs: list[tuple[int, int, QColor]] = []
    run: tuple[int, QColor] | None = None  # the run being built: where it starts, and its colour
    for pos, src in enumerate(align(rendered, source)):
        k = find(src)
        now = None if k is None else span_color(spans[k])
        if run is not None and now is not run[1]:  # span_color gives one of two constants
            runs.append((run[0], pos, run[1]))
            run = None
        if now is not None and run is None:
            run = (pos, now)
    if run is not None:
        runs.append((run[0], len(rendered), run[1]))
    # Drafted tokens often begin with a space (" the"): shading it makes ragged edges.
    return [(a, b, c) for a, b, c in ((*trim_run(rendered, a, b), c) for a, b, c in runs) if a < b]


def trim_run(text: str, start: int, end: int) -> tuple[int, int]:
    """[start, end) of text without whitespace at either end (start == end when nothing is left)."""
    while start < end and (text[start].isspace() or text[start] in _SEPARATORS):
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in _SEPARATORS):
        end -= 1
    return start, end


def split_blocks(source: str) -> list[tuple[int, int]]:
    """Cut markdown into independently renderable chunks, as (start, end) offsets covering all of it.

    A cut goes after a blank line outside any code fence, before a line that starts a new top-level
    block (not indented, not the next item of a list), so lists and code stay whole. While a response
    streams only its last chunk changes, so only that chunk is rendered again.
    """
    cuts = [0]
    in_fence = in_list = blank_before = after_fence = top_fence = False
    pos = 0
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        item = bool(_LIST_ITEM.match(line))
        fence = stripped.startswith(("```", "~~~")) and len(line) - len(line.lstrip(" ")) < 4
        top = bool(stripped) and not line[0].isspace()
        # A top-level code block is a chunk of its own (it gets a copy button), even without blank lines.
        if (
            not in_fence
            and top
            and pos > cuts[-1]
            and ((blank_before and not (item and in_list)) or (fence and not in_list) or after_fence)
        ):
            cuts.append(pos)
        if stripped:
            after_fence = False
        if fence:
            in_fence = not in_fence
            if in_fence:
                top_fence = top and not in_list
            else:
                after_fence = top_fence
        if stripped and not in_fence:
            in_list = item or (in_list and line[0].isspace())  # items and their indented continuations
        blank_before = not stripped
        pos += len(line)
    return [(a, b) for a, b in zip(cuts, cuts[1:] + [len(source)])]


_LIST_ITEM = re.compile(r"([-*+]|\d{1,9}[.)])(\s|$)")


# Qt lays out rich text on the GUI thread, and some text costs far more than its length (measured on a 2-core
# CPU): a line's layout grows with the square of its length (16K characters 55 ms, 64K 1 s), a table row costs
# ~0.6 ms, ordinary paragraphs ~2 ms per thousand characters. A message is shown up to a budget of about 40 ms
# and folded after it ("Show all" opens the whole text in a viewer that takes it a slice at a time).
DISPLAY_BUDGET = 16_000  # cost units: a character of ordinary text is one
TABLE_ROW_COST = 250  # what a table row costs beyond its characters
CODE_SHARE = 0.5  # a code block is plain text (coloured later, a slice at a time): half the cost of markdown
LONG_LINE = 4_000  # characters: a longer line is cut here


def fold_point(source: str) -> int | None:
    """Where to stop rendering source so that laying it out stays within DISPLAY_BUDGET; None when all of it
    fits. It depends only on the text before it, so a streaming answer folds once and stays folded there."""
    cost, pos, in_code = 0.0, 0, False
    while pos < len(source):
        end = source.find("\n", pos)
        end = len(source) if end < 0 else end + 1
        if end - pos > LONG_LINE:
            return pos + LONG_LINE
        start = source[pos : min(pos + 8, end)].lstrip()
        in_code ^= start.startswith(("```", "~~~"))
        if in_code:
            cost += (end - pos) * CODE_SHARE
        else:
            cost += end - pos + (TABLE_ROW_COST if start.startswith("|") else 0)
        if cost > DISPLAY_BUDGET:
            return max(pos, 1)
        pos = end
    return None


def spans_within(spans: list[list[int]], start: int, end: int) -> list[list[int]]:
    """The parts of sorted, non-overlapping spans inside [start, end), shifted to start at 0 (proposers kept)."""
    out = []
    i = bisect_right(spans, [start, start])
    if i > 0 and spans[i - 1][1] > start:
        i -= 1
    while i < len(spans) and spans[i][0] < end:
        a, b = max(spans[i][0], start), min(spans[i][1], end)
        if a < b:
            out.append([a - start, b - start, *spans[i][2:]])
        i += 1
    return out


def rendered_text(doc: QTextDocument) -> str:
    """The document's characters by position (block and frame separators as newlines)."""
    chars = ["\n"] * max(doc.characterCount(), 0)
    block = doc.begin()
    while block.isValid():
        text = block.text()
        pos = block.position()
        chars[pos : pos + len(text)] = text
        block = block.next()
    return "".join(chars)


def render(
    doc: QTextDocument,
    source: str,
    spans: list[list[int]] | None = None,
    color_drafts: bool = False,
    markdown: bool = True,
) -> None:
    """Fill doc with source rendered as markdown (or plain text), shading code and, when asked, drafts."""
    if markdown:
        doc.setMarkdown(source, QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
        unlink_unopenable(doc)
    else:
        doc.setPlainText(source)
    code_blocks, code_runs = _code_ranges(doc) if markdown else ([], [])
    last = doc.characterCount() - 1  # the final paragraph separator cannot be formatted
    runs = (
        [(a, min(b, last), color) for a, b, color in shaded_runs(rendered_text(doc), source, spans) if a < last]
        if color_drafts and spans
        else []
    )
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
    _merge_formats(
        cursor, [(a, b, _shade(CODE_COLOR)) for a, b in code_runs] + [(a, b, _shade(color)) for a, b, color in runs]
    )
    cursor.endEditBlock()


def _shade(color: QColor) -> QTextCharFormat:
    fmt = QTextCharFormat()
    fmt.setBackground(color)
    return fmt


def _blocks(doc: QTextDocument):
    block = doc.begin()
    while block.isValid():
        yield block
        block = block.next()


def _fragments(block):
    it = block.begin()
    while not it.atEnd():
        yield it.fragment()
        it += 1


def unlink_unopenable(doc: QTextDocument) -> None:
    """Links SpecChat would not open (file:, smb:, javascript:, ... : safe_text.LINK_SCHEMES) become plain text,
    so nothing invites a click that cannot go anywhere."""
    runs = [
        (f.position(), f.position() + f.length())
        for block in _blocks(doc)
        for f in _fragments(block)
        if f.charFormat().isAnchor() and QUrl(f.charFormat().anchorHref()).scheme().lower() not in LINK_SCHEMES
    ]
    if not runs:
        return
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    for start, end in runs:
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        fmt = cursor.charFormat()
        fmt.setAnchor(False)
        fmt.setAnchorHref("")
        fmt.setFontUnderline(False)
        fmt.clearForeground()  # the text's own colour, not a link's
        cursor.setCharFormat(fmt)
    cursor.endEditBlock()


def _code_ranges(doc: QTextDocument) -> tuple[list[int], list[tuple[int, int]]]:
    """Positions of code-block blocks, and (start, end) of inline code runs."""
    blocks, runs = [], []
    for block in _blocks(doc):
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
            blocks.append(block.position())
        else:
            runs += [
                (f.position(), f.position() + f.length()) for f in _fragments(block) if f.charFormat().fontFixedPitch()
            ]
    return blocks, runs


# --- fenced code blocks -------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeFence:
    language: str  # as written after the opening fence ("" when none)
    code: str  # exactly the code: what the copy button puts on the clipboard
    code_start: int  # where the code starts in the chunk (for the draft spans)
    closed: bool  # the closing fence has arrived


_FENCE_OPEN = re.compile(r" {0,3}(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)(?:\n|$)")
HIGHLIGHT_LIMIT = 30_000  # characters; a longer block stays plain, so applying colours never stalls the window


def code_fence(chunk: str) -> CodeFence | None:
    """The code of a chunk that is one fenced code block (blank lines after it allowed), else None."""
    m = _FENCE_OPEN.match(chunk)
    if not m or (m["fence"][0] == "`" and "`" in m["info"]):
        return None
    fence, start = m["fence"], m.end()
    language = (m["info"].split() or [""])[0].strip("{}.")
    close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M).search(chunk, start)
    if close is None:
        return CodeFence(language, chunk[start:], start, False)
    if chunk[close.end() :].strip():
        return None  # text after the block: not a code chunk of its own
    return CodeFence(language, chunk[start : close.start()].removesuffix("\n"), start, True)


# Signs of common languages, for fences that name none (Pygments' own guess mistakes most short code).
_HINTS = {
    "python": r"^\s*(def \w+\(|class \w+[(:]|import \w+|from [\w.]+ import |elif |print\(|if __name__)",
    "javascript": r"\bfunction\b|^\s*(const|let|var) \w+ =|console\.log|=> *[{(]|\brequire\(",
    "typescript": r"^\s*(interface|type) \w+ *[={]|: (string|number|boolean)\b",
    "c": r"^#include\s*[<\"]|\bint main\(|\bprintf\(",
    "cpp": r"\bstd::|^#include\s*<(iostream|vector|string)>|\btemplate\s*<",
    "java": r"\bpublic (static )?(class|void|final)\b|System\.out\.",
    "rust": r"\bfn \w+\(|\blet mut\b|\w+!\(|\bimpl\b|-> *(Self|Result|Option)",
    "go": r"^package \w+|\bfunc \w+\(|\bfmt\.\w+\(|:= ",
    "bash": r"^#!.*\b(ba|z)?sh\b|^\s*(\$ )?(sudo|apt|apt-get|pip|cd|echo|export|npm|git|ls|mkdir|curl) ",
    "sql": r"(?i)^\s*(select|insert into|update|delete from|create table|with) ",
    "html": r"^\s*<(!doctype|html|head|body|div|span|p|a|ul|li|table|script)\b",
    "css": r"^\s*[.#]?[\w-]+\s*\{\s*$|^\s*[\w-]+:\s*[^;]+;\s*$",
    "json": r"^\s*[\[{]\s*$|^\s*\"[^\"]+\"\s*:",
    "yaml": r"^\w[\w-]*:\s*(\S.*)?$|^\s*- \w+:",
}
_HINT_RES = {name: re.compile(rx, re.M) for name, rx in _HINTS.items()}


def guess_language(code: str) -> str:
    """The language whose signs are in the most lines of code, or "" when none shows any."""
    sample = code[:4000]
    scores = {name: len(rx.findall(sample)) for name, rx in _HINT_RES.items()}
    best = max(scores, key=scores.__getitem__)
    return best if scores[best] else ""


@lru_cache(maxsize=64)
def _lexer(language: str):
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:  # keep the text exactly as it is: no stripped or added newlines
        return get_lexer_by_name(language.lower(), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


@lru_cache(maxsize=4)
def _style(dark: bool):
    from pygments.styles import get_style_by_name

    return get_style_by_name("monokai" if dark else "default")


@lru_cache(maxsize=512)
def _token_format(ttype, dark: bool) -> QTextCharFormat:
    spec = _style(dark).style_for_token(ttype)
    fmt = QTextCharFormat()
    if spec["color"]:
        fmt.setForeground(QColor("#" + spec["color"]))
    if spec["bold"]:
        fmt.setFontWeight(QFont.Weight.Bold)
    if spec["italic"]:
        fmt.setFontItalic(True)
    return fmt


@lru_cache(maxsize=128)  # a conversation opened again, or a widget made again, costs nothing
def code_tokens(code: str, language: str) -> list[tuple[str, object]] | None:
    """(text, token type) runs of code in language (guessed when "" or unknown); None when it cannot be
    coloured (no language fits, too long, or the lexer would change the text)."""
    lexer = (_lexer(language) if language else None) or _lexer(guess_language(code) or "text")
    if lexer is None or len(code) > HIGHLIGHT_LIMIT or lexer.name == "Text only":
        return None
    runs: list[tuple[str, object]] = []
    for ttype, value in lexer.get_tokens(code):
        if runs and runs[-1][1] is ttype:
            runs[-1] = (runs[-1][0] + value, ttype)
        elif value:
            runs.append((value, ttype))
    return runs if "".join(text for text, _ in runs) == code else None


def render_code(doc: QTextDocument, code: str, spans: list[list[int]] | None = None) -> None:
    """Fill doc with code, plain, in a fixed-pitch font; spans (offsets into code) get the draft highlight.
    Colours go on afterwards, a slice at a time (colour_ranges, apply_colours)."""
    doc.clear()
    doc.setDefaultFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    append_code(doc, code, 0, spans)


def append_code(doc: QTextDocument, code: str, start: int, spans: list[list[int]] | None = None) -> None:
    """Add code[start:] to a doc that render_code (or this) filled with code[:start]: a streaming block grows by
    its new text instead of being laid out again whole (a 400-line block: ~40 ms a delta on a 2-core CPU)."""
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    cursor.movePosition(QTextCursor.MoveOperation.End)
    cursor.insertText(code[start:], QTextCharFormat())  # not the draft colour of the text before it
    # Runs are trimmed of whitespace at their ends; whitespace the last delta ended on may now be inside one.
    lo = start
    while lo > 0 and code[lo - 1].isspace():
        lo -= 1
    # A span may start before the code (on its opening fence: shifted by the fence, it is negative) or end past it.
    runs = ((*trim_run(code, max(s[0], 0), min(s[1], len(code))), span_color(s)) for s in spans or [] if s[1] > lo)
    _merge_formats(cursor, [(max(a, lo), b, _shade(color)) for a, b, color in runs])
    cursor.endEditBlock()


def colour_ranges(runs: list[tuple[str, object]], dark: bool = False) -> list[tuple[int, int, QTextCharFormat]]:
    """(start, end, format) for the runs (from code_tokens) that have a colour or a weight; plain ones
    need nothing (a 400-line block: 6,400 runs, 2,400 of them coloured)."""
    out, pos = [], 0
    for text, ttype in runs:
        fmt = _token_format(ttype, dark)
        if fmt.properties():
            out.append((pos, pos + len(text), fmt))
        pos += len(text)
    return out


def apply_colours(doc: QTextDocument, ranges: list[tuple[int, int, QTextCharFormat]]) -> None:
    """Merge the formats onto code that render_code put in doc (draft highlights stay)."""
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    _merge_formats(cursor, ranges)
    cursor.endEditBlock()


def _merge_formats(cursor: QTextCursor, ranges: list[tuple[int, int, QTextCharFormat]]) -> None:
    for start, end, fmt in ranges:
        if start < end:
            cursor.setPosition(start)
            cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)


HIGHLIGHT_LANE = "highlight"  # one block at a time: colouring never takes more than one core from the answer


def lex_in_background(code: str, language: str, deliver: Callable[[object], None], owner: QObject) -> None:
    """Run code_tokens off the GUI thread (app.background) and call deliver(runs) on it, unless owner is gone by
    then. Pygments is pure Python and takes tens of ms on a long block: never on the GUI thread. A lexer that fails
    leaves the code plain."""
    run_in_background(
        code_tokens, code, language, lane=HIGHLIGHT_LANE, done=deliver, failed=lambda _exc: None, owner=owner
    )
