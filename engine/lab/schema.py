"""What both labs write and report while they run: the results document's schema and a run's progress.
Its own module so that the lab here (local.py) and the one against servers (remote.py) share it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA = "specchat-lab/1"


@dataclass(frozen=True)
class LabProgress:
    fraction: float  # of the whole run, 0..1
    cell: int  # 1-based
    cells: int
    method: str
    concurrency: int
    generated: int  # tokens so far in this cell
    expected: int  # tokens this cell will produce at most
    elapsed_s: float  # in this cell


def cell_progress(
    index: int, cells: int, method: str, concurrency: int, generated: int, expected: int, elapsed_s: float
) -> LabProgress:
    """The progress of the run while its cell number index + 1 (of `cells`) has generated `generated` tokens."""
    share = min(generated / expected, 1.0)
    return LabProgress((index + share) / cells, index + 1, cells, method, concurrency, generated, expected, elapsed_s)
