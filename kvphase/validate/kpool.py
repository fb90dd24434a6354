"""k-pool (glm5-next): the pooled keys, indexer scores and selected pools against `designs.kpool.KPool`."""

from __future__ import annotations

import numpy as np

from kvphase.engines.capture import CaptureRun
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.gguf.tensors import read_model_tensor
from kvphase.validate.common import FamilyCheck, compare_scores, captured_rows, set_agreement
from kvphase.validate.report import LayerCheck


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
        self.model = info
        self.ape_roll = ape_roll  # a deliberately wrong reference: the per-phase bias rolled by this many offsets
        self.layers = info.compression.layers
        self._ape: dict[int, np.ndarray] = {}

    def ape(self, layer: int) -> np.ndarray:
        if layer not in self._ape:
            ape = read_model_tensor(self.model, f"blk.{layer}.indexer_compressor_ape.weight")  # (kpool, d)
            self._ape[layer] = np.roll(ape, self.ape_roll, axis=0)
        return self._ape[layer]

    def compare(self, run: CaptureRun, checks: dict[int, LayerCheck]) -> None:
        for layer in run.layers("indexer_k"):
            check = checks.setdefault(layer, LayerCheck(layer))
            self._compare_layer(run, layer, check)

    def _compare_layer(self, run: CaptureRun, layer: int, check: LayerCheck) -> None:
        kp = self.design
        d = run.get("indexer_k", layer, 0).shape[-1]
        keys = np.concatenate([captured_rows(run.get("indexer_k", layer, u.index), d) for u in run.ubatches])  # (n, d)
        gates = np.concatenate([captured_rows(run.get("indexer_gate", layer, u.index), d) for u in run.ubatches])  # (n, d)
        ref_new = kp.pool_keys(keys, gates, self.ape(layer))  # (n_pool, d)
        ref_pool = kp.cached(ref_new)  # (n_pool, d)
        for ub in run.ubatches:
            pos = ub.positions  # (n_tokens,)
            first_new, n_real = kp.layout.n_complete(int(pos[0])), kp.layout.n_complete(int(pos[-1]) + 1)
            if n_real > first_new:  # with no completed pool llama.cpp pools a dummy entry
                got = captured_rows(run.get("indexer_pool_k_new", layer, ub.index), d)[: n_real - first_new]
                check.keys.add(got, ref_new[first_new:n_real])
            got_pool = captured_rows(run.get("indexer_pool_k", layer, ub.index), d)  # (n_pool_pad, d)
            check.keys.add(got_pool[:n_real], ref_pool[:n_real])

            q = run.get("indexer_q", layer, ub.index).reshape(len(pos), -1, d)  # (n_tokens, n_head, d)
            w = run.get("indexer_weights", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, n_head)
            ref_scores = kp.scores(q, w, ref_pool[:n_real], pos)  # (n_tokens, n_real)
            got_scores = run.get("indexer_score", layer, ub.index).reshape(len(pos), -1)  # (n_tokens, n_pool_pad)
            compare_scores(check, got_scores, ref_scores)
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
            verdict = set_agreement(ours, theirs, ref_scores[t], kp.n_top_pools)
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
