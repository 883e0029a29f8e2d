"""The chat's controller (app/chat/session.py) driven directly: no window, no widget, no model. A fake engine
stands where EngineClient does, and the test plays the engine's signals; the store is a real one, in memory.

What a person does in the window (send, stop, regenerate, edit, continue, switch branches, delete a chat) is a call
here, and what the window shows is the session's ChatModel and signals."""

from __future__ import annotations

import sqlite3

import pytest

import app.chat.response as response_module
from app.chat.session import ChatSession, title_from
from app.conversations import held_answers
from app.conversations.store import MEMORY, ConversationStore
from app.settings.values import AppSettings

from support.fake_engine import FakeEngine


class Heard:
    """Every signal the session sends the window, as (name, *args)."""

    def __init__(self, session: ChatSession):
        self.said: list[tuple] = []
        for name in (
            "busyChanged",
            "noticeRaised",
            "conversationsChanged",
            "responseFinished",
            "responseFailed",
            "saveNotice",
        ):
            getattr(session, name).connect(lambda *args, name=name: self.said.append((name, *args)))

    def named(self, name: str) -> list[tuple]:
        return [s[1:] for s in self.said if s[0] == name]


@pytest.fixture
def chat(qapp):
    store = ConversationStore(MEMORY)
    engine = FakeEngine()
    session = ChatSession(store, engine, lambda: AppSettings(system_prompt="Be brief."))
    session.model_name = "Test model"
    yield session, engine, store, Heard(session)
    store.close()


def shown(session: ChatSession) -> list[tuple[str, str, str]]:
    return [(m.role, m.content, m.status) for m in session.model.items]


def test_a_message_sent_in_a_new_chat_is_saved_answered_and_shown_as_it_streams(chat):
    session, engine, store, heard = chat
    assert session.send("  What is a lighthouse?  ")
    cid = session.conversation_id
    assert store.conversation(cid).title == "What is a lighthouse?"
    assert session.busy and heard.named("busyChanged") == [(True,)]
    assert shown(session) == [("user", "What is a lighthouse?", "done"), ("assistant", "", "streaming")]
    request = engine.sent[-1]
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a lighthouse?"},
    ]
    assert session.request is request and session.streaming is session.model.items[-1]

    engine.progress.emit(request.id, [("A tower ", False), ("with a light.", "lookup")], {"generated": 4})
    answer = session.model.items[-1]
    assert answer.content == "A tower with a light." and answer.model == "Test model"
    assert answer.draft_spans == [[8, 21, "lookup"]]
    engine.finished.emit(request.id, {"finish_reason": "stop", "generated": 4})

    assert not session.busy and heard.named("busyChanged") == [(True,), (False,)]
    assert heard.named("responseFinished") == [({"finish_reason": "stop", "generated": 4},)]
    assert cid in [c for (c,) in heard.named("conversationsChanged")]
    saved = store.messages(cid)
    assert [(m.role, m.content, m.status) for m in saved] == [
        ("user", "What is a lighthouse?", "done"),
        ("assistant", "A tower with a light.", "done"),
    ]


def test_nothing_is_sent_while_an_answer_is_written_nor_an_empty_message(chat):
    session, engine, _, _ = chat
    assert not session.send("   ")
    assert session.send("One")
    assert not session.send("Two") and len(engine.sent) == 1
    engine.answer("Done.")
    assert session.send("Two") and len(engine.sent) == 2


def test_regenerating_keeps_the_old_answer_as_a_branch_and_switching_shows_either(chat):
    session, engine, store, _ = chat
    session.send("Name a colour.")
    engine.answer("Blue.")
    first = session.model.items[-1]
    assert session.regenerate()
    assert engine.sent[-1].messages[-1] == {"role": "user", "content": "Name a colour."}  # the same question
    engine.answer("Red.")
    second = session.model.items[-1]
    assert shown(session)[-1] == ("assistant", "Red.", "done")
    assert session.model.branch(1) == (2, 2)

    assert session.switch_branch(second, -1)
    assert session.model.items[-1].id == first.id and session.model.items[-1].content == "Blue."
    assert store.tree(session.conversation_id).path()[-1].id == first.id  # the branch shown is saved
    assert not session.switch_branch(session.model.items[-1], -1)  # nothing before the first


