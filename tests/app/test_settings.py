"""Settings: round-trip, corrupt and invalid files fall back to defaults with a notice."""

import json
from dataclasses import asdict, replace

import pytest

from app.settings.values import AppSettings, load_settings, save_settings, settings_path, what_changed
from engine.errors import InvalidSettingError


def test_round_trip_in_the_config_dir(dirs):
    s = AppSettings(
        model="/models/t.gguf",
        draft="/models/d.gguf",
        method="draft",
        max_draft=8,
        min_draft=2,
        p_min=0.6,
        adaptive=False,
        temperature=0.3,
        top_k=20,
        top_p=0.9,
        min_p=0.1,
        seed=42,
        n_ctx=8192,
        n_gpu_layers=20,
        threads=3,
        flash_attention=False,
        max_tokens=300,
        system_prompt="Be kind.",
        color_drafts=True,
        show_sparkline=False,
    )
    save_settings(s)
    assert settings_path().parent == dirs / "config"
    loaded, notices = load_settings()
    assert loaded == s and notices == []


def test_missing_file_gives_defaults_quietly(dirs):
    assert load_settings() == (AppSettings(), [])


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\xff\xfe garbage"])
def test_corrupt_file_falls_back_with_notice_and_is_kept(dirs, content):
    path = settings_path()
    data = content.encode("latin-1")
    path.write_bytes(data)
    settings, notices = load_settings()
    assert settings == AppSettings()
    assert len(notices) == 1 and "could not be read" in notices[0] and "defaults" in notices[0]
    kept = list(path.parent.glob("settings.corrupt-*.json"))
    assert len(kept) == 1 and kept[0].read_bytes() == data
    assert not path.exists()  # the next save writes a fresh file; the bad one is kept aside


def test_invalid_values_reset_only_those_keys(dirs):
    raw = asdict(AppSettings(temperature=0.5, top_k=10))
    raw.update(top_p=7, seed="abc", threads=0, method="magic", flash_attention="yes", unknown_future_key=1)
    settings_path().write_text(json.dumps(raw))
    settings, notices = load_settings()
    assert settings.temperature == 0.5 and settings.top_k == 10  # the good values survive
    assert settings.top_p == AppSettings().top_p and settings.seed is None and settings.threads is None
    assert settings.flash_attention is None
    assert settings.method == AppSettings().method
    assert notices and all(k in notices[0] for k in ("top_p", "seed", "threads", "method"))
    assert "unknown_future_key" not in notices[0]


def test_values_that_clash_reset_speculation(dirs):
    raw = asdict(AppSettings())
    raw.update(min_draft=10, max_draft=4, method="draft", draft=None, temperature=0.1)
    settings_path().write_text(json.dumps(raw))
    settings, notices = load_settings()
    assert (settings.min_draft, settings.max_draft, settings.method) == (1, AppSettings().max_draft, "lookup")
    assert settings.temperature == 0.1
    assert "speculation" in notices[0]


def test_validation_messages_are_for_people():
    with pytest.raises(InvalidSettingError, match="temperature must be a number 0..5"):
        AppSettings(temperature=9).validated()
    with pytest.raises(InvalidSettingError, match="needs a draft model"):
        AppSettings(method="draft").validated()
    with pytest.raises(InvalidSettingError, match="must not exceed"):
        AppSettings(min_draft=5, max_draft=3).validated()
    AppSettings(method="draft", speculation=False).validated()  # off: no draft needed


def test_what_a_change_needs():
    base = AppSettings()
    assert what_changed(base, replace(base, model="/x.gguf")) == "reload"
    assert what_changed(base, replace(base, n_ctx=2048)) == "reload"
    assert what_changed(base, replace(base, max_draft=4)) == "speculation"
    assert what_changed(base, replace(base, speculation=False)) == "speculation"
    assert what_changed(base, replace(base, temperature=0.1, color_drafts=True)) == ""
    d = base.decoder_settings()
    assert (d.method, d.max_draft) == ("lookup", AppSettings().max_draft)
    assert replace(base, speculation=False).decoder_settings().method == "none"


def test_a_file_too_deeply_nested_to_parse_is_set_aside(dirs):
    path = settings_path()
    path.write_text("[" * 100_000)  # json.loads raises RecursionError here, not ValueError
    settings, notices = load_settings()
    assert settings == AppSettings() and "could not be read" in notices[0]
    kept = list(path.parent.glob("settings.corrupt-*.json"))
    assert len(kept) == 1 and kept[0].read_text() == "[" * 100_000 and not path.exists()
    assert load_settings() == (AppSettings(), [])  # the next launch starts clean


def test_a_lone_surrogate_is_saved_and_read_back_unchanged(dirs):
    typed = AppSettings(system_prompt="Be brief \ud800 and kind ✓")  # Qt can hand over half a surrogate pair
    save_settings(typed)
    assert load_settings() == (typed, [])
    assert "✓" in settings_path().read_text(encoding="utf-8")  # still readable UTF-8 text
    assert not list(settings_path().parent.glob("*.tmp"))


def test_an_unusable_config_folder_gives_defaults_and_says_settings_are_not_saved(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECCHAT_CONFIG_DIR", str(blocker / "config"))  # mkdir fails: NotADirectoryError
    settings, notices = load_settings()
    assert settings == AppSettings()
    assert len(notices) == 1 and notices[0].startswith(
        f"Settings will not be saved: {blocker / 'config'} is not writable ("
    )
    with pytest.raises(OSError):  # the window turns this into a notice (test_chat_window)
        save_settings(AppSettings(top_k=3))
    assert blocker.read_text() == "not a folder"
