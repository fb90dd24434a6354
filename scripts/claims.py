"""Tables the documents publish, generated from their run folders (issue 41: claims as code).

A document holds a generated table between two markers:

    <!-- claims:NAME -->
    ...what TABLES[NAME] builds from the folders it names...
    <!-- /claims:NAME -->

`python scripts/claims.py` rewrites every such block in README.md, docs/ and reports/README.md;
`--check` only compares (exit 1 naming each block that differs); tests/test_claims.py runs the
check. Every number in a block is read from a summary.json, config.json or manifest.json, and
each row's verdict is the report's own class (`Summary.verdict`: effect, inconclusive, no
effect at this power). Prose around a block is written by hand and must agree with it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "reports" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"(<!-- claims:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /claims:(?P=name) -->)", re.S)
FIXES = ROOT / "reports" / "trained" / "fixes"


def _read(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text())


def verdict(summary: dict) -> str:
    """The report's class, from the summary's numbers (the rule of `Summary.verdict`)."""
    from kvphase.sweep.analysis import Summary
    from kvphase.sweep.stratified import StratifiedTest

    fields = {k: v for k, v in summary.items() if k not in ("headline", "verdict")}
    rebuilt = Summary(**{**fields, "test": StratifiedTest(**fields["test"]),
                         "logprob_test": StratifiedTest(**fields["logprob_test"]),
                         "gap_ci": tuple(fields["gap_ci"]), "mean_ci": tuple(fields.get("mean_ci", (0.0, 0.0)))})
    return rebuilt.verdict


def _mean(summary: dict) -> str:
    """Mean accuracy with its interval (summaries written before the interval have none)."""
    ci = summary.get("mean_ci")
    return f"{summary['mean_accuracy']:.1f}" + (f" ({ci[0]:.1f}-{ci[1]:.1f})" if ci else "")


def _p(value: float) -> str:
    return f"{value:.2g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def fixes_table(models: list[tuple[str, str]], fixes: list[tuple[str, str]]) -> str:
    """Each model's plain sweep and each fix: mean (CI), gap (CI), p, verdict, tokens x plain."""
    rows = []
    for model, label in models:
        plain = _read(FIXES / f"{model}-plain", "manifest.json")["tokens_evaluated"]
        for i, (fix, fix_label) in enumerate(fixes):
            folder = FIXES / f"{model}-{fix}"
            if not folder.is_dir():
                continue
            s, tokens = _read(folder, "summary.json"), _read(folder, "manifest.json")["tokens_evaluated"]
            rows.append([label if i == 0 else "", fix_label,
                         f"{s['mean_accuracy']:.1f} ({s['mean_ci'][0]:.1f}-{s['mean_ci'][1]:.1f})",
                         f"{s['gap']:.1f} ({s['gap_ci'][0]:.1f}-{s['gap_ci'][1]:.1f})", _p(s["test"]["p_value"]),
                         verdict(s), f"{tokens / plain:.2f}"])
    return _table(["model", "fix", "mean % (95% CI)", "gap, points (95% CI)", "p", "verdict", "tokens x plain"], rows)


FIX_NAMES = [("plain", "none"), ("offsets2-mean", "`--offsets 2`"), ("offsets4-mean", "`--offsets 4`"),
             ("offsets4-max", "`--offsets 4 --combine max`"), ("random-offset", "`--random-offset`")]


def long_context_table() -> str:
    """README's sweeps at the defaults: the plan, its cost (the manifests) and what the report says."""
    runs = [("SmolLM2-135M Q4_1", "reports/example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024", "example"),
            ("SmolLM2-135M Q4_1", "reports/long-context/SmolLM2-135M-Instruct.Q4_1-records-S4-L8128", "long-context"),
            ("Gemma 3 270M Q4_K_M", "reports/calibrated/gemma-3-270m-q4_k_m-records-S4-calibrated", "calibrated"),
            ("Gemma 3 270M Q4_K_M", "reports/long-context/gemma-3-270m-q4_k_m-records-S4-L16384", "long-context")]
    rows = []
    for model, relative, label in runs:
        folder = ROOT / relative
        config, s, manifest = (_read(folder, n) for n in ("config.json", "summary.json", "manifest.json"))
        dip = "-" if s["detectable_dip"] is None else f"{s['detectable_dip']:.1f}"
        rows.append([model, str(config["context"]), f"{s['n_contexts']} x {s['n_targets'] // s['n_contexts']}",
                     f"{round(manifest['tokens_evaluated'] / 1000)}K", f"{manifest['wall_time_s'] / 60:.1f} min",
                     f"{s['mean_accuracy']:.1f}%", verdict(s), dip, f"[{label}]({relative}/report.md)"])
    return _table(["model", "context", "contexts x targets", "tokens", "wall time", "mean accuracy", "verdict",
                   "detectable dip, points", "run folder"], rows)


def _quantized_gap(folder: Path, kind: str) -> str:
    sweep = folder / f"sweep-{kind}"
    return f"{_read(sweep, 'summary.json')['gap']:.1f}" if sweep.is_dir() else "-"


def _reference_agreement(folder: Path) -> str:
    """The reference sweep of the same weights against llama.cpp's: identical per-residue
    accuracies, or its gap and how many targets' verdicts differ (results.csv, by target)."""
    import pandas as pd

    engine, reference = _read(folder / "sweep", "summary.json"), _read(folder / "sweep-reference", "summary.json")
    if [r["accuracy"] for r in engine["per_residue"]] == [r["accuracy"] for r in reference["per_residue"]]:
        return "identical"
    flags = [pd.read_csv(folder / name / "results.csv").set_index("target_id")["correct"]
             for name in ("sweep", "sweep-reference")]
    apart = int((flags[0] != flags[1].reindex(flags[0].index)).sum())
    return f"gap {reference['gap']:.1f}, {apart} target{'s' if apart != 1 else ''} apart"