def test_an_edited_first_question_is_a_new_branch_and_the_title_follows_it(chat):
    session, engine, store, _ = chat
    session.send("How tall is it?")
    engine.answer("Which one?")
    assert session.resend_edited("How tall is the lighthouse?")
    engine.answer("Thirty metres.")
    cid = session.conversation_id
    assert store.conversation(cid).title == title_from("How tall is the lighthouse?")
    assert [m.content for m in session.model.items] == ["How tall is the lighthouse?", "Thirty metres."]

    assert session.switch_branch(session.model.items[0], -1)  # back to the first question: its title too
    assert store.conversation(cid).title == "How tall is it?"

    store.rename(cid, "My own title")  # a title the person chose stays
    assert session.switch_branch(session.model.items[0], 1)
    assert store.conversation(cid).title == "My own title"


def test_an_answer_cut_short_is_continued_in_the_same_message_and_a_failed_continuation_leaves_it_as_it_was(chat):
    session, engine, _, heard = chat
    session.send("Count to ten.")
    rid = engine.sent[-1].id
    engine.progress.emit(rid, [("1 2 3", False)], {})
    engine.finished.emit(rid, {"finish_reason": "length"})
    answer = session.model.items[-1]
    assert answer.status == "done"

    assert session.continue_answer()
    request = engine.sent[-1]
    assert request.continue_last and request.messages[-1] == {"role": "assistant", "content": "1 2 3"}
    assert answer.status == "streaming" and session.streaming is answer
    engine.progress.emit(request.id, [(" 4 5", False)], {})
    engine.failed.emit(request.id, "The engine failed: no memory", {})
    assert answer.content == "1 2 3 4 5" and answer.status == "done"  # as it was, with what came
    assert answer.stats == {"finish_reason": "length"} and answer.notice == "The engine failed: no memory"
    assert heard.named("responseFailed") == [("The engine failed: no memory",)]
    assert ("The engine failed: no memory", "error") in heard.named("noticeRaised")
    assert session.continue_answer()  # it can be continued again


def test_a_failed_answer_says_why_under_it(chat):
    session, engine, store, _ = chat
    session.send("Hello")
    engine.failed.emit(engine.sent[-1].id, "No model is loaded.", {})
    answer = session.model.items[-1]
    assert (answer.status, answer.notice) == ("error", "No model is loaded.")
    assert store.messages(session.conversation_id)[-1].status == "error"
    session.send("Again")  # a failed answer is left out of what the model is sent
    assert engine.sent[-1].messages[1:] == [{"role": "user", "content": "Hello"}, {"role": "user", "content": "Again"}]


def test_stop_ends_the_answer_even_when_the_engine_never_says_so(chat, qtbot, monkeypatch):
    monkeypatch.setattr(response_module, "STOP_GRACE_S", 0.05)
    session, engine, store, heard = chat
    session.send("Write a long story.")
    request = engine.sent[-1]
    engine.progress.emit(request.id, [("Once", False)], {})
    session.stop()
    assert request.cancel.is_set()
    qtbot.waitUntil(lambda: not session.busy, timeout=5_000)
    answer = store.messages(session.conversation_id)[-1]
    assert answer.status == "stopped" and answer.content == "Once" and "did not stop within" in answer.notice
    assert heard.named("responseFinished")[-1][0]["finish_reason"] == "cancelled"
    engine.finished.emit(request.id, {"finish_reason": "cancelled"})  # late: not this session's request any more
    assert len(heard.named("responseFinished")) == 1


def test_a_stalled_answer_says_so_until_text_comes_again(chat, qtbot, monkeypatch):
    monkeypatch.setattr(response_module, "STALL_AFTER_S", 0.0)
    session, engine, _, _ = chat
    session.send("Think hard.")
    answer = session.model.items[-1]
    qtbot.waitUntil(lambda: answer.notice.startswith("No text yet after"), timeout=5_000)
    engine.progress.emit(engine.sent[-1].id, [("Here.", False)], {})
    assert answer.notice == ""


def test_the_chats_own_settings_go_with_its_answers_and_a_remote_chat_is_answered_there(chat):
    session, engine, store, _ = chat
    session.set_conversation_settings({"preset": "Default", "system_prompt": "Answer in French."})
    session.send("Hello")  # the new chat keeps what was set before its first message
    assert engine.sent[-1].messages[0] == {"role": "system", "content": "Answer in French."}
    assert store.conversation_settings(session.conversation_id)["system_prompt"] == "Answer in French."
    engine.answer("Bonjour.")
    assert session.remote_endpoint() is None and session.answering_model() == "Test model"

    session.set_conversation_settings({"engine_url": "http://127.0.0.1:9", "engine_model": "big"})
    endpoint = session.remote_endpoint()
    assert (endpoint.url, endpoint.model) == ("http://127.0.0.1:9", "big")
    assert session.answering_model() == "big @ 127.0.0.1:9"
    session.send("Encore")
    assert engine.sent[-1].remote == endpoint
    assert session.model.items[-1].model == "big @ 127.0.0.1:9"

    session.new_conversation()
    assert session.conversation_settings() == {} and session.remote_endpoint() is None


