"""Read or overwrite each layer's per-head attention output inside llama.cpp's graph.

The llama.cpp backend can install one eval callback (`llama_context_params.cb_eval`, see
`kvphase.engines.capture`) that hands a `HeadTap` the node holding every head's attention
output of a layer, before the output projection mixes the heads: `kqv_out-<layer>` in
llama.cpp's shared attention (`build_attn`), glm5-next's MLA layers and minimax-m3;
`attn_derope-<layer>` in deepseek4, whose heads are un-roped before its grouped output
projection. The scheduler computes the graph up to that node, calls back, then computes
the rest from the node's memory, so an array the tap returns is what the output
projection reads (CPU backends: the node lives in host memory).

The tap sees the node only while `active` (the backend sets it for query decodes), as
(n_tokens, n_head, head_dim): llama.cpp lays every token's heads out one after another.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from kvphase.engines.capture import (
    _EVAL_CALLBACK, GgmlTensor, numpy_to_tensor, split_name, tensor_name, tensor_to_numpy,
)
from kvphase.errors import BackendError

HEAD_OUTPUT = "kqv_out"
HEAD_OUTPUT_BY_ARCH = {"deepseek4": "attn_derope"}


def head_output_node(architecture: str) -> str:
    """The graph node that holds every head's attention output of a layer in this architecture."""
    return HEAD_OUTPUT_BY_ARCH.get(architecture, HEAD_OUTPUT)


class HeadTap(Protocol):
    def wants(self, layer: int) -> bool:
        """Whether to see this layer's head outputs."""

    def update(self, layer: int, heads: np.ndarray) -> np.ndarray | None:
        """heads: (n_tokens, n_head, head_dim). Return an array of that shape to write it into
        the graph, or None to leave the node as computed."""


def as_heads(array: np.ndarray, n_tokens: int, n_head: int) -> np.ndarray:
    """A node's array, token by token: (n_tokens, n_head, head_dim)."""
    outer = [d for d in array.shape if d != 1]
    if array.size % (n_tokens * n_head) or (n_tokens > 1 and outer[:1] != [n_tokens]):
        raise BackendError(f"expected {n_tokens} tokens of {n_head} heads in a head-output node, "
                           f"found shape {array.shape}")
    return array.reshape(n_tokens, n_head, -1)


class TapPoint:
    """One llama.cpp context's eval callback: hands node `node`-<layer> to `tap` while `active`."""

    def __init__(self, node: str, n_head: int):
        self.node, self.n_head = node, n_head
        self.tap: HeadTap | None = None
        self.active, self.n_tokens = False, 0
        self.seen: set[int] = set()  # layers whose node llama.cpp computed while active
        self.errors: list[BaseException] = []
        self.c_callback = _EVAL_CALLBACK(self._callback)  # the context keeps a pointer: lives as long as self

    def _callback(self, t_ptr, ask, user_data):  # noqa: ARG002
        try:
            t = t_ptr.contents
            if not self.active:
                return not ask
            name, layer = split_name(tensor_name(t))
            if name != self.node or layer < 0:
                return not ask
            self.seen.add(layer)
            wanted = self.tap is not None and self.tap.wants(layer)
            if ask or not wanted:
                return bool(wanted) if ask else True
            array = tensor_to_numpy(t)
            changed = self.tap.update(layer, as_heads(array, self.n_tokens, self.n_head))
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
            raise BackendError(f"the head tap failed: {first!r}") from first
