"""kvphase train: the JAX mirror equals the numpy reference, training learns, runs resume,
exports round-trip through inspect and sweep, bad options are one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.train.config import TrainConfig
from tests.helpers.paths import TRAINED
from tests.helpers.trained import TINY_TRAINING, loud, numpy_logits, tiny_trainer

jax = pytest.importorskip("jax", reason="the training extra is installed by make test; CI runs these")

runner = CliRunner()


@pytest.mark.parametrize("design,fix", [
    ("dense", {}), ("meanpool", {}), ("gated", {}), ("kpool", {}),
    ("gated", {"stagger": "head"}), ("gated", {"stagger": "layer_head"}), ("meanpool", {"stagger": "layer"}),
    ("rolling", {}),
])
@pytest.mark.slow
def test_trained_forward_equals_the_numpy_reference(tmp_path, design, fix):
    """The JAX forward and the numpy reference (designs/ + reference/gpt2.py) on the same weights."""
    from kvphase.train.export import export_gguf
    from kvphase.train.model import draw_starts, forward

    trainer = tiny_trainer(design, **fix)
    params = loud(trainer.params, np.random.default_rng(1))
    path = tmp_path / "m.gguf"
    export_gguf(path, params, trainer.config, trainer.data.vocab, 0)
    batch = trainer.data.batch(np.random.default_rng(7), 3)
    starts = draw_starts(trainer.config, np.random.default_rng(0), 3)
    hidden, _ = forward(params, batch.tokens, starts, trainer.config)
    expected = np.asarray(hidden @ params["wte"].T)  # (3, T, n_vocab)
    got = numpy_logits(path, batch.tokens)
    diff = np.abs(got - expected)
    assert diff.max() < 1e-4, f"max diff {diff.max():.3g}, mean {diff.mean():.3g} (logits up to {np.abs(expected).max():.3g})"


@pytest.mark.slow
def test_the_equality_test_sees_a_wrong_phase_bias(tmp_path):
    """Planted bug: the numpy side reads the per-phase bias one slot off; the forward must differ."""
    from kvphase.train.export import export_gguf
    from kvphase.train.model import draw_starts, forward

    trainer = tiny_trainer("gated")
    params = loud(trainer.params, np.random.default_rng(1))
    batch = trainer.data.batch(np.random.default_rng(7), 2)
    hidden, _ = forward(params, batch.tokens, draw_starts(trainer.config, np.random.default_rng(0), 2), trainer.config)
    rolled = jax.tree_util.tree_map_with_path(
        lambda p, x: np.roll(np.asarray(x), 1, axis=1) if getattr(p[-1], "key", "") == "ape" else x, params)
    export_gguf(tmp_path / "m.gguf", rolled, trainer.config, trainer.data.vocab, 0)
    diff = np.abs(numpy_logits(tmp_path / "m.gguf", batch.tokens) - np.asarray(hidden @ params["wte"].T))
    assert diff.max() > 1e-2


@pytest.mark.slow
def test_a_short_training_run_lowers_the_loss():
    from kvphase.train.loop import Trainer

    trainer = Trainer.new(TrainConfig(design="gated", **{**TINY_TRAINING, "steps": 60, "eval_every": 60, "lr": 1e-2}))
    first = np.mean([trainer.train_step()[0] for _ in range(5)])
    trainer.run(60)
    last = np.mean([trainer.train_step()[0] for _ in range(5)])
    assert last < first - 0.5, f"loss {first:.3f} -> {last:.3f}"


@pytest.mark.slow
def test_resume_from_a_checkpoint_gives_the_weights_of_an_uninterrupted_run(tmp_path):
    from kvphase.train.run import train

    config = TrainConfig(design="gated", offsets="random", **{**TINY_TRAINING, "steps": 6, "eval_every": 3})
    whole = train(config, tmp_path / "whole")

    def interrupt(metrics):
        if metrics.step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path / "split", on_step=interrupt)
    resumed = train(config, tmp_path / "split")
    for a, b in zip(jax.tree_util.tree_leaves(whole.params), jax.tree_util.tree_leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = (tmp_path / "split" / "results.csv").read_text().splitlines()
    assert rows == (tmp_path / "whole" / "results.csv").read_text().splitlines()
    kept = {name: (tmp_path / "whole" / name).read_bytes() for name in ("results.csv", "training.csv", "manifest.json")}
    train(config, tmp_path / "whole")  # a finished run run again (a study script's resume) changes no file
    assert {name: (tmp_path / "whole" / name).read_bytes() for name in kept} == kept


@pytest.mark.slow
def test_init_starts_a_longer_context_from_another_runs_weights_and_refuses_what_does_not_fit(tmp_path):
    from kvphase.train.run import _resume, train

    short = dict(design="csa", layers=2, heads=2, d_model=16, context=40, queries=2, batch=4, eval_sequences=8,
                 steps=2, eval_every=2)
    source = train(TrainConfig(**short), tmp_path / "short")
    longer = TrainConfig(**{**short, "context": 80, "seed": 1, "init": str(tmp_path / "short")})
    started = _resume(longer, tmp_path / "long")
    assert started.step == 0
    for a, b in zip(jax.tree_util.tree_leaves(source.params), jax.tree_util.tree_leaves(started.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert json.loads((tmp_path / "long" / "config.json").read_text())["init"] == str(tmp_path / "short")

    base = ["train", "csa", "--layers", "2", "--heads", "2", "--context", "80", "--steps", "2", "--quiet"]
    for i, (extra, fragment) in enumerate(((["--init", str(tmp_path / "nowhere")], "no checkpoint.npz there"),
                            (["--d-model", "32", "--init", str(tmp_path / "short")], "cannot start this run (array"),
                            (["--d-model", "16", "--init", str(tmp_path / "long")], "no checkpoint.npz there"))):
        out = tmp_path / f"refused-{i}"
        result = runner.invoke(app, [*base, str(out), *extra])
        assert result.exit_code == 1 and fragment in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and not out.exists()
    other = TrainConfig(**{**short, "design": "csa-disjoint", "init": str(tmp_path / "short")})
    with pytest.raises(PlanError, match="trained csa; this run trains csa-disjoint"):
        _resume(other, tmp_path / "disjoint")


def test_training_runs_jax_computations_inline():
    """require_jax turns JAX's asynchronous CPU dispatch off: with it on, a step whose indexer is a
    pure_callback hung for good at times (kvphase/train/loop.py, require_jax)."""
    from jax._src import xla_bridge

    from kvphase.train.loop import require_jax

    require_jax()
    assert xla_bridge._CPU_ENABLE_ASYNC_DISPATCH.value is False


@pytest.mark.slow
def test_init_adds_the_lightning_indexer_to_a_run_that_read_every_entry(tmp_path):
    """--init from a csa run without the indexer into one with --top-k: every weight the source has is
    the source's, the indexer's are those of a fresh run of the new configuration; a source with an
    indexer cannot start a run without one."""
    from kvphase.train.loop import Trainer
    from kvphase.train.run import _resume, train

    short = dict(design="csa", layers=2, heads=2, d_model=16, context=40, queries=2, batch=4, eval_sequences=8,
                 steps=2, eval_every=2)
    source = train(TrainConfig(**short), tmp_path / "dense")
    sparse = TrainConfig(**{**short, "indexer_top_k": 2, "seed": 1, "init": str(tmp_path / "dense")})
    started = _resume(sparse, tmp_path / "sparse")

    def named(params):
        return {jax.tree_util.keystr(key): np.asarray(leaf) for key, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}

    carried, fresh = named(source.params), named(Trainer.new(sparse).params)
    added = sorted(set(fresh) - set(carried))
    assert added and all("idx_" in name for name in added), added
    for name, leaf in named(started.params).items():
        np.testing.assert_array_equal(leaf, carried[name] if name in carried else fresh[name], err_msg=name)

    started.save(tmp_path / "sparse" / "checkpoint.npz")  # a run with an indexer, as training would leave it
    with pytest.raises(PlanError, match="this model has no weight .*idx_"):
        _resume(TrainConfig(**{**short, "init": str(tmp_path / "sparse")}), tmp_path / "dropped")


@pytest.mark.slow
def test_a_folder_with_another_run_is_refused(tmp_path):
    from kvphase.errors import RunFolderError
    from kvphase.train.run import train

    train(TrainConfig(design="dense", **{**TINY_TRAINING, "steps": 2, "eval_every": 2}), tmp_path / "run")
    with pytest.raises(RunFolderError, match="different training run"):
        train(TrainConfig(design="dense", **{**TINY_TRAINING, "steps": 3, "eval_every": 3}), tmp_path / "run")


def test_vocabulary_tokenizes_in_llamacpp_as_in_training(tmp_path):
    """llama.cpp's BPE on the exported vocabulary gives the ids the training data used."""
    import llama_cpp

    from kvphase.sweep.tasks import load_task
    from kvphase.train.export import export_gguf

    trainer = tiny_trainer("dense")
    export_gguf(tmp_path / "m.gguf", trainer.params, trainer.config, trainer.data.vocab, 0)
    vocab = llama_cpp.Llama(str(tmp_path / "m.gguf"), vocab_only=True, verbose=False)
    try:
        task = load_task("pairs")
        text = " " + " ".join([task.keys[0], task.values[-1], *task.filler.split()[:3], task.keys[-1], task.values[0]])
        assert vocab.tokenize(text.encode(), add_bos=False, special=False) == trainer.data.vocab.encode(text)
        assert vocab.tokenize(b" cat", add_bos=True)[0] == trainer.data.vocab.bos_id
    finally:
        vocab.close()


