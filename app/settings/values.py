"""User settings: one JSON file in the config dir. Bad values fall back to defaults, with a notice.

The file is the user's alone (0600 in a 0700 folder on POSIX, engine.paths). The API server's key is kept in the
system keyring where one works (the file then says so, and holds no key), else in the file.

No Qt here: the dialog edits an AppSettings, this module validates, loads and saves it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from engine.decoding.loader import DecoderSettings, loads_mtp, needs_draft_model
from engine.decoding.sampling import SamplingParams
from engine.errors import EngineError, InvalidSettingError
from engine.methods import (
    DEFAULT_MAX_DRAFT,
    DEFAULT_METHOD,
    DEFAULT_MIN_DRAFT,
    DEFAULT_P_MIN,
    MAX_DRAFT_RANGE,
    METHODS,
    MIN_DRAFT_RANGE,
    P_MIN_RANGE,
    method_words,
)
from engine.paths import config_dir, make_private, unwritable_reason, write_text_atomic
from engine.remote.endpoint import normalised_url
from engine.remote.keys import save_key, saved_key

FILE_NAME = "settings.json"
METHOD_LABELS = method_words("label")
RELOAD_KEYS = ("model", "n_ctx", "n_gpu_layers", "threads", "flash_attention")  # a change reloads the target model
SPECULATION_KEYS = ("speculation", "method", "draft", "max_draft", "min_draft", "p_min", "adaptive", "exact_greedy")
THEMES = ("system", "light", "dark")
_SURROGATE = re.compile("[\ud800-\udfff]")
SERVER_KEY_SERVICE = "SpecChat API server"  # keyring entries: one per settings file (its path)
IN_KEYRING = "server_api_key_in_keyring"  # in settings.json: the server's key is in the keyring, not here
_kept_keys: dict[str, str] = {}  # settings file -> the server key its keyring entry holds, as last read or written


def _listed(text: str) -> tuple[str, ...]:
    """A comma-separated setting as its items."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


