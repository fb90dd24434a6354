"""How far two builds of llama.cpp move one sweep's per-target numbers (issue 71): the same plan scored
by two llama-cpp-python builds that differ only in the CPU kernels they were compiled for.

Build llama-cpp-python a second time in a scratch venv with CPU features restricted, e.g. as an
AVX2-only host (no AVX-512) would get it natively, and never through pip's wheel cache:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \\
      -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF" \\
      scratch/bin/pip install --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36

then score the default plan with each build (`kvphase sweep --threads 1 --quiet --out DIR`, once from
each venv) and compare the two folders:

    python scripts/cross_build_spread.py NATIVE_DIR RESTRICTED_DIR --out tests/data/cross-build-spread.json

It prints the per-target log-probability differences and the targets whose correctness flips, and
writes them (one row per target) for tests/sweep/test_default_sweep.py, which derives its
reproduction bounds from them. Refuses two folders of different plans.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import beta

PLAN_COLUMNS = ["context", "residue", "target_pos", "key", "answer"]


def _folder(path: Path) -> tuple[pd.DataFrame, dict]:
    rows = pd.read_csv(path / "results.csv", keep_default_na=False).set_index("target_id").sort_index()
    return rows, json.loads((path / "manifest.json").read_text())


def clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided upper confidence bound on a binomial rate after k of n."""
    return 1.0 if k == n else float(beta.ppf(level, k + 1, n - k))


def spread(a_dir: Path, b_dir: Path) -> dict:
    (a, a_manifest), (b, b_manifest) = _folder(a_dir), _folder(b_dir)
    if a_manifest["plan_sha256"] != b_manifest["plan_sha256"] or not a[PLAN_COLUMNS].equals(b[PLAN_COLUMNS]):
        raise SystemExit(f"Error: {a_dir} and {b_dir} are not the same plan")
    d_logprob = (b["logprob"] - a["logprob"]).to_numpy()
    flips = (a["correct"] != b["correct"]).to_numpy()
    n, k = len(a), int(flips.sum())
    return {
        "builds": {"a": a_manifest["engine"]["system_info"], "b": b_manifest["engine"]["system_info"]},
        "plan_sha256": a_manifest["plan_sha256"],
        "n_targets": n,
        "flips": k,
        "flip_rate_upper_95": clopper_pearson_upper(k, n),
        "net_correct_change": int(b["correct"].sum() - a["correct"].sum()),
        "abs_logprob_difference": {"max": float(np.abs(d_logprob).max()), "mean": float(np.abs(d_logprob).mean()),
                                   "median": float(np.median(np.abs(d_logprob))),
                                   "identical": int((d_logprob == 0).sum())},
        "rows": {"target_id": a.index.tolist(), "residue": a["residue"].tolist(), "context": a["context"].tolist(),
                 "d_logprob": [round(float(x), 6) for x in d_logprob], "flip": flips.astype(int).tolist()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="run folder scored by the first build (the native one)")
    parser.add_argument("b", type=Path, help="the same plan's run folder scored by the second build")
    parser.add_argument("--out", type=Path, help="write the figures and per-target rows here (JSON)")
    args = parser.parse_args(argv)
    found = spread(args.a, args.b)
    lp = found["abs_logprob_difference"]
    print(f"{found['n_targets']} targets; correctness flips: {found['flips']} "
          f"(rate {found['flips'] / found['n_targets']:.4f}, 95% upper bound {found['flip_rate_upper_95']:.4f}); "
          f"net change in correct targets {found['net_correct_change']:+d}")
    print(f"|logprob difference|: max {lp['max']:.3f}, mean {lp['mean']:.4f}, median {lp['median']:.4f} nats; "
          f"{lp['identical']} targets identical")
    print(f"builds: a {found['builds']['a']}\n        b {found['builds']['b']}")
    if args.out:
        args.out.write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