@pytest.mark.parametrize("args,fragment", [
    (["transformer"], "unknown design"),
    (["gated", "--stride", "1"], "--stride must be at least 2"),
    (["gated", "--heads", "3"], "does not split into 3 heads"),
    (["gated", "--stagger", "diagonal"], "unknown --stagger"),
    (["gated", "--offsets", "random", "--stagger", "head"], "use --stagger none"),
    (["dense", "--stagger", "head"], "dense control"),
    (["rolling", "--offsets", "random"], "rolling has a window at every position to offset"),
    (["gated", "--context", "16"], "fewer than 8 windows"),
    (["gated", "--steps", "0"], "--steps must be a positive integer"),
    (["gated", "--steps", "100000000"], "--steps beyond 1000000"),
    (["gated", "--lr", "inf"], "--lr must be a positive finite number, got inf"),  # trained, then failed
    (["gated", "--lr", "nan"], "--lr must be a positive finite number, got nan"),
    (["gated", "--records", "2"], "--records must lie between --queries (4)"),
    (["gated", "--records", "40"], "what --context 64 holds (31), got 40"),
])
def test_bad_options_are_one_line(args, fragment, tmp_path):
    result = runner.invoke(app, ["train", *args[:1], str(tmp_path / "o"), *args[1:]])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert fragment in result.output and len(result.output.strip().splitlines()) == 1


