"""The one loop that pumps a Batch (batch.py), whoever decodes: the chat and the bench (generate.py), the lab
(batch_decode.py, through run_jobs) and the server (serving/scheduler.py). In the manner of vLLM v1's EngineCore
(take in requests, schedule, execute, update from the output), each turn:

1. `more(batch)`: the caller's feed hands the batch whatever jobs have come in, and says whether to go on (the
   server waits here for work; the lab refills its slots and stops once its own requests are answered);
2. `batch.admit()`: cancelled jobs end, about one chunk of prompt is prefilled (a prompt's last piece gives its
   first token);
3. `batch.step()`: one StepLoop.step over every active sequence, their output handed on through each job's
   callbacks.

The loop yields after 2 (ADMITTED: the chat hands a first token on before the step that follows) and after 3
(STEPPED). A step that raises ends the loop, unless `on_error` takes it (the server fails the running jobs and goes
on serving)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..errors import GenerationCancelled

if TYPE_CHECKING:
    from .batch import Batch

ADMITTED, STEPPED = "admitted", "stepped"  # where pump() yields


def busy(batch: Batch) -> bool:
    """The plain feed: nothing comes in, the loop goes on while the batch has work."""
    return not batch.idle


def pump(
    batch: Batch, more: Callable[[Batch], bool] = busy, on_error: Callable[[Exception], None] | None = None
) -> Iterator[str]:
    """Pump the batch while more(batch) says so, yielding ADMITTED and STEPPED each turn (see the module's text)."""
    admit, step = batch.admit, batch.step
    while more(batch):
        try:
            admit()
            yield ADMITTED
            step()
        except Exception as exc:
            if on_error is None:
                raise
            on_error(exc)
        yield STEPPED


def run_jobs(
    batch: Batch,
    cancel: threading.Event | None = None,
    on_step: Callable[[], None] | None = None,
    done: Callable[[], bool] | None = None,
) -> None:
    """Pump until every job is done, or until done() says so (the jobs left are then ended); on cancel, end them all
    and raise GenerationCancelled. on_step runs after every step (the lab refills and reports there)."""

    def more(batch: Batch) -> bool:
        if batch.idle:
            return False
        if cancel is not None and cancel.is_set():
            batch.cancel_all()
            raise GenerationCancelled("stopped by the user")
        if done is not None and done():
            batch.cancel_all("length")
            return False
        return True

    for phase in pump(batch, more):
        if on_step is not None and phase is STEPPED:
            on_step()
