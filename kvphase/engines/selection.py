"""Which pools, compressed entries or blocks an indexer selected, read from llama.cpp's graph.

Two named nodes of each indexer layer (llama.cpp 0.3.36, vendored in llama-cpp-python):

- glm5-next (`build_kpool_select`, src/models/glm5-next.cpp): `indexer_score-<il>`, each token's
  score of every pool slot, -inf where the slot is not visible to the token, and
  `indexer_top_k-<il>`, the `top_k / kpool` best slots. Shared-indexer layers reuse the
  selection of the full layer before them and have neither node.
- deepseek4 (`build_lid_top_k`, src/models/deepseek4.cpp, CSA ratio-4 layers only):
  `lid_score_masked-<il>` and `lid_top_k-<il>`, over the lightning indexer's compressed entries.

- minimax-m3 (the sparse branch of `llama_model_minimax_m3::graph`, src/models/minimax-m3.cpp,
  MoE layers only): `msa_bsf-<il>`, each head group's score of every position block plus the
  1e30 that forces the query's local blocks in, and `msa_block_mask-<il>`, 0 on the blocks its
  top-k chose and -inf elsewhere, per head group (one indexer head per KV head). Blocks are
  position blocks (block b holds positions [b * block_size, (b + 1) * block_size)), so a block's
  number is its unit. llama.cpp names both only on its batch path: a query decode of one token
  takes the decode path, whose top-k node has no name, and is refused (`take`). A block no
  position of which is visible pools to -FLT_MAX (ggml's max pool starts there, not at -inf).

glm5-next's and deepseek4's arrays are (n_tokens, slots) in the decode's token order. A slot the top-k took while its
score is -inf holds no pool (fewer visible pools than the indexer keeps). Slots are cache
entries, not positions: glm5-next lays out the pools of every sequence one after the other
(`set_input_kpool` in src/llama-memory-hybrid-idx.cpp), so a query on a copy of the context
sees its own sequence's pools as one run of visible slots; deepseek4's visible entries start at
slot 0. So the n-th visible slot is the sequence's n-th pool or entry, positions
[n * unit, (n + 1) * unit) from the sequence's start at position 0: `units` counts from the
first visible slot. tests/sweep/test_selection.py checks this against the numpy reference.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvphase.errors import BackendError


class IndexerNodes(NamedTuple):
    """The two nodes of an architecture's indexer layer."""

    scores: str
    top_k: str
    block_mask: bool = False  # `top_k` is minimax-m3's (head group, token, block) 0 / -inf mask, not slot numbers


INDEXER_NODES = {
    "glm5-next": IndexerNodes("indexer_score", "indexer_top_k"),
    "deepseek4": IndexerNodes("lid_score_masked", "lid_top_k"),
    "minimax-m3": IndexerNodes("msa_bsf", "msa_block_mask", block_mask=True),
}
UNSEEN_BLOCK = np.finfo(np.float32).min  # `msa_bsf` of a block with no visible position


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


def masked_blocks(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The position blocks one head group selected for one token, ascending: 0 in its block mask,
    and some position visible (the top-k fills its spare places with unseen blocks).

    scores: (n_blocks,) `msa_bsf`; mask: (n_blocks,) `msa_block_mask`."""
    return np.flatnonzero((np.asarray(mask) == 0) & (np.asarray(scores) > UNSEEN_BLOCK))


def group_blocks(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(head groups, k): each group's `masked_blocks` for one token. Every group keeps the same number
    of visible blocks (its top-k, or every visible block when fewer), so the rows are equally long."""
    chosen = [masked_blocks(group_scores, group_mask) for group_scores, group_mask in zip(scores, mask)]
    if len({len(blocks) for blocks in chosen}) > 1:
        raise BackendError(f"minimax-m3's head groups selected {[len(b) for b in chosen]} visible blocks; "
                           "expected as many in every group")
    return np.stack(chosen)


def token_rows(array: np.ndarray, n_tokens: int, groups_first: bool) -> np.ndarray:
    """A node's array as (n_tokens, head groups, slots): glm5-next's and deepseek4's nodes hold one
    group, minimax-m3's `msa_bsf` is (token, group, block) and `msa_block_mask` (group, token, block)."""
    if groups_first:
        return array.reshape(-1, n_tokens, array.shape[-1]).transpose(1, 0, 2)
    return array.reshape(n_tokens, -1, array.shape[-1])


class IndexerNodeTap:
    """What both indexer taps select: an architecture's indexer nodes in every layer."""

    def __init__(self, architecture: str):
        if architecture not in INDEXER_NODES:
            raise BackendError(f"llama.cpp's {architecture} graph has no indexer node kvphase reads")
        self.nodes = INDEXER_NODES[architecture]
        self.node_names = (self.nodes.scores, self.nodes.top_k)
        self.name_prefixes = tuple(f"{node}-".encode() for node in self.node_names)  # `taps.Tap`

    def select(self, name: str, layer: int, t) -> tuple[str, int] | None:
        return (name, layer) if layer >= 0 and name in self.node_names else None


class SelectionTap(IndexerNodeTap):
    """A `engines.taps.Tap` that records, for one token position of each query decode, the units
    every indexer layer selected (`take`): ascending unit numbers, and for minimax-m3 one row of
    blocks per head group. Query decodes only."""

    every_decode = False

    def __init__(self, architecture: str):
        super().__init__(architecture)
        self.position = -1  # the token whose selection is recorded
        self._arrays: dict[tuple[str, int], np.ndarray] = {}

    def update(self, key: tuple[str, int], array: np.ndarray, positions: np.ndarray) -> None:
        rows = np.flatnonzero(np.asarray(positions) == self.position)
        if len(rows) != 1:
            raise BackendError(f"the decode holds position {self.position} {len(rows)} times, expected once")
        if array.size % (len(positions) * array.shape[-1]):
            raise BackendError(f"{key[0]}-{key[1]} of shape {array.shape} does not hold {len(positions)} token rows")
        token_major = token_rows(array, len(positions), self.nodes.block_mask and key[0] == self.nodes.top_k)
        if not self.nodes.block_mask and token_major.shape[1] != 1:
            raise BackendError(f"{key[0]}-{key[1]} holds {len(token_major) * token_major.shape[1]} token rows for a "
                               f"decode of {len(positions)}")
        self._arrays[key] = token_major[rows[0]].copy()  # (groups, slots)
        return None

    def take(self) -> dict[int, np.ndarray]:
        """Each indexer layer's selected units at `position` in the decodes since the last call:
        (k,) for glm5-next and deepseek4, (head groups, k) for minimax-m3."""
        arrays, self._arrays = self._arrays, {}
        if not arrays and self.nodes.block_mask:
            raise BackendError("llama.cpp named no minimax-m3 block mask in this query's decode: it names "
                               "msa_block_mask only in a decode of two or more tokens (a one-token query takes "
                               "its decode path); give the query a longer prompt")
        layers = sorted({layer for _, layer in arrays})
        missing = [layer for layer in layers if (self.nodes.scores, layer) not in arrays
                   or (self.nodes.top_k, layer) not in arrays]
        if missing:
            raise BackendError(f"llama.cpp computed only one of {self.nodes.scores} and {self.nodes.top_k} "
                               f"in layer {missing[0]}")
        if self.nodes.block_mask:
            return {layer: group_blocks(arrays[(self.nodes.scores, layer)], arrays[(self.nodes.top_k, layer)])
                    for layer in layers}
        return {layer: units(arrays[(self.nodes.scores, layer)][0], arrays[(self.nodes.top_k, layer)][0])
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
