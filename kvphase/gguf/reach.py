"""From which length each part of a file's compressor acts: its reach, from the metadata alone.

A compressor does not act at every length. An indexer that keeps `k` pools (entries, blocks)
drops nothing while the sequence holds no more than `k` of them, and every target is then
read exactly; a sliding window reads its last tokens raw whatever else the layer does. The
rules follow the llama.cpp vendored in llama-cpp-python 0.3.36 (paths under vendor/llama.cpp):

- glm5-next's k-pool indexer (`src/models/glm5-next.cpp` build_kpool_select): pools of
  `kpool` tokens from the sequence's first position; a pool is visible once it ends at or
  before the token (`src/llama-memory-hybrid-idx.cpp` fill_mask: floor(n / kpool) of them
  for a token with n tokens up to and including it); the top `top_k / kpool` are kept
  (`n_top_pool = min(n_pool, top_k / kpool)`), so it drops a pool from n = top_k + kpool on.
  Selected pools are read token by token: a target is lost only at selection.
- deepseek4 (`src/models/deepseek4.cpp`): every layer reads its last `sliding_window` tokens
  raw (`hparams.n_swa`, the query's own token included); a layer of ratio r also reads one
  pooled entry per complete block of r tokens (floor(n / r) of them); on ratio-4 (CSA) layers
  the lightning indexer keeps `min(n_entries, top_k)` entries (`lid_top_k`), so it drops one
  from n = 4 (top_k + 1) on. Ratio-128 (HCA) layers have no indexer.
- minimax-m3 (`src/models/minimax-m3.cpp`): blocks of `block_size` exact tokens; the token's
  own block and `local_blocks - 1` before it are always kept, and `K = min(top_k, nblk)`
  blocks in all, so a visible block is dropped from n = top_k x block_size + 1 on. MSA runs
  only under flash attention with one sequence or per-sequence caches; otherwise every
  layer is dense (`msa_enabled = fa_on && streams_ok`).

Lengths here count the tokens of the sequence up to and including the token that predicts
(the query's last token, for an answer's first token).
"""

from __future__ import annotations

import functools
from typing import Collection, NamedTuple, Optional

from kvphase.errors import GGUFError
from kvphase.gguf.keys import Keys
from kvphase.gguf.modelinfo import _ranges  # one writer of layer ranges

QUARTER = 4  # a measuring length keeps at most 1/QUARTER of what the indexer could select (docs/sweep.md)


