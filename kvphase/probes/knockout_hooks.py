"""The components a knockout reaches, and the hooks that record or hold them at their means.

On the numpy reference backend the hooks wrap the attention policy (`HeadRecorder`,
`HeadKnockout`) or swap its designs (`with_designs`). In llama.cpp, for any model it runs,
compressed architectures included, they tap the graph (`engines.taps`): each layer's
per-head attention output at query decodes (`TapRecorder`, `TapKnockout`), and the
compressor gate weights at every decode (`GateSlotRecorder`, `GateSlotKnockout`: the same
`hold_phase` as `HeldPhaseGate`). `PolicyHeads` and `EngineHeads` give the probe
(`probes.knockout`) one way to reach either; `model_heads` picks the one a backend offers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kvphase.backends.base import RunsPolicy, TapsGraph
from kvphase.designs import GatedPool
from kvphase.designs.heldphase import held_phase, hold_phase
from kvphase.errors import PlanError
from kvphase.probes.activations import RunningMeans
from kvphase.reference.policy import WindowDesigns, begin_context


class HeadRecorder(RunningMeans):
    """The inner policy, unchanged, summing every head's output over the rows at positions
    `from_position` and later (the query rows when that is the context length)."""

    def __init__(self, inner, from_position: int = 0):
        super().__init__()
        self.inner, self.from_position = inner, from_position

    def begin(self, context: Sequence[int]):
        return begin_context(self.inner, context)

    def attend(self, layer, q, k, v, q_pos, scale):
        out = self.inner.attend(layer, q, k, v, q_pos, scale)  # (n_head_kv, n_group, n_q, head_dim)
        rows = np.asarray(q_pos) >= self.from_position  # (n_q,)
        self.add(layer, out[:, :, rows].sum(axis=2).reshape(-1, out.shape[3]), int(rows.sum()))  # (n_head, head_dim)
        return out


class HeadKnockout:
    """The inner policy with head `head` of layer `layer` replaced by a fixed output `mean`
    at positions `from_position` and later."""

    def __init__(self, inner, layer: int, head: int, mean: np.ndarray, from_position: int = 0):
        self.inner, self.layer, self.head = inner, layer, head
        self.mean, self.from_position = np.asarray(mean), from_position  # mean: (head_dim,)

    def begin(self, context: Sequence[int]):
        return begin_context(self.inner, context)

    def attend(self, layer, q, k, v, q_pos, scale):
        out = self.inner.attend(layer, q, k, v, q_pos, scale)  # (n_head_kv, n_group, n_q, head_dim)
        if layer != self.layer:
            return out
        out = out.copy()
        n_group, rows = out.shape[1], np.asarray(q_pos) >= self.from_position  # rows: (n_q,)
        out[self.head // n_group, self.head % n_group, rows] = self.mean.astype(out.dtype)  # (rows, head_dim) by broadcast
        return out


class HeadTap:
    """Selects each chosen layer's per-head attention output node in llama.cpp's graph at query decodes."""

    every_decode = False

    def __init__(self, node: str, n_head: int, layers: Sequence[int] | None = None):
        from kvphase.engines.taps import named

        self.locate, self.n_head, self.layers = named(node), n_head, None if layers is None else set(layers)

    def select(self, name: str, layer: int, t) -> int | None:
        found = self.locate(name, layer, t)
        return found if found is not None and (self.layers is None or found in self.layers) else None

    def update(self, layer: int, array: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
        from kvphase.engines.taps import as_heads

        return self.on_heads(layer, as_heads(array, len(positions), self.n_head))  # (n_tokens, n_head, head_dim)

    def on_heads(self, layer: int, heads: np.ndarray) -> np.ndarray | None:
        raise NotImplementedError


class TapRecorder(HeadTap, RunningMeans):
    """Sums every head's output over the query rows."""

    def __init__(self, node: str, n_head: int):
        HeadTap.__init__(self, node, n_head)
        RunningMeans.__init__(self)

    def on_heads(self, layer: int, heads: np.ndarray) -> None:
        self.add(layer, heads.sum(axis=0, dtype=np.float64), heads.shape[0])  # heads: (n_tokens, n_head, head_dim)


