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
import os
import re
import sys
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "reports" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"(?P<open><!-- claims:(?P<name>[\w-]+) -->(?P<newline>\n?))(?P<body>.*?)"
                   r"(?P<close>[ ]*<!-- /claims:(?P=name) -->)", re.S)
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


def _gap(summary: dict) -> str:
    return f"{summary['gap']:.1f} ({summary['gap_ci'][0]:.1f}-{summary['gap_ci'][1]:.1f})"


def _link(label: str, folder: Path, base: Path) -> str:
    return f"[{label}]({folder.relative_to(base)}/report.md)"


def _dip(summary: dict, digits: int = 1) -> str:
    """The one-residue dip the run detects with 80% power, "-" when none can be computed."""
    return "-" if summary["detectable_dip"] is None else f"{summary['detectable_dip']:.{digits}f}"


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
                         _gap(s), _p(s["test"]["p_value"]), verdict(s), f"{tokens / plain:.2f}"])
    return _table(["model", "fix", "mean % (95% CI)", "gap, points (95% CI)", "p", "verdict", "tokens x plain"], rows)


FIX_NAMES = [("plain", "none"), ("offsets2-mean", "`--offsets 2`"), ("offsets4-mean", "`--offsets 4`"),
             ("offsets4-max", "`--offsets 4 --combine max`"), ("random-offset", "`--random-offset`")]


LONG_CONTEXT = [("SmolLM2-135M Q4_1", "reports/long-context/SmolLM2-135M-Instruct.Q4_1-records-S4-L8128", "long-context"),
                ("Gemma 3 270M Q4_K_M", "reports/long-context/gemma-3-270m-q4_k_m-records-S4-L16384", "long-context")]


def long_context_table(runs: list[tuple[str, str, str]], base: Path = ROOT) -> str:
    """Sweeps at the defaults: the plan, its cost (the manifests) and what the report says;
    links relative to `base`, the folder of the document that shows the table."""
    rows = []
    for model, relative, label in runs:
        folder = ROOT / relative
        config, s, manifest = (_read(folder, n) for n in ("config.json", "summary.json", "manifest.json"))
        rows.append([model, str(config["context"]), f"{s['n_contexts']} x {s['n_targets'] // s['n_contexts']}",
                     f"{round(manifest['tokens_evaluated'] / 1000)}K", f"{manifest['wall_time_s'] / 60:.1f} min",
                     f"{s['mean_accuracy']:.1f}%", verdict(s), _dip(s), _link(label, folder, base)])
    return _table(["model", "context", "contexts x targets", "tokens", "wall time", "mean accuracy", "verdict",
                   "detectable dip, points", "run folder"], rows)


def _quantized_gap(folder: Path, kind: str) -> str:
    sweep = folder / f"sweep-{kind}"
    return f"{_read(sweep, 'summary.json')['gap']:.1f}" if sweep.is_dir() else "-"


def _by_target(*folders: Path):
    """Each folder's results.csv indexed by target, on the first folder's targets."""
    import pandas as pd

    tables = [pd.read_csv(folder / "results.csv").set_index("target_id") for folder in folders]
    return [table.reindex(tables[0].index) for table in tables]


def _reference_agreement(folder: Path) -> str:
    """The reference sweep of the same weights against llama.cpp's: identical per-residue
    accuracies, or its gap and how many targets' verdicts differ (results.csv, by target)."""
    engine, reference = _read(folder / "sweep", "summary.json"), _read(folder / "sweep-reference", "summary.json")
    if [r["accuracy"] for r in engine["per_residue"]] == [r["accuracy"] for r in reference["per_residue"]]:
        return "identical"
    ours, theirs = _by_target(folder / "sweep", folder / "sweep-reference")
    apart = int((ours["correct"] != theirs["correct"]).sum())
    return f"gap {reference['gap']:.1f}, {apart} target{'s' if apart != 1 else ''} apart"


def agreement_phrase(first: str, second: str) -> str:
    """Two sweeps of one plan, target by target: the flags that differ and the log-probability gap."""
    ours, theirs = _by_target(ROOT / "reports" / first, ROOT / "reports" / second)
    apart, diff = int((ours["correct"] != theirs["correct"]).sum()), (ours["logprob"] - theirs["logprob"]).abs()
    return (f"{apart} of {len(ours)} flags differ, log-probabilities within {diff.max():.1e} nats "
            f"(mean {diff.mean():.1e})")


