"""Prove the numpy reference designs equal to llama.cpp's compressed attention on a real model.

llama.cpp evaluates a seeded random prompt several times, each with a different batch
split (one prefill; pools/blocks that straddle a batch boundary; small decode batches that
take llama.cpp's gather path). `capture` records the compression's intermediate tensors;
the reference design of the model's family recomputes them from the captured inputs, and
each layer reports how far the two are apart:

- compressed keys (k-pool pooled keys; deepseek4's compressed entries, pooled and finished, and
  its compressed caches as read back, plus the per-token gate logits with the per-phase bias):
  max / mean absolute difference;
- indexer scores: max / mean absolute difference, judged relative to the largest score;
- selected sets (pools or blocks, and the tokens they expose): exact agreement, and
  agreement up to exact score ties at the top-k boundary (llama.cpp's top-k is not stable).

Masks are not graph nodes and never reach the callback; the reference rebuilds them from
positions. A fresh single-sequence context puts position p in cache cell p, which is how
cell indices in `indexer_sel` / `indexer_sel_idx` are read as positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from kvphase.capture import CaptureRun, EngineSettings, GgmlTensor, op_name, run_and_capture, source_chain, split_name, tensor_name
from kvphase.errors import BackendError, PlanError
from kvphase.gguf_header import read_gguf_header
from kvphase.modelinfo import ModelInfo, read_model_info


@dataclass(frozen=True)
class Tolerances:
    """What counts as equal."""

    keys_abs: float = 1e-5  # compressed keys: max absolute difference
    scores_rel: float = 1e-4  # scores: max absolute difference / largest |score|
    # attention output (deepseek4): max absolute difference / largest |output|; flash
    # attention reads keys and values as F16 and sums them in F16
    attention_rel: float = 5e-3


@dataclass
class Diff:
    """Running max and mean of |llama.cpp - reference| over many values."""

    max: float = 0.0
    total: float = 0.0
    count: int = 0

    def add(self, ours: np.ndarray, theirs: np.ndarray) -> None:
        d = np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64)).ravel()
        if d.size:
            self.max = max(self.max, float(d.max()))
            self.total += float(d.sum())
            self.count += d.size

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def excess(self, what: str, limit: float, tolerance: str) -> list[str]:
        """The failure line when the largest difference is over `limit`, else nothing."""
        if not self.count or self.max <= limit:
            return []
        return [f"{what} differ by up to {self.max:.3g} (mean {self.mean:.3g}), tolerance {tolerance}"]


@dataclass
class LayerCheck:
    """Everything compared on one layer, summed over splits and ubatches."""

    layer: int
    keys: Diff = field(default_factory=Diff)  # compressed keys
    gates: Diff = field(default_factory=Diff)  # per-token gate logits incl. the per-phase bias (deepseek4)
    scores: Diff = field(default_factory=Diff)  # finite indexer / block scores
    score_scale: float = 0.0  # largest |finite score| llama.cpp produced
    mask_mismatch: int = 0  # scores finite in one and -inf in the other
    attention: Diff = field(default_factory=Diff)  # attention output from llama.cpp's q, keys and mask (deepseek4)
    attention_scale: float = 0.0  # largest |attention output| llama.cpp produced
    rows: int = 0  # selections compared (query x head)
    exact: int = 0  # identical selected sets
    ties: int = 0  # sets that differ only among exactly tied scores
    notes: list[str] = field(default_factory=list)  # the first few mismatches, for the user
    uncompared: list[str] = field(default_factory=list)  # what this layer should have compared but could not

    @property
    def mismatched(self) -> int:
        return self.rows - self.exact - self.ties

    def note(self, text: str) -> None:
        if len(self.notes) < 5:
            self.notes.append(text)

    def not_compared(self, text: str) -> None:
        """Record, once, something this layer should have compared but could not (a FAIL)."""
        if text not in self.uncompared:
            self.uncompared.append(text)

    def count(self, verdict: str, tokens_equal: bool, mismatch: str, tie_needs_equal_tokens: bool = False,
              differ: str = ", selected tokens differ") -> None:
        """Tally one compared selection: exact, an exact tie, or a mismatch noted for the user.

        A tie usually exposes other tokens than the reference's choice; where the check reads
        llama.cpp's own choice back (deepseek4's block mask), a tie must agree on tokens too.
        """
        self.rows += 1
        if verdict == "exact" and tokens_equal:
            self.exact += 1
        elif verdict == "tie" and (tokens_equal or not tie_needs_equal_tokens):
            self.ties += 1
        else:
            self.note(mismatch + ("" if tokens_equal else differ))

    def failures(self, tol: Tolerances) -> list[str]:
        """Why this layer fails; empty when it passes."""
        out = [f"not compared: {text}" for text in self.uncompared]
        out += self.gates.excess("gate logits", tol.keys_abs, f"{tol.keys_abs:g}")
        out += self.keys.excess("keys", tol.keys_abs, f"{tol.keys_abs:g}")
        out += self.scores.excess("scores", tol.scores_rel * max(self.score_scale, 1e-30),
                                  f"{tol.scores_rel:g} x largest score {self.score_scale:.3g}")
        if self.mask_mismatch:
            out.append(f"{self.mask_mismatch} scores are masked in one and not the other")
        out += self.attention.excess("attention outputs", tol.attention_rel * max(self.attention_scale, 1e-30),
                                     f"{tol.attention_rel:g} x largest output {self.attention_scale:.3g}")
        if self.mismatched:
            out.append(f"{self.mismatched} of {self.rows} selected sets differ beyond ties")
        if not self.rows and not self.keys.count:
            out.append("nothing was compared")
        return out


@dataclass
class ValidationReport:
    """The result of `validate_model`: one check per compressed layer."""

    model: Path
    architecture: str
    family: str
    n_tokens: int
    splits: list[list[int]]
    tolerances: Tolerances
    layers: list[LayerCheck]

    @property
    def passed(self) -> bool:
        return bool(self.layers) and all(not layer.failures(self.tolerances) for layer in self.layers)


# --------------------------------------------------------------------------- batch splits


def default_splits(n_tokens: int, stride: int) -> list[list[int]]:
    """One prefill; batches that cut pools in the middle; a prefill followed by small decode batches.

    Batches above 16 tokens take llama.cpp's scatter (mask) path, 16 or fewer its gather path
    (`build_inp_kpool`: max_ub = 16), so each split mixes both.
    """
    if n_tokens < 24:
        raise PlanError(f"validation needs at least 24 tokens, got {n_tokens}")
    straddle, left = [], n_tokens
    for size in _cycle([17 + stride // 2, stride + 1, 2 * stride + 3, 3]):
        size = min(size, left)
        straddle.append(size)
        left -= size
        if not left:
            break
    tail = [1, 1, 1, 5]
    return [[n_tokens], straddle, [n_tokens - sum(tail)] + tail]


def _cycle(values: list[int]):
    while True:
        yield from values


def _check_split(split: Sequence[int], n_tokens: int) -> list[int]:
    split = [int(s) for s in split]
    if sum(split) != n_tokens or any(s <= 0 for s in split):
        raise PlanError(f"batch split {split} must be positive sizes summing to {n_tokens}")
    return split


# --------------------------------------------------------------------------- model tensors


def read_model_tensor(path: str | Path, name: str) -> np.ndarray:
    """One tensor of a GGUF file as float32, numpy order (ggml's ne reversed)."""
    header = read_gguf_header(path)
    info = next((t for t in header.tensors if t.name == name), None)
    if info is None:
        raise PlanError(f"{path} has no tensor {name}")
    with open(path, "rb") as f:
        f.seek(info.data_offset)
        raw = np.frombuffer(f.read(info.n_bytes), dtype=np.uint8)
    shape = tuple(reversed(info.shape))
    if info.type_id == 0:
        return raw.view(np.float32).reshape(shape).copy()
    if info.type_id == 1:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if info.type_id == 30:  # BF16: the high half of an F32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(raw, GGMLQuantizationType(info.type_id)).astype(np.float32).reshape(shape)


# --------------------------------------------------------------------------- families


class FamilyCheck:
    """How one compression family is captured and compared; one instance per model."""

    names: tuple[str, ...] = ()  # llama.cpp tensor names (without the layer) to capture
    default_tokens: int = 64  # prompt length when the caller names none

    def uncompared(self, n_tokens: int) -> dict[int, list[str]]:
        """Per layer, what a prompt of n_tokens is too short to compare (the layer then FAILs)."""
        return {}

    def want(self, name: str, layer: int, t: GgmlTensor) -> tuple[str, int] | None:
        return (name, layer) if layer >= 0 and name in self.names else None

    def compare(self, run: CaptureRun, checks: dict[int, LayerCheck]) -> None:
        raise NotImplementedError


def _rows(a: np.ndarray, width: int) -> np.ndarray:
    """A captured (1, 1, n, width)-like array as (n, width)."""
    return np.asarray(a).reshape(-1, width)


def _set_agreement(ours: set, theirs: set, ref_scores: np.ndarray, k: int) -> str:
    """'exact', 'tie' (the sets differ only among pools tied with the k-th reference score) or 'diff'."""
    if ours == theirs:
        return "exact"
    finite = np.sort(ref_scores[np.isfinite(ref_scores)])[::-1]
    if len(ours) != len(theirs) or len(finite) < k:
        return "diff"
    kth = finite[k - 1]
    differing = ours ^ theirs
    return "tie" if all(ref_scores[i] == kth for i in differing) else "diff"


class KPoolCheck(FamilyCheck):
    """glm5-next: `build_kpool_select` (src/models/glm5-next.cpp) against `designs.kpool.KPool`."""

    names = (
        "indexer_q", "indexer_k", "indexer_gate", "indexer_weights", "indexer_pool_k_new",
        "indexer_pool_k", "indexer_score", "indexer_top_k", "indexer_sel", "indexer_sel_idx",
    )

    def __init__(self, info: ModelInfo, ape_roll: int = 0, cache_dtype: str = "f32"):
        from kvphase.designs.kpool import KPool

        p = info.compression.params
        self.design = KPool(kpool=p["kpool"], top_k=p["top_k"], select_tail=p["select_tail"], cache_dtype=cache_dtype)
        self.path = info.path
        self.ape_roll = ape_roll  # a deliberately wrong reference: the per-phase bias rolled by this many offsets
        self.layers = info.compression.layers
        self._ape: dict[int, np.ndarray] = {}

    def ape(self, layer: int) -> np.ndarray:
        if layer not in self._ape:
            ape = read_model_tensor(self.path, f"blk.{layer}.indexer_compressor_ape.weight")  # (kpool, d)
            self._ape[layer] = np.roll(ape, self.ape_roll, axis=0)
        return self._ape[layer]

    def compare(self, run: CaptureRun, checks: dict[int, LayerCheck]) -> None:
        for layer in run.layers("indexer_k"):
            check = checks.setdefault(layer, LayerCheck(layer))
            self._compare_layer(run, layer, check)

    def _compare_layer(self, run: CaptureRun, layer: int, check: LayerCheck) -> None:
        kp = self.design
        d = run.get("indexer_k", layer, 0).shape[-1]
        keys = np.concatenate([_rows(run.get("indexer_k", layer, u.index), d) for u in run.ubatches])  # (n, d)
        gates = np.concatenate([_rows(run.get("indexer_gate", layer, u.index), d) for u in run.ubatches])  # (n, d)
        ref_new = kp.pool_keys(keys, gates, self.ape(layer))  # (n_pool, d)
        ref_pool = kp.cached(ref_new)  # (n_pool, d)
        for ub in run.ubatches:
            pos = ub.positions  # (n_tokens,)
            first_new, n_real = kp.layout.n_complete(int(pos[0])), kp.layout.n_complete(int(pos[-1]) + 1)
            if n_real > first_new:  # with no completed pool llama.cpp pools a dummy entry
                got = _rows(run.get("indexer_pool_k_new", layer, ub.index), d)[: n_real - first_new]
                check.keys.add(got, ref_new[first_new:n_real])
            got_pool = _rows(run.get("indexer_pool_k", layer, ub.index), d)  # (n_pool_pad, d)
            check.keys.add(got_pool[:n_real], ref_pool[:n_real])

            q = run.get("indexer_q", layer, ub.index).reshape(len(pos), -1, d)  # (n_tokens, n_head, d)
            w = run.get("indexer_weights", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, n_head)
            ref_scores = kp.scores(q, w, ref_pool[:n_real], pos)  # (n_tokens, n_real)
            got_scores = run.get("indexer_score", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, n_pool_pad)
            _compare_scores(check, got_scores, ref_scores)
            self._compare_selection(run, layer, ub, check, ref_scores, n_real)

    def _compare_selection(self, run, layer, ub, check, ref_scores, n_real) -> None:
        kp, pos = self.design, ub.positions
        got_top = run.get("indexer_top_k", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, n_top)
        ref_top = kp.top_pools(ref_scores)  # (n_tokens, n_top), -1 padding
        ref_sel = kp.selected_positions(ref_top, pos)  # (n_tokens, n_sel), -1 padding
        got_tokens = self._selected_tokens(run, layer, ub, got_top)
        for t in range(len(pos)):
            n_live = int(min(kp.layout.n_visible(pos[t : t + 1])[0], got_top.shape[1]))
            ours = {int(i) for i in got_top[t, :n_live]}
            theirs = {int(i) for i in ref_top[t] if i >= 0}
            verdict = _set_agreement(ours, theirs, ref_scores[t], kp.n_top_pools)
            tokens_equal = got_tokens[t] == {int(p) for p in ref_sel[t] if p >= 0}
            check.count(verdict, tokens_equal,
                        f"ubatch {ub.index} pos {pos[t]}: pools {sorted(ours)} vs reference {sorted(theirs)}")

    def _selected_tokens(self, run, layer, ub, got_top) -> list[set[int]]:
        """The positions llama.cpp lets each query read, from `indexer_sel` or `indexer_sel_idx`."""
        kp, pos = self.design, ub.positions
        sel = run.find("indexer_sel", layer, ub.index)
        if sel is not None:  # scatter path: an additive mask over cells, 0 where visible
            mask = sel.reshape(len(pos), -1)
            return [set(np.flatnonzero(mask[t] == 0).tolist()) for t in range(len(pos))]
        idx = run.get("indexer_sel_idx", layer, ub.index).reshape(len(pos), -1)  # gather path: cells per slot
        out = []
        n_pool_slots = kp.n_top_pools * kp.kpool
        for t in range(len(pos)):
            n_live = int(min(kp.layout.n_visible(pos[t : t + 1])[0], got_top.shape[1]))
            live = list(idx[t, : n_live * kp.kpool])
            if kp.select_tail:  # `set_input_kpool`: tail slot k is real for k < (p - start + 1) % kpool
                n_tail = (int(pos[t]) - kp.start + 1) % kp.kpool
                live += list(idx[t, n_pool_slots : n_pool_slots + n_tail])
            out.append({int(c) for c in live})
        return out


def _first(run: CaptureRun, name: str, layer: int, ubatch: int) -> np.ndarray:
    """The first capture of a reused name (llama.cpp's unfused indexer names a permuted view the same)."""
    found = run.all(name, layer, ubatch)
    if not found:
        raise BackendError(f"llama.cpp computed no tensor {name}-{layer} in ubatch {ubatch}")
    return found[0].array


def _live(x: np.ndarray) -> np.ndarray:
    """Scores that are not masked: finite and above -FLT_MAX/2 (ggml's max pool starts from -FLT_MAX)."""
    return np.isfinite(x) & (x > -1e37)


def _compare_scores(check: LayerCheck, got: np.ndarray, ref: np.ndarray) -> None:
    """Scores over the reference's columns; llama.cpp's padding columns must all be masked."""
    n = ref.shape[-1]
    head, pad = got[..., :n], got[..., n:]
    finite_got, finite_ref = _live(head), _live(ref)
    check.mask_mismatch += int(np.sum(finite_got != finite_ref)) + int(np.sum(_live(pad)))
    both = finite_got & finite_ref
    check.scores.add(head[both], ref[both])
    if both.any():
        check.score_scale = max(check.score_scale, float(np.abs(head[both]).max()))


class MSACheck(FamilyCheck):
    """minimax-m3: the sparse branch of `llama_model_minimax_m3::graph` against `designs.msa.MSA`.

    The indexer q and k after RoPE carry no name in llama.cpp's graph; they are the ROPE
    nodes whose first-source chain reaches `blk.N.indexer.q_proj` / `k_proj`. The top-k
    block ids are the TOP_K node fed by `msa_bsf` (batch) or `msa_bs` + bias (decode).
    """

    names = ("msa_bs", "msa_bsf", "msa_mask4")

    def __init__(self, info: ModelInfo, shift: int = 0, cache_dtype: str = "f32"):
        from kvphase.designs.msa import MSA

        p = info.compression.params
        # a deliberately wrong reference puts block 0 `shift` positions late
        self.design = MSA(p["block_size"], p["top_k"], p["local_blocks"], start=abs(shift), cache_dtype=cache_dtype)

    def want(self, name: str, layer: int, t: GgmlTensor) -> tuple[str, int] | None:
        if layer >= 0 and name in self.names:
            return name, layer
        op = op_name(t)
        if op == "ROPE" and layer < 0:
            for src in source_chain(t, 6):
                m = split_name(tensor_name(src))
                if m[0].endswith(".indexer.q_proj.weight") or m[0].endswith(".indexer.k_proj.weight"):
                    kind = "msa_iq" if "q_proj" in m[0] else "msa_ik"
                    return kind, int(m[0].split(".")[1])
        if op == "TOP_K":
            for src in source_chain(t, 2):
                src_name, src_layer = split_name(tensor_name(src))
                if src_name in ("msa_bs", "msa_bsf") and src_layer >= 0:
                    return "msa_top_k", src_layer
        return None

    def compare(self, run: CaptureRun, checks: dict[int, LayerCheck]) -> None:
        for layer in run.layers("msa_ik"):
            self._compare_layer(run, layer, checks.setdefault(layer, LayerCheck(layer)))

    def _compare_layer(self, run: CaptureRun, layer: int, check: LayerCheck) -> None:
        msa = self.design
        d = run.get("msa_ik", layer, 0).shape[-1]
        keys = np.concatenate([_rows(run.get("msa_ik", layer, u.index), d) for u in run.ubatches])  # (n, d)
        for ub in run.ubatches:
            pos = ub.positions
            n_keys = int(pos[-1]) + 1
            q = run.get("msa_iq", layer, ub.index).reshape(len(pos), -1, d)  # (n_tokens, n_head, d)
            ref = msa.forward(q, keys[:n_keys], pos)
            n_head, n_blocks = ref.block_scores.shape[1:]
            got_bs = run.get("msa_bs", layer, ub.index).reshape(len(pos), n_head, -1)  # (n_tokens, n_head, nblk)
            _compare_scores(check, got_bs, ref.block_scores)
            got_top = run.get("msa_top_k", layer, ub.index).reshape(len(pos), n_head, -1)  # (n_tokens, n_head, K)
            mask = run.find("msa_mask4", layer, ub.index)  # (n_head, 1, n_tokens, n_kv) F16, batch path only
            for t in range(len(pos)):
                for h in range(n_head):
                    self._compare_row(check, ub, t, h, got_top[t, h], ref, mask, n_blocks, n_keys)

    def _compare_row(self, check, ub, t, h, got_top, ref, mask, n_blocks, n_keys) -> None:
        biased = ref.biased_scores[t, h]  # (n_blocks,)
        # llama.cpp's top-k fills spare slots with -inf (future) blocks; the causal mask hides them
        ours = {int(b) for b in got_top if b < n_blocks and np.isfinite(biased[b])}
        theirs = {int(b) for b in ref.top_blocks[t, h] if b >= 0}
        k = min(len(theirs), int(np.isfinite(biased).sum()))
        verdict = _set_agreement(ours, theirs, biased, max(k, 1))
        tokens_equal = True
        if mask is not None:
            seen = np.asarray(mask)[h, 0, t] == 0  # (n_kv,)
            tokens_equal = bool(np.array_equal(seen[:n_keys], ref.visible[t, h]) and not seen[n_keys:].any())
        check.count(verdict, tokens_equal,
                    f"ubatch {ub.index} pos {ub.positions[t]} head {h}: blocks {sorted(ours)} vs reference {sorted(theirs)}")


def hadamard(n: int) -> np.ndarray:
    """llama.cpp's orthonormal Walsh-Hadamard matrix (`ggml_gen_hadamard`, src/llama-kv-cache.cpp)."""
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h * np.float32(1.0 / np.sqrt(n))).astype(np.float32)  # (n, n), symmetric


