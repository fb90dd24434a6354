"""Which pools or compressed entries an indexer selected, read from llama.cpp's graph.

Two named nodes of each indexer layer (llama.cpp 0.3.36, vendored in llama-cpp-python):

- glm5-next (`build_kpool_select`, src/models/glm5-next.cpp): `indexer_score-<il>`, each token's
  score of every pool slot, -inf where the slot is not visible to the token, and
  `indexer_top_k-<il>`, the `top_k / kpool` best slots. Shared-indexer layers reuse the
  selection of the full layer before them and have neither node.
- deepseek4 (`build_lid_top_k`, src/models/deepseek4.cpp, CSA ratio-4 layers only):
  `lid_score_masked-<il>` and `lid_top_k-<il>`, over the lightning indexer's compressed entries.

Both arrays are (n_tokens, slots) in the decode's token order. A slot the top-k took while its
score is -inf holds no pool (fewer visible pools than the indexer keeps). Slots are cache
entries, not positions: glm5-next lays out the pools of every sequence one after the other
(`set_input_kpool` in src/llama-memory-hybrid-idx.cpp), so a query on a copy of the context
sees its own sequence's pools as one run of visible slots; deepseek4's visible entries start at
slot 0. So the n-th visible slot is the sequence's n-th pool or entry, positions
[n * unit, (n + 1) * unit) from the sequence's start at position 0: `units` counts from the
first visible slot. tests/test_selection.py checks this against the numpy reference.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvphase.errors import BackendError


class IndexerNodes(NamedTuple):
    """The two nodes of an architecture's indexer layer."""

    scores: str
    top_k: str


INDEXER_NODES = {
    "glm5-next": IndexerNodes("indexer_score", "indexer_top_k"),
    "deepseek4": IndexerNodes("lid_score_masked", "lid_top_k"),
}


def units(scores: np.ndarray, top: np.ndarray) -> np.ndarray:
    """The selected pools or entries of one token, numbered from its first visible slot, ascending.

    scores: (n_slots,) the token's scores, -inf where a slot is not visible; top: (k,) slots."""
    visible = np.flatnonzero(np.isfinite(scores))
    if not len(visible):
        return np.zeros(0, np.int64)
    chosen = np.asarray(top, np.int64)
    chosen = chosen[(chosen >= 0) & (chosen < len(scores))]
    chosen = chosen[np.isfinite(scores[chosen])]
    return np.unique(chosen - visible[0])


class IndexerNodeTap:
    """What both indexer taps select: an architecture's two indexer nodes in every layer."""

    def __init__(self, architecture: str):
        if architecture not in INDEXER_NODES:
            raise BackendError(f"llama.cpp's {architecture} graph has no indexer node kvphase reads")
        self.nodes = INDEXER_NODES[architecture]
        self.name_prefixes = tuple(f"{node}-".encode() for node in self.nodes)  # `taps.Tap`

    def select(self, name: str, layer: int, t) -> tuple[str, int] | None:
        return (name, layer) if layer >= 0 and name in self.nodes else None


class SelectionTap(IndexerNodeTap):
    """A `engines.taps.Tap` that records, for one token position of each query decode, the units
    every indexer layer selected (`take`). Query decodes only."""

    every_decode = False

    def __init__(self, architecture: str):
        super().__init__(architecture)
        self.position = -1  # the token whose selection is recorded
        self._arrays: dict[tuple[str, int], np.ndarray] = {}

    def update(self, key: tuple[str, int], array: np.ndarray, positions: np.ndarray) -> None:
        rows = np.flatnonzero(np.asarray(positions) == self.position)
        if len(rows) != 1:
            raise BackendError(f"the decode holds position {self.position} {len(rows)} times, expected once")
        flat = array.reshape(-1, array.shape[-1])
        if len(flat) != len(positions):
            raise BackendError(f"{key[0]}-{key[1]} holds {len(flat)} token rows for a decode of {len(positions)}")
        self._arrays[key] = flat[rows[0]].copy()
        return None

    def take(self) -> dict[int, np.ndarray]:
        """Each indexer layer's selected units at `position` in the decodes since the last call."""
        arrays, self._arrays = self._arrays, {}
        layers = sorted({layer for _, layer in arrays})
        missing = [layer for layer in layers if (self.nodes.scores, layer) not in arrays
                   or (self.nodes.top_k, layer) not in arrays]
        if missing:
            raise BackendError(f"llama.cpp computed only one of {self.nodes.scores} and {self.nodes.top_k} "
                               f"in layer {missing[0]}")
        return {layer: units(arrays[(self.nodes.scores, layer)], arrays[(self.nodes.top_k, layer)])
                for layer in layers}


class IndexerRowsTap(IndexerNodeTap):
    """A `engines.taps.Tap` that records every token's indexer scores and top-k slots in every
    indexer layer, context decodes included (`every_decode`), by position: a later decode of a
    position (the checked query after the branch's first one) replaces an earlier one's row."""

    every_decode = True

    def __init__(self, architecture: str):
        super().__init__(architecture)
        self.rows: dict[tuple[str, int, int], np.ndarray] = {}  # (node, layer, position) -> (slots,)

    def update(self, key: tuple[str, int], array: np.ndarray, positions: np.ndarray) -> None:
        flat = array.reshape(len(positions), -1)  # (n_tokens, slots)
        for row, position in zip(flat, positions):
            self.rows[(*key, int(position))] = row.copy()
        return None

    def selections(self) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
        """(position, layer) -> the token's visible scores in slot order (n_visible,) and the units
        the indexer kept (`units`)."""
        found = {}
        for (node, layer, position), scores in self.rows.items():
            if node == self.nodes.scores and (self.nodes.top_k, layer, position) in self.rows:
                top = self.rows[(self.nodes.top_k, layer, position)]
                found[(position, layer)] = (scores[np.isfinite(scores)], units(scores, top))
        return found
