"""A run folder's human side: `summary.json`, `report.md` and `accuracy_by_residue.png`,
rebuilt from `config.json` and `results.csv` alone. Computes no statistics itself."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvphase.errors import PlanError, RunFolderError
from kvphase.runfolder import (REPORT_FILE, SUMMARY_FILE, ReportPage, check_writable, figure, figure_link,
                               markdown_table, write_atomic, write_json)
from kvphase.statistics.intervals import COVERAGE_RUNS
from kvphase.statistics.stratified import format_p, p_text
from kvphase.statistics.printed import fixed
from kvphase.sweep.analysis import PLANNED_DIP, Summary, per_group, summarize, summarize_shifts, with_shifts
from kvphase.sweep.offsets import OFFSETS_FILE
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.positions import MEAN_TOLERANCE
from kvphase.sweep.query_phases import QueryPhaseSummary, summarize_query_phases
from kvphase.sweep.reach_check import recorded_inactive
from kvphase.runfolder.rows import check_planned_rows
from kvphase.sweep.run import RESULTS_FILE, load_manifest, load_offsets, load_plan, load_results
from kvphase.sweep.selection import selection_section
from kvphase.sweep.tasks import load_task

FIGURE_FILE = "accuracy_by_residue.png"
SHIFT_FIGURE_FILE = "accuracy_by_shift.png"  # under an offset ensemble: each shift alone and combined
ANSWER_FIGURE_FILE = "accuracy_by_answer_residue.png"  # where the answer's phase was planned


def build_report(run_dir: Path) -> Summary:
    """Write summary.json, report.md and the figure for a run folder; return the summary."""
    run_dir = Path(run_dir)
    plan = load_plan(run_dir)
    results = load_results(run_dir)
    check_planned_rows(run_dir / RESULTS_FILE, results, plan)
    if results.empty:
        raise RunFolderError(f"{run_dir} has no scored targets yet; run the sweep first")
    manifest = load_manifest(run_dir)
    check_writable(run_dir, [SUMMARY_FILE, FIGURE_FILE, REPORT_FILE])
    summary = run_summary(plan, results, manifest)
    shifts = _shift_section(plan, results, load_offsets(run_dir), summary, run_dir)
    selection = selection_section(results, summary.worst_residue)
    query = summarize_query_phases(results, plan.modulus, plan.seed)
    write_json(run_dir / SUMMARY_FILE, {**summary.to_json(), **({"query_phases": query.to_json()} if query else {})})
    plot_accuracy([(run_dir.name, summary)], plan.stride, run_dir / FIGURE_FILE)
    if summary.answer_axis is not None:
        check_writable(run_dir, [ANSWER_FIGURE_FILE])
        plot_answer_axis(summary, plan.stride, run_dir / ANSWER_FIGURE_FILE)
    write_atomic(run_dir / REPORT_FILE, render_markdown(plan, summary, manifest, shifts, selection,
                                                        query_phase_section(query), answer_phase_section(summary)))
    return summary


def task_chance(plan: SweepPlan) -> float:
    """What guessing among the task's values scores (a fraction); 0 when the task's file is gone."""
    try:
        return load_task(plan.task).chance
    except PlanError:
        return 0.0


def run_summary(plan: SweepPlan, results: pd.DataFrame, manifest: dict) -> Summary:
    """A run folder's statistics as its report states them: the task's chance, and whether its compressor
    touched a target (from the manifest), and what `--calibrate` can turn on the task and whether it chose the
    setting (the advice of a silent headline). Every reader of a folder's summary computes it here."""
    return summarize(results, plan.stride, plan.modulus, plan.seed, control=plan.control, chance=task_chance(plan),
                     compressor_inactive=recorded_inactive(manifest, plan),
                     knobs=list(_calibration_knobs(plan.task)), calibrated=bool(plan.calibration),
                     answer_phases=plan.answer_phases)


