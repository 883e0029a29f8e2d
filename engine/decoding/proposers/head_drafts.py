"""The drafting loop a head shares, whatever feeds it (an MTP head, an EAGLE-3 head): each decode of the head is one
step of every sequence still drafting, fed the token it drafted last and the head's own row from that decode, as
common/speculative.cpp's draft-mtp and draft-eagle3 both do. Drafts are greedy and stop below the confidence p_min.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..mtp_head import HEAD_BATCH
from .draft_model import greedy_pick

# (token, position, sequence, the row it is fed, wants logits)
Row = tuple[int, int, int, np.ndarray, bool]


class Head(Protocol):
    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        rows: np.ndarray,
        outputs: Sequence[bool],
        seq_ids: Sequence[int] | None = None,
    ) -> None: ...

    def logits(self, i: int) -> np.ndarray: ...

    def hidden(self, i: int) -> np.ndarray: ...


def draft_greedy(
    head: Head, wanted: dict[int, tuple[int, int]], rows: list[Row], p_min: float, lag: int
) -> dict[int, list[int]]:
    """Greedy drafts per slot (its history's length, the most wanted), from the first rows given (the catch-up's last
    ones); a slot stops at its length or below p_min. Draft j is fed at position length - lag + j (an MTP head feeds a
    token at its own position, lag 1; an EAGLE-3 head one position before, lag 2)."""
    drafts: dict[int, list[int]] = {slot: [] for slot in wanted}
    while rows:
        picks = decode_and_pick(head, rows)
        rows = []
        for slot, (length, k) in wanted.items():
            if slot not in picks:
                continue
            token, confidence, row = picks[slot]
            if confidence < p_min:
                continue
            drafts[slot].append(token)
            if len(drafts[slot]) < k:
                rows.append((token, length - lag + len(drafts[slot]), slot, row, True))
    return drafts


def decode_and_pick(head: Head, rows: list[Row]) -> dict[int, tuple[int, float, np.ndarray]]:
    """Decode rows (in HEAD_BATCH chunks); each slot's greedy token, its confidence and the head's row from its
    output row."""
    picks = {}
    for begin in range(0, len(rows), HEAD_BATCH):
        chunk = rows[begin : begin + HEAD_BATCH]
        tokens, positions, slots, fed, outputs = zip(*chunk)
        head.decode(tokens, positions, np.stack(fed), outputs, slots)
        for i, (slot, output) in enumerate(zip(slots, outputs)):
            if output:
                picks[slot] = (*greedy_pick(head.logits(i)), head.hidden(i))
    return picks
