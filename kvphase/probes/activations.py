"""Activation gate concentration: the gate weights each window actually used on real contexts.

`gates` reads the per-phase bias alone. Here the content term is in: every complete
window of a sweep's contexts is pooled with per-channel weights softmax(gate + ape) over
its slots, and a slot sits at a phase (its position mod S). Per window and channel the
probe sums the weight of each phase and records the dominant phase, its share and the
entropy in bits (0: one phase takes all; log2 S: uniform) (docs/protocol.md, "Gate
concentration"). The report gives, per layer, the entropy distribution and the share of
windows (and channels) in which one phase takes more than half.

Sources of the weights:
- kvphase-trained gated and kpool models, on the numpy reference: `GateRecorder` wraps
  the attention policy and asks each (layer, head)'s design for the `pool_weights` of the
  windows a forward pass completes;
- glm5-next, through llama.cpp: the k-pool indexer's `indexer_gate-N` is captured while
  llama.cpp evaluates the context (`kvphase.engines.capture`) and pooled with the file's
  `indexer_compressor_ape` exactly as `kvphase.designs.kpool.KPool.pool_weights` does;
- deepseek4, through llama.cpp: each compressor's gate logits with the bias added
  (`csa_state_score_ape`, `lid_state_score_ape`, `hca_state_score_ape`) are captured and
  pooled as `kvphase.designs.dsv4.DSV4.pool_weights` does (a CSA entry's softmax spans the
  previous block's rows and its own; both map to their phases).
Both llama.cpp paths are the ones `kvphase validate` proves equal to llama.cpp's pooling.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from kvphase.errors import PlanError
from kvphase.probes.gates import GateSource, entropy_bits, sum_by_phase
from kvphase.reference.policy import WindowDesigns, begin_context
from kvphase.runfolder import MANIFEST_FILE, ReportPage, figure, markdown_table, write_csv, write_json

WINDOWS_FILE, FIGURE_FILE = "windows.csv", "gate_activations.png"
COLUMNS = ["layer", "source", "head", "context", "window", "first_position", "channel", "stride", "dominant_phase",
           "dominant_share", "entropy_bits"]
MAX_CAPTURE_BATCH = 512  # tokens per llama_decode call while capturing


def window_rows(shares: np.ndarray, first_positions: np.ndarray, layer: int, source: str, head: int,
                context: int) -> pd.DataFrame:
    """One row per window and channel: dominant phase, its share, entropy in bits."""
    n_windows, stride, n_channels = shares.shape
    window, channel = np.meshgrid(np.arange(n_windows), np.arange(n_channels), indexing="ij")  # (n_windows, C) each
    return pd.DataFrame({
        "layer": layer, "source": source, "head": head, "context": context, "window": window.ravel(),
        "first_position": np.asarray(first_positions)[window.ravel()], "channel": channel.ravel(), "stride": stride,
        "dominant_phase": shares.argmax(axis=1).ravel(), "dominant_share": shares.max(axis=1).ravel().round(6),
        "entropy_bits": entropy_bits(shares).ravel().round(6)})


class RunningMeans:
    """Arrays summed per key over the rows (query rows, windows) seen; `means` divides by their count."""

    def __init__(self):
        self.sums: dict = {}  # key (a layer; (layer, gate)) -> e.g. (n_head, head_dim) or (S, channels)
        self.rows: dict = {}

    def add(self, key, total: np.ndarray, n_rows: int) -> None:
        """total: the sum over `n_rows` rows."""
        self.sums[key] = self.sums.get(key, 0.0) + total
        self.rows[key] = self.rows.get(key, 0) + n_rows

    def means(self) -> dict:
        return {key: total / self.rows[key] for key, total in self.sums.items()}


class GateRecorder(RunningMeans):
    """The inner policy, unchanged, recording the pool weights of every window a forward
    pass completes, for the gated (layer, head)s of `layers`."""

    def __init__(self, inner, stride: int, layers: Sequence[int], source: str = "trained-gated", keep_rows: bool = True):
        super().__init__()
        self.inner, self.stride, self.layers, self.source = inner, stride, set(layers), source
        self.context, self.keep_rows = 0, keep_rows
        self.frames: list[pd.DataFrame] = []

    def begin(self, context: Sequence[int]):
        return begin_context(self.inner, context)

    def attend(self, layer, q, k, v, q_pos, scale):
        out = self.inner.attend(layer, q, k, v, q_pos, scale)  # (n_head_kv, n_group, n_q, head_dim)
        if layer in self.layers:
            for head in range(k.shape[0]):
                self._record(layer, head, self.inner.design_for(layer, head, k.shape[0]), k[head], int(np.min(q_pos)))
        return out

    def _record(self, layer: int, head: int, design, keys: np.ndarray, first_new: int) -> None:
        layout = design.layout
        n_windows = layout.n_complete(keys.shape[0])
        new = np.flatnonzero(layout.last_positions(n_windows) >= first_new)  # windows this pass completed
        if not len(new):
            return
        members = layout.members(n_windows)[new]  # (n_new, W)
        weights = design.pool_weights(keys[:, None][members])[:, :, 0]  # (n_new, W, head_dim)
        first = layout.first_positions(n_windows)[new]  # (n_new,)
        shares = sum_by_phase(weights, first, self.stride)  # (n_new, S, head_dim)
        self.add((layer, head), shares.sum(axis=0), len(new))  # means: (layer, head) -> (S, head_dim)
        if self.keep_rows:
            self.frames.append(window_rows(shares, first, layer, self.source, head, self.context))


def reference_windows(backend, contexts: Sequence[Sequence[int]], sources: Sequence[GateSource]) -> pd.DataFrame:
    """Every context through the numpy reference with its policy wrapped by a `GateRecorder`."""
    inner = backend.policy
    if not isinstance(inner, WindowDesigns):
        raise PlanError("the reference model's attention is dense here; nothing pools windows")
    recorder = GateRecorder(inner, sources[0].stride, [s.layer for s in sources], sources[0].kind)
    backend.policy = recorder
    try:
        for index, tokens in enumerate(contexts):
            recorder.context = index
            recorder.begin(tokens)  # offsets drawn per context (random-offset models) are drawn here
            backend.logits(tokens)
    finally:
        backend.policy = inner
    return pd.concat(recorder.frames, ignore_index=True)


DSV4_CAPTURE = {"csa-compressor": "csa_state_score_ape", "csa-indexer": "lid_state_score_ape",
                "hca-compressor": "hca_state_score_ape"}  # gate source -> llama.cpp's node of gate + ape


def captured_node(architecture: str, source: GateSource) -> str:
    """The llama.cpp node whose values `engine_weights` pools for this gate source."""
    return "indexer_gate" if architecture == "glm5-next" else DSV4_CAPTURE[source.kind]


def engine_windows(info, contexts: Sequence[Sequence[int]], sources: Sequence[GateSource], n_threads: int) -> pd.DataFrame:
    """glm5-next and deepseek4: each context through llama.cpp with the gate nodes captured,
    pooled as `KPool.pool_weights` / `DSV4.pool_weights` pool them."""
    from kvphase.engines.capture import EngineSettings, by_name, run_and_capture
    from kvphase.gguf.tensors import read_model_tensor

    apes = {s.tensor: read_model_tensor(info, s.tensor) for s in sources}  # (S, C) each
    names = sorted({captured_node(info.architecture, s) for s in sources})
    frames = []
    for index, tokens in enumerate(contexts):
        split = [min(MAX_CAPTURE_BATCH, len(tokens) - i) for i in range(0, len(tokens), MAX_CAPTURE_BATCH)]
        run = run_and_capture(info, list(tokens), split, by_name(names),
                              EngineSettings(n_ctx=len(tokens), n_threads=n_threads))
        for source in sources:
            weights, first = engine_weights(info, run, source, apes[source.tensor])  # (n_windows, W, C), (n_windows,)
            frames.append(window_rows(sum_by_phase(weights, first, source.stride), first, source.layer, source.kind,
                                      0, index))
    return pd.concat(frames, ignore_index=True)


def engine_weights(info, run, source: GateSource, ape: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One source's pool weights on one captured run, and the position of each window's row 0."""
    from kvphase.designs.dsv4 import DSV4
    from kvphase.designs.kpool import KPool

    width = ape.shape[-1]
    name = captured_node(info.architecture, source)
    rows = np.concatenate([run.get(name, source.layer, u.index).reshape(-1, width) for u in run.ubatches])  # (n, C)
    if info.architecture == "glm5-next":
        design = KPool(kpool=source.stride, top_k=source.stride)  # top_k plays no part in the weights
        weights = design.pool_weights(rows, ape)  # (n_pool, kpool, C)
        return weights, design.layout.first_positions(weights.shape[0])
    design = DSV4(ratio=source.stride, n_swa=1)  # only the block shape matters for the weights
    weights = design.pool_weights(rows)  # (n_blocks, ratio or 2 * ratio, C or C / 2)
    return weights, design.first_rows(weights.shape[0])