def test_an_output_that_cannot_be_written_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = runner.invoke(app, ["train", "dense", str(blocker / "run"), "--steps", "1"])
    assert result.exit_code == 1 and "not a writable folder" in result.output


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_under_proc_is_one_line():
    """/proc passes the writable check (for root) and refuses the mkdir: that was a traceback (issue 22)."""
    result = runner.invoke(app, ["train", "dense", "/proc/kvphase-run", "--steps", "1", "--eval-every", "1"])
    assert result.exit_code == 1 and "/proc" in result.output, result.output  # root: mkdir refused; others: not writable
    assert len(result.output.strip().splitlines()) == 1


def test_a_missing_extra_names_the_install_command(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_jax(name, *args, **kwargs):
        if name.split(".")[0] in ("jax", "optax"):
            raise ImportError(name=name.split(".")[0])
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_jax)
    result = runner.invoke(app, ["train", "gated", str(tmp_path / "o"), "--steps", "1"])
    assert result.exit_code == 1 and "pip install 'kvphase[train]'" in result.output


def test_config_rejects_what_cannot_train():
    with pytest.raises(PlanError):
        TrainConfig(design="gated", d_model=4, heads=4)
    assert TrainConfig(design="gated", stagger="layer_head", layers=2, heads=4).starts() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert TrainConfig(design="gated", stagger="head", heads=6, d_model=48, stride=4).starts()[0] == [0, 1, 2, 3, 0, 1]


