"""Damaged and crafted GGUF files, built byte by byte: the fuzz tests' corpus and the seeds
of `scripts/fuzz_campaign.py`.

The bytes are assembled here with `struct`, independently of kvphase's reader, so a
reader bug cannot hide in the way the test files are made.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
UINT8, UINT32, FLOAT32, STRING, ARRAY, INT64, FLOAT64 = 0, 4, 6, 8, 9, 11, 12


def s(text: str | bytes) -> bytes:
    """A GGUF string: uint64 length, then the bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def value(t: int, v) -> tuple[int, bytes]:
    """(type id, encoded value) of a scalar or string metadata value."""
    return t, (s(v) if t == STRING else struct.pack("<" + SCALAR[t], v))


def nested_array(depth: int) -> bytes:
    """An array value nesting arrays `depth` deep, each of one element, ending in one uint8."""
    return b"".join(struct.pack("<IQ", ARRAY, 1) for _ in range(depth - 1)) + struct.pack("<IQB", UINT8, 1, 7)


def gguf_bytes(fields: list[tuple[str, int, bytes]], tensors: list[tuple[str, tuple, int, int]] = (),
               version: int = 3, n_tensors: int | None = None, n_fields: int | None = None, data: bytes = b"") -> bytes:
    """A GGUF file from raw pieces: fields as (key, type id, encoded value), tensors as
    (name, shape in ggml order, ggml type id, data offset); the data section padded to 32."""
    out = [b"GGUF", struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                len(fields) if n_fields is None else n_fields)]
    for key, t, encoded in fields:
        out += [s(key), struct.pack("<I", t), encoded]
    for name, shape, type_id, offset in tensors:
        out += [s(name), struct.pack("<I", len(shape)), *(struct.pack("<q", d) for d in shape),
                struct.pack("<IQ", type_id, offset)]
    head = b"".join(out)
    return head + b"\0" * (-len(head) % 32) + data


ARCH = [("general.architecture", *value(STRING, "llama"))]
F32_TENSOR = [("t", (4,), 0, 0)]  # four F32 values at the start of the data section


def valid_file() -> bytes:
    """A small well-formed file: metadata of every kind and one F32 tensor."""
    fields = ARCH + [("general.name", *value(STRING, "tiny")), ("llama.block_count", *value(UINT32, 2)),
                     ("llama.context_length", *value(UINT32, 256)), ("x.float", *value(FLOAT32, 0.5)),
                     ("x.list", ARRAY, struct.pack("<IQ", UINT32, 3) + struct.pack("<3I", 1, 2, 3)),
                     ("x.words", ARRAY, struct.pack("<IQ", STRING, 2) + s("a") + s("bc"))]
    return gguf_bytes(fields, F32_TENSOR, data=struct.pack("<4f", 1, 2, 3, 4))