def trained_table(runs: list[tuple[str, str]], quantized: bool = False, reference: bool = False) -> str:
    """Trained models: held-out accuracy (the training folder's summary.json), then the sweep of
    each (its sweep/ folder): mean (CI), per residue with the worst in bold, gap (CI), p, verdict.
    A model below the training report's 80% bar is marked so: its training report does not read
    its gap as a phase effect, whatever its sweep's verdict. `quantized`: the gaps of its Q8_0 and
    Q4_0 copies' sweeps (sweep-Q8_0/, sweep-Q4_0/) beside."""
    rows = []
    for label, name in runs:
        folder = ROOT / "reports" / "trained" / name
        trained, s = _read(folder, "summary.json"), _read(folder / "sweep", "summary.json")
        accuracies = [row["accuracy"] for row in s["per_residue"]]
        worst = accuracies.index(min(accuracies))
        worst = worst if min(accuracies) < max(accuracies) else None  # no residue is worst when all are equal
        residues = ", ".join(f"**{a:.1f}**" if i == worst else f"{a:.1f}" for i, a in enumerate(accuracies))
        held_out = f"{trained['accuracy']:.1f}" + ("" if trained["readable"] else " (below 80%)")
        rows.append([f"[{label}]({folder.relative_to(ROOT / 'reports')}/sweep/report.md)", held_out, _mean(s), residues,
                     f"{s['gap']:.1f} ({s['gap_ci'][0]:.1f}-{s['gap_ci'][1]:.1f})", _p(s["test"]["p_value"]),
                     verdict(s)] + ([_reference_agreement(folder)] if reference else [])
                    + ([_quantized_gap(folder, q) for q in ("Q8_0", "Q4_0")] if quantized else []))
    return _table(["model", "held-out %", "sweep mean % (95% CI)", "per residue %", "gap (95% CI)", "p", "verdict"]
                  + (["reference sweep"] if reference else []) + (["Q8_0 gap", "Q4_0 gap"] if quantized else []), rows)


GATED_CONTEXTS = [("S = 4, context 64, seed 0", "gated-seed0")] + [
    (f"S = {stride}, context 256, {steps}seed {seed}", f"gated-{'S8-' if stride == 8 else ''}L256-{long}seed{seed}")
    for stride in (4, 8) for steps, long in (("", ""), ("3000 steps, ", "long-")) for seed in (0, 1, 2)]

def contents(document: Path) -> str:
    """A table of contents of a document's "## " headings, linked as GitHub anchors them."""
    lines = []
    for heading in re.findall(r"^## (.+)$", document.read_text(), re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        lines.append(f"- [{heading}](#{anchor})")
    return "\n".join(lines) + "\n"


DEEPSEEK4_LAYOUT = [(f"{design} seed {seed}" + (" (twin)" if design == "csa-dense" else ""), f"engine/{design}-seed{seed}")
                    for design, seeds in (("csa-disjoint", range(5)), ("csa", range(5)), ("csa-dense", range(3)))
                    for seed in seeds]

GLM5_LAYOUT = [(f"glm-kpool seed {seed} (top-k 8)", f"engine/glm-kpool-seed{seed}") for seed in range(3)] + [
    ("glm-kpool top-k 4, seed 0", "engine/glm-kpool-top4-seed0"), ("glm-dense seed 0 (twin)", "engine/glm-dense-seed0")]

SEEDS_FIXED = [(f"csa-disjoint-seed{k}-retrained", f"csa-disjoint seed {k}, retrained") for k in (2, 5, 6)]

TABLES: dict[str, Callable[[], str]] = {
    "fixes-seeds": lambda: fixes_table([("csa-disjoint-seed0", "csa-disjoint seed 0 (tests/data)"), *SEEDS_FIXED],
                                       [("plain", "none"), ("offsets4-mean", "`--offsets 4`")]),
    "glm5-layout": lambda: trained_table(GLM5_LAYOUT, quantized=True, reference=True),
    "deepseek4-layout": lambda: trained_table(DEEPSEEK4_LAYOUT, quantized=True),
    "reports-contents": lambda: contents(ROOT / "reports" / "README.md"),
    "gated-contexts": lambda: trained_table(GATED_CONTEXTS),
    "readme-fixes": lambda: fixes_table([("csa-disjoint-seed0", "csa-disjoint seed 0")], FIX_NAMES),
    "fixes": lambda: fixes_table([("csa-disjoint-seed0", "csa-disjoint (deepseek4, llama.cpp)"),
                                  ("gated-seed0", "gated seed 0 (gpt2 + gate, reference)"),
                                  ("glm-dense-seed0", "glm-dense (glm5-next, llama.cpp; no weak spot)"),
                                  ("gated-offsets-random-seed0", "gated-offsets-random seed 0 (no weak spot)")],
                                 FIX_NAMES),
    "long-context": long_context_table,
}


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def regenerate(text: str) -> str:
    """`text` with every block's body rebuilt; KeyError for a block no table builds."""
    return BLOCK.sub(lambda m: m.group(1) + TABLES[m.group("name")]() + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 naming each block that differs")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    stale = []
    for document in DOCUMENTS:
        text = document.read_text()
        new = regenerate(text)
        if new != text:
            stale.append(document.relative_to(ROOT))
            if not args.check:
                document.write_text(new)
    for document in stale:
        print(f"{document}: {'differs from its run folders' if args.check else 'rewritten'}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
