"""Static gate concentration: which phase each compressor's per-phase bias favours, from weights alone.

Every compressor kvphase knows pools a window of tokens with a per-channel softmax over
the window of `gate + ape[slot]`, where `ape` is a learned bias per slot of the window
(docs/protocol.md, "Gate concentration"). With the content term averaged out, the bias alone
gives the static weights softmax(ape) over the slots; a slot sits at a fixed residue
(its phase) of the position mod the stride S. Per channel this probe reports the weight
each phase gets, its entropy in bits (0 for one-hot, log2 S for uniform), and the
dominant phase with its share. Sources:

- glm5-next: `blk.N.indexer_compressor_ape`, numpy (kpool, n_embd_indexer): the k-pool
  indexer's pooling (`build_kpool_select`, src/models/glm5-next.cpp);
- deepseek4: `blk.N.attn_compressor_ape` and (ratio 4) `blk.N.indexer_compressor_ape`,
  numpy (ratio, C). Ratio 4 (CSA) overlaps: C = 2d, and an entry's softmax runs over 2 x 4
  rows per channel, the previous block's slots with the first d channels and its own
  block's slots with the last d (`kvphase.designs.dsv4.DSV4.pool`); ratio 128 (HCA) is
  one block of C = d channels;
- kvphase's trained models (`kvphase.trained.design` gated or kpool):
  `blk.N.attn_gate_ape.weight`, numpy (heads, S, head_dim), each head's windows starting
  at its `kvphase.trained.starts` offset (`kvphase.designs.gatedpool.GatedPool`).

Only the header and the bias tensors are read, through one memory map: a file of
hundreds of GB costs the header parse and a few kilobytes of weights.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from kvphase.errors import ModelFileError, PlanError
from kvphase.gguf.header import GGUFHeader, TensorInfo, read_gguf_header
from kvphase.gguf.keys import Keys
from kvphase.gguf.tensors import tensor_array
from kvphase.runfolder import MANIFEST_FILE, ReportPage, figure, markdown_table, write_csv, write_json

TRAINED = "kvphase.trained."
CSA_RATIO = 4  # deepseek4: the ratio whose compressor overlaps two blocks (kvphase.designs.dsv4.CSA_RATIO)


@dataclass(frozen=True)
class GateSource:
    """One per-phase bias tensor of a model and how its slots map to phases."""

    layer: int
    kind: str  # "kpool-indexer", "csa-compressor", "csa-indexer", "hca-compressor", "trained-gated", "trained-kpool"
    tensor: str  # the tensor's name in the file
    stride: int  # S: phases are positions mod S
    starts: tuple[int, ...] = (0,)  # per unit (head): the window offset; slot j sits at phase (start + j) % S
    overlap: bool = False  # CSA: the softmax spans the previous block's slots and the block's own

    def __post_init__(self) -> None:
        if self.stride < 2:
            raise ModelFileError(f"{self.tensor}: a stride of {self.stride} has no phases (expected >= 2)")


def find_sources(header: GGUFHeader) -> list[GateSource]:
    """The per-phase biases a file declares, in layer order, from its metadata; PlanError when
    it declares none, ModelFileError when a declared bias tensor is missing."""
    fields = header.fields
    arch = str(fields.get(Keys.General.ARCHITECTURE, "unknown"))
    if arch == "glm5-next":
        sources = _kpool_sources(fields)
    elif arch == "deepseek4":
        sources = _dsv4_sources(fields)
    elif TRAINED + "design" in fields:
        sources = _trained_sources(fields)
    else:
        sources = []
    if not sources:
        design = fields.get(TRAINED + "design")
        why = f" (trained design {design!r} has no gate bias)" if design else ""
        raise PlanError(f"{header.path.name} ({arch}) declares no compressor with a per-phase gate bias{why}; "
                        "`gates` reads glm5-next, deepseek4 and kvphase-trained gated/kpool models")
    names = {t.name for t in header.tensors}
    for source in sources:
        if source.tensor not in names:
            raise ModelFileError(f"{header.path.name}: layer {source.layer} declares a {source.kind} "
                                 f"but the file has no tensor {source.tensor}")
    return sources


def _per_layer(fields: dict, key: str, n_layer: int) -> list[int]:
    """A per-layer array key, or one value for every layer."""
    values = [int(v) for v in np.atleast_1d(fields.get(key, []))]
    return values * n_layer if len(values) == 1 else values + [0] * (n_layer - len(values))


def _kpool_sources(fields: dict) -> list[GateSource]:
    """glm5-next: every MLA layer (head_count_kv > 0; 0 marks KDA) has the k-pool indexer."""
    n_layer = int(fields.get(Keys.LLM.BLOCK_COUNT.format(arch='glm5-next'), 0))
    kpool = int(fields.get(Keys.Attention.Indexer.KPOOL.format(arch='glm5-next'), 0))
    kv_heads = _per_layer(fields, Keys.Attention.HEAD_COUNT_KV.format(arch='glm5-next'), n_layer)
    return [GateSource(i, "kpool-indexer", f"blk.{i}.indexer_compressor_ape.weight", kpool)
            for i in range(n_layer) if kv_heads[i] > 0]


def _dsv4_sources(fields: dict) -> list[GateSource]:
    """deepseek4: a compressor on every layer with ratio > 1, and the indexer's on ratio-4 (CSA) layers."""
    n_layer = int(fields.get(Keys.LLM.BLOCK_COUNT.format(arch='deepseek4'), 0))
    sources = []
    for i, ratio in enumerate(_per_layer(fields, Keys.Attention.COMPRESS_RATIOS.format(arch='deepseek4'), n_layer)):
        if ratio <= 1:
            continue
        csa = ratio == CSA_RATIO
        sources.append(GateSource(i, "csa-compressor" if csa else "hca-compressor",
                                  f"blk.{i}.attn_compressor_ape.weight", ratio, overlap=csa))
        if csa:
            sources.append(GateSource(i, "csa-indexer", f"blk.{i}.indexer_compressor_ape.weight", ratio, overlap=True))
    return sources


