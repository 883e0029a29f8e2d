"""Shared fixtures: the real embedded Gemma 3 270M base, loaded once per session.

Gemma, not the default embedded SmolLM2, on purpose: the engine tests rely on its properties (a 262k
vocabulary, base-model continuation that prompt lookup can copy, no chat template)."""

import pytest

from engine.decoding.runtime import LoadSettings, Model
from engine.modelfiles.embedded import embedded_gemma_path


@pytest.fixture(scope="session")
def model_path():
    return embedded_gemma_path()


@pytest.fixture(scope="session")
def target(model_path):
    model = Model(model_path, LoadSettings(n_ctx=2048, threads=2))
    yield model
    model.close()
