"""Start SpecChat: `specchat` or `python -m app`.

    specchat                      open the window
    specchat --send "Hello"       open it and send a message in a new conversation
    specchat doctor [--json]      the system check (engine.doctor): llama.cpp's build and devices, the VRAM
                                  reader, where the model's layers went, a 15-second bench
    specchat --smoke-test         check the whole path offscreen: send one message to the embedded model
                                  with prompt lookup, print the response's figures, text and model as one
                                  JSON line, exit 0 (non-zero on any failure). Uses temporary settings and
                                  storage. --prompt TEXT sends TEXT instead of the built-in passage;
                                  --use-settings answers with the saved model and settings instead (read,
                                  never written: conversations still go to temporary storage).
                                  --engine-url URL [--engine-model ID] [--api-key-env NAME] asks that
                                  OpenAI-compatible server instead ("backend": "remote …").

One SpecChat runs per data folder: launched again, it brings the running window forward (handing it
the --send message, if any) and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import shutil
import sys
import tempfile
import traceback
from typing import cast


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The app's options (args.engine: the --engine-url server's Endpoint, or None), and the rest for Qt."""
    parser = _parser()
    args, qt_args = parser.parse_known_args(argv)
    _check(parser, args)
    return args, qt_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specchat", description="Chat with local GGUF models, faster with lossless speculative decoding."
    )
    parser.add_argument("--send", metavar="TEXT", help="send TEXT in a new conversation once the window opens")
    parser.add_argument(
        "--smoke-test",
        action="store_true",
        help="send one message to the embedded model offscreen, print its figures as JSON, exit",
    )
    parser.add_argument("--prompt", metavar="TEXT", help="with --smoke-test: send TEXT instead of the built-in passage")
    parser.add_argument(
        "--use-settings",
        action="store_true",
        help="with --smoke-test: the saved model and settings instead of the embedded model's",
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="with --smoke-test: exact greedy (the answer is plain "
        "decoding's token for token; verifies kept as narrow as this build decodes like one row)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the smoke test may take (600)")
    parser.add_argument(
        "--engine-url",
        metavar="URL",
        help="with --smoke-test: ask this OpenAI-compatible server "
        "(vLLM, llama-server, a SpecChat server) instead of this machine's engine",
    )
    parser.add_argument(
        "--engine-model",
        metavar="ID",
        default="",
        help="with --engine-url: the server's model (default: the first it lists)",
    )
    parser.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="with --engine-url: the environment variable that holds the server's API key",
    )
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that go together, or not at all (parser.error exits); the --engine-url server, checked."""
    if (args.engine_url or args.api_key_env or args.engine_model) and not args.smoke_test:
        parser.error(
            "--engine-url, --engine-model and --api-key-env go with --smoke-test; in the window, a chat's "
            "engine is set in its chat settings"
        )
    if (args.api_key_env or args.engine_model) and not args.engine_url:
        parser.error("--engine-model and --api-key-env go with --engine-url")
    if args.engine_url:
        from engine.errors import EngineError
        from engine.remote.endpoint import Endpoint, normalised_url
        from engine.remote.keys import key_from_env

        try:
            args.engine = Endpoint(
                normalised_url(args.engine_url), args.engine_model.strip(), key_from_env(args.api_key_env)
            )
        except EngineError as exc:
            parser.error(str(exc))
    else:
        args.engine = None
    if args.prompt is not None and not args.smoke_test:
        parser.error("--prompt goes with --smoke-test; to open the window with a message, use --send")
    if args.exact and not args.smoke_test:
        parser.error("--exact goes with --smoke-test; in the window it is Settings → Exact greedy")
    if args.use_settings and not args.smoke_test:
        parser.error("--use-settings goes with --smoke-test (the window always uses them)")
    if args.prompt is not None and not args.prompt.strip():
        parser.error("--prompt needs some text")


class _PrivateLog(logging.handlers.RotatingFileHandler):
    """The log, readable by the user alone (it names files, servers and what went wrong): each file it opens, the
    first and each after a rollover, is made PRIVATE_FILE (engine.paths)."""

    def _open(self):
        from engine.paths import private_opener

        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors, opener=private_opener)


def _setup_logging() -> None:
    from engine.paths import data_dir, make_private

    handlers: list[logging.Handler] = [logging.StreamHandler()]
    log_file = data_dir() / "specchat.log"
    for kept in (1, 2):  # the rolled-over logs an older version left readable by others
        make_private(f"{log_file}.{kept}")
    try:
        handlers.append(_PrivateLog(log_file, maxBytes=1 << 20, backupCount=2, encoding="utf-8"))
    except OSError:
        pass
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request to a remote engine is noise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:  # the system check, without a window (also how the bundle runs it as a child)
        from engine.doctor import main as doctor

        return doctor(argv[1:])
    args, qt_args = parse_args(argv)
    scratch = _smoke_folders(args.use_settings) if args.smoke_test else ""
    _setup_logging()
    app = _application(qt_args)

    from app.single_instance import claim, instance_name
    from engine.paths import data_dir

    instance = claim(instance_name(data_dir()), {"send": args.send})
    if instance is None:  # before the store opens: the running one owns the conversation file
        logging.getLogger("specchat").info("SpecChat is already running; it was asked to come forward.")
        return 0
    window = _open_window(args)
    instance.requested.connect(lambda request: _come_forward(window, request))
    _install_excepthook(window, smoke=args.smoke_test)
    window.show()
    if args.smoke_test:
        from app.smoke import SmokeTest

        _smoke_test = SmokeTest(window, args.timeout, args.prompt, args.engine)  # lives until exit: app.exec() is below
        code = app.exec()
        instance.close()
        shutil.rmtree(scratch, ignore_errors=True)
        return code
    if args.send:
        window.new_chat()
        window.session.send(args.send)
    code = app.exec()
    instance.close()  # removes the socket file now: Python's exit may never run Qt's destructors
    return code


def _smoke_folders(use_settings: bool) -> str:
    """The smoke test's own settings and conversations, in a temporary folder (returned), never the user's: with
    use_settings, a copy of the user's settings. Offscreen unless told otherwise."""
    from engine.paths import config_dir

    saved = config_dir() if use_settings else None  # found before the temporary folders replace it
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    scratch = tempfile.mkdtemp(prefix="specchat-smoke-")
    os.environ["SPECCHAT_CONFIG_DIR"] = os.path.join(scratch, "config")  # never the user's own files
    os.environ["SPECCHAT_DATA_DIR"] = os.path.join(scratch, "data")
    if saved is not None:  # a copy: reading a damaged file must not set the user's own aside
        shutil.copytree(saved, os.environ["SPECCHAT_CONFIG_DIR"], dirs_exist_ok=True)
    return scratch