def _trained_sources(fields: dict) -> list[GateSource]:
    """kvphase-trained gated / kpool models: every layer, one unit per head at its window offset."""
    design = str(fields[TRAINED + "design"])
    if design not in ("gated", "kpool"):
        return []
    stride = int(fields.get(TRAINED + "stride", 0))
    n_layer, n_head = int(fields.get(Keys.LLM.BLOCK_COUNT.format(arch='gpt2'), 0)), int(fields.get(Keys.Attention.HEAD_COUNT.format(arch='gpt2'), 0))
    starts = [int(s) for s in np.atleast_1d(fields.get(TRAINED + "starts", []))]
    if str(fields.get(TRAINED + "offsets", "fixed")) == "random" or len(starts) != n_layer * n_head:
        starts = [0] * (n_layer * n_head)  # offsets drawn per context: slots are phases relative to the window
    return [GateSource(i, f"trained-{design}", f"blk.{i}.attn_gate_ape.weight", stride,
                       tuple(starts[i * n_head : (i + 1) * n_head])) for i in range(n_layer)]


def read_bias(raw: np.ndarray, info: TensorInfo, source: GateSource) -> np.ndarray:
    """The source's bias as (units, W, C): per unit (head), per slot of the softmax window, per channel."""
    ape = tensor_array(raw, info).astype(np.float64)  # numpy order, see the module docstring
    trained = source.kind.startswith("trained")
    expected = (len(source.starts), source.stride) if trained else (source.stride,)
    if ape.ndim != len(expected) + 1 or ape.shape[:-1] != expected or (source.overlap and ape.shape[-1] % 2):
        raise ModelFileError(f"{info.name} has shape {ape.shape} (numpy order), expected {expected + ('C',)}"
                             + (" with C even" if source.overlap else ""))
    if trained:
        return ape  # (heads, S, head_dim)
    if source.overlap:
        d = ape.shape[1] // 2
        return np.concatenate([ape[:, :d], ape[:, d:]], axis=0)[None]  # (1, 2S, d): previous block's slots, then its own
    return ape[None]  # (1, S, C)


