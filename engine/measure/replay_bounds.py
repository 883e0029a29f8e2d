"""What a replay sets beside the methods it replays, on the same recorded step costs: llama.cpp's ngram-simple
(`llama-server --spec-type ngram-simple`: after a 12-token match, up to 48 tokens drafted, every step), and two
bounds found by dynamic programming over each answer, knowing it: the hindsight bound (the best draft lengths for
the shipped lookup proposer's proposals) and the any-copy bound (the best lengths and, at each step, whichever
earlier place in the history the answer follows furthest). Each figure is a decode speed-up over plain decoding."""

from __future__ import annotations

from ..decoding.proposers.lookup import LookupProposer
from ..methods import DEFAULT_MAX_DRAFT
from .recording import Recording

NGRAM_SIMPLE_N, NGRAM_SIMPLE_M = 12, 48  # llama.cpp's defaults (common_params_speculative_ngram_map)


def ngram_simple_draft(tokens: list[int], n: int = NGRAM_SIMPLE_N, m: int = NGRAM_SIMPLE_M) -> list[int]:
    """llama.cpp's common_ngram_simple_draft: the latest earlier occurrence of the last n tokens, and up
    to m tokens after it (none unless at least n)."""
    cur = len(tokens) - 1  # the last token is the one just sampled, not yet in llama.cpp's history
    if cur <= n + m + 1:
        return []
    pattern = tokens[-n:]
    for j in range(cur - n - 1, 0, -1):
        if tokens[j : j + n] == pattern:
            copy = min(m, cur - (j + n))
            return tokens[j + n : j + n + copy] if copy >= n else []
    return []


def replay_ngram_simple(recording: Recording) -> list[float]:
    out = []
    for a in recording.answers:
        spent, produced = 0.0, 1
        while produced < len(a.answer):
            draft = ngram_simple_draft(a.prompt + a.answer[:produced])[: len(a.answer) - produced]
            spent += recording.seconds(1 + len(draft))
            produced += 1 + kept_tokens(draft, a.answer, produced)
        out.append(speed_up(len(a.answer), recording.seconds(1), spent))
    return out


def hindsight_bound(recording: Recording, max_draft: int = DEFAULT_MAX_DRAFT) -> list[float]:
    """Per answer: the best draft lengths for the shipped proposer's proposals, knowing the answer."""
    proposer = LookupProposer(remember_requests=False)
    out = []
    for a in recording.answers:
        proposals = [proposer.propose_one(a.prompt + a.answer[:i], max_draft).tokens for i in range(len(a.answer))]
        kept = [kept_tokens(p, a.answer, i) for i, p in enumerate(proposals)]
        out.append(_best_schedule(recording, len(a.answer), kept, [len(p) for p in proposals]))
    return out


def any_copy_bound(recording: Recording, max_draft: int = DEFAULT_MAX_DRAFT) -> list[float]:
    """Per answer: the hindsight bound over every proposal that copies the history. At each step the draft
    is the continuation of whichever earlier occurrence of the last token the answer goes on to follow
    furthest (every prompt-lookup proposal, of any n-gram length or scoring, continues one of them; the
    shipped proposer's own draft, which may repeat a period past the history's end, is a candidate too),
    padded to any length, and the draft lengths are the best. No way of choosing what to copy beats it;
    edits the proposer writes into a copy, and a draft model, are outside it."""
    proposer = LookupProposer(remember_requests=False)
    out = []
    for a in recording.answers:
        kept = []
        for i in range(len(a.answer)):
            history = a.prompt + a.answer[:i]
            best = kept_tokens(proposer.propose_one(history, max_draft).tokens, a.answer, i)
            for e in range(len(history) - 1):
                if history[e] == history[-1]:
                    best = max(best, kept_tokens(history[e + 1 : e + 1 + max_draft], a.answer, i))
            kept.append(best)
        out.append(_best_schedule(recording, len(a.answer), kept, [max_draft] * len(a.answer)))
    return out


def _best_schedule(recording: Recording, n: int, kept: list[int], lengths: list[int]) -> float:
    """The speed-up of the fastest schedule over an answer of n tokens, where a step at token i may verify up
    to lengths[i] drafts of which the answer keeps kept[i] (dynamic programming, from the end)."""
    if n <= 1:
        return 1.0
    best = [0.0] * (n + 1)  # best[i]: least time to produce answer[i:] given answer[:i]
    for i in range(n - 1, 0, -1):
        best[i] = min(
            recording.seconds(k + 1) + best[min(n, i + 1 + min(k, kept[i]))]
            for k in range(0, min(lengths[i], n - 1 - i) + 1)
        )
    return speed_up(n, recording.seconds(1), best[1])


def kept_tokens(draft: list[int], answer: list[int], at: int) -> int:
    """How many of a draft proposed with answer[:at] written the answer goes on to write."""
    k = 0
    while k < len(draft) and at + k < len(answer) and draft[k] == answer[at + k]:
        k += 1
    return k


def speed_up(tokens: int, plain_step: float, spent: float) -> float:
    return (tokens - 1) * plain_step / spent if spent > 0 else 1.0
