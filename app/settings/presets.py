"""Presets: a named system prompt and sampling values, saved in presets.json beside settings.json.

A conversation keeps the name of its preset and the values it overrides, e.g. {"preset": "Precise",
"temperature": 0.2}; PresetBook.effective() combines the two into what its next response uses. Without
a presets file there is one preset, "Default", made from the app settings' values. No Qt here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from app.settings.values import AppSettings, check_field, read_json_object, set_aside, write_json_atomic
from engine.decoding.sampling import SamplingParams
from engine.errors import InvalidSettingError
from engine.paths import config_dir, make_private

FILE_NAME = "presets.json"
DEFAULT_NAME = "Default"
NAME_CHARS = 60
PRESET_KEYS = (
    "system_prompt",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "max_tokens",
    "engine_url",
    "engine_model",
)


@dataclass(frozen=True)
class Preset:
    name: str
    system_prompt: str = AppSettings.system_prompt
    temperature: float = AppSettings.temperature
    top_k: int = AppSettings.top_k
    top_p: float = AppSettings.top_p
    min_p: float = AppSettings.min_p
    seed: int | None = AppSettings.seed
    max_tokens: int = AppSettings.max_tokens
    engine_url: str = AppSettings.engine_url  # "" = this machine's engine (app/remote_answer.py for the others)
    engine_model: str = AppSettings.engine_model

    @classmethod
    def from_settings(cls, name: str, settings: AppSettings) -> Preset:
        return cls(name, **{k: getattr(settings, k) for k in PRESET_KEYS})

    def values(self) -> dict:
        return {k: getattr(self, k) for k in PRESET_KEYS}

    def with_values(self, values: dict) -> Preset:
        return replace(self, **{k: v for k, v in values.items() if k in PRESET_KEYS})

    @property
    def remote(self) -> bool:
        return bool(self.engine_url)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed
        )


def valid_values(values: dict) -> dict:
    """The preset keys of values that hold usable values; anything else is dropped."""
    out = {}
    for key in PRESET_KEYS:
        if key in values:
            try:
                check_field(key, values[key])
                out[key] = values[key]
            except InvalidSettingError:
                pass
    return out


def check_values(values: dict) -> None:
    """Raises InvalidSettingError, with a message for a person, at the first unusable value."""
    for key in PRESET_KEYS:
        if key in values:
            check_field(key, values[key])


class PresetBook:
    """The saved presets in their order, and the one new chats start from."""

    def __init__(self, presets: list[Preset], default: str | None, path: Path | None = None):
        self.presets = {p.name: p for p in presets}
        self.default = default if isinstance(default, str) and default in self.presets else next(iter(self.presets))
        self.path = path or presets_path()

    @classmethod
    def built_in(cls, settings: AppSettings, path: Path | None = None) -> PresetBook:
        return cls([Preset.from_settings(DEFAULT_NAME, settings)], DEFAULT_NAME, path)

    def names(self) -> list[str]:
        return list(self.presets)

    def get(self, name) -> Preset | None:
        return self.presets.get(name) if isinstance(name, str) else None

    @property
    def default_preset(self) -> Preset:
        return self.presets[self.default]

    def effective(self, conversation: dict) -> Preset:
        """What a conversation uses: its preset (the default one if it names none, or one that is gone),
        with the conversation's own values over it."""
        return self.base_of(conversation).with_values(valid_values(conversation))

    def base_of(self, conversation: dict) -> Preset:
        """The preset a conversation follows: the one it names, else the default one."""
        return self.get(conversation.get("preset")) or self.default_preset

    def overrides(self, conversation: dict) -> dict:
        """The usable values the conversation sets that differ from its preset's."""
        base = self.base_of(conversation)
        return {k: v for k, v in valid_values(conversation).items() if v != getattr(base, k)}

    # --- changes (the caller saves) -----------------------------------------------------------
    def put(self, preset: Preset) -> None:
        """Add preset, or replace the one of that name."""
        if preset.name not in self.presets:
            check_name(preset.name, self.names())
        check_values(preset.values())
        self.presets[preset.name] = preset

    def rename(self, old: str, new: str) -> None:
        new = new.strip()
        if new == old:
            return
        check_name(new, [n for n in self.names() if n != old])
        self.presets = {
            (new if n == old else n): (replace(p, name=new) if n == old else p) for n, p in self.presets.items()
        }
        if self.default == old:
            self.default = new

    def delete(self, name: str) -> None:
        if len(self.presets) <= 1:
            raise InvalidSettingError("The last preset cannot be deleted: chats need one to start from.")
        del self.presets[name]
        if self.default == name:
            self.default = next(iter(self.presets))

    def set_default(self, name: str) -> None:
        if name not in self.presets:
            raise InvalidSettingError(f"There is no preset named “{name}”.")
        self.default = name

    def save(self) -> None:
        """Write the file atomically, readable by the user alone (system prompts, servers). Raises only OSError."""
        write_json_atomic(
            self.path, {"default": self.default, "presets": [asdict(p) for p in self.presets.values()]}, private=True
        )


def check_name(name: object, taken: list[str]) -> None:
    if not isinstance(name, str) or not name.strip():
        raise InvalidSettingError("A preset needs a name.")
    if name != name.strip() or len(name) > NAME_CHARS:
        raise InvalidSettingError(f"A preset name is at most {NAME_CHARS} characters, without spaces around it.")
    if name.casefold() in {n.casefold() for n in taken}:
        raise InvalidSettingError(f"There is already a preset named “{name}”.")


# --- the file ---------------------------------------------------------------------------------
def presets_path() -> Path:
    return config_dir() / FILE_NAME


def load_presets(settings: AppSettings, path: Path | None = None) -> tuple[PresetBook, list[str]]:
    """The saved presets, and notices about anything that could not be used. settings seeds the built-in
    Default preset (no file, or nothing usable in it) and the values a preset's bad ones fall back to."""
    path = path or presets_path()
    fallback = f"the built-in {DEFAULT_NAME} preset is in use"
    make_private(path)  # an older version's file, readable by others: no longer
    raw, notices = read_json_object(path, "presets", fallback)
    if raw is None:
        return PresetBook.built_in(settings, path), notices
    items = raw.get("presets")
    if not isinstance(items, list) or not items:
        kept = set_aside(path)
        notice = f"Your presets file holds no list of presets, so {fallback}."
        return PresetBook.built_in(settings, path), [
            f"{notice} The old file was kept as {kept.name}." if kept else notice
        ]
    presets: list[Preset] = []
    skipped, reset = 0, []
    for item in items:
        name = item.get("name") if isinstance(item, dict) else None
        try:
            check_name(name, [p.name for p in presets])
        except InvalidSettingError:
            skipped += 1
            continue
        assert isinstance(name, str)  # check_name refused anything else
        values = valid_values(item)
        reset += [f"{name}: {k.replace('_', ' ')}" for k in PRESET_KEYS if k in item and k not in values]
        presets.append(Preset.from_settings(name, settings).with_values(values))
    if skipped or reset:  # the next save drops what was not usable: keep the file as it was
        kept = set_aside(path, "invalid", copy=True)
        if skipped:
            notices.append(f"{skipped} preset(s) without a usable, distinct name were left out.")
        if reset:
            notices.append(f"Some preset values were invalid and were reset to the app's settings: {', '.join(reset)}.")
        if kept:
            notices[-1] += f" The file as it was is kept as {kept.name}."
    if not presets:
        return PresetBook.built_in(settings, path), notices
    return PresetBook(presets, raw.get("default"), path), notices