def hadamard_rotate(x: np.ndarray) -> np.ndarray:
    """`llama_mul_mat_hadamard` with the rotation `build_input_k_rot` picks: the largest power of two
    (at least 64) dividing the row width, applied to each chunk of that many channels."""
    x = np.asarray(x, np.float32)  # (n, d)
    d = x.shape[-1]
    n = 64
    while d % (2 * n) == 0:
        n *= 2
    if d % n:
        raise PlanError(f"a Hadamard rotation of width {n} does not divide rows of {d} channels")
    return (x.reshape(-1, n) @ hadamard(n).T).reshape(x.shape).astype(np.float32)  # (n, d)


@dataclass(frozen=True)
class _Compressor:
    """One of the three compressors of a deepseek4 layer, as llama.cpp names its tensors."""

    prefix: str  # "csa" / "lid" (ratio 4) or "hca" (ratio 128)
    weights: str  # the GGUF tensors: "attn" (attn_compressor_*) or "indexer" (indexer_compressor_*)
    cache: str  # the node that reads its compressed cache back: csa_comp_k, hca_comp_k, lid_k


# a raw cell holds a token when its stored row is this close to the token's `kv` row: F16 storage
# rounds by ~1e-3 at most for these RMS-normed rows; two different tokens' rows differ by ~1
RAW_CELL_MATCH = 1e-2
_CSA = (_Compressor("csa", "attn", "csa_comp_k"), _Compressor("lid", "indexer", "lid_k"))
_HCA = (_Compressor("hca", "attn", "hca_comp_k"),)



