"""Selection records (`kvphase sweep --selection`): which pool or compressed entry the indexer chose.

The selection llama.cpp's graph holds (`engines.selection`) must be the one the numpy reference
makes from the same weights, layer by layer, on the committed trained models whose indexers keep
fewer units than a query sees: csa-top4 (deepseek4, 4 of 32 entries at 128 tokens) and
glm-kpool-top4 (glm5-next, 4 of 16 pools at 64 tokens).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvphase.backends import llamacpp_backend, reference_backend
from kvphase.backends.base import Query
from kvphase.cli import app
from kvphase.sweep.selection import SelectionReader, selection_by_residue, where_lost
from tests.helpers.cli_checks import one_line_error
from tests.helpers.paths import REPO
from tests.helpers.same_values import assert_same_values

CSA_TOP4 = REPO / "tests" / "data" / "trained" / "csa-top4.gguf"
GLM_TOP4 = REPO / "reports" / "trained" / "engine" / "glm-kpool-top4-seed0" / "model.gguf"
OLD_RUN = GLM_TOP4.parent / "sweep"  # a run folder written before selection records existed


@pytest.mark.parametrize("path, n_context, n_units", [(CSA_TOP4, 128, 32), (GLM_TOP4, 64, 16)])
def test_llamacpp_selects_what_the_reference_selects_in_each_layer(path, n_context, n_units):
    rng = np.random.default_rng(0)
    engine = llamacpp_backend(path, n_ctx=n_context + 8, options={"selection": True})
    reference = reference_backend(path, n_ctx=n_context + 8, options={"design": "trained"})
    for _ in range(4):
        context = [int(t) for t in rng.integers(10, 800, n_context)]
        query = Query(tuple(int(t) for t in rng.integers(10, 800, 2)), tuple(int(t) for t in rng.integers(10, 800, 2)))
        _, ours = SelectionReader(engine).score(context, query)
        _, theirs = SelectionReader(reference).score(context, query)
        assert sorted(ours) == sorted(theirs) and len(theirs) == 2, (sorted(ours), sorted(theirs))
        for layer, chosen in theirs.items():
            assert ours[layer].tolist() == chosen.tolist(), f"layer {layer}: llama.cpp {ours[layer]}, ref {chosen}"
            assert 0 < len(chosen) < n_units  # the indexer drops units: the selection is in play
        assert any(ours[a].tolist() != ours[b].tolist() for a in ours for b in ours)  # layers differ: a mix-up shows
        assert {layer: chosen.tolist() for layer, chosen in theirs.items()} == \
            selection_at(reference, context, query, n_context + len(query.prompt) - 1)


def selection_at(reference, context: list[int], query: Query, row: int) -> dict[int, list[int]]:
    """Each layer's pools or entries the reference selected at `row` (the query's last token: its
    logits predict the answer's first token), read from the reference model as it scores."""
    reference.model.selections = {}
    reference.score(context, [query])
    found = {layer: sorted(int(u) for u in top[row] if u >= 0) for layer, top in reference.model.selections.items()}
    reference.model.selections = None
    return found


def test_a_sweep_records_the_selection_and_llamacpp_and_the_reference_agree(tmp_path):
    from kvphase.sweep.api import sweep

    result = CliRunner().invoke(app, ["sweep", str(GLM_TOP4), "--selection", "--per-residue", "8", "--threads", "1",
                                      "--out", str(tmp_path / "engine"), "-q"])
    assert result.exit_code == 0, result.output
    sweep(GLM_TOP4, selection=True, per_residue="8", backend="reference", design="trained", out=tmp_path / "reference")
    engine, reference = (pd.read_csv(tmp_path / name / "results.csv") for name in ("engine", "reference"))
    columns = ["target_id", "answer_pos", "indexer_layers", "selected_layers", "selected_share", "selected_all"]
    pd.testing.assert_frame_equal(engine[columns], reference[columns])
    assert (engine["answer_pos"] == engine["target_pos"] + 1).all()  # pairs: " key", " value", one token each
    assert (engine["indexer_layers"] == "1;2").all()  # the file's MLA layers; layer 0 is KDA
    assert 0 < engine["selected_share"].mean() < 1
    assert json.loads((tmp_path / "engine" / "config.json").read_text())["selection"] is True
    report = (tmp_path / "engine" / "report.md").read_text()
    assert "## Indexer selection" in report and "| residue | n | accuracy | layer 1 | layer 2 |" in report


