"""The indexer of an HF checkpoint, run by transformers' own modeling code, against kvphase's design of
it (the numpy reference written from llama.cpp's sources), layer by layer, reported as `validate`
reports llama.cpp.

transformers evaluates a seeded random prompt in one forward. A forward hook on every indexer module
reads what the module was given (its hidden states, its query residual or rotary embedding) and
recomputes, with the module's own weights, the quantities the design takes: k-pool (glm5_next) the
indexer queries, keys, gates and head weights; MSA (minimax_m3_vl) the indexer queries and keys after
norm and RoPE. The design then pools, scores and selects from transformers' own intermediates, so
what is compared is the selection semantics alone:
- k-pool: the pooled keys (transformers' `get_pooled_states`), the pool scores, and the kept set (the
  pools transformers' top-k kept, and every token it lets the query read, tail included);
- MSA: the block scores (max over each block's token scores) and the kept blocks per head.
A kept set that differs only among pools or blocks tied with the k-th score counts as a tie, as in
`validate`; each layer's first tie is noted with its position, because a tie is where two correct
implementations may part (ReLU scores tie at exactly 0).

torch is imported only inside the entry point (the `hf` extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import ModelInfo, as_model_info
from kvphase.validate.common import compare_scores, set_agreement
from kvphase.validate.options import DEFAULT_SEED, Tolerances
from kvphase.validate.report import LayerCheck, ValidationReport

DEFAULT_TOKENS = 64


def validate_checkpoint(model: str | Path | ModelInfo, n_tokens: int | None = None, seed: int = DEFAULT_SEED,
                        tolerances: Tolerances = Tolerances()) -> ValidationReport:
    """Every indexer layer of a glm5-next or minimax-m3 checkpoint: transformers against the design."""
    import torch

    from kvphase.backends.hf import load_transformers_model

    info = as_model_info(model)
    family = info.compression.family
    if info.header is not None or family not in CHECKERS:
        raise PlanError(f"{info.path.name}: the transformers indexer check reads a glm5-next or minimax-m3 "
                        "HF checkpoint folder (kvphase export-hf writes one)")
    n = min(DEFAULT_TOKENS, info.context_length or DEFAULT_TOKENS) if n_tokens is None else int(n_tokens)
    if n < 2 or seed < 0:
        raise PlanError(f"--tokens must be at least 2 and --seed at least 0, got {n} and {seed}")
    if info.context_length and n > info.context_length:
        raise PlanError(f"--tokens {n} does not fit: {info.path.name} has a {info.context_length}-token context")
    model_, _ = load_transformers_model(info)
    tokens = np.random.default_rng(seed).integers(0, max(info.vocab_size, 2), size=n)
    checker = CHECKERS[family](info)

    def forward():
        with torch.inference_mode():
            model_(input_ids=torch.tensor([tokens.tolist()]), use_cache=False)

    _, captured = hooked(model_, checker, forward)
    checks = {layer: checker.compare(forwards[0], LayerCheck(layer)) for layer, forwards in sorted(captured.items())}
    return ValidationReport(model=info.path, architecture=info.architecture, family=family, n_tokens=n,
                            splits=[[n]], tolerances=tolerances, layers=list(checks.values()))


def hooked(model, checker, run):
    """`run()`'s result and what `checker`'s hook captured of every indexer layer in the forwards it made
    (layer -> one dict a forward, in order, of the quantities the design takes)."""
    captured: dict[int, list[dict]] = {}
    hooks = [module.register_forward_hook(checker.hook(captured, layer), with_kwargs=True)
             for layer, module in checker.indexers(model)]
    try:
        return run(), captured
    finally:
        for hook in hooks:
            hook.remove()


def indexer_selections(backend, run):
    """`run(backend)`'s result through a `backends.hf.TransformersBackend` of a glm5-next checkpoint and
    every token's selection in every indexer layer of the forwards it made, cached ones included
    (`conform.ties.Selections`: (position, layer) -> the visible pools' scores in pool order, the pools
    transformers kept), as `engines.selection.IndexerRowsTap` reads llama.cpp's: a later forward of a
    position (a query on another copy of the context's cache) replaces an earlier one's."""
    checker = KPoolTransformers(backend.info)
    result, captured = hooked(backend.model, checker, lambda: run(backend))
    return result, {(position, layer): selection for layer, forwards in captured.items() for c in forwards
                    for position, selection in checker.selections(c).items()}


def indexer_modules(layers):
    """(layer, indexer module) for every block whose attention holds an indexer."""
    for layer, block in enumerate(layers):
        indexer = getattr(block.self_attn, "indexer", None)
        if indexer is not None:
            yield layer, indexer


def _numpy(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


class KPoolTransformers:
    """glm5_next's `Glm5NextTextIndexer` against `designs.kpool.KPool`."""

    def __init__(self, info: ModelInfo):
        from kvphase.designs.kpool import KPool

        p = info.compression.params
        self.design = KPool(kpool=p["kpool"], top_k=p["top_k"], select_tail=p["select_tail"], cache_dtype="f32")

    @staticmethod
    def indexers(model):
        return indexer_modules(model.model.language_model.layers)

    @staticmethod
    def hook(captured: dict, layer: int):
        def after(m, args, kwargs, out):
            import torch
            import torch.nn.functional as F

            h, q_resid, cache = kwargs["hidden_states"], kwargs["q_resid"], kwargs.get("cache")
            batch, seq = h.shape[:2]
            if cache is not None:  # every token's packed keys, gates and validity, this forward's appended
                packed = cache.layers[m.layer_idx].indexer_keys  # (1, n_keys, 2 d + 1)
            else:
                keys = m.k_norm(m.wk(h))  # (1, n, d)
                packed = torch.cat([keys, F.linear(h, m.index_kpool_compress_gate), torch.ones_like(keys[..., :1])],
                                   dim=-1)
            pooled, _, _ = m.get_pooled_states(packed)  # (1, n_pool, d)
            d = m.head_dim
            # relu(q.k / sqrt(d)) * w / sqrt(H) = relu(q.k) * w / sqrt(d * H): the design's scaled weights
            weights = m.weights_proj(h).float() * (m.n_heads ** -0.5) * m.softmax_scale
            captured.setdefault(layer, []).append(dict(
                q=_numpy(m.wq_b(q_resid).view(batch, seq, -1, d)[0]), k=_numpy(packed[0, :, :d]),
                gates=_numpy(packed[0, :, d:2 * d]), weights=_numpy(weights[0]), pooled=_numpy(pooled[0]),
                ape=_numpy(m.index_kpool_compress_ape), kept=out[0].cpu().numpy()))
        return after

    def scored(self, c: dict):
        """(the design's selection from transformers' intermediates, transformers' pool scores (n_query, n_pool),
        -inf where the design's causal pool mask hides a pool); the forward's queries are the last positions."""
        ref = self.design.forward(c["q"], c["weights"], c["k"], c["gates"], c["ape"])
        n_pool = len(ref.pool_keys)
        got_scores = np.einsum("thd,pd->thp", c["q"], c["pooled"][:n_pool])  # transformers' pooled keys scored
        got_scores = np.sum(np.maximum(got_scores, 0) * c["weights"][:, :, None], axis=1)
        return ref, np.where(np.isfinite(ref.scores), got_scores, -np.inf)

    def kept_pools(self, c: dict, t: int) -> set[int]:
        """The complete pools transformers let the forward's query `t` read (its own incomplete pool, the
        tail, left out)."""
        position = len(c["k"]) - len(c["q"]) + t
        tail_start = self.design.layout.n_complete(position + 1) * self.design.kpool
        return {int(i) // self.design.kpool for i in c["kept"][t] if 0 <= i < tail_start}

    def selections(self, c: dict) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """position -> (transformers' scores of the pools visible to it, in pool order; the pools it kept)."""
        _, scores = self.scored(c)
        first = len(c["k"]) - len(c["q"])
        return {first + t: (row[np.isfinite(row)], np.array(sorted(self.kept_pools(c, t)), np.int64))
                for t, row in enumerate(scores)}

    def compare(self, c: dict, check: LayerCheck) -> LayerCheck:
        kp, n = self.design, len(c["k"])
        ref, got_scores = self.scored(c)
        check.keys.add(c["pooled"][:len(ref.pool_keys)], ref.pool_keys)
        compare_scores(check, got_scores, ref.scores)
        for t in range(n):
            kept = {int(i) for i in c["kept"][t] if i >= 0}
            ours = self.kept_pools(c, t)
            theirs = {int(p) for p in ref.top_pools[t] if p >= 0}
            tokens_equal = kept == set(np.flatnonzero(ref.visible[t]).tolist())
            verdict = set_agreement(ours, theirs, ref.scores[t], kp.n_top_pools)
            _count(check, verdict, tokens_equal, f"pos {t}: pools {sorted(ours)} vs reference {sorted(theirs)}")
        return check


class MSATransformers:
    """minimax_m3_vl's `MiniMaxM3VLIndexer` against `designs.msa.MSA`."""

    def __init__(self, info: ModelInfo):
        from kvphase.designs.msa import MSA

        p = info.compression.params
        self.design = MSA(p["block_size"], p["top_k"], p["local_blocks"], cache_dtype="f32")

    @staticmethod
    def indexers(model):
        return indexer_modules(model.model.layers)

    @staticmethod
    def hook(captured: dict, layer: int):
        def after(m, args, kwargs, out):
            h, (cos, sin) = args[0], args[1]
            batch, seq = h.shape[:2]
            rope = sys.modules[type(m).__module__].apply_rotary_pos_emb  # the module's own RoPE
            q = m.q_norm(m.q_proj(h).view(batch, seq, -1, m.head_dim)).transpose(1, 2)  # (1, H, n, d)
            k = m.k_norm(m.k_proj(h).view(batch, seq, 1, m.head_dim)).transpose(1, 2)  # (1, 1, n, d)
            q, k = rope(q, k, cos[..., : m.head_dim], sin[..., : m.head_dim])
            captured.setdefault(layer, []).append(dict(q=_numpy(q[0].transpose(0, 1)), k=_numpy(k[0, 0]),
                                                       kept=out[0].cpu().numpy()))
        return after

    def compare(self, c: dict, check: LayerCheck) -> LayerCheck:
        msa, n = self.design, len(c["k"])
        ref = msa.forward(c["q"], c["k"], np.arange(n))
        n_blocks = ref.block_scores.shape[-1]
        token = np.einsum("thd,kd->thk", c["q"], c["k"])  # (n, H, n) transformers' token scores, f32
        token = np.where(np.arange(n)[None, None, :] <= np.arange(n)[:, None, None], token, -np.inf)
        padded = np.full(token.shape[:2] + (n_blocks * msa.block_size,), -np.inf, np.float32)
        padded[..., :n] = token
        compare_scores(check, padded.reshape(n, -1, n_blocks, msa.block_size).max(-1), ref.block_scores)
        for t in range(n):
            for h in range(ref.block_scores.shape[1]):
                ours = {int(b) for b in c["kept"][h, t] if b >= 0}
                theirs = {int(b) for b in ref.top_blocks[t, h] if b >= 0}
                seen = np.zeros(n, bool)
                for b in ours:
                    seen[b * msa.block_size:(b + 1) * msa.block_size] = True
                tokens_equal = bool(np.array_equal(seen & (np.arange(n) <= t), ref.visible[t, h]))
                k = min(len(theirs), int(np.isfinite(ref.biased_scores[t, h]).sum()))
                verdict = set_agreement(ours, theirs, ref.biased_scores[t, h], max(k, 1))
                _count(check, verdict, tokens_equal,
                       f"pos {t} head {h}: blocks {sorted(ours)} vs reference {sorted(theirs)}")
        return check


def _count(check: LayerCheck, verdict: str, tokens_equal: bool, where: str) -> None:
    """`LayerCheck.count`, and the layer's first tie noted (where the two implementations may part)."""
    if verdict == "tie" and not check.ties:
        check.note(f"first tie at {where}")
    check.count(verdict, tokens_equal, where)


CHECKERS = {"kpool": KPoolTransformers, "msa": MSATransformers}
