"""What a GGUF file says about its model, read from metadata only (no weights, no llama.cpp).

The compression keys follow `src/llama-arch.cpp` of the llama.cpp vendored in
llama-cpp-python 0.3.36; see docs/protocol.md for where each stride comes from.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvphase.gguf.header import GGUFHeader, TensorInfo, read_gguf_header
from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata

from kvphase.gguf.trained import GLM5_REFERENCE_DESIGNS, TRAINED_PREFIX, TrainedSpec, read_trained_spec

@dataclass(frozen=True)
class CompressionSpec:
    """How an architecture compresses its KV cache, as declared in the file's metadata."""

    family: str  # "kpool" (glm5-next), "dsv4" (deepseek4), "msa" (minimax-m3) or "none"
    stride: int | None  # tokens per compressed entry that sets the phase; None without compression
    layers: tuple[int, ...] = ()  # layers that carry the compressor or indexer
    params: dict[str, Any] = field(default_factory=dict)  # family-specific settings, as in the file
    keys: dict[str, str] = field(default_factory=dict, compare=False)  # a param's key in an HF config.json (none: GGUF's)

    @property
    def compressed(self) -> bool:
        return self.family != "none"

    def describe(self) -> str:
        if not self.compressed:
            return "none declared (a sweep is a control run with a user-chosen stride)"
        settings = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.family}: stride {self.stride}; {settings}; layers {_ranges(self.layers)}"


@dataclass(frozen=True)
class ModelInfo:
    """The facts a sweep needs about a model file."""

    path: Path
    file_size: int  # bytes
    architecture: str
    name: str
    n_params: int
    quantization: str  # general.file_type, or the most common tensor type
    context_length: int  # the training context (n_ctx_train)
    n_layer: int
    tokenizer_model: str
    vocab_size: int
    compression: CompressionSpec
    header: GGUFHeader = field(repr=False, compare=False)  # the parse all of the above comes from, for what reads more
    trained: TrainedSpec | None = None  # what `kvphase train` declared, for its models
    weights_size: int | None = None  # a header-only file (kvphase header): the model's size; None: the weights are here
    needed_size: int | None = None  # a file cut inside its tensor data (partial=True): the whole file's size

    @property
    def declared_keys(self):
        """The metadata keys the file declares (a key it lacks reads as 0 in `compression`), or None for an HF
        checkpoint, whose config.json keys `compression.keys` names."""
        return self.header.fields if self.header is not None else None

    @property
    def short_name(self) -> str:
        """A file-system friendly name for run folders: the file's name, or for a file named
        model.gguf (every `kvphase train` folder holds one) its folder's name, so that two
        trained models' default run folders never collide."""
        stem = self.path.name.removesuffix(".gguf")
        if stem == "model":
            stem = self.path.resolve().parent.name or stem
        return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-") or "model"


def as_model_info(model: str | Path | ModelInfo) -> ModelInfo:
    """A model already opened as it is; a path (a script's, a test's) opened by `read_model_info`."""
    return model if isinstance(model, ModelInfo) else read_model_info(model)


def read_model_info(path: str | Path, partial: bool = False) -> ModelInfo:
    """Open a model: parse a GGUF file's (or URL's) header, the one parse everything below reads
    (`ModelInfo.header`); raise ModelFileError (GGUFError) if the file is unusable.
    `partial`: a file cut inside its tensor data is read too (`read_gguf_header`). A folder is an HF
    checkpoint, read from its config.json (`gguf.checkpoint`; its ModelInfo has no header)."""
    from kvphase.gguf.checkpoint import is_checkpoint, read_checkpoint_info

    if is_checkpoint(path):
        return read_checkpoint_info(path)
    header = read_gguf_header(path, partial=partial)
    path = header.path
    meta, tensors = Metadata(header), header.tensors
    arch = meta.text(Keys.General.ARCHITECTURE, "unknown")
    vocab = meta.integer(Keys.Tokenizer.LIST_COUNT, 0) or meta.integer(Keys.LLM.VOCAB_SIZE.format(arch=arch), 0)
    n_layer = meta.integer(Keys.LLM.BLOCK_COUNT.format(arch=arch), 0)
    return ModelInfo(
        path=path,
        file_size=header.file_size,
        architecture=arch,
        name=meta.text(Keys.General.NAME, path.stem),
        n_params=sum(t.n_elements for t in tensors),
        quantization=_quantization(meta, tensors),
        context_length=meta.integer(Keys.LLM.CONTEXT_LENGTH.format(arch=arch), 0),
        n_layer=n_layer,
        tokenizer_model=meta.text(Keys.Tokenizer.MODEL, "unknown"),
        vocab_size=vocab,
        compression=compression_spec(arch, meta, [t.name for t in tensors], n_layer),
        header=header,
        trained=read_trained_spec(meta, n_layer, meta.integer(Keys.Attention.HEAD_COUNT.format(arch=arch), 0)),
        weights_size=header.source_size,
        needed_size=header.needed_size,
    )