def dsv4_rope_scaling(fields: dict, arch: str):
    """The RoPE scaling deepseek4.cpp gives its compressed entries, from GGUF metadata as
    llama.cpp reads it (llama_model::load_hparams, llama_context's cparams, default context
    params): freq_scale = 1/rope.scaling.factor unless the type is "none"; for "yarn" the
    ramp is on (ext_factor 1, betas 32 and 1, the original context length) and
    `dsv4_rope_attn_factor` cancels the magnitude correction. Returns (freq_scale, Yarn or None)."""
    from kvphase.designs.dsv4 import Yarn

    kind = str(fields.get(f"{arch}.rope.scaling.type", "linear")).lower()
    factor = np.float32(fields.get(f"{arch}.rope.scaling.factor", 0.0) or 0.0)
    freq_scale = float(np.float32(1) / factor) if factor != 0 and kind != "none" else 1.0
    if kind != "yarn":
        return freq_scale, None
    n_ctx_orig = int(fields.get(f"{arch}.rope.scaling.original_context_length", 0)
                     or fields.get(f"{arch}.context_length", 0))
    attn_factor = np.float32(1) / Yarn.boost(freq_scale)  # dsv4_rope_attn_factor
    return freq_scale, Yarn(ext_factor=1.0, n_ctx_orig=n_ctx_orig, attn_factor=float(attn_factor))