def trained_table(runs: list[tuple[str, str]], quantized: bool = False, reference: bool = False,
                  logprob: bool = False) -> str:
    """Trained models: held-out accuracy (the training folder's summary.json), then the sweep of
    each (its sweep/ folder): mean (CI), per residue with the worst in bold, gap (CI), p, verdict.
    A model below the training report's 80% bar is marked so: its training report does not read
    its gap as a phase effect, whatever its sweep's verdict. `quantized`: the gaps of its Q8_0 and
    Q4_0 copies' sweeps (sweep-Q8_0/, sweep-Q4_0/) beside; `logprob`: the log-probability test's p."""
    rows = []
    for label, name in runs:
        folder = ROOT / "reports" / "trained" / name
        trained, s = _read(folder, "summary.json"), _read(folder / "sweep", "summary.json")
        accuracies = [row["accuracy"] for row in s["per_residue"]]
        worst = accuracies.index(min(accuracies))
        worst = worst if min(accuracies) < max(accuracies) else None  # no residue is worst when all are equal
        residues = ", ".join(f"**{a:.1f}**" if i == worst else f"{a:.1f}" for i, a in enumerate(accuracies))
        held_out = f"{trained['accuracy']:.1f}" + ("" if trained["readable"] else " (below 80%)")
        rows.append([_link(label, folder / "sweep", ROOT / "reports"), held_out, _mean(s), residues,
                     _gap(s), _p(s["test"]["p_value"]), verdict(s)]
                    + ([_p(s["logprob_test"]["p_value"])] if logprob else []) + ([_reference_agreement(folder)] if reference else [])
                    + ([_quantized_gap(folder, q) for q in ("Q8_0", "Q4_0")] if quantized else []))
    return _table(["model", "held-out %", "sweep mean % (95% CI)", "per residue %", "gap (95% CI)", "p", "verdict"]
                  + (["log-prob p"] if logprob else []) + (["reference sweep"] if reference else []) + (["Q8_0 gap", "Q4_0 gap"] if quantized else []), rows)


# DeepSeek-V4-Flash-Base's published per-residue accuracy (S = 4, residues mod 8; issue 43): residues 3
# and 7, the last token of a block, are the weak ones
PUBLISHED_DEEPSEEK4 = (43.8, 69.5, 66.0, 29.7, 44.9, 69.9, 64.5, 32.8)


def block_end_dip(accuracies: list[float], stride: int = 4) -> float:
    """Mean accuracy at the residues that end a block (r % S == S - 1) minus the mean at the others."""
    ends = [a for r, a in enumerate(accuracies) if r % stride == stride - 1]
    others = [a for r, a in enumerate(accuracies) if r % stride != stride - 1]
    return sum(ends) / len(ends) - sum(others) / len(others)


def _pearson(a: list[float], b: tuple[float, ...]) -> str:
    import numpy as np

    return "-" if np.std(a) == 0 else f"{np.corrcoef(a, b)[0, 1]:.2f}"


def profile_table(runs: list[tuple[str, str, str]]) -> str:
    """Trained models' sweeps at residues mod 8 against the published DeepSeek-V4 profile: each run's
    two worst residues, its block-end dip and the correlation of its profile with the published one,
    the published profile itself in the first row."""
    rows = [["DeepSeek-V4-Flash-Base (published)", "-", "-", ", ".join(f"{a:.1f}" for a in PUBLISHED_DEEPSEEK4),
             f"{max(PUBLISHED_DEEPSEEK4) - min(PUBLISHED_DEEPSEEK4):.1f}", "-", "-", "3, 7",
             f"{block_end_dip(list(PUBLISHED_DEEPSEEK4)):.1f}", "1.00"]]
    for label, name, sweep in runs:
        folder = ROOT / "reports" / "trained" / name
        trained, s = _read(folder, "summary.json"), _read(folder / sweep, "summary.json")
        accuracies = [row["accuracy"] for row in s["per_residue"]]
        worst = sorted(range(len(accuracies)), key=lambda r: (accuracies[r], r))[:2]
        held_out = f"{trained['accuracy']:.1f}" + ("" if trained["readable"] else " (below 80%)")
        rows.append([_link(label, folder / sweep, ROOT / "reports"), held_out, str(min(r["n"] for r in s["per_residue"])),
                     ", ".join(f"{a:.1f}" for a in accuracies),
                     _gap(s), _p(s["test"]["p_value"]), verdict(s), ", ".join(map(str, sorted(worst))),
                     f"{block_end_dip(accuracies):.1f}", _pearson(accuracies, PUBLISHED_DEEPSEEK4)])
    return _table(["model", "held-out %", "targets per residue", "per residue % (mod 8)", "gap (95% CI)", "p", "verdict", "worst two residues",
                   "block-end dip (points)", "r with published"], rows)


def sweep_table(runs: list[tuple[str, str]], periodicity: bool = False) -> str:
    """Sweeps of models not trained here (folders under reports/): targets per residue, mean
    (CI), worst residue, gap (CI), the one-residue dip the run detects, both tests' p, verdict."""
    rows = []
    for label, relative in runs:
        folder = ROOT / "reports" / relative
        s = _read(folder, "summary.json")
        rows.append([_link(label, folder, ROOT / "reports"), str(min(r["n"] for r in s["per_residue"])), _mean(s),
                     f"{s['worst_accuracy']:.1f}", _gap(s)] + ([f"{s['periodicity']:.1f}"] if periodicity else [])
                    + [_dip(s, 0), _p(s["test"]["p_value"]), _p(s["logprob_test"]["p_value"]), verdict(s)])
    return _table(["run", "n per residue", "mean % (95% CI)", "worst residue %", "gap (95% CI)"]
                  + (["periodicity"] if periodicity else [])
                  + ["detectable dip", "p (CMH)", "p (log-prob)", "verdict"], rows)


