"""Every figure an answer carries, in one table: its key (in the stats dicts, the JSON export and the smoke
test's line), kind, label, unit, format, tooltips and the README's words for it, and who sets it.

GenerationStats.to_dict and RemoteFigures.to_dict give exactly the keys listed for them here (a test checks),
progress.snapshot adds the SHOWN ones, the conversation files check an import's figures by their kind, and the stats
line, the server panel and the README's table take their words from here. Adding a figure is adding a row.

`python -m engine.figures --markdown` prints the README's table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

NA = "n/a"

# Kinds: what a value may be (None is allowed for every kind but FLAG and the lists).
NUMBER, TEXT, FLAG, NUMBER_LIST, PAIR_LIST = "number", "text", "flag", "number list", "pair list"
COUNTS = "counts"  # name -> {count name: whole number}, e.g. per proposer {"drafted": 90, "accepted": 69}
# Who sets a figure: the local engine (GenerationStats.to_dict), a remote one (RemoteFigures.to_dict),
# progress.snapshot (for what the window shows), or the answer path once the answer is done (app/answers.py).
LOCAL, REMOTE, SHOWN, ANSWER = "local", "remote", "shown", "answer"
BOTH = (LOCAL, REMOTE)


def mean_accepted_length(accepted: float, drafts: float) -> float | None:
    """Mean accepted length: the tokens a draft yields, its bonus token included, 1 + accepted ÷ drafts, where a
    draft is one sequence's target step that verified drafted tokens (plain steps do not count). vLLM's definition
    (vllm/v1/spec_decode/metrics.py: 1 + num_accepted_tokens / num_drafts, "conventionally including the bonus
    token"), and the acceptance length of the EAGLE and Medusa papers; llama.cpp's server reports only accepted ÷
    drafted. The window (GenerationStats), the server's timings, the lab and the remote client (prometheus.SpecDelta)
    all read it here. None before any draft."""
    return 1.0 + accepted / drafts if drafts else None


@dataclass(frozen=True)
class Figure:
    key: str
    kind: str
    set_by: tuple[str, ...]
    label: str = ""  # its name for a person (the README's table, a column)
    short: str = ""  # the word before its value on the stats line, and a column's header
    unit: str = ""  # after its value
    fmt: str = ""  # its value's format spec
    tooltip: str = ""  # on the stats line, for a local answer
    remote_tooltip: str = ""  # for a remote answer, where it is timed or read differently
    meaning: str = ""  # the README's row; none, no row

    def value_text(self, value) -> str:
        """The value formatted, n/a where it was not read."""
        return NA if value is None else format(value, self.fmt)

    def text(self, value) -> str:
        """As the stats line shows it: "TTFT 0.20 s" and "TTFT n/a", "41.3 tok/s" and "n/a tok/s". The short
        word names the figure where it has one; else the unit does, so the unit stays beside n/a."""
        if self.short:
            amount = self.value_text(value) + (f" {self.unit}" if self.unit and value is not None else "")
            return f"{self.short} {amount}"
        return f"{self.value_text(value)} {self.unit}".strip()


_MEMORY_TIP = (
    "Memory in use: VRAM (with the GPU's name) when a GPU runs the model and can be read, else this process's RAM."
)

FIGURES: tuple[Figure, ...] = (
    # --- in the README's table, in its order ----------------------------------------------------------
    Figure(
        "tokens_per_s",
        NUMBER,
        BOTH,
        "tokens/s",
        unit="tok/s",
        fmt=".1f",
        tooltip="Decode speed: tokens after the first ÷ time after the first token.",
        remote_tooltip="Decode speed measured on this machine as the text arrived: tokens after the first ÷ "
        "time after the first token. The network's delays are included.",
        meaning="decode speed: tokens after the first, over the time after the first (llama.cpp's server counts "
        "the first token too, so its predicted_per_second, which the server panel shows, reads a little "
        "higher on short answers)",
    ),
    Figure(
        "ttft_s",
        NUMBER,
        BOTH,
        "TTFT",
        short="TTFT",
        unit="s",
        fmt=".2f",
        tooltip="Time to first token: from the request to the first generated token (prompt processing).",
        remote_tooltip="Time to first token, measured here: from sending the request to the first text "
        "arriving (the server's prompt processing and the network).",
        meaning="time to first token: prompt processing plus the first sampled token",
    ),
    Figure("drafted", NUMBER, BOTH, "drafted", meaning="tokens the proposer offered and the target verified"),
    Figure("accepted", NUMBER, BOTH, "accepted", meaning="of the drafted tokens, the ones the target kept"),
    Figure(
        "acceptance_rate",
        NUMBER,
        BOTH,
        "acceptance rate",
        short="accepted",
        fmt=".0%",
        tooltip="Acceptance rate: drafted tokens the target model kept ÷ drafted tokens it verified.",
        remote_tooltip="Acceptance rate: drafted tokens the server's target model kept ÷ drafted tokens it "
        "verified; {source}.",
        meaning="accepted ÷ drafted. High means the proposer guesses well; it says nothing about speed by itself",
    ),
    Figure(
        "mean_acceptance_length",
        NUMBER,
        BOTH,
        "mean accepted length",
        unit="tok/step",
        fmt=".2f",
        tooltip="Mean accepted length: tokens each step that verified drafts produced, the bonus token included "
        "(1.00 means every draft was rejected).",
        remote_tooltip="Mean accepted length: tokens per step that verified drafts, the bonus token included; "
        "{source}.",
        meaning="tokens produced per target step that verified drafts, bonus token included: 1 + accepted ÷ such "
        "steps, as vLLM counts it. 1.0 means every draft was rejected; 3.0 means each step that drafted yielded "
        "three tokens",
    ),
    Figure(
        "memory_label",
        TEXT,
        (SHOWN, REMOTE),
        "VRAM / RAM",
        tooltip=_MEMORY_TIP,
        remote_tooltip="The server's memory cannot be read from here.",
        meaning="memory in use: VRAM when a GPU runs the model and can be read, otherwise this process's RAM "
        "— labelled which",
    ),
    Figure(
        "draft_time_share",
        NUMBER,
        (LOCAL,),
        "drafting",
        short="drafting",
        fmt=".0%",
        tooltip="What the draft model costs: the share of this response's decoding time spent in it (its "
        "catch-up on the prompt included), and its weights in memory.",
        meaning="with a draft model (draft, auto): the share of decoding time spent in it, its prompt catch-up "
        "included",
    ),
    Figure(
        "draft_model_bytes",
        NUMBER,
        (LOCAL,),
        "draft",
        short="draft",
        unit="bytes",
        meaning="with a draft model (draft, auto): its weights in memory",
    ),
    Figure(
        "backend",
        TEXT,
        BOTH,
        "backend",
        tooltip="The llama.cpp backend running the model.",
        remote_tooltip="The server that answered (and its backend, where it says).",
        meaning="where llama.cpp runs the model: CPU, CUDA, Metal or Vulkan",
    ),
    # --- on the stats line, not in the README's table ---------------------------------------------------
    Figure(
        "method",
        TEXT,
        BOTH,
        "method",
        tooltip="Speculation method for this response. Adaptive mode drafts only while that is predicted "
        "faster, predicted from the step times measured on this machine and the acceptance seen so far.",
        remote_tooltip="A server elsewhere wrote this response; SpecChat's own speculation did not run here.",
    ),
    Figure("speculation_paused", FLAG, (LOCAL,), "speculation paused"),
    Figure(
        "speedup_vs_plain",
        NUMBER,
        (LOCAL,),
        "speed vs plain (estimate)",
        unit="× plain",
        fmt=".2f",
        tooltip="An estimate: plain decoding's time for this answer's tokens, predicted from this machine's "
        "measured plain steps at this context (or its calibrated step time before any), over the time "
        "the answer took.",
        meaning="an estimate of this answer's speed against plain decoding on this machine: plain decoding's "
        "predicted time for its tokens (from measured plain steps at this context) over its time",
    ),
    Figure(
        "guard",
        TEXT,
        (LOCAL,),
        "guard",
        tooltip="Speculation stops for a while within an answer that runs below plain decoding.",
    ),
    Figure(
        "by_proposer",
        COUNTS,
        (LOCAL,),
        "drafted and accepted by proposer",
        tooltip="Drafted and accepted tokens of each proposer (under auto: prompt lookup and the draft model).",
    ),
    Figure("finish_reason", TEXT, BOTH, "end", tooltip="Why this response ended."),
    Figure(
        "trimmed_messages",
        NUMBER,
        (ANSWER,),
        "messages left out",
        tooltip="The oldest messages did not fit the context, so the model did not see them.",
    ),
    # --- in the tooltip's details and the exports --------------------------------------------------------
    Figure("prompt_tokens", NUMBER, BOTH, "prompt tokens"),
    Figure("reused_prompt_tokens", NUMBER, (LOCAL,), "prompt tokens reused"),
    Figure("generated", NUMBER, BOTH, "tokens generated"),
    Figure("verify_steps", NUMBER, (LOCAL,), "target steps"),
    Figure("speculative_steps", NUMBER, (LOCAL,), "speculative steps"),
    Figure("decode_s", NUMBER, BOTH, "decode time", unit="s"),
    Figure("draft_s", NUMBER, (LOCAL,), "drafting time", unit="s"),
    Figure("prefill_s", NUMBER, (LOCAL,), "prefill time", unit="s"),
    Figure("policy_draft_length", NUMBER, (LOCAL,), "draft length chosen"),
    Figure("draft_length", NUMBER, (LOCAL,), "draft length"),
    Figure("memory_bytes", NUMBER, BOTH, "memory", unit="bytes"),
    Figure("memory_kind", TEXT, BOTH, "memory kind"),
    Figure("per_position_drafted", NUMBER_LIST, (LOCAL,), "drafted by position"),
    Figure("per_position_accepted", NUMBER_LIST, (LOCAL,), "accepted by position"),
    Figure("per_position_acceptance", NUMBER_LIST, BOTH, "acceptance by draft position"),
    Figure("rate_history", PAIR_LIST, BOTH, "tokens/s over the response"),
    Figure("model", TEXT, (REMOTE,), "model"),
    Figure("acceptance_source", TEXT, (REMOTE,), "acceptance from"),
    Figure("remote", FLAG, (REMOTE,), "remote"),
    Figure("network_included", FLAG, (REMOTE,), "network included"),
)
FIGURE: dict[str, Figure] = {f.key: f for f in FIGURES}


def keys_of(kind: str) -> frozenset[str]:
    return frozenset(f.key for f in FIGURES if f.kind == kind)


def keys_set_by(source: str) -> frozenset[str]:
    return frozenset(f.key for f in FIGURES if source in f.set_by)


def markdown_table() -> str:
    """The README's table of figures."""
    rows = [
        "<!-- written by `python -m engine.figures --markdown` from engine/figures.py; a test checks it -->",
        "",
        "| figure | key | meaning |",
        "|---|---|---|",
    ]
    rows += [f"| {f.label} | `{f.key}` | {f.meaning} |" for f in FIGURES if f.meaning]
    return "\n".join(rows) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.figures", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the README's table of figures")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table(), end="")
    else:
        for f in FIGURES:
            print(f"{f.key}\t{f.kind}\t{f.label}")


if __name__ == "__main__":
    main()
