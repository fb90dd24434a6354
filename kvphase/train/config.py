"""What one training run is: the model, the compressor, the fixes, the optimisation.

`TrainConfig` is the run folder's `config.json` for `kvphase train`; every field is
checked where it is made, so a bad option is one line before anything is trained.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from kvphase.designs.dsv4 import CSA_RATIO, HCA_RATIO
from kvphase.errors import PlanError
from kvphase.gguf.trained import DEEPSEEK4_DESIGNS, DENSE_DESIGNS, GLM5_DESIGNS, TRAINED_DESIGNS

# what the deepseek4 layout trains with where an option is not given: its single K = V head
# (RMS-normed, no position embedding) leaves the retrieval at the mercy of gradient noise: at
# 16 sequences a step and 1500 steps seeds 0 and 2 never left the plateau, at 32 both learned
# it within 500 steps (measured; some seeds still stay on it). glm5-next's
# NoPE model finds the retrieval through its KDA layer between steps 500 and 750 while the
# learning rate is still high: within a 3000-step schedule it did (94% at step 750), within a
# 1000-step one it had not by the end (47%, measured); 2000 steps keep the rate high enough
LAYOUT_DEFAULTS = {"deepseek4": {"heads": 2, "batch": 32, "steps": 1000},
                   "glm5-next": {"heads": 2, "batch": 32, "steps": 2000}, "gpt2": {}}
# what a design trains with over its layout's defaults. cowa: slices of L = 2 tokens dealt to 2 heads, so
# the mask repeats every 4 positions, the longest period whose residues a sweep can depth-match in the
# 64-token trained context (modulus 8 already fails the depth check there; measured). 6000 steps: at 1500
# it still answers at chance; by 6000 it has learned to name a value no earlier question took, not retrieval
# meanpool: from scratch its uniform pooling stays at chance for 1500 steps and stops at elimination by 6000
# (measured); gated's trained gate for the first third of the steps (GATED_START), then uniform, carries it
# to retrieval (reports/README.md)
DESIGN_DEFAULTS = {"cowa": {"stride": 2, "heads": 2, "steps": 6000}, "meanpool": {"steps": 3000}}
GATED_START = 3  # meanpool's default --gate-steps: --steps // GATED_START
HINT_SHARE = 0.3  # csa-dense's default --hint-steps: this share of --steps. Without the hint no csa-dense recipe learned the
# retrieval in up to 5000 steps (more than a dozen tried); with it for 300 of 1000 steps seeds 0 and 1 answered 99.6-99.8% by step 700,
# which stays once the hint stops (reports/README.md)
COPY_RUN = 8  # words in the run the induction warm-up repeats (PairData.copy_sequence); every context (>= 16) holds two
MAX_STEPS = 1_000_000  # about 20 hours at the 14 steps/s of the default sizes on one core
STAGGER_MODES = ("none", "layer", "head", "layer_head")
OFFSET_MODES = ("fixed", "random", "jitter")
KDA_MODES = ("trained", "off")
RATIOS = (0, CSA_RATIO, HCA_RATIO)  # llama.cpp's deepseek4: a window-only layer, CSA (overlapped, indexer), HCA


@dataclass(frozen=True)
class TrainConfig:
    design: str  # one of TRAINED_DESIGNS: "dense" (control), "gated", "meanpool", "kpool", "cowa", "rolling" (gated's pooling at every position: its twin without chunk boundaries); "csa", "csa-disjoint", "csa-dense"; "glm-kpool", "glm-dense", "glm-msa"
    stride: int = 4  # S: tokens per pooled entry (window W = S); cowa: L, tokens per head slice
    local_window: int = 8  # most recent tokens every query also sees exactly (compressed designs)
    top_k: int = 8  # kpool: pools each query selects
    layers: int = 2  # transformer blocks
    heads: int = 4  # attention heads (each has its own compressor and window offset)
    d_model: int = 64  # width of the residual stream
    context: int = 64  # tokens before the queries; the sweep's default --context
    queries: int = 4  # key -> value questions after the context of every training sequence
    records: int = 4  # key value records in the context, at uniformly random non-overlapping places
    steps: int = 1500  # optimisation steps (retrieval appears after 400-700 of them; the gap closes slowly after)
    batch: int = 16  # sequences per step
    lr: float = 1e-3  # peak AdamW learning rate (linear warm-up, cosine decay); 3e-3 and 1e-2 plateau far longer
    seed: int = 0  # weights, data and offsets
    eval_every: int = 100  # steps between evaluations by residue (and checkpoints)
    eval_sequences: int = 256  # held-out sequences per evaluation (queries each)
    stagger: str = "none"  # window offsets staggered across "layer", "head" or "layer_head"
    offsets: str = "fixed"  # "fixed", "random" (per sequence and head) or "jitter" (per sequence, shared)
    task: str = "pairs"  # prompts/<task>.toml: the words and record format
    dense_steps: int = 200  # glm designs: steps of dense attention (the indexer distilled) before sparse training
    kda: str = "trained"  # glm designs: the KDA layer "trained" (first, the model's source of order) or "off" (a no-op)
    copy_steps: int = 0  # of `steps`, the first ones spent on the induction warm-up (PairData.copy_batch), not on pairs
    gate_steps: int = 0  # meanpool: of `steps`, the first ones pool with gated's trained gate, which is then dropped
    hint_steps: int = 0  # csa-dense: of `steps`, the first ones also train the induction hint (csa.induction_hint)
    indexer_top_k: int = 0  # csa designs: compressed entries DeepSeek-V4's lightning indexer selects per query (trained by
    # distillation after `dense_steps` of dense reading); 0: every entry is read and the indexer's weights are zero
    ratios: str = "4"  # csa designs: compress ratio per layer, a comma pattern repeated over the layers: 4 (CSA), 128 (HCA), 0 (window only)
    init: str = ""  # a run folder of the same design and sizes whose last checkpoint's weights this run starts from (a
    # context extension: every layout but gpt2's has no learned positions); the optimiser and schedule start afresh

    def __post_init__(self) -> None:
        if self.design not in TRAINED_DESIGNS:
            raise PlanError(f"unknown design {self.design!r}; expected one of {', '.join(TRAINED_DESIGNS)}")
        if self.stride < 2:
            raise PlanError(f"--stride must be at least 2, got {self.stride}")
        if self.stagger not in STAGGER_MODES:
            raise PlanError(f"unknown --stagger {self.stagger!r}; expected one of {', '.join(STAGGER_MODES)}")
        if self.offsets not in OFFSET_MODES:
            raise PlanError(f"unknown --offsets {self.offsets!r}; expected one of {', '.join(OFFSET_MODES)}")
        if self.offsets != "fixed" and self.stagger != "none":
            raise PlanError(f"--offsets {self.offsets} draws every offset itself; use --stagger none")
        self._check_sizes()
        if self.layout == "deepseek4":
            self._check_deepseek4()
        if self.layout == "glm5-next":
            self._check_glm5()
        elif self.kda != TrainConfig.kda or (self.dense_steps != TrainConfig.dense_steps and not self.indexer_top_k):
            if self.layout == "deepseek4" and self.kda == TrainConfig.kda:
                raise PlanError(f"--dense-steps warms up {self.design}'s lightning indexer: give --top-k too")
            raise PlanError(f"--kda and --dense-steps belong to the glm designs; {self.design} has neither")
        if self.layout != "deepseek4" and (self.indexer_top_k or self.ratios != TrainConfig.ratios):
            raise PlanError(f"--ratios and the lightning indexer's top-k belong to the csa designs; {self.design} has neither")
        if self.design in ("dense", "rolling") and (self.stagger != "none" or self.offsets != "fixed"):
            what = "the dense control has no windows" if self.design == "dense" else "rolling has a window at every position"
            raise PlanError(f"{what} to offset; drop --stagger/--offsets")
        if self.design == "cowa":
            self._check_cowa()

    def _check_sizes(self) -> None:
        for name in ("layers", "heads", "d_model", "context", "queries", "steps", "batch", "eval_every", "eval_sequences"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlanError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.d_model % self.heads:
            raise PlanError(f"--d-model {self.d_model} does not split into {self.heads} heads")
        if self.d_model // self.heads < 2:
            raise PlanError(f"--d-model {self.d_model} leaves heads narrower than 2 channels")
        if self.layers > 64 or self.d_model > 4096 or self.context > 65536:
            raise PlanError("sizes beyond 64 layers, d_model 4096 or context 65536 do not train on a CPU")
        if self.context < 8 * self.stride:
            unit = "slices of length" if self.design == "cowa" else "windows of stride"
            raise PlanError(f"--context {self.context} holds fewer than 8 {unit} {self.stride}")
        if not isinstance(self.records, int) or not self.queries <= self.records <= (self.context - 1) // 2:
            raise PlanError(
                f"--records must lie between --queries ({self.queries}) and what --context {self.context} holds "
                f"({(self.context - 1) // 2}), got {self.records!r}"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise PlanError(f"--lr must be a positive finite number, got {self.lr}")
        if self.steps > MAX_STEPS:
            raise PlanError(f"--steps beyond {MAX_STEPS} would train for days on a CPU, got {self.steps}")
        if self.seed < 0:
            raise PlanError(f"--seed must be a non-negative integer, got {self.seed}")
        if not isinstance(self.copy_steps, int) or not 0 <= self.copy_steps < self.steps:
            raise PlanError(f"--copy-steps must be a whole number from 0 to --steps - 1 ({self.steps - 1}), so that "
                            f"pairs are trained at all, got {self.copy_steps!r}")
        if not isinstance(self.gate_steps, int) or not 0 <= self.gate_steps < self.steps:
            raise PlanError(f"--gate-steps must be a whole number from 0 to --steps - 1 ({self.steps - 1}), so that "
                            f"the uniform pooling is trained at all, got {self.gate_steps!r}")
        if self.gate_steps and self.design != "meanpool":
            raise PlanError(f"--gate-steps starts meanpool with a trained gate; {self.design} has no uniform pooling to start")
        if self.gate_steps and self.copy_steps:
            raise PlanError("--gate-steps and --copy-steps each restart the schedule; give one of them")
        if not isinstance(self.hint_steps, int) or not 0 <= self.hint_steps <= self.steps:
            raise PlanError(f"--hint-steps must be a whole number from 0 to --steps ({self.steps}), got {self.hint_steps!r}")
        if self.hint_steps and self.design != "csa-dense":
            raise PlanError(f"--hint-steps guides csa-dense's attention to the record's tokens; {self.design} has no hint "
                            "(the other designs read records through their pooled entries)")
        if self.hint_steps and self.copy_steps:
            raise PlanError("--hint-steps and --copy-steps are two ways to the induction circuit; give one of them")
        if self.local_window < 0 or self.top_k < 1:
            raise PlanError(f"expected --local-window >= 0 and --top-k >= 1, got {self.local_window}, {self.top_k}")

    def _check_cowa(self) -> None:
        """What CoWA's head slices need: slices of L = --stride tokens dealt to at least two heads,
        whole slices in the context and every head owning one there; no top-k selection."""
        if self.heads < 2:
            raise PlanError(f"cowa deals slices out to the heads: --heads must be at least 2, got {self.heads} "
                            "(one head reading every slice is the dense control)")
        if self.context % self.stride:
            raise PlanError(f"cowa's slice length --stride {self.stride} does not divide --context {self.context}")
        if self.context < self.heads * self.stride:
            raise PlanError(f"cowa's slice period --heads x --stride = {self.heads * self.stride} is longer than "
                            f"--context {self.context}: some head would own no slice of it")
        if self.top_k != TrainConfig.top_k:
            raise PlanError("cowa reads its slices exactly and selects nothing; drop --top-k")

    def _check_deepseek4(self) -> None:
        """What deepseek4's file cannot express: its blocks start at absolute positions pos // 4."""
        if self.stride != 4:
            raise PlanError(f"{self.design} is deepseek4's CSA, whose compress ratio is 4; got --stride {self.stride}")
        if self.stagger != "none" or self.offsets != "fixed":
            raise PlanError(f"deepseek4 pools blocks at absolute positions (pos // 4); {self.design} takes no "
                            "--stagger or --offsets")
        if self.head_dim % 4:
            raise PlanError(f"{self.design} ropes half of each head in pairs: --d-model / --heads must be a multiple "
                            f"of 4, got {self.head_dim}")
        if self.design != "csa-dense" and self.local_window < 1:
            raise PlanError("deepseek4's sliding window holds the query itself: --local-window must be at least 1")
        if self.top_k != TrainConfig.top_k:  # the csa designs' --top-k is the indexer's (for_design moves it there)
            raise PlanError(f"{self.design} selects entries with its lightning indexer: give indexer_top_k, not top_k")
        self._check_ratios()
        if not isinstance(self.indexer_top_k, int) or self.indexer_top_k < 0:
            raise PlanError(f"--top-k must be a whole number of compressed entries, got {self.indexer_top_k!r}")
        blocks = self.n_positions // CSA_RATIO
        if self.indexer_top_k >= blocks:  # it would select every entry: an option that does nothing is refused
            raise PlanError(f"--top-k {self.indexer_top_k} selects every one of the {blocks} compressed entries "
                            f"--context {self.context} holds; give fewer, or drop --top-k to read them all")
        if self.indexer_top_k and self.design == "csa-dense":
            raise PlanError("csa-dense's compressed entries are exactly zero: its indexer has nothing to select; drop --top-k")
        if self.indexer_top_k and CSA_RATIO not in self.layer_ratios:
            raise PlanError("the lightning indexer selects ratio-4 (CSA) entries; --ratios has no 4")

    def _check_ratios(self) -> None:
        """llama.cpp's deepseek4 has ratios 0, 4 and 128, and dies (SIGFPE) on a file without a ratio-4 layer."""
        try:
            pattern = self._ratio_pattern()
        except ValueError:
            pattern = None
        if not pattern or any(r not in RATIOS for r in pattern):
            raise PlanError(f"--ratios must be a comma list of {', '.join(map(str, RATIOS))}, got {self.ratios!r}")
        if CSA_RATIO not in self.layer_ratios:
            raise PlanError(f"--ratios {self.ratios} over {self.layers} layers has no ratio-4 layer, which llama.cpp's "
                            "deepseek4 needs (measured: SIGFPE without one)")
        if HCA_RATIO in self.layer_ratios and self.n_positions < 2 * HCA_RATIO:
            raise PlanError(f"a ratio-128 (HCA) layer pools 128 tokens per entry: --context {self.context} leaves it "
                            "fewer than 2 entries; give --context 256 or more")

    def _check_glm5(self) -> None:
        """What glm5-next's file cannot express: pools start at the sequence's first position,
        and its MLA has no positions at all (NoPE)."""
        if self.stagger != "none" or self.offsets != "fixed":
            raise PlanError(f"glm5-next pools tokens from the sequence's first position; {self.design} takes no "
                            "--stagger or --offsets")
        if self.local_window != TrainConfig.local_window:
            raise PlanError(f"glm5-next has no sliding window (a query reads its selected pools and its own pool's "
                            f"tail); {self.design} takes no --local-window")
        if self.kda not in KDA_MODES:
            raise PlanError(f"unknown --kda {self.kda!r}; expected one of {', '.join(KDA_MODES)}")
        if not isinstance(self.dense_steps, int) or not 0 <= self.dense_steps <= MAX_STEPS:
            raise PlanError(f"--dense-steps must be an integer from 0 to {MAX_STEPS}, got {self.dense_steps!r}")

    @property
    def layout(self) -> str:
        """The file the model exports to: "deepseek4" (llama.cpp runs it) or "gpt2" (+ kvphase's gate tensors)."""
        return layout_of(self.design)

    @classmethod
    def for_design(cls, design: str, **options) -> TrainConfig:
        """The config of `kvphase train DESIGN`: the options given (None: not given) over the design's and
        the layout's defaults."""
        given = {k: v for k, v in options.items() if v is not None}
        if layout_of(design) == "deepseek4" and "top_k" in given:  # csa's --top-k is its lightning indexer's
            given["indexer_top_k"] = given.pop("top_k")
        merged = {**LAYOUT_DEFAULTS[layout_of(design)], **DESIGN_DEFAULTS.get(design, {}), **given}
        if design == "meanpool" and "gate_steps" not in given:
            merged["gate_steps"] = merged.get("steps", cls.steps) // GATED_START
        if design == "csa-dense" and "hint_steps" not in given and not merged.get("copy_steps"):
            merged["hint_steps"] = round(merged.get("steps", cls.steps) * HINT_SHARE)
        return cls(design=design, **merged)

    def _ratio_pattern(self) -> list[int]:
        return [int(r) for r in self.ratios.split(",")]

    @property
    def layer_ratios(self) -> tuple[int, ...]:
        """Each layer's compress ratio: the --ratios pattern repeated over the layers."""
        pattern = self._ratio_pattern()
        return tuple(pattern[i % len(pattern)] for i in range(self.layers))

    @property
    def dense_first(self) -> bool:
        """Whether the first `dense_steps` read densely while an indexer is distilled (the glm designs,
        csa with a trained top-k), the attention reading only what it selects after them."""
        return self.layout == "glm5-next" or self.indexer_top_k > 0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def n_positions(self) -> int:
        """Positions the model embeds: the context, then the queries (key, value each)."""
        return self.context + 2 * self.queries

    @property
    def compressed(self) -> bool:
        return self.design not in DENSE_DESIGNS

    @property
    def query_rows(self) -> np.ndarray:
        """Rows whose next-token logits answer the questions (queries,): a key at context + 2i, its value after it."""
        return self.context + 2 * np.arange(self.queries)

    @property
    def first_stage_steps(self) -> int:
        """Steps before the schedule restarts: the induction warm-up or meanpool's gated start."""
        return self.copy_steps + self.gate_steps

    def stage(self, step: int) -> TrainConfig:
        """The configuration a step trains with: meanpool's first `gate_steps` pool as gated does; the
        hint is trained in the first `hint_steps` only."""
        if step < self.gate_steps:
            return dataclasses.replace(self, design="gated", gate_steps=0)
        if step >= self.hint_steps > 0:
            return dataclasses.replace(self, hint_steps=0)
        return self

    def starts(self) -> list[list[int]]:
        """Fixed window offset of every (layer, head); random offsets are drawn per sequence instead."""
        index = {
            "none": lambda l, h: 0,
            "layer": lambda l, h: l,
            "head": lambda l, h: h,
            "layer_head": lambda l, h: l * self.heads + h,
        }[self.stagger]
        return [[index(l, h) % self.stride for h in range(self.heads)] for l in range(self.layers)]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlanError(f"config.json holds unknown training settings {unknown}")
        for f in dataclasses.fields(cls):
            kind = str if f.default is dataclasses.MISSING else type(f.default)
            value = data.get(f.name, f.default if f.default is not dataclasses.MISSING else None)
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
                expected = {int: "a whole number", float: "a number", str: "text"}[kind]
                raise PlanError(f"config.json: {f.name} is {str(value)[:40]!r}, expected {expected}")
        return cls(**data)


def layout_of(design: str) -> str:
    if design in DEEPSEEK4_DESIGNS:
        return "deepseek4"
    return "glm5-next" if design in GLM5_DESIGNS else "gpt2"