def calibrated_table(runs: list[tuple[str, str]]) -> str:
    """`--calibrate` runs: each pilot step's accuracy (its config.json), the length chosen, the
    pilot's tokens against the sweep's (manifest.json), then the sweep as its report reads."""
    rows = []
    for model, relative in runs:
        folder = ROOT / "reports" / relative
        config, s = _read(folder, "config.json"), _read(folder, "summary.json")
        steps, manifest = config["calibration"]["steps"], _read(folder, "manifest.json")
        pilot = ", ".join(f"{step['context']}: {100 * step['correct'] / step['targets']:.1f}% of {step['targets']}"
                          for step in steps)
        rows.append([_link(model, folder, ROOT / "reports"), pilot, f"{config['task']} at {config['context']}",
                     f"{100 * config['calibration']['pilot_tokens'] / manifest['tokens_evaluated']:.1f}%",
                     f"{manifest['wall_time_s'] / 60:.1f} min",
                     f"{s['n_targets']} in {s['n_contexts']}", f"{s['mean_accuracy']:.1f}%", _gap(s),
                     _p(s["test"]["p_value"]), verdict(s), _dip(s)])
    return _table(["model", "pilot: context, accuracy of targets", "chosen", "pilot tokens / sweep's", "sweep time", "sweep targets in contexts",
                   "mean", "gap (95% CI)", "p", "verdict", "detectable dip"], rows)


def pilot_phrase(relative: str) -> str:
    """A calibrated run's pilot steps in a sentence (its config.json)."""
    steps = _read(ROOT / "reports" / relative, "config.json")["calibration"]["steps"]
    return (_and([f"{100 * s['correct'] / s['targets']:.1f}" for s in steps]) + "% at "
            + _and([f"{s['context'] // 1024}K" if s["context"] >= 1024 else str(s["context"]) for s in steps])
            + " tokens from " + _and([str(s["targets"]) for s in steps]) + " targets")


def example_phrase() -> str:
    """The default sweep's numbers in the sentences that describe it (its summary and manifest)."""
    folder = ROOT / "reports" / "example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024"
    s, manifest = _read(folder, "summary.json"), _read(folder, "manifest.json")
    return (f"Mean accuracy {s['mean_accuracy']:.1f}%; residues range from {s['worst_accuracy']:.1f}% (residue "
            f"{s['worst_residue']}) to {s['best_accuracy']:.1f}% (residue {s['best_residue']}), a {s['gap']:.1f}-point raw "
            f"gap whose bias-corrected 95% interval is {s['gap_ci'][0]:.1f} to {s['gap_ci'][1]:.1f} points. The "
            f"Cochran-Mantel-Haenszel test stratified by context gives p = {s['test']['p_value']:.2f}, and the same test "
            f"on the answer log-probability p = {s['logprob_test']['p_value']:.2f}: {verdict(s)}, no phase effect larger "
            f"than {s['detectable_dip']:.1f} points (the dip this run detects with 80% power), in a model that has no "
            f"compression to cause one. Targets of one context agree a little (intra-context correlation "
            f"{s['icc']:.3f}, design effect {s['design_effect']:.1f}). It took {manifest['wall_time_s']:.0f} s on "
            f"{manifest['machine']['threads']} threads")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def gaps_phrase(folders: list[str], mean: bool = False) -> str:
    """A sentence's numbers for seeds of one model (folders under reports/trained/, each with a
    sweep/): "[mean M, ...%,] gaps G (CI), ... points, p = P, ..."."""
    summaries = [_read(ROOT / "reports" / "trained" / folder / "sweep", "summary.json") for folder in folders]
    means = "mean " + _and([f"{s['mean_accuracy']:.1f}" for s in summaries]) + "%, " if mean else ""
    plural = "s" if len(summaries) > 1 else ""
    return (f"{means}gap{plural} {_and([_gap(s) for s in summaries])} points, "
            f"p = {_and([_p(s['test']['p_value']) for s in summaries])}")


def residues_phrase(folder: str) -> str:
    """One sweep's numbers in a sentence: each residue's accuracy, the gap, p and the verdict."""
    s = _read(ROOT / "reports" / "trained" / folder / "sweep", "summary.json")
    accuracies = [f"{row['accuracy']:.1f}" for row in s["per_residue"]]
    return (f"{_and(accuracies)}% at residues 0-{len(accuracies) - 1}, gap {_gap(s)} points, "
            f"p = {_p(s['test']['p_value'])}: {verdict(s)}")


def trained_files_table() -> str:
    """README's table of the trained files in tests/data/trained/: each is seed 0 of a study
    folder (the same bytes), shown with that folder's sweep."""
    rows = []
    for file, layout, what, relative in TRAINED_FILES:
        folder = ROOT / "reports" / "trained" / relative
        s = _read(folder, "summary.json")
        rows.append([f"`{file}`", layout, what, f"{s['mean_accuracy']:.1f}%", f"{s['worst_residue']}: {s['worst_accuracy']:.1f}%",
                     _gap(s), _p(s["test"]["p_value"]), _link(verdict(s), folder, ROOT)])
    return _table(["file", "layout", "what it is", "mean", "worst residue", "gap (95% CI)", "p", "verdict"], rows)