@dataclass(frozen=True)
class AppSettings:
    # models
    model: str = "embedded"  # "embedded" or a path to a GGUF file
    draft: str | None = None  # a path to a GGUF file for the draft-model and auto methods
    # speculation
    speculation: bool = True
    method: str = DEFAULT_METHOD  # "auto" | "draft" | "lookup" | "none" (auto: lookup and the draft, per step)
    max_draft: int = DEFAULT_MAX_DRAFT
    min_draft: int = DEFAULT_MIN_DRAFT
    p_min: float = DEFAULT_P_MIN  # draft confidence cutoff
    adaptive: bool = True
    exact_greedy: bool = False  # greedy answers token for token plain decoding's (verifies kept narrow: slower)
    # sampling
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = 1024
    system_prompt: str = ""
    # the engine that answers (per preset and chat): "" = this machine, else an OpenAI-compatible server's URL
    engine_url: str = ""
    engine_model: str = ""  # one of that server's /v1/models ids; "" = the first it lists
    # runtime
    n_ctx: int = 4096
    n_gpu_layers: int = -1
    threads: int | None = None  # None = physical cores
    flash_attention: bool | None = None  # None = llama.cpp's choice (engine runtime.flash_attention_type)
    # the API server (Model → Server…)
    server_port: int = 8765
    server_lan: bool = False  # listen on every interface, not only this machine (needs an API key)
    server_api_key: str = ""
    server_cors: str = ""  # browser origins allowed to call the API, comma-separated
    server_hosts: str = ""  # host names requests may be addressed to beyond this machine's, comma-separated
    server_parallel: int = 4
    # view
    color_drafts: bool = False
    show_sparkline: bool = True
    theme: str = "system"  # THEMES: the system's colours, or light or dark whatever the system's
    window_geometry: str = ""  # base64 of QWidget.saveGeometry()
    splitter_state: str = ""
    last_folder: str = ""  # where the last export or import was, where the next file dialog starts

    # --- what the engine gets -----------------------------------------------------------------
    @property
    def effective_method(self) -> str:
        return self.method if self.speculation else "none"

    def decoder_settings(self) -> DecoderSettings:
        return DecoderSettings(
            model=self.model,
            draft=self.draft,
            method=self.effective_method,
            max_draft=self.max_draft,
            min_draft=self.min_draft,
            adaptive=self.adaptive,
            p_min=self.p_min,
            n_ctx=self.n_ctx,
            n_gpu_layers=self.n_gpu_layers,
            threads=self.threads,
            flash_attention=self.flash_attention,
            exact=self.exact_greedy,
        )

    def serve_options(self):
        """engine.serving's ServeOptions (imported here: the HTTP stack loads only when it serves).
        Raises InvalidSettingError for options that cannot serve (the network without a key)."""
        from engine.serving.service import ServeOptions

        return ServeOptions(
            host="0.0.0.0" if self.server_lan else "127.0.0.1",
            port=self.server_port,
            api_key=self.server_api_key.strip() or None,
            parallel=self.server_parallel,
            cors_origins=_listed(self.server_cors),
            allowed_hosts=_listed(self.server_hosts),
        )

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, seed=self.seed
        )

    def validated(self) -> AppSettings:
        """Self, if every value is usable; raises InvalidSettingError with a message for a person."""
        for key, value in asdict(self).items():
            check_field(key, value)
        self.sampling()  # the engine's own checks, so the two never disagree
        DecoderSettings(method="none", max_draft=self.max_draft, min_draft=self.min_draft).speculation()
        if self.min_draft > max(self.max_draft, 1):
            raise InvalidSettingError(
                f"min draft tokens ({self.min_draft}) must not exceed max draft tokens ({self.max_draft})."
            )
        if self.speculation and not self.draft and needs_draft_model(self.method, self.model):
            raise InvalidSettingError(
                f"The {METHOD_LABELS[self.method].lower()} method needs a draft model: choose "
                "one, or use prompt lookup."
            )
        return self

    def merged(self, changes: dict) -> AppSettings:
        """A copy with these keys changed; unknown keys raise InvalidSettingError."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise InvalidSettingError(f"Unknown settings: {', '.join(sorted(unknown))}")
        return replace(self, **changes)


def what_changed(old: AppSettings, new: AppSettings) -> str:
    """ "reload" (the target must be loaded again), "speculation" (applies to the next response),
    or "" (sampling and view settings are read per response)."""
    if any(getattr(old, k) != getattr(new, k) for k in RELOAD_KEYS):
        return "reload"
    if loads_mtp(old.effective_method, old.model) != loads_mtp(new.effective_method, new.model):
        return "reload"  # a model's MTP layers load with it
    if old.effective_method != new.effective_method or any(
        getattr(old, k) != getattr(new, k) for k in SPECULATION_KEYS
    ):
        return "speculation"
    return ""


# --- the file ---------------------------------------------------------------------------------
def settings_path() -> Path:
    return config_dir() / FILE_NAME


def load_settings(path: Path | None = None) -> tuple[AppSettings, list[str]]:
    """Settings from the file, and notices about anything that had to fall back to a default, or that
    will not be saved."""
    path = path or settings_path()
    reason = unwritable_reason(path.parent)
    make_private(path)  # an older version's file, readable by others: no longer
    settings, notices = _read(path)
    if reason:  # what the file holds is still used: only saving is impossible
        notices.append(
            f"Settings will not be saved: {path.parent} is not writable ({reason}). Changes apply until you quit."
        )
    return settings, notices


def read_json_object(path: Path, what: str, fallback: str = "defaults are in use") -> tuple[dict | None, list[str]]:
    """The JSON object in path; None when there is no file, or when it cannot be read: such a file is set
    aside (never deleted) and the notice says so. what names the file for a person ("settings")."""
    if not path.exists():
        return None, []
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError("the file does not hold a JSON object")
        return raw, []
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: brackets nested too deep
        reason = "its brackets are nested too deeply" if isinstance(exc, RecursionError) else exc
        kept = set_aside(path)
        notice = f"Your {what} file could not be read ({reason}), so {fallback}."
        return None, [f"{notice} The old file was kept as {kept.name}." if kept else notice]


def _read(path: Path) -> tuple[AppSettings, list[str]]:
    raw, notices = read_json_object(path, "settings")
    if raw is None:
        return AppSettings(), notices
    defaults, known = AppSettings(), {f.name for f in fields(AppSettings)}
    values, bad = {}, []
    for key, value in raw.items():
        if key not in known:
            continue  # a setting from another version: ignore it quietly
        try:
            check_field(key, value)
            values[key] = value
        except InvalidSettingError:
            bad.append(key)
    settings = replace(defaults, **values)
    try:
        settings.validated()
    except InvalidSettingError as exc:  # values fine alone but not together (e.g. min > max draft)
        bad.append(f"speculation ({exc})")
        settings = replace(settings, **{k: getattr(defaults, k) for k in SPECULATION_KEYS})
    notices = [f"Some settings were invalid and were reset to their defaults: {', '.join(bad)}."] if bad else []
    return _with_server_key(settings, raw, path, notices), notices


def _with_server_key(settings: AppSettings, raw: dict, path: Path, notices: list[str]) -> AppSettings:
    """The API server's key from the keyring, where the file says it is; a key an older version kept in the file
    moved there (the file is written again without it). The keyring is asked only when the file names it: it
    may ask the person to unlock it. notices: the file's so far; one is added if the key cannot be read."""
    if settings.server_api_key:
        if raw.get(IN_KEYRING) is not True and not notices:  # (a file with bad values is kept as it is)
            try:
                save_settings(settings, path)
            except OSError:
                pass  # read-only: it stays where it is, in a file only its owner can read
        return settings
    if raw.get(IN_KEYRING) is not True:
        return settings
    key = saved_key(str(path), SERVER_KEY_SERVICE)
    if not key:
        notices.append(
            "The API server's key could not be read from the system keyring; set it again in "
            "Model → Server… before serving on the network."
        )
        return settings
    _kept_keys[str(path)] = key
    return replace(settings, server_api_key=key)