class TapKnockout(HeadTap):
    """Writes the fixed output `mean` over head `head` of layer `layer` at the query rows."""

    def __init__(self, node: str, n_head: int, layer: int, head: int, mean: np.ndarray):
        super().__init__(node, n_head, [layer])
        self.head, self.mean = head, np.asarray(mean)  # mean: (head_dim,)

    def on_heads(self, layer: int, heads: np.ndarray) -> np.ndarray:
        heads = heads.copy()  # (n_tokens, n_head, head_dim)
        heads[:, self.head] = self.mean.astype(heads.dtype)
        return heads


class GateSlotTap:
    """Selects the compressor gate weights (softmax over each window's slots, `engines.taps`) of
    the chosen layers at every decode; slot j of a window sits at phase j mod S."""

    every_decode = True

    def __init__(self, gate, stride: int, channels: int, layers: Sequence[int]):
        self.gate, self.stride, self.channels, self.layers = gate, stride, channels, set(layers)

    def select(self, name: str, layer: int, t) -> tuple[int, int] | None:
        from kvphase.engines.taps import gate_softmax_key

        key = gate_softmax_key(t, self.gate)  # (layer, gate number)
        return key if key is not None and key[0] in self.layers else None

    def update(self, key: tuple[int, int], array: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
        from kvphase.engines.taps import as_windows

        return self.on_windows(key, as_windows(array, self.channels), positions)  # (n_windows, channels, slots)

    def on_windows(self, key: tuple[int, int], windows: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
        raise NotImplementedError


class GateSlotRecorder(GateSlotTap, RunningMeans):
    """Sums each phase's weight per channel over the windows each decode completes: `means`,
    (layer, gate number) -> (S, channels)."""

    def __init__(self, gate, stride: int, channels: int, layers: Sequence[int]):
        GateSlotTap.__init__(self, gate, stride, channels, layers)
        RunningMeans.__init__(self)

    def on_windows(self, key, windows: np.ndarray, positions: np.ndarray) -> None:
        from kvphase.engines.taps import completed_windows
        from kvphase.probes.gates import sum_by_phase

        n_new = completed_windows(positions, self.stride)
        if not n_new:
            return
        done = windows[-n_new:] if self.gate.completed_last else windows[:n_new]  # (n_new, channels, slots)
        shares = sum_by_phase(done.transpose(0, 2, 1), np.zeros(n_new, int), self.stride)  # (n_new, S, channels)
        self.add(key, shares.sum(axis=0, dtype=np.float64), n_new)


class GateSlotKnockout(GateSlotTap):
    """Holds phase `phase`'s weight in every window of layer `layer`, per gate at `weights[gate
    number]` per channel, the other slots sharing the rest in their own proportions (`hold_phase`)."""

    def __init__(self, gate, stride: int, channels: int, layer: int, phase: int, weights: dict[int, np.ndarray]):
        super().__init__(gate, stride, channels, [layer])
        self.phase, self.weights = phase, weights  # gate number -> (channels,)

    def on_windows(self, key, windows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        held = (np.arange(windows.shape[2]) % self.stride == self.phase)[None, None, :]  # (1, 1, slots)
        return hold_phase(windows, held, np.asarray(self.weights[key[1]])[None, :, None], axis=2)


class PolicyHeads:
    """The components of the numpy reference model: hooks wrap its attention policy (heads)
    or swap its designs (gate slots)."""

    def __init__(self, backend):
        self.backend, self.base = backend, backend.policy
        self.layers, self.n_head = list(range(backend.model.config.n_layer)), backend.model.config.n_head

    def recorder(self, context: int) -> HeadRecorder:
        return HeadRecorder(self.base, from_position=context)

    def knockout(self, layer: int, head: int, mean: np.ndarray, context: int) -> HeadKnockout:
        return HeadKnockout(self.base, layer, head, mean, from_position=context)

    def install(self, hook) -> None:
        self.backend.policy = hook

    def restore(self) -> None:
        self.backend.policy = self.base

    def slot_layers(self, stride: int) -> list[int]:
        return self.layers

    def check_slots(self, layers: Sequence[int]) -> None:
        _check_gated(self.base, layers, _n_head_kv(self.backend))

    def slot_recorder(self, stride: int, layers: Sequence[int]):
        from kvphase.probes.activations import GateRecorder

        return GateRecorder(self.base, stride, layers, keep_rows=False)

    def slot_knockout(self, layer: int, phase: int, means: dict):
        """The policy with phase `phase` held at its mean in every head of `layer` (`means`: (layer, head) -> (S, head_dim))."""
        n_head_kv = _n_head_kv(self.backend)
        pinned = {(layer, h): held_phase(self.base.design_for(layer, h, n_head_kv), phase, means[layer, h][phase])
                  for h in range(n_head_kv)}
        return self.base.with_designs(pinned)


class EngineHeads:
    """The components of a model in llama.cpp: hooks are taps on its graph, on each layer's
    head-output node at query decodes (the rows at the context length and later), or on
    the compressor gate weights (`taps.GATE_SOFTMAX`) at every decode (gate slots)."""

    def __init__(self, backend):
        from kvphase.engines.taps import named

        self.backend, self.node, self.n_head = backend, backend.head_node, backend.n_head
        self.layers = backend.layers_where(named(self.node))
        if not self.layers:
            raise PlanError(f"llama.cpp computes no per-head attention output ({self.node}) "
                            f"in {backend.info.path.name}; there are no heads to knock out")
        self.gate, self.stride, self.channels = None, 0, 0

    def recorder(self, context: int) -> TapRecorder:
        return TapRecorder(self.node, self.n_head)

    def knockout(self, layer: int, head: int, mean: np.ndarray, context: int) -> TapKnockout:
        return TapKnockout(self.node, self.n_head, layer, head, mean)

    def install(self, hook) -> None:
        self.backend.tap_point.tap = hook

    def restore(self) -> None:
        self.backend.tap_point.tap = None

    def slot_layers(self, stride: int) -> list[int]:
        """The layers whose compressor gate softmax llama.cpp computes (glm5-next's k-pool gate;
        deepseek4's CSA and indexer compressors, whose ratio is the plan's stride)."""
        from kvphase.engines.taps import GATE_SOFTMAX, gate_softmax_key

        self.gate, self.stride = GATE_SOFTMAX.get(self.backend.architecture), stride
        if self.gate is None:
            raise PlanError(f"--slots through llama.cpp holds the compressor gate slots of {' and '.join(GATE_SOFTMAX)}; "
                            f"{self.backend.architecture} has none (kvphase-trained gates run on the reference backend)")
        self.channels = int(self.backend.meta(self.gate.channels_key) or 0) if self.gate.channels_key else 0

        def layer_of(name, layer, t):
            key = gate_softmax_key(t, self.gate)
            return None if key is None else key[0]

        return self.backend.layers_where(layer_of)

    def check_slots(self, layers: Sequence[int]) -> None:
        return None

    def slot_recorder(self, stride: int, layers: Sequence[int]) -> GateSlotRecorder:
        return GateSlotRecorder(self.gate, stride, self.channels, layers)

    def slot_knockout(self, layer: int, phase: int, means: dict) -> GateSlotKnockout:
        weights = {number: table[phase] for (at, number), table in means.items() if at == layer}
        return GateSlotKnockout(self.gate, self.stride, self.channels, layer, phase, weights)


def model_heads(backend) -> PolicyHeads | EngineHeads:
    """Where a backend's heads can be reached: its reference policy, or its llama.cpp head tap."""
    if isinstance(backend, RunsPolicy):
        if backend.policy is None:  # kvphase.reference.deepseek4: the file's own compressor, no policy to hook
            raise PlanError("the numpy deepseek4 reference has no head hooks; knock heads out through llama.cpp's "
                            "graph (--backend llama.cpp, the default for this file)")
        return PolicyHeads(backend)
    if isinstance(backend, TapsGraph) and backend.tap_point is not None:
        return EngineHeads(backend)
    raise PlanError("knockouts need the numpy reference backend or llama.cpp opened with a head tap")


def _n_head_kv(backend) -> int:
    config = backend.model.config
    return int(getattr(config, "n_head_kv", config.n_head))


def _check_gated(policy, layers: Sequence[int], n_head_kv: int) -> None:
    """PlanError unless every chosen layer pools its windows with a trained gate at fixed offsets."""
    gated = (isinstance(policy, WindowDesigns) and not policy.randomize
             and all(isinstance(policy.design_for(layer, 0, n_head_kv), GatedPool) for layer in layers))
    if not gated:
        raise PlanError("--slots knocks out phase slots of a trained gate at fixed window offsets; this model's "
                        "attention has none (kvphase-trained gated and kpool models with fixed offsets do)")
