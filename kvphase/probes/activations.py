"""Activation gate concentration: the gate weights each window actually used on real contexts.

`gates` reads the per-phase bias alone. Here the content term is in: every complete
window of a sweep's contexts is pooled with per-channel weights softmax(gate + ape) over
its slots, and a slot sits at a phase (its position mod S). Per window and channel the
probe sums the weight of each phase and records the dominant phase, its share and the
entropy in bits (0: one phase takes all; log2 S: uniform) (PROTOCOL.md, "Gate
concentration"). The report gives, per layer, the entropy distribution and the share of
windows (and channels) in which one phase takes more than half.

Sources of the weights:
- kvphase-trained gated and kpool models, on the numpy reference: `GateRecorder` wraps
  the attention policy and asks each (layer, head)'s design for the `pool_weights` of the
  windows a forward pass completes;
- glm5-next, through llama.cpp: the k-pool indexer's `indexer_gate-N` is captured while
  llama.cpp evaluates the context (`kvphase.engines.capture`) and pooled with the file's
  `indexer_compressor_ape` exactly as `kvphase.designs.kpool.KPool.pool_weights` does
  (proven equal to llama.cpp by `kvphase validate`).
deepseek4's compressors are not read yet (their CSA softmax spans two blocks).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from kvphase.errors import PlanError, RunFolderError
from kvphase.probes.gates import entropy_bits

WINDOWS_FILE, FIGURE_FILE = "windows.csv", "gate_activations.png"
COLUMNS = ["layer", "head", "context", "window", "first_position", "channel", "stride", "dominant_phase",
           "dominant_share", "entropy_bits"]
MAX_CAPTURE_BATCH = 512  # tokens per llama_decode call while capturing


def phase_shares(weights: np.ndarray, first_positions: np.ndarray, stride: int) -> np.ndarray:
    """Per window and channel, the weight of each phase: (n_windows, S, C) from window
    weights (n_windows, W, C) whose slot j sits at position first_positions[w] + j."""
    n_windows, width, _ = weights.shape
    phases = (np.asarray(first_positions)[:, None] + np.arange(width)) % stride  # (n_windows, W)
    one_hot = phases[:, :, None] == np.arange(stride)  # (n_windows, W, S)
    return np.einsum("nws,nwc->nsc", one_hot.astype(np.float64), weights.astype(np.float64))  # (n_windows, S, C)


def window_rows(shares: np.ndarray, first_positions: np.ndarray, layer: int, head: int, context: int) -> pd.DataFrame:
    """One row per window and channel: dominant phase, its share, entropy in bits."""
    n_windows, stride, n_channels = shares.shape
    window, channel = np.meshgrid(np.arange(n_windows), np.arange(n_channels), indexing="ij")  # (n_windows, C) each
    return pd.DataFrame({
        "layer": layer, "head": head, "context": context, "window": window.ravel(),
        "first_position": np.asarray(first_positions)[window.ravel()], "channel": channel.ravel(), "stride": stride,
        "dominant_phase": shares.argmax(axis=1).ravel(), "dominant_share": shares.max(axis=1).ravel().round(6),
        "entropy_bits": entropy_bits(shares).ravel().round(6)})


class GateRecorder:
    """The inner policy, unchanged, recording the pool weights of every window a forward
    pass completes, for the gated (layer, head)s of `layers`."""

    def __init__(self, inner, stride: int, layers: Sequence[int]):
        self.inner, self.stride, self.layers = inner, stride, set(layers)
        self.context = 0
        self.frames: list[pd.DataFrame] = []

    def begin(self, context: Sequence[int]):
        return self.inner.begin(context) if hasattr(self.inner, "begin") else None

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
        self.frames.append(window_rows(phase_shares(weights, first, self.stride), first, layer, head, self.context))


def reference_windows(backend, contexts: Sequence[Sequence[int]], stride: int, layers: Sequence[int]) -> pd.DataFrame:
    """Every context through the numpy reference with its policy wrapped by a `GateRecorder`."""
    inner = backend.policy
    if not hasattr(inner, "design_for"):
        raise PlanError("the reference model's attention is dense here; nothing pools windows")
    recorder = GateRecorder(inner, stride, layers)
    backend.policy = recorder
    try:
        for index, tokens in enumerate(contexts):
            recorder.context = index
            recorder.begin(tokens)  # offsets drawn per context (random-offset models) are drawn here
            backend.logits(tokens)
    finally:
        backend.policy = inner
    return pd.concat(recorder.frames, ignore_index=True)


def kpool_windows(model_path: Path, info, contexts: Sequence[Sequence[int]], layers: Sequence[int],
                  n_threads: int) -> pd.DataFrame:
    """glm5-next: each context through llama.cpp, `indexer_gate` captured, pooled as KPool pools it."""
    from kvphase.designs.kpool import KPool
    from kvphase.engines.capture import EngineSettings, by_name, run_and_capture
    from kvphase.gguf.tensors import read_model_tensor

    params = info.compression.params
    design = KPool(kpool=params["kpool"], top_k=params["top_k"], select_tail=params["select_tail"])
    apes = {layer: read_model_tensor(model_path, f"blk.{layer}.indexer_compressor_ape.weight") for layer in layers}
    frames = []
    for index, tokens in enumerate(contexts):
        split = [min(MAX_CAPTURE_BATCH, len(tokens) - i) for i in range(0, len(tokens), MAX_CAPTURE_BATCH)]
        settings = EngineSettings(n_ctx=len(tokens), n_threads=n_threads)
        run = run_and_capture(model_path, list(tokens), split, by_name(["indexer_gate"]), settings)
        for layer in layers:
            d = apes[layer].shape[-1]
            gates = np.concatenate([run.get("indexer_gate", layer, u.index).reshape(-1, d) for u in run.ubatches])  # (n, d)
            weights = design.pool_weights(gates, apes[layer])  # (n_pool, kpool, d)
            first = design.layout.first_positions(weights.shape[0])  # (n_pool,)
            frames.append(window_rows(phase_shares(weights, first, design.kpool), first, layer, 0, index))
    return pd.concat(frames, ignore_index=True)


def run_gate_activations(plan, backend, run_dir: Path, info, layers: Sequence[int] | None, n_contexts: int,
                         n_threads: int = 1) -> str:
    """Build the plan's contexts, record the windows' gate weights on the first `n_contexts`, write the folder."""
    from kvphase.probes import folder
    from kvphase.probes.gates import find_sources
    from kvphase.gguf.header import read_gguf_header
    from kvphase.sweep.placement import build_probes
    from kvphase.sweep.tasks import load_task

    started, run_dir = time.time(), Path(run_dir)
    sources = find_sources(read_gguf_header(info.path))  # refuses a model without a gate bias
    present = sorted({s.layer for s in sources})
    chosen = sorted(set(layers)) if layers else present
    if any(layer not in present for layer in chosen):
        raise PlanError(f"layer {next(x for x in chosen if x not in present)} has no gate in {info.path.name}; "
                        f"layers with one: {', '.join(map(str, present))}")
    if info.architecture == "deepseek4":
        raise PlanError("gate activations are read from kvphase-trained models (reference) and glm5-next "
                        "(llama.cpp); deepseek4's compressors are not supported yet (`kvphase gates` reads their bias)")
    if n_contexts < 1:
        raise PlanError(f"--contexts must be at least 1, got {n_contexts}")
    contexts = [c.tokens for c in build_probes(load_task(plan.task), backend, plan.probe_settings)][:n_contexts]
    config = {"probe": "gate-activations", "model": plan.model, "plan": asdict(plan), "layers": chosen,
              "contexts": len(contexts)}
    folder.start_folder(run_dir, config, [WINDOWS_FILE, FIGURE_FILE])
    stride = min(s.stride for s in sources)
    if info.architecture == "glm5-next":
        windows = kpool_windows(info.path, info, contexts, chosen, n_threads)
    else:
        windows = reference_windows(backend, contexts, stride, chosen)
    folder.write_csv(run_dir / WINDOWS_FILE, windows[COLUMNS])
    folder.write_json(run_dir / folder.MANIFEST_FILE, folder.manifest(
        Path(plan.model), info.architecture, time.time() - started, backend=plan.describe_backend(),
        tokens_evaluated=sum(len(c) for c in contexts)))
    return build_report(run_dir)


# --------------------------------------------------------------------------- summary and report


def summarize(windows: pd.DataFrame) -> dict:
    """Per layer: the entropy distribution over (window, channel) and how often one phase takes over half."""
    layers = []
    for layer, rows in windows.groupby("layer", sort=True):
        stride = int(rows.stride.iloc[0])
        over_half = rows.dominant_share > 0.5
        by_window = over_half.groupby([rows["head"], rows["context"], rows["window"]]).any()  # some channel has a dominant phase
        top = rows[over_half].dominant_phase.value_counts(normalize=True).reindex(range(stride), fill_value=0.0)
        quartiles = rows.entropy_bits.quantile([0.1, 0.25, 0.5, 0.75, 0.9]).round(4).tolist()
        layers.append({
            "layer": int(layer), "stride": stride, "max_bits": round(float(np.log2(stride)), 4),
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
        parts.append(f"layer {layer['layer']}: median {layer['entropy_p10_p25_p50_p75_p90'][2]:.2f} of "
                     f"{layer['max_bits']:.2f} bits, one phase over half in {100 * layer['share_over_half']:.1f}% "
                     f"of window channels{tail}")
    return "Gate weights used on real contexts: " + "; ".join(parts)


def plot(windows: pd.DataFrame, path: Path) -> None:
    """Per layer: the entropy distribution (left) and which phase dominates where one does (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stride = int(windows.stride.max())
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=110)
    bins = np.linspace(0, np.log2(stride), 25)
    for layer, rows in windows.groupby("layer"):
        left.hist(rows.entropy_bits, bins=bins, histtype="step", density=True, label=f"layer {layer}")
        dominant = rows[rows.dominant_share > 0.5].dominant_phase
        counts = np.bincount(dominant, minlength=stride) / max(1, len(rows))  # (S,)
        right.plot(range(stride), 100 * counts, "o-", label=f"layer {layer}")
    left.set(xlabel=f"entropy of the phase weights (bits; uniform = {np.log2(stride):.2f})", ylabel="density")
    right.set(xlabel="phase (position mod S)", ylabel="% of window channels it takes over half",
              xticks=range(stride) if stride <= 16 else None)
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render_markdown(config: dict, summary: dict, manifest: dict) -> str:
    from kvphase.sweep.report import markdown_table

    plan = config["plan"]
    table = pd.DataFrame([{k: v for k, v in layer.items() if k != "dominant_phase_shares"}
                          | {f"over_half_at_phase_{p}": s for p, s in enumerate(layer["dominant_phase_shares"])}
                          for layer in summary["layers"]]) if summary["layers"] else pd.DataFrame()
    return "\n".join([
        f"# Gate activations: {Path(config['model']).name}", "", f"**{headline(summary)}**", "",
        f"The first {config['contexts']} context(s) of a sweep plan (task `{plan['task']}`, {plan['context']} tokens, "
        f"seed {plan['seed']}) evaluated; for every complete window, per channel, the weight its gate gave each phase "
        "(softmax of gate + per-phase bias over the window's slots, summed per position mod S). Entropy in bits: 0 when one "
        "phase takes all, log2 S when the gate is uniform. `share_over_half`: window channels in which one phase takes more "
        "than half; `over_half_at_phase_p`: how those split over the phases. Compare with `kvphase gates` (the bias alone).",
        "", f"![entropy and dominant phases]({FIGURE_FILE})", "", markdown_table(table), "",
        "## How this was measured", "",
        f"- Model `{manifest.get('model', {}).get('file', '?')}` ({manifest.get('model', {}).get('architecture', '?')}), "
        f"backend {manifest.get('backend', '?')}; {manifest.get('tokens_evaluated', '?')} tokens, "
        f"wall time {manifest.get('wall_time_s', '?')} s.", "",
        f"Files: `config.json`, `{WINDOWS_FILE}` (one row per layer, head, context, window and channel), `summary.json`, "
        "`manifest.json`; `kvphase report <this folder>` rebuilds this page from the first two.", ""])


def build_report(run_dir: Path) -> str:
    from kvphase.probes import folder

    config = folder.load_probe_config(run_dir)
    windows = folder.load_csv(run_dir, WINDOWS_FILE, COLUMNS)
    if windows.empty:
        raise RunFolderError(f"{run_dir}/{WINDOWS_FILE} holds no rows; the contexts completed no window")
    summary = summarize(windows)
    plot(windows, Path(run_dir) / FIGURE_FILE)
    folder.write_report(run_dir, summary, render_markdown(config, summary, folder.read_manifest(run_dir)))
    return headline(summary)