def run_gate_activations(plan, backend, run_dir: Path, info, sources: Sequence[GateSource], n_contexts: int,
                         n_threads: int = 1) -> str:
    """Build the plan's contexts, record the windows' gate weights of `sources` (`gates.find_sources`,
    `select_sources`) on the first `n_contexts`, write the folder."""
    from kvphase.probes import folder
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.tasks import load_task

    started, run_dir = time.time(), Path(run_dir)
    chosen = sorted({s.layer for s in sources})
    if n_contexts < 1:
        raise PlanError(f"--contexts must be at least 1, got {n_contexts}")
    contexts = [c.tokens for c in build_contexts(load_task(plan.task), backend, plan.context_settings)][:n_contexts]
    config = {"probe": "gate-activations", "model": plan.model, "plan": asdict(plan), "layers": chosen,
              "contexts": len(contexts)}
    folder.start_folder(run_dir, config, [WINDOWS_FILE, FIGURE_FILE])
    if plan.backend == "reference":
        windows = reference_windows(backend, contexts, sources)
    else:
        windows = engine_windows(info, contexts, sources, n_threads)
    write_csv(run_dir / WINDOWS_FILE, windows[COLUMNS])
    write_json(run_dir / MANIFEST_FILE, folder.manifest(
        Path(plan.model), info.architecture, time.time() - started, backend=plan.describe_backend(),
        tokens_evaluated=sum(len(c) for c in contexts)))
    return build_report(run_dir)


