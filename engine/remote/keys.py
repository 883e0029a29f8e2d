"""API keys of remote engines, kept in the operating system's keyring (one entry per server URL), never in
settings.json, exports or logs. Where no keyring works (a bare Linux without a secret service), saving says so;
the key can then be given for this run only, or through an environment variable."""

from __future__ import annotations

import logging
import os

import keyring
from keyring.errors import KeyringError

from ..errors import EngineError

log = logging.getLogger(__name__)
SERVICE = "SpecChat remote engine"


def saved_key(url: str, service: str = SERVICE) -> str | None:
    """The key saved for this server (under service), or None (none saved, or no keyring here)."""
    try:
        return keyring.get_password(service, url) or None
    except (KeyringError, RuntimeError) as exc:  # RuntimeError: a backend that fails to start
        log.info("no keyring to read an API key from: %s", type(exc).__name__)
        return None


def secure(ring) -> bool:
    """A keyring of the system's (priority ≥ 1: Secret Service, KWallet, macOS, Windows), not keyrings.alt's files
    (0.5), which only the tests may use (SPECCHAT_ALLOW_FILE_KEYRING=1)."""
    return os.environ.get("SPECCHAT_ALLOW_FILE_KEYRING") == "1" or getattr(ring, "priority", 0) >= 1


def save_key(url: str, key: str, service: str = SERVICE) -> None:
    """Save (or, for an empty key, forget) the key for this server (under service); EngineError says why it
    could not: no keyring, or only keyrings.alt's files (see secure)."""
    try:
        ring = keyring.get_keyring()
        if key and not secure(ring):
            raise KeyringError(f"{type(ring).__name__} is not a system keyring")
        if key:
            keyring.set_password(service, url, key)
        else:
            try:
                keyring.delete_password(service, url)
            except keyring.errors.PasswordDeleteError:
                pass  # there was none
    except (KeyringError, RuntimeError) as exc:
        raise EngineError(
            f"The API key could not be kept in this system's keyring ({type(exc).__name__}: {exc}). "
            "It is used until you quit; to keep one, install a keyring service (e.g. GNOME "
            "Keyring or KWallet) or start SpecChat with the key in an environment variable."
        ) from exc


def key_from_env(name: str | None) -> str | None:
    """The key in environment variable `name` (--api-key-env), or EngineError if it is not set."""
    if not name:
        return None
    value = os.environ.get(name, "").strip()
    if not value:
        raise EngineError(f"The environment variable {name} holds no API key.")
    return value
