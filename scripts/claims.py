"""Tables the documents publish, generated from their run folders (issue 41: claims as code).

A document holds a generated table between two markers:

    <!-- claims:NAME -->
    ...what TABLES[NAME] builds from the folders it names...
    <!-- /claims:NAME -->

`python scripts/claims.py` rewrites every such block in README.md, docs/, reports/README.md (the index of
the studies) and the study pages beside it (reports/study-*.md), and, run without documents, the pages a
study script derives from run folders (DERIVED: reports/trained/fixes/fixes.md, reports/trained/study.md);
`--check` only compares (exit 1 naming each block that differs), with every sweep's statistics recomputed from
its results.csv rather than read from summary.json; tests/project/test_claims.py runs the check. Every other
page that prints a result is written whole by a tool (`written_by`: a run folder's command, or a MEASURED
script), and the test fails on a page on neither list (`uncovered_pages`). Every number in a block is read from
a summary.json (kept at full precision), config.json or manifest.json and printed rounded once
(`kvphase.statistics.printed.fixed`, as report.md prints it), and
each row's verdict is the report's own class (`Summary.verdict`, printed as it is: no list of
verdicts is kept here). Prose around a block is written by hand and holds no measured number, no
verdict word and no retired method word of its own, no count in words of classes or of what runs held, no
absence written as absence, and no "(measured)" or "... has the table" that points at nothing (`hand_numbers`,
`verdict_words`, `run_words`, tested in tests/project/test_claims.py); `--audit` prints the sentences outside
blocks that name a run folder, for a
reviewer to read against it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
# README, the manuals, the reports index and its study pages (reports/study-*.md, beside the run folders their
# tables link to)
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "reports").glob("*.md")), *sorted((ROOT / "docs").rglob("*.md"))]
# the documents written by hand (reports/ also holds reports a script writes, e.g. reference-agreement.md)
HAND_WRITTEN = [d for d in DOCUMENTS if d.parent != ROOT / "reports" or d.name == "README.md" or d.name.startswith("study-")]
BLOCK = re.compile(r"(?P<open><!-- claims:(?P<name>[\w-]+) -->(?P<newline>\n?))(?P<body>.*?)"
                   r"(?P<close>[ ]*<!-- /claims:(?P=name) -->)", re.S)
FIXES = ROOT / "reports" / "trained" / "fixes"


def fixed(value: float, digits: int = 1) -> str:
    """A number as every page prints it, rounded once (`kvphase.statistics.printed.fixed`)."""
    from kvphase.statistics.printed import fixed as printed

    return printed(value, digits)


RECOMPUTE = False  # `--check`: every sweep's statistics recomputed from its results.csv, none read from summary.json


def _read(folder: Path, name: str) -> dict:
    """A folder's JSON file; a sweep's summary.json with its accuracies exact (`exact_accuracies`), or under
    RECOMPUTE all of it as `kvphase report` computes it from the folder's config.json and results.csv."""
    data = json.loads((folder / name).read_text())
    if name != "summary.json" or "per_residue" not in data:
        return data
    return exact_accuracies({**data, **recomputed(Path(folder).resolve())} if RECOMPUTE else data)


@functools.lru_cache(maxsize=None)
def recomputed(folder: Path) -> dict:
    """A sweep folder's summary recomputed from its rows (`sweep.report.run_summary`), as summary.json holds it."""
    from kvphase.sweep.report import run_summary
    from kvphase.sweep.run import load_manifest, load_plan, load_results

    return run_summary(load_plan(folder), load_results(folder), load_manifest(folder)).to_json()


def exact_accuracies(summary: dict) -> dict:
    """A sweep summary whose residue accuracies, mean, worst, best and gap are recomputed unrounded from each
    residue's counts (correct of n): a number printed to one decimal is rounded once, not from two decimals."""
    from kvphase.sweep.analysis import exact_accuracies as exact

    per_residue = [{**row, "accuracy": 100 * row["correct"] / row["n"]} for row in summary["per_residue"]]
    found = exact(per_residue)
    return {**summary, "per_residue": per_residue, "mean_accuracy": found["mean"], "worst_accuracy": found["worst"],
            "best_accuracy": found["best"], "gap": found["gap"]}


def verdict(summary: dict) -> str:
    """The report's class, from the summary's numbers (the rule of `Summary.verdict`)."""
    from kvphase.sweep.analysis import Summary

    return Summary.from_json(summary).verdict


def _mean(summary: dict) -> str:
    """Mean accuracy with its interval (summaries written before the interval have none)."""
    ci = summary.get("mean_ci")
    return f"{fixed(summary['mean_accuracy'])}" + (f" ({fixed(ci[0])}-{fixed(ci[1])})" if ci else "")


def _p(value: float) -> str:
    return f"{value:.2g}"


def _gap(summary: dict) -> str:
    return f"{fixed(summary['gap'])} ({fixed(summary['gap_ci'][0])}-{fixed(summary['gap_ci'][1])})"


def _link(label: str, folder: Path, base: Path) -> str:
    return f"[{label}]({folder.relative_to(base)}/report.md)"


def _dip(summary: dict, digits: int = 1) -> str:
    """The one-residue dip the run detects with 80% power, "-" when none can be computed."""
    return "-" if summary["detectable_dip"] is None else f"{summary['detectable_dip']:.{digits}f}"


def _markdown_rows(page: Path) -> list[list[str]]:
    """The cells of every table row of a markdown page (header and separator rows included), stripped."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("|")]


def _markdown_rows_of(text: str) -> list[list[str]]:
    """The cells of the first table of markdown `text`, its header and separator rows included."""
    rows, lines = [], text.splitlines()
    for line in lines:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows and line.strip():
            break
    return rows


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
                         f"{fixed(s['mean_accuracy'])} ({fixed(s['mean_ci'][0])}-{fixed(s['mean_ci'][1])})",
                         _gap(s), _p(s["test"]["p_value"]), verdict(s), fixed(tokens / plain, 2)])
    return _table(["model", "fix", "mean % (95% CI)", "gap, points (95% CI)", "p", "verdict", "tokens x plain"], rows)


FIX_NAMES = [("plain", "none"), ("offsets2-mean", "`--offsets 2`"), ("offsets4-mean", "`--offsets 4`"),
             ("offsets4-max", "`--offsets 4 --combine max`"), ("random-offset", "`--random-offset`")]


CALIBRATED = [("SmolLM2-135M", "calibrated/SmolLM2-135M-Instruct.Q4_1-records-S4-calibrated"),
              ("Gemma 3 270M", "calibrated/gemma-3-270m-q4_k_m-records-S4-calibrated")]
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
                     f"{round(manifest['tokens_evaluated'] / 1000)}K", f"{fixed(manifest['wall_time_s'] / 60)} min",
                     f"{fixed(s['mean_accuracy'])}%", verdict(s), _dip(s), _link(label, folder, base)])
    return _table(["model", "context", "contexts x targets", "tokens", "wall time", "mean accuracy", "verdict",
                   "detectable dip, points", "run folder"], rows)


def _quantized_gap(folder: Path, kind: str) -> str:
    sweep = folder / f"sweep-{kind}"
    return f"{fixed(_read(sweep, 'summary.json')['gap'])}" if sweep.is_dir() else "-"


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
    return f"gap {fixed(reference['gap'])}, {apart} target{'s' if apart != 1 else ''} apart"


def reference_agreements(runs: list[tuple[str, str]]) -> str:
    """Trained runs' reference sweeps against llama.cpp's (as `_reference_agreement` reads each): "identical
    per-residue accuracies at N of M files; LABEL: gap G, n target apart; ..."."""
    readings = [(label, _reference_agreement(ROOT / "reports" / "trained" / run)) for label, run in runs]
    apart = [f"{label}: {reading}" for label, reading in readings if reading != "identical"]
    return "; ".join([f"identical per-residue accuracies at {len(readings) - len(apart)} of {len(readings)} files"] + apart)


def agreement_phrase(first: str, second: str) -> str:
    """Two sweeps of one plan, target by target: the flags that differ and the log-probability gap."""
    ours, theirs = _by_target(ROOT / "reports" / first, ROOT / "reports" / second)
    apart, diff = int((ours["correct"] != theirs["correct"]).sum()), (ours["logprob"] - theirs["logprob"]).abs()
    return (f"{apart} of {len(ours)} flags differ, log-probabilities within {diff.max():.1e} nats "
            f"(mean {diff.mean():.1e})")


REFERENCE_AGREEMENT = ROOT / "reports" / "reference-agreement.md"  # written by scripts/reference_agreement.py


def agreement_row(comparison: str) -> str:
    """The result of one comparison of reports/reference-agreement.md (its table's row whose name matches the
    regular expression `comparison` whole), as the report words it."""
    return next(result for label, result in _markdown_rows(REFERENCE_AGREEMENT) if re.fullmatch(comparison, label))


def agreement_clear_share() -> str:
    """The share of tokens on which llama.cpp's best token leads clearly (reports/reference-agreement.md)."""
    return re.search(r"on the (\d+%) of tokens where", REFERENCE_AGREEMENT.read_text()).group(1)


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
        residues = ", ".join(f"**{fixed(a)}**" if i == worst else fixed(a) for i, a in enumerate(accuracies))
        held_out = f"{fixed(trained['accuracy'])}" + ("" if trained["readable"] else " (below 80%)")
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

    return "-" if np.std(a) == 0 else fixed(np.corrcoef(a, b)[0, 1], 2)


def gap_of(run: str) -> str:
    """A trained run's sweep gap with its interval (reports/trained/RUN/sweep): "G (CI) points"."""
    return _gap(_read(ROOT / "reports" / "trained" / run / "sweep", "summary.json")) + " points"


def learned_gap_span(runs: list[str], context: int) -> str:
    """The range of the gaps of the runs trained at `context` tokens that reached the 80% bar: "A to B points"."""
    at = [run for run in runs if _read(ROOT / "reports" / "trained" / run, "config.json")["context"] == context]
    return _span([s["gap"] for s in learned_sweeps(at)])


def profile_stats(runs: list[str]) -> str:
    """Runs' sweeps at residues mod 8 against the published profile (as `profile_table` reads them): "block-end
    dips of A to B points, r with the published profile C-D"."""
    profiles = [[row["accuracy"] for row in _read(ROOT / "reports" / "trained" / run / "sweep", "summary.json")["per_residue"]]
                for run in runs]
    dips = [block_end_dip(profile) for profile in profiles]
    r = [_pearson(profile, PUBLISHED_DEEPSEEK4) for profile in profiles]
    return f"block-end dips of {_span(dips)}, r with the published profile {min(r)}-{max(r)}"


def published_phrase() -> str:
    """The published DeepSeek-V4 profile's own gap and block-end dip: "the published gap of G points or its block-end dip of D"."""
    return (f"the published gap of {fixed(max(PUBLISHED_DEEPSEEK4) - min(PUBLISHED_DEEPSEEK4))} points or its block-end dip "
            f"of {fixed(block_end_dip(list(PUBLISHED_DEEPSEEK4)))}")


def profile_table(runs: list[tuple[str, str, str]]) -> str:
    """Trained models' sweeps at residues mod 8 against the published DeepSeek-V4 profile: each run's
    two worst residues, its block-end dip and the correlation of its profile with the published one,
    the published profile itself in the first row."""
    moduli = sorted({_read(ROOT / "reports" / "trained" / name / sweep, "config.json")["modulus"] for _, name, sweep in runs})
    rows = [["DeepSeek-V4-Flash-Base (published)", "-", "-", ", ".join(fixed(a) for a in PUBLISHED_DEEPSEEK4),
             fixed(max(PUBLISHED_DEEPSEEK4) - min(PUBLISHED_DEEPSEEK4)), "-", "-", "3, 7",
             fixed(block_end_dip(list(PUBLISHED_DEEPSEEK4))), "1.00"]]
    for label, name, sweep in runs:
        folder = ROOT / "reports" / "trained" / name
        trained, s = _read(folder, "summary.json"), _read(folder / sweep, "summary.json")
        accuracies = [row["accuracy"] for row in s["per_residue"]]
        worst = sorted(range(len(accuracies)), key=lambda r: (accuracies[r], r))[:2]
        held_out = f"{fixed(trained['accuracy'])}" + ("" if trained["readable"] else " (below 80%)")
        rows.append([_link(label, folder / sweep, ROOT / "reports"), held_out, str(min(r["n"] for r in s["per_residue"])),
                     ", ".join(fixed(a) for a in accuracies),
                     _gap(s), _p(s["test"]["p_value"]), verdict(s), ", ".join(map(str, sorted(worst))),
                     fixed(block_end_dip(accuracies)), _pearson(accuracies, PUBLISHED_DEEPSEEK4)])
    return _table(["model", "held-out %", "targets per residue", f"per residue % (mod {' or '.join(map(str, moduli))})",
                   "gap (95% CI)", "p", "verdict", "worst two residues",
                   "block-end dip (points)", "r with published"], rows)


def sweep_table(runs: list[tuple[str, str]], periodicity: bool = False) -> str:
    """Sweeps of models not trained here (folders under reports/): targets per residue, mean
    (CI), worst residue, gap (CI), the one-residue dip the run detects, both tests' p, verdict."""
    rows = []
    for label, relative in runs:
        folder = ROOT / "reports" / relative
        s = _read(folder, "summary.json")
        rows.append([_link(label, folder, ROOT / "reports"), str(min(r["n"] for r in s["per_residue"])), _mean(s),
                     f"{fixed(s['worst_accuracy'])}", _gap(s)] + ([f"{fixed(s['periodicity'])}"] if periodicity else [])
                    + [_dip(s, 0), _p(s["test"]["p_value"]), _p(s["logprob_test"]["p_value"]), verdict(s)])
    return _table(["run", "n per residue", "mean % (95% CI)", "worst residue %", "gap (95% CI)"]
                  + (["periodicity"] if periodicity else [])
                  + ["detectable dip", "p (CMH)", "p (log-prob)", "verdict"], rows)


def stride_label(relative: str) -> str:
    """A sweep's stride and modulus as its config.json gives them: "stride S, residues mod M"."""
    config = _read(ROOT / "reports" / relative, "config.json")
    return f"stride {config['stride']}, residues mod {config['modulus']}"


def calibrated_table(runs: list[tuple[str, str]]) -> str:
    """`--calibrate` runs: each pilot step's accuracy (its config.json), the length chosen, the
    pilot's tokens against the sweep's (manifest.json), then the sweep as its report reads."""
    rows = []
    for model, relative in runs:
        folder = ROOT / "reports" / relative
        config, s = _read(folder, "config.json"), _read(folder, "summary.json")
        steps, manifest = config["calibration"]["steps"], _read(folder, "manifest.json")
        pilot = ", ".join(f"{step['context']}: {fixed(100 * step['correct'] / step['targets'])}% of {step['targets']}"
                          for step in steps)
        rows.append([_link(model, folder, ROOT / "reports"), pilot, f"{config['task']} at {config['context']}",
                     f"{fixed(100 * config['calibration']['pilot_tokens'] / manifest['tokens_evaluated'])}%",
                     f"{fixed(manifest['wall_time_s'] / 60)} min",
                     f"{s['n_targets']} in {s['n_contexts']}", f"{fixed(s['mean_accuracy'])}%", _gap(s),
                     _p(s["test"]["p_value"]), verdict(s), _dip(s)])
    return _table(["model", "pilot: context, accuracy of targets", "chosen", "pilot tokens / sweep's", "sweep time", "sweep targets in contexts",
                   "mean", "gap (95% CI)", "p", "verdict", "detectable dip"], rows)


