"""Shared fixtures: the real embedded Gemma 3 270M base, loaded once per session, as the target and as a draft.

Gemma, not the default embedded SmolLM2, on purpose: the engine tests rely on its properties (a 262k
vocabulary, base-model continuation that prompt lookup can copy, no chat template)."""

import pytest

from engine.decoding.runtime import LoadSettings, Model


@pytest.fixture(scope="session")
def target(gemma_path):
    model = Model(gemma_path, LoadSettings(n_ctx=2048, threads=2))
    yield model
    model.close()


@pytest.fixture(scope="session")
def gemma_draft(gemma_path):
    """A second Gemma 3 270M, drafting for `target` (a draft model with the target's own weights). Shared by the
    modules that draft with it: DraftModelProposer clears its sequence when a job starts, so no test sees another's
    cache."""
    model = Model(gemma_path, LoadSettings(n_ctx=2048, threads=2))
    yield model
    model.close()
