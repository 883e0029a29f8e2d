"""The figures under each response, in words: the line of figures (stat_items: key, text and tooltip of each) and
the fuller picture of its tooltip (detail_lines). Every figure is a measured one from the engine (engine.figures);
"n/a" where it could not be read. No Qt: the chat's stats bar (app/chat/stats_view.py), the Compare view and the
Markdown export all read them here."""

from __future__ import annotations

from engine.figures import FIGURE, NA, mean_accepted_length
from engine.methods import DRAFT_METHODS, MTP_METHODS, method_words

METHOD_NAMES = method_words("name")
FINISH_NAMES = {
    "stop": "",
    "length": "stopped at the length limit",
    "context": "context full",
    "cancelled": "stopped by you",
}
NA_VS_PLAIN = " n/a where it could not be estimated (or the answer was saved before it was)."
REMOTE_VS_PLAIN_TIP = "Compared with plain decoding: n/a, the server's plain decoding speed is not measured here."
# Who drafted, as Proposal.source names it: short, in words.
PROPOSER_NAMES = {
    "lookup": ("lookup", "prompt lookup"),
    "draft": ("draft", "the draft model"),
    "mtp": ("MTP", f"the {METHOD_NAMES['mtp']}"),
    "eagle3": ("EAGLE-3", "the EAGLE-3 draft head"),
}
AUTO_PROPOSERS = ("lookup", "draft")  # auto's two before it had more, each shown even where it drafted nothing
MTP_DRAFTING_TIP = (
    f"What the {METHOD_NAMES['mtp']} costs: the share of this response's decoding time spent in it (its catch-up "
    "on the prompt included). Its weights are the model's own: no second model in memory."
)
BY_PROPOSER_TIP = (
    "Who did the work: tokens each proposer drafted and the target kept (accepted/drafted). "
    '"proposed nothing": it drafted no token in this answer.'
)


def _text(stats: dict, key: str) -> str:
    return FIGURE[key].text(stats.get(key))


def _tip(key: str, remote: bool = False, **names) -> str:
    """A figure's tooltip (engine.figures), a remote answer's where it has its own."""
    figure = FIGURE[key]
    return ((figure.remote_tooltip or figure.tooltip) if remote else figure.tooltip).format(**names)


def _rate(stats: dict) -> str:
    """The acceptance rate as shown: "accepted 75%", "accepted n/a"."""
    return FIGURE["acceptance_rate"].text(stats.get("acceptance_rate"))


def vs_plain_text(speedup) -> str:
    """This answer against plain decoding, as the engine estimated it: "≈1.62× plain", "vs plain n/a"."""
    return f"vs plain {NA}" if speedup is None else f"≈{speedup:.2f}× plain"


def proposer_counts(stats: dict) -> dict:
    """Drafted and accepted by proposer; under auto both proposers, one that never drafted with zeros (the
    engine counts a proposer from its first verdict). {} for an answer saved before they were counted."""
    by_proposer = stats.get("by_proposer") or {}
    if "by_proposer" in stats and stats.get("method") == "auto" and set(by_proposer) <= set(AUTO_PROPOSERS):
        # an answer of lookup and a draft model, perhaps saved before the engine counted both from the start (an
        # auto answer with the MTP head or an EAGLE-3 head names its proposers from its first token)
        return {name: {"drafted": 0, "accepted": 0} for name in AUTO_PROPOSERS} | by_proposer
    return by_proposer


def _proposers(by_proposer: dict) -> list[tuple[str, dict]]:
    """(name, counts), lookup first, then the draft model, the built-in drafter, then any other in name order."""
    order = list(PROPOSER_NAMES) + sorted(set(by_proposer) - set(PROPOSER_NAMES))
    return [(name, by_proposer[name]) for name in order if name in by_proposer]


def by_proposer_text(by_proposer: dict) -> str:
    """Who did the work: "lookup 69/90 · draft 0/0 (proposed nothing)"; "by proposer n/a" when not recorded."""
    if not by_proposer:
        return f"by proposer {NA}"
    parts = []
    for name, counts in _proposers(by_proposer):
        drafted, accepted = counts.get("drafted") or 0, counts.get("accepted") or 0
        short = PROPOSER_NAMES.get(name, (str(name),))[0]
        note = " (proposed nothing)" if not drafted else " (none kept)" if not accepted else ""
        parts.append(f"{short} {accepted}/{drafted}{note}")
    return " · ".join(parts)


def stat_items(stats: dict) -> list[tuple[str, str, str]]:
    """(key, text, tooltip) for each figure, in display order."""
    items = remote_items(stats) if stats.get("remote") else local_items(stats)
    finish = FINISH_NAMES.get(stats.get("finish_reason") or "", "")
    if finish:
        items.append(("finish", finish, _tip("finish_reason")))
    if stats.get("trimmed_messages"):
        n = stats["trimmed_messages"]
        items.append(("trimmed", f"{n} old message{'s' if n != 1 else ''} left out", _tip("trimmed_messages")))
    return items


