"""MSA (minimax-m3): block scores and selected blocks against `designs.msa.MSA`."""

from __future__ import annotations

import numpy as np

from kvphase.engines.capture import CaptureRun, GgmlTensor, op_name, source_chain, split_name, tensor_name
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.validate.common import FamilyCheck, compare_scores, captured_rows, set_agreement
from kvphase.validate.report import LayerCheck


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
        keys = np.concatenate([captured_rows(run.get("msa_ik", layer, u.index), d) for u in run.ubatches])  # (n, d)
        for ub in run.ubatches:
            pos = ub.positions
            n_keys = int(pos[-1]) + 1
            q = run.get("msa_iq", layer, ub.index).reshape(len(pos), -1, d)  # (n_tokens, n_head, d)
            ref = msa.forward(q, keys[:n_keys], pos)
            n_head, n_blocks = ref.block_scores.shape[1:]
            got_bs = run.get("msa_bs", layer, ub.index).reshape(len(pos), n_head, -1)  # (n_tokens, n_head, nblk)
            compare_scores(check, got_bs, ref.block_scores)
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
        verdict = set_agreement(ours, theirs, biased, max(k, 1))
        tokens_equal = True
        if mask is not None:
            seen = np.asarray(mask)[h, 0, t] == 0  # (n_kv,)
            tokens_equal = bool(np.array_equal(seen[:n_keys], ref.visible[t, h]) and not seen[n_keys:].any())
        check.count(verdict, tokens_equal,
                    f"ubatch {ub.index} pos {ub.positions[t]} head {h}: blocks {sorted(ours)} vs reference {sorted(theirs)}")