def detect_cost_table(modulus: int, dips: list[int], lanes: dict[int, int]) -> str:
    """What `--per-residue auto --detect DIP` plans at one modulus (`plan.per_residue_for_detect`, the tool's own
    rule): targets per residue and in all, and the context tokens they take at each context length, whose
    targets per context `lanes` gives."""
    import math

    from kvphase.sweep.plan import per_residue_for_detect

    rows = []
    for dip in dips:
        per_residue = per_residue_for_detect(dip, modulus)
        targets = per_residue * modulus
        rows.append([f"{dip} points", str(per_residue), f"{targets:,}"]
                    + [f"{fixed(math.ceil(targets / held) * length / 1e6)}M" for length, held in lanes.items()])
    return _table(["one-residue dip to detect", "targets per residue", "targets"]
                  + [f"context tokens at {length}" if i == 0 else f"at {length}" for i, length in enumerate(lanes)], rows)


def pilot_phrase(relative: str) -> str:
    """A calibrated run's pilot steps in a sentence (its config.json)."""
    steps = _read(ROOT / "reports" / relative, "config.json")["calibration"]["steps"]
    return (_and([f"{fixed(100 * s['correct'] / s['targets'])}" for s in steps]) + "% at "
            + _and([f"{s['context'] // 1024}K" if s["context"] >= 1024 else str(s["context"]) for s in steps])
            + " tokens from " + _and([str(s["targets"]) for s in steps]) + " targets")


def example_phrase() -> str:
    """The default sweep's numbers in the sentences that describe it (its summary and manifest)."""
    folder = ROOT / "reports" / "example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024"
    s, manifest = _read(folder, "summary.json"), _read(folder, "manifest.json")
    return (f"Mean accuracy {fixed(s['mean_accuracy'])}%; residues range from {fixed(s['worst_accuracy'])}% (residue "
            f"{s['worst_residue']}) to {fixed(s['best_accuracy'])}% (residue {s['best_residue']}), a {fixed(s['gap'])}-point raw "
            f"gap whose simultaneous 95% interval is {fixed(s['gap_ci'][0])} to {fixed(s['gap_ci'][1])} points. The "
            f"Cochran-Mantel-Haenszel test stratified by context gives p = {fixed(s['test']['p_value'], 2)}, and the same test "
            f"on the answer log-probability p = {fixed(s['logprob_test']['p_value'], 2)}: {verdict(s)} ({dip_clause(s)}), in a "
            f"model that has no compression to cause one. Targets of one context agree a little (intra-context correlation "
            f"{fixed(s['icc'], 3)}, design effect {fixed(s['design_effect'])}). It took {fixed(manifest['wall_time_s'], 0)} s on "
            f"{manifest['machine']['threads']} threads")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def dip_clause(summary: dict) -> str:
    """What the run could have seen, in words: the one-residue dip it detects 80% of the time, or
    that it can name none (a model at a floor or ceiling, or one the rules read no dip for)."""
    if summary["detectable_dip"] is None:
        return "it can name no one-residue dip it would detect"
    return f"a one-residue dip of {fixed(summary['detectable_dip'])} points is what it detects 80% of the time"


def _reports(relative: str) -> dict:
    return _read(ROOT / "reports" / relative, "summary.json")


def _span(values: list[float], unit: str = "points") -> str:
    """"A to B points" over values (one decimal), or "A points" when they agree to that decimal."""
    low, high = fixed(min(values)), fixed(max(values))
    unit = unit if unit in ("%", "") else " " + unit
    return f"{low}{unit}" if low == high else f"{low} to {high}{unit}"


def gap_span(folders: list[str]) -> str:
    """The range of the gaps of sweeps (folders under reports/): "A to B points"."""
    return _span([_reports(folder)["gap"] for folder in folders])


def dip_span(folders: list[str]) -> str:
    """The range of the one-residue dips these sweeps detect 80% of the time (those that name one)."""
    dips = [s["detectable_dip"] for s in map(_reports, folders) if s["detectable_dip"] is not None]
    return _span(dips) if dips else "no dip"


def seed_verdicts(folders: list[str]) -> str:
    """Each seed's sweep (folders under reports/trained/, each with a sweep/) as its report reads it, the
    verdict first: "effect at seed 0 (gap G (CI), p = P), inconclusive at seed 1 (...)"; any verdict
    string the analysis gives is printed as it is."""
    parts = []
    for folder in folders:
        s = _read(ROOT / "reports" / "trained" / folder / "sweep", "summary.json")
        seed = _read(ROOT / "reports" / "trained" / folder, "config.json")["seed"]
        parts.append(f"{verdict(s)} at seed {seed} (gap {_gap(s)}, p = {_p(s['test']['p_value'])}; {dip_clause(s)})")
    return _and(parts)


def verdict_tally(rows: list[tuple[str, str]], named: bool = True) -> str:
    """How sweeps (label, folder under reports/) read, counted by verdict in the reports' own words, in the
    order they first appear: "effect (2 of 3): seed 0 and seed 2; no effect at this power (1 of 3): seed 1"
    (without the labels unless `named`)."""
    groups: dict[str, list[str]] = {}
    for label, relative in rows:
        groups.setdefault(verdict(_reports(relative)), []).append(label)
    return "; ".join(f"{word} ({len(labels)} of {len(rows)})" + (f": {_and(labels)}" if named else "")
                     for word, labels in groups.items())


def learned_tally_from(runs: list[str], from_context: int) -> str:
    """How the sweeps of the trained runs (names under reports/trained/) that reached the 80% bar at
    `from_context` tokens and longer read, counted: "effect (12 of 14); ..."."""
    kept = [run for run in runs if _read(ROOT / "reports" / "trained" / run, "config.json")["context"] >= from_context
            and _read(ROOT / "reports" / "trained" / run, "summary.json")["readable"]]
    return verdict_tally([(run, f"trained/{run}/sweep") for run in kept], named=False)


def fix_tally(models: list[tuple[str, str]], fix: str) -> str:
    """How one fix's sweeps of several models (`fixes_table`'s (folder, label) pairs) read, by model."""
    return verdict_tally([(label, f"trained/fixes/{model}-{fix}") for model, label in models])


def seed_tally(runs: list[str], learned: bool = False) -> str:
    """`verdict_tally` of trained runs' sweeps (names under reports/trained/), each labelled by its seed;
    `learned`: only the runs whose training reached the 80% bar, said so."""
    kept = [run for run in runs if not learned or _read(ROOT / "reports" / "trained" / run, "summary.json")["readable"]]
    by_seed = len({re.sub(r"seed\d+$", "", run) for run in runs}) == 1  # one design's seeds: "seed k" says which
    rows = [(f"seed {_read(ROOT / 'reports' / 'trained' / run, 'config.json')['seed']}" if by_seed else run.split("/")[-1],
             f"trained/{run}/sweep") for run in kept]
    if not learned:
        return verdict_tally(rows)
    unit = "seeds" if by_seed else "runs"
    return f"{len(kept)} of {len(runs)} {unit} learned" + (f"; their sweeps read {verdict_tally(rows)}" if kept else "")


# the runs that show a verdict first, where they read it: the default sweep, the front page's figure, the long
# context SmolLM2 cannot read, post-hoc block selection at 16 targets per residue
VERDICT_EXAMPLES = ["trained/engine/csa-disjoint-seed0/sweep", "example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024",
                    "long-context/SmolLM2-135M-Instruct.Q4_1-records-S4-L8128", "reference/blocktopk-S4"]


def verdict_examples() -> str:
    """One committed sweep of each verdict the reports print (the first folder under reports/ in path order that
    reads it), its headline quoted: a table."""
    seen: dict[str, Path] = {}
    preferred = [ROOT / "reports" / relative / "summary.json" for relative in VERDICT_EXAMPLES]
    for path in preferred + sorted((ROOT / "reports").rglob("summary.json")):
        summary = json.loads(path.read_text())
        if "verdict" in summary and (path.parent / "config.json").is_file():
            seen.setdefault(summary["verdict"], path.parent)
    rows = [[_link(word, folder, ROOT), f"`{folder.relative_to(ROOT / 'reports')}`", _read(folder, "summary.json")["headline"]]
            for word, folder in seen.items()]
    return _table(["verdict", "run", "its headline"], rows)


NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()


def verdict_classes() -> str:
    """How many classes a report can print and how many are decided before any test (`analysis.VERDICTS`, in the
    order `Summary.verdict` decides them: every class before "effect"), in words: "seven classes, four of them"."""
    from kvphase.sweep.analysis import VERDICTS

    return f"{NUMBER_WORDS[len(VERDICTS)]} classes, {NUMBER_WORDS[VERDICTS.index('effect')]} of them"


def verdict_class_count() -> str:
    """How many classes a report can print, in words (`analysis.VERDICTS`): "seven classes"."""
    return verdict_classes().split(",")[0]


def density_phrase(relative: str) -> str:
    """How a sweep (a folder under reports/) spread its targets: "N targets per context at stride S, C contexts"."""
    s, stride = _reports(relative), _read(ROOT / "reports" / relative, "config.json")["stride"]
    per = s["n_targets"] / s["n_contexts"]
    return f"{per:g} target{'s' if per != 1 else ''} per context at stride {stride}, {s['n_contexts']} contexts"


def verdict_of(relative: str) -> str:
    """A sweep's verdict (a folder under reports/), in its report's words."""
    return verdict(_reports(relative))


def sweep_reading(relative: str) -> str:
    """One sweep (a folder under reports/) as its report reads it: "verdict (mean M%, gap G (CI), p = P)"."""
    s = _reports(relative)
    return f"{verdict(s)} (mean {fixed(s['mean_accuracy'])}%, gap {_gap(s)}, p = {_p(s['test']['p_value'])})"


def means_change(folders: list[str]) -> str:
    """The first sweep's mean accuracy against the others' (folders under reports/): "A% to B%, C% and D%"."""
    means = [f"{fixed(_reports(folder)['mean_accuracy'])}" for folder in folders]
    return f"{means[0]}% to " + _and(means[1:]) + "%"


def correct_of(folders: list[str]) -> str:
    """How many targets the sweeps answered, of how many (their summaries): "N of M targets"."""
    summaries = [_reports(folder) for folder in folders]
    correct = sum(round(s["mean_accuracy"] * s["n_targets"] / 100) for s in summaries)
    return f"{correct} of {sum(s['n_targets'] for s in summaries)} targets"


def _residue_extremes(relative: str) -> str:
    """A sweep's test and its worst and best residues: "p = P, W% against B%"."""
    s = _reports(relative)
    return f"p = {_p(s['test']['p_value'])}, {fixed(s['worst_accuracy'])}% against {fixed(s['best_accuracy'])}%"


def gaps_between(runs: list[str], low: float, high: float, from_context: int) -> str:
    """The learned runs' sweeps (the 80% bar) at `from_context` tokens and longer: their gaps' range
    and how many lie in [low, high]: "from A to B points, n of m between low and high"."""
    contexts = {run: _read(ROOT / "reports" / "trained" / run, "config.json")["context"] for run in runs}
    gaps = [s["gap"] for s in learned_sweeps([run for run in runs if contexts[run] >= from_context])]
    inside = sum(low <= gap <= high for gap in gaps)
    return f"from {_span(gaps)}, {inside} of {len(gaps)} between {low:g} and {high:g}"


def flip_phrase(relative: str) -> str:
    """A flip run's targets (summary.json): how many flip, and each target's margin range over its shifts
    (right value's log-probability minus the strongest distractor's), the sign saying which leads."""
    s = _reports(relative)
    def leader(target: dict) -> str:
        if target["min_margin"] > 0:
            return "the right value leads at every shift"
        return "a distractor leads at every shift" if target["max_margin"] < 0 else "either leads"

    targets = [f"target {t['target_id']} {'flips' if t['flips'] else 'does not flip'}, margins "
               f"{t['min_margin']:+.2f} to {t['max_margin']:+.2f} nats ({leader(t)})" for t in s["targets"]]
    return (f"{s['flipping_targets']} of {s['n_targets']} targets flip: " + _and(targets)
            + f"; phase \"explains\" {fixed(100 * s['mean_periodic_share'], 0)}% of the margin's variation against "
            f"{fixed(100 * s['chance_periodic_share'], 0)}% expected from noise")


def knockout_phrase(relative: str, phase: int, components: list[str]) -> str:
    """What knocking out each component costs one phase (the probe's effects.csv): its change in accuracy,
    points, with the interval and whether that interval excludes 0."""
    import pandas as pd

    effects = pd.read_csv(ROOT / "reports" / relative / "effects.csv").set_index(["component", "phase"])
    parts = []
    for component in components:
        row = effects.loc[(component, phase)]
        low, high = row["d_correct_low"], row["d_correct_high"]
        parts.append(f"{component} {row['d_correct']:+.1f} points (CI {low:+.1f} to {high:+.1f}, "
                     f"{'excluding' if low > 0 or high < 0 else 'including'} 0)")
    return _and(parts)


def training_outcome(run: str) -> str:
    """A training run in a clause (its summary, manifest and training.csv): "S steps, M minutes on one core:
    H% held-out (B% on its last training batches, loss L nats)"."""
    import pandas as pd

    folder = ROOT / "reports" / "trained" / run
    s, last = _read(folder, "summary.json"), pd.read_csv(folder / "training.csv").iloc[-1]
    minutes = _read(folder, "manifest.json")["wall_time_s"] / 60
    return (f"{s['steps']} steps, {fixed(minutes, 0)} minute{'s' if round(minutes) != 1 else ''} on one core: "
            f"{fixed(s['accuracy'])}% held-out ({fixed(100 * last['accuracy'])}% on its last training batches, "
            f"loss {fixed(last['loss'], 2)} nats)")


def _training_curve(run: str):
    """A training run's training.csv (a pandas frame, one row per logged step)."""
    import pandas as pd

    return pd.read_csv(ROOT / "reports" / "trained" / run / "training.csv")


def batch_accuracy(run: str, steps: list[int]) -> str:
    """A training run's accuracy on its training batches at some steps (its training.csv, each row the batches
    since the row before): "A% at step X, B% at Y and C% at Z"."""
    rows = _training_curve(run).set_index("step")
    return _and([f"{fixed(100 * rows.loc[step, 'accuracy'])}%" + (" at step " if i == 0 else " at ") + str(step)
                 for i, step in enumerate(steps)])


def position_accuracy(relative: str, ranges: list[tuple[int, int]]) -> str:
    """A sweep's accuracy over targets by position (its results.csv): "A% for targets at positions a-b, B% at c-d"."""
    import pandas as pd

    results = pd.read_csv(ROOT / "reports" / relative / "results.csv")
    parts = [f"{fixed(100 * results[results['target_pos'].between(low, high)]['correct'].mean(), 0)}%"
             + (" for targets at positions " if i == 0 else " at ") + f"{low}-{high}" for i, (low, high) in enumerate(ranges)]
    return _and(parts)


def learned_summary(runs: list[str]) -> str:
    """The sweeps of the runs that reached the 80% bar, in a clause: "at the N seeds that learned: gaps A to B
    points, p from P to Q, the worst residue R at every one" (or the worst residues each had)."""
    sweeps = learned_sweeps(runs)
    worst = sorted({s["worst_residue"] for s in sweeps})
    p_values = [s["test"]["p_value"] for s in sweeps]
    where = (f"the worst residue {worst[0]} at every one" if len(worst) == 1
             else "the worst residues " + _and([str(s["worst_residue"]) for s in sweeps]))
    return (f"at the {len(sweeps)} seeds that learned: gaps {_span([s['gap'] for s in sweeps])}, p from "
            f"{_p(min(p_values))} to {_p(max(p_values))}, {where}")


def quantized_shift(runs: list[str]) -> str:
    """How far the Q8_0 and Q4_0 copies' sweeps (sweep-Q8_0/, sweep-Q4_0/) of the runs that reached the 80% bar
    move the gap and the mean accuracy from the F32 sweep's: "Q8_0 moves gaps by at most A points, ..."."""
    learned = [ROOT / "reports" / "trained" / run for run in runs
               if _read(ROOT / "reports" / "trained" / run, "summary.json")["readable"]]
    shifts = {}
    for kind in ("Q8_0", "Q4_0"):
        pairs = [(_read(f / "sweep", "summary.json"), _read(f / f"sweep-{kind}", "summary.json")) for f in learned
                 if (f / f"sweep-{kind}").is_dir()]
        shifts[kind] = (max(abs(a["gap"] - b["gap"]) for a, b in pairs),
                        max(abs(a["mean_accuracy"] - b["mean_accuracy"]) for a, b in pairs))
    return (f"Q8_0 moves gaps by at most {fixed(shifts['Q8_0'][0])} points, Q4_0 by at most {fixed(shifts['Q4_0'][0])}; "
            f"mean accuracy by at most {fixed(max(shift[1] for shift in shifts.values()))}")