def example_sweep_time() -> str:
    manifest = _read(ROOT / "reports" / "example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024", "manifest.json")
    return f"{manifest['wall_time_s'] / 60:.1f} minutes on {manifest['machine']['threads']} threads"


def engine_sweep_times() -> str:
    """The range of the engine study's sweeps through llama.cpp (their manifests)."""
    times = [_read(folder, "manifest.json")["wall_time_s"]
             for folder in sorted((ROOT / "reports" / "trained" / "engine").glob("*/sweep"))]
    return f"{min(times):.0f}-{max(times):.0f} s on one thread ({len(times)} sweeps of the engine study)"


def training_minutes(runs: list[str]) -> str:
    """The range of training times over runs (folders under reports/trained/; their manifests)."""
    minutes = [_read(ROOT / "reports" / "trained" / run, "manifest.json")["wall_time_s"] / 60 for run in runs]
    low, high = f"{min(minutes):.0f}", f"{max(minutes):.0f}"
    return low if low == high else f"{low}-{high}"


def study_hours(study: str) -> str:
    """The wall time of every run folder under reports/trained/<study> (trainings, and the sweeps and
    probes inside them), from their manifests: "T hours, trainings R of them"."""
    hours = {"all": 0.0, "trainings": 0.0}
    for manifest in (ROOT / "reports" / "trained" / study).rglob("manifest.json"):
        seconds = json.loads(manifest.read_text())["wall_time_s"]
        hours["all"] += seconds / 3600
        hours["trainings"] += seconds / 3600 if (manifest.parent / "training.csv").is_file() else 0.0
    return f"{hours['all']:.1f} hours, trainings {hours['trainings']:.1f} of them"


def nested_phase_phrase(relative: str, inner: int) -> str:
    """A large-modulus sweep read against a smaller stride that divides it, by the tool's own reading
    (`kvphase.sweep.nested`, what `kvphase compare` prints): its residues pooled by position mod `inner`,
    and the residues within each phase class, each test stratified by context, statistics spelled out."""
    import pandas as pd

    from kvphase.sweep.nested import read_nested
    from kvphase.sweep.stratified import PERMUTATIONS

    folder = ROOT / "reports" / relative
    config = _read(folder, "config.json")
    reading = read_nested(pd.read_csv(folder / "results.csv"), config["stride"], config["modulus"], inner,
                          config["seed"])
    between, within = reading.between, reading.within
    how = f" from {PERMUTATIONS} permutations" if "permutations" in within.note else ""
    return (f"pooled by position mod {inner} its residues read {_and([f'{a:.1f}' for a in reading.phase_accuracy])}% "
            f"(chi-square {between.statistic:.1f}, df {between.dof}, p = {_p(between.p_value)}); within each phase "
            f"mod {inner} they differ {'no more than chance' if within.p_value >= 0.05 else 'beyond chance'} "
            f"(chi-square {within.statistic:.1f}, df {within.dof}, p = {_p(within.p_value)}{how}; a one-residue dip "
            f"of {reading.within_dip:.1f} points within a phase is what it detects 80% of the time)")


def training_times() -> str:
    studies = [[f"gated-seed{k}" for k in range(3)], [f"engine/csa-disjoint-seed{k}" for k in range(5)],
               [f"engine/glm-kpool-seed{k}" for k in range(3)]]
    return " / ".join(training_minutes(runs) for runs in studies) + " minutes on one core each"


TRAINED_FILES = [
    ("csa-disjoint.gguf", "`deepseek4`", "DeepSeek-V4's compressor, each entry pooling its own 4 tokens", "engine/csa-disjoint-seed0/sweep"),
    ("csa-dense.gguf", "`deepseek4`", "its dense twin: a window over every token, trained with the induction hint", "engine/csa-dense-seed0/sweep"),
    ("csa-top4.gguf", "`deepseek4`", "DeepSeek-V4's overlapped compressor, its lightning indexer reading the top 4 entries, "
     "128-token context (residues mod 8)", "ds4-ablation/ctx128-top4-seed0/sweep"),
    ("glm-dense.gguf", "`glm5-next`", "GLM-5.3's layout, a top-k that keeps every pool: the dense twin", "engine/glm-dense-seed0/sweep"),
    ("gated.gguf", "gpt2 + gate tensors", "kvphase's first trained model (numpy reference only)", "gated-seed0/sweep"),
    ("dense.gguf", "gpt2", "its control, which never learned the retrieval", "dense-seed0/sweep")]


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

POST_HOC_FIXES = [("blocktopk S=4", "reference/blocktopk-S4"),
                  ("+ offsets staggered across layers", "reference/blocktopk-S4-stagger-layer"),
                  ("+ offsets staggered across KV heads", "reference/blocktopk-S4-stagger-head"),
                  ("+ offsets randomized per context", "reference/blocktopk-S4-randomize")]