def _shift_section(plan: SweepPlan, results: pd.DataFrame, offsets: pd.DataFrame, summary: Summary,
                   run_dir: Path) -> tuple:
    """The report's section on phase shifts (`sweep.offsets`): under an ensemble, each shift alone
    beside the combined score, with their figure; under random offsets, the shifts drawn. () without."""
    offset_plan = plan.offset_plan
    if not offset_plan.active or offsets.empty:
        return ()
    prose = (f"Phase shifts: {offset_plan.describe()}. Residues are the unshifted plan's; each shift's own "
             f"scores are in `{OFFSETS_FILE}`.")
    if len(offset_plan.shifts) < 2:
        drawn = per_group(with_shifts(results, offsets), "shift")[["shift", "n", "correct", "accuracy", "ci_low",
                                                                   "ci_high"]]
        return ("Phase shifts", prose, rows_table(drawn.to_dict("records")))
    alone = summarize_shifts(results, offsets, plan.stride, plan.modulus, plan.seed, task_chance(plan))
    rows = [(f"shift {d}", s) for d, s in alone.items()] + [(f"combined ({offset_plan.combine})", summary)]
    check_writable(run_dir, [SHIFT_FIGURE_FILE])
    plot_accuracy(rows, plan.stride, run_dir / SHIFT_FIGURE_FILE)
    table = pd.DataFrame([{"scored": label, "mean accuracy %": f"{fixed(s.mean_accuracy, 2)} ({fixed(s.mean_ci[0], 2)} to "
                           f"{fixed(s.mean_ci[1], 2)})", "worst residue": f"{s.worst_residue}: {fixed(s.worst_accuracy, 2)}",
                           "gap (points)": f"{fixed(s.gap, 2)} ({fixed(s.gap_ci[0], 2)} to {fixed(s.gap_ci[1], 2)})",
                           "p": p_text(s.test).removeprefix("= "), "verdict": s.verdict} for label, s in rows])
    return ("Phase shifts", prose, markdown_table(table),
            figure_link(SHIFT_FIGURE_FILE, "accuracy by residue under each shift"))


TABLE_DIGITS = {"mean_logprob": 4}  # decimals a rows table prints a column with; 2 for any other


def rows_table(rows: list[dict]) -> str:
    """A markdown table of a summary's rows (per residue, per phase), each float rounded once as printed."""
    return markdown_table(pd.DataFrame([{key: fixed(value, TABLE_DIGITS.get(key, 2)) if isinstance(value, float) else value
                                         for key, value in row.items()} for row in rows]))


def query_phase_section(query: QueryPhaseSummary | None) -> tuple:
    """The report's section on the query's phase (`sweep.query_phases`); () for a run whose queries
    all sit at one residue."""
    if query is None:
        return ()
    tests = pd.DataFrame([{"test": t.name, "statistic": f"{t.statistic:.4g}",
                           "p": "not computed" if t.p_value is None else format_p(t.p_value), "how": t.note}
                          for t in (query.query_test, query.interaction_test)])
    return ("Per query residue",
            "Each context's query starts at its own residue (query_pos mod M); accuracy in percent with a 95% Wilson "
            "interval (targets counted as independent). The query's phase is a property of the context, so both "
            "tests permute whole contexts' labels; the interaction test compares residue profiles within contexts.",
            rows_table(query.per_query), markdown_table(tests))


def unplanned_answer_note(plan: SweepPlan) -> str:
    """One line for a run whose answer's phase was not planned ('' where it was): its report.md reads as
    before answer phases, and this says what it could not see."""
    if plan.answer_phases:
        return ""
    return ("Note: this run's answer phase was not planned (a folder written before answer phases, or a plan "
            "without them): its answers start where each query's own length puts them, so its verdict reads "
            "the target's phase only and says nothing of where generation starts.")


