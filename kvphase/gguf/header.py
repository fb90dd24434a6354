"""A fast reader of a GGUF file's header: metadata and tensor records, no tensor data.

gguf's GGUFReader builds a view per array element, which takes seconds on a large
vocabulary; `inspect` must be instant even on a 300 GB file, so the header is parsed
here in one pass. Large arrays (vocabularies, merges) keep only their length
(`<key>_count`), long strings only their head; everything else keeps its value.

The reader is total: any byte string gives a header or a `GGUFError` naming the offset
and what was expected there. Every length is checked against the bytes left in the
file before anything is read or allocated, and arrays nest at most `MAX_ARRAY_DEPTH`
deep, so a damaged or crafted file can neither exhaust memory nor recurse without end.
The checks mirror what llama.cpp's `ggml/src/gguf.cpp` refuses (llama-cpp-python 0.3.36).

The header is the head of the file, so the head is all it needs: a URL is read by HTTP ranges
(kvphase.gguf.remote) and, for `inspect` and `kvphase header` (`partial=True`), a file cut
inside its tensor data (`head -c 100M model.gguf`) is read as a whole one. A file cut inside
its metadata or tensor table is refused with the part it ends in.
"""

from __future__ import annotations

import math
import re
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, NamedTuple

from kvphase.errors import GGUFError, ModelFileError
from kvphase.gguf.keys import Keys
from kvphase.gguf.remote import RemoteFile, Url, is_url

GGUF_MAGIC = b"GGUF"
KEPT_ARRAY_LIMIT = 4096  # longer arrays are summarised by their length
KEPT_STRING_LIMIT = 1 << 16  # characters kept of a longer string value (chat templates fit)
MAX_KEY_LENGTH = 1 << 16  # bytes; real keys are tens of bytes
MAX_ARRAY_DEPTH = 3  # arrays of arrays of arrays; llama.cpp itself reads no nested array
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name is shorter
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
COUNTS = "version and counts"  # the first 24 bytes after the magic, as a truncation names them
WINDOW = 1 << 20  # bytes read ahead at a time
# what `kvphase header` writes in place of the tensors (kvphase.gguf.header_only): one record a tensor,
# "TYPE D0,D1,... NAME", and the size of the file whose weights were left out
LISTED_TENSORS = "kvphase.header_only.tensors"
SOURCE_SIZE = "kvphase.header_only.source_size"
_U64 = struct.Struct("<Q")

# GGUFValueType ids -> struct format (strings and arrays handled apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
               8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}


class TensorInfo(NamedTuple):
    """One tensor record of the header."""

    name: str
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    type_id: int  # GGMLQuantizationType value
    data_offset: int  # absolute offset in the file; -1 in a header-only file (no data)
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class GGUFHeader(NamedTuple):
    path: Path | Url
    file_size: int
    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]
    types: dict[str, int] = {}  # key -> GGUF value type id (9 for arrays), for type checks
    spans: dict[str, tuple[int, int]] = {}  # key -> the bytes [start, end) of its record in the file
    source_size: int | None = None  # a header-only file: the size of the model it describes
    needed_size: int | None = None  # a file cut inside its tensor data (read with partial=True): the whole file's size

    @property
    def header_only(self) -> bool:
        """Written by `kvphase header`: metadata, vocabulary and tensor records, no weights."""
        return self.source_size is not None

    @property
    def model_size(self) -> int:
        """Bytes of the whole model: this file's, the size a header-only file records, or where
        the data of a file cut short would end."""
        return self.source_size or self.needed_size or self.file_size


def read_gguf_header(path: str | Path, in_full: tuple[str, ...] = (), partial: bool = False) -> GGUFHeader:
    """Parse the header of a file or of an http(s) URL (fetching only the header's bytes);
    ModelFileError for a missing or unreadable file or URL, GGUFError for a non-GGUF, corrupt
    or truncated one (with the offset and what was expected there).
    Keys that start with a prefix in `in_full` keep every item and whole strings (a tokenizer
    to copy: gguf's GGUFReader takes seconds over a vocabulary, this a tenth of one).
    `partial`: a file cut inside its tensor data (the head of a model, whole up to its tensor
    table) is read, its `needed_size` telling how far the data would go; without it such a file
    is refused as truncated, as whatever reads weights must."""
    location = model_location(path)
    with open_model_file(location) as f:
        return parse_gguf_header(f, location, in_full, partial)


def model_location(path: str | Path) -> Path | Url:
    """A command line's MODEL: an http(s) URL, or a file's path."""
    if is_url(path):
        return Url(path)
    if isinstance(path, str) and re.match(r"[A-Za-z][A-Za-z0-9+.-]+://", path):
        raise ModelFileError(f"not a model file or an http(s) URL: {path}")
    return Path(path)


