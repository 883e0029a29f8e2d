"""A chi-square test of sampled counts against a distribution, for the lossless-sampling tests."""

from __future__ import annotations

import torch


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """P-value of observed counts against expected counts; categories expected < 5 times are pooled."""
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    stat = float((((obs - exp) ** 2) / exp)[keep].sum())
    df = int(keep.sum()) - 1
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
        )
    )
