"""Selection records (`kvphase sweep --selection`): whether the indexer chose each target's pool.

An indexer keeps a few pools of a long context and the query reads only those, so a target can
be lost at selection (its pool was not chosen) or after it (chosen, and the answer still wrong).
For every target this module records, at the position whose logits predict the answer's first
token (the query's last token), which indexer layers selected the unit that holds the first
token of the target record's answer in the context (`answer_pos`; the record starts at `target_pos`):
glm5-next's k-pool pools of `kpool` tokens, deepseek4's lightning-indexer entries of 4 tokens on
its CSA layers (the entry of that token's own block: entry b pools positions 4b to 4b+3 in half of
its channels and the block before in the other half, so the token also reaches entry b + 1),
minimax-m3's position blocks of `block_size` tokens on its MSA (MoE) layers.
llama.cpp's selection is read from its graph (`engines.selection`); the numpy reference's from
its glm5-next and deepseek4 models (`reference.deepseek4.WholeSequence.selections`).

A row's columns: `answer_pos`, `indexer_layers` and `selected_layers` (layer numbers joined by ";"),
`selected_share` (the share of indexer layers that selected that unit) and `selected_all`
(every one did). deepseek4 also reads a token through the next entry and, inside its raw window,
raw, whatever the indexer chose for its own entry.

minimax-m3 selects per head group (one indexer head per KV head) and query token. A layer counts
as having selected the target's block when any of its head groups did: that group's query heads
read the block's tokens exactly, and one head suffices to copy an answer, so only a block no group
chose is unread in that layer, the sense "lost at selection" needs. Two more columns keep the
detail: `group_share`, the share of (layer, head group) pairs that chose the block, and
`local_block`, True when the block is one of the `local_blocks` up to the query token's own, which
llama.cpp forces into every group's selection (a 1e30 bias): such a target is read raw whatever the
indexer scores, and the report gives its share apart.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np
import pandas as pd

from kvphase.backends.base import Query, RunsPolicy, Score, TapsGraph
from kvphase.errors import BackendError, PlanError, RunFolderError

SELECTION_COLUMNS = ["answer_pos", "indexer_layers", "selected_layers", "selected_share", "selected_all"]
GROUP_COLUMNS = ["group_share", "local_block"]  # indexers that select per head group (minimax-m3)
CSA_ENTRY = 4  # deepseek4's lightning indexer scores the ratio-4 (CSA) entries only


class Indexer(NamedTuple):
    """What a selection record needs to know of a file's indexer."""

    unit: int  # consecutive positions, from position 0, of one pool, entry or block
    per_group: bool = False  # minimax-m3: a selection per head group
    local_blocks: int = 0  # minimax-m3: blocks up to the query token's own that every group reads

    @property
    def columns(self) -> list[str]:
        """The selection columns of a run of this file."""
        return SELECTION_COLUMNS + (GROUP_COLUMNS if self.per_group else [])


def file_indexer(info) -> Indexer:
    """The file's indexer: a glm5-next pool, a deepseek4 CSA entry, a minimax-m3 block; PlanError
    naming the file when it has no indexer kvphase reads."""
    spec, params, where = info.compression, info.compression.params, f"{info.path.name} ({info.architecture})"
    if spec.family == "kpool" and params.get("kpool", 0) > 1:
        return Indexer(params["kpool"])
    if spec.family == "dsv4" and params.get("indexer_top_k", 0) > 0 and CSA_ENTRY in params.get("strides", ()):
        return Indexer(CSA_ENTRY)
    if spec.family == "msa" and params.get("block_size", 0) > 0:
        return Indexer(params["block_size"], per_group=True, local_blocks=params.get("local_blocks", 0))
    raise PlanError(f"--selection needs a model with an indexer (glm5-next's k-pool, deepseek4's lightning "
                    f"indexer, minimax-m3's block indexer); {where} has none")


def indexer_unit(info) -> int:
    """How many consecutive positions one unit of the file's indexer holds; PlanError as `file_indexer`."""
    return file_indexer(info).unit


def check_selection_plan(info, backend: str, offsets: dict, design: str = "") -> int:
    """The unit of the model's indexer, when a sweep with this backend can record its selection;
    else PlanError."""
    unit = indexer_unit(info)
    if backend == "server":
        raise PlanError("--selection reads the indexer inside the engine: use --backend llama.cpp or reference")
    if backend == "reference" and info.compression.family == "msa":
        raise PlanError(f"--selection: the numpy reference does not run {info.architecture}'s model, so it has no "
                        "block selection to record; use --backend llama.cpp")
    if backend == "reference" and design != "trained":
        raise PlanError("--selection with --backend reference needs the file's own indexer (--design trained)")
    if offsets:
        raise PlanError("--selection records plain scoring; run it without --offsets, --shift or --random-offset")
    return unit


@runtime_checkable
class RecordsSelections(Protocol):
    """A numpy reference model that runs an indexer: while `selections` is a dict, each forward
    pass puts there every indexer layer's selected units per row (None: it records nothing)."""

    selections: dict[int, np.ndarray] | None


