"""Finding GGUF models on the Hugging Face hub: search repos, then list one repo's model files.

search_repos() asks GET /api/models (the listing huggingface_hub's list_models reads) itself, through
the hub client's own session, headers and error parsing: list_models passes no timeout (a hub that
stops answering would hang the search for ever) and retries a refused connection with back-off for
about half a minute, where a person waiting on a search box wants the answer now. repo_files() uses
HfApi.model_info(files_metadata=True), which takes a timeout and does not retry.

The hub address, HF_TOKEN (or a saved `hf auth login`) and HF_HUB_OFFLINE work as for downloads
(engine.modelfiles.downloads). Every failure is a DownloadError (HubUnreachable when no answer came)
whose message says what to do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from huggingface_hub import HfApi  # noqa: E402 - after the guard above
from huggingface_hub.errors import (  # noqa: E402
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import ModelInfo  # noqa: E402
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status  # noqa: E402

from ..errors import InvalidSettingError  # noqa: E402

# hub_files guards the hub client's import against a malformed HF_ENDPOINT.
from .hub_files import DownloadError, HubUnreachable, hub_endpoint, hub_http

# What people pick from, and the hub's name for each order (always most first).
SORTS = {"downloads": "downloads", "likes": "likes", "recent": "lastModified"}
# The listing's default fields lack lastModified, gated and the card; ask for what a result shows.
_LIST_FIELDS = ["downloads", "likes", "lastModified", "gated", "cardData", "tags"]
# Files in a GGUF repo that are no chat model: vision projectors and importance matrices.
_NOT_A_MODEL = re.compile(r"mmproj|imatrix", re.IGNORECASE)
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# llama.cpp's quantization names as they appear in file names; longer alternatives first.
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(?P<ud>UD[-_])?(?P<quant>"
    r"IQ[1-4]_(?:XXS|XS|NL|S|M|L)"
    r"|Q[2-8]_K(?:_(?:XXL|XL|S|M|L))?"
    r"|Q[2-8]_[01](?:_[48]_[48])?"
    r"|TQ[12]_0|MXFP4(?:_MOE)?|BF16|FP16|F16|FP32|F32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class GGUFFile:
    """One model as people pick it: a single .gguf, or every part of a split one, in order."""

    parts: tuple[str, ...]  # paths in the repo
    size: int  # bytes, all parts together (0 where the hub did not say)
    quantization: str  # "Q4_K_M", "IQ4_XS", "UD-Q4_K_XL", "F16", ... or "unknown"

    @property
    def filename(self) -> str:
        """The file llama.cpp is pointed at (it finds the other parts beside it)."""
        return self.parts[0]


@dataclass(frozen=True)
class RepoResult:
    repo_id: str
    downloads: int
    likes: int
    last_modified: str | None  # ISO 8601, as the hub says it
    gated: bool | str  # False, or the hub's "auto" / "manual": then downloads need an accepted licence
    base_model: str | None  # from the model card; the first one where the card names several
    files: tuple[GGUFFile, ...] = ()  # filled by repo_files(), empty from search_repos()


BROAD_SEARCH_LIMIT = 200  # repos asked for when a many-word search is retried with one word


def search_repos(
    query: str, sort: str = "downloads", limit: int = 20, *, endpoint: str | None = None, timeout_s: float = 15
) -> list[RepoResult]:
    """Repos with GGUF files whose name holds every word of query, most downloaded (or liked, or
    recently changed) first. Their files are not listed: repo_files() does that for one repo."""
    if sort not in SORTS:
        raise InvalidSettingError(f"Unknown sort order {sort!r}: use one of {', '.join(SORTS)}.")
    if limit < 1:
        raise InvalidSettingError(f"A search must ask for at least one result, not {limit}.")
    hub = _endpoint(endpoint)
    words = query.split()
    found = _list(hub, " ".join(words), sort, limit, timeout_s)
    if not found and len(words) > 1:
        # The hub documents `search` as one substring of the id ("qwen2.5 coder" is in no id): ask for the
        # longest word, then keep the repos whose id holds every word, as a person meant.
        broad = _list(hub, max(words, key=len), sort, max(limit, BROAD_SEARCH_LIMIT), timeout_s)
        found = [r for r in broad if all(w.lower() in r.repo_id.lower() for w in words)][:limit]
    return found


def _list(hub: str, search: str, sort: str, limit: int, timeout_s: float) -> list[RepoResult]:
    params: dict[str, str | int | list[str]] = {
        "filter": "gguf",
        "sort": SORTS[sort],
        "direction": -1,
        "limit": limit,
        "expand": _LIST_FIELDS,
    }
    if search:
        params["search"] = search
    try:
        response = get_session().get(f"{hub}/api/models", params=params, headers=build_hf_headers(), timeout=timeout_s)
        hf_raise_for_status(response)
        items = response.json()
        if not isinstance(items, list):
            raise ValueError("the model listing is not a list")
        infos = [ModelInfo(**item) for item in items[:limit]]  # type: ignore[no-untyped-call]  # hub's **kwargs
    except Exception as exc:
        raise _explain(exc, hub, timeout_s) from exc
    return [_result(info) for info in infos]


def repo_files(
    repo_id: str, revision: str = "main", *, endpoint: str | None = None, timeout_s: float = 15
) -> RepoResult:
    """One repo's facts and its GGUF chat models, smallest first. mmproj and imatrix files are left
    out: they are no model to chat with. Raises DownloadError when the repo holds none."""
    hub = _endpoint(endpoint)
    try:
        info = HfApi(endpoint=hub).model_info(repo_id, revision=revision, files_metadata=True, timeout=timeout_s)
        names = [
            (s.rfilename, s.size if s.size is not None else (s.lfs.size if s.lfs else 0)) for s in info.siblings or []
        ]
    except Exception as exc:
        raise _explain(exc, hub, timeout_s, repo_id, revision) from exc
    files = group_gguf_files(names)
    if not files:
        ggufs = [name for name, _ in names if name.lower().endswith(".gguf")]
        what = (
            f"only {', '.join(ggufs)}: projector, importance-matrix or incomplete split files"
            if ggufs
            else "no .gguf file"
        )
        raise DownloadError(
            f"{repo_id} has no GGUF model to download ({what}). SpecChat runs GGUF files: "
            "search for a GGUF version of this model (often a repo named ...-GGUF)."
        )
    return replace(_result(info), files=files)


def group_gguf_files(entries: Iterable[tuple[str, int]]) -> tuple[GGUFFile, ...]:
    """(path, size) pairs -> one GGUFFile per model, smallest first. Split parts
    (X-00001-of-00003.gguf ...) become one file; a set with a part missing is left out, since
    llama.cpp cannot load it."""
    singles: list[GGUFFile] = []
    splits: dict[tuple[str, int], dict[int, tuple[str, int]]] = {}
    for path, size in entries:
        name = path.rsplit("/", 1)[-1]
        if not name.lower().endswith(".gguf") or _NOT_A_MODEL.search(name):
            continue
        split = _SPLIT.match(path)
        if split:
            key = (split["stem"], int(split["count"]))
            splits.setdefault(key, {})[int(split["index"])] = (path, size)
        else:
            singles.append(GGUFFile((path,), size, quantization_of(path)))
    for (stem, count), parts in splits.items():
        if sorted(parts) != list(range(1, count + 1)):
            continue
        ordered = [parts[i] for i in range(1, count + 1)]
        singles.append(GGUFFile(tuple(p for p, _ in ordered), sum(s for _, s in ordered), quantization_of(stem)))
    return tuple(sorted(singles, key=lambda f: (f.size, f.filename)))


def quantization_of(path: str) -> str:
    """The quantization a GGUF file name states ("Q4_K_M", "UD-Q4_K_XL", "F16"), or "unknown".
    The last match wins: names put it at the end ("Llama-3-8B-Q8_0", not the "F16" of a source)."""
    name = _SPLIT.sub(r"\g<stem>.gguf", path.rsplit("/", 1)[-1])
    matches = list(_QUANT.finditer(name))
    if not matches:
        return "unknown"
    match = matches[-1]
    quant = match["quant"].upper()
    quant = {"FP16": "F16", "FP32": "F32"}.get(quant, quant)
    return f"UD-{quant}" if match["ud"] else quant


def gated_message(repo_id: str) -> str:
    return (
        f"{repo_id} is gated: accept its terms on its page on the hub (huggingface.co/{repo_id}), then set "
        "HF_TOKEN to a token of that account (or run `hf auth login`) and try again."
    )


def _endpoint(endpoint: str | None) -> str:
    return endpoint.rstrip("/") if endpoint else hub_endpoint()


def _result(info: ModelInfo) -> RepoResult:
    base = getattr(info.card_data, "base_model", None) if info.card_data is not None else None
    if isinstance(base, (list, tuple)):
        base = base[0] if base else None
    return RepoResult(
        repo_id=info.id,
        downloads=info.downloads or 0,
        likes=info.likes or 0,
        last_modified=info.last_modified.isoformat() if info.last_modified else None,
        gated=info.gated or False,
        base_model=base if isinstance(base, str) else None,
    )


def _explain(
    exc: Exception, endpoint: str, timeout_s: float, repo_id: str | None = None, revision: str = "main"
) -> DownloadError:
    """A message a person can act on, for what the hub client raised."""
    check = " and HF_ENDPOINT" if "HF_ENDPOINT" in os.environ else ""
    if isinstance(exc, OfflineModeIsEnabled):
        return HubUnreachable(
            f"The hub at {endpoint} cannot be reached: HF_HUB_OFFLINE is set, so SpecChat stays "
            "offline. Unset HF_HUB_OFFLINE to search the hub."
        )
    if isinstance(exc, hub_http.TimeoutException):
        return HubUnreachable(
            f"The hub at {endpoint} did not answer within {timeout_s:g} s. Check the network "
            f"connection{check}, then try again."
        )
    if isinstance(exc, hub_http.TransportError):
        return HubUnreachable(f"The hub at {endpoint} cannot be reached ({exc}). Check the network connection{check}.")
    if isinstance(exc, HFValidationError):
        return DownloadError(f"{repo_id!r} is not a valid Hugging Face repo id: {exc}")
    if repo_id is not None and isinstance(exc, GatedRepoError):
        return DownloadError(gated_message(repo_id))
    if repo_id is not None and isinstance(exc, RevisionNotFoundError):
        return DownloadError(f"Revision {revision!r} does not exist in {repo_id}.")
    if repo_id is not None and isinstance(exc, RepositoryNotFoundError):
        return DownloadError(
            f"Repository {repo_id} was not found on {endpoint} (or it is private: set HF_TOKEN "
            "to a token that can read it)."
        )
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else 0
        if status == 401:  # a repo the token cannot see is RepositoryNotFoundError, above: this is the token
            return DownloadError(
                f"{endpoint} refused the token SpecChat sent (HF_TOKEN, or the one saved by "
                "`hf auth login`): set a valid token, or unset HF_TOKEN, and try again."
            )
        if status >= 500 or status == 429:
            return DownloadError(f"{endpoint} answered HTTP {status}; the hub may be busy, try again later.")
        return _not_a_hub(endpoint, f"HTTP {status}")
    if isinstance(exc, (ValueError, KeyError, TypeError, AttributeError)):
        return _not_a_hub(endpoint, "its answer is not the hub's JSON")
    return DownloadError(f"Asking {endpoint} failed: {exc}")


def _not_a_hub(endpoint: str, detail: str) -> DownloadError:
    return DownloadError(
        f"{endpoint} did not answer like a Hugging Face hub ({detail}). If HF_ENDPOINT is set, "
        "check that it points to a hub or a hub mirror."
    )
