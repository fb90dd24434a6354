"""lm-evaluation-harness in and out.

`export_task`: a plan's targets as an lm-eval task (`kvphase.yaml` and `docs.jsonl`), one doc per
target: the text before the answer (`text`, the context and the question) and the answer
(`target`), with the target's position, residue and phase, the answer's position, the context,
the sha256 of the planned token ids, and the plan itself. lm-eval re-tokenizes `doc_to_text`, so
each doc's text is tokenized here with the model's own tokenizer and must give exactly the
planned ids; a doc whose text does not is refused (left out of docs.jsonl, counted in
export.json), or with --flag-mismatches kept and flagged, with where the re-tokenized text (what an
engine that tokenizes the text sees) puts its target. SmolLM2's tokenizer re-tokenizes none of the
default plan's docs exactly: the plan joins separately tokenized pieces ("\n" then " word"), which
the text merges into one token. The task is `generate_until` (greedy, the answer's length at most): it runs on any
OpenAI-compatible server through `lm_eval --model local-completions` (llama-server answers no
prompt logprobs through its OpenAI endpoint, so a loglikelihood task would not run there).

`import_samples`: lm-eval's `--log_samples` file of such a task into a run folder that `kvphase
report` reads: correct where the generated text starts with the answer (kvphase's exact match:
every answer token greedy), no answer log-probability (the harness's generation gives none, so the
log-probability test is unavailable). Samples from another plan, or with docs missing or
repeated, are refused in one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from kvphase.errors import PlanError, RunFolderError

TASK_FILE, DOCS_FILE, EXPORT_FILE = "kvphase.yaml", "docs.jsonl", "export.json"
TASK_PREFIX = "kvphase_"


def planned_ids_sha256(ids) -> str:
    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode()).hexdigest()


def plan_text(plan) -> str:
    """The plan as docs carry it: config.json's fields, sorted, as one string (Arrow, which lm-eval's
    datasets read the docs with, cannot hold the plan's empty objects as columns)."""
    return json.dumps(asdict(plan), sort_keys=True)


def _source_plan(source: Path):
    """The plan of a run folder, or of a config.json named directly."""
    from kvphase.sweep.run import load_plan

    if source.is_file() and source.name == "config.json":
        source = source.parent
    if not source.is_dir():
        raise PlanError(f"{source} is neither a run folder nor its config.json")
    return load_plan(source)


def export_task(source: Path, out: Path, model: Optional[Path] = None, name: Optional[str] = None,
                flag_mismatches: bool = False) -> dict:
    """Write the task of the plan in `source` (a run folder or its config.json) into `out`; the model's
    tokenizer is the plan's model file's (or `model`'s). A doc whose text does not re-tokenize to its
    planned ids is refused, or with `flag_mismatches` kept and flagged (`_doc`). Returns export.json's
    content."""
    from kvphase.engines.llamacpp import Vocab
    from kvphase.runfolder import make_folder, write_atomic, write_json
    from kvphase.sweep.contexts import build_contexts, plan_fingerprint
    from kvphase.sweep.tasks import load_task

    plan = _source_plan(Path(source))
    model_path = Path(model or plan.model)
    if not model_path.is_file():
        raise PlanError(f"the plan's model {model_path} is not a file here; pass --model PATH (the same model)")
    vocab = Vocab.load(model_path)
    contexts = build_contexts(load_task(plan.task), vocab, plan.context_settings)
    carried, fingerprint = plan_text(plan), plan_fingerprint(contexts)
    docs, refused = [], []
    for context in contexts:
        query_pos = int(plan.query_positions([context.index])[0])
        for target in context.targets:
            doc = _doc(vocab, plan, context, target, query_pos, carried, fingerprint)
            (docs if doc["retokenizes"] or flag_mismatches else refused).append(doc)
    if not docs:
        raise PlanError(f"none of the plan's {len(refused)} docs re-tokenizes to its planned ids with "
                        f"{model_path.name}'s tokenizer (the plan joins separately tokenized pieces); "
                        "--flag-mismatches exports them flagged, with where the re-tokenized text puts each target")
    for doc in docs:
        doc["n_docs"] = len(docs)
    task = name or TASK_PREFIX + fingerprint[:12]
    make_folder(Path(out))
    write_atomic(Path(out) / DOCS_FILE, "".join(json.dumps(doc) + "\n" for doc in docs))
    longest = max(len(vocab.tokenize(doc["target"])) for doc in docs)
    write_atomic(Path(out) / TASK_FILE, task_yaml(task, (Path(out) / DOCS_FILE).resolve(), longest))
    flagged = [doc["target_id"] for doc in docs if not doc["retokenizes"]]
    summary = {"task": task, "plan_sha256": fingerprint, "docs": len(docs), "retokenize_exactly": len(docs) -
               len(flagged), "flagged": len(flagged), "refused": len(refused),
               "refused_targets": [doc["target_id"] for doc in refused], "model": model_path.name}
    write_json(Path(out) / EXPORT_FILE, summary)
    return summary