@pytest.mark.slow
def test_train_export_inspect_sweep_and_report_round_trip(tmp_path):
    """A trained file is a model like any other: inspect shows its compressor, sweep needs no options."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "gated", str(out), "--steps", "4", "--eval-every", "2", "--d-model", "16",
                                 "--heads", "2", "--context", "128", "--queries", "6", "--records", "6", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "held-out accuracy" in result.output and (out / "model.gguf").is_file()
    assert {"config.json", "results.csv", "training.csv", "summary.json", "report.md", "manifest.json",
            "training_curve.png", "checkpoint.npz"} <= {p.name for p in out.iterdir()}

    shown = runner.invoke(app, ["inspect", str(out / "model.gguf")])
    assert shown.exit_code == 0 and "trained-gated" in shown.output and "stride 4" in shown.output

    swept = runner.invoke(app, ["sweep", str(out / "model.gguf"), "--out", str(tmp_path / "sweep"), "--quiet"])
    assert swept.exit_code == 0, swept.output
    config = json.loads((tmp_path / "sweep" / "config.json").read_text())
    assert (config["stride"], config["modulus"], config["context"], config["per_residue"], config["task"],
            config["padding"], config["backend"]) == (4, 4, 128, 256, "pairs", "in-sequence", "reference")
    assert config["backend_options"] == {"design": "trained"}

    refused = runner.invoke(app, ["sweep", str(out / "model.gguf"), "--backend", "llama.cpp", "--out", str(tmp_path / "x")])
    assert refused.exit_code == 1 and "llama.cpp cannot run" in refused.output

    rebuilt = runner.invoke(app, ["report", str(out)])
    assert rebuilt.exit_code == 0 and "held-out accuracy" in rebuilt.output


@pytest.mark.slow
def test_the_dense_control_runs_in_llamacpp_as_in_the_reference(tmp_path):
    """The dense export is llama.cpp's own gpt2: its logits match the numpy GPT-2 (F32 KV cache)."""
    from kvphase.reference.agreement import llamacpp_logits
    from kvphase.train.export import export_gguf

    trainer = tiny_trainer("dense")
    params = loud(trainer.params, np.random.default_rng(3))
    path = tmp_path / "dense.gguf"
    export_gguf(path, params, trainer.config, trainer.data.vocab, 0)
    tokens = trainer.data.batch(np.random.default_rng(9), 1).tokens[0]
    expected = numpy_logits(path, tokens[None])[0]  # (T, n_vocab)
    got = llamacpp_logits(path, [int(t) for t in tokens], n_ctx=len(tokens), type_k=0, type_v=0)
    diff = np.abs(got - expected)
    print(f"llama.cpp vs reference: max {diff.max():.3g}, mean {diff.mean():.3g}, logits up to {np.abs(expected).max():.3g}")
    assert (got.argmax(1) == expected.argmax(1)).mean() == 1.0
    # ggml's GELU reads an F16 table and its matmuls round activations: a few 1e-3 at most
    assert diff.max() < 2e-2, f"max diff {diff.max():.3g}, mean {diff.mean():.3g} (logits up to {np.abs(expected).max():.3g})"


def test_training_records_are_exactly_as_many_as_asked_and_land_on_every_residue_alike():
    """`--records` records per context, never overlapping, with keys uniform over residues mod S (a
    chi-square test at 1e-3 on 4000 records), so no residue is trained more than another."""
    from scipy.stats import chisquare

    from kvphase.train.data import PairData

    config = TrainConfig(design="gated", context=64, records=4, queries=4)
    data = PairData.of(config)
    keys, values = set(data.keys.tolist()), set(data.values.tolist())
    residues = []
    for seed in range(1000):
        tokens, key_positions, answers = data.sequence(np.random.default_rng(seed))
        context = tokens[: config.context]
        at = np.flatnonzero(np.isin(context, list(keys)))  # (records,) the keys of the context
        assert len(at) == config.records and np.isin(context[at + 1], list(values)).all()
        assert set(key_positions) <= set(at) and (tokens[config.context + 1 :: 2] == answers).all()
        residues += list(at % config.stride)
    counts = np.bincount(residues, minlength=config.stride)
    assert chisquare(counts).pvalue > 1e-3, counts


