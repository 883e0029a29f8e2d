"""Shared fixtures: the real embedded Gemma 270M, loaded once per session."""
import pytest

from engine.embedded import embedded_model_path
from engine.runtime import LoadSettings, Model


@pytest.fixture(scope="session")
def model_path():
    return embedded_model_path()


@pytest.fixture(scope="session")
def target(model_path):
    model = Model(model_path, LoadSettings(n_ctx=2048, threads=2))
    yield model
    model.close()
