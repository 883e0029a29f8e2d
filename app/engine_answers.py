"""This machine's engine as an answer source (app/answers.py), in its two ways: its own decode loop on the worker's
thread, or, while the API server runs, one more job in the server's batch."""

from __future__ import annotations

from app.answers import Answer, GenerationRequest
from app.progress import snapshot
from engine.chat_format import answer_reserve
from engine.decoding.generate import SpeculativeDecoder
from engine.decoding.jobs import Job, RequestRun, job_for
from engine.decoding.proposers.base import NoProposer
from engine.errors import EngineError

NO_MODEL = "No model is loaded. Choose one in Settings or Models…."
PLAIN_WHILE_SERVING = "Plain decoding for one answer (Compare) needs the engine to itself: stop the server first."


def _prompt(worker, request: GenerationRequest, out: Answer):
    """The request's prompt for the worker's model (its notices said)."""
    reserve = answer_reserve(request.max_tokens, worker.decoder.target.n_ctx)
    prompt = worker.formatter.prompt(request.messages, reserve, continue_last=request.continue_last)
    for text in prompt.notices:
        out.notice(text)
    return prompt


class LocalAnswers:
    """The worker's decoder, on the worker's thread (app.worker.EngineWorker.generate)."""

    failure, what = "The engine failed", "generation"

    def __init__(self, worker):
        self.worker = worker

    def answer(self, request: GenerationRequest, out: Answer) -> None:
        decoder = self.worker.decoder
        if decoder is None:
            raise EngineError(NO_MODEL)
        prompt = _prompt(self.worker, request, out)
        out.figures = lambda: snapshot(decoder.stats)  # decoder.stats are this answer's from here on
        for delta in decode(decoder, prompt, request):
            out.add(delta.segments)
        out.finish(out.figures(), trimmed_messages=prompt.trimmed)


def decode(decoder: SpeculativeDecoder, prompt, request: GenerationRequest):
    """The decoder's deltas; a plain request swaps in NoProposer for itself alone, so the chat's
    proposer and its learned draft policy are still there for the next request."""
    proposer = decoder.proposer
    if request.plain:
        decoder.proposer = NoProposer()
    try:
        yield from decoder.generate(
            prompt.tokens, request.sampling, max_tokens=request.max_tokens, stop=prompt.stop, cancel=request.cancel
        )
    finally:
        decoder.proposer = proposer


class ServedAnswers:
    """While serving (the worker's thread runs the server's engine loop): the chat's answer as one more job in the
    server's batch. Templating and tokenizing happen on the caller's thread (a thread of its own: a template may
    take its sandbox's 3 s); the job's callbacks run on the engine loop."""

    failure, what = "The engine failed", "a served answer"

    def __init__(self, worker):
        self.worker = worker

    def answer(self, request: GenerationRequest, out: Answer) -> None:
        if request.plain:
            raise EngineError(PLAIN_WHILE_SERVING)
        prompt = _prompt(self.worker, request, out)

        def on_delta(job: Job, delta) -> None:
            out.add(delta.segments, lambda: snapshot(_run(job).stats))

        def on_done(job: Job) -> None:
            stats = snapshot(_run(job).stats)  # set for every job by now, run or refused
            if job.error:
                out.fail(job.error, stats)
            else:
                out.finish(stats, trimmed_messages=prompt.trimmed)

        self.worker.service.scheduler.submit(
            job_for(
                f"chat-{request.id}",
                prompt.tokens,
                request.sampling,
                request.max_tokens,
                stop=prompt.stop,
                cancel=request.cancel,
                on_delta=on_delta,
                on_done=on_done,
            )
        )


def _run(job: Job) -> RequestRun:
    """The job's run: the batch sets it before it calls on_delta (the job was admitted) or on_done (run or refused)."""
    if job.run is None:
        raise EngineError(f"the engine reported on {job.id} before it was admitted")
    return job.run
