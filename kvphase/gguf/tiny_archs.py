"""The tiny models' architectures: for each, the metadata keys and tensor shapes (TinySpec) of
the smallest model llama.cpp's loader accepts that still exercises the compression: several pools /
blocks per prompt, a top-k that keeps fewer than all of them, and a gate bias (`ape`) large enough
that rolling it by one offset changes the pooled keys well beyond rounding; and the dense
llama-family layouts the numpy reference model runs. `kvphase.gguf.tiny` fills and writes them.

Keys and tensor names follow `src/llama-arch.cpp`; shapes follow `load_arch_hparams` /
`load_arch_tensors` in `src/models/{glm5-next,minimax-m3,deepseek4}.cpp`. The PyPI gguf
package does not know these architectures, so their keys are named in `kvphase.gguf.keys`, as gguf-py names its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kvphase.gguf.keys import Keys

TINY_VOCAB = 64
TINY_CONTEXT = 1024


@dataclass
class TinySpec:
    """What one tiny model file holds: metadata keys and tensor shapes (ggml order, ne0 first)."""

    arch: str
    keys: dict[str, object] = field(default_factory=dict)  # full key -> value (int, float, bool, str, list)
    tensors: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)  # (name, ne, init)

    def key(self, name: str, value: object) -> None:
        """Set a key of this architecture (`Keys.LLM.BLOCK_COUNT`: its `{arch}` filled)."""
        self.keys[name.format(arch=self.arch)] = value

    def tensor(self, name: str, ne: tuple[int, ...], init: str = "w") -> None:
        self.tensors.append((name, tuple(int(d) for d in ne), init))


# --------------------------------------------------------------------------- shared pieces


def _common(spec: TinySpec, n_embd: int, n_layer: int) -> None:
    spec.keys[Keys.General.NAME] = f"tiny-{spec.arch}"
    spec.keys[Keys.Tokenizer.MODEL] = "none"
    spec.key(Keys.LLM.VOCAB_SIZE, TINY_VOCAB)
    spec.key(Keys.LLM.CONTEXT_LENGTH, TINY_CONTEXT)
    spec.key(Keys.LLM.EMBEDDING_LENGTH, n_embd)
    spec.key(Keys.LLM.BLOCK_COUNT, n_layer)
    spec.key(Keys.Attention.LAYERNORM_RMS_EPS, 1e-6)
    spec.tensor("token_embd.weight", (n_embd, TINY_VOCAB), "embd")
    spec.tensor("output_norm.weight", (n_embd,), "ones")
    spec.tensor("output.weight", (n_embd, TINY_VOCAB))


def _hyper_connections(spec: TinySpec, i: int, n_embd: int, hc: int) -> None:
    """mHC mixing weights (`build_hc_pre` / `build_hc_post`), shared by glm5-next and deepseek4."""
    mix = (2 + hc) * hc
    for part in ("attn", "ffn"):
        spec.tensor(f"blk.{i}.hc_{part}_fn.weight", (hc * n_embd, mix))
        spec.tensor(f"blk.{i}.hc_{part}_base.weight", (mix,), "small")
        spec.tensor(f"blk.{i}.hc_{part}_scale.weight", (3,), "ones")


def _dense_ffn(spec: TinySpec, i: int, n_embd: int, n_ff: int) -> None:
    spec.tensor(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff))
    spec.tensor(f"blk.{i}.ffn_up.weight", (n_embd, n_ff))
    spec.tensor(f"blk.{i}.ffn_down.weight", (n_ff, n_embd))


def _moe_ffn(spec: TinySpec, i: int, n_embd: int, n_ff_exp: int, n_expert: int, n_shared: int) -> None:
    spec.tensor(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert))
    spec.tensor(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert))
    spec.tensor(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert))
    spec.tensor(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert))
    spec.tensor(f"blk.{i}.ffn_gate_shexp.weight", (n_embd, n_ff_exp * n_shared))
    spec.tensor(f"blk.{i}.ffn_up_shexp.weight", (n_embd, n_ff_exp * n_shared))
    spec.tensor(f"blk.{i}.ffn_down_shexp.weight", (n_ff_exp * n_shared, n_embd))


# --------------------------------------------------------------------------- glm5-next


@dataclass(frozen=True)
class Glm5Layout:
    """The sizes of a glm5-next file; the defaults are the tiny random model's."""

    n_embd: int = 32
    n_head: int = 2
    q_lora: int = 16
    kv_lora: int = 16
    k_mla: int = 8
    v_mla: int = 8
    kda_dim: int = 8
    d_conv: int = 4
    n_idx_head: int = 2
    n_idx: int = 16
    kpool: int = 4
    top_k: int = 8  # tokens: top_k // kpool pools
    n_ff: int = 32
    kinds: tuple[str, ...] = ("dsa", "kda", "dsa")  # per layer: nope MLA with the indexer, or KDA