def _doc(vocab, plan, context, target, query_pos: int, carried: str, fingerprint: str) -> dict:
    """One target as an lm-eval doc, at its planned positions; `retokenizes`: its text gives exactly the
    planned ids again. One whose text does not also carries where the re-tokenized text puts its
    target and answer (`text_target_pos`, `text_residue`, `text_phase`, `text_answer_pos`)."""
    prefix = list(vocab.prefix_ids)
    planned = list(context.tokens) + list(target.query.prompt)
    text = vocab.detokenize(planned[len(prefix):])
    answer = vocab.detokenize(list(target.query.answer))
    again = prefix + vocab.tokenize(text)
    exact = again == planned and vocab.tokenize(text + answer) == planned[len(prefix):] + list(target.query.answer)
    doc = {"target_id": target.target_id, "context": target.context_index, "residue": target.residue,
           "phase": target.phase, "target_pos": target.position, "query_pos": query_pos, "answer_pos": len(planned),
           "key": target.key, "answer": target.answer, "text": text, "target": answer,
           "ids_sha256": planned_ids_sha256(planned + list(target.query.answer)), "retokenizes": exact}
    if not exact:
        moved = _position_in(vocab, again, _offset(vocab, planned, target.position))
        doc.update(text_target_pos=moved, text_residue=moved % plan.modulus, text_phase=moved % plan.stride,
                   text_answer_pos=len(again))
    return {**doc, "plan_sha256": fingerprint, "plan": carried}


def _offset(vocab, ids: list[int], position: int) -> int:
    """The character where token `position` of `ids` starts in their text (the prefix ids hold none)."""
    skip = len(vocab.prefix_ids)
    return len(vocab.detokenize(ids[skip:position])) if position > skip else 0


def _position_in(vocab, ids: list[int], offset: int) -> int:
    """The token of `ids` whose text holds character `offset` (a merged token: the one it starts inside)."""
    skip, length = len(vocab.prefix_ids), 0
    for position in range(skip, len(ids)):
        length += len(vocab.detokenize([ids[position]]))
        if length > offset:
            return position
    return len(ids)


def task_yaml(task: str, docs: Path, answer_tokens: int) -> str:
    """An lm-eval task over `docs`: greedy generation of at most the longest answer's tokens."""
    return "\n".join([
        f"task: {task}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(str(docs))}",
        "test_split: test",
        "output_type: generate_until",
        "doc_to_text: text",
        "doc_to_target: target",
        'target_delimiter: ""',
        "generation_kwargs:",
        '  until: ["\\n"]',
        f"  max_gen_toks: {answer_tokens}",
        "  do_sample: false",
        "  temperature: 0.0",
        "metric_list:",
        "  - metric: exact_match",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        "  version: 1.0",
        "",
    ])


