"""What an HF checkpoint folder says about its model (config.json, the safetensors headers,
tokenizer.json), read as `modelinfo` reads a GGUF header: no weights, no torch.

The compression keys are the ones transformers' configuration classes read (transformers 5.25:
`models/deepseek_v4/configuration_deepseek_v4.py`, `models/glm5_next/configuration_glm5_next.py`,
`models/minimax_m3_vl/configuration_minimax_m3_vl.py`); each is turned into the `CompressionSpec`
the GGUF key of the same meaning gives (`modelinfo.compression_spec`), so the reach, the plan and
`inspect` read a checkpoint as they read a file. A compressed architecture's indexer settings must be
written in config.json: a missing one is refused by name rather than taken from transformers' class
default (a different model's).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from kvphase.errors import KvphaseError, ModelFileError
from kvphase.gguf.modelinfo import CompressionSpec, ModelInfo, _runs
from kvphase.gguf.reach import reach_of

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"

# transformers' model_type -> the GGUF architecture of the same model (what plans, reach and defaults key on)
ARCHITECTURES = {"llama": "llama", "deepseek_v4": "deepseek4", "glm5_next": "glm5-next",
                 "glm5_next_text": "glm5-next", "minimax_m3_vl": "minimax-m3", "minimax_m3_vl_text": "minimax-m3"}
DSV4_LAYER_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def is_checkpoint(path: str | Path) -> bool:
    """A folder is read as an HF checkpoint; anything else as a GGUF file (or URL)."""
    return not str(path).startswith(("http://", "https://")) and Path(path).is_dir()


def read_checkpoint_info(folder: str | Path) -> ModelInfo:
    """Open an HF checkpoint folder: ModelFileError naming what is missing or wrong (config.json,
    its weights, an architecture kvphase cannot sweep, an indexer key)."""
    folder = Path(folder)
    config = read_config(folder)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise ModelFileError(f"{folder / CONFIG}: model_type {str(model_type)[:40]!r} is not one kvphase sweeps "
                             f"through transformers (it sweeps {', '.join(sorted(set(ARCHITECTURES)))})")
    text = config.get("text_config") or config  # the language model's settings (a VL model nests them)
    if not isinstance(text, dict):
        raise ModelFileError(f"{folder / CONFIG}: text_config is a {type(text).__name__}, expected a JSON object")
    weights = weight_files(folder)
    tensors = [tensor for path in weights for tensor in _safetensors_entries(path)]
    n_layer = _whole(text, "num_hidden_layers", folder)
    arch = ARCHITECTURES[model_type]
    compression = checkpoint_compression(arch, text, n_layer, folder)
    reach_of(compression)  # contradictory indexer settings (top_k not a multiple of kpool) refused by their key here
    return ModelInfo(
        path=folder,
        file_size=sum(path.stat().st_size for path in weights),
        architecture=arch,
        name=str(config.get("_name_or_path") or folder.name),
        n_params=sum(n for _, n in tensors),
        quantization=Counter(dtype for dtype, _ in tensors).most_common(1)[0][0],
        context_length=int(text.get("max_position_embeddings") or 0),
        n_layer=n_layer,
        tokenizer_model=_tokenizer_model(folder),
        vocab_size=int(text.get("vocab_size") or 0),
        compression=compression,
        trained=_trained_spec(config, folder, n_layer, text),
        header=None,  # no GGUF header: what reads one (llama.cpp, the numpy reference) refuses a checkpoint
    )


TRAINED_KEY = "kvphase_trained"  # export-hf's copy of a `kvphase train` file's kvphase.trained.* keys


def _trained_spec(config: dict, folder: Path, n_layer: int, text: dict):
    """What `kvphase train` declared for the GGUF this folder was exported from (its trained context sets the
    sweep's query room), type-checked as the GGUF's keys are; None for other checkpoints."""
    from types import SimpleNamespace

    from kvphase.gguf.metadata import Metadata
    from kvphase.gguf.trained import TRAINED_PREFIX, read_trained_spec

    keys = config.get(TRAINED_KEY)
    if keys is None:
        return None
    if not isinstance(keys, dict):
        raise ModelFileError(f"{folder / CONFIG}: {TRAINED_KEY} is a {type(keys).__name__}, expected a JSON object")
    fields = {TRAINED_PREFIX + str(k): v for k, v in keys.items()}
    meta = Metadata(SimpleNamespace(fields=fields, path=folder / CONFIG))
    try:
        return read_trained_spec(meta, n_layer, int(text.get("num_attention_heads") or 0))
    except KvphaseError as exc:
        raise ModelFileError(str(exc).replace("metadata kvphase.trained.", f"{TRAINED_KEY}.")) from None


def read_config(folder: Path) -> dict:
    path = folder / CONFIG
    if not path.is_file():
        raise ModelFileError(f"{folder} holds no {CONFIG}: an HF checkpoint folder needs one (and its .safetensors)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path} is not readable JSON ({str(exc)[:80]})") from None
    if not isinstance(config, dict):
        raise ModelFileError(f"{path} holds a {type(config).__name__}, expected a JSON object")
    return config


def weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{folder} holds no .safetensors weights beside its {CONFIG}")
    return files


def _safetensors_entries(path: Path) -> list[tuple[str, int]]:
    """(dtype, elements) of each tensor a .safetensors file's JSON header lists (8-byte length first)."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(100_000_000, path.stat().st_size):
                raise ValueError(f"a {length}-byte header")
            header = json.loads(f.read(length))
        entries = []
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for size in entry["shape"]:
                count *= int(size)
            entries.append((str(entry["dtype"]), count))
        return entries
    except (OSError, struct.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelFileError(f"{path} is not a safetensors file ({str(exc)[:80]})") from None


def _tokenizer_model(folder: Path) -> str:
    """tokenizer.json's model type (BPE, Unigram, ...), 'none' without the file (as a GGUF without a vocabulary)."""
    path = folder / TOKENIZER
    if not path.is_file():
        return "none"
    try:
        return str(json.loads(path.read_text(encoding="utf-8")).get("model", {}).get("type", "unknown"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        raise ModelFileError(f"{path} is not readable JSON") from None


def checkpoint_compression(arch: str, text: dict, n_layer: int, folder: Path) -> CompressionSpec:
    """The `CompressionSpec` config.json declares, in the GGUF reading's families and params, with
    `keys` naming config.json's keys (so the reach's errors name them)."""
    def need(key: str) -> Any:
        if key not in text:
            raise ModelFileError(f"{folder / CONFIG}: {key} is missing, and a {arch} model's indexer needs it")
        return _whole(text, key, folder)

    if arch == "glm5-next":
        layer_types = _layer_types(text, n_layer, folder)
        kpool, top_k = need("index_kpool"), need("index_topk")
        return CompressionSpec(family="kpool", stride=kpool,
                               layers=tuple(i for i, t in enumerate(layer_types) if t == "indexed_attention"),
                               params={"kpool": kpool, "top_k": top_k,
                                       "select_tail": bool(text.get("index_kpool_always_select_tail", True))},
                               keys={"kpool": "index_kpool", "top_k": "index_topk",
                                     "select_tail": "index_kpool_always_select_tail"})
    if arch == "deepseek4":
        rates = {**{"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
                 **(text.get("compress_rates") or {})}
        if "layer_types" in text:
            kinds = _layer_types(text, n_layer, folder)
            unknown = sorted(set(kinds) - set(DSV4_LAYER_RATIO))
            if unknown:
                raise ModelFileError(f"{folder / CONFIG}: layer_types holds {unknown[0]!r}, expected one of "
                                     f"{', '.join(DSV4_LAYER_RATIO)}")
            ratios = [int(rates.get(kind, 0)) for kind in kinds]
        elif "compress_ratios" in text:
            ratios = [int(r) for r in text["compress_ratios"]][:n_layer]
        else:
            raise ModelFileError(f"{folder / CONFIG}: layer_types (or compress_ratios) is missing, and a deepseek4 "
                                 "model's compressor is declared per layer by it")
        compressed = sorted({r for r in ratios if r > 1})
        return CompressionSpec(
            family="dsv4", stride=compressed[0] if compressed else None,
            layers=tuple(i for i, r in enumerate(ratios) if r > 1),
            params={"compress_ratios": _runs(ratios), "strides": compressed,
                    "indexer_top_k": need("index_topk") if 4 in ratios else int(text.get("index_topk") or 0),
                    "sliding_window": need("sliding_window")},
            keys={"indexer_top_k": "index_topk", "sliding_window": "sliding_window", "compress_ratios": "layer_types"})
    if arch == "minimax-m3":
        layer_types = _layer_types(text, n_layer, folder)
        block = need("index_block_size")
        return CompressionSpec(family="msa", stride=block,
                               layers=tuple(i for i, t in enumerate(layer_types) if t == "minimax_m3_sparse"),
                               params={"block_size": block, "top_k": need("index_topk_blocks"),
                                       "local_blocks": need("index_local_blocks")},
                               keys={"block_size": "index_block_size", "top_k": "index_topk_blocks",
                                     "local_blocks": "index_local_blocks"})
    return CompressionSpec(family="none", stride=None)


def _layer_types(text: dict, n_layer: int, folder: Path) -> list[str]:
    kinds = text.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != n_layer or not all(isinstance(k, str) for k in kinds):
        raise ModelFileError(f"{folder / CONFIG}: layer_types is {'missing' if kinds is None else 'not'} a list of "
                             f"{n_layer} layer names (num_hidden_layers)")
    return kinds


def _whole(config: dict, key: str, folder: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelFileError(f"{folder / CONFIG}: {key} is {str(value)[:40] if value is not None else 'missing'}, "
                             "expected a whole number")
    return value
