"""Published tables equal what their run folders say (issue 41, `scripts/claims.py`): a table
between `<!-- claims:NAME -->` markers is rebuilt from the folders and compared."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize
from scipy.stats import chi2, chi2_contingency

from kvphase.statistics.power import noncentrality_for_power
from tests.helpers.paths import REPO

ROOT = REPO
spec = importlib.util.spec_from_file_location("claims", ROOT / "scripts" / "claims.py")
claims = importlib.util.module_from_spec(spec)
spec.loader.exec_module(claims)
MARKED = [d for d in claims.DOCUMENTS if claims.blocks(d.read_text())]


def test_the_readme_and_the_study_publish_generated_tables():
    names = {m.group("name") for d in MARKED for m in claims.blocks(d.read_text())}
    assert names == set(claims.TABLES), f"tables no document shows or blocks no table builds: {names ^ set(claims.TABLES)}"


@pytest.mark.parametrize("document", MARKED, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_generated_table_equals_its_run_folders(document):
    text = document.read_text()
    for found, want in zip(claims.blocks(text), claims.blocks(claims.regenerate(text))):
        differing = [(a, b) for a, b in zip(found.group("body").splitlines(), want.group("body").splitlines()) if a != b]
        assert found.group("body") == want.group("body"), (
            f"{document.name}, block {found.group('name')}: run `python scripts/claims.py`; "
            f"first differing row: {differing[:1]}")


def test_one_number_edited_in_a_table_is_caught():
    text = (ROOT / "README.md").read_text()
    block = next(b for b in claims.blocks(text) if re.search(r"\d+\.\d", b.group("body")))  # the first with a number
    body = block.group("body")
    number = re.search(r"\d+\.\d", body)
    edited_body = body[:number.start()] + str(int(body[number.start()]) ^ 1) + body[number.start() + 1:]
    edited = text[:block.start("body")] + edited_body + text[block.end("body"):]
    assert claims.regenerate(edited) != edited and claims.regenerate(edited) == claims.regenerate(text)


def test_a_table_inside_a_list_item_keeps_the_items_indentation():
    text = "- a point:\n\n  <!-- claims:post-hoc -->\n  <!-- /claims:post-hoc -->\n\n  more of the point\n"
    table = claims.regenerate(text).split("\n")[3:-4]
    assert len(table) > 3 and all(line.startswith("  |") for line in table), table[:2]


def test_a_phrase_inside_a_sentence_stays_on_its_line():
    text = "the seeds leave <!-- claims:gaps-dense --><!-- /claims:gaps-dense --> at 1500 steps\n"
    assert re.fullmatch(r"the seeds leave <!-- claims:gaps-dense -->gaps [^\n]+ points, p = [^\n]+"
                        r"<!-- /claims:gaps-dense --> at 1500 steps\n", claims.regenerate(text))


def test_the_block_end_dip_and_worst_residues_of_the_published_deepseek4_profile():
    """The study's comparison columns, pinned by hand from the published numbers: residues 3 and 7 (the
    last token of a block) average 31.25%, the other six 59.77%: a dip of -28.5 points."""
    profile = list(claims.PUBLISHED_DEEPSEEK4)
    assert claims.block_end_dip(profile) == pytest.approx(31.25 - 358.6 / 6)
    assert claims.block_end_dip([90.0, 90.0, 90.0, 90.0]) == 0.0
    assert claims.block_end_dip([100.0, 100.0, 100.0, 70.0, 100.0, 100.0, 100.0, 80.0]) == pytest.approx(-25.0)
    assert claims._pearson(profile, claims.PUBLISHED_DEEPSEEK4) == "1.00"
    assert claims._pearson([50.0] * 8, claims.PUBLISHED_DEEPSEEK4) == "-"


def test_learned_gaps_are_grouped_by_trained_context_and_runs_below_the_bar_only_counted(tmp_path, monkeypatch):
    import json

    def run(name, context, readable, gap, ci, p):
        folder = tmp_path / "reports" / "trained" / name
        (folder / "sweep").mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"context": context}))
        (folder / "summary.json").write_text(json.dumps({"readable": readable}))
        (folder / "sweep" / "summary.json").write_text(json.dumps({"gap": gap, "gap_ci": ci, "test": {"p_value": p}}))
        return name

    runs = [run("a", 256, True, 16.1, [12.9, 18.0], 5.6e-53), run("b", 128, True, 16.5, [13.6, 17.8], 1e-38),
            run("c", 128, False, 6.2, [0.0, 6.1], 0.76), run("d", 128, True, 6.8, [4.4, 8.3], 4.5e-7)]
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    assert claims.learned_gaps_by_context(runs) == (
        "at 128 tokens (2 of 3 runs learned) gaps 16.5 (13.6-17.8) and 6.8 (4.4-8.3) points, p <= 4.5e-07; "
        "at 256 tokens (1 of 1 runs learned) gap 16.1 (12.9-18.0) points, p <= 5.6e-53")


def test_a_studys_hours_add_every_manifest_inside_it_and_count_trainings_apart(tmp_path, monkeypatch):
    import json

    def manifest(relative, seconds, training=False):
        folder = tmp_path / "reports" / "trained" / "study" / relative
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"wall_time_s": seconds}))
        if training:
            (folder / "training.csv").write_text("step,loss,accuracy,steps_per_s\n")

    manifest("run-seed0", 5400, training=True)  # a training, with its sweep and a probe inside it
    manifest("run-seed0/sweep", 1800)
    manifest("run-seed0/probes/knockout", 360)
    manifest("other-seed1", 1440, training=True)
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    assert claims.study_hours("study") == "2.5 hours, trainings 1.9 of them"


def test_a_large_modulus_is_read_against_the_stride_that_divides_it(tmp_path, monkeypatch):
    """Residues mod 8 whose accuracy depends only on the position mod 4 (residue 3 and 7 weak), one
    target per context: the pooled classes differ ((N - 1) / N x Pearson's chi-square, N = 800), the
    residues within each class do not (chi-square exactly 0)."""
    import json

    import pandas as pd

    rows = [(r, int(i < (60 if r % 4 == 3 else 90))) for r in range(8) for i in range(100)]
    folder = tmp_path / "reports" / "run"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"stride": 8, "modulus": 8, "seed": 0}))
    pd.DataFrame({"residue": [r for r, _ in rows], "correct": [c for _, c in rows],
                  "context": range(len(rows))}).to_csv(folder / "results.csv", index=False)
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    between = chi2_contingency([[180, 20], [180, 20], [180, 20], [120, 80]], correction=False)[0] * 799 / 800
    # a class is one stratum of two residues, 100 independent targets each: a drop d of one residue of the class
    # at p = 0.6 (the hardest) moves its CMH difference (S_1 - S_2) / 2 by 50 d, with variance 25 (v_1 + v_2)
    # under the drop, while the test divides by 50 s^2 (s^2: the class's sample variance, (N - 1) in it); the
    # three other classes add a chi-square of 1 df each. Its power, simulated here directly, is 80% at the dip.
    draws = np.random.default_rng(0).standard_normal((200_000, 4))

    def power(d):
        v1, v2, m = 0.6 * 0.4, (0.6 - d) * (0.4 + d), 0.6 - d / 2
        s2 = (0.995 * 100 * (v1 + v2) + 200 * (d / 2) ** 2) / 199 + 0.24 / 199 * (1 + (1 - d / 0.6) ** 2) / 2
        dipped = (50 * d + np.sqrt(25 * (v1 + v2)) * draws[:, 0]) ** 2 / (50 * s2)
        return float((dipped + (draws[:, 1:] ** 2).sum(axis=1) > chi2.isf(0.05, 4)).mean())

    dip = 100 * optimize.brentq(lambda d: power(d) - 0.8, 0.01, 0.6, xtol=1e-4)
    phrase = claims.nested_phase_phrase("run", 4)
    assert phrase.startswith(
        f"pooled by position mod 4 its residues read 90.0, 90.0, 90.0 and 60.0% (chi-square {between:.1f}, df 3, "
        f"p = {claims._p(chi2.sf(between, 3))}); within each phase mod 4 they differ no more than chance "
        f"(chi-square 0.0, df 4, p = 1; a one-residue dip of "), phrase
    shown = float(re.search(r"a one-residue dip of ([0-9.]+) points within a phase", phrase).group(1))
    assert shown == pytest.approx(dip, abs=0.6), (shown, dip)


@pytest.mark.parametrize("row", claims.TRAINED_FILES, ids=lambda row: row[0])
def test_each_file_in_tests_data_is_its_study_folders_model_byte_for_byte(row):
    """reports/study-highlights.md says the small trained files are seed 0 of their study folders, byte for byte."""
    file, _, _, sweep = row
    model = ROOT / "reports" / "trained" / sweep / ".." / "model.gguf"
    assert (ROOT / "tests" / "data" / "trained" / file).read_bytes() == model.resolve().read_bytes(), file


@pytest.mark.parametrize("document", claims.HAND_WRITTEN, ids=lambda d: str(d.relative_to(ROOT)))
def test_prose_holds_no_measured_number_of_its_own(document):
    """A measured number outside a generated block drifts from its folder unseen: the prose may hold none but
    the allowed levels and bars, versions, sizes and dates."""
    found = claims.hand_numbers(document.read_text())
    assert not found, (f"{document.relative_to(ROOT)}: a number typed by hand (generate it with a claims phrase, or "
                       "remove it): " + "; ".join(f"line {line}: {number}" for line, number in found))


@pytest.mark.parametrize("prose, numbers", [
    ("a gap of 12.5 points at 62.2% (p = 3.6e-40), 9 of 14 seeds, 105 s", ["12.5", "62.2%", "3.6e-40", "9 of 14", "105 s"]),
    ("gaps 12 to 31 points, the dense control's 25 points, 44-54 points, 1.8-3.4%", ["31 points", "25 points",
                                                                                     "44-54 points", "1.8-3.4%"]),
    ("margins +1.0 to +3.1 nats; 4e-36", ["+1.0", "+3.1", "4e-36"]),
    ("seed 2, S = 4, 1500 steps, 256 targets per residue, 95% intervals, 80% power, alpha 0.05, rho = 0.35", []),
    ("p = 0.35 at rho = 0.5", ["0.35"]),
    ("Python 3.11+, llama-cpp-python 0.3.36, gguf 0.17.1, 0.7 MB, 2026-12-06, `--per-residue 12.5`, [x](a-1.5.md)", []),
    ("<!-- claims:example -->62.2%<!-- /claims:example --> and <!-- a note: 3.5% -->\n```console\n$ x  # 1.5 s\n```\n", []),
])
def test_what_counts_as_a_hand_typed_number(prose, numbers):
    assert [number for _, number in claims.hand_numbers(prose)] == numbers


def test_the_check_command_fails_on_a_number_changed_in_a_tables_last_row(tmp_path):
    """`scripts/claims.py --check` run as the command it is, on a copy of a document whose generated table has
    one number changed in its last row: exit 1, naming the document; the untouched copy passes."""
    document = ROOT / "reports" / "study-post-hoc.md"
    block = next(b for b in claims.blocks(document.read_text()) if b.group("name") == "post-hoc")
    rows = block.group("body").rstrip("\n").split("\n")
    number = list(re.finditer(r"\d+\.\d", rows[-1]))[-1]
    edited_row = rows[-1][:number.start()] + str(int(rows[-1][number.start()]) ^ 1) + rows[-1][number.start() + 1:]
    text = document.read_text()
    row_at = text.index(rows[-1], block.start("body"))
    copy, untouched = tmp_path / "edited.md", tmp_path / "untouched.md"
    copy.write_text(text[:row_at] + edited_row + text[row_at + len(rows[-1]):])
    shutil.copy(document, untouched)

    def check(path):
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "claims.py"), "--check", str(path)],
                              capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": ""})

    passed, failed = check(untouched), check(copy)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert failed.returncode == 1 and "edited.md: differs from its run folders" in failed.stdout, (
        f"edited row: {edited_row}\n{failed.stdout}{failed.stderr}")
    assert copy.read_text() != untouched.read_text(), "--check must not rewrite the document"


def test_the_check_command_names_a_missing_document_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "claims.py"), "--check", str(tmp_path / "none.md")],
                            capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert result.returncode == 2 and "none.md: no such document" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("document", claims.HAND_WRITTEN, ids=lambda d: str(d.relative_to(ROOT)))
def test_prose_names_no_verdict_and_no_retired_method(document):
    """A verdict word outside a generated block drifts when the verdicts change (issue 64: five such words were
    wrong after a re-report); a retired method word describes an interval the reports no longer print."""
    found = claims.verdict_words(document.read_text(), str(document.relative_to(ROOT)))
    assert not found, (f"{document.relative_to(ROOT)}: a verdict or retired method word written by hand (generate it "
                       "with a claims phrase, or reword): " + "; ".join(f"line {line}: {words}" for line, words in found))


def test_the_old_gemma_sentence_fails_the_lint():
    """The sentence reports/README.md held before issue 64, put back: the lint names its verdict word."""
    page = ROOT / "reports" / "README.md"
    planted = page.read_text() + ("\nGemma's report is\ninconclusive: the gap's interval excludes 0 while the test does "
                                  "not reach significance, so a\nlarger sample would decide.\n")
    assert claims.verdict_words(page.read_text(), "reports/README.md") == []
    line = planted[:planted.index("inconclusive: the gap")].count("\n") + 1
    assert claims.verdict_words(planted, "reports/README.md") == [(line, "inconclusive")]


@pytest.mark.parametrize("prose, page, words", [
    ("kpool S = 4 reads inconclusive; dense reads no effect at\nthis power", "reports/README.md",
     ["inconclusive", "no effect at this power"]),
    ("One flat-at-chance sweep reads an effect; an effect at every seed; Uninformative at the floor", "x.md",
     ["an effect", "an effect", "Uninformative at the floor"]),
    ("the design effect of a context, a phase effect, the effect of the gate", "x.md", []),
    ("<!-- claims:x -->inconclusive<!-- /claims:x -->, [no effect at this power](statistics.md#verdicts)", "x.md", []),
    ("a run that reads inconclusive", "docs/statistics.md", []),
    ("CIs are the bootstrap-over-contexts gap intervals. Its bias-corrected 95% interval.", "docs/statistics.md",
     ["bootstrap", "bias-corrected"]),
    ("every seed reads effect at 2 of 3 seeds", "x.md", ["reads effect"]),
    ("Where they learned, the reports read effects, weakest at the block's end.", "x.md", ["read effects"]),
    ("The gap's interval is no longer a bootstrap (retired). compare gives a gap difference with a bootstrap.",
     "x.md", []),
])
def test_what_counts_as_a_verdict_or_retired_method_word(prose, page, words):
    assert [found for _, found in claims.verdict_words(prose, page)] == words


@pytest.mark.parametrize("prose, numbers", [
    ("at 32 both learned within 500, and by step 1250; after 3000 steps", ["500", "1250", "3000"]),
    ("smaller losses elsewhere (-3 to -28 on average), a bias of -4", ["-3 to -28", "-4"]),
    ("`meanpool` trained 6000 steps (4x its default), 2.5x faster", ["4x", "2.5x"]),
    ("| model | tokens |\n|---|---|\n| llama | 900 |\n| glm | `6` |\n", ["900"]),
    ("2 x observed - upper quantile, top-4, 1500 steps, `--queries 16`", []),
])
def test_the_widened_hand_number_rule(prose, numbers):
    assert [number for _, number in claims.hand_numbers(prose)] == numbers


def _folders_read_while_generating(monkeypatch) -> set[Path]:
    """The sweep folders whose summary.json some generated block reads, found by regenerating every document."""
    read, plain = set(), claims._read

    def recording(folder, name):
        data = plain(folder, name)
        if name == "summary.json" and "per_residue" in data:  # a sweep's, not a training's
            read.add(Path(folder).resolve())
        return data

    monkeypatch.setattr(claims, "_read", recording)
    for document in MARKED:
        claims.regenerate(document.read_text())
    return {folder for folder in read if (folder / "results.csv").is_file()}


@pytest.mark.slow
def test_every_generated_accuracy_equals_its_results_recomputed_without_rounding(monkeypatch):
    """Every sweep a generated block reads: its residue accuracies, mean, worst, best and gap as the blocks
    take them (`claims._read`) equal the ones recomputed from results.csv in one step, unrounded (issue 64:
    17 folders printed a gap 0.1 off, taken from accuracies already rounded)."""
    import pandas as pd

    folders = _folders_read_while_generating(monkeypatch)
    assert len(folders) > 100, len(folders)
    differing = []
    for folder in sorted(folders):
        results = pd.read_csv(folder / "results.csv", usecols=["residue", "correct"])
        accuracy = 100 * results.groupby("residue")["correct"].mean().to_numpy()  # (M,)
        want = {"mean_accuracy": accuracy.mean(), "worst_accuracy": accuracy.min(), "best_accuracy": accuracy.max(),
                "gap": accuracy.max() - accuracy.min()}
        got = claims._read(folder, "summary.json")
        shown = np.array([row["accuracy"] for row in got["per_residue"]])  # (M,)
        errors = [abs(got[key] - value) for key, value in want.items()] + list(np.abs(shown - accuracy))
        if max(errors) > 1e-9:
            differing.append((str(folder.relative_to(ROOT)), max(errors), float(np.mean(errors))))
    assert not differing, (f"{len(differing)} of {len(folders)} folders differ from their results.csv (folder, max and "
                           f"mean difference, points): {differing[:5]}")


def table_verdicts(text: str, base: Path) -> list[tuple[str, Path]]:
    """(verdict cell, folder) for every row of a markdown table with a verdict column whose row links to a
    run folder's report.md (the first such link of the row)."""
    found, header = [], None
    for line in text.splitlines():
        row = line.strip()
        if not row.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(row) <= set("|-: ") and "verdict" in header:
            links = re.findall(r"\]\(([^)\s]+?)/report\.md\)", row)
            if links:
                found.append((re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cells[header.index("verdict")]), base / links[0]))
    return found


