"""`kvphase flip`: a fake model whose retrieval works at one phase only must show a flip with period S."""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.backends.base import Query, Score
from kvphase.probes.flip import build_report, pick_targets, run_flip, shifted
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.plan import SweepPlan
from kvphase.sweep.tasks import load_task
from kvphase.cli import app
from tests.helpers.fakes import CharBackend
from tests.helpers.paths import TRAINED

runner = CliRunner()

GOOD_PHASE, STRIDE = 1, 4


class PhaseBackend(CharBackend):
    """Retrieves a key's value (logprob 0) only when the key's record starts at phase GOOD_PHASE;
    else the right value gets -4 and every wrong one -2, so the margin is +2 or -2."""

    def score(self, context: Sequence[int], queries: Sequence[Query]) -> list[Score]:
        self.tokens_evaluated += len(context)
        text = "".join(map(chr, context))
        out = []
        for q in queries:
            prompt, answer = "".join(map(chr, q.prompt)), "".join(map(chr, q.answer))
            position = text.index(prompt)  # the record " key: value" starts with the query " key:"
            right = text.startswith(answer, position + len(prompt))
            logprob = (0.0 if position % STRIDE == GOOD_PHASE else -4.0) if right else -2.0
            out.append(Score(right and logprob == 0.0, logprob, tuple(q.answer)))
        return out


def _plan(tmp_path, **kw):
    return SweepPlan(model=str(tmp_path / "fake.gguf"), task="records", stride=STRIDE, modulus=2 * STRIDE,
                     context=kw.get("context", 900), per_residue=1, padding="prefix", seed=0, control=True)


class _Info:
    architecture = "fake"


def test_shift_inserts_before_the_target_only(tmp_path):
    backend = PhaseBackend()
    plan = _plan(tmp_path)
    context, target = pick_targets(build_contexts(load_task("records"), backend, plan.context_settings), 1)[0]
    tokens = shifted(context, target, [0] * 8, 3)
    p = target.position
    assert tokens[:p] == list(context.tokens[:p]) and tokens[p : p + 3] == [0, 0, 0]
    assert tokens[p + 3 :] == list(context.tokens[p:])


def test_fake_phase_model_flips_with_period_s(tmp_path):
    (tmp_path / "fake.gguf").write_bytes(b"GGUF")  # the manifest records its size
    out = tmp_path / "run"
    headline = run_flip(_plan(tmp_path), PhaseBackend(), out, n_targets=3, cycles=2, model_info=_Info())
    import pandas as pd

    rows = pd.read_csv(out / "results.csv")
    assert len(rows) == 3 * 2 * STRIDE
    assert (rows.phase == rows.position % STRIDE).all() and (rows.query_pos == 900 + rows["shift"]).all()
    expected = np.where(rows.phase == GOOD_PHASE, 2.0, -2.0)
    diff = np.abs(rows.margin - expected)
    assert diff.max() == 0, f"max diff {diff.max()}, mean {diff.mean()}"
    assert "3 of 3 targets flip" in headline and "phase explains 100%" in headline
    assert f"best at phase {GOOD_PHASE} (+2.00 nats)" in headline
    (out / "summary.json").unlink()
    assert build_report(out) == headline


def test_bad_counts(tmp_path):
    from kvphase.errors import PlanError

    with pytest.raises(PlanError, match="at least 1"):
        run_flip(_plan(tmp_path), PhaseBackend(), tmp_path / "r", n_targets=0, cycles=2, model_info=_Info())
    with pytest.raises(PlanError, match="fewer than --targets 500"):
        run_flip(_plan(tmp_path), PhaseBackend(), tmp_path / "r", n_targets=500, cycles=1, model_info=_Info())


def test_cli_refuses_in_one_line(tmp_path):
    from kvphase.gguf.tiny import write_tiny_model

    assert runner.invoke(app, ["flip", "--help"]).exit_code == 0
    tiny = write_tiny_model("glm5-next", tmp_path / "glm.gguf")
    for args, message in ((["--targets", "0"], "--targets and --cycles must be at least 1"),
                          (["--context", "1000000"], "does not fit"),
                          (["--stride", "0"], "--stride must be at least 2, got 0"),  # was a ZeroDivisionError
                          (["--stride", "-3"], "--stride must be at least 2, got -3"),
                          ([], "has no tokenizer")):
        result = runner.invoke(app, ["flip", str(tiny), "--out", str(tmp_path / "run"), *args])
        assert result.exit_code == 1 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_flip_counts_name_the_option_typed(tmp_path):
    """Issue 76b: gated.gguf is trained at 64 tokens, S = M = 4: 15 cycles leave 4 tokens, 16 leave none;
    4 x (65536 / 4) targets fill one run."""
    for args, message in ((["--cycles", str(10**9)], "--cycles must be at most 15"),
                          (["--cycles", "16"], "--cycles must be at most 15"),
                          (["--targets", str(2**63)], "--targets must be at most 65536"),
                          (["--targets", "65537"], "--targets must be at most 65536")):
        result = runner.invoke(app, ["flip", str(TRAINED / "gated.gguf"), "--out", str(tmp_path / "run"), *args])
        assert result.exit_code == 1 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_trained_model_with_a_weak_phase_flips_periodically_and_its_dense_twin_does_not(tmp_path):
    """The positive controls of the training issue, with their own context, task and compressor:
    the gated model's margins follow the phase (S = 4) far above what noise gives, the dense
    twin's do not."""
    data = TRAINED
    shares = {}
    for name in ("gated", "dense"):
        out = tmp_path / name
        result = runner.invoke(app, ["flip", str(data / f"{name}.gguf"), "--out", str(out), "--targets", "8",
                                     "--cycles", "3", "--threads", "1"])
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        config = json.loads((out / "config.json").read_text())
        assert config["plan"]["context"] == 64 - 3 * 4  # the longest shift ends at the trained context
        shares[name] = (summary["mean_periodic_share"], summary["chance_periodic_share"])
    assert shares["gated"][0] > 2 * shares["gated"][1], shares
    assert shares["dense"][0] < 1.5 * shares["dense"][1], shares
