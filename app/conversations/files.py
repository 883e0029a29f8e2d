"""A conversation to a file and back: Markdown to read, JSON to keep or move.

Markdown holds the branch shown: the title, each turn under its role, and each answer's stats line.
JSON holds everything: every branch (each message names its parent and the child shown below it),
stats, draft spans, statuses, model names and the conversation's own settings, under a format name
and version. import_json reads only that JSON, checks all of it first, and adds the conversation in
one transaction: a bad file is refused with a message that says why, and nothing is added.

A conversation file is data, never settings: what it says about where messages go and what goes with them
(SENT_KEYS: a server, its model, a system prompt, a preset) is used only when the person importing it has
seen it and said so (the window asks); otherwise it is dropped. An imported chat's title says it was imported.
Exports never hold a user name or password from a server's URL (older versions kept them in labels).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any, TypeGuard, overload

from app.conversations.store import STATUSES, ConversationStore, Message
from app.figure_texts import stat_items
from app.plain_text import safe_file_name
from app.settings.values import FIELDS, check_field, write_json_atomic
from engine import safe_files
from engine.figures import COUNTS, FLAG, NUMBER, NUMBER_LIST, PAIR_LIST, TEXT, keys_of
from engine.paths import write_text_atomic
from engine.remote.endpoint import without_credentials
from engine.safe_files import FileRefused, Wording
from engine.text_rules import valid_json

FORMAT = "specchat-conversation"
VERSION = 1
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_MESSAGES = 100_000
MAX_TEXT_CHARS = 4_000_000  # one message's text
MAX_NAME_CHARS = 1_000  # a title, a model name, a notice
ROLES = ("system", "user", "assistant")
ROLE_HEADERS = {"user": "You", "assistant": "Assistant", "system": "System"}
# Settings that change where a chat's messages go, or what is sent with them: an import uses them only when asked.
# Sampling values (temperature, top-k, top-p, min-p, seed, max tokens) change neither, and are kept.
SENT_KEYS = ("engine_url", "engine_model", "system_prompt", "preset")
IMPORTED_MARK = " (imported)"
# A conversation file's refusals, in an import's words (engine.safe_files checks and reads it).
IMPORTING = Wording(
    folder="{label} is a folder, not a conversation file, so nothing was imported.",
    special=(
        "{label} is {kind}, not a regular file, so it was not read (it could wait for ever or never end) "
        "and nothing was imported. Only a SpecChat conversation file (.json) can be imported."
    ),
    too_large=("{label} is {mb:.0f} MB; a conversation file can be at most {limit_mb} MB, so it was not imported."),
    grew=(
        "{label} is over {limit_mb} MB (more than its size said); a conversation file can be at most "
        "{limit_mb} MB, so it was not imported."
    ),
    unreadable="{label} could not be read: {why}.",
)
_IMPORTED = re.compile(r" \(imported(?: \d+)?\)$")  # the mark an earlier import left on the title

# The kinds of a response's figures (app.progress.snapshot), from engine.figures: what an import accepts.
STATS_NUMBERS = keys_of(NUMBER)
STATS_TEXTS = keys_of(TEXT)
STATS_FLAGS = keys_of(FLAG)
STATS_NUMBER_LISTS = keys_of(NUMBER_LIST)
STATS_PAIR_LISTS = keys_of(PAIR_LIST)
STATS_COUNTS = keys_of(COUNTS)
SPAN_SOURCES = ("lookup", "draft")  # who proposed a span's accepted drafts (older files name no one)


class ConversationFileError(ValueError):
    """A file that cannot be imported; the message says why, for a person."""


# --- export -----------------------------------------------------------------------------------
def conversation_data(store: ConversationStore, conversation_id: int) -> dict:
    """The whole conversation as plain data, in the JSON export's shape. Message ids are numbered
    from 1 in the order written, so a parent always comes before its children."""
    conversation = store.conversation(conversation_id)
    if conversation is None:
        raise KeyError(f"no conversation {conversation_id}")
    tree = store.tree(conversation_id)
    number: dict[int | None, int] = {mid: n for n, mid in enumerate(sorted(tree.messages), 1)}
    messages = []
    for mid in sorted(tree.messages):
        m = tree.messages[mid]
        shown = tree.active_child(mid)
        messages.append(
            {
                "id": number[mid],
                "parent": number.get(m.parent_id),
                "role": m.role,
                "content": m.content,
                "status": m.status,
                "model": without_credentials(m.model),
                "stats": _without_credentials(m.stats),
                "draft_spans": m.draft_spans,
                "notice": without_credentials(m.notice),
                "active_child": number[shown] if shown is not None else None,
            }
        )
    root = tree.active_child(None)
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "title": conversation.title,
        "settings": _without_credentials(store.conversation_settings(conversation_id)),
        "active_root": number[root] if root is not None else None,
        "messages": messages,
    }


@overload
def _without_credentials(values: dict) -> dict: ...
@overload
def _without_credentials(values: None) -> None: ...
def _without_credentials(values: dict | None) -> dict | None:
    """The app's own texts in values (a server's URL, a "remote host" label) without a user:password@ that an
    older version kept in them."""
    if not values:
        return values
    return {k: without_credentials(v) if isinstance(v, str) else v for k, v in values.items()}


def export_json(store: ConversationStore, conversation_id: int, path: Path | str) -> None:
    """Every branch, stats and settings, as JSON (written atomically). Raises OSError."""
    write_json_atomic(Path(path), conversation_data(store, conversation_id))


def markdown(store: ConversationStore, conversation_id: int) -> str:
    conversation = store.conversation(conversation_id)
    if conversation is None:
        raise KeyError(f"no conversation {conversation_id}")
    tree = store.tree(conversation_id)
    path = tree.path()
    parts = [f"# {conversation.title}\n"]
    note = f"Exported from SpecChat on {time.strftime('%Y-%m-%d %H:%M')}."
    if len(path) < len(tree.messages):
        note += " This is the branch that was shown; the JSON export holds every version of every message."
    parts.append(f"*{note}*\n")
    for m in path:
        header = ROLE_HEADERS.get(m.role, m.role)
        if m.role == "assistant" and m.model:
            header += f" · {without_credentials(m.model)}"
        parts.append(f"## {header}\n")
        parts.append((m.content.strip() or "*(no text)*") + "\n")
        if m.status not in ("done", "stopped"):
            parts.append(f"*({m.status})*\n")
        if m.notice:
            parts.append(f"*{without_credentials(m.notice)}*\n")
        if m.role == "assistant" and m.stats:
            parts.append("*" + "  ·  ".join(text for _, text, _ in stat_items(_without_credentials(m.stats))) + "*\n")
    return "\n".join(parts)


def export_markdown(store: ConversationStore, conversation_id: int, path: Path | str) -> None:
    """The branch shown, readable: title, each turn under its role, each answer's stats. Raises OSError."""
    write_text_atomic(Path(path), markdown(store, conversation_id))


