"""OpenAI's Predicted Outputs on both completion endpoints: `prediction: {"type": "content", "content": text or
[{"type": "text", "text": ...}, ...]}` read and checked here, tokenized as the answer's text is, and the answer's
`usage.completion_tokens_details` counted from the drafts it gave (engine/decoding/proposers/prediction.py drafts
along it).

Counts, as OpenAI defines them for the tokens the prediction offered: accepted_prediction_tokens, the predicted tokens
the answer kept; rejected_prediction_tokens, the predicted tokens verified and not kept. Only drafted tokens count
(a predicted token the planner did not draft was neither verified nor rejected), and, unlike OpenAI's billing,
completion_tokens stays the answer's own: a rejected draft here takes no room in the context."""

from __future__ import annotations

from typing import Any

from ..chat_format import provably_too_long, utf8_size
from ..decoding.jobs import Job
from ..decoding.proposers.base import PREDICTION_SOURCE
from ..decoding.stats import GenerationStats
from ..decoding.vocabulary import Vocabulary
from .api_schema import MAX_CONTENT_PARTS, ApiError, checked_text, shown

PARAM = "prediction"
SHAPE = '{"type": "content", "content": text or [{"type": "text", "text": ...}, ...]}'


def parse_prediction(body: dict[str, Any]) -> str | None:
    """The prediction's text, or None for a request without one (or with an empty one: nothing to draft along);
    a 400 naming what is wrong for any other shape."""
    prediction = body.get(PARAM)
    if prediction is None:
        return None
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise _bad(PARAM, f"expected {SHAPE}, got {shown(prediction)}")
    content = prediction.get("content")
    param = f"{PARAM}.content"
    if isinstance(content, str):
        text = checked_text(content, param)
    elif isinstance(content, list):
        if len(content) > MAX_CONTENT_PARTS:
            raise _bad(param, f"{len(content):,} parts; at most {MAX_CONTENT_PARTS:,}")
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(param, f'{param}[{j}]: expected {{"type": "text", "text": ...}}, got {shown(part)}')
            checked_text(part["text"], f"{param}[{j}].text")
        text = "".join(part["text"] for part in content)
    else:
        raise _bad(param, f"expected text or a list of text parts, got {shown(content)}")
    return text or None


def prediction_tokens(model: Vocabulary, text: str, n_ctx: int) -> list[int]:
    """On a worker thread: the prediction as the answer's tokens (no BOS, no special tokens), or a 400 when it is
    longer than the context: no answer could ever write it (and its bytes alone say so before it is tokenized)."""
    if provably_too_long(model, utf8_size([text]), n_ctx):
        raise _too_long(f"{utf8_size([text]):,} bytes of text")
    tokens = model.tokenize(text, add_bos=False, special=False)
    if len(tokens) > n_ctx:
        raise _too_long(f"{len(tokens):,} tokens")
    return tokens


def completion_tokens_details(job: Job, stats: GenerationStats) -> dict[str, Any] | None:
    """usage.completion_tokens_details for a request with a prediction (zeros where nothing was drafted from it),
    None for one without."""
    if not job.prediction:
        return None
    counts = stats.by_proposer.get(PREDICTION_SOURCE, {})
    accepted = counts.get("accepted", 0)
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": counts.get("drafted", 0) - accepted}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}': {message}", param=param)


def _too_long(size: str) -> ApiError:
    return ApiError(
        400,
        f"'{PARAM}': {size}; more than the model's context can hold, so no answer could follow it.",
        param=PARAM,
        code="prediction_too_long",
    )