POSITIVE_CONTROL = TRAINED


@pytest.mark.slow
@pytest.mark.parametrize("name,effect", [("gated", True), ("meanpool", True), ("dense", False), ("rolling", False)])
def test_a_trained_positive_control_shows_its_phase_effect_and_its_dense_twin_none(tmp_path, name, effect):
    """Committed models of the study (scripts/train_study.sh, seed 0; 0.7 MB each): `kvphase sweep FILE`
    on the gated model and on meanpool (started gated) finds the phase effect at p < 0.001; on the
    dense control and on the rolling twin (gated's pooling at every position) it does not, and the
    rolling twin retrieves (the plain dense control sits at chance). 64 targets per residue keep the
    test short; the study's own sweeps use 256."""
    out = tmp_path / name
    result = runner.invoke(app, ["sweep", str(POSITIVE_CONTROL / f"{name}.gguf"), "--per-residue", "64",
                                 "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    p, gap = summary["test"]["p_value"], summary["gap"]
    if effect:
        assert p < 1e-3 and gap >= 20, f"p = {p:.3g}, gap {gap:.1f} points"
        assert summary["headline"].startswith("Accuracy depends on the token phase")
    else:
        assert p >= 1e-3, f"the {name} control shows p = {p:.3g}, gap {gap:.1f} points"
    if name == "dense":  # at chance (25%): its gap is sampling noise at 64 targets per residue
        assert summary["headline"].startswith("No phase effect")
    if name == "rolling":  # its study sweeps: gaps 1.9-2.3 points, one of them at p = 0.046 (reports/README.md)
        assert summary["mean_accuracy"] >= 90 and gap < 10, f"rolling: {summary['mean_accuracy']:.1f}%, gap {gap:.1f}"


class _FakeJaxConfig:
    def __init__(self, cache_dir=None):
        self.jax_compilation_cache_dir, self.updates = cache_dir, {}

    def update(self, name, value):
        self.updates[name] = value


@pytest.mark.parametrize("xdg, chosen, expected", [
    ("xdg", None, "xdg/kvphase/jax"),  # the default home of the cache
    ("xdg", "mine", None),  # JAX_COMPILATION_CACHE_DIR (read by JAX itself) wins
    ("a-file", None, None),  # a folder that cannot be made: no cache, no error
])
def test_training_keeps_its_compilations_where_the_user_wants_them(tmp_path, monkeypatch, xdg, chosen, expected):
    from types import SimpleNamespace

    from kvphase.train.loop import _keep_compilations

    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / xdg))
    jax = SimpleNamespace(config=_FakeJaxConfig(chosen))
    _keep_compilations(jax)
    kept = {"jax_compilation_cache_dir": str(tmp_path / expected),
            "jax_persistent_cache_min_compile_time_secs": 0} if expected else {}
    assert jax.config.updates == kept
    if expected:
        assert (tmp_path / expected).is_dir()


