"""SpecChat in a process of its own, as a person starts it: the repository root and the child's environment."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child_env(dirs):
    # PYTHONFAULTHANDLER: a child that crashes in native code (once rc -11 in CI, not reproduced) leaves a stack.
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        SPECCHAT_CONFIG_DIR=str(dirs / "config"),
        SPECCHAT_DATA_DIR=str(dirs / "data"),
        PYTHONFAULTHANDLER="1",
    )
    env.pop("SPECCHAT_CACHE_DIR", None)
    return env