@pytest.mark.parametrize("document", [ROOT / "README.md", *sorted((ROOT / "reports").glob("*.md"))],
                         ids=lambda d: str(d.relative_to(ROOT)))
def test_every_verdict_in_a_table_is_its_folders_report(document):
    """A reviewer's check kept (issue 64): a table's verdict word is the one its folder's summary.json holds, read
    here without scripts/claims.py."""
    rows = table_verdicts(document.read_text(), document.parent)
    wrong = [(str(folder.relative_to(ROOT)), cell, json.loads((folder / "summary.json").read_text())["verdict"])
             for cell, folder in rows if cell != json.loads((folder / "summary.json").read_text())["verdict"]]
    assert not wrong, f"{document.name}: (folder, the table's verdict, its report's): {wrong[:5]}"


def test_the_readme_holds_tables_with_verdicts_of_folders():
    rows = table_verdicts((ROOT / "README.md").read_text(), ROOT)
    assert len(rows) >= 4, rows
    edited = (ROOT / "README.md").read_text().replace(f"[{rows[0][0]}](", "[inconclusive](", 1)
    assert table_verdicts(edited, ROOT)[0][0] == "inconclusive" != rows[0][0]


def test_the_audit_names_the_sentences_outside_blocks_that_name_a_folder(tmp_path):
    """`scripts/claims.py --audit` run as the command it is: a sentence that links a run folder is printed with its
    page and line, its generated phrases shown by name; a sentence naming no folder is not."""
    (tmp_path / "trained").symlink_to(ROOT / "reports" / "trained")  # the page's links resolve as in reports/
    page = tmp_path / "study-audit-probe.md"
    page.write_text("# Probe\n\nThe gated seed reads <!-- claims:gated-tally -->x<!-- /claims:gated-tally --> "
                    "([`trained/gated-seed0/sweep/`](trained/gated-seed0/sweep/report.md)).\n\nNo folder here.\n")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "claims.py"), "--audit", str(page)],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{page}:3: The gated seed reads [claims:gated-tally] "
        "([`trained/gated-seed0/sweep/`](trained/gated-seed0/sweep/report.md))."], done.stdout


