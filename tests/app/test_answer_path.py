"""The one answer path (app/answers.py): every source's signals and failures come out of run_answer alike, and one
Send reads the conversation once and resolves the chat's settings once (no model needed here)."""

from types import SimpleNamespace

from app.answers import GenerationRequest, run_answer
from app.engine_answers import NO_MODEL, PLAIN_WHILE_SERVING, LocalAnswers, ServedAnswers
from engine.errors import EngineError

from support.fake_engine import FakeEngine


def recorder() -> tuple[SimpleNamespace, list]:
    """Signals as the worker has them, each emit recorded as (name, *args)."""
    said: list = []
    signals = SimpleNamespace(
        **{
            name: SimpleNamespace(emit=lambda *args, name=name: said.append((name, *args)))
            for name in ("started", "progress", "finished", "failed", "notice")
        }
    )
    return signals, said


class Source:
    failure, what = "The engine failed", "a test answer"

    def __init__(self, raises: Exception, figures: dict | None = None):
        self.raises, self.figures = raises, figures

    def answer(self, request, out) -> None:
        if self.figures is not None:
            out.figures = lambda: self.figures
            out.add([("held", False)])  # batched: shown with the failure, not lost
        raise self.raises


def test_an_unexpected_failure_is_worded_by_the_source_and_an_engine_error_as_it_is():
    signals, said = recorder()
    request = GenerationRequest([{"role": "user", "content": "Hi"}])
    run_answer(Source(ValueError("boom")), request, signals)
    assert said == [("started", request.id), ("failed", request.id, "The engine failed: ValueError: boom", {})]

    signals, said = recorder()
    run_answer(Source(EngineError("The prompt does not fit."), figures={"generated": 3}), request, signals)
    assert said == [
        ("started", request.id),
        ("progress", request.id, [("held", False)], {"generated": 3}),
        ("failed", request.id, "The prompt does not fit.", {"generated": 3}),
    ]


def test_this_machines_engine_without_a_model_and_a_plain_answer_while_serving_say_why():
    signals, said = recorder()
    request = GenerationRequest([{"role": "user", "content": "Hi"}])
    run_answer(LocalAnswers(SimpleNamespace(decoder=None)), request, signals)
    assert said == [("started", request.id), ("failed", request.id, NO_MODEL, {})]
    assert NO_MODEL == "No model is loaded. Choose one in Settings or Models…."

    signals, said = recorder()
    plain = GenerationRequest([{"role": "user", "content": "Hi"}], plain=True)
    run_answer(ServedAnswers(SimpleNamespace()), plain, signals)
    assert said == [("started", plain.id), ("failed", plain.id, PLAIN_WHILE_SERVING, {})]


def test_one_send_goes_to_the_store_once_and_resolves_the_chats_settings_once(qapp, monkeypatch):
    from app.chat.session import ChatSession
    from app.conversations.store import MEMORY, ConversationStore
    from app.settings.presets import PresetBook
    from app.settings.values import AppSettings

    store = ConversationStore(MEMORY)
    calls: dict[str, int] = {}

    def counted(owner, name):
        real = getattr(owner, name)

        def count(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, count)

    for name in ("tree", "conversation_settings", "transaction"):
        counted(store, name)
    counted(PresetBook, "effective")
    engine = FakeEngine()
    session = ChatSession(store, engine, lambda: AppSettings(system_prompt="Be brief."))
    for text in ("Hello", "And again"):  # a new chat, then one saved
        calls.clear()
        assert session.send(text)
        assert calls.get("transaction") == 1 and calls.get("tree") == 1 and calls.get("effective") == 1, calls
        request = engine.sent[-1]
        assert request.messages[0] == {"role": "system", "content": "Be brief."}
        assert request.messages[-1] == {"role": "user", "content": text}
        engine.finished.emit(request.id, {"finish_reason": "stop"})
        assert not session.busy
    assert [(m.role, m.status) for m in store.messages(session.conversation_id)] == [
        ("user", "done"),
        ("assistant", "done"),
        ("user", "done"),
        ("assistant", "done"),
    ]
