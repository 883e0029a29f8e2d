"""The fuzzer's time bound per example, enforced by a watchdog rather than measured.

`bounded()` arms a timer thread around one example. When it fires it dumps every thread's stack (faulthandler,
to the test's captured stderr) and sends SIGUSR1 to the main thread, whose handler raises ExampleTimedOut there:
Hypothesis then reports the example that hung (with its reproduction blob) like any other failure. A real signal
also wakes a main thread blocked in a system call. If the main thread is stuck in C code that never returns to
Python, faulthandler's own watchdog (a C thread that needs no GIL) dumps the stacks and ends the process after
HARD_FACTOR times the bound, with the message below, rather than leaving the default test tier to hang.

The bound is generous (seconds, where an example takes milliseconds), so it never flakes on a slow machine: it
catches a hang or a runaway loop, and is no speed measurement.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading

EXAMPLE_BOUND_S = 10.0
HARD_FACTOR = 3
# Where the watchdog writes: the terminal's stderr where conftest found it (pytest captures fd 2 itself, and a
# captured file is lost when the hard stop ends the process).
report_fd = 2


class ExampleTimedOut(AssertionError):
    """One generated example ran past the watchdog's bound."""


@contextlib.contextmanager
def bounded(what: str, seconds: float = EXAMPLE_BOUND_S):
    """Run the with-block under the watchdog: ExampleTimedOut once `seconds` pass (see the module's docstring).
    Only from the main thread (signal handlers live there), as pytest runs tests."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("bounded() runs on the main thread only")
    fired = threading.Event()
    message = (
        f"fuzz watchdog: one example of {what} ran past {seconds:g} s (a hang or a runaway loop); "
        "every thread's stack was dumped to stderr above"
    )

    def on_signal(_signum, _frame):
        if fired.is_set():
            raise ExampleTimedOut(message)

    def fire():
        fired.set()
        _say(
            f"\n{message}; interrupting it (if it cannot be, the process ends {seconds * HARD_FACTOR:g} s after the example began)\n"
        )
        faulthandler.dump_traceback(file=report_fd, all_threads=True)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, on_signal)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    # The hard stop: pytest sets no faulthandler_timeout here, so this timer is the fuzzer's alone.
    faulthandler.dump_traceback_later(seconds * HARD_FACTOR, exit=True, file=report_fd)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGUSR1, previous)
    if fired.is_set():  # the code under test swallowed the exception (an `except Exception`): still a failure
        raise ExampleTimedOut(message)


def _say(text: str) -> None:
    try:
        os.write(report_fd, text.encode("utf-8", "replace"))
    except OSError:
        pass