# --------------------------------------------------------------------------- summary and report


def summarize(windows: pd.DataFrame) -> dict:
    """Per layer: the entropy distribution over (window, channel) and how often one phase takes over half."""
    layers = []
    for (layer, source), rows in windows.groupby(["layer", "source"], sort=True):
        stride = int(rows.stride.iloc[0])
        over_half = rows.dominant_share > 0.5
        by_window = over_half.groupby([rows["head"], rows["context"], rows["window"]]).any()  # some channel has a dominant phase
        top = rows[over_half].dominant_phase.value_counts(normalize=True).reindex(range(stride), fill_value=0.0)
        quartiles = rows.entropy_bits.quantile([0.1, 0.25, 0.5, 0.75, 0.9]).round(4).tolist()
        layers.append({
            "layer": int(layer), "source": source, "stride": stride, "max_bits": round(float(np.log2(stride)), 4),
            "windows": int(len(by_window)), "channels": int(rows.channel.nunique()), "values": int(len(rows)),
            "mean_bits": round(float(rows.entropy_bits.mean()), 4),
            "entropy_p10_p25_p50_p75_p90": quartiles,
            "share_over_half": round(float(over_half.mean()), 4),
            "windows_with_a_channel_over_half": round(float(by_window.mean()), 4),
            "dominant_phase_shares": [round(float(x), 4) for x in top],
        })
    return {"layers": layers}