@contextmanager
def open_model_file(location: Path | Url) -> Iterator[BinaryIO]:
    """The model's bytes, as a file: a local one (ModelFileError when missing or unreadable),
    or a URL's, fetched by ranges as they are read (kvphase.gguf.remote)."""
    if isinstance(location, Url):
        with RemoteFile(location) as f:
            yield f
        return
    try:
        if not location.exists():
            raise ModelFileError(f"model file not found: {location}")
        if not location.is_file():
            raise ModelFileError(f"model path is not a file: {location}")
        with location.open("rb") as f:
            yield f
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {location}: {exc.strerror or exc}") from None


def parse_gguf_header(f: BinaryIO, location: Path | Url, in_full: tuple[str, ...] = (),
                      partial: bool = False) -> GGUFHeader:
    """`read_gguf_header` on a file already open (a header-only copy then reads its metadata's
    bytes from it, fetched once)."""
    size = _file_size(f)
    magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"not a GGUF file: {location} (expected magic {GGUF_MAGIC!r} at offset 0, found {magic!r})")
    return _Parser(f, location, size, in_full, partial).header()


def _file_size(f: BinaryIO) -> int:
    size = f.seek(0, 2)
    f.seek(0)
    return size


class _Parser:
    """One pass over the header; every read is bounds-checked against the file size."""

    def __init__(self, f: BinaryIO, path: Path | Url, size: int, in_full: tuple[str, ...] = (), partial: bool = False):
        self.f, self.path, self.size, self.in_full, self.partial = f, path, size, in_full, partial
        self.pos = 4  # after the magic
        self.section = COUNTS  # the part being read, which a truncation's message names: then "metadata", "tensor table"
        self.window, self.base = b"", 0  # file bytes [base, base + len(window)), read ahead in WINDOW steps
        self.fields: dict[str, Any] = {}
        self.types: dict[str, int] = {}
        self.spans: dict[str, tuple[int, int]] = {}

    def fail(self, offset: int, message: str) -> GGUFError:
        return GGUFError(f"corrupt GGUF file: {self.path} (offset {offset}: {message})")

    def beyond_end(self, offset: int, message: str) -> GGUFError:
        """A length or count larger than the rest of the file: cut short, or a damaged number. (A count
        in the first 24 bytes too large for the file says it is short, not in which part it ends.)"""
        where = "is cut short" if self.section == COUNTS else f"ends inside its {self.section}"
        return GGUFError(f"truncated GGUF file: {self.path} {where} (offset {offset}: {message}; or that number is corrupt)")

    def truncated(self, offset: int, expected: str) -> GGUFError:
        return GGUFError(f"truncated GGUF file: {self.path} ends inside its {self.section} (offset {offset}: expected "
                         f"{expected}, but the file ends at {self.size} bytes)")

    @property
    def left(self) -> int:
        return self.size - self.pos

    def header(self) -> GGUFHeader:
        version = self.scalar("I", "the GGUF version")
        if version not in (2, 3):
            raise self.fail(4, f"expected GGUF version 2 or 3, found {version}")
        n_tensors = self.count("Q", "the tensor count", min_bytes=8 + 4 + 4 + 8)
        n_fields = self.count("Q", "the metadata count", min_bytes=8 + 4)
        self.section = "metadata"
        for _ in range(n_fields):
            self.field()
        self.section = "tensor table"
        alignment = self.alignment()
        if n_tensors == 0 and LISTED_TENSORS in self.fields:
            return GGUFHeader(self.path, self.size, version, self.fields, self.listed_tensors(), self.types,
                              self.spans, self.integer_field(SOURCE_SIZE))
        raw = [self.tensor_record() for _ in range(n_tensors)]
        names = [name for name, *_ in raw]
        if len(set(names)) < len(names):
            duplicate = next(n for n in names if names.count(n) > 1)
            raise GGUFError(f"corrupt GGUF file: {self.path} (tensor name {duplicate!r} appears twice)")
        data_start = -(-self.pos // alignment) * alignment
        tensors = []
        for name, shape, type_id, offset, at in raw:
            tensor = TensorInfo(name, shape, type_id, data_start + offset, _tensor_bytes(shape, type_id))
            if offset % alignment:
                raise self.fail(at, f"tensor {name!r} data offset {offset} is not a multiple of the alignment "
                                f"{alignment}")
            if tensor.data_offset + tensor.n_bytes > self.size and not self.partial:
                raise GGUFError(f"truncated GGUF file: {self.path} ends inside its tensor data (tensor {name!r} needs "
                                f"bytes up to {tensor.data_offset + tensor.n_bytes}, file has {self.size})")
            tensors.append(tensor)
        data_end = max((t.data_offset + t.n_bytes for t in tensors), default=0)
        whole_size = -(-data_end // alignment) * alignment  # llama.cpp and gguf-py pad the last tensor too
        if isinstance(self.path, Url) and self.size > whole_size + alignment:
            raise ModelFileError(f"cannot read model URL {self.path}: the server states a size of {self.size:,} bytes, "
                                 f"but its tensor table ends at byte {whole_size:,}; not the file it names")
        return GGUFHeader(self.path, self.size, version, self.fields, tensors, self.types, self.spans,
                          needed_size=whole_size if data_end > self.size else None)

    def listed_tensors(self) -> list[TensorInfo]:
        """A header-only file's tensor records, checked as the records themselves are."""
        tensors = []
        for record in self.fields[LISTED_TENSORS]:
            try:
                type_text, dims, name = record.split(" ", 2)
                shape, type_id = tuple(int(d) for d in dims.split(",")), int(type_text)
            except (AttributeError, ValueError):
                raise GGUFError(f"corrupt header-only file: {self.path} ({LISTED_TENSORS} holds {str(record)[:60]!r}, "
                                "expected 'TYPE D0,D1,... NAME'") from None
            block = _block_size(type_id)
            if block is None or len(shape) > MAX_DIMS or any(d < 0 for d in shape) or shape[0] % block[0]:
                raise GGUFError(f"corrupt header-only file: {self.path} (tensor {name!r}: type {type_id}, shape {shape})")
            tensors.append(TensorInfo(name, shape, type_id, -1, _tensor_bytes(shape, type_id)))
        return tensors

    def integer_field(self, key: str) -> int:
        value = self.fields.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise GGUFError(f"corrupt header-only file: {self.path} ({key} must be a byte count, found {value!r})")
        return value

    def read(self, n: int, expected: str) -> bytes:
        """The next n bytes; a vocabulary of small strings is read through one window, not
        one file call per string."""
        at = self.pos
        if n > self.size - at:
            raise self.truncated(at, expected)
        if at < self.base or at + n > self.base + len(self.window):
            self.f.seek(at)
            self.window, self.base = self.f.read(max(n, WINDOW)), at
            if len(self.window) < n:  # the file shrank while we read it
                raise self.truncated(at, expected)
        self.pos = at + n
        return self.window[at - self.base:at - self.base + n]

    def skip(self, n: int, expected: str) -> None:
        if n > self.size - self.pos:
            raise self.truncated(self.pos, expected)
        self.pos += n

    def scalar(self, fmt: str, expected: str):
        return struct.unpack("<" + fmt, self.read(struct.calcsize("<" + fmt), expected))[0]

    def count(self, fmt: str, expected: str, min_bytes: int) -> int:
        """A count of items that take at least `min_bytes` each, so it cannot exceed what is left."""
        at = self.pos
        n = self.scalar(fmt, expected)
        if n * min_bytes > self.left:
            raise self.beyond_end(at, f"{expected} is {n}, more than the {self.left} bytes left can hold")
        return n

    def string(self, expected: str, limit: int | None = None) -> str:
        """A length-prefixed UTF-8 string; beyond `limit` characters only the head is kept."""
        at = self.pos
        n = self.scalar("Q", f"the length of {expected}")
        if n > self.left:
            raise self.beyond_end(at, f"{expected} is {n} bytes long, more than the {self.left} bytes left")
        if limit is not None and n > limit:
            head = self.read(limit, expected)
            self.skip(n - limit, expected)
            return head.decode("utf-8", errors="replace") + f"... ({n} bytes)"
        return self.read(n, expected).decode("utf-8", errors="replace")

    def whole(self, key: str) -> bool:
        """Whether `key` keeps every item and whole strings (a prefix in `in_full`; none by default)."""
        return key.startswith(self.in_full)

    def field(self) -> None:
        at = self.pos
        key = self.string("a metadata key")
        if not key or len(key) > MAX_KEY_LENGTH:
            raise self.fail(at, f"expected a metadata key of 1 to {MAX_KEY_LENGTH} bytes, found {len(key)}")
        if key in self.types:
            raise self.fail(at, f"duplicate metadata key {key!r}")
        type_at = self.pos
        value_type = self.scalar("I", f"the type of {key!r}")
        self.types[key] = value_type
        if value_type == _ARRAY:
            count, values = self.array(key, depth=1)
            self.fields[f"{key}_count"] = count
            if values is not None:
                self.fields[key] = values
        elif value_type == _STRING:
            self.fields[key] = self.string(f"the value of {key!r}", limit=None if self.whole(key) else KEPT_STRING_LIMIT)
        elif value_type in _SCALARS:
            self.fields[key] = self.scalar(_SCALARS[value_type], f"the value of {key!r}")
        else:
            raise self.fail(type_at, f"expected a GGUF value type 0-12 for {key!r}, found {value_type}")
        self.spans[key] = (at, self.pos)

    def array(self, key: str, depth: int) -> tuple[int, list | None]:
        """(count, values); values is None for an array longer than KEPT_ARRAY_LIMIT."""
        at = self.pos
        item_type = self.scalar("I", f"the item type of array {key!r}")
        if item_type == _ARRAY and depth >= MAX_ARRAY_DEPTH:
            raise self.fail(at, f"array {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        if item_type not in _SCALARS and item_type not in (_STRING, _ARRAY):
            raise self.fail(at, f"expected an array item type 0-12 for {key!r}, found {item_type}")
        item_bytes = struct.calcsize("<" + _SCALARS[item_type]) if item_type in _SCALARS else 8 if item_type == _STRING else 12
        count = self.count("Q", f"the length of array {key!r}", min_bytes=item_bytes)
        whole = self.whole(key)
        keep = count <= KEPT_ARRAY_LIMIT or key == LISTED_TENSORS or whole
        what = f"an item of array {key!r}"
        if item_type in _SCALARS:
            fmt = _SCALARS[item_type]
            if not keep:
                self.skip(item_bytes * count, what)
                return count, None
            return count, list(struct.unpack(f"<{count}{fmt}", self.read(item_bytes * count, what)))
        if item_type == _STRING:
            if not keep:
                self.skip_strings(count, what)
                return count, None
            limit = None if whole else KEPT_STRING_LIMIT
            return count, [self.string(what, limit=limit) for _ in range(count)]
        items = [self.array(key, depth + 1) for _ in range(count)]
        return count, [values for _, values in items] if keep else None

    def skip_strings(self, count: int, what: str) -> None:
        """Step over `count` length-prefixed strings. A vocabulary holds 10^5 of them, so the
        lengths are read straight from the window; `scalar` refills it when one crosses its end."""
        length_at = _U64.unpack_from
        for _ in range(count):
            at, rel = self.pos, self.pos - self.base
            if 0 <= rel and rel + 8 <= len(self.window):
                n, self.pos = length_at(self.window, rel)[0], at + 8
            else:
                n = self.scalar("Q", what)
            if n > self.size - self.pos:
                raise self.beyond_end(at, f"{what} is {n} bytes long, more than the {self.left} bytes left")
            self.pos += n

    def alignment(self) -> int:
        """general.alignment as llama.cpp requires it: a uint32 power of two."""
        if Keys.General.ALIGNMENT not in self.fields:
            return DEFAULT_ALIGNMENT
        value, value_type = self.fields[Keys.General.ALIGNMENT], self.types[Keys.General.ALIGNMENT]
        if value_type != _UINT32:
            raise GGUFError(f'corrupt GGUF file: {self.path} ({Keys.General.ALIGNMENT} must be a uint32, found {_TYPE_NAMES.get(value_type, value_type)})')
        if value == 0 or value & (value - 1):
            raise GGUFError(f'corrupt GGUF file: {self.path} ({Keys.General.ALIGNMENT} must be a power of two, found {value})')
        return value

    def tensor_record(self) -> tuple[str, tuple[int, ...], int, int, int]:
        at = self.pos
        name = self.string("a tensor name")
        if len(name.encode()) >= MAX_NAME:
            raise self.fail(at, f"expected a tensor name shorter than {MAX_NAME} bytes, found {len(name.encode())}")
        n_dims = self.scalar("I", f"the dimension count of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise self.fail(at, f"tensor {name!r} has {n_dims} dimensions, expected at most {MAX_DIMS}")
        shape = tuple(self.scalar("q", f"a dimension of tensor {name!r}") for _ in range(n_dims))
        if any(d < 0 for d in shape):
            raise self.fail(at, f"tensor {name!r} has a negative dimension: {shape}")
        type_at = self.pos
        type_id = self.scalar("I", f"the type of tensor {name!r}")
        block = _block_size(type_id)
        if block is None:
            raise self.fail(type_at, f"tensor {name!r} has unknown ggml type {type_id}")
        if shape and shape[0] % block[0]:
            raise self.fail(at, f"tensor {name!r} has {shape[0]} elements per row, not a multiple of its "
                            f"type's block size {block[0]}")
        if math.prod(shape) >= 2**63:  # gguf.cpp: the element count must fit in an int64
            raise self.fail(at, f"tensor {name!r} has shape {shape}: more than 2^63 elements")
        offset = self.scalar("Q", f"the data offset of tensor {name!r}")
        return name, shape, type_id, offset, at


def _block_size(type_id: int) -> tuple[int, int] | None:
    """(elements per block, bytes per block) of a ggml type, None when unknown."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None


def _tensor_bytes(shape: tuple[int, ...], type_id: int) -> int:
    block_size, type_size = _block_size(type_id)
    return math.prod(shape) // block_size * type_size
