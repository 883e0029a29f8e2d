"""Chat templates are code from a file: they render in a child process with a time, memory and output budget.

A GGUF's `tokenizer.chat_template` runs in llama-cpp-python's Jinja sandbox, which refuses attribute
escapes and `range()` beyond 100,000, but not work: nested loops within that cap spin for hours, and a
string repeated a billion times takes gigabytes (both seen: 45 s and still running, 16.7 GB resident).
No setting of Jinja bounds every C-level operation a template can reach (repeat, join, center, replace,
format, ...), so the budget is kept from outside: the template renders in a child process that
  - may add at most MEMORY_LIMIT_BYTES of address space to what its imports took (RLIMIT_AS on Linux; the
    parent also watches its resident memory, on every platform),
  - is killed when a render takes over TIME_LIMIT_S (and kills itself at twice that, should the parent die),
  - sends back no prompt longer than OUTPUT_FACTOR x the conversation's text + OUTPUT_SLACK_CHARS.
A template that breaks a limit is refused with TemplateRefused, naming the limit. The child lives on
between renders (it starts once, ~0.4 s of imports) and is started again after a kill.

    python -m engine.template_sandbox      the child's side: one JSON request a line in, one reply a line out
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import threading
import time

from .errors import EngineError

TIME_LIMIT_S = 3.0  # a normal render takes ~1 ms here (a 200-message chat ~20 ms): 100x margin and more
MEMORY_LIMIT_BYTES = 512 << 20  # a 128k-token conversation renders in a few MB
OUTPUT_FACTOR, OUTPUT_SLACK_CHARS = 4, 1 << 20  # a template repeats no message 4 times; its own text < 1 MiB
START_TIMEOUT_S = 60.0  # the child's imports, on a busy machine
WATCH_EVERY_S = 0.02
FROZEN_FLAG = "--template-sandbox"  # how a PyInstaller bundle runs the child (packaging/specchat_launcher.py)


class TemplateRefused(EngineError):
    """The template broke a limit (or crashed its child): it is not to be used again."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def output_cap(messages: list[dict], tools: list[dict] | None = None) -> int:
    """Tools and earlier tool calls are conversation text too: a template writes them out once each."""
    size = sum(len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or "")) for m in messages)
    return OUTPUT_FACTOR * (size + (len(json.dumps(tools)) if tools else 0)) + OUTPUT_SLACK_CHARS


