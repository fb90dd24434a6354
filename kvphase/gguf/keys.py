"""The GGUF metadata keys kvphase reads and writes, named once, as gguf-py names them
(`gguf/constants.py`, class `Keys`): `Keys.Attention.Indexer.TOP_K`, not the string.

A key of one architecture holds `{arch}`: `Keys.LLM.BLOCK_COUNT.format(arch="llama")` is
"llama.block_count". Helpers that know the architecture (a tiny model's `TinySpec.key`, the HF
layouts' `GGUFTensors.integer`) take the key with `{arch}` and fill it themselves. Keys gguf-py
lacks (the compressed architectures of `src/llama-arch.cpp`: indexer, compressor, hyper-connections,
KDA) follow the same naming. A key written as a string anywhere else fails
`tests/project/test_gguf_keys.py`. kvphase's own keys (`kvphase.trained.*`, `kvphase.header_only.*`)
live with their readers (`gguf/trained.py`, `gguf/header.py`).
"""

from __future__ import annotations

class Keys:
    class General:
        ARCHITECTURE = "general.architecture"
        NAME = "general.name"
        ALIGNMENT = "general.alignment"
        FILE_TYPE = "general.file_type"

    class LLM:
        VOCAB_SIZE = "{arch}.vocab_size"
        CONTEXT_LENGTH = "{arch}.context_length"
        EMBEDDING_LENGTH = "{arch}.embedding_length"
        BLOCK_COUNT = "{arch}.block_count"
        LEADING_DENSE_BLOCK_COUNT = "{arch}.leading_dense_block_count"
        FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
        EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
        EXPERT_COUNT = "{arch}.expert_count"
        EXPERT_USED_COUNT = "{arch}.expert_used_count"
        EXPERT_SHARED_COUNT = "{arch}.expert_shared_count"
        EXPERT_GROUP_COUNT = "{arch}.expert_group_count"
        EXPERT_GROUP_USED_COUNT = "{arch}.expert_group_used_count"
        EXPERT_WEIGHTS_SCALE = "{arch}.expert_weights_scale"
        EXPERT_WEIGHTS_NORM = "{arch}.expert_weights_norm"
        EXPERT_GATING_FUNC = "{arch}.expert_gating_func"
        NEXTN_PREDICT_LAYERS = "{arch}.nextn_predict_layers"
        SWIGLU_CLAMP_EXP = "{arch}.swiglu_clamp_exp"
        HASH_LAYER_COUNT = "{arch}.hash_layer_count"

    class Attention:
        HEAD_COUNT = "{arch}.attention.head_count"
        HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
        KEY_LENGTH = "{arch}.attention.key_length"
        VALUE_LENGTH = "{arch}.attention.value_length"
        KEY_LENGTH_MLA = "{arch}.attention.key_length_mla"
        VALUE_LENGTH_MLA = "{arch}.attention.value_length_mla"
        LAYERNORM_EPS = "{arch}.attention.layer_norm_epsilon"
        LAYERNORM_RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
        Q_LORA_RANK = "{arch}.attention.q_lora_rank"
        KV_LORA_RANK = "{arch}.attention.kv_lora_rank"
        OUTPUT_LORA_RANK = "{arch}.attention.output_lora_rank"
        OUTPUT_GROUP_COUNT = "{arch}.attention.output_group_count"
        SLIDING_WINDOW = "{arch}.attention.sliding_window"
        SCALE = "{arch}.attention.scale"
        COMPRESS_RATIOS = "{arch}.attention.compress_ratios"
        COMPRESS_RATIOS_COUNT = "{arch}.attention.compress_ratios_count"  # the list's length, as the header reader counts it
        COMPRESS_ROPE_FREQ_BASE = "{arch}.attention.compress_rope_freq_base"

        class Indexer:
            HEAD_COUNT = "{arch}.attention.indexer.head_count"
            KEY_LENGTH = "{arch}.attention.indexer.key_length"
            TOP_K = "{arch}.attention.indexer.top_k"
            KPOOL = "{arch}.attention.indexer.kpool"
            KPOOL_SELECT_TAIL = "{arch}.attention.indexer.kpool_select_tail"
            BLOCK_SIZE = "{arch}.attention.indexer.block_size"
            LOCAL_BLOCKS = "{arch}.attention.indexer.local_blocks"
            TYPES = "{arch}.attention.indexer.types"

    class Rope:
        DIMENSION_COUNT = "{arch}.rope.dimension_count"
        FREQ_BASE = "{arch}.rope.freq_base"
        SCALING_TYPE = "{arch}.rope.scaling.type"
        SCALING_FACTOR = "{arch}.rope.scaling.factor"
        SCALING_ORIG_CTX_LEN = "{arch}.rope.scaling.original_context_length"

    class SSM:
        CONV_KERNEL = "{arch}.ssm.conv_kernel"

    class KDA:
        HEAD_DIM = "{arch}.kda.head_dim"
        GATE_LOWER_BOUND = "{arch}.kda.gate_lower_bound"

    class HyperConnection:
        COUNT = "{arch}.hyper_connection.count"
        SINKHORN_ITERATIONS = "{arch}.hyper_connection.sinkhorn_iterations"
        EPSILON = "{arch}.hyper_connection.epsilon"

    class Split:
        LLM_KV_SPLIT_NO = "split.no"
        LLM_KV_SPLIT_COUNT = "split.count"
        LLM_KV_SPLIT_TENSORS_COUNT = "split.tensors.count"

    class Tokenizer:
        MODEL = "tokenizer.ggml.model"
        PRE = "tokenizer.ggml.pre"
        LIST = "tokenizer.ggml.tokens"
        LIST_COUNT = "tokenizer.ggml.tokens_count"  # the list's length, as the header reader counts it
        TOKEN_TYPE = "tokenizer.ggml.token_type"
        MERGES = "tokenizer.ggml.merges"
        BOS_ID = "tokenizer.ggml.bos_token_id"
        EOS_ID = "tokenizer.ggml.eos_token_id"
        ADD_BOS = "tokenizer.ggml.add_bos_token"


def all_keys() -> dict[str, str]:
    """Every key by its dotted name in `Keys` ("Attention.Indexer.TOP_K" -> "{arch}.attention.indexer.top_k")."""
    found: dict[str, str] = {}

    def walk(space: type, path: str) -> None:
        for name, value in vars(space).items():
            if isinstance(value, type):
                walk(value, f"{path}{name}.")
            elif isinstance(value, str) and name.isupper():
                found[path + name] = value

    walk(Keys, "")
    return found

