"""Writing GGUF files: metadata and weights to a file llama.cpp loads.

`write_gguf` writes keys by their string (the PyPI gguf package does not know every
architecture kvphase writes, see `kvphase.gguf.tiny`); `export_f32` rewrites a model
with every tensor dequantized to F32, as the reference model reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import numpy as np


def write_gguf(path: str | Path, arch: str, keys: Mapping[str, object], tensors: Iterable[tuple[str, np.ndarray]]) -> None:
    """Write `keys` (bool, int as uint32, float as float32, str, or a list) and the named
    `tensors` (numpy order) to a GGUF file of architecture `arch`."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        _add_key(writer, key, value)
    for name, array in tensors:
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_key(writer, key: str, value: object) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)  # a list of ints is written as INT32
    else:
        raise TypeError(f"unsupported metadata value for {key}: {value!r}")


def export_f32(src: str | Path, dst: str | Path) -> None:
    """Write `src` again with every tensor dequantized to F32 by gguf (what the reference reads)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize

    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        if field.name == "general.file_type":
            writer.add_file_type(LlamaFileType.ALL_F32)
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, values.reshape([int(d) for d in tensor.shape[::-1]]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def overwrite_tensor(path: str | Path, name: str, array: np.ndarray) -> None:
    """Replace the data of F32 tensor `name` in place (same shape, numpy order): hand-set
    weights for known-answer tests, or a rolled gate bias in a copy of a model."""
    from kvphase.errors import PlanError
    from kvphase.gguf.header import read_gguf_header
    from kvphase.gguf.tensors import GGML_TYPE_F32

    info = next((t for t in read_gguf_header(path).tensors if t.name == name), None)
    if info is None:
        raise PlanError(f"{path} has no tensor {name}")
    values = np.asarray(array, dtype=np.float32)
    if info.type_id != GGML_TYPE_F32 or values.shape != tuple(reversed(info.shape)):
        raise PlanError(f"{name} in {path} is type {info.type_id} of shape {tuple(reversed(info.shape))}; "
                        f"can only overwrite F32 with the same shape, got {values.shape}")
    data = np.memmap(path, dtype=np.uint8, mode="r+", offset=info.data_offset, shape=(info.n_bytes,))
    data[:] = values.reshape(-1).view(np.uint8)
    data.flush()
