"""Can a draft serve a target? llama.cpp's vocabulary check (engine.modelfiles.vocab_check) on vocab-only loads of
both files, cached per file version (path, size, modification time). It loads models, so it lives with the runtime;
the checks that read only GGUF headers (modelfiles.header_vocab) need no load and live with the files."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import ModelFileError
from ..modelfiles.model_inspect import HEAD_SUPPORT, inspect_model
from ..modelfiles.vocab_check import Compatibility, check_compatible
from .runtime import LoadSettings, Model


def check_pair(target: str | Path, draft: str | Path) -> Compatibility:
    return check_drafts(target, [draft])[Path(draft)]


def check_drafts(
    target: str | Path, drafts: Iterable[str | Path], should_stop: Callable[[], bool] = lambda: False
) -> dict[Path, Compatibility]:
    """Can each draft serve this target? The target's vocabulary is loaded once for all of them."""
    target = Path(target)
    results: dict[Path, Compatibility] = {}
    missing: list[Path] = []
    for draft in (Path(d) for d in drafts):
        cached = _cache_get(target, draft)
        if cached is None:
            missing.append(draft)
        else:
            results[draft] = cached
    if not missing:
        return results
    try:
        target_model = _vocab(target)
    except ModelFileError as exc:
        return {**results, **{d: Compatibility(False, f"the target cannot be read: {exc}") for d in missing}}
    try:
        for draft in missing:
            if should_stop():
                break
            refused = _head_refusal(draft)
            if refused:
                results[draft] = Compatibility(False, refused)
                continue
            try:
                draft_model = _vocab(draft)
            except ModelFileError as exc:
                results[draft] = Compatibility(False, f"cannot be read: {exc}")
                continue
            try:
                results[draft] = check_compatible(target_model, draft_model)
            finally:
                draft_model.close()
            _cache_put(target, draft, results[draft])
    finally:
        target_model.close()
    return results


# --- internals ---------------------------------------------------------------------------------
_cache: dict[tuple[object, ...], Compatibility] = {}
_cache_lock = threading.Lock()


def _version(path: Path) -> tuple[object, ...]:
    try:
        stat = path.stat()
    except OSError:
        return (str(path), None)
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def _cache_get(target: Path, draft: Path) -> Compatibility | None:
    with _cache_lock:
        return _cache.get((_version(target), _version(draft)))


def _cache_put(target: Path, draft: Path, result: Compatibility) -> None:
    with _cache_lock:
        _cache[(_version(target), _version(draft))] = result


def _head_refusal(draft: Path) -> str | None:
    """Why SpecChat cannot draft with this file though llama.cpp could (a DFlash head), from its header; else None."""
    try:
        drafter = inspect_model(draft)["drafter"] or {}
    except ModelFileError:
        return None  # loading it says why
    return HEAD_SUPPORT.get(drafter.get("kind", ""))


def _vocab(path: Path) -> Model:
    return Model(path, LoadSettings(n_gpu_layers=0), vocab_only=True)
