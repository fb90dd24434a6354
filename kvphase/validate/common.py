"""What every family checker shares: the `FamilyCheck` base and the comparison helpers."""

from __future__ import annotations

import numpy as np

from kvphase.engines.capture import CaptureRun, GgmlTensor
from kvphase.errors import BackendError
from kvphase.validate.options import DEFAULT_TOKENS
from kvphase.validate.report import LayerCheck


class FamilyCheck:
    """How one compression family is captured and compared; one instance per model."""

    names: tuple[str, ...] = ()  # llama.cpp tensor names (without the layer) to capture
    default_tokens: int = DEFAULT_TOKENS  # prompt length when the caller names none

    def uncompared(self, n_tokens: int) -> dict[int, list[str]]:
        """Per layer, what a prompt of n_tokens is too short to compare (the layer then FAILs)."""
        return {}

    def want(self, name: str, layer: int, t: GgmlTensor) -> tuple[str, int] | None:
        return (name, layer) if layer >= 0 and name in self.names else None

    def compare(self, run: CaptureRun, checks: dict[int, LayerCheck]) -> None:
        raise NotImplementedError


def captured_rows(a: np.ndarray, width: int) -> np.ndarray:
    """A captured (1, 1, n, width)-like array as (n, width)."""
    return np.asarray(a).reshape(-1, width)


def set_agreement(ours: set, theirs: set, ref_scores: np.ndarray, k: int) -> str:
    """'exact', 'tie' (the sets differ only among pools tied with the k-th reference score) or 'diff'."""
    if ours == theirs:
        return "exact"
    finite = np.sort(ref_scores[np.isfinite(ref_scores)])[::-1]
    if len(ours) != len(theirs) or len(finite) < k:
        return "diff"
    kth = finite[k - 1]
    differing = ours ^ theirs
    return "tie" if all(ref_scores[i] == kth for i in differing) else "diff"


def first_capture(run: CaptureRun, name: str, layer: int, ubatch: int) -> np.ndarray:
    """The first capture of a reused name (llama.cpp's unfused indexer names a permuted view the same)."""
    found = run.all(name, layer, ubatch)
    if not found:
        raise BackendError(f"llama.cpp computed no tensor {name}-{layer} in ubatch {ubatch}")
    return found[0].array


def live_scores(x: np.ndarray) -> np.ndarray:
    """Scores that are not masked: finite and above -FLT_MAX/2 (ggml's max pool starts from -FLT_MAX)."""
    return np.isfinite(x) & (x > -1e37)


def compare_scores(check: LayerCheck, got: np.ndarray, ref: np.ndarray) -> None:
    """Scores over the reference's columns; llama.cpp's padding columns must all be masked."""
    n = ref.shape[-1]
    head, pad = got[..., :n], got[..., n:]
    finite_got, finite_ref = live_scores(head), live_scores(ref)
    check.mask_mismatch += int(np.sum(finite_got != finite_ref)) + int(np.sum(live_scores(pad)))
    both = finite_got & finite_ref
    check.scores.add(head[both], ref[both])
    if both.any():
        check.score_scale = max(check.score_scale, float(np.abs(head[both]).max()))