def crafted_files() -> dict[str, bytes]:
    """Files a hostile or broken converter could write: name -> bytes. Each must give a clean
    result or one GGUFError line, never a traceback, a crash or a minute-long parse."""
    name = lambda text: gguf_bytes(ARCH + [("general.name", STRING, s(text))])  # noqa: E731
    field = lambda key, t, v: gguf_bytes(ARCH + [(key, *value(t, v))])  # noqa: E731
    return {
        "empty file": b"",
        "three bytes": b"GGU",
        "magic only": b"GGUF",
        "version only": b"GGUF" + u32(3),
        "nothing declared": gguf_bytes([]),
        "version 1": gguf_bytes(ARCH, version=1),
        "version 2^32-1": gguf_bytes(ARCH, version=2**32 - 1),
        "nested arrays 100000 deep": gguf_bytes([("x", ARRAY, nested_array(100_000))]),
        "nested arrays 3 deep": gguf_bytes(ARCH + [("x", ARRAY, nested_array(3))]),
        "array of 2^60 uint8": gguf_bytes([("x", ARRAY, struct.pack("<IQ", UINT8, 2**60))]),
        "array of 2^40 strings": gguf_bytes([("x", ARRAY, struct.pack("<IQ", STRING, 2**40))]),
        "array of item type 99": gguf_bytes([("x", ARRAY, struct.pack("<IQ", 99, 1))]),
        "string of 2^63 bytes": gguf_bytes([("general.name", STRING, struct.pack("<Q", 2**63))]),
        "20 MB general.name": name("n" * 20_000_000),
        "name with rich markup [/x]": name("x[/x]y[/]"),
        "name with [red]": name("[red]red[/red] [bold]"),
        "name with terminal escapes": name("\x1b[2J\x1b]0;owned\x07\x1b[31mred\r\nline\x00"),
        "architecture with markup": gguf_bytes([("general.architecture", *value(STRING, "[/x]\x1b[31m"))]),
        "invalid utf-8 name": name(b"\xff\xfe\xc3"),
        "alignment 0": field("general.alignment", UINT32, 0),
        "alignment 3": field("general.alignment", UINT32, 3),
        "alignment as string": field("general.alignment", STRING, "32"),
        "alignment as float NaN": field("general.alignment", FLOAT32, math.nan),
        "block_count NaN": field("llama.block_count", FLOAT32, math.nan),
        "block_count string": field("llama.block_count", STRING, "many"),
        "context_length string": field("llama.context_length", STRING, "8k"),
        "context_length -1": field("llama.context_length", INT64, -1),
        "vocab_size NaN": field("llama.vocab_size", FLOAT64, math.nan),
        "file_type string": field("general.file_type", STRING, "Q4"),
        "file_type inf": field("general.file_type", FLOAT64, math.inf),
        "tokens an array of arrays": gguf_bytes(ARCH + [("tokenizer.ggml.tokens", ARRAY, nested_array(2))]),
        "unknown value type": gguf_bytes([("x", 77, b"\0" * 8)]),
        "empty key": gguf_bytes([("", *value(UINT32, 1))]),
        "duplicate key": gguf_bytes(ARCH + ARCH),
        "metadata count beyond the fields": gguf_bytes(ARCH, n_fields=5),
        "metadata count 2^63": gguf_bytes(ARCH, n_fields=2**63),
        "tensor with 9 dimensions": gguf_bytes(ARCH, [("t", (1,) * 9, 0, 0)]),
        "tensor with a negative dimension": gguf_bytes(ARCH, [("t", (-4, 2), 0, 0)]),
        "tensor of 2^62 x 2^62 elements": gguf_bytes(ARCH, [("t", (2**62, 2**62), 0, 0)]),
        "tensor of unknown type 999": gguf_bytes(ARCH, [("t", (4,), 999, 0)]),
        "tensor beyond the end": gguf_bytes(ARCH, [("t", (1024,), 0, 0)], data=b"\0" * 64),
        "tensor at offset 2^63": gguf_bytes(ARCH, [("t", (4,), 0, 2**63)], data=b"\0" * 64),
        "unaligned tensor offset": gguf_bytes(ARCH, [("t", (4,), 0, 3)], data=b"\0" * 64),
        "Q4_0 tensor of 5 elements": gguf_bytes(ARCH, [("t", (5,), 2, 0)], data=b"\0" * 64),
        "duplicate tensor names": gguf_bytes(ARCH, [("t", (4,), 0, 0), ("t", (4,), 0, 32)], data=b"\0" * 64),
        "tensor name of 4 KB": gguf_bytes(ARCH, [("t" * 4096, (4,), 0, 0)], data=b"\0" * 64),
        "tensor count beyond the records": gguf_bytes(ARCH, n_tensors=3),
        "tensor count 2^63": gguf_bytes(ARCH, n_tensors=2**63),
    }


@dataclass(frozen=True)
class FieldAt:
    """Where one metadata value sits in a file."""

    key: str
    type_offset: int  # offset of the value-type id
    value_offset: int  # offset of the value (of the item type, for an array)
    value_type: int


def layout(path: Path) -> tuple[dict[str, FieldAt], int]:
    """(metadata fields by key, offset where the header ends) of a well-formed file, walked
    here independently of kvphase's reader; targeted edits overwrite bytes at these offsets."""
    data = path.read_bytes()
    pos = 8

    def take(fmt):
        nonlocal pos
        out = struct.unpack_from("<" + fmt, data, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return out

    def skip_value(t):
        nonlocal pos
        if t == STRING:
            n = take("Q")  # not `pos += take(...)`: that adds to pos as it was before take moved it
            pos += n
        elif t == ARRAY:
            item, count = take("I"), take("Q")
            if item in SCALAR:
                pos += struct.calcsize("<" + SCALAR[item]) * count
            else:
                for _ in range(count):
                    skip_value(item)
        else:
            pos += struct.calcsize("<" + SCALAR[t])

    n_tensors, n_fields = take("Q"), take("Q")
    fields = {}
    for _ in range(n_fields):
        n = take("Q")
        key = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        type_offset = pos
        t = take("I")
        fields[key] = FieldAt(key, type_offset, pos, t)
        skip_value(t)
    for _ in range(n_tensors):
        n = take("Q")
        pos += n
        n_dims = take("I")
        pos += 8 * n_dims + 4 + 8
    return fields, pos


def patched(src: Path, dst: Path, edits: list[tuple[int, bytes]], truncate: int | None = None) -> Path:
    """A copy of src with bytes overwritten at offsets, optionally cut short."""
    with src.open("rb") as f:
        data = bytearray(f.read() if truncate is None else f.read(truncate))
    for offset, new in edits:
        data[offset:offset + len(new)] = new
    dst.write_bytes(bytes(data))
    return dst


def split_gguf(model, folder, tensors_per_shard: int):
    """`model` rewritten as a split GGUF by the gguf package's writer (llama.cpp's shard names)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(model)
    writer = GGUFWriter(str(folder / "split.gguf"), str(reader.fields["general.architecture"].contents()),
                        split_max_tensors=tensors_per_shard)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(folder.glob("split-*-of-*.gguf"))