def suggested_file_name(title: str, suffix: str) -> str:
    """A file name from a conversation's title, safe on every system and in every shell (app.plain_text)."""
    return safe_file_name(title, suffix)


# --- import -----------------------------------------------------------------------------------
def import_json(store: ConversationStore, path: Path | str, keep_sent: bool = False) -> int:
    """Add the conversation in a JSON export as a new one; its id. keep_sent: use its SENT_KEYS settings (only
    once the person importing it has seen them and said so). Raises ConversationFileError (the file is refused
    and nothing is added) or sqlite3.Error (it could not be saved; nothing is added either)."""
    return add_conversation(store, read_conversation_file(Path(path)), () if keep_sent else SENT_KEYS)


def settings_to_confirm(settings: dict, default_preset: str) -> dict:
    """The settings of an imported conversation that would change where its next message goes or what goes
    with it, in SENT_KEYS order: those that say something (a preset other than this machine's default one)."""
    return {
        k: settings[k]
        for k in SENT_KEYS
        if k in settings
        and isinstance(settings[k], str)
        and settings[k].strip()
        and not (k == "preset" and settings[k] == default_preset)
    }


def imported_title(title: str, taken=()) -> str:
    """The title of an imported copy: "Title (imported)", numbered ("(imported 2)") where a conversation in taken
    has that title already, so neither its original (itself imported, perhaps) nor an earlier copy shares it."""
    stem = _IMPORTED.sub("", title.strip() or "Untitled")
    shown, n = stem + IMPORTED_MARK, 1
    while shown in taken:
        n += 1
        shown = f"{stem} (imported {n})"
    return shown


