"""Attention policies for the reference transformer: dense, or a chunked-compression design
from `kvphase.designs` applied post hoc per layer and per KV head, with the offset fixes.

The fixes to measure on real models (docs/protocol.md, "Fixes to measure on real models"): the window start `start` of a
design can be staggered across layers, across KV heads, or both, or drawn at random per
context (seeded). A design is wrapped, not copied, the way kvpress's ChunkPress wraps a
press: `CompressedAttention` asks the design which entries each query may read and runs
attention over them.
"""

from __future__ import annotations

import copy
import dataclasses
import zlib
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from kvphase.designs import DESIGNS
from kvphase.designs.kpool import PostHocKPool
from kvphase.designs.windows import check_non_negative
from kvphase.designs.windows import masked_softmax
from kvphase.errors import PlanError
from kvphase.reference.model import AttentionPolicy, DenseAttention

STAGGER_MODES = ("none", "layer", "head", "layer_head")


def design_stride(design) -> int:
    """The number of tokens between window starts, which sets the phase."""
    inner = design.kpool if isinstance(design, PostHocKPool) else design
    for name in ("stride", "block_size", "kpool"):
        if hasattr(inner, name):
            return int(getattr(inner, name))
    raise ValueError(f"cannot tell the stride of {type(design).__name__}")


def _with_start(design, start: int):
    if isinstance(design, PostHocKPool):
        return design.with_start(start)
    return dataclasses.replace(design, start=start)


def masked_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, scale: float) -> np.ndarray:
    """Softmax attention of one KV head's query heads over the entries each query may read.

    q: (n_group, n_query, head_dim); k, v: (n_entries, head_dim); visible: (n_query, n_entries).
    A query that may read nothing gets a zero output (as `designs.attend`).
    """
    scores = (q @ k.T) * scale  # (n_group, n_query, n_entries)
    probs = masked_softmax(scores, visible[None])  # (n_group, n_query, n_entries)
    return probs @ v  # (n_group, n_query, head_dim)


@runtime_checkable
class PerContext(Protocol):
    """A policy told each context before it is evaluated (window offsets drawn per context):
    `begin` returns a key that changes when its offsets do."""

    def begin(self, context: Sequence[int]) -> int: ...


@runtime_checkable
class PhaseShiftable(Protocol):
    """A policy whose window starts can move (offset ensembling): `shifted` is a copy moved by
    `phase_shift` tokens from where it was opened."""

    def shifted(self, phase_shift: int) -> "AttentionPolicy": ...


@runtime_checkable
class WindowDesigns(Protocol):
    """A policy that pools windows with one design per (layer, KV head), which a probe reads
    (`design_for`) or swaps (`with_designs`; refused where offsets are drawn per context)."""

    randomize: bool

    def design_for(self, layer: int, kv_head: int, n_head_kv: int): ...

    def with_designs(self, pinned: dict[tuple[int, int], object]) -> "AttentionPolicy": ...


def begin_context(policy, context: Sequence[int]) -> int | None:
    """The policy's key for this context's offsets (`PerContext.begin`); None where they never change."""
    return policy.begin(context) if isinstance(policy, PerContext) else None