def answer_phase_section(summary: Summary) -> tuple:
    """The report's section on where generation starts (the answer's residue, answer_pos mod M): its own
    numbers and the three tests read with Holm's rule; () where the answer's phase was not planned."""
    answer = summary.answer_axis
    if answer is None:
        return ()
    adjusted = summary.adjusted
    tests = pd.DataFrame([
        {"test": name, "statistic": f"{test.statistic:.4g}", "df": test.dof, "p": p_text(test).removeprefix("= "),
         "Holm-adjusted p": format_p(adjusted[axis]), "how": test.note}
        for axis, name, test in (("target", "target residue (accuracy)", summary.test),
                                 ("answer", "answer residue (accuracy)", answer.test),
                                 ("interaction", "target x answer residue", summary.interaction))])
    dip = ("none fits" if answer.detectable_dip is None else
           f"{answer.detectable_dip:.1f} points (one answer residue that far below the rest is found 80% of the time)")
    overview = pd.DataFrame([
        ("worst answer residue", f"{answer.worst_residue}: {answer.worst_accuracy:.2f}%"),
        ("best answer residue", f"{answer.best_residue}: {answer.best_accuracy:.2f}%"),
        ("gap (best - worst)", f"{answer.gap:.2f} points ({answer.gap_interval_text()})"),
        ("log-probability test by answer residue", f"p {p_text(answer.logprob_test)}"),
        ("smallest answer-residue dip detectable (80% power)", dip),
        ("verdict of this axis alone", answer.verdict)], columns=["quantity", "value"])
    return ("Per answer residue (where generation starts)",
            "Each target's answer starts at its own residue (answer_pos mod M: the context's length plus the query's "
            "tokens, a pad of 0 to M - 1 tokens before the question included), every residue equally often in every "
            "context and crossed with the target's residue. Accuracy in percent with a 95% Wilson interval; the "
            "answer's residue is tested as the target's is, stratified by context, and the three accuracy tests are "
            "read together with Holm's step-down rule (family-wise error 5%). The pad (a space, or spaces and the "
            "context's last token) is part of what the model reads, and its length goes with the answer's residue: "
            "a model that reads its question worse after a longer pad shows that on this axis too, so an effect "
            "here is the engine's only where the same plan through another engine (a reference, an unpatched "
            "build) shows none.",
            markdown_table(overview), markdown_table(pd.DataFrame(answer.per_residue)), markdown_table(tests),
            figure_link(ANSWER_FIGURE_FILE, "accuracy by the answer's residue"))


def plot_accuracy(runs: list[tuple[str, Summary]], stride: int, path: Path) -> None:
    """Accuracy by residue with 95% Wilson intervals, saved to `path` (`draw_accuracy`)."""
    with figure(path, **_accuracy_figure_size(runs)) as (fig, ax):
        draw_accuracy(ax, runs, stride)


def plot_answer_axis(summary: Summary, stride: int, path: Path) -> None:
    """Both phase axes side by side: accuracy by the target's residue and by the answer's, with 95%
    Wilson intervals (`draw_accuracy`), saved to `path`."""
    with figure(path, 1, 2, figsize=(11, 3.8), dpi=120) as (fig, (by_target, by_answer)):
        draw_accuracy(by_target, [("by the target's residue", summary)], stride)
        draw_accuracy(by_answer, [("by the answer's residue", summary.answer_axis)], stride)
        by_answer.set_xlabel(f"residue of the answer's first token position (answer_pos mod {len(summary.per_residue)})")


