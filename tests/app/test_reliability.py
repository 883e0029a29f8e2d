"""Startup and saving when the disk does not cooperate: the window opens, nothing raises into the UI,
and every problem is told in a notice."""
from app.settings import load_settings


def test_saving_never_raises_into_the_window(make_window, dirs, monkeypatch):
    window = make_window()
    window.apply_settings(window.settings.merged({"system_prompt": "half an emoji: \ud83d"}))
    assert load_settings()[0].system_prompt == "half an emoji: \ud83d"  # saved as typed
    assert not any("could not be saved" in t for t in window.notices.texts())

    blocker = dirs / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(blocker / "config"))  # as a vanished or unwritable folder
    window.apply_settings(window.settings.merged({"system_prompt": "kept until quit"}))
    assert window.settings.system_prompt == "kept until quit"
    assert any(t.startswith("Settings could not be saved (") for t in window.notices.texts())
