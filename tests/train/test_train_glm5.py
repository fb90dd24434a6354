"""GLM-5.3's k-pool trained by kvphase and run by llama.cpp's own `glm5-next`.

The JAX forward (kvphase/train/glm5.py) must equal what llama.cpp computes from the exported
file, with a top-k that keeps fewer pools than a query sees (so the selection is in play,
ties at ReLU's 0 included) and for the twin that keeps every pool, with the KDA layer
trained or off, and with every trained tensor away from its initial value so that a wrong
name, transpose or half shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

from kvphase.reference.agreement import CLEAR_LEAD, agreement, lead, llamacpp_logits  # noqa: E402
from tests.helpers.trained import perturbed_params, sweep_summary, train_refused_in_one_line, zeroed_copy  # noqa: E402
from kvphase.train.config import TrainConfig  # noqa: E402
from tests.helpers.paths import TRAINED  # noqa: E402

TOLERANCE = 1e-4  # F32 weights and cache, no flash attention, one batch: rounding only

pytestmark = pytest.mark.slow


def small_config(design: str, **changes) -> TrainConfig:
    sizes = dict(design=design, layers=2, heads=2, d_model=32, context=48, queries=2, records=4, steps=2, eval_every=1,
                 eval_sequences=4, batch=2, top_k=3)
    return TrainConfig(**{**sizes, **changes})


def exported(tmp_path, config: TrainConfig):
    from kvphase.train.data import PairData
    from kvphase.train.export import export_gguf

    data = PairData.of(config)
    params = perturbed_params(config, len(data.vocab))
    path = export_gguf(tmp_path / f"{config.design}.gguf", params, config, data.vocab, step=0)
    return path, params, data.evaluation_batch().tokens[0]  # (T,) a training-shaped sequence


def engine_logits(path, tokens) -> np.ndarray:
    return llamacpp_logits(path, tokens.tolist(), type_k=0, type_v=0, flash_attn=False, n_batch=512, n_ubatch=512)


def assert_agrees(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    result = agreement(ours, theirs)
    clear = lead(theirs) > CLEAR_LEAD
    assert result.max_diff < TOLERANCE * max(1.0, float(np.abs(theirs).max())), f"{what}: {result}"
    assert np.all(ours.argmax(1)[clear] == theirs.argmax(1)[clear]), f"{what}: {result}"


@pytest.mark.parametrize("design, kda", [("glm-kpool", "trained"), ("glm-dense", "trained"), ("glm-kpool", "off")])
def test_llamacpp_runs_the_trained_layout_as_trained(tmp_path, design, kda):
    from kvphase.train.glm5 import logits

    config = small_config(design, kda=kda)
    path, params, tokens = exported(tmp_path, config)
    assert_agrees(np.asarray(logits(params, tokens[None], config))[0], engine_logits(path, tokens), f"{design} {kda}")


def test_the_selection_is_in_play(tmp_path):
    """The same weights read through 3 pools and through every pool give other logits (an export
    whose top-k kept everything would pass the agreement test above unnoticed)."""
    from kvphase.train.glm5 import logits

    sparse, dense = small_config("glm-kpool"), small_config("glm-dense")
    _, params, tokens = exported(tmp_path, sparse)
    a = np.asarray(logits(params, tokens[None], sparse))[0]
    b = np.asarray(logits(params, tokens[None], dense))[0]
    assert np.abs(a - b)[4 * 4:].max() > 1e-2  # past the first pools, where 3 pools are fewer than the visible ones


def test_llamacpps_top_k_selects_the_pools_training_selected(tmp_path):
    """`indexer_top_k` captured from llama.cpp's graph equals the JAX selection as a set at every
    query of every layer, ties included: ReLU scores tie at exactly 0, and training breaks those
    ties as llama.cpp's CPU partial sort does (with the lower index instead, some sets differ:
    counted, so this sequence does exercise ties)."""
    import jax.numpy as jnp

    from kvphase.designs.windows import top_k_indices
    from kvphase.engines.capture import EngineSettings, by_name, run_and_capture
    from kvphase.train.glm5 import _llamacpp_choice, attention, feed_forward, kda, pool_scores, rms

    config = small_config("glm-kpool")
    path, params, tokens = exported(tmp_path, config)
    run = run_and_capture(path, tokens.tolist(), [len(tokens)], by_name(["indexer_top_k"]),
                          EngineSettings(n_threads=1, flash_attn=False))
    x = params["wte"][jnp.asarray(tokens)[None]]  # (1, T, d)
    x = feed_forward(x + kda(rms(x, params["kda"]["attn_norm"]), params["kda"], config), params["kda"])
    lower_index_differs = 0
    for layer, block in enumerate(params["blocks"]):
        a = rms(x, block["attn_norm"])
        scores = np.asarray(pool_scores(a, rms(a @ block["q_a"], block["q_a_norm"]), block, config))[0]  # (T, n_pool)
        got = run.get("indexer_top_k", layer + 1, 0).reshape(len(tokens), -1)  # (T, n_top): layer 0 is KDA
        ours = _llamacpp_choice(scores, config.top_k)  # (T, n_pool)
        lower = top_k_indices(scores, config.top_k)  # (T, top_k)
        for t in range(len(tokens)):
            n_top = int(ours[t].sum())
            assert set(got[t][:n_top].tolist()) == set(np.flatnonzero(ours[t]).tolist()), (layer, t, got[t], scores[t])
            lower_index_differs += set(lower[t][lower[t] >= 0].tolist()) != set(np.flatnonzero(ours[t]).tolist())
        out, _ = attention(a, block, config, sparse=True)
        x = feed_forward(x + out, block)
    assert lower_index_differs > 0, "no tie at the top-k boundary: the test does not exercise tie-breaking"


def test_the_tie_breaking_is_libstdcxx_partial_sort():
    """partial_sort_sets against std::partial_sort itself (ggml_top_k's CPU kernel), compiled here, on
    rows full of ties, for every k and row length the trained models use and some they do not."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from kvphase.designs.windows import partial_sort_sets

    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler builds llama-cpp-python; none was found"
    source = r"""
    #include <algorithm>
    #include <cstdio>
    #include <vector>
    int main() { unsigned s = 7; for (int n = 2; n <= 24; n++) for (int k = 1; k < n; k++) for (int r = 0; r < 40; r++) {
      std::vector<float> v(n); std::vector<int> idx(n);
      for (int j = 0; j < n; j++) { s = s * 1103515245u + 12345u; v[j] = (float) ((s >> 16) % 4) - 1.0f; idx[j] = j; }
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) { return v[a] > v[b]; });
      std::sort(idx.begin(), idx.begin() + k);
      printf("%d %d |", n, k); for (int j = 0; j < n; j++) printf(" %g", v[j]); printf(" |");
      for (int j = 0; j < k; j++) printf(" %d", idx[j]); printf("\n"); } }
    """
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.cpp").write_text(source)
        subprocess.run([compiler, "-O1", "-o", str(Path(tmp) / "t"), str(Path(tmp) / "t.cpp")], check=True)
        lines = subprocess.run([str(Path(tmp) / "t")], check=True, capture_output=True, text=True).stdout.splitlines()
    wrong = []
    for line in lines:
        head, row, kept = line.split("|")
        k = int(head.split()[1])
        got = sorted(partial_sort_sets(np.array([[float(x) for x in row.split()]], np.float32), k)[0].tolist())
        wrong += [line] if got != [int(x) for x in kept.split()] else []
    assert len(lines) > 10000 and not wrong, f"{len(wrong)} of {len(lines)} rows differ, e.g. {wrong[:3]}"


def test_the_numpy_reference_runs_the_exported_file_as_llamacpp_does(tmp_path):
    """`--backend reference` on a glm5-next file: kvphase.reference.glm5 (built on the KPool design
    `kvphase validate` checks) against llama.cpp."""
    from kvphase.reference import open_model

    path, _, tokens = exported(tmp_path, small_config("glm-kpool"))
    model = open_model(path)
    assert_agrees(model.forward(tokens.tolist(), model.new_cache()), engine_logits(path, tokens), "reference")


def test_the_reference_refuses_a_glm5_file_outside_the_minimal_configuration(tmp_path):
    from kvphase.errors import ModelFileError
    from kvphase.gguf.tiny import write_tiny_model
    from kvphase.reference import open_model

    path = write_tiny_model("glm5-next", tmp_path / "tiny.gguf")  # random hyper-connections and a live KDA layer
    with pytest.raises(ModelFileError, match="identity hyper-connections"):
        open_model(path)


def test_kvphase_validate_passes_on_the_exported_file(tmp_path):
    """`kvphase validate` (llama.cpp's k-pool indexer against the KPool design) on a glm-kpool file."""
    from typer.testing import CliRunner

    from kvphase.cli import app

    path, _, _ = exported(tmp_path, small_config("glm-kpool"))
    result = CliRunner().invoke(app, ["validate", str(path), "--threads", "1", "--tokens", "48"])
    assert result.exit_code == 0 and result.output.strip().endswith("PASS"), result.output


@pytest.mark.parametrize("args, fragment", [
    (["glm-kpool", "--stagger", "head"], "takes no --stagger or --offsets"),
    (["glm-dense", "--offsets", "random"], "takes no --stagger or --offsets"),
    (["glm-kpool", "--local-window", "4"], "takes no --local-window"),
    (["glm-kpool", "--dense-steps", "-1"], "--dense-steps must be an integer"),
    (["glm-kpool", "--kda", "on"], "unknown --kda 'on'"),
    (["csa", "--kda", "off"], "belong to the glm designs"),
    (["gated", "--dense-steps", "5"], "belong to the glm designs"),
])
def test_bad_options_for_glm5_are_one_line_and_leave_no_folder(tmp_path, args, fragment):
    train_refused_in_one_line(tmp_path, args, fragment)


def test_kvphase_train_glm_kpool_exports_a_file_llamacpp_loads_and_sweeps(tmp_path):
    """The command end to end with the layout's defaults (a smaller batch), past the dense warm-up into sparse steps:
    a glm5-next file `kvphase inspect` names and `kvphase sweep` runs through llama.cpp."""
    from typer.testing import CliRunner

    from kvphase.cli import app

    runner = CliRunner()
    out = tmp_path / "run"
    done = runner.invoke(app, ["train", "glm-kpool", str(out), "--steps", "3", "--dense-steps", "1", "--eval-every", "3",
                               "--batch", "4", "--quiet"])
    assert done.exit_code == 0, done.output
    saved = json.loads((out / "config.json").read_text())
    assert (saved["heads"], saved["batch"], saved["kda"], saved["top_k"]) == (2, 4, "trained", 8)
    shown = runner.invoke(app, ["inspect", str(out / "model.gguf")])
    assert shown.exit_code == 0 and "glm5-next" in shown.output and "kpool" in shown.output, shown.output
    swept = runner.invoke(app, ["sweep", str(out / "model.gguf"), "--per-residue", "8", "--out", str(tmp_path / "s"),
                                "--quiet"])
    assert swept.exit_code == 0, swept.output
    assert json.loads((tmp_path / "s" / "config.json").read_text())["backend"] == "llama.cpp"


GLM_DENSE = TRAINED / "glm-dense.gguf"  # reports/trained/engine/glm-dense-seed0: the twin that retrieves


@pytest.fixture(scope="module")
def twin_run(tmp_path_factory) -> dict:
    """The committed dense twin swept once through llama.cpp (the default for this file)."""
    return sweep_summary(GLM_DENSE, tmp_path_factory.mktemp("twin") / "run")


def test_the_dense_twin_retrieves_and_the_sweep_finds_no_weak_spot_through_llamacpp(twin_run):
    """A twin that answers (measured 95-97% through llama.cpp) and has no phase structure to find:
    the sweep must not report one (measured gap 2-3 points, p 0.56-0.78)."""
    assert twin_run["mean_accuracy"] >= 85, twin_run["per_residue"]
    assert twin_run["test"]["p_value"] > 1e-3 and twin_run["gap"] < 10, (twin_run["gap"], twin_run["test"])


def test_the_committed_twin_sweeps_alike_through_llamacpp_and_the_reference(tmp_path, twin_run):
    reference = sweep_summary(GLM_DENSE, tmp_path / "reference", "--backend", "reference")
    for a, b in zip(twin_run["per_residue"], reference["per_residue"]):
        assert abs(a["correct"] - b["correct"]) <= 2, (twin_run["per_residue"], reference["per_residue"])
        assert abs(a["mean_logprob"] - b["mean_logprob"]) < 0.02, (a, b)


def test_switching_the_kda_layer_off_in_the_file_costs_the_retrieval(tmp_path, twin_run):
    """The KDA layer is the model's only source of token order (its MLA layers are NoPE): zero its
    output in the file and llama.cpp's answers fall to the NoPE plateau or below (measured 16.8%)."""
    off = zeroed_copy(GLM_DENSE, tmp_path / "kda-off.gguf", ["blk.0.attn_output.weight"])
    without = sweep_summary(off, tmp_path / "off")
    assert without["mean_accuracy"] < twin_run["mean_accuracy"] / 2, (twin_run["mean_accuracy"], without["mean_accuracy"])


def test_glm_msa_runs_in_the_reference_as_trained_and_its_selection_is_in_play(tmp_path):
    """glm-msa (MSA's block max selection in the glm5-next layout): the numpy reference on the
    exported file (designs/msa.py's MSA over the indexer) equals the JAX forward; the same weights
    read through every block (glm-dense) give other logits, so the selection counts."""
    from kvphase.reference import open_model
    from kvphase.train.glm5 import logits

    config = small_config("glm-msa")
    path, params, tokens = exported(tmp_path, config)
    model = open_model(path)
    ours = np.asarray(logits(params, tokens[None], config))[0]
    assert_agrees(model.forward(tokens.tolist(), model.new_cache()), ours, "glm-msa reference")
    everything = np.asarray(logits(params, tokens[None], small_config("glm-dense")))[0]
    assert np.abs(ours - everything)[4 * 5:].max() > 1e-2  # past the first 4 blocks (own block + top 3)


def test_glm_msa_files_are_refused_by_llamacpp_paths(tmp_path):
    """llama.cpp's glm5-next computes k-pool, not MSA: a sweep through it and `kvphase validate` refuse
    the file in one line; the sweep's default backend is the reference."""
    from typer.testing import CliRunner

    from kvphase.cli import app
    from kvphase.gguf.modelinfo import read_model_info
    from kvphase.sweep.plan import SweepDefaults

    path, _, _ = exported(tmp_path, small_config("glm-msa"))
    assert SweepDefaults.for_model(read_model_info(path)).backend == "reference"
    for args in (["sweep", str(path), "--backend", "llama.cpp", "--quiet", "--out", str(tmp_path / "s")],
                 ["validate", str(path), "--threads", "1", "--tokens", "48"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1 and "glm-msa" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_glm_msa_distils_its_indexer_on_scaled_scores():
    """MSA's block scores are unscaled dot products; distilled as they were, the indexer's gradient
    (norm 1.28 at initialisation against k-pool's 0.65) shared the global-norm clip with the model's
    and no run learned the retrieval (reports/README.md). Scaled by 1/sqrt(d_idx), its gradient is no
    larger than k-pool's, and the selection (a top-k, blind to a positive scale) is unchanged."""
    import jax
    import optax

    from kvphase.train.loop import Trainer, _answer_stats
    from kvphase.train.model import draw_starts

    def indexer_gradient_norm(design):
        trainer = Trainer.new(TrainConfig.for_design(design))
        batch = trainer.data.training_batch(0)
        starts = draw_starts(trainer.config, np.random.default_rng(0), trainer.config.batch)
        aux = lambda p: _answer_stats(p, batch.tokens, starts, batch.answers, trainer.config, False)[2]  # noqa: E731
        return float(optax.global_norm(jax.grad(aux)(trainer.params)))

    msa, kpool = indexer_gradient_norm("glm-msa"), indexer_gradient_norm("glm-kpool")
    assert 0 < msa <= kpool, f"glm-msa's indexer gradient {msa:.3f}, k-pool's {kpool:.3f}"


def test_the_committed_msa_model_retrieves_through_the_reference_with_no_weak_spot(tmp_path):
    """tests/data/trained/glm-msa.gguf (reports/trained/glm-msa-seed0, 1.6 MB): `kvphase sweep FILE`
    goes through the reference (llama.cpp would run the file's untrained k-pool keys) and finds what
    the study measured: retrieval (97.6%) and no phase effect (gap 1.6, p 0.70)."""
    run = sweep_summary(TRAINED / "glm-msa.gguf", tmp_path / "run")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["backend"] == "reference"
    assert run["mean_accuracy"] >= 85, run["per_residue"]
    assert run["test"]["p_value"] > 1e-3 and run["gap"] < 10, (run["gap"], run["test"])
