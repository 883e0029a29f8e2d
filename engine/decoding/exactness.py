"""The widest verify this build computes bit for bit as one-row decodes do, measured per model.

llama.cpp's kernels for a batch of rows round differently from its one-row kernels beyond some batch size (here,
with flash attention, rows were identical up to 6-12 and not beyond). Greedy speculative decoding then picks
another token at a near-tie, and the answer parts from plain decoding's. So "exact greedy" keeps every verify
within the width measured here, and its answers are plain decoding's, token for token.

The measurement decodes one token sequence one row at a time (the reference), then as batches of 2, 3, ... rows
from the same position, and compares every row's logits exactly; it stops at the first width that differs.
"""

from __future__ import annotations

import numpy as np

from .runtime import Model

MAX_MEASURED_ROWS = 17  # 16 drafts: wider verifies are rare in exact mode, and each width measured costs a decode


def exact_verify_rows(
    target: Model, slot: int, start: int, tokens: list[int], max_rows: int = MAX_MEASURED_ROWS
) -> int:
    """The widest batch (1 at least) whose every row's logits equal one-row decodes', decoded at positions from
    `start` of sequence `slot` (free cells: rolled back after) on `tokens` (cycled to the width needed)."""
    top = max(1, min(max_rows, target.n_batch, target.n_ctx - start - 1))
    row_tokens = [tokens[i % len(tokens)] for i in range(top)]
    reference = []
    try:
        target.forget_from(start, slot)
        for i, token in enumerate(row_tokens):
            reference.append(np.array(target.decode_multi([token], [start + i], [slot], [True])[0], copy=True))
        widest = 1
        for width in range(2, top + 1):
            target.forget_from(start, slot)
            logits = target.decode_multi(
                row_tokens[:width], range(start, start + width), [slot] * width, [True] * width
            )
            if not all(np.array_equal(logits[i], reference[i]) for i in range(width)):
                break
            widest = width
        return widest
    finally:
        target.forget_from(start, slot)
