"""`python -m engine.serve`: the OpenAI-compatible server on the command line, until Ctrl+C."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from ..decoding.loader import DecoderSettings, load_draft, load_target, make_proposer
from ..errors import EngineError
from ..methods import DEFAULT_MAX_DRAFT, DEFAULT_METHOD, DRAFT_METHODS, METHODS
from .api_config import MAX_BODY_BYTES
from .service import DEFAULT_PORT, ServeOptions, Service


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.serve", description=__doc__)
    ap.add_argument("--model", default="embedded", help="a GGUF path, 'embedded' or 'embedded-gemma'")
    ap.add_argument("--draft", help="draft GGUF path (for --method draft or auto)")
    ap.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD)
    ap.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves the local network (needs --api-key)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    ap.add_argument(
        "--api-key",
        default=os.environ.get("SPECCHAT_API_KEY"),
        help="clients must send 'Authorization: Bearer KEY' (default: $SPECCHAT_API_KEY)",
    )
    ap.add_argument(
        "--cors",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to call the API (repeatable; '*' for any)",
    )
    ap.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name clients reach this server by (repeatable); a Host header that is not such a "
        "name, localhost or an IP address this server answers to gets 403",
    )
    ap.add_argument("--parallel", type=int, default=4, help="requests decoded together in one batch")
    ap.add_argument("--max-queue", type=int, default=32, help="requests that may wait beyond those (then 429)")
    ap.add_argument(
        "--max-body-mb",
        type=float,
        default=MAX_BODY_BYTES / (1 << 20),
        help="the largest request body taken, in MiB (then 413)",
    )
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ctx", type=int, default=8192, help="KV cells shared by all requests in flight")
    ap.add_argument("--max-draft", type=int, default=DEFAULT_MAX_DRAFT)
    ap.add_argument(
        "--exact",
        action="store_true",
        help="exact greedy: verify only as many rows at once as this build decodes bit for bit like one-row "
        "steps (measured at the first request), so a greedy answer alone in its batch is plain "
        "decoding's token for token",
    )
    ap.add_argument(
        "--no-remember",
        action="store_true",
        help="lookup searches only the request itself, not earlier answers (benchmarks whose prompts repeat)",
    )
    return ap.parse_args(argv)


SWITCH_INTERVAL_S = 0.001  # Python's default 5 ms lets the HTTP thread hold the engine thread up between decodes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        options = ServeOptions(
            args.host,
            args.port,
            args.api_key,
            tuple(args.cors),
            args.parallel,
            args.max_queue,
            int(args.max_body_mb * (1 << 20)),
            tuple(args.allow_host),
        )
        settings = DecoderSettings(
            model=args.model,
            draft=args.draft,
            method=args.method,
            max_draft=args.max_draft,
            n_ctx=args.ctx,
            threads=args.threads,
            remember_requests=not args.no_remember,
            exact=args.exact,
        )
        target = load_target(settings, n_seq_max=args.parallel)
        draft = load_draft(settings, target, n_seq_max=args.parallel) if args.method in DRAFT_METHODS else None
        proposer = make_proposer(settings, target, draft)
        service = Service(target, proposer, settings.speculation(), options, model_id=target.path.stem).start()
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(
        f"SpecChat serving {target.path.name} ({service.scheduler.method}, {options.parallel} parallel, "
        f"{target.backend}) at {service.url}/v1",
        flush=True,
    )
    done.wait()
    service.stop()
    target.close()
    if draft is not None:
        draft.close()
    return 0