def phase_shares(bias: np.ndarray, source: GateSource) -> np.ndarray:
    """Static softmax weight of each phase, per unit and channel: (units, S, C), summing to 1 over S."""
    bias = np.asarray(bias, dtype=np.float64)  # (units, W, C)
    shifted = bias - bias.max(axis=1, keepdims=True)  # (units, W, C)
    weights = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)  # (units, W, C)
    return sum_by_phase(weights, np.asarray(source.starts), source.stride)  # each unit's slot 0 sits at its start


def sum_by_phase(weights: np.ndarray, first_positions: np.ndarray, stride: int) -> np.ndarray:
    """Per window (or unit) and channel, the weight of each phase: (n, S, C) from weights
    (n, W, C) whose slot j sits at position first_positions[i] + j."""
    n, width, _ = weights.shape
    phases = (np.asarray(first_positions)[:, None] + np.arange(width)) % stride  # (n, W)
    one_hot = phases[:, :, None] == np.arange(stride)  # (n, W, S)
    return np.einsum("nws,nwc->nsc", one_hot.astype(np.float64), weights.astype(np.float64))  # (n, S, C)


def entropy_bits(shares: np.ndarray) -> np.ndarray:
    """Entropy in bits over axis 1 (0 for one-hot, log2 S for uniform): (units, C)."""
    logs = np.log2(np.where(shares > 0, shares, 1.0))  # (units, S, C): 0 * log 0 counts as 0
    return np.maximum(-(shares * logs).sum(axis=1), 0.0)  # (units, C); -0.0 and rounding below 0 become 0


@dataclass(frozen=True)
class GateTables:
    """What `gates` measures: one row per channel and one per (unit, phase)."""

    channels: pd.DataFrame  # layer, source, head, channel, stride, dominant_phase, dominant_share, entropy_bits
    phases: pd.DataFrame  # layer, source, head, stride, phase, mean_share, dominant_channels
    tensors_sha256: str  # of the bias bytes read, in source order: what the numbers depend on
    architecture: str  # general.architecture


CHANNEL_COLUMNS = ["layer", "source", "head", "channel", "stride", "dominant_phase", "dominant_share", "entropy_bits"]
PHASE_COLUMNS = ["layer", "source", "head", "stride", "phase", "mean_share", "dominant_channels"]


def measure_gates(path: str | Path, layers: list[int] | None = None) -> tuple[list[GateSource], GateTables]:
    """Static gate concentration of every per-phase bias in the file (or the `layers` given)."""
    header = read_gguf_header(path)
    sources = select_sources(find_sources(header), layers, header.path.name)
    infos = {t.name: t for t in header.tensors}
    raw = np.memmap(header.path, dtype=np.uint8, mode="r")  # only the bias tensors' pages are ever touched
    digest = hashlib.sha256()
    channel_rows, phase_rows = [], []
    for source in sources:
        info = infos[source.tensor]
        digest.update(np.asarray(raw[info.data_offset : info.data_offset + info.n_bytes]).tobytes())
        shares = phase_shares(read_bias(raw, info, source), source)  # (units, S, C)
        channel_rows.append(_channel_frame(source, shares))
        phase_rows.append(_phase_frame(source, shares))
    return sources, GateTables(pd.concat(channel_rows, ignore_index=True), pd.concat(phase_rows, ignore_index=True),
                               digest.hexdigest(), str(header.fields.get(Keys.General.ARCHITECTURE, "unknown")))


def _channel_frame(source: GateSource, shares: np.ndarray) -> pd.DataFrame:
    units, _, n_channels = shares.shape
    head, channel = np.meshgrid(np.arange(units), np.arange(n_channels), indexing="ij")  # (units, C) each
    return pd.DataFrame({
        "layer": source.layer, "source": source.kind, "head": head.ravel(), "channel": channel.ravel(),
        "stride": source.stride, "dominant_phase": shares.argmax(axis=1).ravel(),
        "dominant_share": shares.max(axis=1).ravel().round(6), "entropy_bits": entropy_bits(shares).ravel().round(6),
    })


def _phase_frame(source: GateSource, shares: np.ndarray) -> pd.DataFrame:
    units, stride, _ = shares.shape
    dominant = shares.argmax(axis=1)  # (units, C)
    head, phase = np.meshgrid(np.arange(units), np.arange(stride), indexing="ij")  # (units, S) each
    counts = (dominant[:, None, :] == np.arange(stride)[None, :, None]).sum(axis=2)  # (units, S)
    return pd.DataFrame({
        "layer": source.layer, "source": source.kind, "head": head.ravel(), "stride": source.stride,
        "phase": phase.ravel(), "mean_share": shares.mean(axis=2).ravel().round(6), "dominant_channels": counts.ravel(),
    })