def _effects(relative: str):
    import pandas as pd

    return pd.read_csv(ROOT / "reports" / relative / "effects.csv")


def slots_ahead(relative: str, stride: int) -> str:
    """A slot-knockout probe (effects.csv) read for the slot one phase ahead of each phase, layer 0:
    "slot 1 costs phase 0 A points (CI a-b), slot 2 phase 1 B, ..."."""
    effects = _effects(relative).set_index(["component", "phase"])
    parts = []
    for phase in range(stride):
        row = effects.loc[(f"L0P{(phase + 1) % stride}", phase)]
        ci = f" (CI {fixed(-row['d_correct_high'])}-{fixed(-row['d_correct_low'])})" if phase == 0 else ""
        parts.append(f"slot {(phase + 1) % stride} {'costs ' if phase == 0 else ''}phase {phase} {fixed(-row['d_correct'])}"
                     + (" points" if phase == 0 else "") + ci)
    return _and(parts)


def slot_pair_costs(relatives: list[str], stride: int) -> str:
    """Slot-knockout probes (effects.csv), layer 0: the range of what knocking out slot p costs phase p and phase
    p - 1 (the phase whose value the slot holds), over every slot of every probe: "A to B points"."""
    costs = []
    for relative in relatives:
        effects = _effects(relative).set_index(["component", "phase"])
        costs += [-effects.loc[(f"L0P{slot}", phase), "d_correct"] for slot in range(stride)
                  for phase in (slot, (slot - 1) % stride)]
    return _span(costs)


def largest_knockout(relative: str, layer: str = "L") -> str:
    """The largest change in accuracy any knockout of a probe makes (effects.csv), of the components whose name
    starts with `layer` ("L1": layer 1's): "A points (COMPONENT at phase P)"."""
    effects = _effects(relative)
    effects = effects[effects["component"].str.startswith(layer)]
    row = effects.loc[effects["d_correct"].abs().idxmax()]
    return f"{fixed(abs(row['d_correct']))} points ({row['component']} at phase {row['phase']})"


def component_by_phase(relative: str, component: str) -> str:
    """What knocking out one component costs each phase (a knockout probe's effects.csv): "phase 0 A points
    (CI a to b), phase 1 B (CI ...), ..."."""
    effects = _effects(relative)
    rows = effects[effects["component"] == component].sort_values("phase")
    return _and([f"phase {row.phase} {row.d_correct:+.1f}" + (" points" if i == 0 else "")
                 + f" (CI {row.d_correct_low:+.1f} to {row.d_correct_high:+.1f})" for i, row in enumerate(rows.itertuples())])


def gate_bias_spread(relative: str) -> str:
    """A gates probe (summary.json): "mean per-channel entropy F% of log2 S; the most concentrated head puts
    D% of its weight on one phase"."""
    s = _reports(relative)
    return (f"mean per-channel entropy {fixed(100 * s['mean_entropy_fraction'])}% of log2 S; the most concentrated head "
            f"puts {fixed(100 * s['sharpest']['dominant_share'])}% of its weight on one phase")


def cycle_rolls(relatives: list[str]) -> str:
    """Cycle probes rolling the gate biases by k = 1, 2, ... (summary.json): the R^2 of the predicted shift and the
    boundary phase's accuracy before and after each roll."""
    summaries = [_reports(relative) for relative in relatives]
    boundary = [next(row for row in s["phases"] if row["boundary"]) for s in summaries]
    return (f"R^2 of the predicted shift {_span([s['r_squared'] for s in summaries], '')}; the boundary phase from "
            f"{fixed(boundary[0]['accuracy_k0'])}% to " + _and([f"{fixed(row['accuracy_k'])}" for row in boundary]) + "%")


def dominant_phase(relative: str, layer: int, source: str) -> str:
    """The phase that most often dominates a gate's window channels (a gate-activations probe): "phase P (S% of them)"."""
    gate = next(g for g in _reports(relative)["layers"] if g["layer"] == layer and g["source"] == source)
    shares = gate["dominant_phase_shares"]
    return f"phase {shares.index(max(shares))} ({fixed(100 * max(shares), 0)}% of them)"


def flip_summary(relative: str) -> str:
    """A flip probe with many targets (summary.json): "N of M targets flip, phase explains A% of the margin's
    variation (noise alone B%), mean margin best at phase p (+m nats) and worst at phase q (+n)"."""
    s = _reports(relative)
    phases = sorted(s["per_phase"], key=lambda row: row["mean_margin"])
    return (f"{s['flipping_targets']} of {s['n_targets']} targets flip, phase explains "
            f"{fixed(100 * s['mean_periodic_share'], 0)}% of the margin's variation (noise alone "
            f"{fixed(100 * s['chance_periodic_share'], 0)}%), mean margin best at phase {phases[-1]['phase']} "
            f"({phases[-1]['mean_margin']:+.2f} nats) and worst at phase {phases[0]['phase']} ({phases[0]['mean_margin']:+.2f})")


def cycle_boundary(relative: str) -> str:
    """A cycle probe (summary.json): the boundary phase's accuracy before and after the roll, "A% -> B%"."""
    boundary = next(row for row in _reports(relative)["phases"] if row["boundary"])
    return f"{fixed(boundary['accuracy_k0'])}% -> {fixed(boundary['accuracy_k'])}%"


def gate_spread(relative: str, layer: int, source: str) -> str:
    """A gate-activations probe (summary.json), one gate: "median A of B bits; one phase over half the weight
    in C% of window channels"."""
    gate = next(g for g in _reports(relative)["layers"] if g["layer"] == layer and g["source"] == source)
    return (f"median {fixed(gate['entropy_p10_p25_p50_p75_p90'][2], 2)} of {gate['max_bits']:g} bits; one phase over half "
            f"the weight in {fixed(100 * gate['share_over_half'], 0)}% of window channels")


def _theory_case(run: str, components: int, stagger: str) -> dict:
    """One case of a `kvphase theory` run (reports/theory/RUN/summary.json): K components, fixed or staggered."""
    return next(case for case in _reports(f"theory/{run}")["cases"]
                if case["components"] == components and case["stagger"] == stagger)


def theory_rates() -> str:
    """The linearization's growth rate against the simulation's on both sides of beta* (S4-beta6's stability rows)."""
    rows = _reports("theory/S4-beta6")["stability"]
    below, above = rows[0], max(rows, key=lambda row: row["beta"])
    return (f"{fixed(below['predicted_rate'], 5)} against {fixed(below['measured_rate'], 5)} at beta = {below['beta']:g}, "
            f"{fixed(above['predicted_rate'], 5)} against {fixed(above['measured_rate'], 5)} at 1.2 beta*")


def theory_times() -> str:
    """How close the predicted time to leave the uniform gate comes to the simulated one, over every run's rows."""
    errors = [abs(row["simulated_time"] - row["predicted_time"]) / row["predicted_time"]
              for run in sorted((ROOT / "reports" / "theory").glob("*/summary.json"))
              for row in _reports(f"theory/{run.parent.name}")["stability"] if row["predicted_time"] is not None]
    return f"within {fixed(100 * max(errors), 0)}%"


def theory_fixed_point() -> str:
    """Fixed offsets, rho = 0.5, beta = 16: the alike-components point's accuracy inside the window and at the boundary."""
    accuracy = _theory_case("S4-beta16", 2, "none")["symmetric_point"]["accuracy"]
    return f"{fixed(100 * accuracy[0])}% against {fixed(100 * accuracy[-1])}%"


def theory_staggered() -> str:
    """K = S staggered components at beta = 16: the symmetric point's accuracy, predicted and simulated."""
    case = _theory_case("S4-beta16", 4, "component")
    return (f"{fixed(100 * case['symmetric_point']['accuracy'][0])}% at every phase at beta = 16, simulated "
            f"{fixed(100 * case['accuracy'][0])}%")


def theory_near_uniform() -> str:
    """Fixed offsets above beta*: how uniform the gates stay, and their weight on the boundary phase."""
    case = _theory_case("S4-beta16", 4, "none")
    return (f"{fixed(case['normalized_entropy'], 3)} of log2 S at beta = 16, {fixed(100 * case['gates'][0][-1], 0)}% "
            "on the boundary")


def theory_sharp() -> str:
    """Fixed offsets below beta*: the gates' mean normalized entropy at beta = 6 and beta = 3, K = 4."""
    return (f"mean normalized entropy {fixed(_theory_case('S4-beta6', 4, 'none')['normalized_entropy'])} at beta = 6, "
            f"{fixed(_theory_case('S4-beta3', 4, 'none')['normalized_entropy'], 2)} at beta = 3 with K = 4")


def theory_lean() -> str:
    """Fixed offsets, rho = 0.5: a gate's weight on the boundary phase against another phase's."""
    gate = _theory_case("S4-beta16", 2, "none")["gates"][0]
    return f"w_b {fixed(gate[-1], 2)} against {fixed(gate[0], 2)}"


def gate_groups(run: str, components: int, stagger: str) -> str:
    """A fixed point's gates grouped by value (weights per phase): "3 at a / b / c / d, 1 at ..."."""
    groups: dict[str, int] = {}
    for gate in _theory_case(run, components, stagger)["gates"]:
        key = " / ".join(fixed(weight, 2) for weight in gate)
        groups[key] = groups.get(key, 0) + 1
    return _and([f"{count} at {key}" for key, count in sorted(groups.items(), key=lambda item: -item[1])])


THEORY_RUNS = [("beta = 3, rho = 0.5", "S4-beta3"), ("beta = 6, rho = 0.5", "S4-beta6"),
               ("beta = 16, rho = 0.5", "S4-beta16"), ("beta = 16, rho = 0.35", "S4-beta16-rho0.35")]


def theory_boundary(run: str, components: int) -> str:
    """A fixed-offset case of a `kvphase theory` run: its boundary phase's p_correct against the other phases'."""
    accuracy = [100 * a for a in _theory_case(run, components, "none")["accuracy"]]
    return f"{fixed(accuracy[-1])}% against {_span(accuracy[:-1], '%')}"


def theory_trade(components: int) -> str:
    """lambda_trade at the fixed-offset symmetric point of the beta = 16 runs, one per rho (their summary.json)."""
    return ", ".join(f"{_theory_case(run, components, 'none')['symmetric_point']['trade_rate']:+.2g} at "
                     f"rho = {_read(ROOT / 'reports' / 'theory' / run, 'config.json')['theory']['attenuation']:g}"
                     for run in ("S4-beta16-rho0.35", "S4-beta16"))


def theory_stability_table() -> str:
    """The `kvphase theory` runs' checks at the uniform gate (stability.csv's rows in summary.json), each beta once,
    as their reports print them (`kvphase.theory.report`)."""
    from kvphase.theory.report import _stability_frame

    rows = {row["beta"]: row for _, run in THEORY_RUNS for row in _reports(f"theory/{run}")["stability"]}
    frame = _stability_frame([rows[beta] for beta in sorted(rows)])
    return _table(list(frame.columns), frame.astype(str).values.tolist())


def theory_cases_table(base: Path) -> str:
    """The `kvphase theory` runs' end states against the symmetric fixed point, as their reports print them
    (`kvphase.theory.report`), a run per group of rows; links relative to `base`, the document's folder."""
    from kvphase.theory.report import _case_frame

    header, rows = None, []
    for label, run in THEORY_RUNS:
        frame = _case_frame(_reports(f"theory/{run}")["cases"])
        frame = frame.drop(columns=["entropy / log2 S", "phases per component"])
        header = ["run", *frame.columns]
        link = f"[{label}]({os.path.relpath(ROOT / 'reports' / 'theory' / run / 'report.md', base)})"
        rows += [[link if i == 0 else "", *values] for i, values in enumerate(frame.astype(str).values.tolist())]
    return _table(header, rows)


def theory_rolled_boundary(run: str, components: int) -> str:
    """A fixed-offset end state's boundary p_correct, then with its gates rolled by 1, 2 and 3 phases (the run's
    gates in summary.json through the model of `kvphase.theory`; the rolls are not part of the command):
    "A% to B%" (or "B, C and D%" when the rolls differ)."""
    import numpy as np

    from kvphase.theory.model import IdealModel, TheoryConfig

    settings = _read(ROOT / "reports" / "theory" / run, "config.json")["theory"]
    model = IdealModel(TheoryConfig(**{**settings, "components": components, "stagger": "none"}))
    gates = np.array(_theory_case(run, components, "none")["gates"])  # (K, S)
    rolled = [fixed(100 * model.accuracy(np.log(np.roll(gates, k, axis=1)))[-1]) for k in range(1, gates.shape[1])]
    return f"{fixed(100 * model.accuracy(np.log(gates))[-1])}% to " + _and(list(dict.fromkeys(rolled))) + "%"


def theory_split_counts(run: str, components: int, stagger: str) -> str:
    """How many of a case's components put their largest gate weight on each phase: "a/b/c/d per phase"."""
    gates = _theory_case(run, components, stagger)["gates"]
    largest = [gate.index(max(gate)) for gate in gates]
    return "/".join(str(largest.count(phase)) for phase in range(len(gates[0]))) + " per phase"


def fix_change(model: str, fix: str) -> str:
    """A model's plain sweep against one fix (folders under trained/fixes/): "mean A% to B%, gap G to H (p = P)"."""
    plain, under_fix = _read(FIXES / f"{model}-plain", "summary.json"), _read(FIXES / f"{model}-{fix}", "summary.json")
    return (f"mean {fixed(plain['mean_accuracy'])}% to {fixed(under_fix['mean_accuracy'])}%, gap {fixed(plain['gap'])} to "
            f"{fixed(under_fix['gap'])} (p = {_p(under_fix['test']['p_value'])})")


def fix_verdict(run: str) -> str:
    """One fix run (a folder under trained/fixes/) as its report reads it: "verdict (gap G (CI), p = P)"."""
    s = _read(FIXES / run, "summary.json")
    return f"{verdict(s)} (gap {_gap(s)}, p = {_p(s['test']['p_value'])})"


def _shifts_alone(run: str) -> dict:
    """Each shift of an offset ensemble (a folder under trained/fixes/) scored alone, as its report and
    fixes.md read them (`summarize_shifts` on its results.csv and offsets.csv): {shift: Summary}."""
    from kvphase.sweep.analysis import summarize_shifts
    from kvphase.sweep.run import load_offsets, load_plan, load_results

    plan = load_plan(FIXES / run)
    return summarize_shifts(load_results(FIXES / run), load_offsets(FIXES / run), plan.stride, plan.modulus, plan.seed)


def shifts_phrase(run: str) -> str:
    """An ensemble's shifts alone: "a gap of A to B points, the weak residue R at shift 0, ..."."""
    alone = _shifts_alone(run)
    return (f"a gap of {_span([s.gap for s in alone.values()])}, the weak residue "
            + _and([f"{s.worst_residue} at shift {d}" for d, s in alone.items()]))


def shifted_loss(run: str) -> str:
    """An ensemble's shifts other than 0, alone, against shift 0 (the plain sweep): "loses A to B points of mean
    accuracy and has a gap of C to D points"."""
    alone = _shifts_alone(run)
    plain = alone[0]
    shifted = [s for d, s in alone.items() if d != 0]
    return (f"loses {_span([plain.mean_accuracy - s.mean_accuracy for s in shifted])} of mean accuracy and has a "
            f"gap of {_span([s.gap for s in shifted])} (plain: {fixed(plain.gap)})")


