"""Writing GGUF files: metadata and weights to a file llama.cpp loads.

`write_gguf` writes keys by their string (the PyPI gguf package does not know every
architecture kvphase writes, see `kvphase.gguf.tiny`); `export_f32` rewrites a model
with every tensor dequantized to F32, as the reference model reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from kvphase.gguf.keys import Keys
from kvphase.runfolder.files import save_atomic


def write_gguf(path: str | Path, arch: str, keys: Mapping[str, object], tensors: Iterable[tuple[str, np.ndarray]]) -> None:
    """Write `keys` (bool, int as uint32, float as float32, str, or a list) and the named
    `tensors` (numpy order) to a GGUF file of architecture `arch`."""
    import gguf

    def write(tmp: Path) -> None:
        writer = gguf.GGUFWriter(str(tmp), arch)
        for key, value in keys.items():
            _add_key(writer, key, value)
        for name, array in tensors:
            writer.add_tensor(name, array)
        _write_out(writer)

    save_atomic(Path(path), write)


def _write_out(writer) -> None:
    """A GGUFWriter's header, keys and tensors to its file; the file is closed however it ends
    (a full disk fails a write: the temporary file is then removed, `save_atomic`)."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
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
    from gguf import LlamaFileType

    _rewrite(src, dst, LlamaFileType.ALL_F32, lambda name, values: (values, None))


QUANTIZED_TYPES = ("Q8_0", "Q4_0")  # what `quantize_file` writes (the gguf package's own quantizers)
KEPT_F32 = ("_ape.", "hc_", "ffn_gate_inp", "exp_probs")  # small tables read by row or mixed as they are


def quantize_file(src: str | Path, dst: str | Path, type_name: str) -> None:
    """Write `src` again with its matrices quantized to `type_name` (Q8_0 or Q4_0), as llama-quantize
    does with its default rules for small models: every 2-D (or 3-D) weight whose rows hold whole
    blocks; vectors, gate biases and mixing tables stay F32."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType
    from gguf.quants import quantize

    from kvphase.errors import PlanError

    if type_name not in QUANTIZED_TYPES:
        raise PlanError(f"unknown quantization {type_name!r}; expected one of {', '.join(QUANTIZED_TYPES)}")
    qtype = GGMLQuantizationType[type_name]
    block = GGML_QUANT_SIZES[qtype][0]

    def convert(name: str, values: np.ndarray):
        if values.ndim < 2 or values.shape[-1] % block or any(part in name for part in KEPT_F32):
            return values, None
        return quantize(values, qtype), qtype

    _rewrite(src, dst, LlamaFileType[f"MOSTLY_{type_name}"], convert)


def _rewrite(src: str | Path, dst: str | Path, file_type, convert) -> None:
    """Copy `src`'s metadata to `dst` and each tensor as convert(name, F32 values) -> (data, raw dtype or None)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    reader = GGUFReader(src)
    arch = str(reader.fields[Keys.General.ARCHITECTURE].contents())

    def write(tmp: Path) -> None:
        writer = GGUFWriter(str(tmp), arch)
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name in (Keys.General.ARCHITECTURE, Keys.General.FILE_TYPE):
                continue
            kind = field.types[0]
            sub_type = field.types[-1] if kind == GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
        writer.add_file_type(file_type)
        for tensor in reader.tensors:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            data, raw_dtype = convert(tensor.name, values.reshape([int(d) for d in tensor.shape[::-1]]))
            writer.add_tensor(tensor.name, data, raw_dtype=raw_dtype)
        _write_out(writer)

    save_atomic(Path(dst), write)


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
