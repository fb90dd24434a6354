"""`kvphase export-hf MODEL.gguf OUT/`: a GGUF model as an HF checkpoint folder (config.json,
model.safetensors, the tokenizer's files) that transformers loads with `from_pretrained(OUT)`.

A llama GGUF goes through transformers' own GGUF reader (`from_pretrained(folder, gguf_file=...)`,
which needs the gguf package and accelerate): its weights dequantized to float32, its query and key
projections un-permuted as llama.cpp's converter had permuted them, its tokenizer rebuilt from the
file's vocabulary. The model it returns carries a GGUF quantization marker that `save_pretrained`
refuses, so its state dict is copied into a model built from the same config without the marker.
The folder is written beside OUT and renamed into place: a failure leaves no half-written OUT.

The architectures transformers' GGUF reader lacks (deepseek4, ...) are written by their own layout
(`kvphase.backends.hf_layout.LAYOUTS`): llama.cpp's converter read backwards, tensor by tensor, with the
config.json the converter would have read; the same staging folder and rename, and before the rename
the folder is read back as `inspect` and `sweep` read a checkpoint (its indexer keys checked), so a
file whose keys contradict each other leaves no OUT either.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

from kvphase.backends.hf import HF_EXTRA, load_transformers_model
from kvphase.backends.hf_layout import LAYOUTS
from kvphase.errors import ModelFileError, PlanError
from kvphase.gguf.modelinfo import ModelInfo, as_model_info, read_model_info

EXPORTED = ("llama",) + tuple(LAYOUTS)


class Exported(NamedTuple):
    path: Path
    architecture: str
    n_params: int
    files: tuple[str, ...]


def export_hf(model: str | Path | ModelInfo, out: str | Path) -> Exported:
    """Write `model` (a GGUF file) as an HF checkpoint folder at `out`, which must not exist or be empty."""
    info = as_model_info(model)
    out = Path(out)
    if info.header is None:
        raise PlanError(f"{info.path} is already an HF checkpoint folder; export-hf reads a GGUF file")
    if info.architecture not in EXPORTED + tuple(LAYOUTS):
        raise PlanError(f"export-hf writes {', '.join(EXPORTED + tuple(LAYOUTS))} models; {info.path.name} is "
                        f"{info.architecture}, whose HF layout is not written yet")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PlanError(f"{out} exists and is not an empty folder; export-hf writes a new one")
    if info.architecture in LAYOUTS:
        try:
            import safetensors  # noqa: F401
            import transformers  # noqa: F401
        except ImportError:
            raise PlanError(f"export-hf needs the hf extra: {HF_EXTRA}") from None
        def write_layout(staging: Path) -> int:
            n_params = LAYOUTS[info.architecture](info, staging) or info.n_params
            read_model_info(staging)  # config.json read back as inspect and sweep read it: a key they refuse, no OUT
            return n_params

        n_params = _written(out, write_layout)
        return Exported(out, info.architecture, n_params, tuple(sorted(p.name for p in out.iterdir())))
    if any(t.name == "rope_freqs.weight" for t in info.header.tensors):
        raise PlanError(f"{info.path.name} holds rope_freqs.weight (llama.cpp's RoPE frequency divisors), which "
                        "transformers' GGUF reader drops: the copy would be another model")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise PlanError(f"export-hf needs the hf extra: {HF_EXTRA}") from None
    loaded, _ = load_transformers_model(info)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    clean.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(str(info.path.parent), gguf_file=info.path.name)

    def write(staging: Path) -> int:
        clean.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        return sum(p.numel() for p in clean.parameters())

    n_params = _written(out, write)
    return Exported(out, info.architecture, n_params, tuple(sorted(p.name for p in out.iterdir())))


def _written(out: Path, write) -> int:
    """`write(staging)` into a folder beside `out`, then renamed to `out`: a failure leaves no OUT."""
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        n_params = write(staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except OSError as exc:
        raise ModelFileError(f"could not write {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return n_params


def cached_checkpoint(model: Path, sha256: str, cache: Path) -> Path:
    """An HF copy of the GGUF `model` (whose sha256 is given) in `cache`, exported once and reused: the
    folder is named by the file's hash, and export-hf's staging and rename mean a folder that exists is whole."""
    folder = cache / f"{model.stem}-{sha256[:16]}"
    if not (folder / "config.json").is_file():
        export_hf(model, folder)
    return folder
    return Exported(out, info.architecture, sum(p.numel() for p in clean.parameters()),
                    tuple(sorted(p.name for p in out.iterdir())))