def accuracy_figure(runs: list[tuple[str, Summary]], stride: int):
    """The figure `plot_accuracy` saves, as a matplotlib Figure (on the Agg canvas, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**_accuracy_figure_size(runs))
    FigureCanvasAgg(fig)
    draw_accuracy(fig.subplots(), runs, stride)
    fig.tight_layout()
    return fig


def _accuracy_figure_size(runs: list) -> dict:
    many = len(runs) > 3  # then the legend goes beside the axes (`draw_accuracy`): a wider figure
    return {"figsize": (10.5 if many else 7, 4.2 if many else 3.8), "dpi": 120}


def draw_accuracy(ax, runs: list[tuple[str, Summary]], stride: int) -> None:
    """Accuracy by residue with 95% Wilson intervals; dotted lines mark stride cycles."""
    import matplotlib

    many = len(runs) > 3  # then the legend goes beside the axes, where it hides no point
    if len(runs) > 10:  # the default cycle repeats after 10 colours
        ax.set_prop_cycle(color=matplotlib.colormaps["tab20"].colors)
    width = 0.8 / max(1, len(runs))
    moduli = set()
    for i, (label, summary) in enumerate(runs):
        table = pd.DataFrame(summary.per_residue)
        moduli.add(int(table["residue"].max()) + 1)
        x = table["residue"] + (i - (len(runs) - 1) / 2) * width
        # clipped: at 0% or 100% the unrounded Wilson end can sit a rounding error inside the accuracy
        err = [(table["accuracy"] - table["ci_low"]).clip(lower=0), (table["ci_high"] - table["accuracy"]).clip(lower=0)]
        ax.errorbar(x, table["accuracy"], yerr=err, fmt="o-", capsize=3, label=label)
    modulus = max(moduli)
    for cycle in range(stride, modulus, stride):
        ax.axvline(cycle - 0.5, color="gray", linestyle=":", linewidth=1)
    ax.set_xticks(range(modulus))
    mods = ", ".join(str(m) for m in sorted(moduli))
    ax.set_xlabel(f"residue of the target's first token position (mod {mods}); dotted: stride {stride} cycles")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.grid(axis="y", alpha=0.3)
    if many:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8, loc="best")


def _depth_sentence(summary: Summary) -> str:
    """Whether depth confounds residue: the plan gives every residue group the same mean position
    (within MEAN_TOLERANCE of the common mean, as `check_matched_positions` reads it) and spread,
    except where the context has room for a single depth per residue (a large modulus in a short
    context: `positions.residue_slots` then moves whole groups, means up to M apart)."""
    means = [row["position_mean"] for row in summary.per_residue]
    if max(abs(mean - sum(means) / len(means)) for mean in means) <= MEAN_TOLERANCE:
        return ("Target positions have the same mean and standard deviation in every residue group, so depth does "
                "not confound residue.")
    return (f"Target positions do not have the same mean in every residue group (from {fixed(min(means), 0)} to "
            f"{fixed(max(means), 0)}: the context has room for few depths at this modulus), so depth and residue are "
            "confounded within that range; a trend with depth can read as a phase effect.")


def render_markdown(plan: SweepPlan, summary: Summary, manifest: dict, shifts: tuple = (),
                    selection: tuple = (), query: tuple = (), answer: tuple = ()) -> str:
    """The report a person reads: headline first, then the numbers and how they were made."""
    model = manifest.get("model", {})
    return ReportPage(
        title=f"Phase sensitivity: {Path(plan.model).name}",
        headline=summary.headline(),
        prose="\n\n".join(note for note in (_compression_note(plan), _difficulty_warning(plan, summary)) if note),
        sections=[
            ("Over residues", markdown_table(pd.DataFrame(_overview_rows(summary), columns=["quantity", "value"])),
             figure_link(FIGURE_FILE, "accuracy by residue")),
            ("Per residue",
             "Accuracy in percent with a two-sided 95% Wilson interval (each target counted as independent, so "
             f"the intervals are somewhat narrow when contexts differ). {_depth_sentence(summary)}",
             rows_table(summary.per_residue)),
            (f"Per phase (position mod {plan.stride})", rows_table(summary.per_phase)),
            *([shifts] if shifts else []),
            *([selection] if selection else []),
            *([query] if query else []),
            *([answer] if answer else []),
        ],
        measured=[
            f"Model: `{Path(plan.model).name}` ({model.get('architecture', '?')}, {model.get('quantization', '?')}, "
            f"sha256 `{model.get('sha256', '?')[:16]}...`), backend {plan.describe_backend()}.",
            f"Task `{plan.task}`; contexts of {plan.context} tokens, {_query_start(plan)}; "
            f"stride S = {plan.stride}, residues mod M = {plan.modulus}; {plan.per_residue} targets per residue "
            f"in {summary.n_contexts} contexts of {summary.targets_per_context:.4g} targets on average; {plan.padding} "
            f"padding; seed {plan.seed}.",
            _clustering_line(summary),
            *([f"Chosen by kvphase to fit this model, not the default: {plan.adjusted}."] if plan.adjusted else []),
            _difficulty_line(plan),
            "Scoring is teacher-forced: a target is correct when every answer token is the argmax given the "
            "answer tokens before it (greedy exact match); the answer's log-probability is recorded.",
            "Tests: " + STATISTICS_NOTE,
            f"Wall time {manifest.get('wall_time_s', '?')} s over {manifest.get('sessions', '?')} session(s), "
            f"{manifest.get('tokens_evaluated', '?')} tokens evaluated; versions {manifest.get('versions', {})}.",
            f"Machine: {describe_machine(manifest)}",
            "What reproduces elsewhere: " + REPRODUCIBILITY_NOTE,
        ],
        files="Files: `config.json` (the plan), `results.csv` (one row per target), `summary.json`, `manifest.json`. "
              "`kvphase report <this folder>` rebuilds this page from the first two.",
    ).markdown()


def _query_start(plan: SweepPlan) -> str:
    return _context_end(plan) + (  # folders without answer phases read as they did
        f"; each answer starts at its own residue mod {plan.modulus} (a pad of 0 to {plan.modulus - 1} tokens "
        "before its question)" if plan.answer_phases else "")


def _context_end(plan: SweepPlan) -> str:
    if plan.query_phases:
        return (f"each query starts at position {plan.context} plus its context's query phase (0 to "
                f"{plan.modulus - 1} filler tokens before the footer)")
    return f"every query starts at position {plan.context}"


SHORT_COVERAGE = 0.93  # a mean interval that held the mean less often than this in simulation is said so in prose


def _clustering_line(summary: Summary) -> str:
    """How alike a context's targets were, and what that costs the mean and spares the test."""
    if summary.icc is None:
        why = ("every context holds one target, so targets are independent" if summary.targets_per_context == 1
               else "correctness never varies, or the run has one context")
        return f"Intra-context correlation of correctness: not measured ({why})." + _short_coverage_note(summary)
    independent = summary.n_targets / summary.design_effect
    return (f"Intra-context correlation of correctness {summary.icc:.2g} (design effect {fixed(summary.design_effect)}: "
            f"for the mean accuracy, {summary.n_targets} targets carry the information of {fixed(independent, 0)} "
            "independent ones); the stratified test compares residues within contexts, so a context effect "
            "cancels there." + _short_coverage_note(summary))


