"""Where SpecChat keeps things, by platform convention (platformdirs)."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "SpecChat"


def _dir(env: str, default: str) -> Path:
    # SPECCHAT_*_DIR lets tests and portable installs put everything elsewhere.
    path = Path(os.environ.get(env) or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    return _dir("SPECCHAT_CACHE_DIR", platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    return _dir("SPECCHAT_DATA_DIR", platformdirs.user_data_dir(APP_NAME, appauthor=False))


def config_dir() -> Path:
    return _dir("SPECCHAT_CONFIG_DIR", platformdirs.user_config_dir(APP_NAME, appauthor=False))


def resources_dir() -> Path:
    """resources/ beside the packages: in a checkout, an editable install and the bundle alike."""
    return Path(__file__).resolve().parent.parent / "resources"