CAPACITY = [("2 heads (< S), offsets 0, 1", "gated-stagger-head-h2"), ("4 heads (= S), offsets 0-3", "gated-stagger-head"),
            ("8 heads (> S), offsets 0-3 twice", "gated-stagger-head-h8"),
            ("8 heads, d_model 128, offsets 0-3 twice", "gated-stagger-head-h8-d128"), ("4 heads, no stagger (`gated`)", "gated")]


def _seeds(label: str, name: str) -> list[tuple[str, str]]:
    return [(f"{label} seed {seed}", f"{name}-seed{seed}") for seed in range(3)]


class Cell(NamedTuple):
    """One cell of issue 43's ablation (scripts/deepseek4_ablation.sh, which names the cells): its
    seeds' run folders are reports/trained/ds4-ablation/NAME-seedK."""
    name: str
    label: str
    seeds: tuple[int, ...]
    family: str  # the group a gaps phrase reads: csa (ratio-4 layers), hca, faithful (hca and top-k), depth, warm-up, glm

    def runs(self) -> list[str]:
        return [f"ds4-ablation/{self.name}-seed{k}" for k in self.seeds]


# from the defaults outwards (the table's rows and the figure's panels)
DS4_CELLS = [Cell("ctx64", "64 tokens", (0, 1, 2), "csa"),
             Cell("ctx64-copy", "64 tokens, 4000 steps, induction warm-up", (0, 1, 2), "warm-up"),
             Cell("ctx64-L4", "64 tokens, 4 layers, 4000 steps", (0, 1, 2), "depth"),
             Cell("ctx64-L4-copy", "64 tokens, 4 layers, 4000 steps, induction warm-up", (0, 1, 2), "depth"),
             Cell("ctx128", "128 tokens", (0, 1, 2), "csa"),
             Cell("ctx128-top4", "128 tokens, top-4", (0, 1, 2, 3, 4, 5), "csa"),
             Cell("ctx128-L4", "128 tokens, 4 layers", (0, 1, 2), "depth"),
             Cell("ctx128-L4-cont", "128 tokens, 4 layers, 3000 steps more", (0, 1), "depth"),
             Cell("ctx128-L4-copy", "128 tokens, 4 layers, induction warm-up", (0, 1), "depth"),
             Cell("ctx256", "256 tokens", (0,), "csa"),
             Cell("ctx256-long", "256 tokens, 3000 steps", (0, 2), "csa"),
             Cell("ctx256-from128", "256 tokens, extended from 128", (0, 1, 2), "csa"),
             Cell("ctx512-from256", "512 tokens, extended from 256", (0, 1, 2), "csa"),
             Cell("ctx256-hca-long", "256 tokens, ratios 4,128, 3000 steps", (0, 1, 2), "hca"),
             Cell("ctx256-hca-cont", "256 tokens, ratios 4,128, 3000 steps more", (0, 1), "hca"),
             Cell("ctx512-hca-from256", "512 tokens, ratios 4,128, extended from 256", (0,), "hca"),
             Cell("ctx768-hca-from512", "768 tokens, ratios 4,128, extended from 512", (0,), "hca"),
             Cell("ctx256-top4-hca", "256 tokens, top-4, ratios 4,128", (0,), "faithful"),
             Cell("ctx256-top4-hca3", "256 tokens, top-4, ratios 4,128,4", (0,), "faithful"),
             Cell("ctx256-top4-hca-long", "256 tokens, top-4, ratios 4,128, 3000 steps", (0, 1, 2), "faithful"),
             Cell("ctx256-top4-from-hca", "256 tokens, top-4 added to ratios 4,128 after 3000 steps", (0, 1, 2),
                  "faithful"),
             Cell("ctx512-top4-hca-from256", "512 tokens, top-4, ratios 4,128, extended from 256", (0, 1, 2), "faithful"),
             Cell("glm-ctx64-top4", "GLM-5.3 k-pool, 64 tokens, top-4 of 16 pools", (0, 1, 2), "glm"),
             Cell("glm-ctx128-top4", "GLM-5.3 k-pool, 128 tokens, top-4 of 32 pools", (0,), "glm"),
             Cell("glm-ctx128-top4-from64", "GLM-5.3 k-pool, 128 tokens, top-4 of 32 pools, extended from 64", (0, 1, 2),
                  "glm")]


DS4 = {cell.name: cell for cell in DS4_CELLS}


def ds4_runs(family: str) -> list[str]:
    """The run folders of every cell of one family."""
    return [run for cell in DS4_CELLS if cell.family == family for run in cell.runs()]


def heldout_phrase(runs: list[str]) -> str:
    """Each run's held-out accuracy at the end of its training (its summary.json): "A, B and C%"."""
    return _and([f"{_read(ROOT / 'reports' / 'trained' / run, 'summary.json')['accuracy']:.1f}" for run in runs]) + "%"


def learned_by_step(runs: list[str], bar: float = 80.0) -> str:
    """The first held-out evaluation (the curve in summary.json) at which each run reached `bar`%:
    "steps A, B and C"."""
    steps = []
    for run in runs:
        curve = _read(ROOT / "reports" / "trained" / run, "summary.json")["curve"]
        steps.append(next((str(point["step"]) for point in curve if 100 * point["accuracy"] >= bar), "never"))
    return "step" + ("s " if len(steps) > 1 else " ") + _and(steps)