def test_an_old_run_folder_reports_as_before(tmp_path):
    """Re-reported from its own results.csv, a folder from before selection records says what it said:
    every word and count exactly, its floats as far as numpy's reductions reproduce on another CPU
    (same_values; bytes differed in the 16th digit on an AVX2 host, issue 71)."""
    from kvphase.sweep.report import build_report

    folder = shutil.copytree(OLD_RUN, tmp_path / "old")
    build_report(folder)
    assert_same_values(folder, OLD_RUN, ("report.md", "summary.json"))
    assert "selection" not in json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("model, fragment", [
    (REPO / "tests" / "data" / "trained" / "dense.gguf", "needs a model with an indexer"),
    (GLM_TOP4, "needs the file's own indexer"),
])
def test_selection_without_an_indexer_is_one_line_and_leaves_no_folder(tmp_path, model, fragment):
    extra = ["--backend", "reference", "--design", "dense"] if model == GLM_TOP4 else []
    result = CliRunner().invoke(app, ["sweep", str(model), "--selection", "--out", str(tmp_path / "run"), *extra])
    one_line_error(result, "--selection", fragment)
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def tiny_minimax(default_model, tmp_path_factory):
    """The tiny minimax-m3 (kvphase.gguf.tiny): MSA on layers 1 and 2, two head groups, blocks of 4
    tokens, top-k 3 with 1 local block, so its indexer drops blocks from 13 tokens on."""
    from kvphase.gguf.tiny import write_tiny_model

    return write_tiny_model("minimax-m3", tmp_path_factory.mktemp("mm3") / "mm3.gguf", tokenizer_from=default_model)


class IndexerInputs:
    """A tap that keeps minimax-m3's indexer q and k after RoPE from every decode (unnamed ROPE
    nodes, found as `kvphase validate` finds them: `validate.msa.MSACheck.want`)."""

    every_decode = True

    def __init__(self, info):
        from kvphase.validate.msa import MSACheck

        self.want, self.arrays = MSACheck(info).want, []

    def select(self, name, layer, t):
        key = self.want(name, layer, t)
        return key if key and key[0] in ("msa_iq", "msa_ik") else None

    def update(self, key, array, positions):
        self.arrays.append((key, np.asarray(positions).copy(), array.copy()))

    def layer(self, layer: int, position: int) -> tuple[np.ndarray, np.ndarray]:
        """The indexer queries of `position`, (1, head groups, d), and the keys of every position, (n, d)."""
        keys = {int(p): row for (kind, at), positions, array in self.arrays if (kind, at) == ("msa_ik", layer)
                for p, row in zip(positions, array.reshape(len(positions), -1))}
        query = [array.reshape(len(positions), -1, array.shape[-1])[list(positions).index(position)]
                 for (kind, at), positions, array in self.arrays if (kind, at) == ("msa_iq", layer)
                 and position in positions]
        return np.stack(query[-1:]), np.stack([keys[p] for p in range(len(keys))])