def remote_items(stats: dict) -> list[tuple[str, str, str]]:
    """A remote engine's answer: speed and TTFT timed here (the network included), acceptance as the server
    reported it (and where from), memory n/a: it is the server's."""
    drafted, accepted, rate = stats.get("drafted"), stats.get("accepted"), stats.get("acceptance_rate")
    source = stats.get("acceptance_source") or "the server reports no speculation figures"
    items = [
        ("speed", f"{_text(stats, 'tokens_per_s')} incl. network", _tip("tokens_per_s", remote=True)),
        ("vs_plain", vs_plain_text(None), REMOTE_VS_PLAIN_TIP),
        ("ttft", f"{_text(stats, 'ttft_s')} incl. network", _tip("ttft_s", remote=True)),
        (
            "acceptance",
            _rate(stats) + ("" if rate is None else f" ({accepted}/{drafted})"),
            _tip("acceptance_rate", remote=True, source=source),
        ),
    ]
    if stats.get("mean_acceptance_length") is not None:
        items.append(
            (
                "mean_length",
                _text(stats, "mean_acceptance_length"),
                _tip("mean_acceptance_length", remote=True, source=source),
            )
        )
    method = stats.get("method")
    reported = f": {METHOD_NAMES.get(method, method)}" if method not in (None, "remote") else ""
    items += [
        ("method", "remote engine" + reported, _tip("method", remote=True)),
        ("memory", stats.get("memory_label") or f"{NA} (remote)", _tip("memory_label", remote=True)),
        ("backend", stats.get("backend") or NA, _tip("backend", remote=True)),
    ]
    return items


def local_items(stats: dict) -> list[tuple[str, str, str]]:
    drafted, accepted = stats.get("drafted"), stats.get("accepted")
    method = stats.get("method") or "none"
    memory = stats.get("memory_label")
    if memory is None:
        kind = stats.get("memory_kind") or "RAM"
        memory = f"{kind} {NA}"
    items = [
        ("speed", _text(stats, "tokens_per_s"), _tip("tokens_per_s")),
        ("vs_plain", vs_plain_text(stats.get("speedup_vs_plain")), _tip("speedup_vs_plain") + NA_VS_PLAIN),
        ("ttft", _text(stats, "ttft_s"), _tip("ttft_s")),
    ]
    if stats.get("guard"):
        items.append(("guard", str(stats["guard"]), _tip("guard")))
    by_proposer = proposer_counts(stats)
    if len(by_proposer) > 1 or method == "auto":
        items.append(("by_proposer", by_proposer_text(by_proposer), BY_PROPOSER_TIP))
    if method != "none" or drafted:
        items += [
            (
                "acceptance",
                _rate(stats) + (f" ({accepted}/{drafted})" if drafted is not None else ""),
                _tip("acceptance_rate"),
            ),
            ("mean_length", _text(stats, "mean_acceptance_length"), _tip("mean_acceptance_length")),
        ]
    if method in DRAFT_METHODS:
        size = stats.get("draft_model_bytes")
        items.append(
            (
                "drafting",
                f"{_text(stats, 'draft_time_share')} · {FIGURE['draft_model_bytes'].short} "
                + (NA if size is None else format(size / 2**20, ".0f") + " MiB"),
                _tip("draft_time_share"),
            )
        )
    elif method in MTP_METHODS:  # no draft model: its share of the time alone
        items.append(("drafting", _text(stats, "draft_time_share"), MTP_DRAFTING_TIP))
    paused = " (paused: plain decoding predicted faster)" if stats.get("speculation_paused") else ""
    items += [
        ("method", METHOD_NAMES.get(method, method) + paused, _tip("method")),
        ("memory", memory, _tip("memory_label")),
        ("backend", stats.get("backend") or NA, _tip("backend")),
    ]
    return items


def detail_lines(stats: dict) -> list[str]:
    """The fuller picture, for the tooltip: counts, prompt reuse, per-position acceptance."""
    lines = []
    if stats.get("remote"):
        lines.append(
            f"Generated {stats.get('generated') or 0} tokens"
            + (f" for a {stats['prompt_tokens']}-token prompt" if stats.get("prompt_tokens") else "")
            + f", by {stats.get('model') or 'the server'}."
        )
    elif stats.get("generated") is not None:
        lines.append(f"Generated {stats['generated']} tokens in {stats.get('verify_steps') or 0} target steps.")
    if stats.get("prompt_tokens") and not stats.get("remote"):
        lines.append(
            f"Prompt: {stats['prompt_tokens']} tokens, {stats.get('reused_prompt_tokens') or 0} of them "
            "reused from the previous turn's cache."
        )
    per_position = stats.get("per_position_acceptance") or []
    if per_position:
        shown = ", ".join(f"{p * 100:.0f}%" for p in per_position[:8]) + (" …" if len(per_position) > 8 else "")
        lines.append(f"Acceptance by draft position: {shown}.")
    for name, counts in _proposers(proposer_counts(stats)):
        words = PROPOSER_NAMES.get(name, (name, str(name)))[1]
        drafted, accepted = counts.get("drafted") or 0, counts.get("accepted") or 0
        length = mean_accepted_length(accepted, counts.get("steps") or 0)  # saved before steps were counted: none
        lines.append(
            f"{words[0].upper() + words[1:]}: proposed nothing."
            if not drafted
            else f"{words[0].upper() + words[1:]}: drafted {drafted} tokens, {accepted} kept "
            f"({accepted / drafted * 100:.0f}%)" + (f", {length:.2f} tokens a step." if length else ".")
        )
    share = stats.get("draft_time_share")
    if share is not None and stats.get("method") not in (None, "none", "remote"):
        lines.append(f"Time spent drafting: {share * 100:.0f}% of decoding.")
    return lines
