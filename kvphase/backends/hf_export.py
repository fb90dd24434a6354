"""`kvphase export-hf MODEL.gguf OUT/`: a GGUF model as an HF checkpoint folder (config.json,
model.safetensors, the tokenizer's files) that transformers loads with `from_pretrained(OUT)`.

A llama GGUF goes through transformers' own GGUF reader (`from_pretrained(folder, gguf_file=...)`,
which needs the gguf package and accelerate): its weights dequantized to float32, its query and key
projections un-permuted as llama.cpp's converter had permuted them, its tokenizer rebuilt from the
file's vocabulary. The model it returns carries a GGUF quantization marker that `save_pretrained`
refuses, so its state dict is copied into a model built from the same config without the marker.
The folder is written beside OUT and renamed into place: a failure leaves no half-written OUT.

glm5-next and minimax-m3 are written from the GGUF's own tensors (`hf_layout.LAYOUTS`: llama.cpp's
converter read backwards), without torch; other architectures are refused by name.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

from kvphase.backends.hf import HF_EXTRA, load_transformers_model
from kvphase.backends.hf_layout import LAYOUTS
from kvphase.errors import ModelFileError, PlanError
from kvphase.gguf.modelinfo import ModelInfo, as_model_info

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
    if info.architecture in LAYOUTS:  # written from the GGUF's tensors by llama.cpp's converter read backwards
        return _write_staged(info, out, LAYOUTS[info.architecture])
    if info.architecture not in EXPORTED:
        raise PlanError(f"export-hf writes {', '.join(EXPORTED)} models; {info.path.name} is {info.architecture}, "
                        "whose HF layout is not written yet")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PlanError(f"{out} exists and is not an empty folder; export-hf writes a new one")
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
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        clean.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except OSError as exc:
        raise ModelFileError(f"could not write {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Exported(out, info.architecture, sum(p.numel() for p in clean.parameters()),
                    tuple(sorted(p.name for p in out.iterdir())))


def _write_staged(info: ModelInfo, out: Path, write) -> Exported:
    """`write(info, staging)` beside OUT, then renamed into place: a failure leaves no OUT."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PlanError(f"{out} exists and is not an empty folder; export-hf writes a new one")
    try:
        import safetensors  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        raise PlanError(f"export-hf needs the hf extra: {HF_EXTRA}") from None
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        write(info, staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except OSError as exc:
        raise ModelFileError(f"could not write {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Exported(out, info.architecture, info.n_params, tuple(sorted(p.name for p in out.iterdir())))