def bench_offsets_phrase(bench: Path) -> str:
    """The cost the offsets bench measured (its table in bench.md: model, fix, tokens x plain, wall time x plain),
    each fix's range over the models: "tokens A-Bx for 2 shifts and ..., wall time ..."."""
    rows = _markdown_rows(bench)[2:]  # below the header and its separator

    def spread(fix: str, column: int) -> str:
        values = sorted({row[column] for row in rows if row[1] == fix}, key=float)
        return f"{values[0]}x" if len(values) == 1 else f"{values[0]}-{values[-1]}x"

    return (f"tokens {spread('offsets 2 (mean)', 2)} for 2 shifts and {spread('offsets 4 (mean)', 2)} for 4, wall time "
            f"{spread('offsets 2 (mean)', 3)} and {spread('offsets 4 (mean)', 3)} (the max rule "
            f"{spread('offsets 4 (max)', 3)}); a random offset costs {spread('random offset', 2)} tokens, "
            f"{spread('random offset', 3)} time")


def gaps_phrase(folders: list[str], mean: bool = False) -> str:
    """A sentence's numbers for seeds of one model (folders under reports/trained/, each with a
    sweep/): "[mean M, ...%,] gaps G (CI), ... points, p = P, ..."."""
    summaries = [_read(ROOT / "reports" / "trained" / folder / "sweep", "summary.json") for folder in folders]
    means = means_phrase(folders) + ", " if mean else ""
    plural = "s" if len(summaries) > 1 else ""
    return (f"{means}gap{plural} {_and([_gap(s) for s in summaries])} points, "
            f"p = {_and([_p(s['test']['p_value']) for s in summaries])}")


def means_phrase(folders: list[str]) -> str:
    """The mean accuracies of seeds' sweeps (folders under reports/trained/, each with a sweep/): "mean A, B and C%"."""
    summaries = [_read(ROOT / "reports" / "trained" / folder / "sweep", "summary.json") for folder in folders]
    return "mean " + _and([f"{fixed(s['mean_accuracy'])}" for s in summaries]) + "%"


def residues_phrase(folder: str) -> str:
    """One sweep's numbers in a sentence: each residue's accuracy, the gap, p and the verdict."""
    s = _read(ROOT / "reports" / "trained" / folder / "sweep", "summary.json")
    accuracies = [f"{fixed(row['accuracy'])}" for row in s["per_residue"]]
    return (f"{_and(accuracies)}% at residues 0-{len(accuracies) - 1}, gap {_gap(s)} points, "
            f"p = {_p(s['test']['p_value'])}: {verdict(s)}")


def trained_files_table() -> str:
    """The table of the trained files in tests/data/trained/ (reports/study-highlights.md): each is seed 0 of a
    study folder (the same bytes), shown with that folder's sweep."""
    rows = []
    for file, layout, what, relative in TRAINED_FILES:
        folder = ROOT / "reports" / "trained" / relative
        s = _read(folder, "summary.json")
        what = f"{what} (residues mod {_read(folder, 'config.json')['modulus']})"
        rows.append([f"`{file}`", layout, what, f"{fixed(s['mean_accuracy'])}%", f"{s['worst_residue']}: {fixed(s['worst_accuracy'])}%",
                     _gap(s), _p(s["test"]["p_value"]), _link(verdict(s), folder, ROOT / "reports")])
    return _table(["file", "layout", "what it is", "mean", "worst residue", "gap (95% CI)", "p", "verdict"], rows)


def headline(relative: str) -> str:
    """A run's headline (a folder under reports/): a sweep's from its summary.json, a probe's the bold line its
    report.md opens with (probes keep none in their summary)."""
    summary = _reports(relative)
    if "headline" in summary:
        return summary["headline"]
    return re.search(r"^\*\*(.+)\*\*$", (ROOT / "reports" / relative / "report.md").read_text(), re.M).group(1)


def headline_list(rows: list[tuple[str, str]]) -> str:
    """Runs' headlines (label, folder under reports/), one list item each, linked to their reports."""
    return "".join(f"- [{label}]({relative}/report.md): {headline(relative)}\n" for label, relative in rows)


def headline_quote(relative: str) -> str:
    """A run's headline as its report opens with it (summary.json), quoted in bold."""
    return f"> **{_read(ROOT / 'reports' / relative, 'summary.json')['headline']}**\n"


def example_sweep_time() -> str:
    manifest = _read(ROOT / "reports" / "example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024", "manifest.json")
    return f"{fixed(manifest['wall_time_s'] / 60)} minutes on {manifest['machine']['threads']} threads"


def engine_sweep_times() -> str:
    """The range of the engine study's sweeps through llama.cpp (their manifests)."""
    times = [_read(folder, "manifest.json")["wall_time_s"]
             for folder in sorted((ROOT / "reports" / "trained" / "engine").glob("*/sweep"))]
    return f"{fixed(min(times), 0)}-{fixed(max(times), 0)} s on one thread ({len(times)} sweeps of the engine study)"


def training_minutes(runs: list[str]) -> str:
    """The range of training times over runs (folders under reports/trained/; their manifests)."""
    minutes = [_read(ROOT / "reports" / "trained" / run, "manifest.json")["wall_time_s"] / 60 for run in runs]
    low, high = fixed(min(minutes), 0), fixed(max(minutes), 0)
    return low if low == high else f"{low}-{high}"


def study_hours(study: str) -> str:
    """The wall time of every run folder under reports/trained/<study> (trainings, and the sweeps and
    probes inside them), from their manifests: "T hours, trainings R of them"."""
    hours = {"all": 0.0, "trainings": 0.0}
    for manifest in (ROOT / "reports" / "trained" / study).rglob("manifest.json"):
        seconds = json.loads(manifest.read_text())["wall_time_s"]
        hours["all"] += seconds / 3600
        hours["trainings"] += seconds / 3600 if (manifest.parent / "training.csv").is_file() else 0.0
    return f"{fixed(hours['all'])} hours, trainings {fixed(hours['trainings'])} of them"


def nested_phase_phrase(relative: str, inner: int) -> str:
    """A large-modulus sweep read against a smaller stride that divides it, by the tool's own reading
    (`kvphase.statistics.nested`, what `kvphase compare` prints): its residues pooled by position mod `inner`,
    and the residues within each phase class, each test stratified by context, statistics spelled out."""
    import pandas as pd

    from kvphase.statistics.nested import read_nested
    from kvphase.statistics.stratified import PERMUTATIONS

    folder = ROOT / "reports" / relative
    config = _read(folder, "config.json")
    reading = read_nested(pd.read_csv(folder / "results.csv"), config["stride"], config["modulus"], inner,
                          config["seed"])
    between, within = reading.between, reading.within
    how = f" from {PERMUTATIONS} permutations" if "permutations" in within.note else ""
    return (f"pooled by position mod {inner} its residues read {_and([fixed(a) for a in reading.phase_accuracy])}% "
            f"(chi-square {fixed(between.statistic)}, df {between.dof}, p = {_p(between.p_value)}); within each phase "
            f"mod {inner} they differ {'no more than chance' if within.p_value >= 0.05 else 'beyond chance'} "
            f"(chi-square {fixed(within.statistic)}, df {within.dof}, p = {_p(within.p_value)}{how}; a one-residue dip "
            f"of {fixed(reading.within_dip)} points within a phase is what it detects 80% of the time)")


def training_times() -> str:
    studies = [[f"gated-seed{k}" for k in range(3)], [f"engine/csa-disjoint-seed{k}" for k in range(5)],
               [f"engine/glm-kpool-seed{k}" for k in range(3)]]
    return " / ".join(training_minutes(runs) for runs in studies) + " minutes on one core each"


TRAINED_FILES = [
    ("csa-disjoint.gguf", "`deepseek4`", "DeepSeek-V4's compressor, each entry pooling its own 4 tokens", "engine/csa-disjoint-seed0/sweep"),
    ("csa-dense.gguf", "`deepseek4`", "its dense twin: a window over every token, trained with the induction hint", "engine/csa-dense-seed0/sweep"),
    ("csa-top4.gguf", "`deepseek4`", "DeepSeek-V4's overlapped compressor, its lightning indexer reading the top 4 entries, "
     "128-token context", "ds4-ablation/ctx128-top4-seed0/sweep"),
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

# the mechanism probes run on tiny random-weight models and on SmolLM2 (reports/study-probes.md)
PROBE_EXAMPLES = [f"example-{probe}-tiny-{arch}" for probe in ("gate-activations", "gates") for arch in ("glm5-next", "deepseek4")] + [
    "example-flip-tiny-glm5-next-L256", "example-flip-SmolLM2-L256"] + [
    f"example-{probe}-tiny-{arch}-L256" for probe in ("knockout", "knockout-slots") for arch in ("glm5-next", "deepseek4")] + [
    "example-knockout-tiny-minimax-m3-L256"]

POST_HOC = [("dense (control)", "reference/dense")] + [
    (f"{design} S={stride}", f"reference/{design}-S{stride}") for design in ("blocktopk", "kpool", "meanpool") for stride in (4, 8)]
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
    return _and([f"{fixed(_read(ROOT / 'reports' / 'trained' / run, 'summary.json')['accuracy'])}" for run in runs]) + "%"


def learned_by_step(runs: list[str], bar: float = 80.0) -> str:
    """The first held-out evaluation (the curve in summary.json) at which each run reached `bar`%:
    "steps A, B and C"."""
    steps = []
    for run in runs:
        curve = _read(ROOT / "reports" / "trained" / run, "summary.json")["curve"]
        steps.append(next((str(point["step"]) for point in curve if 100 * point["accuracy"] >= bar), "never"))
    return "step" + ("s " if len(steps) > 1 else " ") + _and(steps)


def peak_gaps(runs: list[str]) -> str:
    """The largest gap each run's held-out curve reached during training (the curve in summary.json, by
    residue mod 2S as the training report reads it): "A to B points"."""
    return _span([100 * max(point["gap"] for point in _read(ROOT / "reports" / "trained" / run, "summary.json")["curve"])
                  for run in runs])


def stage_batch_accuracy(runs: list[str], stage: str, later: int = 0) -> str:
    """The accuracy on the training batches (training.csv) at the step that ends a stage of the runs' schedule (a
    config.json field: `gate_steps`, meanpool's gated start; `copy_steps`, the induction warm-up), or `later` steps
    after it: "A to B% at step N"."""
    accuracies, steps = [], set()
    for run in runs:
        step, curve = _read(ROOT / "reports" / "trained" / run, "config.json")[stage] + later, _training_curve(run)
        accuracies.append(100 * curve.loc[curve["step"] == step, "accuracy"].item())
        steps.add(step)
    (step,) = steps
    return f"{_span(accuracies, '%')} at step {step}"


def learned_sweeps(runs: list[str]) -> list[dict]:
    """The sweep summaries of the runs whose training reached the 80% bar (`readable`), in order."""
    trained = [ROOT / "reports" / "trained" / run for run in runs]
    return [_read(folder / "sweep", "summary.json") for folder in trained if _read(folder, "summary.json")["readable"]]


def learned_verdicts(runs: list[str]) -> str:
    """Each run's held-out accuracy, then the verdicts of the sweeps of those that reached the 80% bar,
    with its p and the one-residue dip each detects 80% of the time: "held-out A, B and C%; of the 2
    that learned, the sweeps read no effect at this power (p = P, a dip of D points detectable) and ..."."""
    sweeps = learned_sweeps(runs)
    read = _and([f"{verdict(s)} (p = {_p(s['test']['p_value'])}, a dip of {_dip(s)} points detectable)" for s in sweeps])
    return (f"held-out {heldout_phrase(runs)}; of the {len(sweeps)} that learned, the sweep"
            f"{'s read' if len(sweeps) > 1 else ' reads'} {read}")


def sweep_against_training(run: str) -> str:
    """A run's mean accuracy through its sweep beside its training's held-out accuracy:
    "M% mean in the sweep, H% held-out in training"."""
    folder = ROOT / "reports" / "trained" / run
    return (f"{fixed(_read(folder / 'sweep', 'summary.json')['mean_accuracy'])}% mean in the sweep, "
            f"{fixed(_read(folder, 'summary.json')['accuracy'])}% held-out in training")


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
CSA_FIXED = [("csa-seed0", "csa seed 0 (committed)"), *[(f"csa-seed{k}-retrained", f"csa seed {k}, retrained") for k in (1, 2, 3)],
             ("csa-disjoint-seed0-Q4_0", "csa-disjoint seed 0, Q4_0"), ("csa-seed0-Q4_0", "csa seed 0, Q4_0")]
SEEDS_FIXED = [(f"csa-disjoint-seed{k}-retrained", f"csa-disjoint seed {k}, retrained") for k in (2, 5, 6)]

OFFSETS4 = [("plain", "none"), ("offsets4-mean", "`--offsets 4`")]  # (fix folder, as the tables name it)
# the issue-43 models `--offsets 4` was tried on: (fix folder's model, as the tables name it)
DS4_TOP4_FIXED = ([(f"ds4-ctx128-top4-seed{k}", f"128 tokens, top-4, seed {k}") for k in (0, 2, 4, 5)]
                  + [("ds4-ctx128-top4-seed0-Q4_0", "128 tokens, top-4, seed 0, Q4_0")])
DS4_HCA_FIXED = [("ds4-ctx256-hca-long-seed1", "256 tokens, ratios 4,128, seed 1"),
                 ("ds4-ctx256-hca-long-seed2", "256 tokens, ratios 4,128, seed 2"),
                 ("ds4-ctx256-hca-cont-seed0", "256 tokens, ratios 4,128, 6000 steps, seed 0"),
                 ("ds4-ctx256-hca-long-seed1-Q4_0", "256 tokens, ratios 4,128, seed 1, Q4_0")]
DS4_FAITHFUL_FIXED = ([(f"ds4-ctx256-top4-from-hca-seed{k}", f"256 tokens, ratios 4,128, top-4, seed {k}") for k in (0, 1, 2)]
                      + [("ds4-ctx256-top4-from-hca-seed1-Q4_0", "256 tokens, ratios 4,128, top-4, seed 1, Q4_0")])
BENCH_POWER = ROOT / "reports" / "bench-power" / "output.txt"  # `python bench/bench_power.py > ...`: its stdout
SERVERS_BENCH = ROOT / "reports" / "servers" / "bench.md"  # `bench/bench_servers.py`'s console, quoted


def bench_table(output: Path) -> str:
    """The markdown table a bench printed (its lines that start with "|"), and the line that says how many
    simulated runs each row holds."""
    lines = output.read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines if line.startswith("|")]
    return "\n".join([next(line for line in lines if "runs per row" in line), "", *rows]) + "\n"


# transformers' own modeling code against llama.cpp on the same plans (reports/study-transformers.md): (label, the
# folder under reports/, the engine and weights it ran)
TRANSFORMERS_SWEEPS = [
    ("csa-disjoint", "trained/engine/csa-disjoint-seed0/sweep", "llama.cpp, the GGUF (F32)"),
    ("csa-disjoint", "transformers/csa-disjoint-seed0", "transformers, its HF copy (export-hf)"),
    ("glm-kpool-top4", "trained/engine/glm-kpool-top4-seed0/sweep", "llama.cpp, the GGUF (F32)"),
    ("glm-kpool-top4", "transformers/glm-kpool-top4-seed0", "transformers, its HF copy (export-hf)"),
    ("SmolLM2", "transformers/SmolLM2-records-S4-L1024-llamacpp-Q4_1", "llama.cpp, the GGUF (Q4_1)"),
    ("SmolLM2", "transformers/SmolLM2-records-S4-L1024-llamacpp-F32", "llama.cpp, the GGUF dequantized (F32)"),
    ("SmolLM2", "transformers/SmolLM2-records-S4-L1024-transformers", "transformers, its HF copy (export-hf)"),
]
# (what differs, the baseline folder, the other folder): each pair scored the same plan
TRANSFORMERS_PAIRS = [
    ("csa-disjoint: the implementation", "trained/engine/csa-disjoint-seed0/sweep", "transformers/csa-disjoint-seed0"),
    ("glm-kpool-top4: the implementation", "trained/engine/glm-kpool-top4-seed0/sweep",
     "transformers/glm-kpool-top4-seed0"),
    ("SmolLM2: the weights (Q4_1 to F32)", "transformers/SmolLM2-records-S4-L1024-llamacpp-Q4_1",
     "transformers/SmolLM2-records-S4-L1024-llamacpp-F32"),
    ("SmolLM2: the implementation", "transformers/SmolLM2-records-S4-L1024-llamacpp-F32",
     "transformers/SmolLM2-records-S4-L1024-transformers"),
]
TRANSFORMERS_CONFORM = "transformers/conform"  # `kvphase conform --backend transformers --contexts 0`


