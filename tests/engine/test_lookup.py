import numpy as np

from engine.decoding.proposers.lookup import HistoryArray, LookupProposer, find_lookup_draft, longest_match


def h(*tokens):
    return np.array(tokens, dtype=np.int64)


def draft(history, min_n, max_n, max_tokens):
    return find_lookup_draft(history, min_n, max_n, max_tokens)[0].tolist()


def test_longest_ngram_wins_over_shorter_ones():
    # suffix "2 3": the bigram matches at 1..2 (followed by 9), the unigram "3" also at 5 (followed by 7)
    history = h(1, 2, 3, 9, 8, 3, 7, 6, 2, 3)
    assert draft(history, 1, 3, 5) == [9, 8, 3, 7, 6]


def test_most_recent_match_wins_among_equals():
    history = h(5, 1, 5, 2, 5)
    assert draft(history, 1, 1, 1) == [2]


def _longest_match_by_brute_force(corpus, query, end, min_n, max_n):
    best = (0, 0)
    for i in range(end):  # the latest i wins among equals: >= below
        n = 0
        while n < min(max_n, len(query)) and i - n >= 0 and corpus[i - n] == query[-1 - n]:
            n += 1
        if n and n >= best[1]:
            best = (i + 1, n)
    return best if best[1] >= min_n else (0, 0)


def test_longest_match_agrees_with_brute_force():
    """Random texts over few symbols (many candidates, long matches) and long copies (few candidates, the
    vectorised path), queries from the corpus and from elsewhere."""
    rng = np.random.default_rng(7)
    for trial in range(3000):
        corpus = rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(1, 90))).astype(np.int64)
        if trial % 4 == 0:  # a copy: the end repeats an earlier stretch
            corpus = np.concatenate([corpus, corpus[: int(rng.integers(1, len(corpus) + 1))]])
        query = corpus if trial % 3 else rng.integers(0, 4, int(rng.integers(1, 20))).astype(np.int64)
        end, min_n, max_n = int(rng.integers(0, len(corpus) + 1)), int(rng.integers(1, 4)), int(rng.integers(1, 17))
        assert longest_match(corpus, query, end, min_n, max_n) == _longest_match_by_brute_force(
            corpus, query, end, min_n, max_n
        ), (corpus, query, end, min_n, max_n)


def test_history_array_follows_a_growing_history_and_notices_another():
    arrays, history = HistoryArray(), [3, 1, 4]
    assert arrays.of(history).tolist() == [3, 1, 4]
    for token in range(300):  # past its first buffer
        history.append(token)
        assert arrays.of(history)[-1] == token
    assert arrays.of(history).tolist() == history
    assert arrays.of([9, 9]).tolist() == [9, 9]  # another list: converted afresh
    other = [8, 9, 7]
    assert arrays.of(other).tolist() == [8, 9, 7]  # longer, and equal to the last at the cell seen last
    del other[1:]
    assert arrays.of(other).tolist() == [8]  # shorter


def test_no_match_and_no_room_give_nothing():
    assert draft(h(1, 2, 3, 4), 1, 3, 4) == []
    assert draft(h(1, 2, 1, 2), 1, 3, 0) == []
    assert draft(h(7), 1, 3, 4) == []


def test_min_ngram_is_respected():
    history = h(1, 2, 3, 4, 5, 3)
    assert draft(history, 2, 3, 2) == []
    assert draft(history, 1, 3, 2) == [4, 5]


def test_a_continuation_that_reaches_the_end_repeats_with_its_period():
    """A line written again and again: the latest match's continuation runs into the text being written,
    so the draft goes on as the repetition would, not only to the end of the history."""
    line = [11, 12, 13, 14]
    history = h(1, 2, *line, *line, 11, 12)
    assert draft(history, 1, 8, 7) == [13, 14, 11, 12, 13, 14, 11]
    assert draft(h(5, 9, 5, 9, 5), 1, 4, 5) == [9, 5, 9, 5, 9]  # period 2, seen twice
    assert draft(h(5, 9, 5), 1, 4, 5) == [9, 5]  # one matching token is no evidence of a period


def test_draft_is_capped_and_comes_from_the_conversation():
    prompt = list(range(100, 120))
    proposer = LookupProposer(min_ngram=2, max_ngram=4)
    history = prompt + [100, 101, 102]  # the answer starts copying the prompt
    assert proposer.propose_one(history, 5).tokens == [103, 104, 105, 106, 107]
    assert proposer.propose_one(history, 5).match_length == 3  # and how long a match found them


def test_the_match_length_travels_with_the_draft():
    history = h(1, 2, 3, 9, 8, 3, 7, 6, 2, 3)
    assert find_lookup_draft(history, 1, 16, 3)[1] == 2  # "2 3" matched, not only "3"
    assert find_lookup_draft(history, 3, 16, 3)[1] == 0  # shorter than min_n: no draft, no length


