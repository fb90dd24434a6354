"""A model's header without its weights (`kvphase header`): for a model you do not hold.

A sweep through running servers (`--backend server`) reads only the model's metadata and
vocabulary on the machine that plans the prompts; for a 300 GB model that is a few MB of it.
`write_header_only` copies those bytes as they are, and in place of the tensor table writes
the tensors' names, types and shapes under one kvphase key (`LISTED_TENSORS`) and the source's
size (`SOURCE_SIZE`). llama.cpp reads the result as a model without tensors: its vocabulary
loads (`vocab_only`), the same token for token, and nothing tries to read a weight. A split
model's first shard lists the other shards' tensors too; the `split.*` keys are left out, so
llama.cpp does not look for the other shards.

The model need not be here: its URL (only the header's bytes are fetched, by HTTP ranges) or
its head (`curl -r 0-99999999 URL`, any cut after the tensor table) serves as well.

What needs the weights (the in-process backend, the reference, `validate`, the probes) refuses
such a file in one line (`require_weights`, and `tensor_array` for any tensor read).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import NamedTuple

from kvphase.errors import ModelFileError, PlanError
from kvphase.gguf.header import (DEFAULT_ALIGNMENT, GGUF_MAGIC, LISTED_TENSORS, SOURCE_SIZE, GGUFHeader, TensorInfo,
                                 model_location, open_model_file, parse_gguf_header, read_gguf_header)
from kvphase.gguf.keys import Keys
from kvphase.gguf.remote import Url
from kvphase.runfolder.files import save_atomic

SPLIT_KEYS = (Keys.Split.LLM_KV_SPLIT_NO, Keys.Split.LLM_KV_SPLIT_COUNT, Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
SHARD_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's llama_split_path
GGUF_STRING, GGUF_ARRAY, GGUF_UINT64 = 8, 9, 10
SERVES = "it serves `inspect`, `sweep --dry-run` and `sweep --backend server`"


class HeaderOnly(NamedTuple):
    """What `write_header_only` wrote."""

    path: Path
    size: int  # bytes of the header-only file
    source_size: int  # bytes of the model, every shard
    n_tensors: int
    n_shards: int


def write_header_only(source: str | Path, out: str | Path) -> HeaderOnly:
    """Write `out`: `source`'s metadata and vocabulary, its tensors listed, no weights. `source` is
    a file, whole or cut anywhere after its tensor table, or an http(s) URL, of which only the
    header's bytes are fetched (each shard's, for a split model)."""
    source, out = model_location(source), Path(out)
    with open_model_file(source) as f:
        header = parse_gguf_header(f, source, partial=True)
        if header.header_only:
            raise PlanError(f"{source} is already header-only (written by kvphase header)")
        if isinstance(source, Path) and out.resolve() == source.resolve():
            raise PlanError(f"the header-only file would replace the model itself: give another path than {source}")
        kept = [key for key in header.spans if key not in SPLIT_KEYS]
        records = [_read_span(f, header.spans[key]) for key in kept]  # a URL's: from the bytes already fetched
    shards = [header] + [read_gguf_header(path, partial=True) for path in other_shards(header)]
    tensors = [tensor for shard in shards for tensor in shard.tensors]
    source_size = sum(shard.model_size for shard in shards)
    listed = [f"{t.type_id} {','.join(str(d) for d in t.shape)} {t.name}" for t in tensors]
    body = (GGUF_MAGIC + struct.pack("<IQQ", header.version, 0, len(kept) + 2) + b"".join(records)
            + _string_array(LISTED_TENSORS, listed) + _uint64(SOURCE_SIZE, source_size))
    alignment = header.fields.get(Keys.General.ALIGNMENT, DEFAULT_ALIGNMENT)
    data = body + bytes(-len(body) % alignment)  # an empty data section, aligned as llama.cpp seeks to it
    save_atomic(out, lambda tmp: tmp.write_bytes(data))
    return HeaderOnly(out, len(data), source_size, len(tensors), len(shards))


def other_shards(header: GGUFHeader) -> list[Path | Url]:
    """The shards after the first of a split model, beside it (at a URL: beside it on the server);
    PlanError when one is missing or `header` is not a first shard."""
    count = header.fields.get(Keys.Split.LLM_KV_SPLIT_COUNT, 1)
    if not isinstance(count, int) or count <= 1:
        return []
    match = SHARD_NAME.search(header.path.name)
    if header.fields.get(Keys.Split.LLM_KV_SPLIT_NO) != 0 or not match:
        raise PlanError(f"{header.path} is shard {header.fields.get(Keys.Split.LLM_KV_SPLIT_NO, '?')} of a split model; "
                        f"give its first shard (NAME-00001-of-{count:05d}.gguf)")
    stem = header.path.name[:match.start()]
    paths = [header.path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(2, count + 1)]
    missing = [path.name for path in paths if isinstance(path, Path) and not path.is_file()]  # a URL's: when read
    if missing:
        raise PlanError(f"{header.path} is the first of {count} shards, and {', '.join(missing[:3])} "
                        f"{'is' if len(missing) == 1 else 'are'} not beside it: every shard's tensor records are listed")
    return paths


def require_weights(model: str | Path | GGUFHeader, what: str) -> None:
    """ModelFileError when `model` (a path, or its header already read) is a header-only file: `what`
    needs the weights."""
    header = model if isinstance(model, GGUFHeader) else read_gguf_header(model)
    if header.header_only:
        raise ModelFileError(f"{header.path} is a header-only file (kvphase header): it holds no weights, and {what} "
                             f"needs them; give the model itself ({SERVES})")


def no_weights(tensor: TensorInfo) -> ModelFileError:
    return ModelFileError(f"tensor {tensor.name!r} has no weights here: the file is header-only (kvphase header); "
                          f"give the model itself ({SERVES})")


def _read_span(f, span: tuple[int, int]) -> bytes:
    f.seek(span[0])
    data = f.read(span[1] - span[0])
    if len(data) != span[1] - span[0]:
        raise ModelFileError(f"{f.name} changed while it was read")
    return data


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _string_array(key: str, items: list[str]) -> bytes:
    return _string(key) + struct.pack("<IIQ", GGUF_ARRAY, GGUF_STRING, len(items)) + b"".join(map(_string, items))


def _uint64(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<IQ", GGUF_UINT64, value)