def select_sources(sources: list[GateSource], layers: Sequence[int] | None, model_name: str) -> list[GateSource]:
    """The sources of the chosen layers (all for none); PlanError naming a chosen layer without one."""
    if not layers:
        return sources
    present = sorted({s.layer for s in sources})
    missing = [layer for layer in layers if layer not in present]
    if missing:
        raise PlanError(f"layer {missing[0]} has no gate bias in {model_name}; layers with one: {_short(present)}")
    return [s for s in sources if s.layer in layers]


def _short(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:12]) + (", ..." if len(values) > 12 else "")


# --------------------------------------------------------------------------- summary and report

CHANNELS_FILE, PHASES_FILE, FIGURE_FILE = "results.csv", "phases.csv", "gate_phases.png"
CONCENTRATED = 0.5  # a channel is concentrated when one phase takes more than half its weight


def summarize(channels: pd.DataFrame, phases: pd.DataFrame) -> dict:
    """Per unit (layer, source, head): entropy, dominant phase and share, concentrated channels."""
    units = []
    for (layer, source, head), rows in channels.groupby(["layer", "source", "head"], sort=True):
        stride = int(rows["stride"].iloc[0])
        mean = phases[(phases.layer == layer) & (phases.source == source) & (phases["head"] == head)]
        mean = mean.sort_values("phase")["mean_share"].to_numpy()  # (S,)
        static_bits = float(entropy_bits(mean[None, :, None])[0, 0])
        units.append({
            "layer": int(layer), "source": str(source), "head": int(head), "stride": stride, "channels": len(rows),
            "max_bits": round(float(np.log2(stride)), 4),
            "mean_entropy_bits": round(float(rows["entropy_bits"].mean()), 4),
            "static_entropy_bits": round(static_bits, 4),  # of the channel-mean shares: exp(H(E[a])) in bits
            "effective_phases": round(float(2.0 ** static_bits), 3),
            "dominant_phase": int(mean.argmax()), "dominant_share": round(float(mean.max()), 4),
            "concentrated_channels": round(float((rows["dominant_share"] > CONCENTRATED).mean()), 4),
        })
    table = pd.DataFrame(units)
    # most concentrated relative to its own maximum, so strides 4 and 128 compare
    sharpest = table.iloc[int((table["mean_entropy_bits"] / table["max_bits"]).argmin())]
    return {
        "units": units,
        "n_units": len(units),
        "layers": sorted({u["layer"] for u in units}),
        "mean_entropy_fraction": round(float((table["mean_entropy_bits"] / table["max_bits"]).mean()), 4),
        "sharpest": {k: sharpest[k].item() if hasattr(sharpest[k], "item") else sharpest[k]
                     for k in ("layer", "source", "head", "dominant_phase", "dominant_share", "mean_entropy_bits",
                               "max_bits")},
    }


def headline(summary: dict) -> str:
    s = summary["sharpest"]
    return (f"{summary['n_units']} gate units in {len(summary['layers'])} layers; mean per-channel entropy "
            f"{100 * summary['mean_entropy_fraction']:.1f}% of its maximum. Most concentrated: layer {s['layer']} "
            f"{s['source']} head {s['head']}, phase {s['dominant_phase']} (mean share {s['dominant_share']:.3f}, "
            f"{s['mean_entropy_bits']:.3f} of {s['max_bits']:.3g} bits)")