class DSV4Check(FamilyCheck):
    """deepseek4: the compressors, lightning indexer and block masks of `src/models/deepseek4.cpp`
    against `designs.dsv4.DSV4`.

    The compressor keeps state across ubatches (`dsv4_build_comp_plan` in
    src/llama-kv-cache-dsv4.cpp): a block that completes in one ubatch reads tokens of earlier
    ones. So the per-token `*_state_kv` / `*_state_score` of every ubatch are joined, and the
    reference pools them from position 0. llama.cpp names five nodes `*_state_compress`; they
    are told apart by op: CONT is the pooled entry, ROPE the finished one (after RMSNorm).
    A ubatch writes its completed blocks first; CSA pads with dummy blocks (and HCA writes one
    when none completes) that go to the cache's last cell and are never read.

    Where a cache is rotated (`*_state_compress_rot`), llama.cpp rounds to its type_k after the
    rotation, so the rotation node is compared with the rotated reference entries, the read-back
    with `design.store` of llama.cpp's rows, and the scores are recomputed in the rotated basis
    (`lid_q_rope` rotated as `lid_q_rot`; see `_compare_compressor` for the keys they read).

    The raw sliding window lives in a ring of cells whose positions are not graph nodes; each
    visible cell's token is found by matching its content to the tokens' `kv` rows, and the
    tokens each query reads must be the design's raw window. The attention output is
    recomputed from llama.cpp's q, keys and mask with the layer's sinks; the output
    projection after it is not compared.
    """

    def __init__(self, info: ModelInfo, ape_roll: int = 0, cache_dtype: str = "f32"):
        from kvphase.designs.dsv4 import DSV4

        fields = read_gguf_header(info.path).fields
        arch = info.architecture
        ratios = [int(r) for r in np.atleast_1d(fields.get(f"{arch}.attention.compress_ratios", []))]
        if len(ratios) == 1:
            ratios = ratios * info.n_layers
        self.path = info.path
        self.ape_roll = ape_roll  # a deliberately wrong reference: every per-phase bias rolled by this many offsets
        self.eps = float(fields.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))
        self.n_rot = int(fields.get(f"{arch}.rope.dimension_count", 0))
        self.rope_base = float(fields.get(f"{arch}.attention.compress_rope_freq_base", 10000.0))
        self.freq_scale, self.yarn = dsv4_rope_scaling(fields, arch)
        n_swa = int(fields.get(f"{arch}.attention.sliding_window", 0))
        top_k = int(fields.get(f"{arch}.attention.indexer.top_k", 512))
        # llama_kv_cache: every cache of a deepseek4 whose head is as wide as its indexer's
        # is Hadamard-rotated (attn_rot_k); F32/F16 caches are not rotated otherwise
        head_dim = fields.get(f"{arch}.attention.key_length")
        self.rotated = head_dim is not None and head_dim == fields.get(f"{arch}.attention.indexer.key_length")
        self.designs = {
            i: DSV4(ratio=r, n_swa=n_swa, top_k=top_k, cache_dtype=cache_dtype) for i, r in enumerate(ratios) if r > 1
        }
        self.default_tokens = max([64] + [2 * r + 32 for r in ratios])  # two HCA blocks and a tail
        self.names = tuple(
            f"{c.prefix}_{part}" for c in _CSA + _HCA
            for part in ("state_kv", "state_score", "state_score_ape", "state_compress", "state_compress_rot")
        ) + ("csa_comp_k", "hca_comp_k", "lid_k", "lid_q_rope", "lid_weights", "lid_score_masked", "lid_top_k",
             "csa_top_k_mask", "csa_lid_kq_mask", "hca_kq_mask", "kv", "csa_raw_k", "hca_raw_k",
             "q", "csa_k_all", "hca_k_all", "attn_csa_lid", "attn_hca")
        self._tensors: dict[str, np.ndarray] = {}

    def uncompared(self, n_tokens: int) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for layer, design in self.designs.items():
            if n_tokens < design.ratio:
                out.setdefault(layer, []).append(
                    f"no ratio-{design.ratio} block completes within {n_tokens} tokens, so this layer's "
                    f"compressor and cache were not compared; use --tokens {2 * design.ratio + 32} or more"
                )
        return out

    def tensor(self, name: str) -> np.ndarray:
        if name not in self._tensors:
            t = read_model_tensor(self.path, name)
            if name.endswith("_ape.weight"):  # (ratio, C): one row per phase
                t = np.roll(t, self.ape_roll, axis=0)
            self._tensors[name] = t
        return self._tensors[name]

    def compare(self, run: CaptureRun, checks: dict[int, LayerCheck]) -> None:
        for layer, design in sorted(self.designs.items()):
            check = checks.setdefault(layer, LayerCheck(layer))
            entries = {c.prefix: self._compare_compressor(run, layer, design, c, check)
                       for c in (_CSA if design.is_csa else _HCA)}
            for ub in run.ubatches:
                if design.is_csa:
                    self._compare_indexer(run, layer, design, ub, entries["lid"], check)
                else:
                    self._compare_hca_mask(run, layer, design, ub, check)
                self._compare_attention(run, layer, design, ub, check)

    def _compare_attention(self, run, layer, design, ub, check: LayerCheck) -> None:
        """The attention output (`attn_csa_lid` / `attn_hca`) recomputed from llama.cpp's own
        q, keys (`*_k_all`: raw cells, then compressed entries, which are the values too),
        mask and the layer's sinks, as flash attention computes it: F16 q, keys and values,
        each head's sink logit added to the softmax denominator, scale 1/sqrt(head_dim)."""
        from kvphase.designs.windows import round_to_cache

        prefix = "csa" if design.is_csa else "hca"
        names = ("q", f"{prefix}_k_all", "attn_csa_lid" if design.is_csa else "attn_hca",
                 "csa_lid_kq_mask" if design.is_csa else "hca_kq_mask")
        found = [run.all(name, layer, ub.index) for name in names]
        if not all(found):
            check.not_compared(f"attention output: {', '.join(n for n, f in zip(names, found) if not f)} not captured")
            return
        q, keys, expected, mask = (f[-1].array for f in found)
        n, d = len(ub.positions), keys.shape[-1]
        keys = _rows(keys, d)  # (n_kv, d)
        q = _rows(q, d)  # (n * n_head, d)
        if self.rotated:
            q = hadamard_rotate(q)
        q = q.reshape(n, -1, d)  # (n_tokens, n_head, d)
        mask = np.asarray(mask).reshape(-1, mask.shape[-1])[:n, : len(keys)]  # (n_tokens, n_kv)
        q16, keys16 = round_to_cache(q, "f16"), round_to_cache(keys, "f16")  # what flash attention multiplies
        logits = np.einsum("thd,kd->thk", q16, keys16) / np.float32(np.sqrt(d)) + mask[:, None, :]  # (n, n_head, n_kv)
        sinks = self.tensor(f"blk.{layer}.attn_sinks.weight").reshape(1, -1, 1)  # (1, n_head, 1)
        peak = np.maximum(logits.max(axis=-1, keepdims=True), sinks)  # (n, n_head, 1)
        weights = np.exp(logits - peak)  # (n, n_head, n_kv)
        total = weights.sum(axis=-1, keepdims=True) + np.exp(sinks - peak)  # (n, n_head, 1)
        out = np.einsum("thk,kd->thd", weights / total, keys16)  # (n, n_head, d)
        if self.rotated:
            out = hadamard_rotate(out.reshape(-1, d)).reshape(out.shape)
        expected = np.asarray(expected).reshape(out.shape)  # (n, n_head, d)
        check.attention.add(expected, out)
        check.attention_scale = max(check.attention_scale, float(np.abs(expected).max()))

    # -- compressors ---------------------------------------------------------------------------

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        from kvphase.designs.dsv4 import rope

        d = x.shape[1]
        return rope(x, positions, self.n_rot, self.rope_base, offset=d - self.n_rot, freq_scale=self.freq_scale,
                    yarn=self.yarn)

    def _compare_compressor(self, run, layer, design, comp: _Compressor, check: LayerCheck) -> np.ndarray:
        """Gate logits, pooled and finished entries, the rotation, and the cache read-back of one compressor.

        Returns the keys the reference indexer scores: the reference's cache entries (finished,
        rotated where llama.cpp rotates this cache, then `design.store`), except that a channel whose
        F32 pre-store value agrees with llama.cpp's within the key tolerance takes llama.cpp's
        rounding of it (both round to nearest; only which side of an F16 midpoint differs).

        Each stage is compared at its own input: rounding to an F16 cache is discontinuous, so a
        reference entry a few F32 ulps from llama.cpp's can round one F16 ulp apart (about 1e-3 near
        2). The F32 stages (pooled, finished, rotated) are compared with the reference; the store is
        checked as `design.store` of llama.cpp's pre-store rows (`*_state_compress_rot`, or the ROPE
        node without a rotation), which llama.cpp must reproduce exactly. Left in the indexer's keys,
        such one-ulp flips move scores by up to ~1.1e-4 of the largest score (seed 2 of the tiny model),
        past the 1e-4 tolerance; a reference that is really off (beyond 1e-5) keeps its own keys.
        """
        ape = self.tensor(f"blk.{layer}.{comp.weights}_compressor_ape.weight")  # (ratio, C)
        norm = self.tensor(f"blk.{layer}.{comp.weights}_compressor_norm.weight")  # (d,)
        width = ape.shape[1]  # C = 2d (overlapped) or d
        d = norm.shape[-1]
        joined = lambda name: np.concatenate([_rows(run.get(name, layer, u.index), width) for u in run.ubatches])
        kv, gate = joined(f"{comp.prefix}_state_kv"), joined(f"{comp.prefix}_state_score")  # (n, C), (n, C)
        logits = design.gate_logits(gate, ape)  # (n, C)
        pooled = design.pool(kv, logits)  # (n_blocks, d)
        finished = design.finished(kv, gate, ape, norm, self.eps, self._rope)  # (n_blocks, d), F32
        rotated_ref = hadamard_rotate(finished) if len(finished) else finished  # (n_blocks, d)
        stored = None  # (n_blocks, d) the cache as llama.cpp stored it; rows filled per ubatch
        rotated = False
        for ub in run.ubatches:
            pos = ub.positions
            check.gates.add(_rows(run.get(f"{comp.prefix}_state_score_ape", layer, ub.index), width), logits[pos])
            first, last = design.layout.n_complete(int(pos[0])), design.layout.n_complete(int(pos[-1]) + 1)
            nodes = run.all(f"{comp.prefix}_state_compress", layer, ub.index)
            by_op = {t.op: t.array for t in nodes}
            if "CONT" not in by_op or "ROPE" not in by_op:
                check.note(f"ubatch {ub.index}: {comp.prefix}_state_compress nodes {[t.op for t in nodes]}, "
                           "expected CONT (pooled) and ROPE (finished)")
                check.mask_mismatch += 1
                continue
            rot = run.find(f"{comp.prefix}_state_compress_rot", layer, ub.index)
            rotated = rotated or rot is not None
            if stored is None:  # until llama.cpp's own rows arrive, the reference's
                stored = design.store(rotated_ref if rot is not None else finished)
            if last > first:  # the blocks this ubatch completes come first, dummies after
                check.keys.add(_rows(by_op["CONT"], d)[: last - first], pooled[first:last])
                check.keys.add(_rows(by_op["ROPE"], d)[: last - first], finished[first:last])
                pre_store = _rows(by_op["ROPE"], d)[: last - first]  # (last - first, d)
                if rot is not None:  # the cache is rotated before it is stored (and rounded)
                    pre_store = _rows(rot, d)[: last - first]
                    check.keys.add(pre_store, rotated_ref[first:last])
                stored[first:last] = design.store(pre_store)
            if last:  # the cache as the attention / indexer reads it back
                cache = _rows(_first(run, comp.cache, layer, ub.index), d)[:last]  # (last, d)
                check.keys.add(cache, stored[:last])
        ref_pre = rotated_ref if rotated else finished  # (n_blocks, d) the reference before the store
        if stored is None:
            return design.store(ref_pre)  # (n_blocks, d)
        llama_pre = np.full_like(ref_pre, np.nan)  # (n_blocks, d) llama.cpp's pre-store rows
        for ub in run.ubatches:
            first, last = design.layout.n_complete(int(ub.positions[0])), design.layout.n_complete(int(ub.positions[-1]) + 1)
            node = run.find(f"{comp.prefix}_state_compress_rot", layer, ub.index) if rotated else None
            if node is None:
                node = next((t.array for t in run.all(f"{comp.prefix}_state_compress", layer, ub.index) if t.op == "ROPE"), None)
            if node is not None and last > first:
                llama_pre[first:last] = _rows(node, d)[: last - first]
        agree = np.abs(llama_pre - ref_pre) <= Tolerances().keys_abs  # NaN (not produced) never agrees
        return np.where(agree, design.store(np.nan_to_num(llama_pre)), design.store(ref_pre))  # (n_blocks, d)

    # -- selection -----------------------------------------------------------------------------

    def _raw_window_ok(self, run, layer, design, ub, mask: np.ndarray, n_comp: int, check: LayerCheck) -> np.ndarray:
        """Per query: the raw cells the mask exposes hold exactly the tokens of the design's raw
        window. A cell's token is found by its content: the `*_raw_k` view of the ring equals,
        as stored, the `kv` row of the token written there (rotated first where the cache is,
        `self.rotated`)."""
        pos = ub.positions
        visible = np.asarray(mask)[:, : mask.shape[1] - n_comp] == 0  # (n_tokens, n_raw_cells)
        expected = design.raw_window(pos, int(pos[-1]) + 1)  # (n_tokens, n_keys)
        cells = run.find(f"{'csa' if design.is_csa else 'hca'}_raw_k", layer, ub.index)
        if cells is None:
            check.not_compared("the raw window's cells were not captured, so its tokens were not compared")
            return np.zeros(len(pos), dtype=bool)
        held = self._cell_positions(run, layer, design, ub, cells)  # (n_raw_cells,), -1 where no token matches
        ok = np.zeros(len(pos), dtype=bool)  # (n_tokens,)
        for t in range(len(pos)):
            seen = held[visible[t, : len(held)]]  # positions of the cells query t reads
            ok[t] = visible[t, len(held) :].sum() == 0 and (seen >= 0).all() and (
                sorted(seen.tolist()) == np.flatnonzero(expected[t]).tolist())
        return ok

    def _cell_positions(self, run, layer, design, ub, cells: np.ndarray) -> np.ndarray:
        """The position of the token each raw cell holds (-1: none within F16 rounding)."""
        rows = [(u.positions, _rows(run.all("kv", layer, u.index)[-1].array, cells.shape[-1]))
                for u in run.ubatches[: ub.index + 1]]
        positions = np.concatenate([p for p, _ in rows])  # (n_written,)
        kv = np.concatenate([r for _, r in rows])  # (n_written, d)
        cells = _rows(cells, cells.shape[-1])  # (n_cells, d)
        stored = design.store(hadamard_rotate(kv) if self.rotated else kv)  # (n_written, d)
        square = (cells**2).sum(1)[:, None] + (stored**2).sum(1)[None, :] - 2 * cells @ stored.T  # (n_cells, n_written)
        best = square.argmin(axis=1)  # (n_cells,) nearest token row
        found = np.abs(cells - stored[best]).max(axis=1) <= RAW_CELL_MATCH  # (n_cells,)
        return np.where(found, positions[best], -1)  # (n_cells,)

    def _compare_indexer(self, run, layer, design, ub, index_keys, check: LayerCheck) -> None:
        from kvphase.designs.windows import rows_to_mask

        pos = ub.positions
        n_blocks = design.layout.n_complete(int(pos[-1]) + 1)
        q = run.get("lid_q_rope", layer, ub.index)
        q = q.reshape(len(pos), -1, q.shape[-1])  # (n_tokens, n_head, d_idx)
        if run.find("lid_state_compress_rot", layer, ub.index) is not None:  # keys rotated, then rounded
            q = hadamard_rotate(q.reshape(-1, q.shape[-1])).reshape(q.shape)  # `lid_q_rot`
        w = run.get("lid_weights", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, n_head)
        score_nodes = run.all("lid_score_masked", layer, ub.index)
        unfused = bool(score_nodes) and score_nodes[-1].op != "LIGHTNING_INDEXER"  # mul_mat rounds q to type_k
        ref_scores = design.indexer_scores(q, w, index_keys[:n_blocks], pos, round_queries=unfused)  # (n_tokens, n_blocks)
        _compare_scores(check, run.get("lid_score_masked", layer, ub.index).reshape(len(pos), -1), ref_scores)
        ref = design.select(pos, int(pos[-1]) + 1, n_blocks, ref_scores)
        got_top = run.get("lid_top_k", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, k)
        comp_mask = run.get("csa_top_k_mask", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, n_comp_cells)
        full_mask = run.get("csa_lid_kq_mask", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, raw + comp)
        raw_ok = self._raw_window_ok(run, layer, design, ub, full_mask, comp_mask.shape[1], check)
        for t in range(len(pos)):
            live = _live(ref_scores[t])  # (n_blocks,)
            # llama.cpp's top-k fills spare slots with masked blocks; the mask hides them
            ours = {int(b) for b in got_top[t] if 0 <= b < n_blocks and live[b]}
            theirs = {int(b) for b in ref.top_blocks[t] if b >= 0}
            verdict = _set_agreement(ours, theirs, ref_scores[t], max(min(design.top_k, int(live.sum())), 1))
            seen = comp_mask[t] == 0  # (n_comp_cells,)
            own = rows_to_mask(np.array(sorted(ours) or [-1]), n_blocks)  # llama.cpp's own choice, (n_blocks,)
            tokens_equal = bool(np.array_equal(seen[:n_blocks], own) and not seen[n_blocks:].any() and raw_ok[t])
            self._count(check, ub, t, verdict, tokens_equal, f"blocks {sorted(ours)} vs reference {sorted(theirs)}")

    def _compare_hca_mask(self, run, layer, design, ub, check: LayerCheck) -> None:
        pos = ub.positions
        n_blocks = design.layout.n_complete(int(pos[-1]) + 1)
        ref = design.select(pos, int(pos[-1]) + 1, n_blocks)
        mask = run.get("hca_kq_mask", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, raw + comp)
        comp = run.find("hca_comp_k", layer, ub.index)
        n_comp = _rows(comp, comp.shape[-1]).shape[0] if comp is not None else 0
        raw_ok = self._raw_window_ok(run, layer, design, ub, mask, n_comp, check)
        seen = mask[:, mask.shape[1] - n_comp :] == 0  # (n_tokens, n_comp_cells)
        for t in range(len(pos)):
            equal = bool(np.array_equal(seen[t, :n_blocks], ref.block_visible[t]) and not seen[t, n_blocks:].any())
            self._count(check, ub, t, "exact" if equal else "diff", bool(raw_ok[t]),
                        f"{int(seen[t].sum())} blocks visible vs reference {int(ref.block_visible[t].sum())}")

    @staticmethod
    def _count(check: LayerCheck, ub, t: int, verdict: str, tokens_equal: bool, what: str) -> None:
        check.count(verdict, tokens_equal, f"ubatch {ub.index} pos {ub.positions[t]}: {what}",
                    tie_needs_equal_tokens=True, differ=", masks differ")


