"""Checks a model file in a short-lived child process before this process loads it.

llama.cpp aborts the whole process (GGML_ASSERT, exit 134) on some damaged files, and no header
check foresees every case. So each new or changed file is first loaded by a child process; if the
child dies, the file is refused with the child's last words and the app lives on. Verdicts are
remembered by path, size, mtime and llama.cpp version, so each file is checked once.

The child also probe-renders the file's chat template (a short conversation, in engine.template_sandbox's
limits): a template that hangs or blows up is known before the first chat, and the verdict keeps why.

    python -m engine.modelfiles.model_check FILE [--vocab-only]     the child's side: prints one JSON verdict line
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ModelFileError
from ..paths import cache_dir, write_text_atomic
from .gguf_header import metadata_problem, read_gguf_header, read_gguf_metadata
from .model_inspect import HEAD_ARCHS

CHECK_TIMEOUT_S = 300.0
VERDICTS_FILE = "model-checks.json"
CHECK_VERSION = "t2"  # verdicts made before the template probe (t1) and draft heads' loads (t2) are checked again
PROBE_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": "Tell me a short story."},
]
FROZEN_FLAG = "--check-model-file"  # how a PyInstaller bundle runs the child (packaging/specchat_launcher.py)
_verdicts_lock = threading.Lock()
_CRASH_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}
_LAST_WORDS = re.compile(r"(GGML_ASSERT\(.*?\) failed|[^/\s]*error[^:]*:.*)", re.IGNORECASE)


def check_model_file(path: str | Path, vocab_only: bool = False) -> str | None:
    """Return if llama.cpp can load this file (only its vocabulary, with vocab_only); raise
    ModelFileError saying why not. A file seen before (same path, size, mtime, llama.cpp, load kind)
    is answered from the remembered verdict. Returns why its chat template was refused, or None (fine,
    or none)."""
    path = Path(path)
    read_gguf_header(path)  # missing, not GGUF, truncated: said at once, without a child
    key = _key(path, vocab_only)
    with _verdicts_lock:
        known = _read_verdicts()
    verdict = known.get(key)
    if verdict is None and vocab_only and known.get(_key(path, False), {}).get("ok"):
        verdict = {**known[_key(path, False)]}  # a full load passed, so reading the vocabulary alone does too
    if verdict is None:
        verdict = _check_in_child(path, vocab_only)
        if verdict.pop("final", True):
            with _verdicts_lock:
                verdicts = {k: v for k, v in _read_verdicts().items() if os.path.exists(k.rsplit("|", 6)[0])}
                verdicts[key] = verdict  # (verdicts of files that are gone are dropped on the way)
                _write_verdicts(verdicts)
    if not verdict.get("ok"):
        raise ModelFileError(verdict.get("reason") or f"{path.name} cannot be loaded.")
    return verdict.get("template") or None


def file_identity(path: Path) -> str:
    """One file as it is now: its path, size and times, and inode and ctime too, since a copy that keeps size and
    mtime (cp -p, rsync -t) is still a new file. Raises OSError when it cannot be read."""
    stat = path.stat()
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}|{stat.st_ctime_ns}"


def _key(path: Path, vocab_only: bool) -> str:
    import llama_cpp

    kind = "vocab" if vocab_only else "model"
    return f"{file_identity(path)}|{llama_cpp.__version__}+{CHECK_VERSION}|{kind}"


def _check_in_child(path: Path, vocab_only: bool) -> dict[str, Any]:
    name = path.name
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # a crash prints its assert, not a gdb session
    try:
        done = subprocess.run(
            _child_command(path, vocab_only),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CHECK_TIMEOUT_S,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "final": False,
            "reason": f"Checking {name} took over {CHECK_TIMEOUT_S:.0f} s; it was not loaded. Try again.",
        }
    except OSError as exc:
        return {"ok": False, "final": False, "reason": f"Could not start the check of {name}: {exc}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            verdict: dict[str, Any] = json.loads(lines[-1])  # the child's last line: its verdict, an object
            return verdict
        except ValueError:
            pass
    # Only a crash says something about the file; a kill (out of memory, logout) or a failure of the
    # child's own Python is not remembered, so the file is checked again next time.
    crashed = -done.returncode in _CRASH_SIGNALS
    return {"ok": False, "final": crashed, "reason": _crash_reason(name, done.returncode, done.stderr)}


def _crash_reason(name: str, returncode: int, stderr: str) -> str:
    how = f"exit code {returncode}"
    if returncode < 0:
        try:
            how = signal.Signals(-returncode).name
        except ValueError:
            how = f"signal {-returncode}"
    words = [m.group(1).strip() for line in stderr.splitlines() if (m := _LAST_WORDS.search(line))]
    said = f": {words[-1]}" if words else ""
    return (
        f"llama.cpp crashed reading {name} ({how}{said}). The file is damaged, or made for another "
        "llama.cpp version; SpecChat did not load it."
    )


def _child_command(path: Path, vocab_only: bool) -> list[str]:
    args = [str(path), *(["--vocab-only"] if vocab_only else [])]
    if getattr(sys, "frozen", False):
        return [sys.executable, FROZEN_FLAG, *args]
    return [sys.executable, "-m", "engine.modelfiles.model_check", *args]


def child_main(argv: list[str]) -> int:
    """Load the file the way the app will (on the CPU: the same header values, no GPU memory) and print
    {"ok": ..., "reason": ...}. An abort inside llama.cpp ends this process, which is the point."""
    path, vocab_only = Path(argv[0]), "--vocab-only" in argv[1:]
    try:
        problem = metadata_problem(read_gguf_metadata(path), path.name)
    except ModelFileError as exc:
        problem = str(exc)
    template = None
    if problem is None:
        problem, template = _load_problem(path, vocab_only)
    print(json.dumps({"ok": problem is None, "reason": problem or "", "template": template}), flush=True)
    return 0


def _load_problem(path: Path, vocab_only: bool) -> tuple[str | None, str | None]:
    """Why llama.cpp cannot load the file (None: it can), and why its chat template is refused (None: fine)."""
    import llama_cpp as L

    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0
    mparams.vocab_only = vocab_only
    mparams.use_extra_bufts = False  # no repacked copy of the weights: the check stays within the file's mmap
    model = L.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        return (
            f"llama.cpp could not load {path.name}: the file may be damaged, or its architecture is newer "
            "than this llama.cpp build (upgrade llama-cpp-python)."
        ), None
    template = _template_problem(L, model)
    if vocab_only or _is_head(L, model):  # a draft head's context opens only beside its target's (ctx_other)
        L.llama_model_free(model)
        return None, template
    cparams = L.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 256
    cparams.n_threads = cparams.n_threads_batch = 1
    ctx = L.llama_init_from_model(model, cparams)
    if ctx:
        L.llama_free(ctx)
    L.llama_model_free(model)
    return (
        None if ctx else f"llama.cpp could not create a context for {path.name}: the file may be damaged."
    ), template


def _is_head(L: ModuleType, model: object) -> bool:  # L: llama_cpp; model: its llama_model
    """An EAGLE-3 / DFlash draft head, which llama.cpp loads alone but opens a context for only beside a target."""
    buf = ctypes.create_string_buffer(64)
    n = L.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
    return n >= 0 and buf.value.decode("utf-8", "replace") in HEAD_ARCHS


def _template_problem(L: ModuleType, model: object) -> str | None:  # L: llama_cpp; model: its llama_model
    """Why the model's chat template is refused (a limit broken rendering PROBE_CONVERSATION), or None."""
    from ..template_sandbox import TemplateRefused, TemplateSandbox

    raw = L.llama_model_chat_template(model, None)
    if not raw:
        return None
    vocab = L.llama_model_get_vocab(model)

    def text(token: int) -> str:
        return (L.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", "replace") if token >= 0 else ""

    sandbox = TemplateSandbox()
    try:
        sandbox.render(
            raw.decode("utf-8", "replace"),
            PROBE_CONVERSATION,
            bos=text(L.llama_vocab_bos(vocab)),
            eos=text(L.llama_vocab_eos(vocab)),
        )
    except TemplateRefused as exc:
        return exc.reason
    except Exception:  # noqa: BLE001 - it rejected this conversation (a role it lacks): not a verdict on the file
        return None
    finally:
        sandbox.close()
    return None


def _verdicts_path() -> Path:
    return cache_dir() / VERDICTS_FILE


def _read_verdicts() -> dict[str, Any]:
    try:
        verdicts = json.loads(_verdicts_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return verdicts if isinstance(verdicts, dict) else {}


def _write_verdicts(verdicts: dict[str, Any]) -> None:
    try:
        write_text_atomic(_verdicts_path(), json.dumps(verdicts, indent=1))
    except OSError:  # a read-only cache only means checking again next time
        pass


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