def save_settings(settings: AppSettings, path: Path | None = None) -> None:
    """Write atomically (a crash mid-write never leaves a half file), readable by the user alone; the server's
    API key goes to the keyring where one works. Raises only OSError."""
    path = path or settings_path()
    data = asdict(settings)
    if _keep_server_key(path, settings.server_api_key):
        data["server_api_key"], data[IN_KEYRING] = "", True
    write_json_atomic(path, data, private=True)


def _keep_server_key(path: Path, key: str) -> bool:
    """Whether the keyring holds key for this settings file (written there now if it changed; an empty key
    forgets the one kept). Only a system keyring (engine.remote.keys.secure) is trusted with it."""
    name = str(path)
    if _kept_keys.get(name) == key:  # unchanged: the keyring is not asked again at every save
        return bool(key)
    if key or _kept_keys.get(name):  # (an empty key forgets one kept; with none kept there is nothing to ask)
        try:
            save_key(name, key, SERVER_KEY_SERVICE)
        except EngineError:
            return False  # no system keyring here: the key stays in the file, which only its owner can read
    _kept_keys[name] = key
    return bool(key)


def write_json_atomic(path: Path, data, private: bool = False) -> None:
    """data as JSON in path, written atomically (a crash mid-write never leaves a half file); private: readable
    by its owner alone (engine.paths.PRIVATE_FILE). Raises only OSError."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    # A lone surrogate (half an emoji, as a paste can give) has no UTF-8 form: a \u escape keeps it exactly.
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    write_text_atomic(path, text, private=private)


def set_aside(path: Path, label: str = "corrupt", copy: bool = False) -> Path | None:
    """Keep a file that could not be used beside it, as name.<label>-TIME.json: moved out of the way, or
    with copy=True copied (the original stays, to be rewritten). Its new path, or None."""
    target = path.with_name(f"{path.stem}.{label}-{time.strftime('%Y%m%d-%H%M%S')}{path.suffix}")
    try:
        if copy:
            shutil.copyfile(path, target)
        else:
            os.replace(path, target)
        make_private(target)  # a copy of settings or presets is as private as they are
        return target
    except OSError:
        return None


# --- per-field checks -------------------------------------------------------------------------
def _int(lo: int, hi: int | None = None, none_ok: bool = False):
    def ok(v) -> bool:
        if v is None:
            return none_ok
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)

    return ok


def _float(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False):
    def ok(v) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            return False
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)

    return ok


def _is(kind):
    return lambda v: isinstance(v, kind)


def _engine_url(v) -> bool:
    if not isinstance(v, str):
        return False
    try:
        return not v or normalised_url(v) == v
    except InvalidSettingError:
        return False


# key -> (check, what a valid value is)
FIELDS = {
    "model": (lambda v: isinstance(v, str) and bool(v.strip()), "'embedded' or a path to a GGUF file"),
    "draft": (lambda v: v is None or isinstance(v, str), "a path to a GGUF file, or none"),
    "speculation": (_is(bool), "on or off"),
    "method": (lambda v: v in METHODS, f"{', '.join(sorted(METHODS)[:-1])} or {sorted(METHODS)[-1]}"),
    "max_draft": (_int(*MAX_DRAFT_RANGE), "a whole number {}..{}".format(*MAX_DRAFT_RANGE)),
    "min_draft": (_int(*MIN_DRAFT_RANGE), "a whole number {}..{}".format(*MIN_DRAFT_RANGE)),
    "p_min": (_float(*P_MIN_RANGE, hi_open=True), "a number in [{:g}, {:g})".format(*P_MIN_RANGE)),
    "adaptive": (_is(bool), "on or off"),
    "exact_greedy": (_is(bool), "on or off"),
    "temperature": (_float(0.0, 5.0), "a number 0..5"),
    "top_k": (_int(0), "a whole number ≥ 0 (0 turns it off)"),
    "top_p": (_float(0.0, 1.0, lo_open=True), "a number in (0, 1]"),
    "min_p": (_float(0.0, 1.0, hi_open=True), "a number in [0, 1)"),
    "seed": (_int(0, 2**63 - 1, none_ok=True), "a whole number ≥ 0, or empty for random"),
    "max_tokens": (_int(1, 131072), "a whole number 1..131072"),
    "system_prompt": (_is(str), "text"),
    "engine_url": (_engine_url, "empty (this machine) or a server's http:// or https:// URL"),
    "engine_model": (_is(str), "text"),
    "n_ctx": (_int(0, 1 << 20), "0 (the model's own) or a whole number up to 1048576"),
    "n_gpu_layers": (_int(-1), "-1 (all layers) or a whole number ≥ 0"),
    "threads": (_int(1, 512, none_ok=True), "a whole number 1..512, or empty for automatic"),
    "flash_attention": (lambda v: v is None or isinstance(v, bool), "on, off, or empty for automatic"),
    "server_port": (_int(1, 65535), "a port number 1..65535"),
    "server_lan": (_is(bool), "on or off"),
    "server_api_key": (_is(str), "text"),
    "server_cors": (_is(str), "text"),
    "server_hosts": (_is(str), "text"),
    "server_parallel": (_int(1, 16), "a whole number 1..16"),
    "color_drafts": (_is(bool), "on or off"),
    "show_sparkline": (_is(bool), "on or off"),
    "theme": (lambda v: v in THEMES, "system, light or dark"),
    "window_geometry": (_is(str), "text"),
    "last_folder": (_is(str), "a folder's path, or empty"),
    "splitter_state": (_is(str), "text"),
}


def check_field(key: str, value) -> None:
    check, wanted = FIELDS[key]
    if not check(value):
        raise InvalidSettingError(f"{key.replace('_', ' ')} must be {wanted}, got {value!r}")
