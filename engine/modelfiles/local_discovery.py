"""GGUF models other apps already keep on this computer, found where they lie (issue 53).

Nothing is loaded or copied: each candidate gets a GGUF header check (engine.modelfiles.gguf_header) and
whatever is skipped is said in a sentence in Discovery.problems. The walks are bounded (depth, entries
looked at, directory symlinks followed once), so a huge or looping folder cannot hang the caller.

Where each app keeps its models (the sources relied on):
- Hugging Face cache: huggingface_hub's scan_cache_dir; the folder follows huggingface_hub.constants'
  rules (HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub),
  read here at call time because the library reads the environment once, at import.
- LM Studio: ~/.lmstudio/models/<publisher>/<repo>/<file>.gguf (lmstudio.ai/docs/advanced/sideload);
  ~/.cache/lm-studio/models was the models folder of LM Studio 0.2.x.
- Ollama: $OLLAMA_MODELS, else ~/.ollama/models; the Linux install script's service keeps them in
  /usr/share/ollama/.ollama/models (ollama docs/faq.md "Where are models stored?"). A manifest
  manifests/<registry>/<namespace>/<name>/<tag> lists layers; the one with mediaType
  application/vnd.ollama.image.model is the GGUF, stored as blobs/sha256-<hex> (ollama/ollama
  server/internal/manifest/manifest.go; a projector layer has its own mediaType and is left out).
- Jan: ~/jan/models (Jan before 0.6) and the Jan data folder's models: %APPDATA%/Jan/data,
  ~/Library/Application Support/Jan/data, ~/.config/Jan/data (jan.ai/docs/data-folder); some builds used
  ~/.local/share/Jan/data. Models sit in <id>/, huggingface.co/<owner>/<repo>/ or llamacpp/<id>/: walked.
- GPT4All: the download path %LOCALAPPDATA%/nomic.ai/GPT4All, ~/Library/Application Support/nomic.ai/GPT4All,
  ~/.local/share/nomic.ai/GPT4All (nomic-ai/gpt4all gpt4all_desktop/settings.md, "Download Path").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from .. import safe_files
from ..errors import ModelFileError
from .gguf_header import read_gguf_header

HUGGINGFACE, LMSTUDIO, OLLAMA, JAN, GPT4ALL = "huggingface", "lmstudio", "ollama", "jan", "gpt4all"
SOURCES = (HUGGINGFACE, LMSTUDIO, OLLAMA, JAN, GPT4ALL)  # also the order a file found twice is credited in
MAX_DEPTH = 6  # Jan's deepest layout is models/huggingface.co/<owner>/<repo>/<file>
MAX_ENTRIES = 50_000  # directory entries looked at in one discovery, all sources together
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes; a huge file there is read no further
_MANIFEST = safe_files.Wording(
    too_large="over {limit} bytes, too big for a manifest",
    grew="over {limit} bytes, too big for a manifest",
    unreadable="{why}",
)
OLLAMA_REGISTRY, OLLAMA_LIBRARY = "registry.ollama.ai", "library"
_SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)  # llama.cpp's gguf-split names
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")  # anything else could point outside blobs/


@dataclass(frozen=True)
class FoundModel:
    path: Path  # used in place: an HF snapshot link or an Ollama blob stays what it is
    source: str  # one of SOURCES
    name: str
    size_bytes: int


@dataclass(frozen=True)
class Discovery:
    models: list[FoundModel]
    problems: list[str]  # one sentence for each thing skipped


def discover_models(
    *, home: Path | None = None, hf_cache: Path | None = None, roots: dict[str, list[Path]] | None = None
) -> Discovery:
    """GGUF chat models of the Hugging Face cache, LM Studio, Ollama, Jan and GPT4All, sorted by source then name.

    home stands in for the user's home folder (tests); hf_cache for the Hugging Face cache; roots replaces the
    folders searched for the sources it names. Never raises for what it finds: problems says what was skipped."""
    places = _default_roots(Path(home) if home is not None else None)
    places.update({source: [Path(p) for p in paths] for source, paths in (roots or {}).items()})
    if hf_cache is not None:
        places[HUGGINGFACE] = [Path(hf_cache)]
    search = _Search()
    for cache in places.get(HUGGINGFACE, []):
        _scan_hf_cache(cache, search)
    for source in (LMSTUDIO, JAN, GPT4ALL):
        for root in places.get(source, []):
            _scan_tree(root, source, search)
    for root in places.get(OLLAMA, []):
        _scan_ollama(root, search)
    models = sorted(search.models, key=lambda m: (SOURCES.index(m.source), m.name.lower(), str(m.path)))
    return Discovery(models, search.problems)


# --- where to look -------------------------------------------------------------------------------
def _default_roots(home: Path | None) -> dict[str, list[Path]]:
    user = home or Path.home()
    ollama = [Path(os.environ["OLLAMA_MODELS"])] if os.environ.get("OLLAMA_MODELS") else [user / ".ollama/models"]
    if home is None:  # a system-wide install, not under anyone's home: only for the real user
        ollama.append(Path("/usr/share/ollama/.ollama/models"))
    config = _rehome(platformdirs.user_config_dir(roaming=True), home)
    data = _rehome(platformdirs.user_data_dir(roaming=True), home)
    local_data = _rehome(platformdirs.user_data_dir(), home)
    return {
        HUGGINGFACE: [_hf_cache_dir(user)],
        LMSTUDIO: [user / ".lmstudio/models", user / ".cache/lm-studio/models"],
        OLLAMA: ollama,
        JAN: _unique([user / "jan/models", config / "Jan/data/models", data / "Jan/data/models"]),
        GPT4ALL: [local_data / "nomic.ai/GPT4All"],
    }


def _hf_cache_dir(user: Path) -> Path:
    # huggingface_hub.constants' rules, read now: the library read the environment once, at its import
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HF_HUB_CACHE"])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    cache = os.environ.get("XDG_CACHE_HOME") or str(user / ".cache")
    return Path(cache) / "huggingface/hub"


def _rehome(folder: str, home: Path | None) -> Path:
    """platformdirs answers for the real home; a stand-in home gets the same folder below it."""
    path = Path(folder)
    if home is None:
        return path
    try:
        return home / path.relative_to(Path.home())
    except ValueError:
        return path  # set outside the home (XDG_*_HOME): the same for any home


def _unique(paths: list[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


# --- the search's state ---------------------------------------------------------------------------
@dataclass
class _Search:
    models: list[FoundModel] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # resolved paths: a file reached twice is listed once
    entries_left: int = field(default_factory=lambda: MAX_ENTRIES)

    def add(self, path: Path, source: str, name: str, size: int | None = None) -> None:
        """Lists path if it is a GGUF file not listed yet; size None: the header check's size."""
        try:
            key = str(path.resolve(strict=True))
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop, on Python before 3.13
            self.problems.append(
                f"Skipped {path} ({_LABELS[source]}): it cannot be opened "
                f"({_reason(exc)}; a broken or looping symbolic link?)."
            )
            return
        if key in self.seen:
            return
        try:
            header = read_gguf_header(path)  # header only: the file is never loaded here
        except ModelFileError as exc:
            self.problems.append(f"Skipped {path} ({_LABELS[source]}): {exc}")
            return
        self.seen.add(key)
        self.models.append(FoundModel(path, source, name, header.size_bytes if size is None else size))

    def take_entry(self, folder: Path) -> bool:
        if self.entries_left <= 0:
            if self.entries_left == 0:
                self.problems.append(
                    f"Stopped searching at {folder}: over {MAX_ENTRIES} files and folders "
                    "were looked at; add a model from deeper folders by hand."
                )
                self.entries_left -= 1
            return False
        self.entries_left -= 1
        return True