def _targets_per_second(folder: Path) -> str:
    manifest, rows = _read(folder, "manifest.json"), sum(1 for _ in open(folder / "results.csv")) - 1
    return f"{fixed(rows / manifest['wall_time_s'])}"


def transformers_sweeps() -> str:
    """Each sweep of TRANSFORMERS_SWEEPS: its engine, whether its plan is the first row's of its model (the
    manifests' plan fingerprints), mean (CI), gap (CI), p, verdict, targets a second and threads."""
    rows, first = [], {}
    for label, relative, engine in TRANSFORMERS_SWEEPS:
        folder = ROOT / "reports" / relative
        s, manifest = _read(folder, "summary.json"), _read(folder, "manifest.json")
        plan = first.setdefault(label, manifest["plan_sha256"])
        rows.append([_link(label, folder, ROOT / "reports"), engine, "yes" if manifest["plan_sha256"] == plan else "no",
                     _mean(s), _gap(s), _p(s["test"]["p_value"]), verdict(s), _targets_per_second(folder),
                     str(manifest["machine"]["threads"])])
    return _table(["model", "engine, weights", "plan fingerprint as the first row's", "mean % (95% CI)",
                   "gap (95% CI)", "p", "verdict", "targets / s", "threads"], rows)


def transformers_pairs() -> str:
    """Each pair of TRANSFORMERS_PAIRS target by target: flags that differ, the paired accuracy difference
    (other minus baseline, 95% interval with contexts the sampled units) and the log-probability difference."""
    from kvphase.statistics.intervals import paired_difference

    rows = []
    for label, baseline, other in TRANSFORMERS_PAIRS:
        ours, theirs = _by_target(ROOT / "reports" / baseline, ROOT / "reports" / other)
        difference, low, high = paired_difference(theirs["correct"].to_numpy(), ours["correct"].to_numpy(),
                                                  ours["residue"].to_numpy(), ours["context"].to_numpy())
        moved = (ours["logprob"] - theirs["logprob"]).abs()
        rows.append([label, str(len(ours)), str(int((ours["correct"] != theirs["correct"]).sum())),
                     f"{difference:+.1f} ({low:+.1f} to {high:+.1f})", f"{moved.max():.2g}", f"{moved.median():.2g}"])
    return _table(["what differs", "targets", "flags differing", "accuracy difference, points (95% CI, paired)",
                   "largest log-prob difference (nats)", "median"], rows)


def _conform_model(name: str) -> dict:
    run = _read(ROOT / "reports" / TRANSFORMERS_CONFORM, "conform.json")
    return next(m for m in run["models"] if m["name"] == name)


def transformers_conform() -> str:
    """`kvphase conform --backend transformers` over every reference: each model's verdict, targets, flags
    differing, largest log-probability difference, and the moved targets an indexer tie explains."""
    run = _read(ROOT / "reports" / TRANSFORMERS_CONFORM, "conform.json")
    rows = []
    for m in run["models"]:
        c, ties = m["check"], m.get("ties")
        rows.append([m["name"], m["status"], c["check"] if c else "-", str(c["targets"]) if c else "-",
                     str(c["flags_differing"]) if c else "-", f"{c['max_logprob_difference']:.2g}" if c else "-",
                     f"{ties['explained']} of {ties['moved']}" if ties else "-",
                     ", ".join(f"{p['path']} {p['status']}" for p in m["paths"]) or "-"])
    return _table(["reference", "verdict", "check", "targets", "flags differing", "largest log-prob difference",
                   "moved targets after an indexer tie", "engine paths (transformers against itself)"], rows)


def conform_tie(name: str) -> str:
    """The first tie the conform run names for a reference: "N of M <moved>: at position P in layer L ..."."""
    m = _conform_model(name)
    ties = m["ties"]
    first = ties["first"]
    return (f"{ties['explained']} of {ties['moved']}; the first, target {first['target_id']}: at position "
            f"{first['position']} in layer {first['layer']} llama.cpp kept pools {first['kept']} and transformers "
            f"{first['path_kept']}, tied within {first['margin']:.2g} (the engines' scores agree within "
            f"{first['agreement']:.2g} up to there)")


