"""Exception types the engine raises for bad input. Each carries a message meant for a person."""


class EngineError(Exception):
    """Base class: anything the app should show as a message rather than crash on."""


class ModelFileError(EngineError):
    """A model file is missing, truncated, not GGUF, or llama.cpp refused to load it."""


class VocabMismatchError(EngineError):
    """A draft model's vocabulary cannot be used to verify against the target's."""


class ContextOverflowError(EngineError):
    """The prompt does not fit in the context window."""


class InvalidSettingError(EngineError, ValueError):
    """A sampling or speculation value is out of range."""


class GenerationCancelled(EngineError):
    """Raised inside long operations (prefill) when the caller asked to stop."""


class SpeculationUnavailable(EngineError):
    """This model cannot speculate (its state cannot be rolled back); it still decodes plainly."""
