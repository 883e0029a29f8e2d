"""engine.text_rules: text from outside comes out encodable, names read as they are, answers show their bidi
controls instead of obeying them."""

import json

import pytest

from engine.text_rules import bidi_shown, loads, plain_name, valid_json, valid_text


def test_a_lone_surrogate_becomes_the_replacement_character_and_a_pair_is_joined():
    assert valid_text("half \ud800 an emoji") == "half \ufffd an emoji"
    assert valid_text("\ud83d\ude00") == "\U0001f600"  # a pair, as json.loads leaves "\\ud83d\\ude00"
    assert valid_text("héllo 😀") == "héllo 😀"
    assert valid_text("\udfff") == "\ufffd" and valid_text("ok ✓") == "ok ✓"
    valid_text("x\ud800y").encode("utf-8")  # the point: it encodes


def test_loads_makes_every_string_valid_keys_included():
    value = loads(r'{"a\ud800": ["\udc00", {"b": "\ud83d\ude00"}], "n": 1, "t": null}')
    assert value == {"a\ufffd": ["\ufffd", {"b": "\U0001f600"}], "n": 1, "t": None}
    json.dumps(value, ensure_ascii=False).encode("utf-8")


def test_loads_refuses_what_is_not_json_with_a_value_error_never_a_recursion_error():
    with pytest.raises(ValueError, match="nested too deeply"):
        loads("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="not UTF-8"):
        loads(b'{"a": "\xff"}')
    with pytest.raises(ValueError):
        loads("{")


def test_valid_json_walks_a_deep_value_without_recursion():
    deep: list = ["\ud800"]
    for _ in range(50_000):
        deep = [deep]
    fixed = valid_json(deep)
    for _ in range(50_000):
        fixed = fixed[0]
    assert fixed == ["\ufffd"]


def test_a_name_loses_its_bidi_controls_and_invisible_characters():
    assert plain_name("Invoice \u202efdp.exe") == "Invoice fdp.exe"
    assert plain_name("a\u200bb\u2066c\u2069\nd\td") == "abc d d"
    assert plain_name("  x \ud800 ") == "x \ufffd"


def test_an_answer_shows_its_bidi_controls_by_code_and_keeps_everything_else():
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # zero-width joiners: one emoji, kept
    assert bidi_shown(f"gnp\u202e.exe {family} עברית\u200f") == f"gnp⟨U+202E⟩.exe {family} עברית\u200f"
    assert bidi_shown("\u2066x\u2069") == "⟨U+2066⟩x⟨U+2069⟩"