TABLES: dict[str, Callable[[], str]] = {
    "power-table": lambda: bench_table(BENCH_POWER),
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
    "ds4-strides": lambda: sweep_table([(stride_label(folder), folder) for folder in (
        f"trained/ds4-ablation/ctx768-hca-from512-seed0/strides/ctx768-hca-from512-seed0-pairs-S{s}-L768" for s in (4, 128))]),
    "fixes-ds4": lambda: fixes_table(DS4_TOP4_FIXED, OFFSETS4),
    "fixes-ds4-faithful": lambda: fixes_table(DS4_FAITHFUL_FIXED, OFFSETS4),
    "fixes-ds4-hca": lambda: fixes_table(DS4_HCA_FIXED, OFFSETS4),
    "fixes-csa": lambda: fixes_table(CSA_FIXED, OFFSETS4),
    "fixes-csa-tally": lambda: fix_tally(CSA_FIXED, "offsets4-mean"),
    "fixes-seeds-tally": lambda: fix_tally([("csa-disjoint-seed0", "csa-disjoint seed 0"), *SEEDS_FIXED], "offsets4-mean"),
    "fixes-csa-disjoint-tally": lambda: fix_tally([("csa-disjoint-seed0", "F32"), ("csa-disjoint-seed0-Q4_0", "Q4_0")],
                                                  "offsets4-mean"),
    "gated-tally-256": lambda: seed_tally([f"gated-L256-seed{k}" for k in range(3)], learned=True),
    "gated-tally-256-long": lambda: seed_tally([f"gated-L256-long-seed{k}" for k in range(3)], learned=True),
    "meanpool-gated-start-tally": lambda: seed_tally([f"meanpool-gated-start-seed{k}" for k in range(3)]),
    "dense-tally": lambda: seed_tally([f"dense-seed{k}" for k in range(3)]),
    "rolling-tally": lambda: seed_tally([f"rolling-seed{k}" for k in range(3)]),
    "stagger-head-tally": lambda: seed_tally([f"gated-stagger-head-seed{k}" for k in range(3)]),
    "capacity-h2-tally": lambda: seed_tally([f"gated-stagger-head-h2-seed{k}" for k in range(3)]),
    "glm-msa-tally": lambda: seed_tally([f"glm-msa-seed{k}" for k in range(3)], learned=True),
    "csa-dense-tally": lambda: seed_tally([f"engine/csa-dense-seed{k}" for k in range(3)]),
    "readme-offsets4-verdict": lambda: verdict_of("trained/fixes/csa-disjoint-seed0-offsets4-mean"),
    "verdict-examples": verdict_examples,
    "verdict-classes": verdict_classes,
    "conform-csa-disjoint": lambda: sweep_reading("trained/engine/csa-disjoint-seed0/sweep"),
    "conform-csa-top4": lambda: sweep_reading("trained/ds4-ablation/ctx128-top4-seed0/sweep"),
    "conform-glm-kpool-top4": lambda: sweep_reading("trained/engine/glm-kpool-top4-seed0/sweep"),
    "transformers-sweeps": transformers_sweeps,
    "transformers-pairs": transformers_pairs,
    "transformers-conform": transformers_conform,
    "transformers-glm-kpool-top4-ties": lambda: conform_tie("glm-kpool-top4"),
    "transformers-glm5-next-random-ties": lambda: conform_tie("glm5-next-random"),
    "transformers-csa-disjoint": lambda: sweep_reading("transformers/csa-disjoint-seed0"),
    "transformers-glm-kpool-top4": lambda: sweep_reading("transformers/glm-kpool-top4-seed0"),
    "ds4-stride128-density": lambda: density_phrase("trained/ds4-ablation/ctx768-hca-from512-seed0/strides/"
                                                    "ctx768-hca-from512-seed0-pairs-S128-L768"),
    "verdict-class-count": verdict_class_count,
    "meanpool-seed2-verdict": lambda: verdict_of("trained/meanpool-seed2/sweep"),
    "glm5-layout": lambda: trained_table(GLM5_LAYOUT, quantized=True, reference=True),
    "deepseek4-layout": lambda: trained_table(DEEPSEEK4_LAYOUT, quantized=True),
    "reports-contents": lambda: contents(ROOT / "reports" / "README.md"),
    "gated-contexts": lambda: trained_table(GATED_CONTEXTS),
    "readme-fixes": lambda: fixes_table([("csa-disjoint-seed0", "csa-disjoint seed 0")], FIX_NAMES),
    "fixes": lambda: fixes_table([("csa-disjoint-seed0", "csa-disjoint (deepseek4, llama.cpp)"),
                                  ("gated-seed0", "gated seed 0 (gpt2 + gate, reference)"),
                                  ("glm-dense-seed0", "glm-dense (glm5-next, llama.cpp; the dense twin)"),
                                  ("gated-offsets-random-seed0", "gated-offsets-random seed 0 (trained with random offsets)")],
                                 FIX_NAMES),
    "long-context": lambda: long_context_table(
        [("SmolLM2-135M Q4_1", "reports/example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024", "example"), LONG_CONTEXT[0],
         ("Gemma 3 270M Q4_K_M", "reports/calibrated/gemma-3-270m-q4_k_m-records-S4-calibrated", "calibrated"),
         LONG_CONTEXT[1]], ROOT / "reports"),
    "long-context-study": lambda: long_context_table(LONG_CONTEXT, ROOT / "reports"),
    "long-context-headlines": lambda: headline_list([(label, folder.removeprefix("reports/"))
                                                     for label, folder, _ in LONG_CONTEXT]),
    "calibrated-headlines": lambda: headline_list(CALIBRATED),
    "calibrated": lambda: calibrated_table(CALIBRATED),
    "post-hoc": lambda: sweep_table(POST_HOC),
    "post-hoc-verdicts": lambda: verdict_tally(POST_HOC),
    "long-context-verdicts": lambda: verdict_tally([(label, folder.removeprefix("reports/")) for label, folder, _ in LONG_CONTEXT]),
    "gated-tally": lambda: seed_tally([f"gated-seed{k}" for k in range(3)]),
    "csa-disjoint-tally": lambda: seed_tally([f"engine/csa-disjoint-seed{k}" for k in range(5)], learned=True),
    "csa-tally": lambda: seed_tally([f"engine/csa-seed{k}" for k in range(5)], learned=True),
    "glm-topk-tally": lambda: seed_tally(ds4_runs("glm"), learned=True),
    "glm-kpool-tally": lambda: seed_tally([f"engine/glm-kpool-seed{k}" for k in range(3)], learned=True),
    "glm-dense-verdict": lambda: verdict_of("trained/engine/glm-dense-seed0/sweep"),
    "post-hoc-fixes": lambda: sweep_table(POST_HOC_FIXES),
    "post-hoc-fixes-verdicts": lambda: verdict_tally(POST_HOC_FIXES),
    "post-hoc-fixes-n64-verdicts": lambda: verdict_tally([(label, f"{folder}-n64") for label, folder in POST_HOC_FIXES]),
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
    "gaps-stagger-layer": lambda: gaps_phrase([f"gated-stagger-layer-seed{k}" for k in range(3)]),
    "csa-disjoint-seed0": lambda: residues_phrase("engine/csa-disjoint-seed0"),
    "csa-seed0": lambda: residues_phrase("engine/csa-seed0"),
    "glm-kpool-seed0": lambda: residues_phrase("engine/glm-kpool-seed0"),
    "glm-kpool-seed1": lambda: gaps_phrase(["engine/glm-kpool-seed1"]),
    "csa-dense-seeds": lambda: gaps_phrase([f"engine/csa-dense-seed{k}" for k in range(3)], mean=True),
    "glm-msa-seeds": lambda: gaps_phrase([f"glm-msa-seed{k}" for k in range(3)], mean=True),
    "example-sweep-time": example_sweep_time,
    "example-headline": lambda: headline_quote("example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024"),
    "csa-disjoint-headline": lambda: headline_quote("trained/engine/csa-disjoint-seed0/sweep"),
    "example": example_phrase,
    "gemma-pilot": lambda: pilot_phrase("calibrated/gemma-3-270m-q4_k_m-records-S4-calibrated"),
    "stride128-cost": lambda: detect_cost_table(128, [30, 40, 50, 60], {1024: 1, 9216: 16}),
    "engine-sweep-times": engine_sweep_times,
    "training-times": training_times,
    "glm-training-minutes": lambda: training_minutes([f"engine/glm-kpool-seed{k}" for k in range(3)]),
    "glm-msa-training-minutes": lambda: training_minutes([f"glm-msa-seed{k}" for k in range(3)]),
    "rpc-agreement": lambda: agreement_phrase("servers/SmolLM2-in-process", "servers/SmolLM2-rpc-split"),
    "servers-scaling": lambda: servers_scaling(),
    "servers-rpc": lambda: servers_rpc(),
    "reference-f32": lambda: agreement_row(r"reference vs llama\.cpp on the F32 export.*"),
    "reference-q4": lambda: agreement_row(r"reference vs llama\.cpp"),
    "reference-flash": lambda: agreement_row(r"llama\.cpp with flash attention vs llama\.cpp"),
    "reference-f32-cache": lambda: agreement_row(r"llama\.cpp with F32 KV cache vs llama\.cpp"),
    "reference-ubatch": lambda: agreement_row(r"llama\.cpp with ubatch 128 vs llama\.cpp"),
    "reference-threads": lambda: agreement_row(r"llama\.cpp with one thread vs llama\.cpp"),
    "reference-imitation": lambda: agreement_row(r"reference imitating llama\.cpp's roundings vs llama\.cpp"),
    "reference-lead": lambda: agreement_row(r"llama\.cpp's lead at the tokens where the reference picks another"),
    "reference-clear-share": agreement_clear_share,
    "reference-clear": lambda: agreement_row(r"reference vs llama\.cpp on the \d+% of tokens .*"),
    "reference-ffn": lambda: agreement_row(r"reference's feed-forward of every layer.*"),
    "reference-ffn-imitation": lambda: agreement_row(r"imitation's feed-forward of every layer.*"),
    "gaps-jitter": lambda: gaps_phrase([f"gated-offsets-jitter-seed{k}" for k in range(3)]),
    "post-hoc-gaps": lambda: gap_span([f"reference/{design}-S{stride}" for design in ("blocktopk", "kpool")  # meanpool: 0%
                                       for stride in (4, 8)] + [folder for _, folder in POST_HOC_FIXES]),
    "post-hoc-dips": lambda: dip_span([f"reference/{design}-S{stride}" for design in ("blocktopk", "kpool", "meanpool")
                                       for stride in (4, 8)] + [folder for _, folder in POST_HOC_FIXES]),
    "post-hoc-dense-gap": lambda: _gap(_reports("reference/dense")) + " points",
    "unlearned-heldout": lambda: heldout_phrase([f"{design}-seed{k}" for design in ("meanpool", "kpool") for k in range(3)]),
    "rolling-means": lambda: means_phrase([f"rolling-seed{k}" for k in range(3)]),
    "gaps-meanpool-gated-start": lambda: gaps_phrase([f"meanpool-gated-start-seed{k}" for k in range(3)]),
    "gated-256-long-gaps": lambda: learned_gaps_by_context([f"gated-L256-long-seed{k}" for k in range(3)]),
    "gated-S8-256-long-gaps": lambda: learned_gaps_by_context([f"gated-S8-L256-long-seed{k}" for k in range(3)]),
    "rolling-verdicts": lambda: seed_verdicts([f"rolling-seed{k}" for k in range(3)]),
    "offsets-random-verdicts": lambda: seed_verdicts([f"gated-offsets-random-seed{k}" for k in range(3)]),
    "stagger-head-verdicts": lambda: seed_verdicts([f"gated-stagger-head-seed{k}" for k in range(3)]),
    "gated-256-heldout": lambda: heldout_phrase([f"gated-L256-seed{k}" for k in range(3)]),
    "gated-256-long-heldout": lambda: heldout_phrase([f"gated-L256-long-seed{k}" for k in range(3)]),
    "ds4-gaps-from128": lambda: gaps_between(ds4_runs("csa"), 13, 17, 128),
    "ds4-learned-from128-tally": lambda: learned_tally_from(ds4_runs("csa"), 128),
    "fixes-ds4-tally": lambda: fix_tally(DS4_TOP4_FIXED, "offsets4-mean"),
    "fixes-ds4-hca-tally": lambda: fix_tally(DS4_HCA_FIXED, "offsets4-mean"),
    "fixes-ds4-faithful-tally": lambda: fix_tally(DS4_FAITHFUL_FIXED, "offsets4-mean"),
    "knockout-phase3": lambda: knockout_phrase("trained/probes/knockout", 3, ["L0H2", "L0H3"]),
    "flip-smollm2": lambda: flip_phrase("example-flip-SmolLM2-L256"),
    "probe-examples": lambda: headline_list([(folder.removeprefix("example-"), folder) for folder in PROBE_EXAMPLES]),
    "fix-csa-disjoint-offsets4": lambda: fix_verdict("csa-disjoint-seed0-offsets4-mean"),
    "fix-csa-disjoint-q4-offsets4": lambda: fix_verdict("csa-disjoint-seed0-Q4_0-offsets4-mean"),
    "glm-kpool-learned": lambda: seed_verdicts([f"engine/glm-kpool-seed{k}" for k in (0, 1)]),
    "glm-kpool-plateau": lambda: heldout_phrase(["engine/glm-kpool-seed2"]) + " held-out, its sweep "
                                 + sweep_reading("trained/engine/glm-kpool-seed2/sweep"),
    "glm-dense-engine": lambda: sweep_reading("trained/engine/glm-dense-seed0/sweep"),
    "glm-gates": lambda: "; ".join(f"layer {layer}: " + gate_spread("trained/engine/glm-kpool-seed0/probes/gate-activations",
                                                                      layer, "kpool-indexer") for layer in (1, 2)),
    "glm-heads": lambda: largest_knockout("trained/engine/glm-kpool-seed0/probes/knockout"),
    "glm-flip": lambda: flip_summary("trained/engine/glm-kpool-seed0/probes/flip"),
    "glm-cycle": lambda: cycle_boundary("trained/engine/glm-kpool-seed0/probes/cycle"),
    "glm-dense-q4": lambda: sweep_reading("trained/engine/glm-dense-seed0/sweep-Q4_0"),
    "glm-kpool-top4": lambda: heldout_phrase(["engine/glm-kpool-top4-seed0"]) + " held-out, its sweep "
                              + sweep_reading("trained/engine/glm-kpool-top4-seed0/sweep"),
    "gemma-16k": lambda: (sweep_reading("long-context/gemma-3-270m-q4_k_m-records-S4-L16384") + ", log-probability p = "
                          + _p(_reports("long-context/gemma-3-270m-q4_k_m-records-S4-L16384")["logprob_test"]["p_value"])),
    "post-hoc-dense-mean": lambda: f"{fixed(_reports('reference/dense')['mean_accuracy'], 0)}%",
    "post-hoc-meanpool-correct": lambda: correct_of([f"reference/meanpool-S{stride}" for stride in (4, 8)]),
    "post-hoc-fix-means": lambda: means_change([folder for _, folder in POST_HOC_FIXES]),
    "post-hoc-fix-means-n64": lambda: means_change([f"{folder}-n64" for _, folder in POST_HOC_FIXES]),
    "post-hoc-blocktopk-n64": lambda: (sweep_reading("reference/blocktopk-S4-n64") + ", periodicity "
                                       f"{fixed(_reports('reference/blocktopk-S4-n64')['periodicity'])} points; "
                                       + dip_clause(_reports("reference/blocktopk-S4-n64"))),
    "post-hoc-unlearned-means": lambda: _span([_reports(f"reference/{design}-S{stride}")["mean_accuracy"]
                                               for design in ("kpool", "meanpool") for stride in (4, 8)], "%"),
    "engine-csa-disjoint-learned": lambda: learned_summary([f"engine/csa-disjoint-seed{k}" for k in range(5)]),
    "engine-csa-learned": lambda: learned_summary([f"engine/csa-seed{k}" for k in range(5)]),
    "csa-dense-seed2-heldout": lambda: heldout_phrase(["engine/csa-dense-seed2"]),
    "csa-dense-seed2-positions": lambda: position_accuracy("trained/engine/csa-dense-seed2/sweep", [(16, 23), (40, 47)]),
    "csa-dense-seed0-batches": lambda: batch_accuracy("engine/csa-dense-seed0", [300, 400, 500]),
    "csa-dense-seed2-batches": lambda: batch_accuracy("engine/csa-dense-seed2", [500, 700]),
    "engine-reference": lambda: reference_agreements(DEEPSEEK4_LAYOUT),
    "engine-plateau": lambda: heldout_phrase([f"engine/csa-disjoint-seed{k}" for k in (1, 4)] + ["engine/csa-seed4"]),
    "engine-quantized": lambda: quantized_shift([f"engine/{d}-seed{k}" for d, n in (("csa-disjoint", 5), ("csa", 5),
                                                                                   ("csa-dense", 3)) for k in range(n)]),
    "engine-slots-csa-disjoint": lambda: slots_ahead("trained/engine/csa-disjoint-seed0/probes/knockout-slots", 4),
    "engine-slots-csa": lambda: slots_ahead("trained/engine/csa-seed0/probes/knockout-slots", 4),
    "engine-heads": lambda: largest_knockout("trained/engine/csa-disjoint-seed0/probes/knockout"),
    "engine-flip-csa-disjoint": lambda: flip_summary("trained/engine/csa-disjoint-seed0/probes/flip"),
    "engine-flip-csa": lambda: flip_summary("trained/engine/csa-seed0/probes/flip"),
    "engine-cycle": lambda: cycle_boundary("trained/engine/csa-disjoint-seed0/probes/cycle"),
    "engine-gates": lambda: gate_spread("trained/engine/csa-disjoint-seed0/probes/gate-activations", 0, "csa-compressor"),
    "ds4-top4-128-gaps": lambda: learned_gaps_by_context(DS4["ctx128-top4"].runs()),
    "ds4-128-gaps": lambda: learned_gaps_by_context(DS4["ctx128"].runs()),
    "ds4-top4-hca-heldout": lambda: heldout_phrase(DS4["ctx256-top4-hca"].runs() + DS4["ctx256-top4-hca3"].runs()),
    "ds4-top4-128-plateau": lambda: heldout_phrase([DS4["ctx128-top4"].runs()[k] for k in (1, 3)]),
    "ds4-hca-seed0-heldout": lambda: heldout_phrase(DS4["ctx256-hca-long"].runs()[:1]),
    "ds4-csa-256-span": lambda: learned_gap_span(ds4_runs("csa"), 256),
    "ds4-hca-seed1-before": lambda: gap_of(DS4["ctx256-hca-long"].runs()[1]),
    "ds4-hca-seed1-after": lambda: gap_of(DS4["ctx256-hca-cont"].runs()[1]),
    "ds4-top4-hca-long-heldout": lambda: heldout_phrase(DS4["ctx256-top4-hca-long"].runs()),
    "ds4-faithful-256-profile": lambda: profile_stats(DS4["ctx256-top4-from-hca"].runs()),
    "ds4-faithful-512-profile": lambda: profile_stats(DS4["ctx512-top4-hca-from256"].runs()),
    "ds4-faithful-seed2": lambda: (gap_of(DS4["ctx256-hca-long"].runs()[2]) + " without the indexer and "
                                   + gap_of(DS4["ctx256-top4-from-hca"].runs()[2]) + " with it"),
    "ds4-faithful-seed1": lambda: (gap_of(DS4["ctx256-hca-long"].runs()[1]) + " without the indexer and "
                                   + gap_of(DS4["ctx256-top4-from-hca"].runs()[1]) + " with it"),
    "ds4-published": published_phrase,
    "ds4-published-firsts": lambda: _and([fixed(PUBLISHED_DEEPSEEK4[r]) for r in (0, 4)]) + "%",
    "ds4-published-gap": lambda: f"{fixed(max(PUBLISHED_DEEPSEEK4) - min(PUBLISHED_DEEPSEEK4))} points",
    "gated-learned-by": lambda: learned_by_step([f"gated-seed{k}" for k in range(3)]),
    "gated-peak-gaps": lambda: peak_gaps([f"gated-seed{k}" for k in range(3)]),
    "rolling-minutes": lambda: training_minutes([f"rolling-seed{k}" for k in range(3)]),
    "rolling-learned-by": lambda: learned_by_step([f"rolling-seed{k}" for k in range(3)]),
    "offsets-random-means": lambda: means_phrase([f"gated-offsets-random-seed{k}" for k in range(3)]),
    "stagger-head-means": lambda: means_phrase([f"gated-stagger-head-seed{k}" for k in range(3)]),
    "meanpool-gated-start-minutes": lambda: training_minutes([f"meanpool-gated-start-seed{k}" for k in range(3)]),
    "meanpool-gated-start-switch": lambda: stage_batch_accuracy([f"meanpool-gated-start-seed{k}" for k in range(3)], "gate_steps"),
    "meanpool-gated-start-fall": lambda: stage_batch_accuracy([f"meanpool-gated-start-seed{k}" for k in range(3)], "gate_steps",
                                                        100),
    "glm-msa-seed0-learned-by": lambda: learned_by_step(["glm-msa-seed0"]),
    "glm-kpool-heldout": lambda: heldout_phrase([f"engine/glm-kpool-seed{k}" for k in range(3)]),
    "glm-dense-heldout": lambda: heldout_phrase(["engine/glm-dense-seed0"]),
    "gated-256-minutes": lambda: training_minutes([f"gated-{s}L256-seed{k}" for s in ("", "S8-") for k in range(3)]),
    "gated-256-3000-minutes": lambda: training_minutes([f"gated-{s}L256-long-seed{k}" for s in ("", "S8-")
                                                        for k in range(3)]),
    "cowa-offsets-random-sweep": lambda: sweep_reading("trained/cowa-offsets-random-seed0/sweep"),
    "cowa-heldout": lambda: heldout_phrase([f"cowa-seed{k}" for k in range(3)] + ["cowa-stagger-head-seed0",
                                                                             "cowa-offsets-random-seed0"]),
    "cowa-minutes": lambda: training_minutes([f"cowa-seed{k}" for k in range(3)]
                                             + ["cowa-stagger-head-seed0", "cowa-offsets-random-seed0"]),
    "ds4-64-span": lambda: learned_gap_span(DS4["ctx64"].runs(), 64),
    "ds4-faithful-span": lambda: _span([s["gap"] for s in learned_sweeps(ds4_runs("faithful"))]),
    "ds4-faithful-slot-costs": lambda: slot_pair_costs([f"trained/{run}/probes/knockout-slots"
                                                        for run in DS4["ctx256-top4-from-hca"].runs()], 4),
    "ds4-faithful-slot0": lambda: _and([f"seed {k}: " + knockout_phrase(f"trained/ds4-ablation/ctx256-top4-from-hca-seed{k}/"
                                                                         "probes/knockout-slots", 3, ["L0P0"]) for k in (1, 2, 0)]),
    "ds4-faithful-hca-heads": lambda: _and([largest_knockout(f"trained/ds4-ablation/ctx256-top4-from-hca-seed{k}/probes/knockout",
                                                             "L1") + f" at seed {k}" for k in range(3)]),
    "ds4-128-slots": lambda: slots_ahead("trained/ds4-ablation/ctx128-seed0/probes/knockout-slots", 4),
    "ds4-128-heads": lambda: largest_knockout("trained/ds4-ablation/ctx128-seed0/probes/knockout"),
    "ds4-stride128-dip": lambda: dip_clause(_reports("trained/ds4-ablation/ctx768-hca-from512-seed0/strides/"
                                                     "ctx768-hca-from512-seed0-pairs-S128-L768")),
    "glm-128-scratch": lambda: heldout_phrase(DS4["glm-ctx128-top4"].runs()) + " held-out, its sweep "
                               + sweep_reading(f"trained/{DS4['glm-ctx128-top4'].runs()[0]}/sweep"),
    "glm-128-seed0-batches": lambda: batch_accuracy(DS4["glm-ctx128-top4-from64"].runs()[0], [100, 900]),
    "dense-long": lambda: training_outcome("dense-long-seed0"),
    "dense-long-sweep": lambda: sweep_reading("trained/dense-long-seed0/sweep"),
    "dense-L3": lambda: training_outcome("dense-L3-seed0"),
    "dense-L3-sweep": lambda: sweep_reading("trained/dense-L3-seed0/sweep"),
    "dense-L16": lambda: training_outcome("dense-L16-seed0"),
    "gated-S2-L16": lambda: training_outcome("gated-S2-L16-seed0"),
    "dense-copy-L16": lambda: heldout_phrase([f"dense-copy-L16-seed{k}" for k in (0, 1)]),
    "dense-copy-L32": lambda: heldout_phrase(["dense-copy-L32-seed0"]),
    "dense-copy-64": lambda: training_outcome("dense-copy-seed0"),
    "dense-copy-64-sweep": lambda: sweep_reading("trained/dense-copy-seed0/sweep"),
    "dense-copy-64-warmup": lambda: stage_batch_accuracy(["dense-copy-seed0"], "copy_steps"),
    "gated-S8-long-plateau": lambda: means_phrase(["gated-S8-L256-long-seed1"]),
    "gated-256-seed0-gap": lambda: gap_of("gated-L256-seed0"),
    "gated-256-seed0-mean": lambda: means_phrase(["gated-L256-seed0"]),
    "gated-64-means": lambda: means_phrase([f"gated-seed{k}" for k in range(3)]),
    "gated-256-long-minutes": lambda: training_minutes([f"gated-L256-long-seed{k}" for k in range(3)]),
    "gated-1500-seed0-gaps": lambda: gap_of("gated-L256-seed0") + " at S = 4 against " + gap_of("gated-S8-L256-seed0")
                                     + " at S = 8",
    "meanpool-seed2-chance": lambda: _residue_extremes("trained/meanpool-seed2/sweep"),
    "gated-gates": lambda: gate_bias_spread("trained/probes/gates"),
    "gated-cycle": lambda: cycle_rolls([f"trained/probes/cycle-k{k}" for k in (1, 2, 3)]),
    "gated-head0": lambda: component_by_phase("trained/probes/knockout", "L0H0"),
    "gated-fixed-learned": lambda: learned_summary([f"gated-seed{k}" for k in range(3)]),
    "gated-layer1": lambda: largest_knockout("trained/probes/knockout", "L1"),
    "gated-gate-layer0": lambda: gate_spread("trained/probes/gate-activations", 0, "trained-gated"),
    "gated-gate-dominant": lambda: dominant_phase("trained/probes/gate-activations", 0, "trained-gated"),
    "gated-gate-layer1": lambda: gate_spread("trained/probes/gate-activations", 1, "trained-gated"),
    "gated-slots": lambda: slots_ahead("trained/probes/knockout-slots", 4),
    "gated-flip": lambda: flip_summary("trained/probes/flip"),
    "meanpool-gated-start-heldout": lambda: heldout_phrase([f"meanpool-gated-start-seed{k}" for k in range(3)]),
    "meanpool-gated-start-seed1": lambda: sweep_reading("trained/meanpool-gated-start-seed1/sweep"),
    "capacity-fixed-gaps": lambda: gap_span([f"trained/gated-seed{k}/sweep" for k in range(3)]),
    "capacity-staggered-gaps": lambda: gap_span([f"trained/{name}-seed{k}/sweep" for _, name in CAPACITY[:-1]
                                                 for k in range(3)]),
    "capacity-h2-means": lambda: means_phrase([f"gated-stagger-head-h2-seed{k}" for k in range(3)]),
    "capacity-h2-dips": lambda: gaps_phrase([f"gated-stagger-head-h2-seed{k}" for k in (1, 2)]),
    "capacity-h8-means": lambda: means_phrase([f"gated-stagger-head-h8-seed{k}" for k in range(3)]),
    "capacity-h8-gaps": lambda: gap_span([f"trained/gated-stagger-head-h8-seed{k}/sweep" for k in range(3)]),
    "capacity-d128-means": lambda: means_phrase([f"gated-stagger-head-h8-d128-seed{k}" for k in range(3)]),
    "capacity-d128-dips": lambda: gaps_phrase([f"gated-stagger-head-h8-d128-seed{k}" for k in range(3)]),
    "capacity-h4-seed1-logprob": lambda: _p(_reports("trained/gated-stagger-head-seed1/sweep")["logprob_test"]["p_value"]),
    "capacity-minutes": lambda: training_minutes([f"{name}-seed{k}" for _, name in CAPACITY[:-1] for k in range(3)]),
    "capacity-d128-minutes": lambda: training_minutes([f"gated-stagger-head-h8-d128-seed{k}" for k in range(3)]),
    "capacity-h2-gaps": lambda: _and([fixed(_reports(f'trained/gated-stagger-head-h2-seed{k}/sweep')['gap']) for k in range(3)]),
    "theory-threshold": lambda: f"{fixed(_reports('theory/S4-beta6')['uniform_point']['threshold_beta'], 2)}",
    "theory-rates": theory_rates,
    "theory-times": theory_times,
    "theory-fixed-point": theory_fixed_point,
    "theory-onehot-boundary": lambda: f"{fixed(100 * _theory_case('S4-beta3', 4, 'none')['accuracy'][-1])}%",
    "theory-split": lambda: gate_groups("S4-beta16-rho0.35", 4, "none"),
    "theory-staggered": theory_staggered,
    "theory-near-uniform": theory_near_uniform,
    "theory-sharp": theory_sharp,
    "theory-lean": theory_lean,
    "theory-stagger4-seed0": lambda: f"{fixed(100 * _theory_case('S4-beta6', 4, 'component')['gap'])}",
    "theory-boundary-split": lambda: theory_boundary("S4-beta16-rho0.35", 4),
    "theory-onehot-phases": lambda: theory_boundary("S4-beta3", 4),
    "theory-trade": lambda: theory_trade(4),
    "theory-stability": theory_stability_table,
    "theory-end-states": lambda: theory_cases_table(ROOT / "docs"),
    "theory-rolled": lambda: theory_rolled_boundary("S4-beta16", 2),
    "theory-k8-beta3-split": lambda: theory_split_counts("S4-beta3", 8, "component"),
    "theory-k2-staggered": lambda: f"{fixed(100 * _theory_case('S4-beta16', 2, 'component')['gap'])}",
    "theory-k2-staggered-beta3": lambda: f"{fixed(100 * _theory_case('S4-beta3', 2, 'component')['gap'])}",
    "theory-k8-staggered": lambda: (f"{fixed(100 * _theory_case('S4-beta6', 8, 'component')['gap'])} at beta = 6; "
                                    f"{fixed(100 * _theory_case('S4-beta3', 8, 'component')['gap'])} at beta = 3"),
    "fix-csa-retrained-plain": lambda: _and([fix_verdict(f"csa-seed{k}-retrained-plain") for k in (2, 3)]),
    "csa-study-gaps": lambda: gap_span([f"trained/engine/csa-seed{k}/sweep" for k in range(4)]),
    "fix-csa-disjoint-mean": lambda: fix_change("csa-disjoint-seed0", "offsets4-mean"),
    "fix-csa-disjoint-two": lambda: fix_change("csa-disjoint-seed0", "offsets2-mean"),
    "fix-csa-disjoint-two-verdict": lambda: verdict_of("trained/fixes/csa-disjoint-seed0-offsets2-mean"),
    "fix-gated-verdict": lambda: verdict_of("trained/fixes/gated-seed0-offsets4-mean"),
    "fix-csa-retrained-tally": lambda: verdict_tally([(f"seed {k}", f"trained/fixes/csa-seed{k}-retrained-plain")
                                                      for k in (1, 2, 3)]),
    "fix-csa-disjoint-max": lambda: fix_change("csa-disjoint-seed0", "offsets4-max"),
    "fix-csa-disjoint-random": lambda: fix_change("csa-disjoint-seed0", "random-offset"),
    "fix-gated-mean": lambda: fix_change("gated-seed0", "offsets4-mean"),
    "fix-glm-dense-mean": lambda: fix_change("glm-dense-seed0", "offsets4-mean"),
    "fix-offsets-random-mean": lambda: fix_change("gated-offsets-random-seed0", "offsets4-mean"),
    "fix-csa-disjoint-q4-mean": lambda: fix_change("csa-disjoint-seed0-Q4_0", "offsets4-mean"),
    "fix-csa-disjoint-shifts": lambda: shifts_phrase("csa-disjoint-seed0-offsets4-mean"),
    "fix-gated-shifts": lambda: shifted_loss("gated-seed0-offsets4-mean"),
    "fix-cost": lambda: bench_offsets_phrase(FIXES / "bench.md"),
    "conform-engine-bugs": lambda: conform_table("engine-bugs"),
    "conform-time": lambda: conform_time("engine-bugs/unpatched-llama.cpp"),
    "conform-paths": lambda: conform_paths_table("paths"),
    "conform-paths-time": lambda: conform_time("paths/unpatched-llama.cpp"),
    "conform-path-bugs": lambda: conform_path_bugs_table("path-bugs"),
    "engine-routes": lambda: engine_routes_table(ENGINE_ROUTES),
    "vllm-routes-bench": lambda: vllm_routes_phrase(VLLM / "bench.md"),
}


