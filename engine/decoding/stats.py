"""Live figures for one response. Every number is counted or timed, never estimated."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..figures import mean_accepted_length
from ..hardware import MemoryReading


@dataclass
class GenerationStats:
    method: str = "none"
    backend: str = "CPU"
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens found already in the KV cache
    generated: int = 0
    drafted: int = 0  # drafted tokens the target verified
    accepted: int = 0
    verify_steps: int = 0  # target decode steps after the prompt (plain steps included)
    speculative_steps: int = 0  # of those, steps that verified at least one drafted token
    ttft_s: float | None = None
    decode_s: float = 0.0  # from the first token to the last
    draft_s: float = 0.0  # spent proposing
    draft_model_bytes: int | None = None  # the draft model's weights (llama_model_size), where one drafts
    prefill_s: float = 0.0
    policy_draft_length: int = 0  # what the policy chose for the latest step
    draft_length: int = 0  # that, capped by the room left (tokens to go, context, batch)
    speculation_paused: bool = False  # the adaptive policy predicted plain decoding faster (not a cap)
    # An estimate (engine/decoding/pace.py): plain decoding's predicted time for this answer's tokens over theirs.
    speedup_vs_plain: float | None = None
    guard: str | None = None  # what the guard did when the answer ran below plain decoding
    # "lookup"/"draft"/"mtp"/"eagle3" -> drafted, accepted, steps (the target steps that verified its drafts)
    by_proposer: dict[str, dict[str, int]] = field(default_factory=dict)
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    rate_history: list[tuple[float, float]] = field(default_factory=list)  # (seconds, tokens/s)
    memory: MemoryReading | None = None
    finish_reason: str | None = None

    # --- derived figures ----------------------------------------------------------------------
    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after the first (llama.cpp's server's predicted_per_second
        counts the first token too: n / the same time)."""
        if self.generated < 2 or self.decode_s <= 0:
            return None
        return (self.generated - 1) / self.decode_s

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens each speculative step produced, bonus included (figures.mean_accepted_length)."""
        return mean_accepted_length(self.accepted, self.speculative_steps)

    @property
    def draft_time_share(self) -> float | None:
        return self.draft_s / self.decode_s if self.decode_s > 0 else None

    def per_position_acceptance(self) -> list[float]:
        return [a / d for d, a in zip(self.per_position_drafted, self.per_position_accepted) if d]

    def record_verdict(self, drafted: int, accepted: int, source: str | None = None) -> None:
        self.drafted += drafted
        self.accepted += accepted
        if source:
            counts = self.by_proposer.setdefault(source, {"drafted": 0, "accepted": 0, "steps": 0})
            counts["drafted"] += drafted
            counts["accepted"] += accepted
            counts["steps"] = counts.get("steps", 0) + 1  # its drafts: mean_accepted_length(accepted, steps)
        grow = drafted - len(self.per_position_drafted)
        if grow > 0:
            self.per_position_drafted += [0] * grow
            self.per_position_accepted += [0] * grow
        for i in range(drafted):
            self.per_position_drafted[i] += 1
            self.per_position_accepted[i] += i < accepted

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain data: exactly engine.figures' LOCAL keys (tests/engine/test_figures.py)."""
        out = asdict(self)
        out["memory_bytes"] = self.memory.bytes_used if self.memory else None
        out["memory_kind"] = self.memory.kind if self.memory else None
        out.pop("memory")
        out.update(
            tokens_per_s=self.decode_tokens_per_s,
            acceptance_rate=self.acceptance_rate,
            mean_acceptance_length=self.mean_acceptance_length,
            draft_time_share=self.draft_time_share,
            per_position_acceptance=self.per_position_acceptance(),
        )
        return out