@pytest.mark.parametrize("page", list(claims.DERIVED), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_derived_page_equals_what_its_script_writes_from_the_folders(page):
    """A page a study script writes whole (reports/trained/study.md printed the retired bootstrap interval on all its
    rows until issue 74 brought it under the check)."""
    want = claims.DERIVED[page]()
    found = page.read_text()
    differing = [(a, b) for a, b in zip(found.splitlines(), want.splitlines()) if a != b]
    assert found == want, f"{page.relative_to(ROOT)}: run `python scripts/claims.py`; first differing row: {differing[:1]}"


def test_every_page_that_prints_a_result_is_checked_or_written_by_a_tool():
    """Every .md under README, docs/ and reports/ that prints a number or a verdict word is on one of the two lists:
    `--check` regenerates it (`claims.checked_pages`), or a command or measuring script writes it whole
    (`claims.written_by`)."""
    uncovered = claims.uncovered_pages()
    assert not uncovered, ("pages no check reads (add them to DOCUMENTS or DERIVED, or name their writer in MEASURED): "
                           + "; ".join(f"{page.relative_to(ROOT)} ({word})" for page, word in uncovered))


def test_a_page_on_neither_list_that_prints_a_result_is_named(tmp_path, monkeypatch):
    """A study page left beside the run folders, as reports/trained/study.md was, with a number or a verdict word in
    its prose: named; a run folder's own report.md and a page that prints neither are not."""
    (tmp_path / "README.md").write_text("# kvphase\n\nSee the reports.\n")
    (tmp_path / "docs").mkdir()
    run = tmp_path / "reports" / "study" / "run"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "report.md").write_text("gap 12.5 points, inconclusive\n")
    (tmp_path / "reports" / "study" / "table.md").write_text("| model | gap |\n|---|---|\n| a | 9.8 (1.7-14.7) |\n")
    (tmp_path / "reports" / "study" / "words.md").write_text("Every seed reads inconclusive.\n")
    (tmp_path / "reports" / "study" / "plain.md").write_text("How the runs were made: one command per seed.\n")
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    monkeypatch.setattr(claims, "DOCUMENTS", [tmp_path / "README.md"])
    monkeypatch.setattr(claims, "DERIVED", {})
    assert [(page.name, word) for page, word in claims.uncovered_pages()] == [("table.md", "9.8"),
                                                                             ("words.md", "inconclusive")]


