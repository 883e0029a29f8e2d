"""Fuzz: the conversation import reader (app/conversations/files.py import_json and its checks). A real export,
mutated field by field or byte by byte, imports or is refused with ConversationFileError (a message for a person,
nothing added): never another exception. What imports reads back whole: as many messages as the file held, every
text in them, the title and the settings UTF-8 text, and valid text kept exactly."""

import copy
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.conversations.files import ConversationFileError, conversation_data, import_json
from app.conversations.store import MEMORY, ConversationStore, Message

from support.fuzz_values import texts_in
from support.fuzz_watchdog import bounded

FUZZ = settings.get_profile("specchat-fuzz")
STATS = {
    "tokens_per_s": 41.5,
    "ttft_s": 0.12,
    "drafted": 10,
    "accepted": 7,
    "acceptance_rate": 0.7,
    "method": "lookup",
    "backend": "CPU",
    "finish_reason": "length",
    "generated": 12,
    "rate_history": [[0.1, 40.0]],
    "per_position_acceptance": [0.9, 0.5],
    "speculation_paused": False,
}


def exported() -> dict:
    """A real export: two branches, stats, draft spans, a notice and settings."""
    store = ConversationStore(MEMORY)
    try:
        cid = store.create_conversation("Colours")
        store.set_conversation_settings(cid, {"preset": "Precise", "temperature": 0.2, "system_prompt": "Be brief."})
        q = store.add_message(cid, Message(None, "user", "Name a colour."), parent=None)
        a = store.add_message(
            cid,
            Message(None, "assistant", "Red.", model="gemma", stats=STATS, draft_spans=[[0, 3, "lookup"]]),
            parent=q,
        )
        store.add_message(
            cid, Message(None, "assistant", "Blue.", status="stopped", model="smollm2", notice="Stopped."), parent=q
        )
        store.set_active(a)
        return conversation_data(store, cid)
    finally:
        store.close()


BASE = exported()


def paths(value, at=()):
    """Every place in value (dict keys, list indexes), the root included."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, (*at, i))


PATHS = list(paths(BASE))[1:]

hostile_text = st.one_of(
    st.text(max_size=20),
    st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=20),
    st.sampled_from(
        [
            "\ud800",
            "a\udfffb",
            "\u202eexe.txt",
            "\x00",
            "\r\n",
            "specchat-conversation",
            "done",
            "assistant",
            "http://me:pw@host/x",
        ]
    ),
)
BIG_TEXTS = ["y" * 1_001, "y" * 4_000_001]  # just past a name's limit, a message's
# 10**400 (too big for a float) has its own test below while files.py fails on it, so it hides nothing else here.
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10),
    st.integers(),
    st.just(2**64),
    st.floats(),
    hostile_text,
    st.sampled_from(BIG_TEXTS),
)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=10,
)


@st.composite
def mutated(draw) -> dict:
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        holder = doc
        try:
            for key in path[:-1]:
                holder = holder[key]
            key = path[-1]
            op = draw(st.sampled_from(["set", "set", "delete", "copy"]))
            if op == "set":
                holder[key] = draw(value)
            elif op == "delete":
                del holder[key]
            else:  # a duplicate of a sibling: ids and parents repeated, cycles tried
                holder.append(copy.deepcopy(holder[key])) if isinstance(holder, list) else None
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation took that place away
    if draw(st.booleans()):
        doc["messages"] = (
            doc.get("messages")
            if not isinstance(doc.get("messages"), list)
            else doc["messages"] + draw(st.lists(value, max_size=2))
        )
    return doc


def write(tmp_path, name: str, raw: bytes):
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def encoded(doc, ascii_only: bool) -> bytes:
    text = json.dumps(doc, ensure_ascii=ascii_only)  # NaN and Infinity as Python writes them
    return text.encode("utf-8", "surrogatepass")  # a raw surrogate's bytes: not UTF-8, as a hostile file may be


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def expect_import_or_refusal(store: ConversationStore, path) -> None:
    before = len(store.conversations())
    try:
        with bounded("the conversation import"):
            cid = import_json(store, path)
    except ConversationFileError as exc:
        str(exc).encode("utf-8")  # the message is shown to a person
        assert len(store.conversations()) == before  # nothing added
        return
    sent = json.loads(path.read_bytes().decode("utf-8-sig"))  # it imported: UTF-8 JSON
    tree = store.tree(cid)
    assert len(tree.messages) == len(sent["messages"])  # nothing lost
    title = store.conversation(cid).title
    for text in [title, *texts_in(store.conversation_settings(cid))]:
        text.encode("utf-8")
    for m in tree.messages.values():
        for text in [m.content, m.model, m.notice, m.role, m.status, *texts_in(m.stats), *texts_in(m.draft_spans)]:
            text.encode("utf-8")
    stored = [m.content for _, m in sorted(tree.messages.items())]
    for original, kept in zip([m["content"] for m in sent["messages"]], stored):
        assert kept == original or not is_utf8(original)  # valid text exactly; a lone surrogate replaced


@pytest.fixture(scope="module")
def store():
    s = ConversationStore(MEMORY)
    yield s
    s.close()


@settings(FUZZ, max_examples=100)
@given(mutated(), st.booleans())
@example({**BASE, "messages": [{**BASE["messages"][0], "content": "\ud800"}]}, True)
@example({**BASE, "messages": [{**BASE["messages"][0], "content": "\ud800"}]}, False)
@example({**BASE, "title": "a\udfffb"}, True)
def test_a_mutated_export_imports_or_is_refused(store, tmp_path_factory, doc, ascii_only):
    path = write(tmp_path_factory.getbasetemp(), "fuzzed.json", encoded(doc, ascii_only))
    expect_import_or_refusal(store, path)


@st.composite
def damaged_bytes(draw) -> bytes:
    raw = bytearray(json.dumps(BASE).encode("utf-8"))
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "deep"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif kind == "truncate":
        del raw[draw(st.integers(0, len(raw))) :]
    elif kind == "insert":
        at = draw(st.integers(0, len(raw)))
        raw[at:at] = draw(st.binary(max_size=30))
    else:
        n = draw(st.integers(1, 200_000))
        at = raw.index(b'"settings": ') + len(b'"settings": ')
        raw[at:at] = b"[" * n + b"]" * n + b', "x": '
    return bytes(draw(st.sampled_from([b"", b"\xef\xbb\xbf"])) + raw)


@settings(FUZZ, max_examples=150)
@given(damaged_bytes())
@example(b"")
@example(b"\xff\xfe\x00")
@example(b"[" * 100_000)
def test_a_damaged_file_imports_or_is_refused(store, tmp_path_factory, raw):
    expect_import_or_refusal(store, write(tmp_path_factory.getbasetemp(), "damaged.json", raw))


@pytest.mark.parametrize(
    "doc",
    [
        {**BASE, "settings": {"unknown": 10**400}},
        {
            **BASE,
            "messages": [{**BASE["messages"][0], "stats": {"ttft_s": 10**400}, "active_child": None}],
            "active_root": 1,
        },
    ],
    ids=["setting", "stats figure"],
)
def test_a_number_too_big_for_a_float_is_refused(store, tmp_path, doc):
    expect_import_or_refusal(store, write(tmp_path, "huge-number.json", encoded(doc, True)))