def test_llamacpp_selects_the_blocks_msa_selects_in_each_layer_and_head_group(tiny_minimax):
    from kvphase.designs.msa import MSA
    from kvphase.gguf.modelinfo import read_model_info

    info = read_model_info(tiny_minimax)
    params = info.compression.params
    msa = MSA(params["block_size"], params["top_k"], params["local_blocks"], cache_dtype="f16")  # the default cache
    engine = llamacpp_backend(tiny_minimax, n_ctx=128, options={"selection": True})
    rng, differ = np.random.default_rng(0), []  # (layers, head groups of layer 1) chose differently
    for n_context in (61, 64, 70, 4):  # 4: two visible blocks, so the top-k of 3 also takes an unseen one
        context = [int(t) for t in rng.integers(10, 800, n_context)]
        query = Query(tuple(int(t) for t in rng.integers(10, 800, 3)), tuple(int(t) for t in rng.integers(10, 800, 2)))
        position = n_context + len(query.prompt) - 1  # its logits predict the answer's first token
        _, ours = SelectionReader(engine).score(context, query)
        inputs = engine.tap_point.tap = IndexerInputs(info)
        engine.score(context, [query])
        assert sorted(ours) == [1, 2], sorted(ours)  # the MoE layers; layer 0 is dense
        for layer, chosen in ours.items():
            queries, keys = inputs.layer(layer, position)
            reference = msa.forward(queries, keys, np.array([position]))
            assert not reference.ambiguous.any()
            theirs = [sorted(int(b) for b in group if b >= 0) for group in reference.top_blocks[0]]
            assert chosen.tolist() == theirs, f"layer {layer} at position {position}: llama.cpp {chosen.tolist()}, " \
                                              f"MSA {theirs}"
            own_block = position // params["block_size"]
            assert chosen.shape == (2, min(params["top_k"], own_block + 1)) and (chosen[:, -1] == own_block).all()
        differ.append((ours[1].tolist() != ours[2].tolist(), (ours[1][0] != ours[1][1]).any()))
    assert any(layers for layers, _ in differ) and any(groups for _, groups in differ)  # a mix-up would show


def test_a_one_token_query_is_refused_naming_the_decode_path(tiny_minimax):
    from kvphase.errors import BackendError

    engine = llamacpp_backend(tiny_minimax, n_ctx=64, options={"selection": True})
    with pytest.raises(BackendError, match="msa_block_mask only in a decode of two or more tokens"):
        SelectionReader(engine).score(list(range(10, 50)), Query((5,), (8,)))


