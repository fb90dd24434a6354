"""A selection record whose query's last token ends a block (issue 76): the selection and the local
block are the ones of that token, which predicts the answer's first token, not of the next one, which
starts a new block. Positions are counted by hand: a context of 9 tokens (positions 0-8) and a query of
3 (positions 9-11), so the predicting token is position 11, the last of block 2 (positions 8-11) in
blocks of 4; the next token, position 12, would be the first of block 3."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kvphase.backends.base import Query, Score
from kvphase.sweep.selection import Indexer, SelectionReader, target_selection

CONTEXT = [100 + i for i in range(9)]  # positions 0-8; block 2 starts at position 8
QUERY = Query(prompt=(300, 301, 302), answer=(108, 400))  # positions 9-11; the answer's first token is 108
PREDICTING, OWN_BLOCK = 11, 2  # the query's last position and its block, by hand


def _target(answer_at: int):
    """A target whose record holds the answer's first token at `answer_at` (the context's own token)."""
    query = Query(QUERY.prompt, (CONTEXT[answer_at],))
    return SimpleNamespace(target_id=answer_at, position=answer_at, query=query)


def test_a_target_in_the_block_the_query_ends_is_in_its_local_block():
    blocks = Indexer(4, per_group=True, local_blocks=1)  # minimax-m3: only the query token's own block is local
    chosen = {1: np.array([[0, OWN_BLOCK], [1, OWN_BLOCK]])}  # (head groups, k)
    own = target_selection(CONTEXT, _target(8), chosen, blocks)  # position 8: block 2, the query's own
    before = target_selection(CONTEXT, _target(7), chosen, blocks)  # position 7: block 1, one before it
    assert (own["answer_pos"], own["local_block"]) == (8, True), own
    assert (before["answer_pos"], before["local_block"]) == (7, False), before


class _RecordingModel:
    """A reference model that records, for every row (position) of a pass, the block of that position
    as the one unit it selected in layer 1, so the row a reader takes shows in the unit it returns."""

    def __init__(self):
        self.selections = None

    def forward(self, tokens: list[int]) -> None:
        if self.selections is not None:
            self.selections[1] = np.array([[position // 4, -1] for position in range(len(tokens))])  # (T, k)


class _ReferenceBackend:
    """Just enough of the numpy reference for `SelectionReader`: `model`, `policy` and `score`."""

    policy = None

    def __init__(self):
        self.model = _RecordingModel()

    def score(self, context, queries):
        query = queries[0]
        self.model.forward([*context, *query.prompt, *query.answer[:-1]])
        return [Score(True, 0.0, query.answer)]


def test_the_reader_takes_the_selection_of_the_querys_last_token():
    _, chosen = SelectionReader(_ReferenceBackend()).score(CONTEXT, QUERY)
    assert {layer: units.tolist() for layer, units in chosen.items()} == {1: [OWN_BLOCK]}, \
        f"read the selection of block {chosen[1].tolist()}, not that of position {PREDICTING} (block {OWN_BLOCK})"