def test_deleting_the_chat_being_answered_stops_it_and_forgets_it(chat):
    session, engine, store, _ = chat
    session.send("Hello")
    cid, request = session.conversation_id, engine.sent[-1]
    store.delete_conversation(cid)
    session.forget(cid)
    assert request.cancel.is_set() and session.conversation_id is None and session.model.items == []
    engine.progress.emit(request.id, [("late", False)], {})
    engine.finished.emit(request.id, {"finish_reason": "cancelled"})
    assert not session.busy


def refuse_writes(monkeypatch, store: ConversationStore) -> dict:
    """The store's message updates fail as on a full disk while refusing["on"]."""
    refusing = {"on": True}
    update = store.update_message

    def full(message) -> None:
        if refusing["on"]:
            raise sqlite3.OperationalError("database or disk is full")
        update(message)

    monkeypatch.setattr(store, "update_message", full)
    return refusing


def test_an_answer_the_store_refuses_goes_on_is_held_told_once_and_saved_when_it_can_be(chat, monkeypatch):
    monkeypatch.setattr(response_module, "SAVE_EVERY_S", 0.0)  # a save at every piece: many refused
    session, engine, store, heard = chat
    session.send("Hello")
    refusing = refuse_writes(monkeypatch, store)
    rid = engine.sent[-1].id
    for word in ("One ", "two ", "three."):
        engine.progress.emit(rid, [(word, False)], {})
    engine.finished.emit(rid, {"finish_reason": "stop"})

    assert not session.busy and session.unsaved == 1
    unsaved = [n for n in heard.named("saveNotice") if n[2] == "unsaved"]
    assert len(unsaved) == 1 and unsaved[0][1] == "error" and "the disk is full" in unsaved[0][0]
    assert session.model.items[-1].content == "One two three."  # shown from memory
    session.open(session.conversation_id)
    assert session.model.items[-1].content == "One two three."  # and when the chat is opened again
    assert not session.save_unsaved()

    refusing["on"] = False
    assert session.save_unsaved() and session.unsaved == 0
    assert heard.named("saveNotice")[-1] == ("Saved now: no answer is waiting to be saved any more.", "info", "unsaved")
    assert store.messages(session.conversation_id)[-1].content == "One two three."


def test_answers_still_refused_at_close_are_kept_for_the_next_start_once(chat, monkeypatch):
    session, engine, store, _ = chat
    written: list[str] = []
    monkeypatch.setattr(
        held_answers, "write_text", lambda text, count: written.append(text) or held_answers.places()[0]
    )
    session.send("Hello")
    refuse_writes(monkeypatch, store)
    engine.answer("Kept.")
    assert session.unsaved == 1

    assert session.keep_held() is not None  # the window asks whether it can keep them before closing...
    assert session.close()  # ...and closing keeps them: the same answers, not written again
    assert len(written) == 1 and "Kept." in written[0]
    assert session.unsaved == 0 and session.close()  # nothing left to ask about


def test_an_answer_still_streaming_at_close_is_kept_as_stopped(chat, monkeypatch):
    monkeypatch.setattr(response_module, "SAVE_EVERY_S", 0.0)
    session, engine, store, _ = chat
    written: list[str] = []
    monkeypatch.setattr(
        held_answers, "write_text", lambda text, count: written.append(text) or held_answers.places()[0]
    )
    session.send("Hello")
    engine.progress.emit(engine.sent[-1].id, [("Half", False)], {})
    refuse_writes(monkeypatch, store)
    engine.progress.emit(engine.sent[-1].id, [(" an answer", False)], {})
    session.save_unsaved()
    assert session.keep_held() is not None and '"streaming"' in written[-1]
    assert session.close()
    assert len(written) == 2 and '"stopped"' in written[-1] and "Stopped because the app was closed." in written[-1]


def test_a_question_the_store_refuses_is_not_sent(chat, monkeypatch):
    session, engine, store, heard = chat

    def refused(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "create_conversation", refused)
    assert not session.send("Hello")
    assert engine.sent == [] and session.conversation_id is None and not session.busy
    text, level, key = heard.named("saveNotice")[-1]
    assert key == "unsent" and level == "error" and text.startswith("Not sent: the disk is full")