def add_conversation(store: ConversationStore, data: dict, dropped=SENT_KEYS) -> int:
    """Add a checked conversation (read_conversation_file) as a new one, in one transaction; its id. Its settings
    named in dropped are left out (by default every SENT_KEYS one: the chat is answered as a new one would be)."""
    settings = {k: v for k, v in data["settings"].items() if k not in dropped}
    with store.transaction():
        cid = store.create_conversation(imported_title(data["title"], {c.title for c in store.conversations()}))
        store.set_conversation_settings(cid, settings)
        new_id: dict[int, int] = {}
        for m in data["messages"]:
            message = Message(
                id=None,
                role=m["role"],
                content=m["content"],
                status="interrupted" if m["status"] == "streaming" else m["status"],
                model=m["model"],
                stats=m["stats"],
                draft_spans=m["draft_spans"],
                notice=m["notice"],
            )
            parent = new_id[m["parent"]] if m["parent"] is not None else None
            new_id[m["id"]] = store.add_message(cid, message, parent=parent)
        for m in data["messages"]:
            if m["active_child"] is not None:
                store.set_active(new_id[m["active_child"]])
        if data["active_root"] is not None:
            store.set_active(new_id[data["active_root"]])
    return cid


def read_conversation_file(path: Path) -> dict:
    """The checked contents of a JSON export (missing optional fields filled in). Reads only a regular file, and
    never more than MAX_FILE_BYTES of it (engine.safe_files): a FIFO or /dev/zero is refused, not read."""
    name = path.name
    try:
        raw = safe_files.read_bytes(path, MAX_FILE_BYTES, IMPORTING)
    except FileRefused as exc:
        raise ConversationFileError(str(exc)) from exc
    try:
        data = valid_json(json.loads(raw.decode("utf-8-sig")))  # a lone surrogate's escape: U+FFFD (text_rules)
    except UnicodeDecodeError as exc:
        raise ConversationFileError(
            f"{name} is not a text file in UTF-8, so it is not a SpecChat conversation export."
        ) from exc
    except json.JSONDecodeError as exc:
        raise ConversationFileError(
            f"{name} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}), so it was not imported."
        ) from exc
    except RecursionError as exc:
        raise ConversationFileError(f"{name} is nested too deeply to be a SpecChat conversation export.") from exc
    try:
        return check_conversation(data)
    except ConversationFileError as exc:
        raise ConversationFileError(f"{name} was not imported: {exc}") from None


def check_conversation(data) -> dict:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConversationFileError(
            "it is not a SpecChat conversation export (a JSON file made by File → Export conversation…)."
        )
    version = data.get("version")
    if not _is_int(version) or version < 1:
        raise ConversationFileError(f"its format version {version!r} is not one SpecChat knows.")
    if version > VERSION:
        raise ConversationFileError(
            f"it was exported by a newer SpecChat (format version {version}; this one "
            f"reads version {VERSION}). Update SpecChat to import it."
        )
    title = data.get("title", "")
    _need(
        isinstance(title, str) and len(title) <= MAX_NAME_CHARS,
        f"its title must be text of at most {MAX_NAME_CHARS} characters",
    )
    settings = data.get("settings")
    settings = {} if settings is None else settings
    _need(isinstance(settings, dict), "its settings must be an object")
    settings = _without_credentials(settings)  # an older export's server URL may hold a password: never kept
    _check_settings(settings)
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ConversationFileError("it has no list of messages.")
    _need(len(messages) <= MAX_MESSAGES, f"it has {len(messages)} messages; at most {MAX_MESSAGES} can be imported")
    children: dict[int | None, set[int]] = {None: set()}
    checked = []
    for n, m in enumerate(messages, 1):
        checked.append(_check_message(m, n, children))
    for m in checked:
        choice = m["active_child"]
        _need(
            choice is None or choice in children[m["id"]],
            f"message {m['id']} shows message {choice} below it, which does not answer it",
        )
    root = data.get("active_root")
    _need(
        root is None or (_is_int(root) and root in children[None]),
        f"the first message shown ({root!r}) is not one of the first messages",
    )
    return {"title": title, "settings": settings, "messages": checked, "active_root": root}


