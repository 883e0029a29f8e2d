"""The target's hidden rows ("nextn" embeddings: the state before the output norm, one row per decoded token) by
sequence and position, kept for a model's own MTP head (proposers/mtp.py), which pairs token k with row k-1.

llama.cpp keeps only the last decode's rows, and a proposer is asked for drafts only after other decodes (a prompt's
pieces, a calibration's timings, other sequences' steps), so the target's Model copies each decode's rows here, and
this store mirrors its KV cache: a roll-back forgets the rows past it, a shared prefix shares them. It holds at most
the context's cells (n_ctx x n_embd floats: 80 MB for a 4,096-token context of a 5,120-wide model).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class _Run:
    """Rows of one sequence for positions [start, end), in a buffer that doubles as it fills."""

    def __init__(self, start: int, block: np.ndarray):
        self.start, self.end = start, start + len(block)
        self.buffer = np.array(block, dtype=np.float32, copy=True)

    def extend(self, pos: int, block: np.ndarray) -> None:
        """Rows from `pos` on (pos within [start, end]): what followed them is replaced."""
        stop = pos + len(block)
        need = stop - self.start
        if need > len(self.buffer):
            grown = np.empty((max(need, 2 * len(self.buffer)), self.buffer.shape[1]), dtype=np.float32)
            grown[: self.end - self.start] = self.buffer[: self.end - self.start]
            self.buffer = grown
        self.buffer[pos - self.start : need] = block
        self.end = stop


class HiddenRows:
    """Each sequence's hidden rows, for the positions its KV cache holds (those decoded since it was last emptied)."""

    def __init__(self) -> None:
        self._runs: dict[int, _Run] = {}

    def record(self, positions: Sequence[int] | np.ndarray, seq_ids: Sequence[int], rows: np.ndarray) -> None:
        """A decode's rows (rows[i] is the batch's row i, at positions[i] of seq_ids[i]); each sequence's rows in
        a batch are at consecutive positions, as every decode here makes them."""
        n, i = len(positions), 0
        while i < n:
            j = i + 1
            while j < n and seq_ids[j] == seq_ids[i] and positions[j] == positions[j - 1] + 1:
                j += 1
            self._record(int(seq_ids[i]), int(positions[i]), rows[i:j])
            i = j

    def _record(self, seq: int, pos: int, block: np.ndarray) -> None:
        run = self._runs.get(seq)
        if run is None or not run.start <= pos <= run.end:  # a gap (or before what is held): start again
            self._runs[seq] = _Run(pos, block)
        else:
            run.extend(pos, block)

    def rows(self, seq: int, start: int, stop: int) -> np.ndarray | None:
        """Rows of positions [start, stop) of seq (a copy), or None where any of them is not held."""
        run = self._runs.get(seq)
        if stop <= start:
            return np.zeros((0, run.buffer.shape[1] if run else 0), dtype=np.float32)
        if run is None or start < run.start or stop > run.end:
            return None
        return run.buffer[start - run.start : stop - run.start].copy()

    def forget_from(self, pos: int, seq: int) -> None:
        """The sequence's cache keeps positions < pos only."""
        run = self._runs.get(seq)
        if run is None:
            return
        run.end = min(run.end, max(pos, run.start))
        if run.end == run.start:
            del self._runs[seq]

    def share(self, source: int, seq: int, n: int) -> None:
        """seq is given the first n positions of source (Model.share_prefix)."""
        run = self._runs.get(source)
        if run is not None and run.start == 0 and n > 0:
            self._runs[seq] = _Run(0, run.buffer[: min(n, run.end)])

    def forget_all(self) -> None:
        self._runs.clear()
