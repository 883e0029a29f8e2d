"""A draft for any target: smaller GGUFs of the target's family, on the hub and on this machine, each checked
against the target's vocabulary before anything is downloaded.

The family comes from the target's own header (general.basename, "Qwen2.5-Coder"), else its repo's base
model, else the repo's name without its size and format words. Hub candidates are the family's other repos;
each offers its best-fitting file, and only that file's header is read (HTTP range requests,
engine.modelfiles.remote_gguf), then checked with llama.cpp's rules (engine.modelfiles.header_vocab).
A candidate larger than the target is listed with that reason and never read: it could not speed it up.

EAGLE-3 and DFlash draft heads are listed beside the drafts: the family's repos named for a head (HEAD_WORDS) are
looked up too, and a head's header is checked against the target's layers, hidden size and vocabulary
(engine.modelfiles.head_check). A head that fits is listed with whether SpecChat can draft with it
(model_inspect.HEAD_SUPPORT); one that does not fit says why.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import EngineError
from .gguf_header import read_gguf_metadata
from .head_check import HEAD_NAMES, check_head, head_kind
from .header_vocab import check_compatible_metadata
from .hub_search import RepoResult, quantization_of, repo_files, search_repos
from .model_inspect import HEAD_SUPPORT
from .remote_gguf import read_remote_metadata

IDEAL_SIZE_RATIO = 0.1  # a draft about a tenth of the target's size drafts cheaply and still guesses well
SMALL_ENOUGH = 0.5  # a draft over half the target's size costs nearly what it saves
MAX_HUB_CANDIDATES = 8  # headers read per search: each is a few MB for a 150k-token vocabulary
MAX_HEAD_CANDIDATES = 4  # and heads' headers, apart, so many drafts cannot crowd the heads out
SEARCH_LIMIT = 30
HEAD_WORDS = ("eagle", "dflash")  # how head repos are named: Qwen3-8B-Eagle3-GGUF, ...-EAGLE3, ...-DFlash-GGUF
HEAD_SEARCH_LIMIT = 100  # repos per head word, most downloaded first, before the family's filter
HUB_READERS = 4  # hub calls and header reads wait on the network, not the CPU
# Quantizations a draft is best in: fast and close to the full model. Earlier is better.
PREFERRED_QUANTS = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q5_K_M", "Q8_0", "Q6_K", "IQ4_XS", "Q5_K_S", "Q4_1")
SIZE_LABEL = re.compile(r"[-_. ](?:\d+x)?\d+(?:\.\d+)?[BM]\b", re.I)  # -7B, -1.5B, -135M, -8x7B
FORMAT_WORDS = re.compile(r"[-_. ](gguf|instruct|chat|it|base)\b", re.I)


@dataclass(frozen=True)
class DraftCandidate:
    name: str  # what a person reads: "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF / ...q4_k_m.gguf" or an installed file
    size: int
    quantization: str
    compatible: bool | None  # None: its header could not be read (reason says why)
    reason: str  # why not, or a note on a usable one
    repo_id: str | None = None  # a hub file
    parts: tuple[str, ...] = ()
    path: Path | None = None  # an installed file
    bytes_read: int = 0
    head: str | None = None  # "eagle3" or "dflash": a draft head, not a draft model

    @property
    def filename(self) -> str:
        return self.parts[0] if self.parts else (self.path.name if self.path else "")

    @property
    def usable(self) -> bool:
        """It fits the target and SpecChat drafts with it (a head that fits may not be usable yet)."""
        return bool(self.compatible) and (self.head is None or _head_support(self.head) is None)


@dataclass(frozen=True)
class DraftSearch:
    target: str
    target_size: int
    family: str
    candidates: list[DraftCandidate]
    bytes_read: int  # headers read over the network, the target's included
    problems: list[str] = field(default_factory=list)

    @property
    def compatible(self) -> list[DraftCandidate]:
        """The candidates SpecChat can draft with for this target."""
        return [c for c in self.candidates if c.usable]


def family_of(meta: dict[str, Any], repo_id: str | None = None, base_model: str | None = None) -> str:
    """What to search the hub for to find the target's smaller siblings: the header's basename, else the name
    before its size label ("Mistral-7B-Instruct-v0.3" → "Mistral", "Llama-3.2-3B" → "Llama-3.2")."""
    basename = _text(meta.get("general.basename"))
    if basename:
        return basename
    for name in (base_model, repo_id, _text(meta.get("general.name"))):
        name = (name or "").split("/")[-1]
        family = SIZE_LABEL.split(name)[0] if SIZE_LABEL.search(name) else FORMAT_WORDS.sub("", name)
        if family.strip("-_. "):
            return family.strip("-_. ")
    return _text(meta.get("general.architecture"))


def find_drafts(
    repo_id: str,
    filename: str,
    revision: str = "main",
    *,
    installed: Iterable[Path] = (),
    endpoint: str | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> DraftSearch:
    """Drafts for a file on the hub: its header is read (ranges only), then the family's candidates'."""
    target_repo = repo_files(repo_id, revision, endpoint=endpoint)
    target_file = next((f for f in target_repo.files if filename in f.parts), None)
    if target_file is None:
        raise EngineError(f"{repo_id} has no GGUF file named {filename}.")
    header = read_remote_metadata(repo_id, target_file.filename, revision, endpoint=endpoint, cancelled=cancelled)
    search = _find(
        header.metadata,
        target_file.size,
        f"{repo_id} / {filename}",
        repo_id,
        target_repo.base_model,
        installed,
        endpoint,
        cancelled,
    )
    return replace(search, bytes_read=search.bytes_read + header.bytes_read)


def _find(
    meta: dict[str, Any],
    size: int,
    name: str,
    repo_id: str | None,
    base_model: str | None,
    installed: Iterable[Path],
    endpoint: str | None,
    cancelled: Callable[[], bool] | None,
    search_hub: bool = True,
) -> DraftSearch:
    family = family_of(meta, repo_id, base_model)
    problems: list[str] = []
    local = [_check_installed(meta, size, p) for p in installed]
    hub: list[DraftCandidate] = []
    if search_hub and family:
        try:
            hub = _hub_candidates(meta, size, family, repo_id, endpoint, cancelled)
        except EngineError as exc:
            problems.append(f"The hub could not be searched: {exc}")
    candidates = sorted(local + hub, key=lambda c: _rank(c, size))
    return DraftSearch(name, size, family, candidates, sum(c.bytes_read for c in hub), problems)


def _hub_candidates(
    meta: dict[str, Any],
    size: int,
    family: str,
    target_repo: str | None,
    endpoint: str | None,
    cancelled: Callable[[], bool] | None,
) -> list[DraftCandidate]:
    repos = [r for r in search_repos(family, limit=SEARCH_LIMIT, endpoint=endpoint) if r.repo_id != target_repo]
    heads = _head_repos(family, endpoint, {r.repo_id for r in repos} | {target_repo or ""})
    head_ids = {r.repo_id for r in heads}
    with ThreadPoolExecutor(HUB_READERS) as pool:  # each is a round trip to the hub: ask in parallel
        offers = list(pool.map(lambda repo: _offer(repo, size, endpoint, cancelled), repos + heads))
        unread = sorted([o for o in offers if o.compatible is None and not o.reason], key=lambda c: _rank(c, size))
        readable = [o for o in unread if o.repo_id not in head_ids][:MAX_HUB_CANDIDATES]
        readable += [o for o in unread if o.repo_id in head_ids][:MAX_HEAD_CANDIDATES]
        checked = list(pool.map(lambda c: _check_remote(meta, size, c, endpoint, cancelled), readable))
    skipped = [o for o in offers if o.reason]
    return checked + skipped


def _head_repos(family: str, endpoint: str | None, seen: set[str]) -> list[RepoResult]:
    """Repos named for a draft head of the family (its words and a HEAD_WORDS word in the id), not in seen. The
    hub's search is one substring of the id: each head word is asked for, then the family's words kept."""
    words = family.lower().split()
    found = []
    for word in HEAD_WORDS:
        for repo in search_repos(word, limit=HEAD_SEARCH_LIMIT, endpoint=endpoint):
            if repo.repo_id not in seen and all(w in repo.repo_id.lower() for w in words):
                seen.add(repo.repo_id)
                found.append(repo)
    return found


def _offer(
    repo: RepoResult, target_size: int, endpoint: str | None, cancelled: Callable[[], bool] | None
) -> DraftCandidate:
    """The file of this repo that would draft best for the target, not yet checked."""
    if cancelled and cancelled():
        return DraftCandidate(repo.repo_id, 0, "", None, "not looked at: the search was stopped", repo.repo_id)
    try:
        files = repo_files(repo.repo_id, endpoint=endpoint).files
    except EngineError as exc:
        return DraftCandidate(repo.repo_id, 0, "", None, str(exc), repo_id=repo.repo_id)
    if not files:
        return DraftCandidate(repo.repo_id, 0, "", None, "no GGUF files in this repo", repo_id=repo.repo_id)
    smaller = [f for f in files if f.size <= target_size]
    if not smaller:
        best = min(files, key=lambda f: f.size)
        return DraftCandidate(
            f"{repo.repo_id} / {best.filename}",
            best.size,
            best.quantization,
            False,
            "larger than the target: it could not speed it up",
            repo.repo_id,
            best.parts,
        )
    best = min(smaller, key=lambda f: (_quant_rank(f.quantization), -f.size))
    return DraftCandidate(
        f"{repo.repo_id} / {best.filename}", best.size, best.quantization, None, "", repo.repo_id, best.parts
    )


def _check_remote(
    target_meta: dict[str, Any],
    target_size: int,
    offer: DraftCandidate,
    endpoint: str | None,
    cancelled: Callable[[], bool] | None,
) -> DraftCandidate:
    assert offer.repo_id is not None  # an offer from the hub
    try:
        header = read_remote_metadata(offer.repo_id, offer.parts[0], endpoint=endpoint, cancelled=cancelled)
    except EngineError as exc:
        return replace(offer, reason=f"its header could not be read: {exc}")
    return _verdict(target_meta, target_size, header.metadata, replace(offer, bytes_read=header.bytes_read))


def _check_installed(target_meta: dict[str, Any], target_size: int, path: Path) -> DraftCandidate:
    path = Path(path)
    try:
        size = path.stat().st_size
        meta = read_gguf_metadata(path)
    except (EngineError, OSError) as exc:
        return DraftCandidate(path.name, 0, "", None, f"could not be read: {exc}", path=path)
    offer = DraftCandidate(f"{path.name} (on this machine)", size, quantization_of(path.name), None, "", path=path)
    if size > target_size:
        return replace(offer, compatible=False, reason="larger than the target: it could not speed it up")
    return _verdict(target_meta, target_size, meta, offer)


def _verdict(
    target_meta: dict[str, Any], target_size: int, draft_meta: dict[str, Any], offer: DraftCandidate
) -> DraftCandidate:
    kind = head_kind(draft_meta)
    if kind is not None:
        fit = check_head(target_meta, draft_meta)
        support = _head_support(kind) if fit.fits else None
        return replace(
            offer, head=kind, compatible=fit.fits, reason=f"{fit.reason}. {support}" if support else fit.reason
        )
    result = check_compatible_metadata(target_meta, draft_meta)
    if result.ok and offer.size > SMALL_ENOUGH * target_size:
        return replace(offer, compatible=True, reason="usable, but close to the target's size: little to gain")
    return replace(offer, compatible=result.ok, reason=result.reason)


def _rank(c: DraftCandidate, target_size: int) -> tuple[int, float, int, bool, str]:
    """Usable first; then the size closest to a tenth of the target's; then the better quantization; then one on
    this machine (nothing to download)."""
    order = 0 if c.usable else 2 if c.compatible is False else 1  # a head that fits but cannot draft yet: 1
    ratio = c.size / target_size if target_size and c.size else 1.0
    return (
        order,
        round(abs(math.log(max(ratio, 1e-6) / IDEAL_SIZE_RATIO)), 1),
        _quant_rank(c.quantization),
        c.path is None,
        c.name,
    )


def _head_support(kind: str) -> str | None:
    """None where SpecChat drafts with this kind of head, else the sentence that says why not."""
    return HEAD_SUPPORT.get(kind, f"SpecChat cannot draft with {HEAD_NAMES.get(kind, kind)} heads.")


def _quant_rank(quantization: str) -> int:
    q = quantization.upper()
    return PREFERRED_QUANTS.index(q) if q in PREFERRED_QUANTS else len(PREFERRED_QUANTS)


def _text(value: bytes | str | None) -> str:
    return value.decode("utf-8", "replace").strip() if isinstance(value, bytes) else (value or "").strip()