def bench_ratios(output: Path, column: str) -> dict[str, str]:
    """One column of the markdown table a bench's output holds (a page under reports/ quoting its console),
    by the table's first column: {setup: value}."""
    rows = _markdown_rows(output)
    at = rows[0].index(column)
    return {row[0]: row[at] for row in rows[2:]}


VLLM = ROOT / "reports" / "servers" / "vllm"  # issue 72: one plan in process, through vLLM by each route, through lm-eval
ENGINE_ROUTES = [("in process (llama.cpp, the Q4_1 GGUF)", "SmolLM2-L384-in-process"),
                 ("vLLM, --scoring forced (prompt logprobs)", "SmolLM2-L384-vllm-forced"),
                 ("vLLM, --scoring generate (prefix cache)", "SmolLM2-L384-vllm-generate"),
                 ("lm-eval local-completions on llama-server, imported", "SmolLM2-L384-lm-eval-llama-server")]


def engine_routes_table(runs: list[tuple[str, str]]) -> str:
    """The same plan by each engine and route, against the first run, target by target: the report's class,
    the flags equal to the first's, the answers' log-probabilities apart (where the route gives them) and
    the tokens the engine evaluated per target (manifest.json; lm-eval's samples record none)."""
    folders = [VLLM / folder for _, folder in runs]
    tables = _by_target(*folders)
    rows = []
    for (label, _), folder, table in zip(runs, folders, tables):
        summary, manifest = _read(folder, "summary.json"), _read(folder, "manifest.json")
        given = table["logprob"].notna()
        apart = (table["logprob"] - tables[0]["logprob"]).abs()[given]
        spread = (f"{apart.max():.2f} / {apart.median():.2f} on {int(given.sum())}" if given.any() else "not given")
        tokens = manifest.get("tokens_evaluated", 0)
        rows.append([f"[{label}](../{folder.relative_to(ROOT)}/report.md)",  # linked from docs/server.md
                     verdict(summary), _mean(summary), f"{int((table['correct'] == tables[0]['correct']).sum())} of "
                     f"{len(table)}", spread, f"{tokens / len(table):.0f}" if tokens else "not recorded"])
    return _table(["engine and route", "verdict", "mean accuracy (95% CI)", "flags equal to in process",
                   "log-prob apart, max / median (nats)", "tokens evaluated per target"], rows)


def vllm_routes_phrase(output: Path) -> str:
    """bench_vllm_routes.py's ratio of targets/s, its plan and its flags' agreement (reports/servers/vllm/bench.md)."""
    text = output.read_text(encoding="utf-8")
    ratio = re.search(r"generate / forced targets/s: ([\d.]+)x; tokens evaluated: ([\d.]+)x fewer", text)
    plan = re.search(r"(\d+) contexts of (\d+) tokens, (\d+) targets \((\d+) per context\)", text)
    flags = re.search(r"exact-match flags equal on (\d+ of \d+) targets", text)
    speed = bench_ratios(output, "targets/s")
    return (f"{ratio.group(1)}x the forced route's targets/s ({speed['generate']} against {speed['forced']}), "
            f"{ratio.group(2)}x fewer tokens evaluated, on {plan.group(1)} contexts of {plan.group(2)} tokens "
            f"({plan.group(4)} targets each, the task's density); exact-match flags equal on {flags.group(1)} targets")


def servers_scaling() -> str:
    """bench_servers.py's targets/s through 1, 2 and 4 llama-servers against in process (reports/servers/bench.md)."""
    x = bench_ratios(SERVERS_BENCH, "x in process")
    return (f"{x['1 llama-server (1 thread each)']}x the in-process targets/s through one llama-server, "
            f"{x['2 llama-servers (1 thread each)']}x through two and {x['4 llama-servers (1 thread each)']}x through four")


def servers_rpc() -> str:
    """bench_servers.py's one llama-server over two rpc-servers against in process (reports/servers/bench.md)."""
    x = bench_ratios(SERVERS_BENCH, "x in process")["1 llama-server over 2 rpc-servers"]
    return f"{x}x through one llama-server whose layers sit on two local rpc-servers"


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


def conform_paths_table(study: str) -> str:
    """Each engine path of each model in a study's conform runs (their conform.json `paths`): one row
    per backend, model and path, its verdict, where it differed most, and by how much."""
    rows = []
    base = ROOT / "reports" / "conform" / study
    for folder in sorted(base.rglob("conform.json"), key=lambda f: (f.parent.relative_to(base).parts[0], str(f))):
        run = json.loads(folder.read_text())
        link = os.path.relpath(folder.parent / "report.md", ROOT / "docs")  # the table's page is in docs/
        for model in run["models"]:
            for path in model.get("paths", []):
                ran = path["status"] != "cannot run"
                where = (f"{path['length']}-token context (residue {path['length'] % path['stride']})"
                         if ran else "-")
                rows.append([f"[{folder.parent.relative_to(base).parts[0]}]({link})", model["name"], path["path"],
                             path["status"], where if ran else "-",
                             f"{path['max_difference']:.3g}" if ran else "-",
                             f"{len(path['failed_lengths'])}" if ran else "-", path["reason"] or _tie_words(path)])
    return _table(["backend", "model", "path", "verdict", "largest difference after", "nats",
                   "contexts beyond the tolerance", "why"], rows)


def _tie_words(path: dict) -> str:
    """Where an indexer tie explains a path's moved answer (`conform.ties`), or "-"."""
    ties = [f"indexer tie at position {t['position']}, layer {t['layer']} (kept pools {t['kept']} as one prompt, "
            f"{t['path_kept']} on the path; tied within {t['margin']:.2g})" for t in path.get("ties", [])]
    return "; ".join(ties) or "-"


def conform_path_bugs_table(study: str) -> str:
    """Each build of a planted-defect study by engine path: the models that PASS it, and each one that
    FAILs with where and by how much (the models' own verdicts beside: a path defect moves the sweep's
    scoring too when the sweep rides on that path)."""
    rows = []
    base = ROOT / "reports" / "conform" / study
    # a run of every model (in process), or one per model (llama-server: each its own server and folder)
    for build in sorted((d for d in base.iterdir() if d.is_dir()),
                        key=lambda d: (not d.name.startswith("unpatched"), d.name.endswith("server"), d.name)):
        runs = sorted(build.rglob("conform.json"))
        link = os.path.relpath(runs[0].parent / "report.md", ROOT / "docs")
        models = [model for run in runs for model in json.loads(run.read_text())["models"]]
        failed_models = ", ".join(m["name"] for m in models if m["status"] == "FAIL") or "-"
        for name in dict.fromkeys(p["path"] for m in models for p in m.get("paths", [])):
            checks = [(m["name"], p) for m in models for p in m.get("paths", []) if p["path"] == name]
            fails = [f"{model} ({_path_where(p)}, {p['max_difference']:.3g} nats)"
                     for model, p in checks if p["status"] == "FAIL"]
            fails += [f"{model} (UNDECIDED: an indexer tie)" for model, p in checks if p["status"] == "UNDECIDED"]
            count = {status: str(sum(p["status"] == status for _, p in checks)) for status in ("PASS", "cannot run")}
            rows.append([f"[{build.name}]({link})", name, count["PASS"], count["cannot run"], "; ".join(fails) or "-",
                         failed_models])
    return _table(["build", "path", "models passing", "cannot run",
                   "models failing it (where, largest difference), or UNDECIDED", "models failing their own check"], rows)


def _path_where(path: dict) -> str:
    """The residue a failing path names, or none when it failed after every context it tried."""
    if len(path["failed_lengths"]) < path.get("tried", 0):
        if "failed_answer_residues" in path:  # issue 70 on: the residues where the moved answers start
            residues = path["failed_answer_residues"]
            return f"answers at residue{'s' if len(residues) > 1 else ''} {', '.join(map(str, residues))}"
        return f"residue {path['length'] % path['stride']}"
    return "every context"


def conform_time(relative: str) -> str:
    """A conform run's whole time and its models' scoring (its conform.json)."""
    run = _read(ROOT / "reports" / "conform" / relative, "conform.json")
    scoring = sum(model["seconds"] for model in run["models"])
    return f"{fixed(run['wall_time_s'], 0)} s for {len(run['models'])} models ({fixed(scoring, 0)} s of it scoring)"


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


# Hand-typed numbers: the prose of a document may state no measured result of its own. What counts
# as one: a percentage, a decimal, a power of ten, "N of M", or an amount of points, nats or time.
# What is not prose: generated blocks, code, HTML comments, link targets. What is not a result
# (ALLOWED, each with its reason): levels and bars the tool is built on, versions, sizes, dates.
NOT_PROSE = [BLOCK, re.compile(r"^ *```.*?^ *```", re.S | re.M), re.compile(r"`[^`\n]*`"), re.compile(r"<!--.*?-->", re.S),
             re.compile(r"\]\([^)\s]*\)"), re.compile(r"https?://\S+"),
             re.compile(r"\b(?:Python|python|version|llama\.cpp b)\s?\d+(?:\.\d+)+\+?|\b\d+\.\d+\.\d+\b"),  # versions
             re.compile(r"(?<![\w.])\d+(?:\.\d+)? ?(?:[KMGT]i?B|bytes)\b"),  # sizes
             re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),  # dates
             re.compile(r"\b(?:rho|beta|lr|S|K|D)\s?=\s?\d+(?:\.\d+)?\b")]  # a setting of a run, not its result
