"""`kvphase export lm-eval` and `kvphase import lm-eval` on a tiny model's plan, with samples files made
here in lm-eval's `--log_samples` shape (the real lm-eval against the real llama-server is in
tests/interop/test_lm_eval_real.py)."""

from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.sweep.run import load_results

from tests.helpers.cli_checks import one_line_error

pytestmark = pytest.mark.slow  # a tiny model's sweep, then the commands in process


@pytest.fixture(scope="module")
def tiny_run(tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "run"
    result = CliRunner().invoke(app, ["sweep", str(tiny_llama), "--context", "256", "--contexts", "8", "--threads",
                                      "1", "-q", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("task")
    result = CliRunner().invoke(app, ["export", "lm-eval", str(tiny_run), str(out), "--flag-mismatches"])
    assert result.exit_code == 0, result.output
    return out, [json.loads(line) for line in (out / "docs.jsonl").read_text().splitlines()]


def test_every_planned_target_is_a_doc_carrying_its_planned_ids_hash_and_positions(tiny_run, exported, tiny_llama):
    from kvphase.engines.llamacpp import Vocab
    from kvphase.sweep.contexts import build_contexts
    from kvphase.sweep.run import load_plan
    from kvphase.sweep.tasks import load_task

    _, docs = exported
    rows = load_results(tiny_run).set_index("target_id")
    assert sorted(doc["target_id"] for doc in docs) == sorted(rows.index)
    plan = load_plan(tiny_run)
    targets = {t.target_id: (c, t) for c in build_contexts(load_task(plan.task), Vocab.load(tiny_llama),
                                                            plan.context_settings) for t in c.targets}
    for doc in docs:
        context, target = targets[doc["target_id"]]
        ids = list(context.tokens) + list(target.query.prompt) + list(target.query.answer)
        assert doc["ids_sha256"] == hashlib.sha256(json.dumps(ids).encode()).hexdigest()
        assert (doc["target_pos"], doc["residue"], doc["query_pos"]) == (
            rows.loc[doc["target_id"], "target_pos"], rows.loc[doc["target_id"], "residue"], plan.context)
        assert doc["answer_pos"] == len(context.tokens) + len(target.query.prompt)
        assert doc["target"].strip() == doc["answer"]


def test_a_doc_whose_text_tokenizes_otherwise_is_flagged_and_says_where_its_target_moved(exported, tiny_llama):
    """SmolLM2's tokenizer merges the plan's "\\n" + " word" pieces, so the text never gives the planned ids."""
    from kvphase.engines.llamacpp import Vocab

    vocab = Vocab.load(tiny_llama)
    out, docs = exported
    export = json.loads((out / "export.json").read_text())
    assert export["flagged"] == sum(not doc["retokenizes"] for doc in docs) == len(docs)
    for doc in docs[:8]:
        again = vocab.prefix_ids + vocab.tokenize(doc["text"])
        assert doc["text_answer_pos"] == len(again) != doc["answer_pos"]
        record = f"{doc['key']}:"  # the target record's text starts inside the token at text_target_pos
        before = vocab.detokenize(again[:doc["text_target_pos"]])
        through = vocab.detokenize(again[:doc["text_target_pos"] + 1])
        assert len(before) <= doc["text"].index(" " + record if " " + record in doc["text"] else record) < len(through)


def test_without_flag_mismatches_a_plan_none_of_whose_docs_round_trip_is_one_line(tiny_run, tmp_path):
    result = CliRunner().invoke(app, ["export", "lm-eval", str(tiny_run), str(tmp_path / "task")])
    n = len(load_results(tiny_run))
    one_line_error(result, f"none of the plan's {n} docs re-tokenizes to its planned ids", "--flag-mismatches")


def samples_of(docs, answered):
    """lm-eval's --log_samples lines for a generate_until task: `answered(doc)` is the generated text."""
    return "".join(json.dumps({"doc_id": i, "doc": doc, "target": doc["target"], "resps": [[answered(doc)]],
                               "filtered_resps": [answered(doc)], "exact_match": 0.0}) + "\n"
                   for i, doc in enumerate(docs))


def test_imported_samples_are_a_run_folder_report_reads_with_the_flags_lm_eval_logged(exported, tmp_path):
    _, docs = exported
    right = {doc["target_id"] for doc in docs if doc["target_id"] % 3}
    samples = tmp_path / "samples_kvphase_x.jsonl"
    samples.write_text(samples_of(docs, lambda d: d["target"] + " and more" if d["target_id"] in right else " Zz"))
    result = CliRunner().invoke(app, ["import", "lm-eval", str(samples), str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    rows = load_results(tmp_path / "run")
    assert set(rows.loc[rows["correct"], "target_id"]) == right
    assert rows["logprob"].isna().all()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["n_targets"] == len(docs) and summary["logprob_test"]["name"].endswith("unavailable")
    again = CliRunner().invoke(app, ["report", str(tmp_path / "run")])
    assert again.exit_code == 0 and result.output.splitlines()[0] == again.output.splitlines()[0]


@pytest.mark.parametrize("damage, fragment", [
    (lambda lines: lines + lines[:1], "is logged 2 times; samples must hold each doc once"),
    (lambda lines: lines[1:], "samples, the exported task has"),
    (lambda lines: [lines[0].replace('\\"seed\\": 0', '\\"seed\\": 7')] + lines[1:], "its samples come from 2 plans"),
    (lambda lines: ["{not json"] + lines[1:], "line 1 is not JSON"),
    (lambda lines: [json.dumps({"doc": {"x": 1}, "resps": []})] + lines[1:], "line 1 is not a sample of a task"),
])
def test_samples_of_another_plan_or_with_docs_missing_or_repeated_are_refused_naming_the_file(exported, tmp_path,
                                                                                              damage, fragment):
    _, docs = exported
    lines = samples_of(docs, lambda d: d["target"]).splitlines()
    samples = tmp_path / "samples_bad.jsonl"
    samples.write_text("\n".join(damage(lines)) + "\n")
    result = CliRunner().invoke(app, ["import", "lm-eval", str(samples), str(tmp_path / "run")])
    one_line_error(result, str(samples), fragment)