def _application(qt_args: list[str]):
    """The QApplication (the one there already, when there is one), named."""
    from PySide6.QtWidgets import QApplication

    from app.qt_compat import guard_none_refcount

    guard_none_refcount()  # also when `app` was imported as a namespace package (an editable install)
    app = cast("QApplication | None", QApplication.instance()) or QApplication([sys.argv[0], *qt_args])
    app.setApplicationName("SpecChat")
    app.setApplicationDisplayName("SpecChat")
    app.setOrganizationName("SpecChat")
    return app


def _open_window(args: argparse.Namespace):
    """The main window on the saved settings (the smoke test's own, unless --use-settings) and conversations,
    with what went wrong reading them said in it and kept in the log."""
    # Imported after the QApplication exists and before the window: the engine pulls in torch, and
    # loading it here keeps that one-off cost out of the running GUI.
    from app.conversations.held_answers import open_store_with_held
    from app.main_window import MainWindow
    from app.settings.values import load_settings

    settings, notices = load_settings()
    store, store_notices = open_store_with_held()
    if args.smoke_test and not args.use_settings:
        from app.smoke import smoke_settings

        settings = smoke_settings()
    if args.smoke_test and args.exact:
        settings = settings.merged({"exact_greedy": True})
    for text in notices + store_notices:
        logging.getLogger("specchat").warning("%s", text)  # shown in the window too; kept in the log
    return MainWindow(settings, store, notices + store_notices)


def _come_forward(window, request: dict) -> None:
    """Another launch asked for this window: show it, and send its message if it brought one."""
    logging.getLogger("specchat").info("another launch asked SpecChat to come forward")
    if window.isMinimized():
        window.showNormal()
    window.show()
    window.raise_()
    window.activateWindow()
    text = request.get("send")
    if isinstance(text, str) and text.strip():
        if window.session.busy:
            typed = window.input.toPlainText().rstrip()  # a response is being written: the message waits
            window.input.setPlainText(f"{typed}\n\n{text}" if typed else text)  # beside what was typed
        else:
            window.new_chat()
            window.session.send(text)


def crash_notice(window, kind, value) -> str:
    """What the user reads about an unexpected error. It claims the conversations are saved only when nothing
    is waiting to be saved and the error is not the storage failing (then that last write may be missing)."""
    import sqlite3

    said = f"Something went wrong: {kind.__name__}: {value}."
    unsaved = getattr(window.session, "unsaved", 0)
    if unsaved:
        return (
            f"{said} An answer is not saved yet (see the notice about it); everything saved before is kept. "
            "Details are in the log."
        )
    if issubclass(kind, (sqlite3.Error, OSError)):
        return f"{said} The last change may not be saved; everything saved before is kept. Details are in the log."
    return f"{said} Your conversations are saved; details are in the log."


def _install_excepthook(window, smoke: bool) -> None:
    """An unexpected error in a slot is logged and shown; the app keeps running (the smoke test fails)."""
    log = logging.getLogger("specchat")

    def hook(kind, value, tb):
        log.error("unexpected error:\n%s", "".join(traceback.format_exception(kind, value, tb)))
        if smoke:
            from PySide6.QtWidgets import QApplication

            print(f"smoke test failed: {kind.__name__}: {value}", file=sys.stderr)
            QApplication.exit(1)
            return
        try:
            window.notices.show_notice(crash_notice(window, kind, value), "error", key="crash")
        except Exception:  # noqa: BLE001
            pass

    sys.excepthook = hook


if __name__ == "__main__":
    sys.exit(main())
