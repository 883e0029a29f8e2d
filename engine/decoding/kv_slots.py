"""Which sequence id a job gets, and which cells of the shared KV cache outlive the job that made them: the slot and
cache policy of a Batch (batch.py), apart from its decoding and its callbacks.

With keep_caches, a finished job's cache stays in its sequence id, and a later prompt that starts the same way (the
next turn of a conversation) is given that id and prefills only what is new; one that shares only a shorter start
with it (a system prompt) gets a fresh id with that start shared into it. Kept caches give way, the least recently
used first, when the running sequences need the cells.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .runtime import Model, common_prefix

# A kept cache is taken over by a prompt that shares at least this share of it (its conversation goes on);
# a prompt sharing less (another conversation with the same system prompt) leaves it whole.
CONTINUES = 0.5
# Kept caches cost every later step: llama.cpp attends over every used cell of the shared cache, other
# sequences' cells included (measured, SmolLM2, one row: 1,000 kept cells made a step 9% slower, 3,500 24%;
# eight kept conversations had slowed a plain server from ~170 to ~150 tok/s). So they hold at most this
# share of the context.
KEPT_SHARE = 1 / 8


class KvSlots:
    """The sequence ids of one target context: the free ones, the caches kept in them, and (reuse_prompt_logits,
    the chat) the logits of the prompt each kept cache ends with, so the same prompt again (Regenerate) takes them
    rather than re-decoding its last token alone, whose logits differ slightly from the batched prefill's."""

    def __init__(self, target: Model, slots: int, keep_caches: bool = False, reuse_prompt_logits: bool = False):
        self.target, self.slots, self.keep_caches = target, slots, keep_caches
        self.reuse_prompt_logits = reuse_prompt_logits
        self.free = list(range(slots))[::-1]
        self.cached: dict[int, list[int]] = {}  # a free sequence id -> the tokens its cache still holds, oldest first
        self.prompt_logits: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}

    def take_over(self, other: KvSlots) -> None:
        """Keep what another batch on the same target left in its cache (a speculation change keeps the chat's)."""
        self.cached, self.prompt_logits = other.cached, other.prompt_logits

    @property
    def held_cells(self) -> int:
        return sum(len(tokens) for tokens in self.cached.values())

    def claim(self, prompt: list[int]) -> tuple[int, int, np.ndarray | None]:
        """Take a free sequence id for the prompt. Returns it, how many of the prompt's tokens its cache holds for
        the prefill to reuse, and the prompt's logits when the whole prompt is there already (Regenerate)."""
        slot, shared = self._pick(prompt)
        self.free.remove(slot)
        held = self.cached.pop(slot, ())
        if not self.target.can_roll_back and (shared < len(held) or shared == len(prompt)):
            shared = 0  # a recurrent state cannot be cut back part-way: start again from the first token
        known = self.prompt_logits.pop(slot, None)
        if self.reuse_prompt_logits and known is not None and known[0] == tuple(prompt) and shared == len(prompt):
            return slot, shared, known[1]
        return slot, min(shared, len(prompt) - 1), None  # a token is decoded, for fresh logits

    def _pick(self, prompt: list[int]) -> tuple[int, int]:
        """A free sequence id for the prompt, and how many of its tokens that id's cache holds already. A kept
        cache the prompt continues (the next turn of its conversation) is taken over. Otherwise the prompt
        goes to an id without a cache, keeping the others whole, and the start it shares with the best of
        them (a system prompt) is shared into it."""

        def score(slot: int) -> tuple[int, bool]:
            return common_prefix(self.cached.get(slot, ()), prompt), slot not in self.cached

        best = max(self.free, key=score)
        shared = score(best)[0]
        empty = [slot for slot in self.free if slot not in self.cached]
        if shared >= CONTINUES * len(self.cached.get(best, ())) or not empty:
            return best, shared
        if shared and self.target.can_roll_back:  # attention KV: cells can belong to two sequences
            self.target.share_prefix(best, empty[0], shared)
            return empty[0], shared
        return empty[0], 0

    def keep_prompt_logits(self, slot: int, prompt: list[int], logits: np.ndarray) -> None:
        """A prompt's last logits, decoded in sequence `slot` (kept only where they may be reused)."""
        if self.reuse_prompt_logits:
            self.prompt_logits[slot] = (tuple(prompt), logits.copy())

    def release(self, slot: int, tokens: Sequence[int], cells: int) -> None:
        """Sequence `slot` is free again; its cache holds the first `cells` of `tokens`. With keep_caches they stay
        (within KEPT_SHARE of the context in all), else the cache is emptied."""
        # never more than the cache holds (an interrupted decode empties a recurrent state: runtime._run_rows)
        keep = min(cells, len(tokens), self.target.next_position(slot)) if self.keep_caches else 0
        self.target.forget_from(keep, slot)
        if keep:
            self.cached[slot] = list(tokens[:keep])
            self._bound()
        self.free.append(slot)

    def _bound(self) -> None:
        """Kept caches hold at most KEPT_SHARE of the context, the least recently used given up first. One slot's
        cache is bounded by the context alone: no other sequence attends over it, and the next prompt takes it."""
        while self.slots > 1 and self.cached and self.held_cells > KEPT_SHARE * self.target.n_ctx:
            self.drop_oldest()

    def drop_oldest(self) -> None:
        slot = next(iter(self.cached))
        self.target.forget_from(0, slot)
        del self.cached[slot]
        self.prompt_logits.pop(slot, None)

    def forget(self) -> None:
        """Every kept cache goes."""
        for slot in self.cached:
            self.target.forget_from(0, slot)
        self.cached.clear()
        self.prompt_logits.clear()
