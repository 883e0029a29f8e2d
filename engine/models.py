"""`python -m engine.models`: download models from the hub, list what is installed, check a pair. It sits above
engine.modelfiles (the files) and engine.decoding (a pair's check loads both vocabularies).

python -m engine.models download REPO_ID FILENAME [--revision REV]
    Progress goes to stderr; the last line on stdout is the local path (exit 0).
    Any failure: a message on stderr and a non-zero exit. Run it again to resume.
python -m engine.models download-pair PAIR_ID     both files of a catalog pair
python -m engine.models list                      installed models and ready pairs
python -m engine.models catalog                   the curated pairs
python -m engine.models check TARGET DRAFT        can DRAFT draft for TARGET? (paths or 'embedded')
python -m engine.models search QUERY [--sort downloads|likes|recent] [--limit N] [--json]
    GGUF repos on the hub, each with its files (quantization, size); --json: the last line is one JSON list
    [{"repo_id", "downloads", "likes", "gated", "files": [{"filename", "parts", "quantization", "size"}]}]
python -m engine.models drafts REPO FILE [--json]  drafts for that target, checked from GGUF headers read
    with range requests (nothing downloaded); --json: the last line is one JSON object
    {"target", "family", "bytes_read", "candidates": [{"repo_id", "filename", "path", "size",
    "quantization", "compatible", "head", "usable", "reason"}, ...], "problems": [...]}; head: "eagle3" or
    "dflash" for a draft head (listed beside the drafts), usable: it fits and SpecChat can draft with it
python -m engine.models inspect FILE [--json]      what a GGUF file's header says: architecture, vocabulary,
    context, layers and its drafter (nothing loaded); --json: the last line is one JSON object {"path", "name",
    "architecture", "file_type", "vocabulary": {"model", "type", "size"}, "context", "layers", "embedding",
    "tensors", "drafter"}, drafter {"kind": "mtp", "layers"}, {"kind": "eagle3"|"dflash", "target_layers"} or null
python -m engine.models discover [--json]         GGUF models other apps keep here (HF cache, LM Studio,
    Ollama, Jan, GPT4All) and what was skipped; --json: the last line on stdout is one JSON object
    {"models": [{"path", "source", "name", "size_bytes"}, ...], "problems": [...]}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .errors import EngineError
from .modelfiles.catalog import find_pair, load_catalog
from .modelfiles.downloads import DownloadJob, Progress, format_bytes
from .modelfiles.hub_drafters import confirm_drafter
from .modelfiles.hub_files import DownloadCancelled, FileRequest, HubUnreachable
from .modelfiles.model_folder import installed_path, models_dir, partial_bytes

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("\nStopped. What arrived is kept: run the same command again to resume.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except DownloadCancelled as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.models", description="SpecChat models.")
    commands = parser.add_subparsers(dest="command", required=True)
    download = commands.add_parser("download", help="download one GGUF file from a Hugging Face repo")
    download.add_argument("repo_id", metavar="REPO_ID", help="owner/name, e.g. Qwen/Qwen3-0.6B-GGUF")
    download.add_argument("filename", metavar="FILENAME", help="file in the repo, e.g. Qwen3-0.6B-Q8_0.gguf")
    download.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")
    download.set_defaults(run=_download)
    pair = commands.add_parser("download-pair", help="download a catalog pair (target and draft)")
    pair.add_argument("pair_id", metavar="PAIR_ID")
    pair.set_defaults(run=_download_pair)
    commands.add_parser("list", help="installed models and ready pairs").set_defaults(run=_list)
    commands.add_parser("catalog", help="the curated pairs").set_defaults(run=_catalog)
    check = commands.add_parser("check", help="can DRAFT draft for TARGET?")
    check.add_argument("target", metavar="TARGET")
    check.add_argument("draft", metavar="DRAFT")
    check.set_defaults(run=_check)
    search = commands.add_parser("search", help="search the hub for GGUF models")
    search.add_argument("query", metavar="QUERY", nargs="+", help="words of the model's name")
    search.add_argument("--sort", choices=("downloads", "likes", "recent"), default="downloads")
    search.add_argument("--limit", type=int, default=10, help="repos to list (default 10)")
    search.add_argument("--json", action="store_true", help="end with one JSON line (for scripts)")
    search.set_defaults(run=_search)
    drafts = commands.add_parser("drafts", help="drafts for a GGUF file on the hub, checked from headers")
    drafts.add_argument("repo_id", metavar="REPO", help="owner/name of the target's repo")
    drafts.add_argument("filename", metavar="FILE", help="the target's GGUF file in that repo")
    drafts.add_argument("--json", action="store_true", help="end with one JSON line (for scripts)")
    drafts.set_defaults(run=_drafts)
    inspect = commands.add_parser("inspect", help="what a GGUF file's header says, its drafter included")
    inspect.add_argument("path", metavar="FILE", help="a .gguf file, or 'embedded'")
    inspect.add_argument("--json", action="store_true", help="end with one JSON line (for scripts)")
    inspect.set_defaults(run=_inspect)
    discover = commands.add_parser("discover", help="GGUF models other apps keep on this computer")
    discover.add_argument("--json", action="store_true", help="end with one JSON line (for scripts)")
    discover.set_defaults(run=_discover)
    return parser


def _download(args) -> int:
    request = FileRequest(args.repo_id, args.filename, args.revision)
    path: Path | None
    try:
        [path] = DownloadJob([request], _ProgressPrinter()).run()
    except HubUnreachable as exc:
        path = installed_path(request)
        if path is None:
            raise
        # Offline but already downloaded: the file is usable, it just could not be checked for updates.
        print(f"warning: {exc} Using the copy downloaded earlier.", file=sys.stderr)
    print(path)
    return 0


def _download_pair(args) -> int:
    pair = find_pair(args.pair_id)
    requests = [FileRequest(f.repo_id, f.filename, f.revision) for f in pair.files]
    problem = confirm_drafter(pair)  # an MTP model's layers, read from its header before gigabytes are fetched
    if problem:
        raise EngineError(problem)
    paths = DownloadJob(requests, _ProgressPrinter()).run()
    print(f"target: {paths[0]}")
    print(f"draft:  {paths[1]}" if len(paths) > 1 else "draft:  none (the target drafts with its MTP layers)")
    return 0


def _list(args) -> int:
    from .modelfiles.model_store import installed_pairs, list_models

    models = list_models()
    print(f"Installed models ({len(models)}), downloads in {models_dir()}:")
    for model in models:
        where = model.repo_id or "added from disk"
        print(f"  {model.name:50} {format_bytes(model.size_bytes):>10}  {where}\n    {model.path}")
    if not models:
        print("  none yet: try `python -m engine.models download-pair qwen2.5-7b-instruct`")
    pairs = installed_pairs()
    print(f"\nReady pairs ({len(pairs)}):")
    for ready in pairs:
        draft = ready.draft or "none (the target's MTP layers draft)"
        print(f"  {ready.pair.id}: {ready.pair.name}\n    target {ready.target}\n    draft  {draft}")
    partial = [
        (pair, f)
        for pair in load_catalog()
        for f in pair.files
        if partial_bytes(FileRequest(f.repo_id, f.filename, f.revision))
    ]
    if partial:
        print("\nUnfinished downloads (run download-pair again to resume):")
        for pair, f in partial:
            done = partial_bytes(FileRequest(f.repo_id, f.filename, f.revision))
            print(f"  {pair.id}: {f.filename} {format_bytes(done)} of about {format_bytes(f.size_bytes)}")
    return 0


def _catalog(args) -> int:
    for pair in load_catalog():
        mark = "" if pair.verified else "  (names not verified)"
        print(f"{pair.id}: {pair.name}, about {format_bytes(pair.size_bytes)}{mark}")
        for role, f in zip(("target", "draft"), pair.files, strict=False):
            print(f"  {role:6} {f.repo_id} {f.filename} ({f.quantization})")
        if pair.draft is None:
            print("  drafts with its own MTP layers (method mtp)")
        print(f"  {pair.note}")
    return 0


def _check(args) -> int:
    from .decoding.pair_check import check_pair  # llama.cpp loads only when a check is asked for
    from .modelfiles.embedded import resolve_model

    target, draft = resolve_model(args.target), resolve_model(args.draft)
    result = check_pair(target, draft)
    if result.ok:
        print(f"compatible: {Path(draft).name} can draft for {Path(target).name}")
        return 0
    print(f"not compatible: {result.reason}")
    return EXIT_FAILED


def _search(args) -> int:
    from .modelfiles.hub_search import repo_files, search_repos

    query = " ".join(args.query)
    repos = [repo_files(r.repo_id) for r in search_repos(query, sort=args.sort, limit=args.limit)]
    print(f"GGUF repos for “{query}” ({len(repos)}, by {args.sort}):")
    for repo in repos:
        gated = "  (gated: set HF_TOKEN)" if repo.gated else ""
        print(f"  {repo.repo_id}  {repo.downloads:,} downloads, {repo.likes:,} likes{gated}")
        for f in repo.files:
            parts = f" ({len(f.parts)} parts)" if len(f.parts) > 1 else ""
            print(f"    {f.quantization:10} {format_bytes(f.size):>10}  {f.filename}{parts}")
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "repo_id": r.repo_id,
                        "downloads": r.downloads,
                        "likes": r.likes,
                        "gated": r.gated,
                        "files": [
                            {
                                "filename": f.filename,
                                "parts": list(f.parts),
                                "quantization": f.quantization,
                                "size": f.size,
                            }
                            for f in r.files
                        ],
                    }
                    for r in repos
                ]
            )
        )
    return 0


def _drafts(args) -> int:
    from .modelfiles.draft_finder import find_drafts
    from .modelfiles.embedded import embedded_model_path
    from .modelfiles.model_store import list_models

    installed = [embedded_model_path()] + [m.path for m in list_models()]
    found = find_drafts(args.repo_id, args.filename, installed=installed)
    print(
        f"Drafts for {found.target} (family “{found.family}”), checked from GGUF headers: "
        f"{format_bytes(found.bytes_read)} read, nothing downloaded."
    )
    for c in found.candidates:
        verdict = {True: "fits", False: "does not fit", None: "unknown"}[c.compatible]
        size = format_bytes(c.size) if c.size else "?"
        print(f"  {verdict:13} {size:>10}  {c.name}\n{'':17}{c.reason or 'same vocabulary (llama.cpp rules)'}")
    for problem in found.problems:
        print(f"  {problem}")
    if args.json:
        print(
            json.dumps(
                {
                    "target": found.target,
                    "family": found.family,
                    "bytes_read": found.bytes_read,
                    "candidates": [
                        {
                            "repo_id": c.repo_id,
                            "filename": c.filename,
                            "path": str(c.path) if c.path else None,
                            "size": c.size,
                            "quantization": c.quantization,
                            "compatible": c.compatible,
                            "head": c.head,
                            "usable": c.usable,
                            "reason": c.reason,
                        }
                        for c in found.candidates
                    ],
                    "problems": found.problems,
                }
            )
        )
    return 0


def _inspect(args) -> int:
    from .modelfiles.embedded import resolve_model
    from .modelfiles.model_inspect import inspect_model

    info = inspect_model(resolve_model(args.path))
    vocab, drafter = info["vocabulary"], info["drafter"]
    print(f"{info['path']}\n  {info['name'] or '(no name)'}: {info['architecture']}, {info['file_type'] or '?'}")
    print(f"  vocabulary {vocab['type'] or '?'} ({vocab['model']}), {vocab['size']} tokens")
    print(f"  context {info['context']}, {info['layers']} layers, width {info['embedding']}, {info['tensors']} tensors")
    if drafter is None:
        print("  drafter: none built in")
    elif drafter["kind"] == "mtp":
        print(f"  drafter: MTP, {drafter['layers']} nextn layer(s) in the file")
    else:
        print(f"  drafter: this file is a {drafter['kind']} head over target layers {drafter['target_layers']}")
    if args.json:
        print(json.dumps(info))
    return 0


def _discover(args) -> int:
    from .modelfiles.local_discovery import discover_models

    found = discover_models()
    print(f"Models found in other apps' folders ({len(found.models)}), usable where they are:")
    for model in found.models:
        print(f"  {model.name:50} {model.source:12} {format_bytes(model.size_bytes):>10}\n    {model.path}")
    if found.problems:
        print(f"\nSkipped ({len(found.problems)}):")
        for problem in found.problems:
            print(f"  {problem}")
    if args.json:  # last, on one line: a script reads the final line of stdout
        models = [
            {"path": str(m.path), "source": m.source, "name": m.name, "size_bytes": m.size_bytes} for m in found.models
        ]
        print(json.dumps({"models": models, "problems": found.problems}))
    return 0


class _ProgressPrinter:
    """One updating line on a terminal; a line every 10% when stderr is a file or a pipe."""

    def __init__(self):
        self._tty = sys.stderr.isatty()
        self._last_step = -1
        self._last_line = 0.0

    def __call__(self, p: Progress) -> None:
        if p.phase == "checking":
            return
        total = format_bytes(p.total_bytes) if p.total_bytes else "?"
        line = f"[{p.file_index + 1}/{p.file_count}] {p.filename}: {p.phase} {format_bytes(p.done_bytes)} of {total}"
        if p.phase == "downloading" and p.speed_bps:
            eta = f", {p.eta_text} left" if p.eta_s is not None else ""
            line += f" at {format_bytes(p.speed_bps)}/s{eta}"
        if self._tty:
            print(f"\r{line:100.100}", end="" if p.phase != "done" else "\n", file=sys.stderr, flush=True)
            return
        step = int((p.fraction or 0) * 10)
        if step != self._last_step or p.phase in ("verifying", "done") or time.monotonic() - self._last_line > 30:
            self._last_step, self._last_line = step, time.monotonic()
            print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