def test_earlier_requests_are_searched_when_they_match_longer():
    """A new conversation asking what an earlier one asked gets the earlier answer as its draft; the
    current history wins ties, and nothing runs across the gap between two earlier histories."""
    proposer = LookupProposer(min_ngram=1, max_ngram=8)
    earlier = list(range(200, 230))  # prompt + answer of an earlier request
    proposer.finish(0, earlier)
    proposer.finish(0, list(range(500, 520)))
    now = [7, 7, 7] + list(range(210, 214))  # this request has just written 210..213
    p = proposer.propose_one(now, 5)
    assert p.tokens == [214, 215, 216, 217, 218] and p.match_length == 4
    tail = [7, 7] + list(range(226, 230))  # the earlier history's end: its continuation stops at the gap
    assert proposer.propose_one(tail, 5).tokens == []
    forgetful = LookupProposer(min_ngram=1, max_ngram=8, remember_requests=False)
    forgetful.finish(0, earlier)
    assert forgetful.propose_one(now, 5).tokens == []


def answer_tokens(proposer, prompt, answer):
    """Feed an answer token by token, proposing after each as the step loop does; the last proposal."""
    proposer.start(0, prompt, None, None, 0)
    history = list(prompt)
    proposal = None
    for tok in answer:
        history.append(tok)
        proposal = proposer.propose([(0, history, 8)])[0]
    return proposal


def test_an_edit_the_answer_repeats_is_drafted_after_it_is_seen_once():
    """The prompt's lines all start with VAR; the answer writes each as CONST (js: var -> const). Once a
    draft has missed that edit and the answer went on as the draft did, the drafts for the next lines carry
    it, so whole lines can be kept."""
    VAR, CONST, NL = 900, 901, 902
    lines = [[VAR, 10 + i, 20 + i, 30 + i, NL] for i in range(4)]
    prompt = [1, 2, 3] + [t for line in lines for t in line] + [4, 5]
    written = [CONST, 10, 20, 30, NL, CONST, 11, 21, 31, NL]  # the second line's draft missed CONST
    p = answer_tokens(LookupProposer(min_ngram=1, max_ngram=8), prompt, written)
    assert p.tokens[:5] == [CONST, 12, 22, 32, NL]  # the third line, as the answer writes it
    plain = LookupProposer(min_ngram=1, max_ngram=8).propose_one(prompt + written, 8)
    assert plain.tokens[:1] == [VAR]  # without the learned edit the draft would miss at once


def test_a_one_off_difference_is_not_taken_for_an_edit():
    """The answer left the draft once and did not go on as the draft did: nothing is learned from it."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9] + [50, 51]
    proposer = LookupProposer(min_ngram=1, max_ngram=8)
    answer_tokens(proposer, prompt, [1, 2, 3, 77, 78, 79])
    assert proposer._edits[0].subs == {}


def test_drafts_stop_at_an_end_token_unless_end_tokens_are_ignored(target):
    """A draft copying its source past an end token (a user turn into the chat template after it) is cut
    after that token: the answer ends there, so nothing after it could be kept."""
    import torch

    from engine.decoding.sampling import SamplingParams
    from engine.decoding.speculation_config import SpeculationConfig
    from engine.decoding.stats import GenerationStats
    from engine.decoding.step import SequenceState, StepLoop
    from engine.decoding.verifier import Verifier

    loop = StepLoop(target, LookupProposer(), SpeculationConfig(max_draft=8, adaptive=False), torch.device("cpu"))
    history = [target.bos, 300, 301, 302, target.eos, 303, 304, 305, 306, 300, 301]

    def proposed(stops_at_end: bool) -> list[int]:
        seq = SequenceState(
            0,
            list(history),
            Verifier(SamplingParams(temperature=0), loop.device, 0),
            GenerationStats(),
            stops_at_end=stops_at_end,
        )
        return loop._propose([seq], [8], [32])[0].tokens

    assert proposed(True) == [302, target.eos]
    assert proposed(False)[:5] == [302, target.eos, 303, 304, 305]


def test_history_array_self_match_agrees_with_longest_match():
    """The indexed match (Python over few candidates, numpy over many) gives longest_match's answer as a
    history grows token by token, over few symbols (many candidates) and over many (few)."""
    rng = np.random.default_rng(11)
    for _trial in range(200):
        symbols = int(rng.choice([2, 3, 5, 40]))
        history, index = [], HistoryArray()
        min_n, max_n = int(rng.integers(1, 4)), int(rng.integers(1, 17))
        for _ in range(int(rng.integers(1, 120))):
            history.append(
                int(rng.integers(0, symbols))
                if rng.random() < 0.7 or not history
                else history[int(rng.integers(0, len(history)))]
            )
            array = index.of(history)
            assert index.self_match(min_n, max_n) == longest_match(array, array, len(array) - 1, min_n, max_n)


def test_deep_copies_are_told_from_fresh_ones_by_their_match_length():
    """Matches are measured past 16 tokens, so the cost model's features for 24-token matches occur: a copy
    well under way learns its own acceptance instead of sharing the estimate of one that has just begun."""
    from engine.decoding.drafting import lookup_feature

    source = list(range(100, 160))
    early, deep = source + source[:17], source + source[:40]
    proposer = LookupProposer(remember_requests=False)
    found_early, found_deep = proposer.propose_one(early, 8), proposer.propose_one(deep, 8)
    assert found_early.tokens == source[17:25] and found_deep.tokens == source[40:48]
    assert lookup_feature(found_early.match_length, True) == (16, True)
    assert lookup_feature(found_deep.match_length, True) == (24, True)
