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
- glm5-next's k-pool gate weights: the softmax over each pool's slots of gate +
  `indexer_compressor_ape` (`build_kpool_select`), an unnamed node found through its
  sources, (n_pooled, n_embd_indexer, kpool). Pools start at a sequence's position 0, so
  slot j sits at phase j. llama.cpp pools the pools a decode completes (`completed_pools`),
  one dummy when it completes none, and, in a decode after a sequence copy, every pool of
  every sequence in the cache again (measured: a query after a context of 62 pools pools
  125 rows, the context's 62 twice, identical to the context decode's, then the new one).

A tap sees query decodes only, unless it sets `every_decode` (then the backend decodes the
context again under it).
"""

from __future__ import annotations

import re
from typing import Protocol

import numpy as np

from kvphase.engines.capture import (
    _EVAL_CALLBACK, GgmlTensor, numpy_to_tensor, op_name, source_chain, split_name, tensor_name, tensor_to_numpy,
)
from kvphase.errors import BackendError

HEAD_OUTPUT = "kqv_out"
HEAD_OUTPUT_BY_ARCH = {"deepseek4": "attn_derope"}
KPOOL_APE = re.compile(r"blk\.(\d+)\.indexer_compressor_ape\.weight")


def head_output_node(architecture: str) -> str:
    """The graph node that holds every head's attention output of a layer in this architecture."""
    return HEAD_OUTPUT_BY_ARCH.get(architecture, HEAD_OUTPUT)


class Tap(Protocol):
    every_decode: bool  # False: query decodes only

    def select(self, name: str, layer: int, t: GgmlTensor) -> int | None:
        """The layer a node (llama.cpp's name split as `name-layer`) belongs to if the tap wants it, else None."""

    def update(self, layer: int, array: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
        """The node's values (`tensor_to_numpy`) and the decode's positions; return an array of
        the same size to write it into the graph, or None to leave the node as computed."""


def as_heads(array: np.ndarray, n_tokens: int, n_head: int) -> np.ndarray:
    """A head-output node's array, token by token: (n_tokens, n_head, head_dim)."""
    outer = [d for d in array.shape if d != 1]
    if array.size % (n_tokens * n_head) or (n_tokens > 1 and outer[:1] != [n_tokens]):
        raise BackendError(f"expected {n_tokens} tokens of {n_head} heads in a head-output node, "
                           f"found shape {array.shape}")
    return array.reshape(n_tokens, n_head, -1)


def kpool_weights_layer(t: GgmlTensor) -> int | None:
    """The layer of glm5-next's k-pool softmax (over gate + ape), or None for any other node."""
    if op_name(t) != "SOFT_MAX":
        return None
    for source in source_chain(t, 4):
        if op_name(source) == "ADD" and source.src[1]:
            found = KPOOL_APE.fullmatch(tensor_name(source.src[1].contents))
            return int(found.group(1)) if found else None
    return None


def completed_pools(positions: np.ndarray, kpool: int) -> np.ndarray:
    """The pools (index w: positions w*kpool .. w*kpool + kpool - 1) whose last position is decoded here."""
    positions = np.asarray(positions)
    return positions[(positions + 1) % kpool == 0] // kpool


def as_pools(array: np.ndarray, kpool: int, channels: int) -> np.ndarray:
    """The k-pool softmax of a decode as (n_pooled, channels, kpool)."""
    if array.shape[-1] != kpool or array.size % (kpool * channels):
        raise BackendError(f"expected k-pool weights of {kpool} slots and {channels} channels, found shape {array.shape}")
    return array.reshape(-1, channels, kpool)


class TapPoint:
    """One llama.cpp context's eval callback: hands the nodes `tap` selects to it while `active`."""

    def __init__(self):
        self.tap: Tap | None = None
        self.active = False
        self.positions = np.zeros(0, np.int64)  # of the decode running now
        self.errors: list[BaseException] = []
        self.c_callback = _EVAL_CALLBACK(self._callback)  # the context keeps a pointer: lives as long as self

    def _callback(self, t_ptr, ask, user_data):  # noqa: ARG002
        try:
            if not self.active or self.tap is None:
                return not ask
            t = t_ptr.contents
            layer = self.tap.select(*split_name(tensor_name(t)), t)
            if layer is None or ask:
                return layer is not None if ask else True
            array = tensor_to_numpy(t)
            changed = self.tap.update(layer, array, self.positions)
            if changed is not None:
                numpy_to_tensor(np.asarray(changed).reshape(array.shape), t)
            return True
        except BaseException as exc:  # an exception must not unwind through C
            self.errors.append(exc)
            return True

    def raise_errors(self) -> None:
        if self.errors:
            first, self.errors = self.errors[0], []
            if isinstance(first, BackendError):
                raise first
            raise BackendError(f"the graph tap failed: {first!r}") from first


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

    def update(self, layer, array, positions) -> None:
        return None
