"""The compressor a `kvphase train` model declares, as an attention policy for the reference.

Each (layer, head) gets its own design from `kvphase.designs`: `MeanPool` ("meanpool"),
`GatedPool` ("gated"; "rolling" with a window starting at every position) or `GatedTopK`
("kpool") with the head's gate and per-phase bias read from the file, at the window offset
the file declares; `CoWindow` ("cowa") with the layer's slice boundary offsets (the file's
starts, slice length = its stride). Models trained with random offsets draw them per context
(`CompressedAttention`'s randomize), as in training.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvphase.designs import CoWindow, GatedPool, GatedTopK, MeanPool
from kvphase.errors import ModelFileError
from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata
from kvphase.gguf.modelinfo import ModelInfo, as_model_info
from kvphase.gguf.trained import GATED_DESIGNS, TrainedSpec, read_trained_spec, window_step
from kvphase.gguf.tensors import tensor_array
from kvphase.reference.model import DenseAttention
from kvphase.reference.policy import CompressedAttention

class TrainedCompression(CompressedAttention):
    """Per-(layer, head) trained designs: `_design` builds each with its own weights."""

    def __init__(self, spec: TrainedSpec, gates: list | None, apes: list | None, seed: int = 0):
        self.spec, self.gates, self.apes = spec, gates, apes
        template = MeanPool(window=spec.stride, stride=spec.stride, local_window=spec.local_window)
        super().__init__(template, randomize=spec.offsets == "random", seed=seed)

    def start(self, layer: int, kv_head: int, n_head_kv: int) -> int:
        if self.randomize:
            return super().start(layer, kv_head, n_head_kv)
        return self.spec.starts[layer][kv_head]

    def design_for(self, layer: int, kv_head: int, n_head_kv: int):
        key = (layer, kv_head)
        if key not in self._designs:
            s = self.spec
            shape = dict(window=s.stride, stride=window_step(s.design, s.stride), local_window=s.local_window,
                         start=self.window_start(layer, kv_head, n_head_kv))
            if s.design == "cowa":
                self._designs[key] = self._cowa_head(layer, kv_head, n_head_kv)
            elif s.design == "meanpool":
                self._designs[key] = MeanPool(**shape)
            else:
                gate = self.gates[layer][kv_head : kv_head + 1]  # (1, head_dim, head_dim)
                ape = self.apes[layer][kv_head][:, None, :]  # (S, 1, head_dim)
                made = GatedTopK(**shape, gate=gate, ape=ape, top_k=s.top_k) if s.design == "kpool" else GatedPool(**shape, gate=gate, ape=ape)
                self._designs[key] = made
        return self._designs[key]

    def _cowa_head(self, layer: int, kv_head: int, n_head_kv: int) -> CoWindow:
        """One head of CoWA: its slices depend on every head's boundary offset in the layer."""
        offsets = tuple(self.window_start(layer, h, n_head_kv) for h in range(n_head_kv))
        return CoWindow(slice_length=self.spec.stride, n_heads=n_head_kv, head=kv_head, offsets=offsets,
                        local_window=self.spec.local_window)


def trained_policy(model: str | Path | ModelInfo, seed: int = 0):
    """The attention a trained file declares (dense for the control), or None for other files."""
    header = as_model_info(model).header
    path = header.path
    meta = Metadata(header)
    n_layer, n_head = meta.integer(Keys.LLM.BLOCK_COUNT.format(arch='gpt2'), 0), meta.integer(Keys.Attention.HEAD_COUNT.format(arch='gpt2'), 0)
    spec = read_trained_spec(meta, n_layer, n_head)
    if spec is None:
        return None
    if spec.design == "dense":
        return DenseAttention()
    gates = apes = None
    if spec.design in GATED_DESIGNS:
        tensors = {t.name: t for t in header.tensors}
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        try:
            gates = [tensor_array(raw, tensors[f"blk.{i}.attn_gate.weight"]) for i in range(n_layer)]  # (heads, hd, hd)
            apes = [tensor_array(raw, tensors[f"blk.{i}.attn_gate_ape.weight"]) for i in range(n_layer)]  # (heads, S, hd)
        except KeyError as exc:
            raise ModelFileError(f"{path}: the {spec.design} compressor needs tensor {exc.args[0]}") from None
    return TrainedCompression(spec, gates, apes, seed=seed)
