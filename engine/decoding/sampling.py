"""The sampling filters, applied identically to the target (p) and the draft (q).

Order follows llama.cpp's default chain: top-k, then top-p and min-p on the surviving candidates,
then temperature. The whole vocabulary is never sorted: top-k (or a growing top-k when top-k is
off) picks the candidates first, as DESIGN.md measured a full sort at 105 ms on this vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import InvalidSettingError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1.0 = off
    min_p: float = 0.05  # 0.0 = off
    seed: int | None = None  # None = a fresh random seed per request

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and 0.0 <= self.temperature <= 5.0):
            raise InvalidSettingError(f"temperature must be between 0 and 5, got {self.temperature!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise InvalidSettingError(f"top_k must be a whole number ≥ 0 (0 turns it off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise InvalidSettingError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.min_p, (int, float)) and 0.0 <= self.min_p < 1.0):
            raise InvalidSettingError(f"min_p must be in [0, 1), got {self.min_p!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise InvalidSettingError(f"seed must be a whole number or empty, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Candidates:
    """Per-row sparse distributions: probs[r, j] is the probability of token ids[r, j].

    Rows are padded to one width with zero probabilities, so every row sums to 1.
    """

    ids: torch.Tensor  # [rows, width] int64
    probs: torch.Tensor  # [rows, width] float32

    def prob_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """Probability of tokens[r] under row r, for the first len(tokens) rows."""
        n = tokens.shape[0]
        hit = self.ids[:n] == tokens.view(-1, 1)
        return (self.probs[:n] * hit).sum(dim=1)

    def dense_row(self, row: int, vocab_size: int) -> torch.Tensor:
        """Row as a dense vector of at least vocab_size entries (a draft's vocab may be a little larger)."""
        size = max(vocab_size, int(self.ids[row].max()) + 1)
        out = torch.zeros(size, dtype=self.probs.dtype, device=self.probs.device)
        # Added, not written: a padded row repeats token id 0 with probability 0, and a plain scatter
        # would let that padding overwrite token 0's real probability (so the residual over-weights it).
        return out.scatter_add_(0, self.ids[row], self.probs[row])

    def sample(self, row: int, generator: torch.Generator) -> int:
        return int(self.ids[row, draw(self.probs[row], generator)])


def draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    """An index drawn with probability proportional to weights (≥ 0, not all 0), by inverting the float64
    cumulative sum: torch.multinomial took 13.4 ms over a 262k vocabulary here, 241 µs over 4k; this 3.3 ms
    and 51 µs. A zero weight never wins: the first sum above u is past a positive weight."""
    cdf = weights.double().cumsum(0)
    u = torch.rand(1, dtype=torch.float64, generator=generator, device=weights.device) * cdf[-1]
    i = int(torch.searchsorted(cdf, u, right=True))
    return i if i < len(cdf) else int(weights.nonzero()[-1])  # u rounded up to the total


def _candidate_logits(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The candidate set before top-p/min-p: (values sorted descending, ids, untempered probs)."""
    rows, vocab = logits.shape
    if 0 < params.top_k < vocab:
        vals, ids = torch.topk(logits, params.top_k, dim=1)
        return vals, ids, torch.softmax(vals, dim=1)
    log_z = torch.logsumexp(logits, dim=1, keepdim=True)
    if params.top_p >= 1.0:
        # No cut needs an order: keep the whole vocabulary, unsorted.
        ids = torch.arange(vocab, device=logits.device).expand(rows, vocab)
        return logits, ids, torch.exp(logits - log_z)
    # top-p without a full sort: widen a top-k until every row has covered top_p of the mass.
    width = min(vocab, 1024)
    while True:
        vals, ids = torch.topk(logits, width, dim=1)
        probs = torch.exp(vals - log_z)
        if width == vocab or bool((probs.sum(dim=1) >= params.top_p).all()):
            return vals, ids, probs
        width = min(vocab, width * 8)


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> Candidates:
    """Apply top-k, top-p, min-p and temperature to each row of logits (float32 [rows, vocab])."""
    vals, ids, probs = _candidate_logits(logits.float(), params)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if params.top_p < 1.0:
        before = torch.cumsum(probs, dim=1) - probs  # mass of strictly better candidates (sorted rows)
        keep &= before < params.top_p
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs.max(dim=1, keepdim=True).values
    scaled = (vals / params.temperature).masked_fill(~keep, -math.inf)
    return Candidates(ids=ids, probs=torch.softmax(scaled, dim=1))


def pick_device() -> torch.device:
    """The sampling math runs on the GPU when torch has one."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def request_seed(params: SamplingParams) -> int:
    """The seed a request runs with: the user's, or a fresh random one."""
    if params.seed is not None:
        return params.seed
    return int(torch.randint(0, 2**62, (1,)).item())


def position_seed(seed: int, position: int) -> int:
    """A distinct, reproducible seed for the token at one position of the sequence."""
    return (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % (2**63 - 1)


VERIFY, DRAFT = 0, 1  # the random streams a request samples from


def stream_seeds(seed: int, index: int = 0) -> tuple[int, int]:
    """(verifier, draft) seeds of request `index` in a run with `seed` (see stream_seed)."""
    return stream_seed(seed, index, VERIFY), stream_seed(seed, index, DRAFT)


def stream_seed(seed: int, index: int, role: int) -> int:
    """The seed of one random stream: request `index` of a batch run with `seed`, for its verifier or its
    draft. Mixed (splitmix64 over a counter), so no two requests or roles share a stream, as seed + index
    for the verifier and + 1 for the draft did (request i's draft drew request i+1's verifier's numbers)."""
    x = (seed + (2 * index + role + 1) * 0x9E3779B97F4A7C15) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) % (2**63 - 1)