def test_the_check_recomputes_a_sweeps_statistics_from_its_results(tmp_path, monkeypatch):
    """Under `--check` (RECOMPUTE) a sweep's summary is what `kvphase report` computes from results.csv: an interval end
    and a dip planted in a copy's summary.json are read as stored without it and as computed with it."""
    folder = tmp_path / "dense"
    shutil.copytree(ROOT / "reports" / "reference" / "dense", folder)
    stored = json.loads((folder / "summary.json").read_text())
    planted = {**stored, "gap_ci": [-7.25, 34.3], "detectable_dip": 7.15}
    (folder / "summary.json").write_text(json.dumps(planted))
    assert claims._read(folder, "summary.json")["gap_ci"] == [-7.25, 34.3]
    monkeypatch.setattr(claims, "RECOMPUTE", True)
    recomputed = claims._read(folder, "summary.json")
    # the committed summary as `kvphase report` wrote it (whole, or at two decimals before issue 74)
    assert list(recomputed["gap_ci"]) == pytest.approx(stored["gap_ci"], abs=0.005)
    assert recomputed["detectable_dip"] == pytest.approx(stored["detectable_dip"], abs=0.005)


@pytest.mark.parametrize("document", claims.HAND_WRITTEN, ids=lambda d: str(d.relative_to(ROOT)))
def test_prose_counts_no_runs_writes_no_absence_and_points_at_something(document):
    """What the digit and verdict lints cannot see (issue 74): counts in words of classes or of what runs held, absence
    written as absence ("flat", "no phase effect" unscoped, "absence"), "(measured)" with nothing linked that
    measured it, and "... has the table" that is no link to a section holding one."""
    found = claims.run_words(document.read_text(), str(document.relative_to(ROOT)))
    assert not found, (f"{document.relative_to(ROOT)}: generate it with a claims phrase, say what the run could have "
                       "seen, or link what it names: " + "; ".join(f"line {line}: {words}" for line, words in found))


