"""Selection records (`kvphase sweep --selection`): whether the indexer chose each target's pool.

An indexer keeps a few pools of a long context and the query reads only those, so a target can
be lost at selection (its pool was not chosen) or after it (chosen, and the answer still wrong).
For every target this module records, at the position whose logits predict the answer's first
token (the query's last token), which indexer layers selected the unit that holds the first
token of the target record's answer in the context (`answer_pos`; the record starts at `target_pos`):
glm5-next's k-pool pools of `kpool` tokens, deepseek4's lightning-indexer entries of 4 tokens on
its CSA layers (the entry of that token's own block: entry b pools positions 4b to 4b+3 in half of
its channels and the block before in the other half, so the token also reaches entry b + 1).
llama.cpp's selection is read from its graph (`engines.selection`); the numpy reference's from
its glm5-next and deepseek4 models (`reference.deepseek4.WholeSequence.selections`).

A row's columns: `answer_pos`, `indexer_layers` and `selected_layers` (layer numbers joined by ";"),
`selected_share` (the share of indexer layers that selected that unit) and `selected_all`
(every one did). deepseek4 also reads a token through the next entry and, inside its raw window,
raw, whatever the indexer chose for its own entry.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import pandas as pd

from kvphase.backends.base import Query, Score
from kvphase.errors import BackendError, PlanError, RunFolderError

SELECTION_COLUMNS = ["answer_pos", "indexer_layers", "selected_layers", "selected_share", "selected_all"]
CSA_ENTRY = 4  # deepseek4's lightning indexer scores the ratio-4 (CSA) entries only


def indexer_unit(info) -> int:
    """How many consecutive positions, from position 0, one unit of the file's indexer holds (a
    glm5-next pool, a deepseek4 CSA entry); PlanError naming the file when it has no indexer
    kvphase reads."""
    spec, params, where = info.compression, info.compression.params, f"{info.path.name} ({info.architecture})"
    if spec.family == "kpool" and params.get("kpool", 0) > 1:
        return params["kpool"]
    if spec.family == "dsv4" and params.get("indexer_top_k", 0) > 0 and CSA_ENTRY in params.get("strides", ()):
        return CSA_ENTRY
    if spec.family == "msa":  # minimax-m3.cpp: msa_enabled = flash_attn && (n_seq_max == 1 || !kv_unified)
        raise PlanError(f"--selection: kvphase does not read {where}'s block selection yet (a top-k per head "
                        "group and query token, msa_block_mask in minimax-m3.cpp); glm5-next and deepseek4 it reads")
    raise PlanError(f"--selection needs a model with an indexer (glm5-next's k-pool, deepseek4's lightning "
                    f"indexer); {where} has none")


def check_selection_plan(info, backend: str, offsets: dict, design: str = "") -> int:
    """The unit of the model's indexer, when a sweep with this backend can record its selection;
    else PlanError."""
    unit = indexer_unit(info)
    if backend == "server":
        raise PlanError("--selection reads the indexer inside the engine: use --backend llama.cpp or reference")
    if backend == "reference" and design != "trained":
        raise PlanError("--selection with --backend reference needs the file's own indexer (--design trained)")
    if offsets:
        raise PlanError("--selection records plain scoring; run it without --offsets, --shift or --random-offset")
    return unit


class SelectionReader:
    """Reads the selection of one query's decode from a llama.cpp backend (through a graph tap)
    or the numpy reference (through its model's `selections`)."""

    def __init__(self, backend):
        self.backend = backend
        self.model = getattr(backend, "model", None)
        if getattr(self.model, "selections", False) is None:  # a reference model that runs an indexer
            return
        point = getattr(backend, "tap_point", None)
        if point is None:
            raise PlanError("--selection needs the llama.cpp backend opened with a graph tap, or the numpy "
                            "reference of a glm5-next or deepseek4 file")
        from kvphase.engines.selection import SelectionTap

        point.tap = SelectionTap(backend.architecture)
        self.model = None

    def score(self, context: Sequence[int], query: Query) -> tuple[Score, dict[int, np.ndarray]]:
        """The query's score and each indexer layer's selected units where the answer's first token
        is predicted (ascending unit numbers)."""
        position = len(context) + len(query.prompt) - 1
        if self.model is not None:
            self.model.selections = {}
            score = self.backend.score(context, [query])[0]
            rows = {layer: top[position] for layer, top in self.model.selections.items()}  # (k,) each
            chosen = {layer: np.unique(row[row >= 0]) for layer, row in rows.items()}
            self.model.selections = None
            return score, chosen
        tap = self.backend.tap_point.tap
        tap.position = position
        score = self.backend.score(context, [query])[0]
        return score, tap.take()


def score_selected(reader: SelectionReader, jobs: Sequence[tuple[Sequence[int], Sequence[Query]]]
                   ) -> Iterator[tuple[int, list[Score], list[dict[int, np.ndarray]]]]:
    """(job index, scores, selections) for each (context, queries) job, one query at a time."""
    for index, (context, queries) in enumerate(jobs):
        pairs = [reader.score(context, query) for query in queries]
        yield index, [score for score, _ in pairs], [chosen for _, chosen in pairs]


def answer_position(context: Sequence[int], target) -> int:
    """Where the target record holds the first token of its answer: the answer's tokens as the query
    scores them, first found from the record's first token on (segments are tokenized on their own,
    so the record holds the same ids)."""
    answer = list(target.query.answer)
    for position in range(target.position, len(context) - len(answer) + 1):
        if list(context[position:position + len(answer)]) == answer:
            return position
    raise PlanError(f"target {target.target_id}: its answer's tokens are not in its context after position "
                    f"{target.position}")


def selection_row(answer_pos: int, chosen: dict[int, np.ndarray], unit: int) -> dict:
    """A target's selection columns from each indexer layer's selected units: is the unit that holds
    the answer's first token in the context among them?"""
    if not chosen:
        raise BackendError("the engine reported no indexer layer for this query; no selection to record")
    layers = sorted(chosen)
    hit = [layer for layer in layers if answer_pos // unit in set(chosen[layer].tolist())]
    return {"answer_pos": answer_pos, "indexer_layers": ";".join(map(str, layers)),
            "selected_layers": ";".join(map(str, hit)),
            "selected_share": round(len(hit) / len(layers), 4), "selected_all": len(hit) == len(layers)}


def has_selection(results: pd.DataFrame) -> bool:
    return set(SELECTION_COLUMNS) <= set(results.columns)


def selection_by_residue(results: pd.DataFrame) -> pd.DataFrame:
    """Per residue (percent of its targets): accuracy, selected by each indexer layer, by every one and
    by none, and accuracy among the targets some layer selected and among those none did."""
    frame, layers = _typed(results)
    rows = []
    for residue, group in frame.groupby("residue", sort=True):
        read, unread = group[group["selected_share"] > 0], group[group["selected_share"] == 0]
        rows.append({"residue": int(residue), "n": len(group), "accuracy": _percent(group["correct"]),
                     **{f"layer {layer}": _percent(group[f"layer {layer}"]) for layer in layers},
                     "every layer": _percent(group["selected_all"]), "no layer": _percent(group["selected_share"] == 0),
                     "accuracy if some layer": _percent(read["correct"]),
                     "accuracy if none": _percent(unread["correct"])})
    return pd.DataFrame(rows)


def where_lost(results: pd.DataFrame, residue: int) -> str:
    """One sentence: were the residue's missed targets lost at selection (no indexer layer chose their
    unit, so the query never read them) or after it?"""
    frame, _ = _typed(results)
    group = frame[frame["residue"] == residue]
    missed = group[~group["correct"]]
    if missed.empty:
        return f"Residue {residue} missed no target."
    unread = int((missed["selected_share"] == 0).sum())
    read, rest = group[group["selected_share"] > 0], group[group["selected_share"] == 0]
    where = ("at selection (most of its misses are targets no indexer layer chose)" if 2 * unread > len(missed) else
             "after selection (most of its misses are targets some indexer layer chose)" if 2 * unread < len(missed)
             else "as often at selection as after it")
    return (f"At residue {residue}, the weakest, {unread} of its {len(missed)} missed targets were selected by no "
            f"indexer layer (accuracy {_percent_text(read['correct'])} among the {len(read)} targets some layer "
            f"selected, {_percent_text(rest['correct'])} among the {len(rest)} none did): it lost them {where}.")


def selection_section(results: pd.DataFrame, worst_residue: int) -> tuple:
    """The report's section on the indexer's selection; () for a run without selection records."""
    if not has_selection(results):
        return ()
    _, layers = _typed(results)
    prose = (f"Whether the indexer selected each target's unit (glm5-next: the pool of its answer's first "
             f"token; deepseek4: the compressed entry of that token's own block) when the answer's first token "
             f"was predicted, in indexer layer(s) {', '.join(map(str, layers))}; percent of targets. A unit no "
             "layer selected is never read through the indexer (deepseek4 can still read the token through the "
             "next entry, or raw inside its sliding window). "
             + where_lost(results, worst_residue))
    return ("Indexer selection", prose, _markdown(selection_by_residue(results)))


def _markdown(frame: pd.DataFrame) -> str:
    from kvphase.runfolder import markdown_table

    return markdown_table(frame.astype(object).where(frame.notna(), "-"))


def _typed(results: pd.DataFrame) -> tuple[pd.DataFrame, list[int]]:
    """The rows with boolean flags, a numeric share and a flag per indexer layer; the layers."""
    frame = results.copy()
    for column, pattern in (("indexer_layers", r"\d+(;\d+)*"), ("selected_layers", r"(\d+(;\d+)*)?"),
                            ("selected_all", r"(?i)true|false"), ("selected_share", r"[01]|0?\.\d+|1\.0+")):
        bad = ~frame[column].astype(str).str.fullmatch(pattern)
        if bad.any():
            raise RunFolderError(f"results.csv: {column} is {str(frame[column][bad].iloc[0])[:40]!r} in a row; "
                                 "expected what `kvphase sweep --selection` writes")
    frame["selected_all"] = frame["selected_all"].astype(str).str.lower() == "true"
    frame["selected_share"] = pd.to_numeric(frame["selected_share"])
    frame["correct"] = frame["correct"].astype(str).str.lower() == "true"
    layers = sorted({int(layer) for text in frame["indexer_layers"] for layer in str(text).split(";") if layer})
    chosen = frame["selected_layers"].astype(str).str.split(";")
    for layer in layers:
        frame[f"layer {layer}"] = chosen.apply(lambda found, layer=layer: str(layer) in found)
    return frame, layers


def _percent(flags: pd.Series) -> float:
    return round(100 * float(flags.mean()), 2) if len(flags) else float("nan")


def _percent_text(flags: pd.Series) -> str:
    return f"{_percent(flags):.1f}%" if len(flags) else "n/a"