class SelectionReader:
    """Reads the selection of one query's decode from a llama.cpp backend (through a graph tap)
    or the numpy reference (through its model's `selections`)."""

    def __init__(self, backend):
        self.backend = backend
        if isinstance(backend, RunsPolicy) and isinstance(backend.model, RecordsSelections):
            self.model = backend.model
            return
        point = backend.tap_point if isinstance(backend, TapsGraph) else None
        if point is None:
            raise PlanError("--selection needs the llama.cpp backend opened with a graph tap, or the numpy "
                            "reference of a glm5-next or deepseek4 file")
        from kvphase.engines.selection import SelectionTap

        point.tap = SelectionTap(backend.architecture)
        self.model = None

    def score(self, context: Sequence[int], query: Query) -> tuple[Score, dict[int, np.ndarray]]:
        """The query's score and each indexer layer's selected units where the answer's first token
        is predicted: ascending unit numbers, (k,) or for minimax-m3 (head groups, k)."""
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


def target_selection(context: Sequence[int], target, chosen: dict[int, np.ndarray], indexer: Indexer) -> dict:
    """A target's selection columns from the selection its query made (`SelectionReader.score`)."""
    query_pos = len(context) + len(target.query.prompt) - 1  # predicts the answer's first token
    return selection_row(answer_position(context, target), chosen, indexer, query_pos)


def selection_row(answer_pos: int, chosen: dict[int, np.ndarray], indexer: Indexer, query_pos: int) -> dict:
    """A target's selection columns from each indexer layer's selected units, (k,) or (head groups, k):
    is the unit that holds the answer's first token in the context among them (in any group)?"""
    if not chosen:
        raise BackendError("the engine reported no indexer layer for this query; no selection to record")
    layers, unit = sorted(chosen), answer_pos // indexer.unit
    groups = {layer: np.atleast_2d(chosen[layer]) for layer in layers}  # (head groups, k)
    picked = {layer: int((groups[layer] == unit).any(axis=1).sum()) for layer in layers}  # groups that chose it
    hit = [layer for layer in layers if picked[layer]]
    row = {"answer_pos": answer_pos, "indexer_layers": ";".join(map(str, layers)),
           "selected_layers": ";".join(map(str, hit)),
           "selected_share": round(len(hit) / len(layers), 4), "selected_all": len(hit) == len(layers)}
    if not indexer.per_group:
        return row
    n_groups = sum(len(rows) for rows in groups.values())
    return row | {"group_share": round(sum(picked.values()) / n_groups, 4),
                  "local_block": unit > query_pos // indexer.unit - indexer.local_blocks}


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
                     "accuracy if none": _percent(unread["correct"]),
                     **(_group_columns(group) if has_groups(frame) else {})})
    return pd.DataFrame(rows)


def has_groups(results: pd.DataFrame) -> bool:
    """Selection records of an indexer that selects per head group (minimax-m3)."""
    return set(GROUP_COLUMNS) <= set(results.columns)


def _group_columns(group: pd.DataFrame) -> dict:
    """Per residue (percent): the (layer, head group) pairs that chose the target's block, the targets
    in the query's forced local blocks (read raw), and the accuracy of the others."""
    behind = group[~group["local_block"]]
    return {"head groups": round(100 * float(group["group_share"].mean()), 2),
            "local block": _percent(group["local_block"]), "accuracy outside local": _percent(behind["correct"])}


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
    unit = ("minimax-m3: the position block of its answer's first token, selected by a layer when any of its "
            "head groups chose it; \"head groups\" is the share of (layer, head group) pairs that did, \"local block\" "
            "the share of targets in the query's own block or the local blocks before it, which every group reads "
            "raw whatever the indexer scores" if has_groups(results) else
            "glm5-next: the pool of its answer's first token; deepseek4: the compressed entry of that token's own "
            "block")
    prose = (f"Whether the indexer selected each target's unit ({unit}) when the answer's first token "
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
    share, flag = r"[01]|0?\.\d+|1\.0+", r"(?i)true|false"
    groups = (("group_share", share), ("local_block", flag)) if has_groups(frame) else ()
    for column, pattern in (("indexer_layers", r"\d+(;\d+)*"), ("selected_layers", r"(\d+(;\d+)*)?"),
                            ("selected_all", flag), ("selected_share", share), *groups):
        bad = ~frame[column].astype(str).str.fullmatch(pattern)
        if bad.any():
            raise RunFolderError(f"results.csv: {column} is {str(frame[column][bad].iloc[0])[:40]!r} in a row; "
                                 "expected what `kvphase sweep --selection` writes")
    for column in ["selected_all"] + (["local_block"] if groups else []):
        frame[column] = frame[column].astype(str).str.lower() == "true"
    for column in ["selected_share"] + (["group_share"] if groups else []):
        frame[column] = pd.to_numeric(frame[column])
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
