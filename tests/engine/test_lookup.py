import numpy as np

from engine.decoding.proposers.lookup import LookupProposer, find_lookup_draft


def h(*tokens):
    return np.array(tokens, dtype=np.int64)


def test_longest_ngram_wins_over_shorter_ones():
    # suffix "2 3": the bigram matches at 1..2 (followed by 9), the unigram "3" also at 5 (followed by 7)
    history = h(1, 2, 3, 9, 8, 3, 7, 6, 2, 3)
    assert find_lookup_draft(history, 1, 3, 5).tolist() == [9, 8, 3, 7, 6]


def test_most_recent_match_wins_among_equals():
    history = h(5, 1, 5, 2, 5)
    assert find_lookup_draft(history, 1, 1, 1).tolist() == [2]


def test_no_match_and_no_room_give_nothing():
    assert find_lookup_draft(h(1, 2, 3, 4), 1, 3, 4).tolist() == []
    assert find_lookup_draft(h(1, 2, 1, 2), 1, 3, 0).tolist() == []
    assert find_lookup_draft(h(7), 1, 3, 4).tolist() == []


def test_min_ngram_is_respected():
    history = h(1, 2, 3, 4, 3)
    assert find_lookup_draft(history, 2, 3, 4).tolist() == []
    assert find_lookup_draft(history, 1, 3, 4).tolist() == [4, 3]


def test_draft_is_capped_and_comes_from_the_conversation():
    prompt = list(range(100, 120))
    proposer = LookupProposer(min_ngram=2, max_ngram=4)
    history = prompt + [100, 101, 102]  # the answer starts copying the prompt
    assert proposer.propose(history, 5).tokens == [103, 104, 105, 106, 107]