_LABELS = {HUGGINGFACE: "Hugging Face cache", LMSTUDIO: "LM Studio", OLLAMA: "Ollama", JAN: "Jan", GPT4ALL: "GPT4All"}


def _reason(exc: BaseException) -> str:
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).rstrip(".")


def _skipped_file(name: str) -> bool:
    """Not a chat model of its own: a vision projector, or a later part of a split model."""
    if "mmproj" in name.lower():
        return True
    split = _SPLIT_PART.search(name)
    return split is not None and int(split.group(1)) != 1


def _split_size(path: Path, size: int) -> int:
    """The size of all parts of a split model, named from its first part; size for a whole file."""
    split = _SPLIT_PART.search(path.name)
    if not split:
        return size
    total = 0
    for n in range(1, int(split.group(2)) + 1):
        part = path.with_name(f"{path.name[: split.start()]}-{n:05d}-of-{split.group(2)}.gguf")
        try:
            total += part.stat().st_size
        except OSError:
            return size  # a part is missing: llama.cpp will say so when it loads
    return total


# --- plain folders: LM Studio, Jan, GPT4All --------------------------------------------------------
def _scan_tree(root: Path, source: str, search: _Search) -> None:
    for path in _walk(root, search):
        if _skipped_file(path.name):
            continue
        relative = path.relative_to(root)
        # LM Studio names a model by where it lies: <publisher>/<repo>/<file>
        name = relative.as_posix() if source == LMSTUDIO and len(relative.parts) >= 3 else path.name
        before = len(search.models)
        search.add(path, source, name)
        if len(search.models) > before and _SPLIT_PART.search(path.name):
            found = search.models[-1]
            search.models[-1] = FoundModel(found.path, found.source, found.name, _split_size(path, found.size_bytes))