def glm5_next_spec(layout: Glm5Layout = Glm5Layout()) -> TinySpec:
    """GLM-5.3-Flash layout; the tiny model's layers 0 and 2 are nope-MLA with the k-pool
    indexer, layer 1 is KDA.

    Follows `llama_model_glm5_next::load_arch_hparams/load_arch_tensors`. A KDA layer is
    required (its recurrent input is otherwise left unallocated); all layers are dense
    (`leading_dense_block_count` = block_count) to keep the file small. `kvphase train`'s
    glm5-next export writes its weights into this same spec (kvphase/train/export_glm5.py).
    """
    s = TinySpec("glm5-next")
    L, hc = layout, 4
    n_embd, n_head, kinds = L.n_embd, L.n_head, L.kinds
    q_lora, kv_lora, k_mla, v_mla, kda_dim, d_conv = L.q_lora, L.kv_lora, L.k_mla, L.v_mla, L.kda_dim, L.d_conv
    n_idx_head, n_idx, kpool = L.n_idx_head, L.n_idx, L.kpool
    _common(s, n_embd, len(kinds))
    s.key(Keys.Attention.LAYERNORM_EPS, 1e-5)
    s.key(Keys.LLM.FEED_FORWARD_LENGTH, L.n_ff)
    s.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, len(kinds))
    s.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, 16)
    s.key(Keys.LLM.EXPERT_SHARED_COUNT, 1)
    s.key(Keys.Attention.HEAD_COUNT, n_head)
    s.key(Keys.Attention.HEAD_COUNT_KV, [1 if k == "dsa" else 0 for k in kinds])  # one latent per MLA layer; 0 marks KDA
    s.key(Keys.Attention.KEY_LENGTH, kv_lora)  # the MLA cache holds the latent
    s.key(Keys.Attention.VALUE_LENGTH, kv_lora)
    s.key(Keys.Attention.KEY_LENGTH_MLA, k_mla)
    s.key(Keys.Attention.VALUE_LENGTH_MLA, v_mla)
    s.key(Keys.Attention.Q_LORA_RANK, q_lora)
    s.key(Keys.Attention.KV_LORA_RANK, kv_lora)
    s.key(Keys.Rope.DIMENSION_COUNT, 0)  # nope-only MLA
    s.key(Keys.SSM.CONV_KERNEL, d_conv)
    s.key(Keys.KDA.HEAD_DIM, kda_dim)
    s.key(Keys.Attention.Indexer.HEAD_COUNT, n_idx_head)
    s.key(Keys.Attention.Indexer.KEY_LENGTH, n_idx)
    s.key(Keys.Attention.Indexer.TOP_K, L.top_k)
    s.key(Keys.Attention.Indexer.KPOOL, kpool)
    s.key(Keys.Attention.Indexer.KPOOL_SELECT_TAIL, True)
    s.key(Keys.HyperConnection.COUNT, hc)
    s.key(Keys.HyperConnection.SINKHORN_ITERATIONS, 3)
    s.key(Keys.HyperConnection.EPSILON, 1e-6)
    d_inner = kda_dim * n_head
    for i, kind in enumerate(kinds):
        s.tensor(f"blk.{i}.attn_norm.weight", (n_embd,), "ones")
        s.tensor(f"blk.{i}.ffn_norm.weight", (n_embd,), "ones")
        _hyper_connections(s, i, n_embd, hc)
        if kind == "kda":
            for qkv in "qkv":
                s.tensor(f"blk.{i}.ssm_conv1d_{qkv}.weight", (d_conv, 1, d_inner))
                s.tensor(f"blk.{i}.attn_{qkv}.weight", (n_embd, d_inner))
            s.tensor(f"blk.{i}.ssm_f_a.weight", (n_embd, kda_dim))
            s.tensor(f"blk.{i}.ssm_f_b.weight", (kda_dim, d_inner))
            s.tensor(f"blk.{i}.ssm_beta.weight", (n_embd, n_head))
            s.tensor(f"blk.{i}.ssm_a", (n_head,), "neg")
            s.tensor(f"blk.{i}.ssm_dt.bias", (d_inner,), "small")
            s.tensor(f"blk.{i}.ssm_g_a.weight", (n_embd, kda_dim))
            s.tensor(f"blk.{i}.ssm_g_b.weight", (kda_dim, d_inner))
            s.tensor(f"blk.{i}.ssm_norm.weight", (kda_dim,), "ones")
            s.tensor(f"blk.{i}.attn_output.weight", (d_inner, n_embd))
        else:
            s.tensor(f"blk.{i}.attn_q_a_norm.weight", (q_lora,), "ones")
            s.tensor(f"blk.{i}.attn_kv_a_norm.weight", (kv_lora,), "ones")
            s.tensor(f"blk.{i}.attn_q_a.weight", (n_embd, q_lora))
            s.tensor(f"blk.{i}.attn_q_b.weight", (q_lora, n_head * k_mla))
            s.tensor(f"blk.{i}.attn_kv_a_mqa.weight", (n_embd, kv_lora))
            s.tensor(f"blk.{i}.attn_k_b.weight", (k_mla, kv_lora, n_head))
            s.tensor(f"blk.{i}.attn_v_b.weight", (kv_lora, v_mla, n_head))
            s.tensor(f"blk.{i}.attn_output.weight", (n_head * v_mla, n_embd))
            s.tensor(f"blk.{i}.indexer.k_norm.weight", (n_idx,), "ones")
            s.tensor(f"blk.{i}.indexer.k_norm.bias", (n_idx,), "small")
            s.tensor(f"blk.{i}.indexer.proj.weight", (n_embd, n_idx_head))
            s.tensor(f"blk.{i}.indexer.attn_k.weight", (n_embd, n_idx))
            s.tensor(f"blk.{i}.indexer.attn_q_b.weight", (q_lora, n_idx_head * n_idx))
            s.tensor(f"blk.{i}.indexer_compressor_gate.weight", (n_embd, n_idx))
            s.tensor(f"blk.{i}.indexer_compressor_ape.weight", (n_idx, kpool), "ape")
        _dense_ffn(s, i, n_embd, L.n_ff)
    return s


