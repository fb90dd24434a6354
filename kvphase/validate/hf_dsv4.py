"""transformers' deepseek_v4 layer by layer where the compressor acts, against `designs.dsv4.DSV4` (the code
`kvphase validate` proves equal to llama.cpp's), reported as `validate` reports llama.cpp: one `LayerCheck`
per compressed layer, judged by the same `Tolerances`.

transformers' internals are read with forward hooks on its own modules, on a checkpoint export-hf wrote
from the GGUF: each compressor's input (the normed hidden rows and the query's low-rank residual) and output
(the finished entries, RMS-normed and roped at their blocks' first positions), the indexer scorer's output
(sum_h w_h relu(q_h . k_b) before transformers masks the blocks a query cannot see yet) and the indexer's
picks (the kept set, -1 padding). The design gets transformers' own inputs and the GGUF's weights, so each
quantity is compared where it is made, not through the layers before it. Kept sets that differ only among
blocks whose scores tie with the k-th are counted as ties (`set_agreement`), as llama.cpp's are: torch.topk and
llama.cpp's partial sort break ties differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from kvphase.designs.dsv4 import CSA_RATIO, DSV4
from kvphase.gguf.keys import Keys
from kvphase.gguf.metadata import Metadata
from kvphase.gguf.modelinfo import ModelInfo
from kvphase.gguf.tensors import tensor_array
from kvphase.validate.common import set_agreement
from kvphase.validate.report import LayerCheck

ARCH = "deepseek4"


def transformers_layer_checks(info: ModelInfo, checkpoint: str | Path, tokens: Sequence[int]) -> list[LayerCheck]:
    """One LayerCheck per compressed layer of `info` (a deepseek4 GGUF) for transformers on `checkpoint` (its
    export-hf copy), one forward of `tokens` from position 0."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    seen: dict[tuple[str, int], object] = {}
    for il, layer in enumerate(model.model.layers):
        compressor = layer.self_attn.compressor
        if compressor is None:
            continue
        compressor.register_forward_hook(lambda m, a, out, il=il: seen.update({("in", il): a, ("entries", il): out[0]}))
        if hasattr(compressor, "indexer"):
            compressor.indexer.register_forward_hook(lambda m, a, out, il=il: seen.update({("kept", il): out}))
            compressor.indexer.scorer.register_forward_hook(lambda m, a, out, il=il: seen.update({("scores", il): out}))
    with torch.inference_mode():
        model(input_ids=torch.tensor([list(tokens)]))
    layers = _Layers(info)
    return [layers.check(il, {kind: value for (kind, at), value in seen.items() if at == il})
            for il in range(layers.n_layer) if layers.ratios[il]]


