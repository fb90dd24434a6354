"""The induction warm-up of `kvphase train --copy-steps`: its sequences, its loss, its schedule
and the switch to the pairs, each checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.train.config import COPY_RUN, TrainConfig

jax = pytest.importorskip("jax", reason="the training extra is installed by make test; CI runs these")

runner = CliRunner()
TINY = dict(layers=2, heads=2, d_model=16, context=16, stride=2, queries=4, batch=8, eval_sequences=16)


def copy_data(**overrides):
    from kvphase.train.data import PairData

    return PairData.of(TrainConfig(design="dense", **{**TINY, "steps": 10, "copy_steps": 5, **overrides}))


def test_a_warm_up_sequence_repeats_one_run_and_scores_only_the_repeat():
    data = copy_data(context=64, stride=4, queries=8, records=8)  # 16 question rows: room for a repeat past the context
    firsts, offsets, repeat_ends = set(), set(), set()
    for step in range(40):
        batch = data.copy_batch(step)
        assert batch.tokens.shape == (8, 80) and batch.loss_rows.shape == (8, 79)
        for tokens, rows in zip(batch.tokens, batch.loss_rows):
            assert tokens[0] == data.vocab.bos_id
            scored = np.flatnonzero(rows)
            assert len(scored) == COPY_RUN - 1 and np.all(np.diff(scored) == 1)
            repeat = scored[0]  # row t predicts token t + 1: the repeat's first word is not scored
            run = tokens[repeat : repeat + COPY_RUN]
            first = [a for a in range(1, repeat - COPY_RUN + 1) if np.array_equal(tokens[a : a + COPY_RUN], run)]
            assert first, f"the scored run {run} has no earlier copy"
            assert first[-1] + COPY_RUN <= 64, "the first copy lies in the context"
            firsts.add(int(first[-1]))
            offsets.add(int(repeat - first[-1]))
            repeat_ends.add(int(repeat + COPY_RUN))
    assert max(repeat_ends) == 80 and min(offsets) == COPY_RUN, "the repeat reaches the question rows and follows the run"
    assert len(offsets) > 30 and len(firsts) > 30, "places and distances vary: no fixed offset to attend to"


def test_warm_up_batches_are_a_function_of_seed_and_step():
    a, b = copy_data(), copy_data()
    np.testing.assert_array_equal(a.copy_batch(3).tokens, b.copy_batch(3).tokens)
    assert not np.array_equal(a.copy_batch(3).tokens, a.copy_batch(4).tokens)
    assert not np.array_equal(a.copy_batch(3).tokens, copy_data(seed=1).copy_batch(3).tokens)


def test_the_warm_up_loss_scores_the_next_word_of_each_scored_row():
    """Against numpy on the model's own logits: a loss shifted by one row (predicting the current
    word, which a model also learns) differs."""
    import jax.numpy as jnp

    from kvphase.train.loop import Trainer, copy_stats, model_of

    trainer = Trainer.new(TrainConfig(design="dense", **{**TINY, "steps": 10, "copy_steps": 5}))
    config, batch = trainer.config, trainer.data.copy_batch(0)
    starts = np.zeros((8, 2, 2), np.int32)
    logits, _ = model_of(config).query_logits(trainer.params, batch.tokens, jnp.asarray(starts), np.arange(config.n_positions), config)
    logits = np.asarray(logits, np.float64)  # (B, T, V)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    b, t = np.nonzero(batch.loss_rows)
    expected = -logp[b, t, batch.tokens[b, t + 1]].mean()
    current_word = -logp[b, t, batch.tokens[b, t]].mean()
    nll, accuracy, _ = copy_stats(trainer.params, batch.tokens, starts, batch.loss_rows, config)
    assert float(nll) == pytest.approx(expected, abs=1e-4), f"|diff| {abs(float(nll) - expected):.2e}"
    assert abs(expected - current_word) > 1e-3
    assert float(accuracy) == pytest.approx(np.mean(logits[b, t].argmax(-1) == batch.tokens[b, t + 1]))


def test_the_schedule_by_hand():
    """Warm-up steps: a linear warm-up over 100 steps, then the peak; pairs: warm up from zero
    again over 100 steps, then cosine to a tenth of the peak at the last step."""
    from kvphase.train.loop import learning_rate

    rate = learning_rate(TrainConfig(design="dense", steps=3000, copy_steps=1000, lr=1e-3))
    by_hand = {0: 0.0, 50: 5e-4, 100: 1e-3, 999: 1e-3, 1000: 0.0, 1050: 5e-4, 1100: 1e-3,
               2050: 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 950 / 1900)), 3000: 1e-4}
    for step, value in by_hand.items():
        assert float(rate(step)) == pytest.approx(value, rel=1e-5, abs=1e-9), step
    plain = learning_rate(TrainConfig(design="dense", steps=1500, lr=1e-3))
    assert float(plain(800)) == pytest.approx(1e-4 + 0.9e-3 * 0.5, rel=1e-5)  # unchanged without a warm-up


def test_the_first_copy_steps_train_the_warm_up_and_the_rest_the_pairs(monkeypatch):
    from kvphase.train.loop import Trainer

    trainer = Trainer.new(TrainConfig(design="dense", **{**TINY, "steps": 4, "copy_steps": 2}))
    seen = []
    for name in ("copy_batch", "training_batch"):
        original = getattr(type(trainer.data), name)
        monkeypatch.setattr(type(trainer.data), name,
                            lambda self, step, name=name, original=original: seen.append((name, step)) or original(self, step))
    for _ in range(4):
        trainer.train_step()
    assert seen == [("copy_batch", 0), ("copy_batch", 1), ("training_batch", 2), ("training_batch", 3)]


@pytest.mark.parametrize("args,fragment", [
    (["--steps", "5", "--copy-steps", "5"], "--copy-steps must be a whole number from 0 to --steps - 1 (4)"),
    (["--copy-steps", "-1"], "--copy-steps must be a whole number from 0"),
])
def test_bad_warm_up_options_are_one_line(args, fragment, tmp_path):
    result = runner.invoke(app, ["train", "dense", str(tmp_path / "o"), *args])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert fragment in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
