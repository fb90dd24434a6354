"""Read or overwrite nodes of llama.cpp's graph while it scores: knockouts inside the engine.

The llama.cpp backend can install one eval callback (`llama_context_params.cb_eval`, see
`kvphase.engines.capture`) that hands a `Tap` the nodes it selects. The scheduler computes
the graph up to such a node, calls back, then computes the rest from the node's memory, so
an array the tap returns is what later nodes read (CPU backends: the node lives in host
memory). Two kinds of node are tapped:

- each layer's per-head attention output, before the output projection mixes the heads:
  `kqv_out-<layer>` in llama.cpp's shared attention (`build_attn`), glm5-next's MLA layers
  and minimax-m3; `attn_derope-<layer>` in deepseek4, whose heads are un-roped before its
  grouped output projection. llama.cpp lays every token's heads out one after another:
  `as_heads` reads it as (n_tokens, n_head, head_dim);
- the compressor's gate weights, the softmax over each window's slots of gate + per-phase
  bias, an unnamed SOFT_MAX node found through its sources (`GATE_SOFTMAX`): glm5-next's
  k-pool indexer (`build_kpool_select`; its source, the `indexer_compressor_ape` weight),
  deepseek4's CSA compressor and lightning-indexer compressor (`build_overlap_compressed_kv_
  from_state`; the `csa_`/`lid_state_compress` scores). `as_windows` reads it as
  (n_windows, channels, slots). Windows start at multiples of the stride S from a
  sequence's position 0, so slot j sits at phase j mod S (deepseek4's CSA windows span
  the previous block's S rows and the block's own). Which rows are the windows a decode
  completes (`completed_windows`) was measured (rows compared with `DSV4.pool_weights` of
  the captured logits and with the context decode's own rows): glm5-next pools them last (after a sequence copy it pools every pool of every sequence
  again: a query after a 62-pool context pools 125 rows, the context's 62 twice, then the
  new one), deepseek4 first (then one snapshot of a partial block).

A tap sees query decodes only, unless it sets `every_decode` (then the backend decodes the
context again under it).
"""

from __future__ import annotations

import ctypes
import re
import sys
from typing import Hashable, NamedTuple, Protocol

import numpy as np

from kvphase.engines.capture import (
    GgmlTensor, callback_error, numpy_to_tensor, op_name, source_chain, split_name, tensor_name, tensor_to_numpy,
)
from kvphase.errors import BackendError
from kvphase.gguf.keys import Keys

# the eval callback as llama.cpp calls it, the tensor as a plain address: cheaper per call than a
# pointer object, and the callback runs for every node of every decode
_ADDRESS_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
_NAME_OFFSET = GgmlTensor.name.offset
_NAME_HEAD = ctypes.c_uint64  # a name's first 8 bytes, read as one integer in the machine's byte order

HEAD_OUTPUT = "kqv_out"
HEAD_OUTPUT_BY_ARCH = {"deepseek4": "attn_derope"}


class GateSoftmax(NamedTuple):
    """Where an architecture's compressor gate softmax sits in llama.cpp's graph."""

    source: re.Pattern  # names a node the SOFT_MAX reads within 4 steps, or that node's second operand
    sources: tuple[str, ...]  # the pattern's `source` group, in order: a layer's gates are numbered by it
    completed_last: bool  # the completed windows' rows come last in the node (else first)
    channels_key: str = ""  # metadata key of the channel count when the node's shape does not give it


GATE_SOFTMAX = {
    "glm5-next": GateSoftmax(re.compile(r"blk\.(?P<layer>\d+)\.(?P<source>indexer_compressor_ape)\.weight"),
                             ("indexer_compressor_ape",), completed_last=True,
                             channels_key=Keys.Attention.Indexer.KEY_LENGTH.format(arch='glm5-next')),
    "deepseek4": GateSoftmax(re.compile(r"(?P<source>csa|lid)_state_compress-(?P<layer>\d+)"), ("csa", "lid"),
                             completed_last=False),
}


def head_output_node(architecture: str) -> str:
    """The graph node that holds every head's attention output of a layer in this architecture."""
    return HEAD_OUTPUT_BY_ARCH.get(architecture, HEAD_OUTPUT)