def plot_heatmap(phases: pd.DataFrame, path: Path) -> None:
    """Mean static share per unit (rows) and phase (columns); one panel per stride."""
    strides = sorted(phases["stride"].unique())
    grids = []
    for stride in strides:
        grid = phases[phases.stride == stride].pivot_table(index=["layer", "source", "head"], columns="phase",
                                                           values="mean_share")
        grids.append((stride, grid))
    height = sum(max(1.2, 0.28 * len(g)) for _, g in grids) + 1.0
    with figure(path, len(grids), 1, figsize=(7.5, min(height, 40)), dpi=110, squeeze=False) as (fig, axes):
        for ax, (stride, grid) in zip(axes[:, 0], grids):
            values = grid.to_numpy()  # (units, S)
            top = max(float(values.max()), 2.0 / stride)  # a uniform gate (1/S everywhere) stays dark at any S
            image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=0, vmax=top, interpolation="nearest")
            labels = [f"L{l} {s}" + (f" h{h}" if grid.index.get_level_values("head").max() > 0 else "") for l, s, h in grid.index]
            ax.set_yticks(range(len(labels)), labels, fontsize=6 if len(labels) > 24 else 8)
            ax.set_xlabel(f"phase (position mod {stride})")
            if stride <= 32:
                ax.set_xticks(range(stride))
            fig.colorbar(image, ax=ax, label="static share")


def render_markdown(config: dict, summary: dict, manifest: dict) -> str:
    model = manifest.get("model", {})
    return ReportPage(
        title=f"Static gate concentration: {Path(config['model']).name}",
        headline=headline(summary),
        prose="Per channel, the softmax over a window's slots of the learned per-slot bias alone (the content "
              "term left out), summed per phase (position mod S). Entropy 0 bits: the channel reads one phase "
              "only; log2 S: all phases alike. `static_entropy_bits` is the entropy of the channel-mean shares "
              "(effective phases = 2^that); `concentrated_channels` is the share of channels where one phase takes "
              f"more than {CONCENTRATED:.0%}. Static concentration says which phases a gate can favour; what a "
              "window actually uses also depends on its content.",
        figure=(FIGURE_FILE, "mean static share per layer and phase"),
        sections=[("Per gate unit", markdown_table(pd.DataFrame(summary["units"])))],
        measured=[f"Model `{model.get('file', '?')}` ({model.get('architecture', '?')}, {model.get('size', 0):,} "
                  "bytes); only the bias tensors were read (sha256 of their bytes "
                  f"`{manifest.get('tensors_sha256', '?')[:16]}...`).",
                  f"Layers: {config.get('layers') or 'all with a gate bias'}; wall time "
                  f"{manifest.get('wall_time_s', '?')} s."],
        files=f"Files: `config.json`, `{CHANNELS_FILE}` (one row per channel), `{PHASES_FILE}` (per unit and phase), "
              "`summary.json`, `manifest.json`. `kvphase report <this folder>` rebuilds this page from them.",
    ).markdown()


def build_report(run_dir: Path) -> str:
    """summary.json, report.md and the heatmap from config.json and the two tables; the headline."""
    from kvphase.probes import folder

    config = folder.load_probe_config(run_dir)
    channels = folder.load_csv(run_dir, CHANNELS_FILE, CHANNEL_COLUMNS, text=("source",))
    phases = folder.load_csv(run_dir, PHASES_FILE, PHASE_COLUMNS, text=("source",))
    summary = summarize(channels, phases)
    plot_heatmap(phases, Path(run_dir) / FIGURE_FILE)
    folder.write_report(run_dir, summary, render_markdown(config, summary, folder.read_manifest(run_dir)))
    return headline(summary)


def run_gates(model: str | Path, run_dir: str | Path, layers: list[int] | None = None) -> str:
    """Measure, write the run folder, build its report; return the headline."""
    import time

    from kvphase.probes import folder

    started = time.time()
    model, run_dir = Path(model), Path(run_dir)
    sources, tables = measure_gates(model, layers)  # all input errors before anything is written
    config = {"probe": "gates", "model": str(model), "layers": sorted(layers) if layers else []}
    folder.start_folder(run_dir, config, [CHANNELS_FILE, PHASES_FILE, FIGURE_FILE])
    write_csv(run_dir / CHANNELS_FILE, tables.channels[CHANNEL_COLUMNS])
    write_csv(run_dir / PHASES_FILE, tables.phases[PHASE_COLUMNS])
    write_json(run_dir / MANIFEST_FILE, folder.manifest(
        model, tables.architecture, time.time() - started, tensors_sha256=tables.tensors_sha256,
        tensors=[s.tensor for s in sources]))
    return build_report(run_dir)