def _walk(root: Path, search: _Search, depth: int = MAX_DEPTH, suffix: str | None = ".gguf") -> Iterator[Path]:
    """Files below root ending in suffix (any file for None), at most depth folders down. A folder reached
    again through a symbolic link (a loop, or a second link to it) is skipped and said."""
    visited: set[tuple[int, int]] = set()
    stack = [(root, 0)]
    while stack:
        folder, level = stack.pop()
        try:
            stat = folder.stat()
            if (stat.st_dev, stat.st_ino) in visited:
                search.problems.append(
                    f"Skipped {folder}: it leads back to a folder already searched "
                    "(a symbolic link loop or a second link to it)."
                )
                continue
            visited.add((stat.st_dev, stat.st_ino))
            with os.scandir(folder) as entries:
                items = sorted(entries, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue  # the app is not installed, or keeps nothing here
        except OSError as exc:
            search.problems.append(f"Could not look inside {folder}: {_reason(exc)}.")
            continue
        for entry in items:
            if not search.take_entry(folder):
                return
            path = Path(entry.path)
            if _is_dir(entry):  # follows a symbolic link: the visited set stops loops
                if level < depth - 1:
                    stack.append((path, level + 1))
            elif suffix is None or entry.name.lower().endswith(suffix):
                yield path  # a broken or looping link too: the search says what is wrong with it


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False  # a link to itself (ELOOP): treated as a file, so the search names it


# --- the Hugging Face cache --------------------------------------------------------------------------
def _scan_hf_cache(cache: Path, search: _Search) -> None:
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return
    except (OSError, ValueError) as exc:
        search.problems.append(f"Could not read the Hugging Face cache {cache}: {_reason(exc)}.")
        return
    for warning in info.warnings:
        search.problems.append(f"Skipped part of the Hugging Face cache: {warning}")
    files = [
        (repo.repo_id, revision.snapshot_path, f)
        for repo in info.repos
        if repo.repo_type == "model"
        for revision in repo.revisions
        for f in revision.files
    ]
    for repo_id, snapshot, cached in sorted(files, key=lambda x: (x[0], str(x[2].file_path))):
        path = cached.file_path  # the snapshot link, used in place
        if path.suffix.lower() != ".gguf" or _skipped_file(path.name):
            continue
        if search.take_entry(path.parent):  # the name keeps a subfolder: repos put each split quant in one
            name = f"{repo_id}/{path.relative_to(snapshot).as_posix()}"
            search.add(path, HUGGINGFACE, name, _split_size(path, cached.size_on_disk))


# --- Ollama ---------------------------------------------------------------------------------------------
def _scan_ollama(root: Path, search: _Search) -> None:
    manifests = root / "manifests"
    for manifest in _walk(manifests, search, depth=4, suffix=None):
        parts = manifest.relative_to(manifests).parts
        if len(parts) != 4 or parts[-1].startswith("."):
            continue  # not <registry>/<namespace>/<name>/<tag>: something else (.DS_Store) lives here
        name = _ollama_name(*parts)
        try:
            layers = json.loads(_read_small(manifest)).get("layers")
            layer = next(x for x in layers if isinstance(x, dict) and x.get("mediaType") == OLLAMA_MODEL_LAYER)
        except (OSError, UnicodeDecodeError) as exc:
            search.problems.append(
                f"Skipped the Ollama model {name}: its manifest {manifest} cannot be read ({_reason(exc)})."
            )
            continue
        except (ValueError, AttributeError, TypeError) as exc:
            search.problems.append(
                f"Skipped the Ollama model {name}: its manifest {manifest} is not valid "
                f"JSON of a manifest ({_reason(exc)})."
            )
            continue
        except StopIteration:
            search.problems.append(
                f"Skipped the Ollama model {name}: its manifest {manifest} has no GGUF "
                "model layer (a model in another format?)."
            )
            continue
        digest = _DIGEST.fullmatch(str(layer.get("digest")))
        blob = root / "blobs" / f"sha256-{digest.group(1)}" if digest else None
        if blob is None or not blob.is_file():
            what = "names no valid blob" if blob is None else f"names the blob {blob.name}, which is missing"
            search.problems.append(
                f"Skipped the Ollama model {name}: its manifest {what} "
                "(an unfinished or removed pull; `ollama pull` it again)."
            )
            continue
        search.add(blob, OLLAMA, name)


def _read_small(path: Path) -> str:
    """A manifest's text; OSError if it is no regular file (a FIFO there would stall the search) or too big."""
    try:
        data = safe_files.read_bytes(path, MAX_MANIFEST_BYTES, _MANIFEST)
    except safe_files.FileRefused as exc:
        raise OSError(str(exc)) from exc
    return data.decode("utf-8")


def _ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """The name `ollama list` shows: qwen2.5-coder:1.5b, user/model:tag, hf.co/owner/repo:tag."""
    if registry == OLLAMA_REGISTRY:
        return f"{model}:{tag}" if namespace == OLLAMA_LIBRARY else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"