def compression_spec(arch: str, meta: Metadata, tensor_names: list[str], n_layer: int) -> CompressionSpec:
    """The compression an architecture declares; `none` for architectures without one."""
    if arch == "glm5-next":
        kpool = meta.integer(Keys.Attention.Indexer.KPOOL.format(arch=arch), 0)
        if meta.fields.get(TRAINED_PREFIX + "design") in GLM5_REFERENCE_DESIGNS:  # llama.cpp would run its k-pool keys
            return CompressionSpec(
                family="trained-glm-msa", stride=kpool, layers=_layers_with(tensor_names, "indexer_compressor_ape"),
                params={"block_size": kpool, "top_k": meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=arch), 0) // max(kpool, 1),
                        "local_blocks": 1, "runs_in": "the reference only"})
        return CompressionSpec(
            family="kpool",
            stride=kpool,
            layers=_layers_with(tensor_names, "indexer_compressor_ape"),
            params={
                "kpool": kpool,
                "top_k": meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=arch), 0),
                "select_tail": meta.flag(Keys.Attention.Indexer.KPOOL_SELECT_TAIL.format(arch=arch), False),
            },
        )
    if arch == "deepseek4":
        ratios = meta.integers(Keys.Attention.COMPRESS_RATIOS.format(arch=arch), [])
        if len(ratios) == 1 and n_layer > 1:
            ratios = ratios * n_layer
        compressed = sorted({r for r in ratios if r > 1})
        return CompressionSpec(
            family="dsv4",
            stride=compressed[0] if compressed else None,
            layers=tuple(i for i, r in enumerate(ratios) if r > 1),
            params={"compress_ratios": _runs(ratios), "strides": compressed,
                    "indexer_top_k": meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=arch), 0),
                    "sliding_window": meta.integer(Keys.Attention.SLIDING_WINDOW.format(arch=arch), 0)},
        )
    if arch == "minimax-m3":
        block = meta.integer(Keys.Attention.Indexer.BLOCK_SIZE.format(arch=arch), 0)
        return CompressionSpec(
            family="msa",
            stride=block,
            layers=_layers_with(tensor_names, "msa") or _layers_with(tensor_names, "indexer"),
            params={
                "block_size": block,
                "top_k": meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=arch), 0),
                "local_blocks": meta.integer(Keys.Attention.Indexer.LOCAL_BLOCKS.format(arch=arch), 0),
            },
        )
    trained = read_trained_spec(meta, n_layer, meta.integer(Keys.Attention.HEAD_COUNT.format(arch=arch), 0))
    if trained is not None and trained.design != "dense":
        params = {"design": trained.design, "local_window": trained.local_window, "offsets": trained.offsets,
                  "starts": [list(layer) for layer in trained.starts]}
        if trained.design == "kpool":
            params["top_k"] = trained.top_k
        stride = trained.stride
        if trained.design == "cowa":
            # CoWA's mask repeats every heads x L positions (which head owns a slice), so that period is
            # the stride a sweep groups by: residue mod L is the slot in a slice, residue // L its head
            n_head = meta.integer(Keys.Attention.HEAD_COUNT.format(arch=arch), 0)
            params |= {"slice_length": trained.stride, "heads": n_head}
            stride = n_head * trained.stride
        return CompressionSpec(family=f"trained-{trained.design}", stride=stride,
                               layers=tuple(range(n_layer)), params=params)
    return CompressionSpec(family="none", stride=None)


def _quantization(meta: Metadata, tensors: list[TensorInfo]) -> str:
    from gguf import GGMLQuantizationType, LlamaFileType

    file_type = meta.fields.get(Keys.General.FILE_TYPE)
    if isinstance(file_type, int):
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    counts = Counter(GGMLQuantizationType(t.type_id).name for t in tensors)
    return counts.most_common(1)[0][0] if counts else "unknown"


def _layers_with(tensor_names: list[str], marker: str) -> tuple[int, ...]:
    found = {int(m.group(1)) for n in tensor_names if marker in n and (m := re.match(r"blk\.(\d+)\.", n))}
    return tuple(sorted(found))


def _runs(values: list[int]) -> str:
    """Run-length text of a per-layer list: [0, 4, 4, 128] -> '0, 4x2, 128'."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}x{j - i}" if j - i > 1 else f"{values[i]}")
        i = j
    return ", ".join(out)


def _ranges(layers: tuple[int, ...]) -> str:
    if not layers:
        return "none"
    parts, start = [], layers[0]
    for prev, cur in zip(layers, layers[1:] + (None,)):
        if cur != prev + 1 if cur is not None else True:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(parts)