_START = r"(?<![\w.\-/^])"
HAND_NUMBER = re.compile(
    _START + r"\d+(?:\.\d+)?(?:[x×](?![\w(])| times\b)"  # a ratio, "4x", "13 times"
    r"|" + _START + r"[-+]?\d+(?:\.\d+)?(?:e-?\d+)?(?:-\d+(?:\.\d+)?)?%"  # a percentage or a range of them
    r"|" + _START + r"[-+]?\d+\.\d+(?:e-?\d+)?(?![\d.])|" + _START + r"\d+e-\d+"  # a decimal, a power of ten
    r"|" + _START + r"\d+ of \d+(?!\w)"  # a count
    r"|" + _START + r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? (?:points|nats|seconds|minutes|min|hours|s)\b"  # an amount
    r"|" + _START + r"[-−]\d+(?:\.\d+)?(?: to [-−+]?\d+(?:\.\d+)?)?(?![\w.-])"  # a signed number, a range with a minus
    r"|(?<=within )\d+(?:,\d{3})*(?!\w)|(?<=after )\d+(?:,\d{3})*(?= steps)|(?<=by step )\d+(?:,\d{3})*")  # a count of steps a run took
ALLOWED = {"80%": "the bar a trained model must reach, and the power a detectable dip is computed at",
           "95%": "the level of every interval", "0.05": "alpha", "5%": "alpha",
           "40-80%": "`--calibrate`'s default band", "30%": "a default budget (the pilot's, the dense steps')",
           "0%": "the floor of an accuracy", "100%": "the ceiling of an accuracy", "0-100%": "an accuracy's range",
           "90%": "the share of one answer that makes a run degenerate (analysis.DEGENERATE_SHARE)",
           "0.00025": "the smallest p 4,000 permutations give, 1 / 4001",
           "98%": "the highest base accuracy bench_power.py simulates",
           "20 points": "the dip a run is planned for and told the targets of (analysis.PLANNED_DIP, `--detect 20`)",
           "93%": "the coverage under which a report says its mean interval falls short (report.SHORT_COVERAGE)"}


TABLE_NUMBER = re.compile(r"^[-+~]?\d[\d,]*(?:\.\d+)?\s?(?:%|s|ms|min|x|K|M|points)?$")  # a table cell that is a number


def prose(text: str) -> str:
    """`text` with what is not prose (NOT_PROSE) blanked, its line numbers kept."""
    for pattern in NOT_PROSE:
        text = pattern.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return text


def hand_numbers(text: str) -> list[tuple[int, str]]:
    """The measured-looking numbers a document's prose holds outside generated blocks: (line, number),
    ALLOWED ones left out; and the numbers in the body cells of a table written by hand."""
    text = prose(text)
    found = [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in HAND_NUMBER.finditer(text)]
    lines = [line.strip() for line in text.split("\n")]
    for number, line in enumerate(lines, 1):
        header = number == 1 or not lines[number - 2].startswith("|")
        if line.startswith("|") and not header and not re.fullmatch(r"[|:\- ]+", line):
            found += [(number, cell.strip()) for cell in line.strip().strip("|").split("|")
                      if TABLE_NUMBER.match(cell.strip())]
    return sorted((found for found in found if found[1] not in ALLOWED), key=lambda found: found[0])


# Verdict words: a verdict is the report's, so prose names one only inside a generated block, or on the pages that
# define the classes. Method words the reports no longer use stand only in a sentence that says they are retired.
DEFINING = {"docs/glossary.md", "docs/statistics.md"}
VERDICT_WORDS = re.compile(
    r"\b(?:compressor\s+inactive|inconclusive|uninformative(?:\s+at\s+the\s+floor|,\s+too\s+few\s+targets)?|degenerate|no\s+(?:phase\s+)?effect\s+at\s+this\s+power|too\s+few\s+targets|at\s+the\s+floor"
    r"|accuracy\s+depends\s+on\s+the\s+token\s+phase|no\s+phase\s+effect\s+larger\s+than|control\s+run:"
    r"|(?:reads?|reading|verdicts?|class(?:es)?|an?)\s+[\"*_]?effects?\b(?!\s+of|\s+on|\s+size)"
    r"|effect\s+at\s+(?:\d+|every|all|one|two|three|seeds?))\b", re.I)
DEFINITION_LINK = re.compile(r"\[[^\]\n]+\]\((?:[^)\s]*/)?(?:glossary|statistics)\.md#[^)\s]+\)")  # a word sent to its definition
RETIRED = re.compile(r"\bbias[- ]corrected\b|\bbootstrap\w*\b(?=[^.]*\bgap\b)|\bgap\b[^.]*\bbootstrap\w*\b", re.I)
# a sentence that says a method is retired, or is about the one bootstrap still used: compare's gap difference
RETIRING = re.compile(r"\b(?:retired|no longer|replaced|used to|before issue|differences?|minus|compare)\b", re.I)


def verdict_words(text: str, page: str = "") -> list[tuple[int, str]]:
    """Verdict words the prose of `page` names outside generated blocks (none on a DEFINING page), and method
    words the reports no longer use in a sentence that does not say so: (line, words)."""
    text = prose(DEFINITION_LINK.sub(lambda m: " " * len(m.group(0)), text))
    found = [] if page in DEFINING else [(m.start(), m.group(0)) for m in VERDICT_WORDS.finditer(text)]
    for m in RETIRED.finditer(text):
        sentence = text[max(text.rfind(".", 0, m.start()), text.rfind("\n\n", 0, m.start())) + 1:
                        text.find(".", m.end()) % (len(text) + 1)]
        if not RETIRING.search(sentence):
            found.append((m.start(), m.group(0)))
    return [(text.count("\n", 0, at) + 1, " ".join(words.split())) for at, words in sorted(found)]


# What a lint of digits and verdict words cannot see (issue 74): counts in words of what runs or the code hold, absence
# written as absence, and references to nothing. A count of classes comes from the code (the `verdict-classes` phrase);
# a run's density from its folders; "no phase effect" only as the report words it ("... at this power", "... larger
# than"); "(measured)" only beside a link to what measured it; "PAGE has the table" only where PAGE holds one.
NUMBER_WORD = r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
RUN_COUNT = re.compile(rf"\b(?:{NUMBER_WORD}|\d+) (?:verdict )?(?:classes|verdicts)\b"
                       rf"|\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve) of them\b"
                       r"|\b\d+ targets? (?:per|a|in each) context\b", re.I)
ABSENCE = re.compile(r"\bflat(?:-at-chance)?\b|\bno weak spot\b|\bno phase effect\b(?! at this power| larger than)"
                     r"|\babsence\b(?! of evidence)(?<!evidence of absence)", re.I)
MEASURED_MARK = re.compile(r"\(measured\)")
LINK_TARGET = re.compile(r"\]\((?P<target>[^)#\s]+)[^)\s]*\)")
TABLE_CLAIM = re.compile(r"(?P<ref>\S+\)|`[^`]+`|\S+) (?:has|holds) the table")
SECTION_LINK = re.compile(r"\]\((?P<page>[^)#\s]+)#(?P<anchor>[^)\s]+)\)")


def _sentence(text: str, at: int) -> str:
    """The sentence of `text` around position `at` (a full stop or a blank line ends one)."""
    start = max(text.rfind(". ", 0, at), text.rfind("\n\n", 0, at)) + 1
    end = min((i for i in (text.find(". ", at), text.find("\n\n", at)) if i >= 0), default=len(text))
    return text[start:end]


def _links_a_measurement(sentence: str, page: Path) -> bool:
    """Whether `sentence` (of `page`) links what measured it: a run folder (its report.md or the folder), a bench's
    recorded output, or a file under bench/."""
    for m in LINK_TARGET.finditer(sentence):
        target = (page.parent / m["target"]).resolve()
        folder = target.parent if target.name == "report.md" else target
        in_bench = target.is_relative_to(ROOT) and "bench" in target.relative_to(ROOT).parts[:2]
        run_folder = (folder / "config.json").is_file() or (folder / "conform.json").is_file()
        if run_folder or in_bench or target.suffix in (".csv", ".txt"):
            return True
    return False


def _section_has_table(page: Path, anchor: str) -> bool:
    """Whether the section of `page` whose heading's anchor is `anchor` (GitHub's: lower case, spaces to hyphens,
    punctuation dropped) holds a markdown table."""
    if not page.is_file():
        return False
    sections = re.split(r"^(#+ .*)$", page.read_text(encoding="utf-8"), flags=re.M)
    for heading, body in zip(sections[1::2], sections[2::2]):
        slug = re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")
        if slug == anchor:
            return bool(re.search(r"^\s*\|[- :|]+\|\s*$", body, re.M))
    return False


def run_words(text: str, page: str = "") -> list[tuple[int, str]]:
    """What a page's prose says of runs that no digit lint sees (RUN_COUNT, ABSENCE; the DEFINING pages may name
    the report's absence words), "(measured)" with no link in its sentence, and "... has the table" that is not a link
    to a section holding one (relative to `page`, the repository-relative path): (line, words)."""
    raw = BLOCK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)  # links kept: "(measured)" is supported by one
    text = prose(text)

    def at(of: str, m: re.Match) -> tuple[int, int, str]:  # (line, column, words): sorted as they stand
        return of.count("\n", 0, m.start()) + 1, m.start() - of.rfind("\n", 0, m.start()), m.group(0)

    found = [at(text, m) for m in RUN_COUNT.finditer(text)]
    found += [] if page in DEFINING else [at(text, m) for m in ABSENCE.finditer(text)]
    found += [at(raw, m) for m in MEASURED_MARK.finditer(raw)
              if not _links_a_measurement(_sentence(raw, m.start()), ROOT / page) and prose(raw[m.start():m.end()]).strip()]
    for m in TABLE_CLAIM.finditer(raw):
        link = SECTION_LINK.search(m["ref"])
        if not link or not _section_has_table((ROOT / page).parent / link["page"], link["anchor"]):
            found.append(at(raw, m))
    return [(line, " ".join(words.split())) for line, _, words in sorted(found)]


FOLDER_LINK = re.compile(r"\]\((?P<target>[^)#\s]+?)/?(?:report\.md)?\)|`(?P<path>(?:reports/)?trained/[^`\s]+?)/?`")


def audit(document: Path) -> list[tuple[int, str]]:
    """The sentences of a document outside its generated blocks and code that name a run folder (a link to
    one, or its path in backticks), with their lines: what a reviewer reads against the folder."""
    text = BLOCK.sub(lambda m: f"[claims:{m['name']}]" + "\n" * m.group(0).count("\n"), document.read_text())
    text = NOT_PROSE[1].sub(lambda m: "\n" * m.group(0).count("\n"), text)  # code blocks
    found = []
    for sentence in re.finditer(r"[^.!?\n](?:[^.!?\n]|\.(?=\w)|\n(?![\n#]))*[.!?]?", text):  # a paragraph or heading ends one
        folders = [(document.parent / (m["target"] or "")) if m["target"] else ROOT / "reports" / m["path"].removeprefix("reports/")
                   for m in FOLDER_LINK.finditer(sentence.group(0))]
        if any((folder / "config.json").is_file() for folder in folders):
            found.append((text.count("\n", 0, sentence.start()) + 1, " ".join(sentence.group(0).split())))
    return found


def _script(name: str):
    """A study script of scripts/ loaded as a module (they are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fixes_page() -> str:
    """reports/trained/fixes/fixes.md as `scripts/fixes_study.py` writes it, from the fix folders alone."""
    return _script("fixes_study").page()


TRAINED = ROOT / "reports" / "trained"


def trained_study_page() -> str:
    """reports/trained/study.md as `scripts/train_study_figure.py` writes it: every trained model's final sweep."""
    study = _script("train_study_figure")
    return study.table(study.runs(TRAINED)) + "\n"


# pages a script writes from run folders that prose sends readers to: rewritten (or checked) with the documents,
# so that a re-report cannot leave them stale
DERIVED: dict[Path, Callable[[], str]] = {FIXES / "fixes.md": fixes_page, TRAINED / "study.md": trained_study_page}

# Every .md under README, docs/ and reports/ that prints a result is on one of two lists (tests/project/test_claims.py
# fails on one that is on neither): CHECKED, what `--check` regenerates and compares (the documents' blocks, with the
# hand-written prose linted, and the DERIVED pages whole); WRITTEN, what a command or a measuring script writes whole
# and `--check` does not rerun (`written_by` names the writer).
# the measurements a script or bench recorded, each with the command that writes it (they quote no run folder)
MEASURED = {"reports/reference-agreement.md": "scripts/reference_agreement.py",
            "reports/trained/engine/agreement.md": "scripts/engine_agreement.py",
            "reports/trained/fixes/bench.md": "bench/bench_offsets.py (its console, quoted)",
            "reports/trained/ds4-ablation/bench_train.md": "bench/bench_train.py (its console, quoted)",
            "reports/servers/bench.md": "bench/bench_servers.py (its console, quoted)",
            "reports/servers/echo-logprobs.md": "scripts/check_echo_logprobs.py (its console, quoted)",
            "reports/bench-power/README.md": "bench/bench_power.py (how output.txt was made)"}


def checked_pages() -> list[Path]:
    """The pages `--check` covers: every document's blocks, and the DERIVED pages whole."""
    return [*DOCUMENTS, *DERIVED]


def written_by(page: Path) -> str | None:
    """What writes `page` whole, when `--check` does not: the command that made its run folder (rebuilt by
    scripts/rereport_all.py), or the script of a MEASURED page; None for a page no tool writes."""
    folder = page.parent
    if page.name == "report.md" and any((folder / name).is_file() for name in ("config.json", "conform.json")):
        return "its run folder's command (`kvphase report` rebuilds it; scripts/rereport_all.py)"
    if page.name == "comparison.md" and (folder / "comparison.csv").is_file():
        return "`kvphase compare` (scripts/rereport_all.py compares its comparison.csv's runs again)"
    return MEASURED.get(page.relative_to(ROOT).as_posix())


def uncovered_pages() -> list[tuple[Path, str]]:
    """The .md pages under README, docs/ and reports/ that print a number or a verdict word (as `hand_numbers` and
    `verdict_words` read a page) and are neither checked nor written by a tool: (page, first such word)."""
    checked = {page.resolve() for page in checked_pages()}
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "reports").rglob("*.md"))]:
        if page.resolve() in checked or written_by(page):
            continue
        text = page.read_text(encoding="utf-8")
        printed = [word for _, word in hand_numbers(text) + verdict_words(text, "")]
        if printed:
            found.append((page, printed[0]))
    return found


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
    parser.add_argument("documents", nargs="*", type=Path,
                        help="the documents to rewrite or check (default: README.md, reports/*.md and docs/)")
    parser.add_argument("--check", action="store_true", help="compare only, every sweep's statistics recomputed from its results.csv; exit 1 naming "
                             "each block that differs")
    parser.add_argument("--hand-numbers", action="store_true",
                        help="list, by document and line, the measured-looking numbers the prose holds outside its "
                             "blocks (tests/project/test_claims.py allows none)")
    parser.add_argument("--audit", action="store_true",
                        help="print, for each document, the sentences outside its generated blocks that name a run "
                             "folder, for a reviewer to read against it")
    args = parser.parse_args()
    if args.audit:
        for document in args.documents or HAND_WRITTEN:
            if not document.is_file():
                parser.error(f"{document}: no such document")
            for line, sentence in audit(document):
                print(f"{document.resolve().relative_to(ROOT) if document.resolve().is_relative_to(ROOT) else document}:"
                      f"{line}: {sentence}")
        return 0
    if args.hand_numbers:
        for document in HAND_WRITTEN:
            for line, number in hand_numbers(document.read_text()):
                print(f"{document.relative_to(ROOT)}:{line}: {number}")
        return 0
    sys.path.insert(0, str(ROOT))
    global RECOMPUTE
    RECOMPUTE = args.check
    stale = []
    for document in args.documents or DOCUMENTS:
        if not document.is_file():
            parser.error(f"{document}: no such document")
        text = document.read_text()
        try:
            new = regenerate(text)
        except KeyError as error:
            parser.error(f"{document}: a block no table builds: {error}")
        if new != text:
            stale.append(document.resolve().relative_to(ROOT) if document.resolve().is_relative_to(ROOT) else document)
            if not args.check:
                document.write_text(new)
    for page, build in DERIVED.items() if not args.documents else ():
        if page.read_text() != (new := build()):
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new)
    for document in stale:
        print(f"{document}: {'differs from its run folders' if args.check else 'rewritten'}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
