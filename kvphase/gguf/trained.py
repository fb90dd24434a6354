"""The `kvphase.trained.*` keys that `kvphase train` writes into its models (kvphase/train/export.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kvphase.gguf.metadata import Metadata

TRAINED_PREFIX = "kvphase.trained."
GPT2_DESIGNS = ("dense", "gated", "meanpool", "kpool", "cowa", "rolling")  # gpt2 blocks + kvphase's gate tensors: the reference runs them
DEEPSEEK4_DESIGNS = ("csa", "csa-disjoint", "csa-dense")  # deepseek4's own layout: llama.cpp runs them
GLM5_ENGINE_DESIGNS = ("glm-kpool", "glm-dense")  # glm5-next's own layout: llama.cpp runs them
# glm5-next files whose selection llama.cpp does not compute (it would run k-pool): the reference runs them
GLM5_REFERENCE_DESIGNS = ("glm-msa",)  # MiniMax-M3's MSA block selection in glm5-next's NoPE MLA layout
GLM5_DESIGNS = GLM5_ENGINE_DESIGNS + GLM5_REFERENCE_DESIGNS
ENGINE_DESIGNS = DEEPSEEK4_DESIGNS + GLM5_ENGINE_DESIGNS
DENSE_DESIGNS = ("dense", "csa-dense", "glm-dense")  # the controls and twins: every token read exactly
GATED_DESIGNS = ("gated", "kpool", "rolling")  # gpt2 designs whose files carry a gate and per-slot bias per head


def window_step(design: str, stride: int) -> int:
    """Tokens between consecutive pooled windows of S = `stride` tokens: S, or 1 for "rolling"
    (a window ending at every position)."""
    return 1 if design == "rolling" else stride
TRAINED_DESIGNS = GPT2_DESIGNS + ENGINE_DESIGNS + GLM5_REFERENCE_DESIGNS


@dataclass(frozen=True)
class TrainedSpec:
    """The `kvphase.trained.*` keys of a trained model."""

    design: str  # one of TRAINED_DESIGNS
    stride: int  # S; cowa: L, the slice length (its slices repeat every heads x L positions)
    local_window: int  # exact recent tokens
    top_k: int  # kpool: windows read per query
    offsets: str  # "fixed", "random" or "jitter" (jitter-trained models run at their fixed starts)
    starts: tuple[tuple[int, ...], ...]  # (layers, heads) window offsets; cowa: slice boundary offsets
    context: int  # tokens before the question in training: the sweep's default --context
    task: str  # prompts/<task>.toml the model was trained on
    steps: int  # optimisation steps done

    @property
    def in_engine_layout(self) -> bool:
        """The file is an architecture llama.cpp runs whole, compressor included."""
        return self.design in ENGINE_DESIGNS

    @property
    def compressed(self) -> bool:
        return self.design not in DENSE_DESIGNS


def read_trained_spec(meta: Metadata, n_layer: int, n_head: int) -> TrainedSpec | None:
    """The trained compressor a file declares (every key type- and range-checked), or None for other files."""
    if TRAINED_PREFIX + "design" not in meta.fields:
        return None
    design = meta.text(TRAINED_PREFIX + "design")
    if design not in TRAINED_DESIGNS:
        raise meta.bad(TRAINED_PREFIX + "design", design, f"one of {', '.join(TRAINED_DESIGNS)}")
    stride = meta.integer(TRAINED_PREFIX + "stride", low=2, high=1 << 16)
    starts = meta.integers(TRAINED_PREFIX + "starts", low=0, high=stride - 1)
    if len(starts) != n_layer * n_head:
        raise meta.bad(TRAINED_PREFIX + "starts", starts, f"{n_layer} x {n_head} window offsets")
    offsets = meta.text(TRAINED_PREFIX + "offsets")
    if offsets not in ("fixed", "random", "jitter"):
        raise meta.bad(TRAINED_PREFIX + "offsets", offsets, "fixed, random or jitter")
    return TrainedSpec(
        design=design,
        stride=stride,
        local_window=meta.integer(TRAINED_PREFIX + "local_window", high=1 << 20),
        top_k=meta.integer(TRAINED_PREFIX + "top_k", low=1, high=1 << 20),
        offsets=offsets,
        starts=tuple(tuple(starts[l * n_head : (l + 1) * n_head]) for l in range(n_layer)),
        context=meta.integer(TRAINED_PREFIX + "context", low=1, high=1 << 24),
        task=meta.text(TRAINED_PREFIX + "task"),
        steps=meta.integer(TRAINED_PREFIX + "steps", high=1 << 40),
    )