def headline(summary: dict) -> str:
    parts = []
    for layer in summary["layers"]:
        shares = layer["dominant_phase_shares"]
        favoured = int(np.argmax(shares)) if layer["share_over_half"] > 0 else None
        tail = f", phase {favoured} most often ({100 * shares[favoured]:.0f}% of those)" if favoured is not None else ""
        parts.append(f"layer {layer['layer']} {layer['source']}: median {layer['entropy_p10_p25_p50_p75_p90'][2]:.2f} of "
                     f"{layer['max_bits']:.2f} bits, one phase over half in {100 * layer['share_over_half']:.1f}% "
                     f"of window channels{tail}")
    return "Gate weights used on real contexts: " + "; ".join(parts)


def plot(windows: pd.DataFrame, path: Path) -> None:
    """Per layer: the entropy distribution (left) and which phase dominates where one does (right)."""
    stride = int(windows.stride.max())
    with figure(path, 1, 2, figsize=(10, 3.8), dpi=110) as (fig, (left, right)):
        bins = np.linspace(0, np.log2(stride), 25)
        for (layer, source), rows in windows.groupby(["layer", "source"]):
            label = f"layer {layer} {source}"
            left.hist(rows.entropy_bits, bins=bins, histtype="step", density=True, label=label)
            dominant = rows[rows.dominant_share > 0.5].dominant_phase
            counts = np.bincount(dominant, minlength=int(rows.stride.iloc[0])) / max(1, len(rows))  # (S,)
            right.plot(range(len(counts)), 100 * counts, "o-", label=label)
        left.set(xlabel=f"entropy of the phase weights (bits; uniform = {np.log2(stride):.2f})", ylabel="density")
        right.set(xlabel="phase (position mod S)", ylabel="% of window channels it takes over half")
        if stride <= 16:
            right.set_xticks(range(stride))
        left.legend(fontsize=7)


def render_markdown(config: dict, summary: dict, manifest: dict) -> str:
    plan = config["plan"]
    table = pd.DataFrame([{k: v for k, v in layer.items() if k != "dominant_phase_shares"}
                          | {f"over_half_at_phase_{p}": s for p, s in enumerate(layer["dominant_phase_shares"])}
                          for layer in summary["layers"]]) if summary["layers"] else pd.DataFrame()
    return ReportPage(
        title=f"Gate activations: {Path(config['model']).name}",
        headline=headline(summary),
        prose=f"The first {config['contexts']} context(s) of a sweep plan (task `{plan['task']}`, {plan['context']} "
              f"tokens, seed {plan['seed']}) evaluated; for every complete window, per channel, the weight its gate gave "
              "each phase (softmax of gate + per-phase bias over the window's slots, summed per position mod S). Entropy "
              "in bits: 0 when one phase takes all, log2 S when the gate is uniform. `share_over_half`: window channels in "
              "which one phase takes more than half; `over_half_at_phase_p`: how those split over the phases. Compare "
              "with `kvphase gates` (the bias alone).",
        figure=(FIGURE_FILE, "entropy and dominant phases"),
        sections=[(None, markdown_table(table))],
        measured=[f"Model `{manifest.get('model', {}).get('file', '?')}` "
                  f"({manifest.get('model', {}).get('architecture', '?')}), backend {manifest.get('backend', '?')}; "
                  f"{manifest.get('tokens_evaluated', '?')} tokens, wall time {manifest.get('wall_time_s', '?')} s."],
        files=f"Files: `config.json`, `{WINDOWS_FILE}` (one row per layer, head, context, window and channel), "
              "`summary.json`, `manifest.json`; `kvphase report <this folder>` rebuilds this page from the first two.",
    ).markdown()


def build_report(run_dir: Path) -> str:
    from kvphase.probes import folder

    config = folder.load_probe_config(run_dir)
    windows = folder.load_csv(run_dir, WINDOWS_FILE, COLUMNS, text=("source",),
                              empty="the contexts completed no window, or the file was emptied")
    summary = summarize(windows)
    plot(windows, Path(run_dir) / FIGURE_FILE)
    folder.write_report(run_dir, summary, render_markdown(config, summary, folder.read_manifest(run_dir)))
    return headline(summary)