class CompressedAttention:
    """A post-hoc design on chosen layers, with its start offset set per layer and KV head.

    stagger: "none" (every head uses the design's start), "layer" (start + layer * step),
    "head" (start + kv_head * step), "layer_head" (start + (layer * n_head_kv + kv_head) * step),
    all modulo the stride. randomize: draw each (layer, KV head) start uniformly in
    [0, stride) per context, from `seed` and the context's tokens (set by `begin`).
    """

    def __init__(
        self,
        design,
        stagger: str = "none",
        stagger_step: int = 1,
        randomize: bool = False,
        seed: int = 0,
        layers: Sequence[int] | None = None,
    ):
        if stagger not in STAGGER_MODES:
            raise ValueError(f"expected stagger to be one of {STAGGER_MODES}, got {stagger!r}")
        if not isinstance(randomize, bool):
            raise ValueError(f"expected randomize to be true or false, got {randomize!r}")
        check_non_negative("CompressedAttention", stagger_step=stagger_step, seed=seed)
        if layers is not None:
            if not isinstance(layers, (list, tuple)):
                raise ValueError(f"expected layers to be a list of layer indices such as [0, 2], got {layers!r}")
            check_non_negative("CompressedAttention", **{f"layers[{i}]": layer for i, layer in enumerate(layers)})
        if randomize and stagger != "none":
            raise ValueError(f"randomize draws every offset itself; expected stagger 'none', got {stagger!r}")
        self.design, self.stagger, self.stagger_step = design, stagger, int(stagger_step)
        self.randomize, self.seed = randomize, int(seed)
        self.layers = None if layers is None else frozenset(int(i) for i in layers)
        self.stride = design_stride(design)
        self._context_key = 0
        self.phase_shift = 0  # every window start moves back by this many tokens (`shifted`)
        self._designs: dict[tuple[int, int], object] = {}

    def begin(self, context: Sequence[int]) -> int:
        """Called by the backend before a context; returns a key that changes when offsets do."""
        if not self.randomize:
            return 0
        self._context_key = zlib.crc32(np.asarray(context, dtype=np.int64).tobytes())
        self._designs.clear()
        return self._context_key

    def start(self, layer: int, kv_head: int, n_head_kv: int) -> int:
        """The window start of one KV head of one layer."""
        if self.randomize:
            rng = np.random.default_rng([self.seed, self._context_key, layer, kv_head])
            return int(rng.integers(self.stride))
        if self.stagger == "none":
            return self.design.start
        index = {"layer": layer, "head": kv_head, "layer_head": layer * n_head_kv + kv_head}[self.stagger]
        return (self.design.start + index * self.stagger_step) % self.stride

    def window_start(self, layer: int, kv_head: int, n_head_kv: int) -> int:
        """`start`, moved back by the phase shift: every token's phase moves forward by it, as a
        prefix of that many tokens would move it, while positions stay where the model learned them."""
        return (self.start(layer, kv_head, n_head_kv) - self.phase_shift) % self.stride

    def shifted(self, phase_shift: int) -> "CompressedAttention":
        """A copy whose windows start `phase_shift` tokens earlier (offset ensembling, `sweep.offsets`)."""
        twin = copy.copy(self)
        twin.phase_shift, twin._designs = int(phase_shift), {}
        return twin

    def with_designs(self, pinned: dict[tuple[int, int], object]) -> "CompressedAttention":
        """A copy that uses the `pinned` designs for those (layer, KV head)s: how a probe swaps
        one design (a knockout) without touching the others."""
        if self.randomize:
            raise PlanError("a design cannot be swapped when window offsets are drawn per context")
        twin = copy.copy(self)
        twin._designs = {**self._designs, **pinned}
        return twin

    def design_for(self, layer: int, kv_head: int, n_head_kv: int):
        key = (layer, kv_head)
        if key not in self._designs:
            self._designs[key] = _with_start(self.design, self.window_start(layer, kv_head, n_head_kv))
        return self._designs[key]

    def attend(self, layer, q, k, v, q_pos, scale):
        if self.layers is not None and layer not in self.layers:
            return DenseAttention().attend(layer, q, k, v, q_pos, scale)
        n_head_kv = k.shape[0]
        out = np.empty_like(q)  # (n_head_kv, n_group, n_q, head_dim)
        for h in range(n_head_kv):
            design = self.design_for(layer, h, n_head_kv)
            queries = q[h].transpose(1, 0, 2)  # (n_q, n_group, head_dim)
            cache = design.compress(queries, k[h][:, None], v[h][:, None], q_pos)  # one KV head
            visible = cache.visible if cache.visible.ndim == 2 else cache.visible[:, 0]  # (n_q, n_entries)
            out[h] = masked_attention(q[h], cache.keys[:, 0], cache.values[:, 0], visible, scale)
        return out


POLICY_OPTIONS = ("stagger", "stagger_step", "randomize", "seed", "layers")


def check_policy_layers(policy, n_layer: int) -> None:
    """PlanError when a policy compresses layers the model does not have."""
    beyond = sorted(i for i in getattr(policy, "layers", None) or () if i >= n_layer)
    if beyond:
        raise PlanError(f"layers {beyond} do not exist: the model has {n_layer} layers (0 to {n_layer - 1})")


def make_policy(design: str = "dense", **options):
    """Build an attention policy by design name, for `kvphase sweep --backend reference --design NAME`.

    Designs: "dense" (no options), and each post-hoc design of `kvphase.designs.DESIGNS`: "meanpool" (window,
    stride, local_window=0, start=0); "blocktopk" (block_size, top_k, local_window=0, start=0); "kpool" (kpool,
    top_k, select_tail=True, start=0; the model's own queries act as the indexer).
    Offset fixes for every design: stagger="none"|"layer"|"head"|"layer_head",
    stagger_step=1, randomize=False, seed=0; layers=None (all) or the layers to compress.
    Raises PlanError for an unknown design or option, or a value the design rejects.
    """
    if design == "dense":
        if options:
            raise PlanError(f"design 'dense' takes no options, got {sorted(options)}")
        return DenseAttention()
    entry = DESIGNS.get(design)
    if entry is None or not entry.post_hoc:
        known = ["dense", *(name for name, registered in DESIGNS.items() if registered.post_hoc)]
        hint = f" ({entry.refusal})" if entry is not None else ""
        raise PlanError(f"the reference backend runs designs {known}, got {design!r}{hint}")
    names = entry.option_names
    unknown = sorted(set(options) - set(names) - set(POLICY_OPTIONS))
    if unknown:
        raise PlanError(f"design {design!r} takes {list(names) + list(POLICY_OPTIONS)}, got unknown {unknown}")
    try:
        made = entry.make(**{k: v for k, v in options.items() if k in names})
        return CompressedAttention(made, **{k: v for k, v in options.items() if k in POLICY_OPTIONS})
    except (TypeError, ValueError) as exc:
        raise PlanError(f"design {design!r}: {exc}") from None