class TemplateSandbox:
    """A child process that renders chat templates; thread-safe (renders take turns)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._replies: queue.Queue = queue.Queue()
        self._compiled: set[str] = set()  # templates the child has already compiled
        self._baseline_rss = 0

    def render(
        self,
        template: str,
        messages: list[dict],
        bos: str = "",
        eos: str = "",
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> str:
        """The template's prompt for these messages (and tools, as the `tools` variable). Raises TemplateRefused when it breaks a limit, and
        EngineError when the template itself rejects the conversation (raise_exception, a bad role)."""
        key = _key(template, bos, eos, add_generation_prompt)
        with self._lock:
            self._start()
            request = {"key": key, "messages": messages, "cap": output_cap(messages, tools), "tools": tools}
            if key not in self._compiled:
                request.update(template=template, bos=bos, eos=eos, add_generation_prompt=add_generation_prompt)
            reply = self._ask(request)
            if reply.get("ok"):
                self._compiled.add(key)
        if reply.get("ok"):
            return reply["prompt"]
        if reply.get("refused"):
            raise TemplateRefused(reply["message"])
        raise EngineError(reply["message"])

    def close(self) -> None:
        with self._lock:
            self._kill()

    # --- the child --------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._kill()
        env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
        self._proc = subprocess.Popen(
            _child_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1 << 16,
        )
        self._replies = queue.Queue()
        threading.Thread(
            target=_read_lines, args=(self._proc.stdout, self._replies), daemon=True, name="template-sandbox-reader"
        ).start()
        try:
            ready = self._replies.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            ready = None
        if not isinstance(ready, dict) or not ready.get("ready"):
            self._kill()
            raise EngineError("The chat-template sandbox did not start: chat templates cannot be rendered.")
        self._baseline_rss = _rss(self._proc.pid)

    def _ask(self, request: dict) -> dict:
        proc = self._proc
        assert proc is not None and proc.stdin is not None  # started (with pipes) before anything is asked
        try:
            proc.stdin.write(json.dumps(request, ensure_ascii=False) + "\n")
            proc.stdin.flush()
        except OSError:
            return self._lost("it ended before the render")
        deadline = time.monotonic() + TIME_LIMIT_S
        while True:
            try:
                reply = self._replies.get(timeout=WATCH_EVERY_S)
            except queue.Empty:
                reply = None
            if isinstance(reply, dict):
                return reply
            if reply == "":  # end of its output: the child died
                return self._lost("it died while rendering")
            if time.monotonic() > deadline:
                self._kill()
                return _refusal(f"rendering took over {TIME_LIMIT_S:g} s (the limit); it was stopped")
            if _rss(proc.pid) - self._baseline_rss > MEMORY_LIMIT_BYTES:
                self._kill()
                return _refusal(
                    f"rendering used over {MEMORY_LIMIT_BYTES >> 20} MB of memory (the limit); it was stopped"
                )

    def _lost(self, how: str) -> dict:
        code = self._proc.poll() if self._proc else None
        self._kill()
        return _refusal(f"the process rendering it ended ({how}, exit code {code})")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._compiled = set()
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (proc.stdin, proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


def _refusal(message: str) -> dict:
    return {"ok": False, "refused": True, "message": message}


def _key(template: str, bos: str, eos: str, add_generation_prompt: bool) -> str:
    import hashlib

    return hashlib.sha256(
        json.dumps([template, bos, eos, add_generation_prompt]).encode("utf-8", "replace")
    ).hexdigest()


def _read_lines(stream, replies: queue.Queue) -> None:
    try:
        for line in stream:
            try:
                replies.put(json.loads(line))
            except ValueError:
                continue
    except (OSError, ValueError):
        pass
    replies.put("")


def _rss(pid: int) -> int:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except Exception:  # noqa: BLE001 - gone, or not readable: the time limit still holds
        return 0


def _child_command() -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, FROZEN_FLAG]
    return [sys.executable, "-m", "engine.template_sandbox"]


_shared: TemplateSandbox | None = None
_shared_lock = threading.Lock()


def shared_sandbox() -> TemplateSandbox:
    """The one sandbox of this process (started on first use, ended at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TemplateSandbox()
            atexit.register(_shared.close)
        return _shared


# --- the child's side -------------------------------------------------------------------------------
def child_main() -> int:
    import resource
    import signal

    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    if hasattr(resource, "RLIMIT_AS"):
        _limit_address_space(resource)
    formatters: dict[str, Jinja2ChatFormatter] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        # Should the parent be gone, no render outlives twice the limit: SIGALRM's default action ends us.
        signal.setitimer(signal.ITIMER_REAL, 2 * TIME_LIMIT_S)
        try:
            reply = _render(formatters, request, Jinja2ChatFormatter)
        except MemoryError:
            reply = _refusal(f"rendering needed over {MEMORY_LIMIT_BYTES >> 20} MB of memory (the limit)")
        signal.setitimer(signal.ITIMER_REAL, 0)
        print(json.dumps(reply, ensure_ascii=False), flush=True)
    return 0


def _limit_address_space(resource) -> None:
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return  # not Linux: the parent's watch of resident memory is the limit
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = used + MEMORY_LIMIT_BYTES
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))


def _render(formatters: dict, request: dict, formatter_class) -> dict:
    from jinja2.exceptions import SecurityError, TemplateSyntaxError

    key = request["key"]
    if key not in formatters:
        if "template" not in request:  # compiled by a child before this one: the parent sends it again
            return {"ok": False, "refused": False, "message": "The chat template sandbox restarted; try again."}
        try:
            formatters[key] = formatter_class(
                template=request["template"],
                bos_token=request["bos"],
                eos_token=request["eos"],
                add_generation_prompt=request["add_generation_prompt"],
            )
        except (TemplateSyntaxError, RecursionError) as exc:
            return _refusal(f"it could not be read ({exc})")
    try:
        prompt = formatters[key](messages=request["messages"], tools=request.get("tools")).prompt
    except SecurityError as exc:
        return _refusal(f"it tried something the sandbox forbids ({exc})")
    except RecursionError:
        return _refusal("it recursed too deeply")
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. raise_exception('roles must alternate')
        return {
            "ok": False,
            "refused": False,
            "message": f"The model's chat template rejected this conversation: {exc}",
        }
    if not isinstance(prompt, str):
        return _refusal("it wrote no text")
    if len(prompt) > request["cap"]:
        return _refusal(
            f"it wrote {len(prompt):,} characters for {request['cap'] - OUTPUT_SLACK_CHARS:,} "
            f"of conversation (the limit is {OUTPUT_FACTOR}x the conversation + 1 MiB)"
        )
    return {"ok": True, "prompt": prompt}


if __name__ == "__main__":
    sys.exit(child_main())
