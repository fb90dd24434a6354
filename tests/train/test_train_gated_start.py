"""meanpool's gated start (`kvphase train meanpool --gate-steps N`): the first N steps pool with
gated's trained gate, the rest uniformly; the schedule restarts at the switch; the file is a
plain meanpool file. Each checked against an independently built gated or meanpool model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.train.config import TrainConfig

jax = pytest.importorskip("jax", reason="the training extra is installed by make test; CI runs these")

runner = CliRunner()
TINY = dict(layers=2, heads=2, d_model=16, context=40, queries=4, batch=8, eval_sequences=16, eval_every=2)


def trainer(design, **overrides):
    from kvphase.train.loop import Trainer

    return Trainer.new(TrainConfig(design=design, **{**TINY, "steps": 6, **overrides}))


def loud_gate(params):
    """Gates large enough that gated and uniform pooling give clearly different logits."""
    rng = np.random.default_rng(5)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jax.numpy.asarray(rng.normal(0, 3.0, size=x.shape), jax.numpy.float32)
        if getattr(p[-1], "key", "") in ("gate", "ape") else x, params)


def without_gate(params):
    return {**params, "blocks": [{k: v for k, v in b.items() if k not in ("gate", "ape")} for b in params["blocks"]]}


def test_the_first_gate_steps_pool_as_gated_and_the_rest_uniformly():
    """The loss a step reports (before its update) and the evaluation equal a gated model's on the
    same weights during the gated start, and a meanpool model's after it."""
    start = trainer("meanpool", gate_steps=2)
    start.params = loud_gate(start.params)
    gated, uniform = trainer("gated"), trainer("meanpool")
    gated.params, uniform.params = start.params, without_gate(start.params)
    assert not np.allclose(gated.evaluate().logprob, uniform.evaluate().logprob, atol=1e-3)  # the stages differ
    np.testing.assert_allclose(start.evaluate().logprob, gated.evaluate().logprob, atol=1e-5)
    assert start.train_step()[0] == pytest.approx(gated.train_step()[0], abs=1e-5)
    start.train_step()
    assert start.step == 2
    uniform.params, uniform.step = without_gate(start.params), 2
    np.testing.assert_allclose(start.evaluate().logprob, uniform.evaluate().logprob, atol=1e-5)
    assert start.train_step()[0] == pytest.approx(uniform.train_step()[0], abs=1e-5)


def test_the_schedule_restarts_after_the_gated_start():
    """As after the induction warm-up: a linear warm-up then the peak, then from zero again and cosine."""
    from kvphase.train.loop import learning_rate

    rate = learning_rate(TrainConfig(design="meanpool", steps=3000, gate_steps=1000, lr=1e-3))
    by_hand = {0: 0.0, 50: 5e-4, 999: 1e-3, 1000: 0.0, 1050: 5e-4,
               2050: 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 950 / 1900)), 3000: 1e-4}
    for step, value in by_hand.items():
        assert float(rate(step)) == pytest.approx(value, rel=1e-5, abs=1e-9), step


def test_the_default_is_a_gated_third_of_the_steps():
    assert (TrainConfig.for_design("meanpool").steps, TrainConfig.for_design("meanpool").gate_steps) == (3000, 1000)
    assert TrainConfig.for_design("meanpool", steps=30).gate_steps == 10
    assert TrainConfig.for_design("meanpool", gate_steps=0).gate_steps == 0
    assert TrainConfig.for_design("gated").gate_steps == 0


def test_the_exported_file_is_a_plain_meanpool_file(tmp_path):
    """No gate tensors (the reference would not read them), and its reference forward equals the
    uniform JAX forward."""
    from kvphase.gguf.header import read_gguf_header
    from kvphase.reference.gpt2 import GPT2
    from kvphase.reference.trained import trained_policy
    from kvphase.train.export import export_gguf
    from kvphase.train.model import draw_starts, forward

    start = trainer("meanpool", gate_steps=2)
    params = loud_gate(start.params)
    path = export_gguf(tmp_path / "m.gguf", params, start.config, start.data.vocab, 6)
    assert not [t.name for t in read_gguf_header(path).tensors if "gate" in t.name]
    batch = start.data.batch(np.random.default_rng(7), 2)
    hidden, _ = forward(params, batch.tokens, draw_starts(start.config, np.random.default_rng(0), 2), start.config)
    expected = np.asarray(hidden @ params["wte"].T)  # (2, T, n_vocab)
    model = GPT2.from_gguf(path, policy=trained_policy(path))
    got = np.stack([model.forward(list(map(int, row)), model.new_cache(256)) for row in batch.tokens])
    diff = np.abs(got - expected)
    assert diff.max() < 1e-4, f"max diff {diff.max():.3g}, mean {diff.mean():.3g}"


@pytest.mark.parametrize("overrides,fragment", [
    (dict(design="gated", gate_steps=5), "gated has no uniform pooling to start"),
    (dict(design="meanpool", gate_steps=6), "--gate-steps must be a whole number from 0 to --steps - 1 (5)"),
    (dict(design="meanpool", gate_steps=-1), "--gate-steps must be a whole number"),
    (dict(design="meanpool", gate_steps=2, copy_steps=2), "give one of them"),
])
def test_bad_gated_starts_are_refused(overrides, fragment):
    with pytest.raises(PlanError, match=None) as err:
        TrainConfig(**{**TINY, "steps": 6, **overrides})
    assert fragment in str(err.value)


@pytest.mark.parametrize("args,fragment", [
    (["dense", "--gate-steps", "10"], "dense has no uniform pooling"),
    (["meanpool", "--steps", "20", "--gate-steps", "20"], "--gate-steps must be a whole number"),
    (["meanpool", "--gate-steps", "x"], "--gate-steps"),
])
def test_bad_gate_steps_on_the_command_line_are_one_line(args, fragment, tmp_path):
    result = runner.invoke(app, ["train", args[0], str(tmp_path / "o"), *args[1:]])
    assert result.exit_code != 0 and fragment in result.output, result.output
    assert len(result.output.strip().splitlines()) <= 1 or "Usage" in result.output
    assert not (tmp_path / "o").exists()
