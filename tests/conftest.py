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