@pytest.mark.slow
def test_a_training_run_fills_the_compilation_cache(tmp_path):
    """(That a run served from the cache writes the rows of one that compiled is the twenty-signals
    test's: its restarts load what the first run compiled and must end as the uninterrupted run.)"""
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "kvphase.cli", "train", "gated", str(tmp_path / "run"), "--layers", "1",
            "--d-model", "16", "--context", "40", "--batch", "4", "--steps", "10", "--eval-every", "10", "-q"]
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    done = subprocess.run(argv, capture_output=True, text=True, env={**environment, "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-400:]
    kept = sorted(path.name.split("-")[0] for path in (tmp_path / "kvphase" / "jax").iterdir())
    # the step took seconds to compile; the evaluation less than JAX's default threshold of one
    assert "jit_step" in kept and "jit_evaluate" in kept, f"the run kept only {kept}"


# each kind of stop (SIGINT, SIGTERM) in each half (starting, training) twice: twenty took a minute,
# each stop while training a new process that imports JAX and trains up to its next checkpoint
SIGNALS = 8
INTERRUPTED_ARGS = ["gated", "--layers", "2", "--heads", "2", "--d-model", "16", "--context", "40", "--batch", "8",
                    "--steps", "240", "--eval-every", "10", "-q"]


@pytest.mark.slow
def test_signals_during_training_each_keep_a_valid_checkpoint_and_the_run_ends_as_if_never_stopped(tmp_path):
    """SIGINT and SIGTERM (SIGNALS of them), alternately, at random moments, on one core as the
    campaign that found the crashes ran: half of them while the command starts (importing, compiling), half while it
    trains (stepping, evaluating, saving: a random moment after it saved a checkpoint, so every
    such stop is past some progress however fast the machine); every stop is one line with exit
    130 or 143, and the resumed run writes exactly the rows of an uninterrupted one (the
    checkpoints resumed from were whole)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from kvphase.train.run import CHECKPOINT_FILE, train

    import shutil

    # one core, as the campaign that found the crashes ran (taskset: a preexec_fn would fork this JAX process)
    pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if shutil.which("taskset") else []
    command = [*pin, sys.executable, "-m", "kvphase.cli", "train", *INTERRUPTED_ARGS[:1], str(tmp_path / "stopped"),
               *INTERRUPTED_ARGS[1:]]
    checkpoint = tmp_path / "stopped" / CHECKPOINT_FILE
    rng, stopped_at = np.random.default_rng(0), [0]
    for i in range(SIGNALS):
        signum = (signal.SIGINT, signal.SIGTERM)[i % 2]
        saved_before = checkpoint.stat().st_mtime_ns if checkpoint.exists() else None
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if i % 4 < 2:  # while starting: importing JAX alone takes longer
            time.sleep(rng.uniform(0.1, 1.0))
        else:  # while training: after this run's first checkpoint
            while process.poll() is None and (checkpoint.stat().st_mtime_ns if checkpoint.exists() else None) == saved_before:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.5))
        process.send_signal(signum)
        out, err = process.communicate(timeout=300)
        if process.returncode == 0:  # it finished before the signal
            break
        assert process.returncode == 128 + signum, f"signal {signum.name}: exit {process.returncode}: {err[-400:]}"
        assert len(err.strip().splitlines()) == 1 and err.startswith("Interrupted"), err[-400:]
        stopped_at.append(int(err.split("stopped at step ")[1].split()[0]) if "stopped at step " in err else stopped_at[-1])
    assert len(stopped_at) > SIGNALS // 2, f"only {len(stopped_at) - 1} signals landed before the run ended: {stopped_at}"
    assert len(set(stopped_at)) > 3, f"the signals landed at steps {stopped_at}: too few while training"
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-400:]

    options = dict(zip(INTERRUPTED_ARGS[1:-1:2], INTERRUPTED_ARGS[2:-1:2]))
    config = TrainConfig.for_design("gated", **{k.lstrip("-").replace("-", "_"): int(v) for k, v in options.items()})
    train(config, tmp_path / "whole")
    for name in ("results.csv", "training.csv"):
        ours, whole = ((tmp_path / run / name).read_text().splitlines() for run in ("stopped", "whole"))
        if name == "training.csv":  # steps/s and the loss mean over a session's steps differ; the steps may not
            ours, whole = [line.split(",")[0] for line in ours], [line.split(",")[0] for line in whole]
        assert ours == whole, f"{name}: {len(ours)} lines against {len(whole)}"


@pytest.mark.parametrize("design, changes", [("gated", {}), ("csa-disjoint", {}), ("glm-kpool", {"dense_steps": 0})])
def test_the_step_is_compiled_once_for_a_stage(design, changes):
    """Each model family's init (train/model.py, csa.py, glm5.py) comes out strongly typed: a weakly
    typed weight (csa's jnp.full norms) came back strongly typed from the first update, and the step
    was traced and compiled a second time."""
    from kvphase.train.loop import Trainer, _jitted_step

    config = TrainConfig.for_design(design, d_model=16, batch=4, steps=10, eval_every=10, **changes)
    trainer = Trainer.new(config)
    for _ in range(3):
        trainer.train_step()
    step = _jitted_step(config, trainer.sparse, False, config.stage(trainer.step))
    assert step._cache_size() == 1, f"{design}: the step was compiled {step._cache_size()} times in 3 steps"