def test_a_minimax_sweep_records_each_targets_block(default_model, tmp_path):
    from kvphase.gguf.tiny import write_tiny_model

    # the same weights keeping 60 blocks: at the tiny plan's 960 tokens (240 blocks) the file's own 3
    # select no target's block, and a record that never varies would pass anything
    model = write_tiny_model("minimax-m3", tmp_path / "mm3-top60.gguf", tokenizer_from=default_model, top_k=60)
    result = CliRunner().invoke(app, ["sweep", str(model), "--selection", "--per-residue", "2", "--threads", "1",
                                      "--out", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "run" / "results.csv")
    assert (rows["indexer_layers"] == "1;2").all()
    assert (rows["answer_pos"] > rows["target_pos"]).all() and (rows["answer_pos"] < rows["target_pos"] + 8).all()
    assert 0 < rows["group_share"].mean() < 1 and 0 < rows["selected_share"].mean() < 1
    assert ((rows["group_share"] > 0) == (rows["selected_share"] > 0)).all()
    near = rows["answer_pos"] // 4 == rows["query_pos"] // 4  # not in this plan: the footer fills the last block
    assert (rows["local_block"] == near).all() and not near.any()
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Indexer selection" in report and "any of its head groups chose it" in report
    assert "| head groups | local block | accuracy outside local |" in report
    lines = (tmp_path / "run" / "results.csv").read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + ",sometimes"  # local_block
    (tmp_path / "run" / "results.csv").write_text("\n".join(lines) + "\n")
    one_line_error(CliRunner().invoke(app, ["report", str(tmp_path / "run")]), "results.csv: local_block is 'sometimes'")


def test_a_targets_block_is_selected_by_a_layer_when_any_head_group_chose_it():
    from kvphase.sweep.selection import Indexer, selection_row

    chosen = {1: np.array([[3, 11, 16], [2, 5, 16]]), 2: np.array([[8, 14, 16], [13, 14, 16]])}
    blocks, query_pos = Indexer(4, per_group=True, local_blocks=1), 66  # the query token in block 16
    assert selection_row(57, chosen, blocks, query_pos) == {  # block 14: both groups of layer 2, none of layer 1
        "answer_pos": 57, "indexer_layers": "1;2", "selected_layers": "2", "selected_share": 0.5,
        "selected_all": False, "group_share": 0.5, "local_block": False}
    one_group = selection_row(12, chosen, blocks, query_pos)  # block 3: one group of four, in layer 1
    assert (one_group["selected_layers"], one_group["group_share"]) == ("1", 0.25)
    assert selection_row(40, chosen, blocks, query_pos)["selected_layers"] == ""  # block 10: none
    local = selection_row(65, chosen, blocks, query_pos)
    assert (local["local_block"], local["selected_all"], local["group_share"]) == (True, True, 1.0)
    assert selection_row(63, chosen, blocks._replace(local_blocks=2), query_pos)["local_block"]  # block 15
    assert not selection_row(63, chosen, blocks, query_pos)["local_block"]
    pools = selection_row(57, {1: np.array([14]), 2: np.array([3, 13])}, Indexer(4), query_pos)
    assert pools == {"answer_pos": 57, "indexer_layers": "1;2", "selected_layers": "1", "selected_share": 0.5,
                     "selected_all": False}  # one group per layer: the columns of glm5-next and deepseek4


def test_selection_with_the_reference_on_minimax_m3_is_one_line(tmp_path, tiny_minimax):
    result = CliRunner().invoke(app, ["sweep", str(tiny_minimax), "--selection", "--backend", "reference",
                                      "--design", "trained", "--out", str(tmp_path / "run")])
    one_line_error(result, "--selection", "does not run minimax-m3", "--backend llama.cpp")
    assert not (tmp_path / "run").exists()


def rows(residue: int, outcomes: list[tuple[bool, float]]) -> pd.DataFrame:
    """(correct, share of layers that selected it) per target, two indexer layers."""
    return pd.DataFrame([{"residue": residue, "correct": correct, "indexer_layers": "1;2",
                          "selected_layers": {0: "", 0.5: "2", 1: "1;2"}[share], "selected_share": share,
                          "selected_all": share == 1} for correct, share in outcomes])


def test_the_weak_residue_is_said_lost_where_most_of_its_misses_were():
    at_selection = rows(3, [(False, 0), (False, 0), (False, 0.5), (True, 1)])
    assert "2 of its 3 missed targets were selected by no indexer layer" in where_lost(at_selection, 3)
    assert "(accuracy 50.0% among the 2 targets some layer selected, 0.0% among the 2 none did)" in \
        where_lost(at_selection, 3)
    assert "lost them at selection" in where_lost(at_selection, 3)
    after = rows(3, [(False, 1), (False, 0.5), (True, 0), (True, 1)])
    assert "lost them after selection" in where_lost(after, 3)
    table = selection_by_residue(pd.concat([at_selection, rows(0, [(True, 1), (True, 0.5)])])).set_index("residue")
    columns = ["n", "accuracy", "layer 1", "layer 2", "every layer", "no layer", "accuracy if some layer"]
    assert table.loc[0, columns].tolist() == [2, 100.0, 50.0, 100.0, 50.0, 0.0, 100.0]
    assert np.isnan(table.loc[0, "accuracy if none"])
    assert table.loc[3, columns + ["accuracy if none"]].tolist() == [4, 25.0, 25.0, 50.0, 25.0, 50.0, 50.0, 0.0]


def test_a_damaged_selection_column_is_one_line(tmp_path):
    folder = shutil.copytree(GLM_TOP4.parent / "sweep-selection", tmp_path / "run")
    rows_text = (folder / "results.csv").read_text().splitlines()
    rows_text[1] = rows_text[1].rsplit(",", 1)[0] + ",maybe"  # selected_all
    (folder / "results.csv").write_text("\n".join(rows_text) + "\n")
    one_line_error(CliRunner().invoke(app, ["report", str(folder)]), "results.csv: selected_all is 'maybe'")
