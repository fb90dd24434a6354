"""What llama.cpp aborts on, checked in a model's metadata before llama.cpp sees the file.

llama.cpp refuses most bad metadata by throwing, which llama-cpp-python reports as a
failed load; a few values reach a GGML_ASSERT instead, which aborts the whole process.
`check_llama_limits` refuses those first, with a `GGUFError` naming the key. Each check
names the assert it mirrors in the llama.cpp vendored in llama-cpp-python 0.3.36.
"""

from __future__ import annotations

from pathlib import Path

from kvphase.errors import GGUFError
from kvphase.gguf.header import GGUFHeader, read_gguf_header
from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # LLAMA_ROPE_SCALING_TYPES, src/llama-model.cpp
INT32_MAX = 2**31 - 1
HYPER_CONNECTIONS = 4  # "mHC with hc_mult != 4 is not supported" (src/models/glm5-next.cpp, deepseek4.cpp)


def check_llama_limits(model: str | Path | GGUFHeader) -> None:
    """GGUFError when llama.cpp would abort on this file's metadata rather than refuse it."""
    header = model if isinstance(model, GGUFHeader) else read_gguf_header(model)
    meta = Metadata(header)
    arch = meta.text(Keys.General.ARCHITECTURE)
    # llama_model_base::load_hparams (src/llama-model.cpp)
    n_layer = meta.integer(Keys.LLM.BLOCK_COUNT.format(arch=arch), low=1, high=LLAMA_MAX_LAYERS)
    meta.integer(Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch), 0, high=n_layer)
    _check_experts(meta, arch, n_layer)
    scaling = meta.text(Keys.Rope.SCALING_TYPE.format(arch=arch), "linear")
    if scaling not in ROPE_SCALING_TYPES:
        raise meta.bad(Keys.Rope.SCALING_TYPE.format(arch=arch), scaling, f"one of {', '.join(ROPE_SCALING_TYPES)}")
    CHECKS.get(arch, lambda meta, arch, n_layer: None)(meta, arch, n_layer)
    _check_special_tokens(meta)


def _check_special_tokens(meta: Metadata) -> None:
    """BOS and EOS ids inside the vocabulary: llama.cpp (src/llama-vocab.cpp) swaps an id past the
    end for its default without a word, so every prompt would start with a token the file never named."""
    n_vocab = meta.integer(Keys.Tokenizer.LIST_COUNT, 0)
    for name in ("bos", "eos"):
        key = f"tokenizer.ggml.{name}_token_id"
        value = meta.fields.get(key)
        if n_vocab and value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                               or not 0 <= value < n_vocab):
            raise meta.bad(key, value, f"a token id from 0 to {n_vocab - 1} (the vocabulary has {n_vocab} tokens)")


def _check_experts(meta: Metadata, arch: str, n_layer: int) -> None:
    n_expert = meta.integer(Keys.LLM.EXPERT_COUNT.format(arch=arch), 0, high=LLAMA_MAX_EXPERTS)
    used = max(meta.integers(Keys.LLM.EXPERT_USED_COUNT.format(arch=arch), [0], high=n_expert))
    groups = meta.integer(Keys.LLM.EXPERT_GROUP_COUNT.format(arch=arch), 0)
    group_used = meta.integer(Keys.LLM.EXPERT_GROUP_USED_COUNT.format(arch=arch), 0)
    if n_expert == 0:
        if used or groups:
            raise GGUFError(f'{meta.file}: {Keys.LLM.EXPERT_USED_COUNT.format(arch=arch)} and expert_group_count must be 0 without experts (expert_count 0), found {used} and {groups}')
        return
    if used == 0:
        raise meta.bad(Keys.LLM.EXPERT_USED_COUNT.format(arch=arch), used, f"1 to {n_expert} with {n_expert} experts")
    if groups >= n_expert:
        raise meta.bad(Keys.LLM.EXPERT_GROUP_COUNT.format(arch=arch), groups, f"fewer than the {n_expert} experts")
    if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        raise GGUFError(f"{meta.file}: {n_expert} experts in {groups} groups with {group_used} used: expected "
                        "groups that divide the experts and 1 to groups - 1 of them used")


def _check_glm5_next(meta: Metadata, arch: str, n_layer: int) -> None:
    # src/models/glm5-next.cpp: indexer_kpool > 1 && indexer_top_k % indexer_kpool == 0
    kpool = meta.integer(Keys.Attention.Indexer.KPOOL.format(arch=arch), low=2)
    top_k = meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=arch))
    if top_k % kpool:
        raise meta.bad(Keys.Attention.Indexer.TOP_K.format(arch=arch), top_k, f"a multiple of the kpool {kpool}")
    meta.integer(Keys.HyperConnection.COUNT.format(arch=arch), low=HYPER_CONNECTIONS, high=HYPER_CONNECTIONS)


def _check_deepseek4(meta: Metadata, arch: str, n_layer: int) -> None:
    # src/models/deepseek4.cpp: n_compress_ratios <= LLAMA_MAX_LAYERS; the graph asserts hc == 4
    meta.integer(Keys.Attention.COMPRESS_RATIOS_COUNT.format(arch=arch), 0, high=LLAMA_MAX_LAYERS)
    meta.integer(Keys.HyperConnection.COUNT.format(arch=arch), low=HYPER_CONNECTIONS, high=HYPER_CONNECTIONS)


def _check_minimax_m3(meta: Metadata, arch: str, n_layer: int) -> None:
    # src/models/minimax-m3.cpp: indexer_block_size > 0; it and the top-k and local block counts
    # are cast to int (msa_p), so a uint32 above INT32_MAX turns negative and aborts in the graph
    meta.integer(Keys.Attention.Indexer.BLOCK_SIZE.format(arch=arch), low=1, high=INT32_MAX)
    meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=arch), 0, high=INT32_MAX)
    meta.integer(Keys.Attention.Indexer.LOCAL_BLOCKS.format(arch=arch), 0, high=INT32_MAX)


CHECKS = {"glm5-next": _check_glm5_next, "deepseek4": _check_deepseek4, "minimax-m3": _check_minimax_m3}