class Selection(NamedTuple):
    """An indexer that keeps the `keeps` best of the units (pools, entries, blocks) a token sees."""

    name: str  # in words: "glm5-next's k-pool indexer"
    unit: str  # "pool", "entry", "block"
    unit_tokens: int  # tokens a unit covers
    keeps: int  # units kept
    layers: tuple[int, ...]
    first_visible: int = 0  # a unit is visible from (its index + 1) x unit_tokens + this tokens: 0 for complete
    # pools and entries, 1 - unit_tokens for minimax-m3's blocks (visible from their first token)

    @property
    def units(self) -> str:
        return "entries" if self.unit == "entry" else f"{self.unit}s"

    def visible(self, tokens: int) -> int:
        """Units a token with `tokens` tokens up to and including it sees."""
        return max(0, (tokens - self.first_visible) // self.unit_tokens)

    @property
    def acts_from(self) -> int:
        """The fewest tokens at which the indexer drops a visible unit."""
        return (self.keeps + 1) * self.unit_tokens + self.first_visible

    def kept_share(self, tokens: int) -> float:
        """The share of the visible units the indexer keeps at this length (1.0: it keeps them all)."""
        visible = self.visible(tokens)
        return 1.0 if visible <= self.keeps else self.keeps / visible

    def quarter_length(self) -> int:
        """The fewest tokens at which it keeps at most a QUARTER of the visible units."""
        return QUARTER * self.keeps * self.unit_tokens + self.first_visible


class Pooling(NamedTuple):
    """Pooled entries: one per complete block of `stride` tokens, on `layers`."""

    name: str  # "CSA entries", "HCA entries"
    stride: int
    layers: tuple[int, ...]


class Reach(NamedTuple):
    """The parts of one file's compressor and from which length each acts."""

    architecture: str
    pooling: tuple[Pooling, ...] = ()
    selection: tuple[Selection, ...] = ()
    raw_window: int = 0  # the last this many tokens (the predicting one included) are always read exactly
    raw_window_name: str = ""  # "sliding window", "local blocks", "the tail pool"
    raw_window_key: str = ""  # the metadata that sets it
    engine_condition: str = ""  # what llama.cpp needs to run the compressor at all ("" nothing)

    @property
    def declared(self) -> bool:
        return bool(self.pooling or self.selection)

    def idle_at(self, tokens: int) -> Optional[str]:
        """Why no part of the compressor touches a target at this length, in words; None when one does.
        Pooled entries act once a position lies before the raw window in a complete block: position 0
        does from max(raw_window + 1, stride) tokens on; an indexer acts once it drops a unit."""
        if not self.declared:
            return None
        pooled_beyond_window = (self.pooling and tokens > self.raw_window
                                and tokens >= min(p.stride for p in self.pooling))
        if pooled_beyond_window or any(s.visible(tokens) > s.keeps for s in self.selection):
            return None
        parts = [f"{s.name} keeps every {s.unit} a query sees (at most {s.visible(tokens):,}; it keeps {s.keeps:,} "
                 f"and selects from {s.acts_from:,} tokens on)" for s in self.selection]
        if self.pooling:
            parts.append(f"every target sits inside the {self.raw_window}-token {self.raw_window_name}")
        return "; ".join(parts)

    def default_length(self) -> int:
        """The fewest tokens at which every indexer keeps at most a quarter of what it sees (0 without one)."""
        return max((s.quarter_length() for s in self.selection), default=0)

    def lines(self) -> list[str]:
        """The reach in words, one line per part (inspect, dry run)."""
        said = [f"{p.name} pool every {p.stride} tokens (layers {_ranges(tuple(p.layers))}) from {p.stride} tokens on"
                for p in self.pooling]
        said += [f"{s.name} (layers {_ranges(tuple(s.layers))}) keeps {s.keeps:,} {s.units} of {s.unit_tokens} tokens: "
                 f"it selects from {s.acts_from:,} tokens on (below that it keeps every {s.unit} and every target "
                 f"is read through it); it keeps a quarter of what it sees from {s.quarter_length():,} tokens on"
                 for s in self.selection]
        if self.raw_window:
            said.append(f"the last {self.raw_window} tokens ({self.raw_window_name}) are always read exactly")
        if self.engine_condition:
            said.append(self.engine_condition)
        return said

    def read_share_text(self, tokens: int) -> str:
        """What share each indexer reads at this length (dry run)."""
        return "; ".join(f"{s.name} keeps {min(s.keeps, s.visible(tokens)):,} of {s.visible(tokens):,} visible "
                         f"{s.units} ({100 * s.kept_share(tokens):.0f}%)" for s in self.selection)


# each family's params (`CompressionSpec.params`) by the GGUF key they are read from
GLM5_KEYS = {"kpool": Keys.Attention.Indexer.KPOOL, "top_k": Keys.Attention.Indexer.TOP_K,
             "select_tail": Keys.Attention.Indexer.KPOOL_SELECT_TAIL}
MSA_KEYS = {"block_size": Keys.Attention.Indexer.BLOCK_SIZE, "top_k": Keys.Attention.Indexer.TOP_K,
            "local_blocks": Keys.Attention.Indexer.LOCAL_BLOCKS}
DSV4_KEYS = {"sliding_window": Keys.Attention.SLIDING_WINDOW, "indexer_top_k": Keys.Attention.Indexer.TOP_K}
MSA_CONDITION = ("llama.cpp runs MiniMax-M3's block indexer only under flash attention with one sequence or "
                 "per-sequence caches; otherwise every layer is dense")


def reach_of(compression, declared: Collection[str] | None = None) -> Reach:
    """The reach of a `CompressionSpec`; GGUFError naming the key when its settings are missing or
    contradictory. Families without an engine's indexer (kvphase-trained reference designs) have none.
    `declared`: the file's metadata keys, so that a key it lacks (read as 0) is named missing."""
    params, family = compression.params, compression.family
    _positive = functools.partial(_positive_of, declared=declared)
    if family == "kpool":
        key = _key_namer(compression, "glm5-next", GLM5_KEYS)
        kpool, top_k = _positive(params, "kpool", key("kpool")), params.get("top_k", 0)
        _positive(params, "top_k", key("top_k"))
        if top_k % kpool:
            raise GGUFError(f"{key('top_k')} is {top_k}, expected a multiple of {key('kpool').removeprefix('glm5-next.')} ({kpool}): "
                            f"{'transformers' if compression.keys else 'llama.cpp'} refuses the file")
        return Reach("glm5-next", selection=(Selection("the k-pool indexer", "pool", kpool, top_k // kpool,
                                                       compression.layers),),
                     raw_window=kpool - 1 if params.get("select_tail") else 0, raw_window_name="tail pool",
                     raw_window_key=key("select_tail"))
    if family == "dsv4":
        return _deepseek4_reach(compression, _positive)
    if family == "msa":
        key = _key_namer(compression, "minimax-m3", MSA_KEYS)
        block = _positive(params, "block_size", key("block_size"))
        top_k = _positive(params, "top_k", key("top_k"))
        local = params.get("local_blocks", 0)
        if not 0 <= local <= top_k:
            raise GGUFError(f"{key('local_blocks')} is {local}, expected 0 to {key('top_k')} ({top_k})")
        return Reach("minimax-m3", selection=(Selection("the MSA block indexer", "block", block, top_k,
                                                        compression.layers, first_visible=1 - block),),
                     raw_window=local * block, raw_window_name=f"{local} local block{'s' if local != 1 else ''}",
                     raw_window_key=key("local_blocks"),
                     engine_condition=MSA_CONDITION)
    return Reach(compression.family)


def _deepseek4_reach(compression, _positive) -> Reach:
    params, key = compression.params, _key_namer(compression, "deepseek4", DSV4_KEYS)
    ratios = _expand_runs(params.get("compress_ratios", ""))
    window = params.get("sliding_window")
    if window is not None and window < 1:
        raise GGUFError(f"{key('sliding_window')} is {window}, expected a positive number of tokens")
    pooling = tuple(Pooling({4: "CSA entries", 128: "HCA entries"}.get(r, f"ratio-{r} entries"), r,
                            tuple(i for i, x in enumerate(ratios) if x == r)) for r in sorted(set(ratios) - {0, 1}))
    csa_layers = tuple(i for i, x in enumerate(ratios) if x == 4)
    selection = ()
    if csa_layers:
        top_k = _positive(params, "indexer_top_k", key("indexer_top_k"))
        selection = (Selection("the lightning indexer", "entry", 4, top_k, csa_layers),)
    return Reach("deepseek4", pooling=pooling, selection=selection, raw_window=window or 0,
                 raw_window_name="sliding window", raw_window_key=key("sliding_window"))


def _key_namer(compression, arch: str, gguf_keys: dict[str, str]):
    """The name of a param's key in the model's own file: config.json's (an HF checkpoint's `keys`), else
    its GGUF key (`gguf_keys`) for `arch`."""
    return lambda name: compression.keys.get(name) or gguf_keys[name].format(arch=arch)


def _positive_of(params: dict, name: str, key: str, declared: Collection[str] | None = None) -> int:
    value = None if declared is not None and key not in declared else params.get(name)
    if not isinstance(value, int) or value < 1:
        raise GGUFError(f"{key} is {value if value is not None else 'missing'}, expected a positive whole number")
    return value


def _expand_runs(text: str) -> list[int]:
    """'0, 4x2, 128' (modelinfo's run-length text) -> [0, 4, 4, 128]."""
    out = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        value, _, count = part.partition("x")
        out += [int(value)] * int(count or 1)
    return out