@pytest.mark.parametrize("prose, words", [
    ("one of six classes, three of them decided before any test", ["six classes", "three of them"]),
    ("at residues mod 8 the folders hold 2 targets per context", ["2 targets per context"]),
    ("a flat profile; shows no phase effect at these seeds; a known absence of one; no weak spot",
     ["flat", "no phase effect", "absence", "no weak spot"]),
    ("the tests read no phase effect at their power", ["no phase effect"]),
    ("no phase effect at this power; No phase effect larger than X points; absence of evidence, never evidence "
     "of absence", []),
    ("Three choices decide it (measured): the norm weights.", ["(measured)"]),
    ("Three choices decide it (measured, [the sweep](reports/example-SmolLM2-135M-Instruct.Q4_1-records-S4-L1024/"
     "report.md)).", []),
    ("tried five ways (reports/README.md has the table).", ["(reports/README.md has the table"]),
    ("the classes ([docs/statistics.md](docs/statistics.md#verdicts) has the table).", []),
    ("one of them kept the pool; `three of them`; <!-- claims:x -->seven classes<!-- /claims:x -->; the theory's one "
     "target per context", []),
])
def test_what_counts_as_a_run_word(prose, words):
    assert [found for _, found in claims.run_words(prose, "README.md")] == words


def test_the_verdict_pages_define_every_class_of_the_codes_list():
    """docs/statistics.md's verdict table has one row per class of `analysis.VERDICTS` (it had no row for *compressor
    inactive* before issue 74), and the glossary's Verdict entry names each in italics."""
    from kvphase.sweep.analysis import VERDICTS

    statistics = (ROOT / "docs" / "statistics.md").read_text()
    section = statistics[statistics.index("## Verdicts"):]
    rows = [cells[0].strip("` ") for cells in claims._markdown_rows_of(section)[2:]]
    assert len(rows) == len(VERDICTS) and set(rows) == set(VERDICTS), (rows, VERDICTS)
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    entry = glossary[glossary.index("## Verdict\n"):].split("\n## ")[0]
    named = set(re.findall(r"\*([^*]+)\*", " ".join(entry.split())))
    assert set(VERDICTS) <= named and len(named & set(VERDICTS)) == len(VERDICTS), (named, VERDICTS)
