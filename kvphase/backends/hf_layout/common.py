"""What every HF layout writer shares: the GGUF's tensors as numpy, the checkpoint's files written
(config.json, model.safetensors, tokenizer.json), and the GGUF keys read by name.

No torch: the weights go through the safetensors package's numpy interface, and the tokenizer
through the tokenizers library (both in the `hf` extra).

The mapping each writer follows is llama.cpp's converter read backwards, as vendored by
llama-cpp-python 0.3.36 (`vendor/llama.cpp/`): `conversion/<family>.py` (what each HF tensor
becomes, with its reshapes), `gguf-py/gguf/tensor_mapping.py` (HF name -> GGUF name) and
`gguf-py/gguf/constants.py` (the architecture's tensor list). The HF names are the ones
transformers' own `save_pretrained` writes for the class that loads them, so the folder is what a
released checkpoint of that architecture looks like to transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kvphase.errors import ModelFileError
from kvphase.gguf.checkpoint import TRAINED_KEYS
from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.gguf.tensors import tensor_array
from kvphase.gguf.trained import TRAINED_PREFIX


# the per-block tensors every layout of a transformer block names alike: llama.cpp's name -> transformers'
# (under the block's prefix); tensor_mapping.py lines
BLOCK_NORMS = {
    "attn_norm.weight": "input_layernorm.weight",  # ATTN_NORM, tensor_mapping.py:186
    "ffn_norm.weight": "post_attention_layernorm.weight",  # FFN_NORM, tensor_mapping.py:400
}
ATTENTION_PROJECTIONS = {
    "attn_q.weight": "self_attn.q_proj.weight",  # tensor_mapping.py:257
    "attn_k.weight": "self_attn.k_proj.weight",  # tensor_mapping.py:278
    "attn_v.weight": "self_attn.v_proj.weight",  # tensor_mapping.py:300
    "attn_output.weight": "self_attn.o_proj.weight",  # tensor_mapping.py:326
}


class GGUFTensors:
    """A GGUF file's tensors by name, as float32 numpy arrays (ggml's ne reversed, as torch lays them out)."""

    def __init__(self, info: ModelInfo):
        self.info = info
        self.meta = Metadata(info.header)
        self.arch = info.architecture
        self._by_name = {t.name: t for t in info.header.tensors}
        self._data = np.memmap(info.header.path, dtype=np.uint8, mode="r")

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._by_name:
            raise ModelFileError(f"{self.info.path.name} has no tensor {name}, which its {self.arch} layout needs")
        return tensor_array(self._data, self._by_name[name])

    def key(self, name: str, default: Any = None) -> Any:
        """Key `name` (`Keys.X`, its `{arch}` filled) from the metadata, `default` when absent (None: required, refused by name)."""
        return self.meta.get(name.format(arch=self.arch), default, "a value")

    def optional(self, name: str) -> Any:
        """Key `name` (its `{arch}` filled), or None where the file does not declare it."""
        return self.meta.fields.get(name.format(arch=self.arch))

    def integer(self, name: str, default: int | None = None) -> int:
        return self.meta.integer(name.format(arch=self.arch), default)

    def number(self, name: str, default: float | None = None) -> float:
        return self.meta.number(name.format(arch=self.arch), default)


def write_checkpoint_files(folder: Path, config: dict, tensors: dict[str, np.ndarray], info: ModelInfo) -> None:
    """config.json, model.safetensors (float32, contiguous) and, where the GGUF has a vocabulary, tokenizer.json."""
    from safetensors.numpy import save_file

    trained = {k: v for k, v in info.header.fields.items()
               if k.startswith(TRAINED_PREFIX) and not k.endswith("_count")}
    if trained:  # what `kvphase train` declared (the trained context: the sweep's query room)
        config = {**config, TRAINED_KEYS: trained}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file({name: np.ascontiguousarray(a, dtype=np.float32) for name, a in tensors.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer = gguf_tokenizer(info)
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))


def gguf_tokenizer(info: ModelInfo):
    """The GGUF's GPT-2 byte-level BPE vocabulary (tokens, merges, BOS) as a `tokenizers.Tokenizer`;
    None for a file without a vocabulary (`tokenizer.ggml.model` "none": token ids are the text).

    llama.cpp's "gpt2" model with the "gpt-2" pre-tokenizer is GPT-2's regex split, byte symbols and
    merges by rank; `add_bos_token` puts BOS before every text, which the post-processor repeats."""
    fields = info.header.fields
    model = fields.get(Keys.Tokenizer.MODEL, "none")
    if model == "none":
        return None
    if model != "gpt2":
        raise ModelFileError(f'{info.path.name}: {Keys.Tokenizer.MODEL} {model!r}; export-hf writes gpt2 vocabularies')
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = list(fields[Keys.Tokenizer.LIST])
    merges = [tuple(m.split(" ", 1)) for m in fields.get(Keys.Tokenizer.MERGES, [])]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [tokens[i] for i, kind in enumerate(fields.get(Keys.Tokenizer.TOKEN_TYPE, [])) if kind == 3]
    tokenizer.add_special_tokens(specials)
    bos = fields.get(Keys.Tokenizer.BOS_ID)
    if bos is not None and fields.get(Keys.Tokenizer.ADD_BOS, False):
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], bos)])
    return tokenizer