class Tap(Protocol):
    every_decode: bool  # False: query decodes only
    # optional `name_prefixes: tuple[bytes, ...]`, each 8 bytes or longer: select is asked only about nodes
    # whose raw name starts with one of them (the callback runs for every node of every decode, and the
    # first 8 bytes of a name are read as one integer: a fraction of a microsecond a node)

    def select(self, name: str, layer: int, t: GgmlTensor) -> Hashable | None:
        """A key for a node the tap wants (its layer; (layer, gate number) for gates), else None;
        `name` and `layer` are llama.cpp's name split as `name-layer`."""

    def update(self, key: Hashable, array: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
        """The selected node's values (`tensor_to_numpy`) and the decode's positions; return an
        array of the same size to write it into the graph, or None to leave the node as computed."""


def as_heads(array: np.ndarray, n_tokens: int, n_head: int) -> np.ndarray:
    """A head-output node's array, token by token: (n_tokens, n_head, head_dim)."""
    outer = [d for d in array.shape if d != 1]
    if array.size % (n_tokens * n_head) or (n_tokens > 1 and outer[:1] != [n_tokens]):
        raise BackendError(f"expected {n_tokens} tokens of {n_head} heads in a head-output node, "
                           f"found shape {array.shape}")
    return array.reshape(n_tokens, n_head, -1)


def gate_softmax_key(t: GgmlTensor, gate: GateSoftmax) -> tuple[int, int] | None:
    """(layer, number of the gate in the layer: `gate.sources`) for a gate softmax node, else None."""
    if op_name(t) != "SOFT_MAX":
        return None
    for source in source_chain(t, 4):
        for node in (source, source.src[1].contents if source.src[1] else None):
            found = gate.source.fullmatch(tensor_name(node)) if node is not None else None
            if found:
                return int(found["layer"]), gate.sources.index(found["source"])
    return None


def completed_windows(positions: np.ndarray, stride: int) -> int:
    """How many windows (their own S positions from a multiple of S) end among `positions`."""
    return int(np.count_nonzero((np.asarray(positions) + 1) % stride == 0))


def as_windows(array: np.ndarray, channels: int) -> np.ndarray:
    """A gate softmax node as (n_windows, channels, slots); `channels` 0: the node's own second dimension."""
    channels = channels or (array.shape[-2] if array.ndim >= 2 else 0)
    if not channels or array.size % (channels * array.shape[-1]):
        raise BackendError(f"expected gate weights of {channels} channels, found shape {array.shape}")
    return array.reshape(-1, channels, array.shape[-1])


class TapPoint:
    """One llama.cpp context's eval callback: hands the nodes `tap` selects to it while `active`."""

    def __init__(self):
        self.tap: Tap | None = None
        self.active = False
        self.positions = np.zeros(0, np.int64)  # of the decode running now
        self.errors: list[BaseException] = []
        self._filtered: Tap | None = None  # the tap `_prefixes` and `_heads` were read from
        self._prefixes: tuple[bytes, ...] | None = None
        self._heads: set[int] | None = None
        self.c_callback = _ADDRESS_CALLBACK(self._callback)  # the context keeps a pointer: lives as long as self

    def _callback(self, address, ask, user_data):  # noqa: ARG002
        try:
            tap = self.tap
            if not self.active or tap is None:
                return not ask
            if tap is not self._filtered:
                self._filter(tap)
            if self._heads is not None and (_NAME_HEAD.from_address(address + _NAME_OFFSET).value not in self._heads
                                            or not ctypes.string_at(address + _NAME_OFFSET).startswith(self._prefixes)):
                return not ask
            t = GgmlTensor.from_address(address)
            key = self.tap.select(*split_name(tensor_name(t)), t)
            if key is None or ask:
                return key is not None if ask else True
            array = tensor_to_numpy(t)
            changed = self.tap.update(key, array, self.positions)
            if changed is not None:
                numpy_to_tensor(np.asarray(changed).reshape(array.shape), t)
            return True
        except BaseException as exc:  # an exception must not unwind through C
            self.errors.append(exc)
            return True

    def _filter(self, tap: Tap) -> None:
        """The tap's name prefixes, and their first 8 bytes as integers (None: the tap sees every node)."""
        self._filtered, self._prefixes = tap, getattr(tap, "name_prefixes", None)
        if self._prefixes is not None and min(map(len, self._prefixes)) < 8:
            raise BackendError(f"a tap's name prefixes must be 8 bytes or longer, got {self._prefixes}")
        self._heads = None if self._prefixes is None else {int.from_bytes(p[:8], sys.byteorder) for p in self._prefixes}

    def raise_errors(self) -> None:
        if self.errors:
            first, self.errors = self.errors[0], []
            raise callback_error(first, "the graph tap failed")


def named(node: str):
    """A locator for the nodes llama.cpp named `node`-<layer>: (name, layer, tensor) -> layer or None."""
    return lambda name, layer, t: layer if name == node and layer >= 0 else None


class NodeFinder:
    """A tap that only notes the layers `locate` (name, layer, tensor -> layer or None) finds a node in."""

    every_decode = True

    def __init__(self, locate):
        self.locate, self.layers = locate, set()

    def select(self, name: str, layer: int, t: GgmlTensor) -> None:
        found = self.locate(name, layer, t)
        if found is not None:
            self.layers.add(found)
        return None

    def update(self, key, array, positions) -> None:
        return None