# --------------------------------------------------------------------------- minimax-m3


def minimax_m3_spec() -> TinySpec:
    """MiniMax-M3 layout: layer 0 dense, layers 1-2 MoE with the MSA block indexer.

    Follows `llama_model_minimax_m3::load_arch_hparams/load_arch_tensors`. The indexer
    has one head per KV head (`HKV == Hd` in the graph) and lives on MoE layers only.
    """
    s = TinySpec("minimax-m3")
    n_embd, n_head, n_head_kv, head_dim, n_rot = 32, 4, 2, 16, 8
    n_expert, n_used, n_ff_exp = 4, 2, 16
    n_layer, n_dense = 3, 1
    _common(s, n_embd, n_layer)
    s.key(Keys.LLM.FEED_FORWARD_LENGTH, 32)
    s.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, n_dense)
    s.key(Keys.LLM.EXPERT_COUNT, n_expert)
    s.key(Keys.LLM.EXPERT_USED_COUNT, n_used)
    s.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, n_ff_exp)
    s.key(Keys.LLM.EXPERT_SHARED_COUNT, 1)
    s.key(Keys.LLM.EXPERT_GATING_FUNC, 2)  # sigmoid
    s.key(Keys.LLM.EXPERT_WEIGHTS_NORM, True)
    s.key(Keys.LLM.EXPERT_WEIGHTS_SCALE, 1.0)
    s.key(Keys.Attention.HEAD_COUNT, n_head)
    s.key(Keys.Attention.HEAD_COUNT_KV, n_head_kv)
    s.key(Keys.Attention.KEY_LENGTH, head_dim)
    s.key(Keys.Attention.VALUE_LENGTH, head_dim)
    s.key(Keys.Rope.DIMENSION_COUNT, n_rot)
    s.key(Keys.Rope.FREQ_BASE, 10000.0)
    s.key(Keys.Attention.Indexer.HEAD_COUNT, n_head_kv)
    s.key(Keys.Attention.Indexer.KEY_LENGTH, head_dim)
    s.key(Keys.Attention.Indexer.TOP_K, 3)
    s.key(Keys.Attention.Indexer.BLOCK_SIZE, 4)
    s.key(Keys.Attention.Indexer.LOCAL_BLOCKS, 1)
    for i in range(n_layer):
        s.tensor(f"blk.{i}.attn_norm.weight", (n_embd,), "ones")
        s.tensor(f"blk.{i}.ffn_norm.weight", (n_embd,), "ones")
        s.tensor(f"blk.{i}.attn_q.weight", (n_embd, n_head * head_dim))
        s.tensor(f"blk.{i}.attn_k.weight", (n_embd, n_head_kv * head_dim))
        s.tensor(f"blk.{i}.attn_v.weight", (n_embd, n_head_kv * head_dim))
        s.tensor(f"blk.{i}.attn_output.weight", (n_head * head_dim, n_embd))
        s.tensor(f"blk.{i}.attn_q_norm.weight", (head_dim,), "ones")
        s.tensor(f"blk.{i}.attn_k_norm.weight", (head_dim,), "ones")
        if i < n_dense:
            _dense_ffn(s, i, n_embd, 32)
            continue
        _moe_ffn(s, i, n_embd, n_ff_exp, n_expert, 1)
        s.tensor(f"blk.{i}.exp_probs_b.bias", (n_expert,), "small")
        s.tensor(f"blk.{i}.indexer.q_proj.weight", (n_embd, n_head_kv * head_dim))
        s.tensor(f"blk.{i}.indexer.k_proj.weight", (n_embd, head_dim))
        s.tensor(f"blk.{i}.indexer.q_norm.weight", (head_dim,), "ones")
        s.tensor(f"blk.{i}.indexer.k_norm.weight", (head_dim,), "ones")
    return s


