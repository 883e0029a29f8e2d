import numpy as np

from engine.decoding.proposers.lookup import LookupProposer, find_lookup_draft


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


def test_no_match_and_no_room_give_nothing():
    assert draft(h(1, 2, 3, 4), 1, 3, 4) == []
    assert draft(h(1, 2, 1, 2), 1, 3, 0) == []
    assert draft(h(7), 1, 3, 4) == []


def test_min_ngram_is_respected():
    history = h(1, 2, 3, 4, 3)
    assert draft(history, 2, 3, 4) == []
    assert draft(history, 1, 3, 4) == [4, 3]


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
