"""engine/figures.py is the one list of an answer's figures: the engines give exactly its keys, and the
README's table is the one it writes."""

from pathlib import Path

from engine.decoding.stats import GenerationStats
from engine.figures import (
    ANSWER,
    COUNTS,
    FIGURE,
    FIGURES,
    FLAG,
    LOCAL,
    NUMBER,
    NUMBER_LIST,
    PAIR_LIST,
    REMOTE,
    SHOWN,
    TEXT,
    keys_set_by,
    main,
    markdown_table,
)
from engine.hardware import MemoryReading
from engine.remote.answer_stream import RemoteFigures

README = Path(__file__).resolve().parents[2] / "README.md"


def _busy_stats() -> GenerationStats:
    stats = GenerationStats(
        method="draft",
        generated=9,
        drafted=6,
        accepted=4,
        verify_steps=5,
        decode_s=0.5,
        draft_s=0.1,
        memory=MemoryReading(bytes_used=2**30, kind="RAM", source="test"),
    )
    stats.record_verdict(3, 2)
    return stats


def test_the_local_engine_gives_exactly_the_listed_figures():
    # A key added to GenerationStats.to_dict and not to engine.figures.FIGURES fails here.
    for stats in (GenerationStats(), _busy_stats()):
        assert set(stats.to_dict()) == keys_set_by(LOCAL)


def test_a_figure_missing_from_the_table_is_caught():
    class MoreStats(GenerationStats):
        def to_dict(self) -> dict:
            return {**super().to_dict(), "new_figure": 1.0}

    assert set(MoreStats().to_dict()) - keys_set_by(LOCAL) == {"new_figure"}
    assert set(GenerationStats().to_dict()) - keys_set_by(LOCAL) == set()


def test_a_remote_engine_gives_exactly_the_listed_figures():
    for figures in (
        RemoteFigures(backend="remote example.org", model="m"),
        RemoteFigures(
            backend="remote example.org",
            model="m",
            drafted=3,
            accepted=2,
            generated=4,
            decode_s=0.3,
            server_method="lookup",
            rate_history=[(0.1, 9.0)],
        ),
    ):
        assert set(figures.to_dict()) == keys_set_by(REMOTE)


def test_the_snapshot_adds_the_shown_figures():
    from app.progress import snapshot

    assert set(snapshot(_busy_stats())) == keys_set_by(LOCAL) | keys_set_by(SHOWN)


def test_every_row_is_whole():
    assert len(FIGURE) == len(FIGURES), "a key listed twice"
    for f in FIGURES:
        assert f.kind in (NUMBER, TEXT, FLAG, NUMBER_LIST, PAIR_LIST, COUNTS), f.key
        assert f.set_by and set(f.set_by) <= {LOCAL, REMOTE, SHOWN, ANSWER}, f.key
        assert f.label, f.key
        assert not f.meaning or f.label, f.key


def test_the_readme_table_is_the_one_the_table_writes(capsys):
    main(["--markdown"])
    printed = capsys.readouterr().out
    assert printed == markdown_table()
    assert printed in README.read_text(encoding="utf-8"), (
        "README.md's figures table is stale: paste `python -m engine.figures --markdown` over it"
    )
    assert README.read_text(encoding="utf-8").count("| figure | key | meaning |") == 1


def test_stats_line_texts():
    assert FIGURE["tokens_per_s"].text(41.26) == "41.3 tok/s" and FIGURE["tokens_per_s"].text(None) == "n/a tok/s"
    assert FIGURE["ttft_s"].text(0.2049) == "TTFT 0.20 s" and FIGURE["ttft_s"].text(None) == "TTFT n/a"
    assert FIGURE["acceptance_rate"].text(0.75) == "accepted 75%"
    assert FIGURE["mean_acceptance_length"].text(None) == "n/a tok/step"
