"""Which hub repos carry a built-in drafter (MTP layers in the model, or the repo is an EAGLE-3 / DFlash head), from
the header and tensor list of one of each repo's files, read with HTTP range requests (remote_gguf, tensors=True):
MTP layers show as `blk.N.nextn.*` tensors (model_inspect.drafter_of), so the tensor names are read, not a weight.

Bounded: after a search at most MAX_MARKED repos are read (the first ones, in the order the search gave), one
header each, every read capped by remote_gguf.MAX_HEADER_BYTES; a repo chosen later is read with its files.

confirm_drafter checks a catalog entry that drafts with its MTP layers the same way before its file is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import EngineError
from .catalog import MTP, CatalogPair
from .hub_search import GGUFFile, RepoResult, repo_files
from .model_inspect import drafter_of
from .remote_gguf import RemoteHeader, read_remote_metadata

MAX_MARKED = 6  # repos whose header a search reads: each is up to a few MB for a 150k-token vocabulary
READERS = 3  # headers read at once: each waits on the network, not the CPU


@dataclass(frozen=True)
class RepoDrafter:
    repo_id: str
    filename: str | None  # the file whose header was read
    drafter: dict[str, Any] | None  # as model_inspect.drafter_of says; None: none (or not read: see problem)
    bytes_read: int = 0
    problem: str = ""  # why the header could not be read


def header_file(files: Sequence[GGUFFile]) -> GGUFFile | None:
    """The file whose header speaks for a repo: the smallest that is one file. A split model's first part lists only
    its own tensors (MTP layers are in the last one), so a repo of split files only is read from its smallest."""
    whole = [f for f in files if len(f.parts) == 1]
    return min(whole or files, key=lambda f: (f.size, f.filename), default=None)


def drafter_in(header: RemoteHeader) -> dict[str, Any] | None:
    """The built-in drafter a header read with tensors=True describes."""
    return drafter_of(header.metadata, list(header.tensors))


def repo_drafter(
    repo: RepoResult,
    *,
    endpoint: str | None = None,
    cancelled: Callable[[], bool] | None = None,
    timeout_s: float = 15.0,
) -> RepoDrafter:
    """The built-in drafter of a repo's models (its files are listed first if the repo came from a search).
    Never raises for the hub's answers: problem says what went wrong."""
    if cancelled is not None and cancelled():
        return RepoDrafter(repo.repo_id, None, None, problem="not read: the search was stopped")
    try:
        files = repo.files or repo_files(repo.repo_id, endpoint=endpoint, timeout_s=timeout_s).files
        chosen = header_file(files)
        if chosen is None:
            return RepoDrafter(repo.repo_id, None, None, problem="no GGUF model in this repo")
        header = read_remote_metadata(
            repo.repo_id, chosen.filename, endpoint=endpoint, timeout_s=timeout_s, cancelled=cancelled, tensors=True
        )
    except EngineError as exc:
        return RepoDrafter(repo.repo_id, None, None, problem=str(exc))
    return RepoDrafter(repo.repo_id, chosen.filename, drafter_in(header), header.bytes_read)


def mark_drafters(
    repos: Sequence[RepoResult],
    *,
    limit: int = MAX_MARKED,
    endpoint: str | None = None,
    cancelled: Callable[[], bool] | None = None,
    timeout_s: float = 15.0,
) -> list[RepoDrafter]:
    """repo_drafter for the first `limit` repos, a few at a time."""
    chosen = list(repos[: max(limit, 0)])
    with ThreadPoolExecutor(READERS) as pool:
        return list(
            pool.map(lambda r: repo_drafter(r, endpoint=endpoint, cancelled=cancelled, timeout_s=timeout_s), chosen)
        )


def confirm_drafter(
    pair: CatalogPair,
    *,
    endpoint: str | None = None,
    cancelled: Callable[[], bool] | None = None,
    timeout_s: float = 20.0,
) -> str:
    """ "" where a catalog entry's drafter is there, else why not: an entry that drafts with its MTP layers has its
    target's header read on the hub (ranges only) before the file is downloaded. A pair with a draft file: "" (its
    files are checked by the download, their vocabularies by the pair check)."""
    if pair.drafter != MTP:
        return ""
    f = pair.target
    try:
        header = read_remote_metadata(
            f.repo_id, f.filename, f.revision, endpoint=endpoint, timeout_s=timeout_s, cancelled=cancelled, tensors=True
        )
    except EngineError as exc:
        return f"The header of {f.filename} could not be read to check its MTP layers, so nothing was downloaded: {exc}"
    drafter = drafter_in(header)
    if drafter is None or drafter.get("kind") != MTP:
        return (
            f"{f.repo_id} / {f.filename} carries no MTP layers (read from its header on the hub), so it cannot draft "
            "for itself as the catalog says; nothing was downloaded."
        )
    return ""