def learned_sweeps(runs: list[str]) -> list[dict]:
    """The sweep summaries of the runs whose training reached the 80% bar (`readable`), in order."""
    trained = [ROOT / "reports" / "trained" / run for run in runs]
    return [_read(folder / "sweep", "summary.json") for folder in trained if _read(folder, "summary.json")["readable"]]


def learned_verdicts(runs: list[str]) -> str:
    """Each run's held-out accuracy, then the verdicts of the sweeps of those that reached the 80% bar,
    with the one-residue dip each detects 80% of the time: "held-out A, B and C%; of the 2 that
    learned, the sweeps read no effect at this power (a dip of D points detectable) and ..."."""
    sweeps = learned_sweeps(runs)
    read = _and([f"{verdict(s)} (a dip of {_dip(s)} points detectable)" for s in sweeps])
    return (f"held-out {heldout_phrase(runs)}; of the {len(sweeps)} that learned, the sweep"
            f"{'s read' if len(sweeps) > 1 else ' reads'} {read}")


def sweep_against_training(run: str) -> str:
    """A run's mean accuracy through its sweep beside its training's held-out accuracy:
    "M% mean in the sweep, H% held-out in training"."""
    folder = ROOT / "reports" / "trained" / run
    return (f"{_read(folder / 'sweep', 'summary.json')['mean_accuracy']:.1f}% mean in the sweep, "
            f"{_read(folder, 'summary.json')['accuracy']:.1f}% held-out in training")


def learned_gaps_by_context(runs: list[str]) -> str:
    """The runs whose training reached the 80% bar, grouped by trained context: "at 128 tokens
    (n of m runs learned) gaps G (CI), ... points, p <= P; at 256 tokens ..."."""
    by_context: dict[int, list[str]] = {}
    for run in runs:
        by_context.setdefault(_read(ROOT / "reports" / "trained" / run, "config.json")["context"], []).append(run)
    parts = []
    for context, group in sorted(by_context.items()):
        summaries = learned_sweeps(group)
        if not summaries:
            continue
        worst_p = max(s["test"]["p_value"] for s in summaries)
        parts.append(f"at {context} tokens ({len(summaries)} of {len(group)} runs learned) "
                     f"gap{'s' if len(summaries) > 1 else ''} "
                     f"{_and([_gap(s) for s in summaries])} points, p <= {_p(worst_p)}")
    return "; ".join(parts)


DS4_ABLATION = [(f"{cell.label}, seed {k}", run, "sweep")
                for cell in DS4_CELLS for k, run in zip(cell.seeds, cell.runs())] + [
    ("csa, 64 tokens (engine study seed 0)", "engine/csa-seed0", "sweep-mod8"),
    ("csa-disjoint, 64 tokens (engine study seed 0)", "engine/csa-disjoint-seed0", "sweep-mod8")]
SEEDS_FIXED = [(f"csa-disjoint-seed{k}-retrained", f"csa-disjoint seed {k}, retrained") for k in (2, 5, 6)]

OFFSETS4 = [("plain", "none"), ("offsets4-mean", "`--offsets 4`")]  # (fix folder, as the tables name it)

