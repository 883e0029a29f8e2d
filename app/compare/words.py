"""What a finished comparison showed, in words: whether the texts were the same (greedy), the measured speed-up
as a median with its range, the engine's own estimate beside it, and "noisy" instead of one figure when the pairs
disagree widely or other programs loaded the CPU."""

from __future__ import annotations

import statistics

from app.compare.cpu_load import BUSY_SHARE
from app.compare.series import NOISY_SPREAD, PLAIN, SPECULATIVE, Series

SAME_SPEED = 0.05  # within 5% the two speeds are called the same
LITTLE_GAIN = 1.1  # fewer tokens per target step than this: speculation cannot be what made it faster
# Fewer tokens than this in any run and the ratio is shown without a speed claim. tokens/s counts only the
# time after the first token: plain decoding's 10-token answer is 9 timed steps, and one step slowed to double
# (another program on the cores) moves its rate by ~10%, twice SAME_SPEED. At 64 tokens such a step moves it
# by under 2%.
MIN_SPEED_TOKENS = 64


def speed_words(ratio: float) -> str:
    """A measured speed ratio (speculative ÷ plain) as a claim."""
    if abs(ratio - 1) < SAME_SPEED:
        return f"at the same speed ({ratio:.2f}×)"
    if ratio > 1:
        return f"{ratio:.1f}× faster"
    return f"but {ratio:.2f}× the speed: plain decoding was faster for this prompt"


def speed_sentence(series: Series, fewest: int) -> str:
    """The measured figures, claimed as a speed-up only from long enough runs (fewest: the shortest run's tokens)."""
    measured, estimate = measured_words(series), estimate_words(series)
    estimated = f"; the engine estimated {estimate}" if estimate else ""
    if series.median is None:
        return f"Speculative: {measured}{estimated}."
    if fewest < MIN_SPEED_TOKENS:
        return (
            f"Speculative: {measured} plain decoding's tokens/s, over only {fewest} tokens a run: too short a run "
            f"to compare speed (that takes {MIN_SPEED_TOKENS} or more per run: raise “Tokens per run”, or ask for "
            f"a longer answer){estimated}."
        )
    return f"Speculative was {speed_words(series.median)}: {measured}{estimated}."


def measured_words(series: Series) -> str:
    """'measured 1.62× (1.51–1.70×, 3 pairs)': the median of the pairs' ratios and their range."""
    if series.median is None:
        return "no pair measured a speed (too few tokens)"
    n = len(series.ratios)
    return f"measured {series.median:.2f}× ({series.low:.2f}–{series.high:.2f}×, {n} pair{'s' * (n != 1)})"


def estimate_words(series: Series) -> str:
    """The engine's own estimate of the speed-up against plain decoding (speedup_vs_plain), where it gave one."""
    estimates = [
        r.stats["speedup_vs_plain"]
        for r in series.runs(SPECULATIVE)
        if isinstance(r.stats.get("speedup_vs_plain"), (int, float))
    ]
    return f"≈{statistics.median(estimates):.2f}×" if estimates else ""


def noise_reasons(series: Series, others_share: float | None) -> list[str]:
    """Why no single speed-up can be claimed (empty: the measurement holds)."""
    reasons = []
    if series.wide:
        reasons.append(f"the pairs disagree widely (the fastest ratio is over {NOISY_SPREAD:g}× the slowest)")
    if others_share is not None and others_share > BUSY_SHARE:
        reasons.append(
            f"the machine is busy (other programs used {others_share:.0%} of the CPU during the runs; "
            f"over {BUSY_SHARE:.0%} counts as busy)"
        )
    return reasons


def texts_words(series: Series) -> tuple[str, bool]:
    """Greedy: whether every pair's two texts were the same, and where the first parting pair parts."""
    pairs = series.done_pairs
    parted = [(i, p.parted) for i, p in enumerate(pairs, 1) if p.parted is not None]
    if not parted:
        return f"Same answer in {'all ' * (len(pairs) > 1)}{len(pairs)} pair{'s' * (len(pairs) != 1)}.", True
    index, (token, _) = parted[0]
    return (
        f"The texts differ in {len(parted)} of {len(pairs)} pairs; in pair {index} from token {token + 1}: "
        "near-ties in the model's arithmetic (verifying drafts in one batch rounds slightly differently from "
        "decoding one token at a time), see README, “Compare plain vs speculation”."
    ), False


def drafting_note(series: Series) -> str:
    runs = [r.stats for r in series.runs(SPECULATIVE)]
    if all(s.get("method", "none") == "none" for s in runs):
        return (
            " Speculation was not available for this model (see the notices in the chat window), so both runs "
            "decoded plainly."
        )
    if not any(s.get("drafted") for s in runs):
        return (
            " Nothing was drafted (no text to copy, or the adaptive length measured plain decoding as faster), "
            "so both sides decoded plainly: the speeds differ by how busy the machine was."
        )
    lengths = [s["mean_acceptance_length"] for s in runs if s.get("mean_acceptance_length")]
    if lengths and statistics.median(lengths) < LITTLE_GAIN:
        return (
            f" Speculation gained little here ({statistics.median(lengths):.2f} tokens per target step), so the "
            "difference in speed is mostly not its doing."
        )
    return ""


def verdict(series: Series, greedy: bool, temperature: float, others_share: float | None) -> tuple[str, bool | None]:
    """(what the comparison showed, in words; whether the texts are the same, None when sampled)."""
    reasons = noise_reasons(series, others_share)
    if reasons and series.median is not None:
        capped = f" ({series.capped})" if series.capped else ""
        speed = (
            f"Noisy: {series.low:.2f}–{series.high:.2f}× over {len(series.ratios)} pairs{capped}, median "
            f"{series.median:.2f}×: {' and '.join(reasons)}, so no one figure holds."
        )
        estimate = estimate_words(series)
        speed += f" The engine estimated {estimate}." if estimate else ""
    else:
        fewest = min((r.stats.get("generated") or 0 for k in (PLAIN, SPECULATIVE) for r in series.runs(k)), default=0)
        speed = speed_sentence(series, fewest)
    note = drafting_note(series)
    if not greedy:
        return (
            f"Sampled at temperature {temperature:g}: the two texts are separate samples, not expected to match "
            f"(tick “Greedy” to compare texts). {speed}{note}"
        ), None
    texts, same = texts_words(series)
    return f"{texts} {speed}{note}", same