def _coverage_clause(summary: Summary) -> str:
    if summary.mean_coverage is None:
        return ""
    return f"; it held the true mean in {summary.mean_coverage:.0%} of {COVERAGE_RUNS} runs simulated like this one"


def _short_coverage_note(summary: Summary) -> str:
    """The mean interval's simulated coverage in words, where it falls short of what "95%" says."""
    if summary.mean_coverage is None or summary.mean_coverage >= SHORT_COVERAGE:
        return ""
    return (f" The mean's interval falls short of 95% on this design ({summary.n_contexts} contexts): in {COVERAGE_RUNS} runs "
            f"simulated like this one it held the true mean {summary.mean_coverage:.0%} of the time, so read it as an "
            f"interval of about that level; the test, which compares residues within contexts, is not affected.")


def _compression_note(plan: SweepPlan) -> str:
    """Where the compression came from when not from the model itself ("" when it did)."""
    if plan.control:
        return (f"This is a **control run**: the model declares no KV-cache compression, so the stride "
                f"S = {plan.stride} is the user's choice and no phase effect is expected from compression. "
                f"At alpha = 0.05, one control run in twenty rejects by chance alone.")
    if plan.backend == "reference":
        return f"Compression applied post hoc by the numpy reference model: {plan.describe_backend()}."
    return ""


CEILING, FLOOR = 95.0, 5.0  # mean accuracy (%) beyond which a dip has little room to show


def _difficulty_warning(plan: SweepPlan, summary: Summary) -> str:
    """A warning when the mean accuracy is near the ceiling or the floor, where even a large weak
    spot barely moves the numbers ("" in between)."""
    mean = summary.mean_accuracy
    if FLOOR <= mean <= CEILING:
        return ""
    side = "easy" if mean > CEILING else "hard"
    if plan.calibration:
        advice = "even the setting `--calibrate` chose (below) is outside its band: see where its pilot stopped"
    elif _calibration_knobs(plan.task):
        advice = ("`kvphase sweep --calibrate` chooses the context and task for this model, aiming at a mean accuracy "
                  "of 40-80% where a dip shows best")
    else:
        advice = f"task `{plan.task}` has no difficulty calibration can turn (a trained model is swept as it learned)"
    reading = f'reads "{summary.verdict}", which' if summary.verdict != "effect" else "shows an effect, but its size"
    return (f"**This task is too {side} for this model to show a weak spot at its hardest**: mean accuracy "
            f"{fixed(mean)}% leaves a dip little room, so this run {reading} says little about a harder task; "
            f"{advice}.")


def _difficulty_line(plan: SweepPlan) -> str:
    """How the task's difficulty was chosen."""
    from kvphase.sweep.calibrate import Calibration

    if plan.calibration:
        try:
            return Calibration.from_json(plan.calibration).describe()
        except PlanError as exc:
            raise RunFolderError(f"config.json: {exc}") from None
    hint = " (`--calibrate` chooses them for a mean accuracy in 40-80%)" if _calibration_knobs(plan.task) else ""
    return f"Difficulty: task and context as given or by default, not calibrated to this model{hint}."


def _calibration_knobs(task: str) -> tuple[str, ...]:
    """The knobs calibration may turn on `task` (none when its file is gone)."""
    try:
        return load_task(task).calibrate
    except PlanError:
        return ()