TABLES: dict[str, Callable[[], str]] = {
    "fixes-seeds": lambda: fixes_table([("csa-disjoint-seed0", "csa-disjoint seed 0 (tests/data)"), *SEEDS_FIXED],
                                       OFFSETS4),
    "ds4-ablation": lambda: profile_table(DS4_ABLATION),
    "ds4-minutes-64": lambda: training_minutes(DS4["ctx64"].runs()),
    "ds4-minutes-128": lambda: training_minutes(DS4["ctx128"].runs() + DS4["ctx128-top4"].runs()),
    "ds4-minutes-256": lambda: training_minutes(DS4["ctx256-long"].runs() + DS4["ctx256-hca-long"].runs()[:1]),
    "ds4-minutes-from128": lambda: training_minutes(DS4["ctx256-from128"].runs()),
    "ds4-minutes-from256": lambda: training_minutes(DS4["ctx512-from256"].runs()),
    "glm-minutes-128": lambda: training_minutes(DS4["glm-ctx128-top4"].runs()),
    "glm-64-learned": lambda: learned_verdicts(DS4["glm-ctx64-top4"].runs()),
    "glm-128-learned": lambda: learned_verdicts(DS4["glm-ctx128-top4-from64"].runs()),
    "ds4-minutes-hca-cont": lambda: training_minutes(DS4["ctx256-hca-cont"].runs()),
    "ds4-minutes-hca-ext": lambda: training_minutes(DS4["ctx512-hca-from256"].runs() + DS4["ctx768-hca-from512"].runs()),
    "glm-minutes-from64": lambda: training_minutes(DS4["glm-ctx64-top4"].runs()
                                                    + DS4["glm-ctx128-top4-from64"].runs()),
    "ds4-gaps": lambda: learned_gaps_by_context(ds4_runs("csa")),
    "ds4-hours": lambda: study_hours("ds4-ablation"),
    "ds4-stride128-nested": lambda: nested_phase_phrase("trained/ds4-ablation/ctx768-hca-from512-seed0/strides/"
                                                        "ctx768-hca-from512-seed0-pairs-S128-L768", 4),
    "ds4-hca-gaps": lambda: learned_gaps_by_context(ds4_runs("hca")),
    "ds4-depth-2-learned": lambda: learned_by_step(DS4["ctx128"].runs()),
    "ds4-depth-4-heldout": lambda: heldout_phrase(DS4["ctx128-L4"].runs()),
    "ds4-depth-4-cont-heldout": lambda: heldout_phrase(DS4["ctx128-L4-cont"].runs()),
    "ds4-depth-64-heldout": lambda: heldout_phrase(DS4["ctx64-L4"].runs()),
    "ds4-depth-128-copy-heldout": lambda: heldout_phrase(DS4["ctx128-L4-copy"].runs()),
    "ds4-depth-64-copy-gaps": lambda: learned_gaps_by_context(DS4["ctx64-L4-copy"].runs()),
    "ds4-depth-64-copy-heldout": lambda: heldout_phrase(DS4["ctx64-L4-copy"].runs()),
    "ds4-copy-64-gaps": lambda: learned_gaps_by_context(DS4["ctx64-copy"].runs()),
    "ds4-64-gaps": lambda: learned_gaps_by_context(DS4["ctx64"].runs()),
    "ds4-copy-64-seed0": lambda: sweep_against_training(DS4["ctx64-copy"].runs()[0]),
    "ds4-faithful-gaps": lambda: learned_gaps_by_context(ds4_runs("faithful")),
    "ds4-strides": lambda: sweep_table([(f"stride {s}, residues mod {m}", f"trained/ds4-ablation/ctx768-hca-from512-seed0/"
                                         f"strides/ctx768-hca-from512-seed0-pairs-S{s}-L768") for s, m in ((4, 8), (128, 128))]),
    "fixes-ds4": lambda: fixes_table([(f"ds4-ctx128-top4-seed{k}", f"128 tokens, top-4, seed {k}") for k in (0, 2, 4, 5)]
                                     + [("ds4-ctx128-top4-seed0-Q4_0", "128 tokens, top-4, seed 0, Q4_0")],
                                     OFFSETS4),
    "fixes-ds4-faithful": lambda: fixes_table(
        [(f"ds4-ctx256-top4-from-hca-seed{k}", f"256 tokens, ratios 4,128, top-4, seed {k}") for k in (0, 1, 2)]
        + [("ds4-ctx256-top4-from-hca-seed1-Q4_0", "256 tokens, ratios 4,128, top-4, seed 1, Q4_0")],
        OFFSETS4),
    "fixes-ds4-hca": lambda: fixes_table([("ds4-ctx256-hca-long-seed1", "256 tokens, ratios 4,128, seed 1"),
                                          ("ds4-ctx256-hca-long-seed2", "256 tokens, ratios 4,128, seed 2"),
                                          ("ds4-ctx256-hca-cont-seed0", "256 tokens, ratios 4,128, 6000 steps, seed 0"),
                                          ("ds4-ctx256-hca-long-seed1-Q4_0", "256 tokens, ratios 4,128, seed 1, Q4_0")],
                                         OFFSETS4),
    "fixes-csa": lambda: fixes_table([("csa-seed0", "csa seed 0 (committed)"),
                                      *[(f"csa-seed{k}-retrained", f"csa seed {k}, retrained") for k in (1, 2, 3)],
                                      ("csa-disjoint-seed0-Q4_0", "csa-disjoint seed 0, Q4_0"),
                                      ("csa-seed0-Q4_0", "csa seed 0, Q4_0")],
                                     OFFSETS4),
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
    "long-context": lambda: long_context_table(
        [("SmolLM2-135M Q4_1", "reports/example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024", "example"), LONG_CONTEXT[0],
         ("Gemma 3 270M Q4_K_M", "reports/calibrated/gemma-3-270m-q4_k_m-records-S4-calibrated", "calibrated"),
         LONG_CONTEXT[1]]),
    "long-context-study": lambda: long_context_table(LONG_CONTEXT, ROOT / "reports"),
    "calibrated": lambda: calibrated_table([
        ("SmolLM2-135M", "calibrated/SmolLM2-135M-Instruct.Q4_1-records-S4-calibrated"),
        ("Gemma 3 270M", "calibrated/gemma-3-270m-q4_k_m-records-S4-calibrated")]),
    "post-hoc": lambda: sweep_table([("dense (control)", "reference/dense")] + [
        (f"{design} S={stride}", f"reference/{design}-S{stride}") for design in ("blocktopk", "kpool", "meanpool")
        for stride in (4, 8)]),
    "post-hoc-fixes": lambda: sweep_table(POST_HOC_FIXES),
    "post-hoc-fixes-n64": lambda: sweep_table([(label, f"{folder}-n64") for label, folder in POST_HOC_FIXES], True),
    "rolling": lambda: trained_table([(f"{design} seed {seed}", f"{design}-seed{seed}")
                                      for design in ("rolling", "gated", "dense") for seed in range(3)], logprob=True),
    "meanpool-gated-start": lambda: trained_table(_seeds("meanpool, gated start", "meanpool-gated-start"), logprob=True),
    "glm-msa": lambda: trained_table(_seeds("glm-msa", "glm-msa"), logprob=True),
    "cowa": lambda: trained_table(_seeds("cowa", "cowa") + [("cowa --stagger head, seed 0", "cowa-stagger-head-seed0"),
                                                            ("cowa --offsets random, seed 0", "cowa-offsets-random-seed0")],
                                  logprob=True),
    "capacity": lambda: trained_table([(f"{heads}, seed {seed}", f"{name}-seed{seed}") for heads, name in CAPACITY
                                       for seed in range(3)]),
    "trained-files": trained_files_table,
    "gaps-gated": lambda: gaps_phrase([f"gated-seed{k}" for k in range(3)]),
    "gaps-dense": lambda: gaps_phrase([f"dense-seed{k}" for k in range(3)]),
    "gaps-offsets-random": lambda: gaps_phrase([f"gated-offsets-random-seed{k}" for k in range(3)]),
    "gaps-stagger-head": lambda: gaps_phrase([f"gated-stagger-head-seed{k}" for k in range(3)]),
    "gaps-stagger-layer": lambda: gaps_phrase([f"gated-stagger-layer-seed{k}" for k in range(3)]),
    "csa-disjoint-seed0": lambda: residues_phrase("engine/csa-disjoint-seed0"),
    "csa-seed0": lambda: residues_phrase("engine/csa-seed0"),
    "glm-kpool-seed0": lambda: residues_phrase("engine/glm-kpool-seed0"),
    "glm-kpool-seed1": lambda: gaps_phrase(["engine/glm-kpool-seed1"]),
    "csa-dense-seeds": lambda: gaps_phrase([f"engine/csa-dense-seed{k}" for k in range(3)], mean=True),
    "glm-msa-seeds": lambda: gaps_phrase([f"glm-msa-seed{k}" for k in range(3)], mean=True),
    "example-sweep-time": example_sweep_time,
    "example": example_phrase,
    "gemma-pilot": lambda: pilot_phrase("calibrated/gemma-3-270m-q4_k_m-records-S4-calibrated"),
    "engine-sweep-times": engine_sweep_times,
    "training-times": training_times,
    "glm-training-minutes": lambda: training_minutes([f"engine/glm-kpool-seed{k}" for k in range(3)]),
    "glm-msa-training-minutes": lambda: training_minutes([f"glm-msa-seed{k}" for k in range(3)]),
    "rpc-agreement": lambda: agreement_phrase("servers/SmolLM2-in-process", "servers/SmolLM2-rpc-split"),
    "gaps-jitter": lambda: gaps_phrase([f"gated-offsets-jitter-seed{k}" for k in range(3)]),
    "conform-engine-bugs": lambda: conform_table("engine-bugs"),
    "conform-time": lambda: conform_time("engine-bugs/unpatched-llama.cpp"),
}


