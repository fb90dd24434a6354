"""deepseek4: compressors, lightning indexer and block masks against `designs.dsv4.DSV4`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvphase.designs.dsv4 import dsv4_rope_scaling, hadamard_rotate
from kvphase.engines.capture import CaptureRun
from kvphase.gguf.keys import Keys
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.gguf.tensors import read_model_tensor
from kvphase.validate.common import FamilyCheck, compare_scores, first_capture, live_scores, captured_rows, set_agreement
from kvphase.validate.options import Tolerances, deepseek4_tokens
from kvphase.validate.report import LayerCheck


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

        fields = info.header.fields
        arch = info.architecture
        ratios = [int(r) for r in np.atleast_1d(fields.get(Keys.Attention.COMPRESS_RATIOS.format(arch=arch), []))]
        if len(ratios) == 1:
            ratios = ratios * info.n_layer
        self.model = info
        self.ape_roll = ape_roll  # a deliberately wrong reference: every per-phase bias rolled by this many offsets
        self.eps = float(fields.get(Keys.Attention.LAYERNORM_RMS_EPS.format(arch=arch), 1e-6))
        self.n_rot = int(fields.get(Keys.Rope.DIMENSION_COUNT.format(arch=arch), 0))
        self.rope_base = float(fields.get(Keys.Attention.COMPRESS_ROPE_FREQ_BASE.format(arch=arch), 10000.0))
        self.freq_scale, self.yarn = dsv4_rope_scaling(fields, arch)
        n_swa = int(fields.get(Keys.Attention.SLIDING_WINDOW.format(arch=arch), 0))
        top_k = int(fields.get(Keys.Attention.Indexer.TOP_K.format(arch=arch), 512))
        # llama_kv_cache: every cache of a deepseek4 whose head is as wide as its indexer's
        # is Hadamard-rotated (attn_rot_k); F32/F16 caches are not rotated otherwise
        head_dim = fields.get(Keys.Attention.KEY_LENGTH.format(arch=arch))
        self.rotated = head_dim is not None and head_dim == fields.get(Keys.Attention.Indexer.KEY_LENGTH.format(arch=arch))
        self.designs = {
            i: DSV4(ratio=r, n_swa=n_swa, top_k=top_k, cache_dtype=cache_dtype) for i, r in enumerate(ratios) if r > 1
        }
        self.default_tokens = deepseek4_tokens(ratios)
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
            t = read_model_tensor(self.model, name)
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
        keys = captured_rows(keys, d)  # (n_kv, d)
        q = captured_rows(q, d)  # (n * n_head, d)
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
        joined = lambda name: np.concatenate([captured_rows(run.get(name, layer, u.index), width) for u in run.ubatches])
        kv, gate = joined(f"{comp.prefix}_state_kv"), joined(f"{comp.prefix}_state_score")  # (n, C), (n, C)
        logits = design.gate_logits(gate, ape)  # (n, C)
        pooled = design.pool(kv, logits)  # (n_blocks, d)
        finished = design.finished(kv, gate, ape, norm, self.eps, self._rope)  # (n_blocks, d), F32
        # llama.cpp rotates a cache only where its rows hold whole 64-channel blocks (build_input_k_rot)
        rotated_ref = hadamard_rotate(finished) if len(finished) and d % 64 == 0 else finished  # (n_blocks, d)
        stored = None  # (n_blocks, d) the cache as llama.cpp stored it; rows filled per ubatch
        rotated = False
        for ub in run.ubatches:
            pos = ub.positions
            check.gates.add(captured_rows(run.get(f"{comp.prefix}_state_score_ape", layer, ub.index), width), logits[pos])
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
                check.keys.add(captured_rows(by_op["CONT"], d)[: last - first], pooled[first:last])
                check.keys.add(captured_rows(by_op["ROPE"], d)[: last - first], finished[first:last])
                pre_store = captured_rows(by_op["ROPE"], d)[: last - first]  # (last - first, d)
                if rot is not None:  # the cache is rotated before it is stored (and rounded)
                    pre_store = captured_rows(rot, d)[: last - first]
                    check.keys.add(pre_store, rotated_ref[first:last])
                stored[first:last] = design.store(pre_store)
            if last:  # the cache as the attention / indexer reads it back
                cache = captured_rows(first_capture(run, comp.cache, layer, ub.index), d)[:last]  # (last, d)
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
                llama_pre[first:last] = captured_rows(node, d)[: last - first]
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
        rows = [(u.positions, captured_rows(run.all("kv", layer, u.index)[-1].array, cells.shape[-1]))
                for u in run.ubatches[: ub.index + 1]]
        positions = np.concatenate([p for p, _ in rows])  # (n_written,)
        kv = np.concatenate([r for _, r in rows])  # (n_written, d)
        cells = captured_rows(cells, cells.shape[-1])  # (n_cells, d)
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
        compare_scores(check, run.get("lid_score_masked", layer, ub.index).reshape(len(pos), -1), ref_scores)
        ref = design.select(pos, int(pos[-1]) + 1, n_blocks, ref_scores)
        got_top = run.get("lid_top_k", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, k)
        comp_mask = run.get("csa_top_k_mask", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, n_comp_cells)
        full_mask = run.get("csa_lid_kq_mask", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, raw + comp)
        raw_ok = self._raw_window_ok(run, layer, design, ub, full_mask, comp_mask.shape[1], check)
        for t in range(len(pos)):
            live = live_scores(ref_scores[t])  # (n_blocks,)
            # llama.cpp's top-k fills spare slots with masked blocks; the mask hides them
            ours = {int(b) for b in got_top[t] if 0 <= b < n_blocks and live[b]}
            theirs = {int(b) for b in ref.top_blocks[t] if b >= 0}
            verdict = set_agreement(ours, theirs, ref_scores[t], max(min(design.top_k, int(live.sum())), 1))
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
        n_comp = captured_rows(comp, comp.shape[-1]).shape[0] if comp is not None else 0
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
