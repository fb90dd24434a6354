"""report.md of a conform run: one line per model, then each model's residues."""

from __future__ import annotations

import pandas as pd

from kvphase.runfolder import ReportPage, markdown_table


def headline(run) -> str:
    counts = {status: sum(o.status == status for o in run.outcomes)
              for status in ("PASS", "FAIL", "UNDECIDED", "cannot run")}
    said = (f"{run.engine}: {counts['PASS']} PASS, {counts['FAIL']} FAIL, "
            + (f"{counts['UNDECIDED']} UNDECIDED, " if counts["UNDECIDED"] else "") + f"{counts['cannot run']} cannot run")
    # a path's FAIL fails the run: the line says so even when every model's own check passed, before
    # the models' reasons (long ones, which the console cuts)
    paths = [f"{o.name}'s {p.path} ({p.moved})" for o in run.outcomes for p in o.paths if p.status == "FAIL"]
    said += f"; engine paths FAIL: {', '.join(paths)}" if paths else ""
    failed = [f"{o.name} ({o.reason})" for o in run.outcomes if o.status == "FAIL"]
    said += f"; {'; '.join(failed)}" if failed else ""
    undecided = [f"{o.name}'s {p.path}" for o in run.outcomes for p in o.paths if p.status == "UNDECIDED"]
    undecided += [f"{o.name} (every target that moved from the folder)" for o in run.outcomes if o.status == "UNDECIDED"]
    if undecided:
        said += (f"; UNDECIDED (an indexer tie broken another way, no engine defect shown): "
                 f"{', '.join(undecided)}")
    return said + "."


def models_table(run) -> str:
    rows = []
    for o in run.outcomes:
        c = o.check
        rows.append({"model": o.name, "verdict": o.status, "check": c.check if c else "",
                     "targets": c.targets if c else 0, "flags differing": c.flags_differing if c else "",
                     "largest log-prob difference": f"{c.max_logprob_difference:.3g}" if c else "",
                     "gap difference (95% CI)": f"{c.gap.difference:+.1f} ({c.gap.ci_low:+.1f} to {c.gap.ci_high:+.1f})"
                     if c else "", "why": o.reason})
    return markdown_table(pd.DataFrame(rows))


def residues_table(check) -> str:
    rows = [{"residue": r.residue, "n": r.n, "folder %": f"{r.committed:.1f}",
             "folder 95% CI": f"{r.committed_ci[0]:.1f} to {r.committed_ci[1]:.1f}", "engine %": f"{r.engine:.1f}",
             "difference (90% CI)": f"{r.difference:+.1f} ({r.ci_low:+.1f} to {r.ci_high:+.1f})",
             "equivalent": "yes" if r.equivalent else "no", "flags differing": r.flags_differing,
             "largest log-prob difference": f"{r.max_logprob_difference:.3g}"} for r in check.residues]
    return markdown_table(pd.DataFrame(rows))


def paths_table(run) -> str:
    rows = [{"model": o.name, "path": p.path, "verdict": p.status,
             "where": p.where if not p.reason else "",
             "largest difference (nats)": f"{p.max_difference:.3g}" if not p.reason else "",
             "mean": f"{p.mean_difference:.2g}" if not p.reason else "", "why": p.reason or p.tie_note}
            for o in run.outcomes for p in o.paths]
    return markdown_table(pd.DataFrame(rows))


def conform_page(run, choice) -> ReportPage:
    sections = [("Models", models_table(run))]
    if any(o.paths for o in run.outcomes):
        sections.append(("Engine paths against one prompt", paths_table(run)))
    sections += [(f"{o.name}: residue by residue", residues_table(o.check)) for o in run.outcomes if o.check]
    return ReportPage(
        title=f"Conformance of {run.engine}",
        headline=headline(run),
        prose=("Each reference model ran through the engine on its committed folder's plan (the first "
               f"{choice.contexts or 'all'} contexts, whole rounds of residues) and is compared target by target "
               "with the folder. A trained model (check: profile) passes when at every residue the engine's accuracy "
               f"minus the folder's, on the same targets, has its 90% paired interval within +-{choice.margin:g} points "
               "(two one-sided tests at 5%); a random-weight model (check: logprobs) passes when no target's answer "
               f"log-probability moved more than {choice.logprob_tolerance:g} nats. cannot run: the engine lacks the "
               "architecture; such a model is not counted as passing."
               + (" Through transformers, each target that moved from the folder is scored again as one prompt by "
                  "both engines with their indexer selections recorded; a model is UNDECIDED when every one of them "
                  "moved after a token whose indexer scores tied at the edge of the kept pools, where the two engines "
                  "kept different tied pools (torch.topk and llama.cpp's partial sort break ties their own ways)."
                  if any(o.ties for o in run.outcomes) else "")
               + (" An engine path passes when its answers' log-probabilities stay within its tolerance of the same "
                  "text scored as one prompt; it is UNDECIDED when it moved only after a token whose indexer scores "
                  "tied at the edge of the kept pools, where llama.cpp kept another of the tied pools (neither side "
                  "is shown wrong, and the run does not fail for it)." if any(o.paths for o in run.outcomes) else "")),
        sections=sections,
        measured=[f"the whole check: {run.wall_time_s:.1f} s (the references' plans built and checked, every model "
                  "run)"] + [f"{o.name}: {o.seconds:.1f} s" for o in run.outcomes],
        files="conform.json holds every number on this page; <model>/results.csv the engine's rows.")