def conform_table(study: str) -> str:
    """`kvphase conform` against each llama.cpp build of a study (reports/conform/<study>/<build>-<backend>/,
    their conform.json): one row per build and model, the verdict and the reason as the report words it."""
    rows = []
    base = ROOT / "reports" / "conform" / study
    # a run of every model (in process), or one per model (llama-server: each its own server and folder)
    for folder in sorted(base.rglob("conform.json"), key=lambda f: (not f.parent.relative_to(base).parts[0].startswith(
            "unpatched"), f.parent.relative_to(base).parts[0].endswith("server"), f.parent.relative_to(base).parts[0])):
        run = json.loads(folder.read_text())
        for model in run["models"]:
            check = model["check"] or {}
            link = os.path.relpath(folder.parent / "report.md", ROOT / "docs")  # the table's page is in docs/
            rows.append([f"[{folder.parent.relative_to(base).parts[0]}]({link})", model["name"], model["status"],
                         str(check.get("flags_differing", "")), f"{check.get('max_logprob_difference', 0):.3g}",
                         model["reason"] or "-"])
    return _table(["build and backend", "model", "verdict", "flags differing", "largest log-prob difference", "why"],
                  rows)


def conform_time(relative: str) -> str:
    """A conform run's whole time and its models' scoring (its conform.json)."""
    run = _read(ROOT / "reports" / "conform" / relative, "conform.json")
    scoring = sum(model["seconds"] for model in run["models"])
    return f"{run['wall_time_s']:.0f} s for {len(run['models'])} models ({scoring:.0f} s of it scoring)"


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def regenerate(text: str) -> str:
    """`text` with every block's body rebuilt; KeyError for a block no table builds. A block
    whose marker opens a line is a table, indented as its marker (a table inside a list item);
    one inside a sentence is a phrase."""
    def rebuild(m: re.Match) -> str:
        body = TABLES[m.group("name")]()
        if not m.group("newline"):
            return m.group("open") + body + m.group("close")
        indent = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
        indent = indent if not indent.strip() else ""
        body = "".join(indent + line if line.strip() else line for line in body.splitlines(True))
        return m.group("open") + body + indent + m.group("close").lstrip(" ")
    return BLOCK.sub(rebuild, text)


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
