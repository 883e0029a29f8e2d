import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest


@pytest.fixture(autouse=True)
def keyring_in_tmp(tmp_path, monkeypatch):
    """API keys go to keyring's file backend (keyrings.alt) in tmp_path, never this machine's own keyring."""
    monkeypatch.setenv("SPECCHAT_ALLOW_FILE_KEYRING", "1")  # engine/remote/keys.py takes no file keyring otherwise
    import keyring
    from keyrings.alt.file import PlaintextKeyring

    ring = PlaintextKeyring()
    ring.file_path = str(tmp_path / "keyring.cfg")
    before = keyring.get_keyring()
    keyring.set_keyring(ring)
    yield ring
    keyring.set_keyring(before)


# The two embedded models, each named for what it is. Paths only: a test or a fixture loads its own Model.
# (Imports inside the fixtures: packaging/gpu_check.sh runs a few engine tests on a machine with neither model.)
@pytest.fixture(scope="session")
def gemma_path():
    """The embedded Gemma 3 270M base (262k vocabulary, no chat template), assembled once in the real cache dir."""
    from engine.modelfiles.embedded import embedded_gemma_path

    return embedded_gemma_path()


@pytest.fixture(scope="session")
def smollm_path():
    """The default embedded model, SmolLM2-135M-Instruct (49k vocabulary, a ChatML template)."""
    from engine.modelfiles.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """The one tiny model: a real GGUF file (support.tiny.write_tiny_gguf's defaults), written once. Read it,
    copy it or serve it; a test that needs a variant writes its own with write_tiny_gguf."""
    from support.tiny import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