FAMILIES: dict[str, Callable[..., FamilyCheck]] = {"kpool": KPoolCheck, "msa": MSACheck, "dsv4": DSV4Check}


# --------------------------------------------------------------------------- entry point


CACHE_TYPES = ("f32", "f16")  # f16: llama.cpp's default cache, which rounds keys, gates and pooled keys


def validate_model(
    model: str | Path,
    n_tokens: int | None = None,
    seed: int = 0,
    splits: Sequence[Sequence[int]] | None = None,
    tolerances: Tolerances = Tolerances(),
    settings: EngineSettings | None = None,
    perturb: int = 0,
    cache: str = "f32",
    on_split: Callable[[int, int, Sequence[int]], None] | None = None,
) -> ValidationReport:
    """Run the model through llama.cpp under several batch splits and compare every compressed layer.

    `perturb` != 0 makes the reference deliberately wrong (its per-phase gate bias, or its
    block grid, shifted by that many positions) to show that the check can fail. `n_tokens`
    defaults to the family's need (64; deepseek4: two ratio-128 blocks and a tail).
    `on_split(index, count, split)` is called before each batch split runs.
    """
    info = read_model_info(model)
    family = info.compression.family
    if family not in FAMILIES:
        raise PlanError(
            f"{info.architecture} declares compression {family!r}; validation supports "
            f"{', '.join(sorted(FAMILIES))} (deepseek4, glm5-next, minimax-m3)"
        )
    if cache not in CACHE_TYPES:
        raise PlanError(f"unknown cache type {cache!r}; expected one of {', '.join(CACHE_TYPES)}")
    checker = FAMILIES[family](info, perturb, cache_dtype=cache)
    n_tokens = checker.default_tokens if n_tokens is None else int(n_tokens)
    if info.context_length and n_tokens > info.context_length:
        raise PlanError(f"--tokens {n_tokens} does not fit: {info.path.name} has a {info.context_length}-token context")
    stride = int(info.compression.stride or 4)
    plan = [_check_split(s, n_tokens) for s in splits] if splits else default_splits(n_tokens, stride)
    settings = settings or EngineSettings()
    settings = replace(settings, n_ctx=max(settings.n_ctx, _round_up(n_tokens + 16, 256)), kv_f32=cache == "f32")
    tokens = np.random.default_rng(seed).integers(0, max(info.vocab_size, 2), size=n_tokens)
    checks: dict[int, LayerCheck] = {}
    for i, split in enumerate(plan):
        if on_split is not None:
            on_split(i, len(plan), split)
        run = run_and_capture(info.path, tokens.tolist(), split, checker.want, settings)
        checker.compare(run, checks)
    for layer, reasons in checker.uncompared(n_tokens).items():
        checks.setdefault(layer, LayerCheck(layer)).uncompared.extend(reasons)
    return ValidationReport(
        model=info.path,
        architecture=info.architecture,
        family=family,
        n_tokens=n_tokens,
        splits=plan,
        tolerances=tolerances,
        layers=[checks[k] for k in sorted(checks)],
    )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
