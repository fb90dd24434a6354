"""A fast reader of a GGUF file's header: metadata and tensor records, no tensor data.

gguf's GGUFReader builds a view per array element, which takes seconds on a large
vocabulary; `inspect` must be instant even on a 300 GB file, so the header is parsed
here in one pass. Large string arrays (vocabularies, merges) keep only their length
(`<key>_count`); everything else keeps its value.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from kvphase.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
KEPT_ARRAY_LIMIT = 4096  # longer arrays are summarised by their length

# GGUFValueType ids -> struct format (strings and arrays handled apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class TensorInfo(NamedTuple):
    """One tensor record of the header."""

    name: str
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    type_id: int  # GGMLQuantizationType value
    data_offset: int  # absolute offset in the file
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class GGUFHeader(NamedTuple):
    path: Path
    file_size: int
    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]


class _Truncated(Exception):
    pass


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Parse the header; raise ModelFileError for a missing, non-GGUF, corrupt or truncated file."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"model path is not a file: {path}")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF file: {path} (expected magic {GGUF_MAGIC!r}, found {magic!r})")
        try:
            header = _parse(f, path, size)
        except _Truncated:
            raise ModelFileError(f"truncated GGUF file: {path} (the header ends early, file has {size} bytes)") from None
        except (UnicodeDecodeError, ValueError, OverflowError, MemoryError) as exc:
            raise ModelFileError(f"corrupt GGUF file: {path} ({exc})") from None
    needed = max((t.data_offset + t.n_bytes for t in header.tensors), default=0)
    if needed > size:
        raise ModelFileError(f"truncated GGUF file: {path} (tensor data needs {needed} bytes, file has {size})")
    return header


def _parse(f: BinaryIO, path: Path, size: int) -> GGUFHeader:
    version = _read(f, "I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}, expected 2 or 3")
    n_tensors, n_fields = _read(f, "Q"), _read(f, "Q")
    if n_tensors > size or n_fields > size:
        raise ValueError(f"impossible counts: {n_tensors} tensors, {n_fields} fields in {size} bytes")
    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        key = _read_string(f)
        value_type = _read(f, "I")
        if value_type == _ARRAY:
            item_type, count = _read(f, "I"), _read(f, "Q")
            fields[f"{key}_count"] = count
            values = _read_array(f, item_type, count)
            if values is not None:
                fields[key] = values
        else:
            fields[key] = _read_value(f, value_type)
    raw = [_read_tensor_record(f) for _ in range(n_tensors)]
    alignment = int(fields.get("general.alignment", 32))
    data_start = -(-f.tell() // alignment) * alignment
    tensors = [TensorInfo(n, s, t, data_start + off, _tensor_bytes(s, t)) for n, s, t, off in raw]
    return GGUFHeader(path, size, version, fields, tensors)


def _read(f: BinaryIO, fmt: str):
    n = struct.calcsize("<" + fmt)
    data = f.read(n)
    if len(data) < n:
        raise _Truncated
    return struct.unpack("<" + fmt, data)[0]


def _read_string(f: BinaryIO) -> str:
    n = _read(f, "Q")
    data = f.read(n)
    if len(data) < n:
        raise _Truncated
    return data.decode("utf-8")


def _read_value(f: BinaryIO, value_type: int) -> Any:
    if value_type == _STRING:
        return _read_string(f)
    if value_type in _SCALARS:
        return _read(f, _SCALARS[value_type])
    raise ValueError(f"unknown GGUF value type {value_type}")


def _read_array(f: BinaryIO, item_type: int, count: int) -> list | None:
    if item_type == _STRING:
        if count > KEPT_ARRAY_LIMIT:
            for _ in range(count):
                n = _read(f, "Q")
                f.seek(n, 1)
            return None
        return [_read_string(f) for _ in range(count)]
    if item_type in _SCALARS:
        fmt = _SCALARS[item_type]
        n = struct.calcsize("<" + fmt) * count
        data = f.read(n) if count <= KEPT_ARRAY_LIMIT else (f.seek(n, 1), b"")[1]
        if count > KEPT_ARRAY_LIMIT:
            return None
        if len(data) < n:
            raise _Truncated
        return list(struct.unpack(f"<{count}{fmt}", data))
    if item_type == _ARRAY:
        return [_read_array(f, _read(f, "I"), _read(f, "Q")) for _ in range(count)]
    raise ValueError(f"unknown GGUF array item type {item_type}")


def _read_tensor_record(f: BinaryIO) -> tuple[str, tuple[int, ...], int, int]:
    name = _read_string(f)
    n_dims = _read(f, "I")
    if n_dims > 8:
        raise ValueError(f"tensor {name!r} has {n_dims} dimensions, expected at most 8")
    shape = tuple(_read(f, "Q") for _ in range(n_dims))
    return name, shape, _read(f, "I"), _read(f, "Q")


def _tensor_bytes(shape: tuple[int, ...], type_id: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown tensor type id {type_id}") from None
    n = 1
    for d in shape:
        n *= d
    return n // block_size * type_size