STATISTICS_NOTE = (
    "a run whose answers do not depend on the query (one answer for nearly every target) is degenerate, and one "
    "where no one-residue dip that fits between its accuracy and chance (a guess among the task's values) would "
    f"be detected is uninformative: at the floor when its accuracy leaves less than {fixed(PLANNED_DIP, 0)} points above "
    "chance, for too few targets when it leaves more; neither is tested further. Targets that share a context are "
    "not independent, so residues are compared within "
    "contexts: the Cochran-Mantel-Haenszel test stratified by context (residue x correct, and the same statistic "
    "on the answer log-probability, whose p comes from permutations of residue labels within contexts); the "
    "gap's interval joins simultaneous intervals of every difference between residues, from the variance within "
    "contexts; the detectable dip is where the accuracy test reaches 80% power at alpha = 0.05, computed under "
    "the dip (the dipped residue's own variance) at the contexts' observed accuracies.")
REPRODUCIBILITY_NOTE = (
    "the plan, the probes and every target position depend only on the tokenizer and the seed and are the "
    "same on every machine; per-target log-probabilities are machine-bound (llama.cpp picks its kernels by "
    "instruction set and thread count; the same plan on another CPU moved logprobs by up to 0.6 nats and "
    "flipped 2 of 256 targets' correctness), so accuracies and p-values agree across machines only within "
    "a few targets.")


def _overview_rows(summary: Summary) -> list[tuple[str, str]]:
    test, lp = summary.test, summary.logprob_test
    dip = (f"none fits: the largest that does ({fixed(summary.largest_dip)} points, down to the mean's lower bound) would "
           f"be found {_floor_power(summary)} of the time"
           if summary.detectable_dip is None else
           f"{fixed(summary.detectable_dip)} points (one residue that far below the rest is found 80% of the time)")
    return [
        ("targets scored", f"{summary.n_targets} in {summary.n_contexts} contexts"),
        ("contexts balanced over residues", "yes" if summary.balanced else "no (short contexts or few targets)"),
        ("mean accuracy over residues", f"{fixed(summary.mean_accuracy, 2)}% (95% CI {fixed(summary.mean_ci[0], 2)} to "
                                        f"{fixed(summary.mean_ci[1], 2)}, contexts the sampled units, t-widened for few"
                                        f"{_coverage_clause(summary)})"),
        ("worst residue", f"{summary.worst_residue}: {fixed(summary.worst_accuracy, 2)}%"),
        ("best residue", f"{summary.best_residue}: {fixed(summary.best_accuracy, 2)}%"),
        ("gap (best - worst)", f"{fixed(summary.gap, 2)} points ({summary.gap_interval_text()}: simultaneous intervals of "
                               "the differences between residues, from the variance within contexts)"),
        ("periodicity check, mean over r < S of abs(A(r) - A(r+S))",
         "n/a (modulus is not twice the stride)" if summary.periodicity is None
         else f"{fixed(summary.periodicity, 2)} points"),
        (f"accuracy test: {test.name}", f"statistic = {fixed(test.statistic, 2)}, df = {test.dof}, p {p_text(test)}"),
        ("accuracy test note", test.note),
        (f"log-probability test: {lp.name}", f"statistic = {fixed(lp.statistic, 2)}, df = {lp.dof}, p {p_text(lp)}"),
        ("log-probability test note", lp.note),
        ("smallest dip detectable (80% power)", dip),
        *_answer_rows(summary),
    ]


def _floor_power(summary: Summary) -> str:
    return "an unknown share" if summary.power_at_floor is None else f"{fixed(100 * summary.power_at_floor, 0)}%"


def _answer_rows(summary: Summary) -> list[tuple[str, str]]:
    spread = summary.spread
    if spread is None:
        return []
    answer = f'"{spread.commonest}"' if spread.commonest else "an empty answer"
    return [("commonest answer", f"{answer}, {fixed(100 * spread.commonest_share)}% of targets"),
            ("answers in effect (exp entropy): given, right", f"{fixed(spread.effective)}, {fixed(spread.truth_effective)}")]


def describe_machine(manifest: dict) -> str:
    """CPU, threads and llama.cpp's instruction sets from the manifest, in one line."""
    machine = manifest.get("machine")
    if not machine:
        return "not recorded (a run from before kvphase recorded it)."
    cpu, build = machine.get("cpu", {}), machine.get("llama_cpp", {})
    return (f"{cpu.get('model', '?')} ({cpu.get('logical_cpus', '?')} logical CPUs), {machine.get('threads', '?')} "
            f"threads; llama.cpp {build.get('version', '?')}: `{build.get('system_info', '?')}`.")