def import_samples(samples: Path, out: Path) -> Path:
    """A run folder in `out` from an lm-eval samples file of an exported task; RunFolderError in one line
    naming the file for samples of another plan or with docs missing or repeated."""
    import pandas as pd

    from kvphase.runfolder import CONFIG_FILE, MANIFEST_FILE, file_sha256, make_folder, write_csv, write_json
    from kvphase.sweep.plan import SweepPlan
    from kvphase.sweep.run import MISSING_LOGPROB, RESULT_COLUMNS, RESULTS_FILE

    samples = Path(samples)
    lines = _sample_lines(samples)
    docs = [line["doc"] for line in lines]
    plans = {doc.get("plan") for doc in docs}
    if len(plans) != 1 or None in plans:
        raise RunFolderError(f"{samples}: its samples come from {len(plans)} plans; import one task of one plan")
    plan = SweepPlan(**json.loads(plans.pop()))
    ids = [doc["target_id"] for doc in docs]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise RunFolderError(f"{samples}: target {repeated[0]} is logged {ids.count(repeated[0])} times; "
                             "samples must hold each doc once")
    expected = int(docs[0].get("n_docs", 0))
    if len(ids) != expected:
        raise RunFolderError(f"{samples}: {len(ids)} samples, the exported task has {expected} docs; "
                             "run the whole task (no --limit) and import its samples file")
    rows = [_row(line, samples, MISSING_LOGPROB) for line in sorted(lines, key=lambda line: line["doc"]["target_id"])]
    out = Path(out)
    make_folder(out)
    write_json(out / CONFIG_FILE, asdict(plan))
    write_csv(out / RESULTS_FILE, pd.DataFrame(rows, columns=RESULT_COLUMNS))
    write_json(out / MANIFEST_FILE, {"model": {"file": Path(plan.model).name, "sha256": ""},
                                     "backend": "lm-eval", "engine": {"engine": "lm-eval", "samples": str(samples),
                                                                      "samples_sha256": file_sha256(samples)},
                                     "plan_sha256": docs[0]["plan_sha256"], "wall_time_s": 0,
                                     "tokens_evaluated": 0, "sessions": 1})
    return out


def _sample_lines(samples: Path) -> list[dict]:
    """The samples file's records, each with its doc; RunFolderError naming the file and line otherwise."""
    if not samples.is_file():  # a fifo or a device would block the read, a folder fails it
        raise RunFolderError(f"{samples} is not a file; expected lm-eval's samples_<task>_<date>.jsonl")
    try:
        text = samples.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{samples} cannot be read ({exc.__class__.__name__})") from None
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            raise RunFolderError(f"{samples} line {number} is not JSON; expected lm-eval's --log_samples "
                                 "file") from None
        doc = line.get("doc") if isinstance(line, dict) else None
        if not isinstance(doc, dict) or "plan" not in doc or "target_id" not in doc or "resps" not in line:
            raise RunFolderError(f"{samples} line {number} is not a sample of a task `kvphase export lm-eval` "
                                 "wrote (no doc with a plan and a target_id, or no resps)")
        lines.append(line)
    if not lines:
        raise RunFolderError(f"{samples} holds no samples")
    return lines


def _row(line: dict, samples: Path, missing: str) -> dict:
    """One results.csv row of a sample: correct where the generated text starts with the answer."""
    doc = line["doc"]
    generated = _generated_text(line, samples)
    return {"target_id": doc["target_id"], "context": doc["context"], "residue": doc["residue"],
            "phase": doc["phase"], "target_pos": doc["target_pos"], "query_pos": doc["query_pos"],
            "correct": generated.startswith(doc["target"]), "logprob": missing, "key": doc["key"],
            "answer": doc["answer"], "predicted": generated[:len(doc["target"])].strip()}


def _generated_text(line: dict, samples: Path) -> str:
    """The generation lm-eval logged: `resps` is [[text]] for a generate_until request."""
    resps = line["resps"]
    while isinstance(resps, list) and len(resps) == 1:
        resps = resps[0]
    if not isinstance(resps, str):
        raise RunFolderError(f"{samples}: target {line['doc']['target_id']}'s resps is {str(line['resps'])[:40]!r}, "
                             "not one generated text (the task must be generate_until, as exported)")
    return resps