class _Layers:
    """The GGUF's settings and weights, and the design of each compressed layer."""

    def __init__(self, info: ModelInfo):
        meta = Metadata(info.header)
        self.n_layer = meta.integer(Keys.LLM.BLOCK_COUNT.format(arch=ARCH), low=1)
        ratios = meta.integers(Keys.Attention.COMPRESS_RATIOS.format(arch=ARCH))
        self.ratios = ratios * self.n_layer if len(ratios) == 1 else ratios
        self.n_rot = meta.integer(Keys.Rope.DIMENSION_COUNT.format(arch=ARCH))
        self.base = meta.number(Keys.Attention.COMPRESS_ROPE_FREQ_BASE.format(arch=ARCH))
        self.eps = meta.number(Keys.Attention.LAYERNORM_RMS_EPS.format(arch=ARCH))
        self.n_swa = meta.integer(Keys.Attention.SLIDING_WINDOW.format(arch=ARCH), low=1)
        self.top_k = meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=ARCH), low=1)
        self.n_idx_head = meta.integer(Keys.Attention.Indexer.HEAD_COUNT.format(arch=ARCH), low=1)
        raw = np.memmap(info.path, dtype=np.uint8, mode="r")
        self.w = {t.name: tensor_array(raw, t) for t in info.header.tensors if t.name.startswith("blk.")}

    def turn(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        from kvphase.reference.deepseek4 import last_channels_roped

        return last_channels_roped(x, positions, self.n_rot, self.base)

    def finished(self, design: DSV4, a: np.ndarray, prefix: str) -> np.ndarray:
        w = self.w
        return design.finished(a @ w[prefix + "_kv.weight"].T, a @ w[prefix + "_gate.weight"].T, w[prefix + "_ape.weight"],
                               w[prefix + "_norm.weight"], self.eps, self.turn)  # (n_blocks, width)

    def check(self, il: int, seen: dict) -> LayerCheck:
        check = LayerCheck(il)
        design = DSV4(ratio=self.ratios[il], n_swa=self.n_swa, top_k=self.top_k, cache_dtype="f32")
        a, qr = (x[0].numpy() for x in seen["in"][:2])  # (T, n_embd), (T, q_lora)
        entries = self.finished(design, a, f"blk.{il}.attn_compressor")
        got = seen["entries"][0, 0].numpy()  # (n_blocks, head_dim)
        if got.shape != entries.shape:
            check.not_compared(f"transformers pooled {got.shape[0]} entries, the design {entries.shape[0]}")
            return check
        check.keys.add(got, entries)
        if design.ratio == CSA_RATIO:
            self._compare_indexer(check, design, il, a, qr, seen)
        return check

    def _compare_indexer(self, check: LayerCheck, design: DSV4, il: int, a: np.ndarray, qr: np.ndarray,
                         seen: dict) -> None:
        w, p, positions = self.w, f"blk.{il}.", np.arange(len(a))
        keys = self.finished(design, a, p + "indexer_compressor")  # (n_blocks, n_idx)
        n_idx = keys.shape[1]
        q = (qr @ w[p + "indexer.attn_q_b.weight"].T).reshape(len(a), self.n_idx_head, n_idx)
        q = np.stack([self.turn(q[:, h], positions) for h in range(self.n_idx_head)], axis=1)  # (T, Hi, n_idx)
        weights = (a @ w[p + "indexer.proj.weight"].T) / np.float32(np.sqrt(n_idx * self.n_idx_head))  # (T, Hi)
        scores = design.indexer_scores(q, weights, keys, positions)  # (T, n_blocks), -inf where not complete
        got = seen["scores"][0].numpy()  # (T, n_blocks), before transformers' own mask
        visible = np.isfinite(scores)
        check.scores.add(got[visible], scores[visible])
        if visible.any():
            check.score_scale = max(check.score_scale, float(np.abs(got[visible]).max()))
        chosen = design.select(positions, len(a), len(keys), scores).block_visible  # (T, n_blocks)
        kept = seen["kept"][0].numpy()  # (T, k), -1 padding
        for t in positions:
            ours, theirs = {int(b) for b in kept[t] if b >= 0}, set(np.flatnonzero(chosen[t]).tolist())
            verdict = set_agreement(ours, theirs, scores[t], min(self.top_k, int(visible[t].sum())))
            check.count(verdict, True, f"token {t}: transformers kept blocks {sorted(ours)}, llama.cpp's design "
                                       f"{sorted(theirs)}")


def validate_through_transformers(model: str | Path, n_tokens: int | None, seed: int, tolerances) -> "ValidationReport":
    """`kvphase validate MODEL --engine transformers`: the deepseek4 GGUF exported to HF layout in a temporary
    folder (export-hf), one forward of validate's seeded prompt, each compressed layer checked (one split:
    transformers has no micro-batches)."""
    import tempfile

    from kvphase.backends.hf_export import export_hf
    from kvphase.errors import PlanError
    from kvphase.gguf.header_only import require_weights
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.validate.options import deepseek4_tokens
    from kvphase.validate.report import ValidationReport

    info = read_model_info(model)
    if info.architecture != ARCH:
        raise PlanError(f"validate --engine transformers checks deepseek4 files (export-hf's layout); "
                        f"{info.path.name} is {info.architecture}")
    require_weights(info.header, "validate")
    layers = _Layers(info)
    n_tokens = int(n_tokens if n_tokens is not None else min(deepseek4_tokens(layers.ratios),
                                                             info.context_length or deepseek4_tokens(layers.ratios)))
    if n_tokens < 1 or seed < 0:
        raise PlanError(f"--tokens must be at least 1 and --seed at least 0, got {n_tokens} and {seed}")
    if info.context_length and n_tokens > info.context_length:
        raise PlanError(f"--tokens {n_tokens} does not fit: {info.path.name} has a {info.context_length}-token context")
    tokens = np.random.default_rng(seed).integers(0, max(info.vocab_size, 2), size=n_tokens).tolist()  # as validate's
    with tempfile.TemporaryDirectory(prefix="kvphase-validate-") as scratch:
        copy = export_hf(info, Path(scratch) / "hf").path
        checks = transformers_layer_checks(info, copy, tokens)
    return ValidationReport(model=info.path, architecture=info.architecture, family=info.compression.family,
                            n_tokens=n_tokens, splits=[[n_tokens]], tolerances=tolerances, layers=checks)
