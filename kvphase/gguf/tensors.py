"""The one GGUF tensor reader: a tensor's bytes as float32, in numpy order.

`validate` reads single tensors with `read_model_tensor`; the reference model reads a
whole file through `tensor_array` over one memory map. F32, F16 and BF16 are converted
directly; quantized types are dequantized by the gguf package (`gguf.quants`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvphase.errors import PlanError
from kvphase.gguf.header import TensorInfo
from kvphase.gguf.header_only import no_weights
from kvphase.gguf.modelinfo import ModelInfo, as_model_info

GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16 = 0, 1, 30  # ggml_type (GGMLQuantizationType) ids


def tensor_array(data: np.ndarray, info: TensorInfo) -> np.ndarray:
    """The tensor `info` out of `data` (the whole file as uint8, e.g. an `np.memmap`) as a
    new float32 array in numpy order (ggml's ne reversed: slowest dimension first)."""
    if info.data_offset < 0:
        raise no_weights(info)
    raw = np.asarray(data[info.data_offset : info.data_offset + info.n_bytes])  # (n_bytes,)
    shape = tuple(reversed(info.shape))
    if info.type_id == GGML_TYPE_F32:
        return raw.view(np.float32).reshape(shape).copy()
    if info.type_id == GGML_TYPE_F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if info.type_id == GGML_TYPE_BF16:  # the high half of an F32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(raw, GGMLQuantizationType(info.type_id)).astype(np.float32).reshape(shape)


def read_model_tensor(model: str | Path | ModelInfo, name: str) -> np.ndarray:
    """One tensor of a GGUF file (a path, or a model already opened) as float32, numpy order; PlanError
    when the file has none of that name."""
    header = as_model_info(model).header
    info = next((t for t in header.tensors if t.name == name), None)
    if info is None:
        raise PlanError(f"{header.path} has no tensor {name}")
    return tensor_array(np.memmap(header.path, dtype=np.uint8, mode="r"), info)