# --------------------------------------------------------------------------- deepseek4


@dataclass(frozen=True)
class DSV4Layout:
    """The sizes and switches of a deepseek4 file; the defaults are the tiny random model's."""

    n_embd: int = 32
    n_head: int = 2
    head_dim: int = 64
    n_rot: int = 16
    q_lora: int = 32
    o_groups: int = 2
    o_lora: int = 16
    n_idx_head: int = 2
    n_idx: int = 64  # the smallest indexer key length its Hadamard rotation accepts
    idx_top_k: int = 4
    n_expert: int = 4
    n_used: int = 2
    n_ff_exp: int = 16
    ratios: tuple[int, ...] = (0, 4, 128)
    sliding_window: int = 8
    rope_base: float = 10000.0
    compress_rope_base: float = 160000.0
    expert_weights_scale: float = 1.5
    swiglu_clamp: float = 10.0
    hc_iterations: int = 3
    hc_eps: float = 1e-6


def deepseek4_spec(layout: DSV4Layout = DSV4Layout()) -> TinySpec:
    """DeepSeek-V4 layout; the tiny model has three layers with compress ratios 0, 4 (CSA +
    lightning indexer) and 128 (HCA).

    Follows `llama_model_deepseek4::load_arch_hparams/load_arch_tensors`. Every layer is
    MoE with sqrt-softplus gating (gating function 4). `kvphase train`'s deepseek4 export
    writes its weights into this same spec (kvphase/train/export_deepseek4.py).
    """
    s = TinySpec("deepseek4")
    L, hc = layout, 4
    _common(s, L.n_embd, len(L.ratios))
    s.key(Keys.Attention.HEAD_COUNT, L.n_head)
    s.key(Keys.Attention.HEAD_COUNT_KV, 1)
    s.key(Keys.Attention.KEY_LENGTH, L.head_dim)
    s.key(Keys.Attention.VALUE_LENGTH, L.head_dim)
    s.key(Keys.Rope.DIMENSION_COUNT, L.n_rot)
    s.key(Keys.Rope.FREQ_BASE, L.rope_base)
    s.key(Keys.Attention.Q_LORA_RANK, L.q_lora)
    s.key(Keys.Attention.SLIDING_WINDOW, L.sliding_window)
    s.key(Keys.Attention.OUTPUT_GROUP_COUNT, L.o_groups)
    s.key(Keys.Attention.OUTPUT_LORA_RANK, L.o_lora)
    s.key(Keys.Attention.COMPRESS_ROPE_FREQ_BASE, L.compress_rope_base)
    s.key(Keys.Attention.COMPRESS_RATIOS, list(L.ratios))
    s.key(Keys.Attention.Indexer.HEAD_COUNT, L.n_idx_head)
    s.key(Keys.Attention.Indexer.KEY_LENGTH, L.n_idx)
    s.key(Keys.Attention.Indexer.TOP_K, L.idx_top_k)
    s.key(Keys.LLM.EXPERT_COUNT, L.n_expert)
    s.key(Keys.LLM.EXPERT_USED_COUNT, L.n_used)
    s.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, L.n_ff_exp)
    s.key(Keys.LLM.EXPERT_SHARED_COUNT, 1)
    s.key(Keys.LLM.EXPERT_GATING_FUNC, 4)  # sqrt-softplus, the only one the loader accepts
    s.key(Keys.LLM.EXPERT_WEIGHTS_NORM, True)
    s.key(Keys.LLM.EXPERT_WEIGHTS_SCALE, L.expert_weights_scale)
    s.key(Keys.LLM.SWIGLU_CLAMP_EXP, L.swiglu_clamp)
    s.key(Keys.HyperConnection.COUNT, hc)
    s.key(Keys.HyperConnection.SINKHORN_ITERATIONS, L.hc_iterations)
    s.key(Keys.HyperConnection.EPSILON, L.hc_eps)
    s.key(Keys.LLM.HASH_LAYER_COUNT, 0)
    s.tensor("output_hc_fn.weight", (hc * L.n_embd, hc))
    s.tensor("output_hc_base.weight", (hc,), "small")
    s.tensor("output_hc_scale.weight", (1,), "ones")
    n_embd, n_head, head_dim = L.n_embd, L.n_head, L.head_dim
    for i, ratio in enumerate(L.ratios):
        s.tensor(f"blk.{i}.attn_norm.weight", (n_embd,), "ones")
        s.tensor(f"blk.{i}.ffn_norm.weight", (n_embd,), "ones")
        s.tensor(f"blk.{i}.attn_sinks.weight", (n_head,), "small")
        s.tensor(f"blk.{i}.attn_q_a.weight", (n_embd, L.q_lora))
        s.tensor(f"blk.{i}.attn_q_a_norm.weight", (L.q_lora,), "ones")
        s.tensor(f"blk.{i}.attn_q_b.weight", (L.q_lora, n_head * head_dim))
        s.tensor(f"blk.{i}.attn_kv.weight", (n_embd, head_dim))
        s.tensor(f"blk.{i}.attn_kv_a_norm.weight", (head_dim,), "ones")
        # stored 2-D, the loader reshapes to (n_head*head_dim/o_groups, o_lora, o_groups)
        s.tensor(f"blk.{i}.attn_output_a.weight", (n_head * head_dim // L.o_groups, L.o_lora * L.o_groups))
        s.tensor(f"blk.{i}.attn_output_b.weight", (L.o_groups * L.o_lora, n_embd))
        _hyper_connections(s, i, n_embd, hc)
        if ratio:
            coff = 2 if ratio == 4 else 1  # ratio-4 windows overlap: two halves per entry
            s.tensor(f"blk.{i}.attn_compressor_kv.weight", (n_embd, coff * head_dim))
            s.tensor(f"blk.{i}.attn_compressor_gate.weight", (n_embd, coff * head_dim))
            s.tensor(f"blk.{i}.attn_compressor_ape.weight", (coff * head_dim, ratio), "ape")
            s.tensor(f"blk.{i}.attn_compressor_norm.weight", (head_dim,), "ones")
        if ratio == 4:
            s.tensor(f"blk.{i}.indexer.proj.weight", (n_embd, L.n_idx_head))
            s.tensor(f"blk.{i}.indexer.attn_q_b.weight", (L.q_lora, L.n_idx_head * L.n_idx))
            s.tensor(f"blk.{i}.indexer_compressor_kv.weight", (n_embd, 2 * L.n_idx))
            s.tensor(f"blk.{i}.indexer_compressor_gate.weight", (n_embd, 2 * L.n_idx))
            s.tensor(f"blk.{i}.indexer_compressor_ape.weight", (2 * L.n_idx, ratio), "ape")
            s.tensor(f"blk.{i}.indexer_compressor_norm.weight", (L.n_idx,), "ones")
        _moe_ffn(s, i, n_embd, L.n_ff_exp, L.n_expert, 1)
        s.tensor(f"blk.{i}.exp_probs_b.bias", (L.n_expert,), "small")
    return s


TINY_ARCHS: dict[str, Callable[[], TinySpec]] = {
    "glm5-next": glm5_next_spec,
    "minimax-m3": minimax_m3_spec,
    "deepseek4": deepseek4_spec,
}


# --------------------------------------------------------------------------- dense layouts for the reference model


def _dense_spec(arch: str, head_dim: int, qkv_bias: bool = False, qk_norm: bool = False, tied: bool = False,
                rope_freqs: bool = False, linear_rope: float = 0.0) -> TinySpec:
    """A llama-family model with every feature the reference model reads from the file:
    grouped-query attention (4 query heads on 2 KV heads), norm weights that are not ones,
    and per architecture a tied output and Llama-3 RoPE frequency divisors (llama), Q/K/V
    biases and linear RoPE scaling (qwen2), per-head Q/K norms and a head width that is not
    n_embd / n_head (qwen3)."""
    s = TinySpec(arch)
    n_embd, n_head, n_kv, n_ff, n_layer = 32, 4, 2, 64, 2
    _common(s, n_embd, n_layer)
    if tied:
        s.tensors = [t for t in s.tensors if t[0] != "output.weight"]
    if rope_freqs:
        s.tensor("rope_freqs.weight", (head_dim // 2,), "freq")
    if linear_rope:
        s.key(Keys.Rope.SCALING_TYPE, "linear")
        s.key(Keys.Rope.SCALING_FACTOR, linear_rope)
    s.key(Keys.Attention.HEAD_COUNT, n_head)
    s.key(Keys.Attention.HEAD_COUNT_KV, n_kv)
    s.key(Keys.Attention.KEY_LENGTH, head_dim)
    s.key(Keys.Attention.VALUE_LENGTH, head_dim)
    s.key(Keys.LLM.FEED_FORWARD_LENGTH, n_ff)
    s.key(Keys.Rope.DIMENSION_COUNT, head_dim)
    s.key(Keys.Rope.FREQ_BASE, 10000.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        s.tensor(p + "attn_norm.weight", (n_embd,), "ape")
        for name, width in (("attn_q", n_head * head_dim), ("attn_k", n_kv * head_dim), ("attn_v", n_kv * head_dim)):
            s.tensor(p + name + ".weight", (n_embd, width))
            if qkv_bias:
                s.tensor(p + name + ".bias", (width,), "small")
        if qk_norm:
            s.tensor(p + "attn_q_norm.weight", (head_dim,), "ape")
            s.tensor(p + "attn_k_norm.weight", (head_dim,), "ape")
        s.tensor(p + "attn_output.weight", (n_head * head_dim, n_embd))
        s.tensor(p + "ffn_norm.weight", (n_embd,), "ape")
        s.tensor(p + "ffn_gate.weight", (n_embd, n_ff))
        s.tensor(p + "ffn_up.weight", (n_embd, n_ff))
        s.tensor(p + "ffn_down.weight", (n_ff, n_embd))
    return s


# the numpy reference model's layouts (kvphase/reference/model.py), checked against llama.cpp
DENSE_TINY_ARCHS: dict[str, Callable[[], TinySpec]] = {
    "llama": lambda: _dense_spec("llama", head_dim=8, tied=True, rope_freqs=True),
    "qwen2": lambda: _dense_spec("qwen2", head_dim=8, qkv_bias=True, linear_rope=4.0),
    "qwen3": lambda: _dense_spec("qwen3", head_dim=16, qk_norm=True),
}