def _check_message(m, n: int, children: dict[int | None, set[int]]) -> dict:
    _need(isinstance(m, dict), f"message {n} is not an object")
    mid, parent = m.get("id"), m.get("parent")
    where = f"message {n} (id {mid!r})"
    _need(_is_int(mid) and mid not in children, f"{where} needs an id (a whole number) no other message has")
    # A parent listed before its child: so the messages always form a tree, never a loop.
    _need(
        parent is None or (_is_int(parent) and parent in children),
        f"{where} answers message {parent!r}, which does not come before it",
    )
    role, content = m.get("role"), m.get("content")
    _need(role in ROLES, f"{where} has the role {role!r}; it must be one of {', '.join(ROLES)}")
    _need(
        isinstance(content, str) and len(content) <= MAX_TEXT_CHARS,
        f"{where} needs its content as text of at most {MAX_TEXT_CHARS} characters",
    )
    status = m.get("status", "done")
    _need(status in STATUSES, f"{where} has the status {status!r}; it must be one of {', '.join(STATUSES)}")
    model, notice = m.get("model", ""), m.get("notice", "")
    _need(isinstance(model, str) and len(model) <= MAX_NAME_CHARS, f"{where}: its model name must be short text")
    _need(isinstance(notice, str) and len(notice) <= MAX_TEXT_CHARS, f"{where}: its notice must be text")
    stats = m.get("stats")
    _need(stats is None or isinstance(stats, dict), f"{where}: its stats must be an object")
    if stats:
        _check_stats(stats, where)
    spans = m.get("draft_spans") or []
    _need(
        isinstance(spans, list)
        and all(
            isinstance(s, list)
            and len(s) in (2, 3)
            and all(_is_int(x) for x in s[:2])
            and 0 <= s[0] < s[1] <= len(content)
            and (len(s) == 2 or s[2] in SPAN_SOURCES)
            for s in spans
        ),
        f"{where}: its draft spans must be [start, end] or [start, end, proposer] within its text",
    )
    choice = m.get("active_child")
    _need(choice is None or _is_int(choice), f"{where}: the message shown below it must be an id")
    children[mid] = set()
    children[parent].add(mid)
    return {
        "id": mid,
        "parent": parent,
        "role": role,
        "content": content,
        "status": status,
        "model": without_credentials(model),
        "stats": _without_credentials(stats),
        "draft_spans": [list(s) for s in spans],
        "notice": without_credentials(notice),
        "active_child": choice,
    }


def _check_stats(stats: dict, where: str) -> None:
    for key, value in stats.items():
        if key in STATS_NUMBERS:
            ok = value is None or _is_number(value)
        elif key in STATS_TEXTS:
            ok = value is None or isinstance(value, str)
        elif key in STATS_FLAGS:
            ok = isinstance(value, bool)
        elif key in STATS_NUMBER_LISTS:
            ok = isinstance(value, list) and all(_is_number(x) for x in value)
        elif key in STATS_PAIR_LISTS:
            ok = isinstance(value, list) and all(
                isinstance(p, list) and len(p) == 2 and all(map(_is_number, p)) for p in value
            )
        elif key in STATS_COUNTS:
            ok = isinstance(value, dict) and all(
                isinstance(name, str)
                and isinstance(counts, dict)
                and all(isinstance(k, str) and _is_int(n) for k, n in counts.items())
                for name, counts in value.items()
            )
        else:  # a figure this version does not show: kept as it is, if it is plain
            ok = value is None or isinstance(value, (str, bool)) or _is_number(value)
        _need(
            ok,
            f"{where}: its stats figure {key!r} has the value {str(value)[:60]!r}, which is not "
            "one of that figure's kind",
        )


def _check_settings(settings) -> None:
    _need(isinstance(settings, dict), "its settings must be an object")
    for key, value in settings.items():
        if key in FIELDS:
            try:
                check_field(key, value)
            except ValueError as exc:
                raise ConversationFileError(f"its setting {exc}") from None
        else:
            _need(
                value is None or isinstance(value, (str, bool)) or _is_number(value),
                f"its setting {key!r} must be plain text, a number or on/off",
            )


def _need(ok: bool, problem: str) -> None:
    if not ok:
        raise ConversationFileError(problem + ".")


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    # An int of 400 digits is no figure, and math.isfinite would raise OverflowError turning it into a float.
    return abs(value) < 2**63 if isinstance(value, int) else math.isfinite(value)
