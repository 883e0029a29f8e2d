"""Answers the conversation file would not take when SpecChat closed (a full disk), kept in a file of their own
until the next start saves them where they belong.

Held in memory only, such an answer was lost at close: the file kept what it took before the disk filled (276 of
3,954 characters in a report). So close writes the answers still held to the first place that takes them: the
data folder (space may come back there), the cache folder, then the system's temporary folder (often another
disk, or memory). The next start puts them into the store and removes the file.

The file is the user's alone (PRIVATE_FILE). One found in the shared temporary folder is used only if this user
owns it and nobody else may write it: anybody can write there, and what it says would go into the user's chats.
No Qt here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path

from app.conversations.store import STATUSES, ConversationStore, Message, open_store
from engine import safe_files, text_rules
from engine.paths import cache_dir, data_dir, write_text_atomic

log = logging.getLogger(__name__)

FORMAT = "specchat-held-answers"
MAX_BYTES = 256 << 20  # a few answers of at most 4,000,000 characters each (conversations.files.MAX_TEXT_CHARS)


def places() -> list[Path]:
    """Where held answers are written, in order; named for the data folder, so two profiles never share one."""
    key = hashlib.sha256(str(data_dir().resolve()).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    name = f"held-answers-{key}.json"
    return [data_dir() / name, cache_dir() / name, Path(tempfile.gettempdir()) / f"specchat-{name}"]


def answers_text(held: list[tuple[int | None, Message]]) -> str:
    """The file's text for the held (conversation, message) pairs."""
    answers = [
        {
            "conversation": cid,
            "id": m.id,
            "content": m.content,
            "status": m.status,
            "model": m.model,
            "stats": m.stats,
            "draft_spans": m.draft_spans,
            "notice": m.notice,
        }
        for cid, m in held
    ]
    return json.dumps({"format": FORMAT, "answers": answers})


def write_text(text: str, count: int) -> Path | None:
    """answers_text's text (of count answers) in the first place that takes it: where, or None if none did."""
    for place in places():
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(place, text, private=True)
        except OSError as exc:
            log.warning("held answers could not be kept in %s: %s", place, exc)
            continue
        log.warning("%d answer(s) the conversation file refused are kept in %s until the next start", count, place)
        return place
    return None


def open_store_with_held() -> tuple[ConversationStore, list[str]]:
    """open_store(), with the answers held at the last close put in: what the app starts with."""
    store, notices = open_store()
    held = recover(store)
    if held:
        many = held != 1
        notices.insert(
            0,
            f"{held} answer{'s' if many else ''} that could not be saved when SpecChat closed (the "
            f"disk was full) {'are' if many else 'is'} saved in {'their' if many else 'its'} conversation "
            "now.",
        )
    return store, notices


def recover(store: ConversationStore) -> int:
    """Put the answers held at the last close into store, and remove their file once they are in: how many."""
    recovered = 0
    for place in places():
        answers = _read(place)
        if answers is None:
            continue
        try:
            with store.transaction():
                recovered += sum(_put(store, answer) for answer in answers)
        except Exception as exc:  # noqa: BLE001 - still not saved (the disk is still full): kept for next time
            log.warning("the answers held in %s are still not saved: %s", place, exc)
            continue
        place.unlink(missing_ok=True)
    return recovered


def _read(place: Path) -> list | None:
    try:
        st = os.lstat(place)
    except OSError:
        return None
    if not _trusted(st):
        log.warning("%s was not written by SpecChat for this user; it is left as it is and not read", place)
        return None
    try:
        data = text_rules.loads(safe_files.read_bytes(place, MAX_BYTES))
    except (safe_files.FileRefused, ValueError) as exc:
        log.warning("the held answers in %s cannot be read: %s", place, exc)
        return None
    answers = data.get("answers") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return answers if isinstance(answers, list) else None


def _trusted(st: os.stat_result) -> bool:
    """A regular file of this user's that no one else may write (on systems that have users)."""
    if not stat.S_ISREG(st.st_mode):
        return False
    getuid = getattr(os, "getuid", None)
    return getuid is None or (st.st_uid == getuid() and not st.st_mode & 0o022)


def _put(store: ConversationStore, answer) -> bool:
    """The held answer over its row, if that row is still the answer it was (same conversation, an assistant's, and
    what was saved of it is where the held text starts)."""
    if not (
        isinstance(answer, dict)
        and isinstance(answer.get("id"), int)
        and isinstance(answer.get("content"), str)
        and answer.get("status") in STATUSES
    ):
        return False
    row = store.db.execute("SELECT conversation_id, role, content FROM messages WHERE id=?", (answer["id"],)).fetchone()
    if (
        row is None
        or row[0] != answer.get("conversation")
        or row[1] != "assistant"
        or not answer["content"].startswith(row[2])
    ):
        return False
    stats, spans = answer.get("stats"), answer.get("draft_spans")
    model, notice = answer.get("model"), answer.get("notice")
    store.update_message(
        Message(
            id=answer["id"],
            role="assistant",
            content=answer["content"],
            status=answer["status"],
            model=model if isinstance(model, str) else "",
            stats=stats if isinstance(stats, dict) else None,
            draft_spans=spans if isinstance(spans, list) else [],
            notice=notice if isinstance(notice, str) else "",
        )
    )
    store.touch(row[0])
    return True
