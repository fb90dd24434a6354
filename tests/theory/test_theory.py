"""`kvphase theory`: the idealized model's closed forms against its own simulation, its gradient
against finite differences, a case small enough to do by hand, and the command line."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.theory.closed_form import symmetric_point, trade_rate, uniform_point
from kvphase.theory.flow import growth_rate, integrate, linear_records, mode_norms
from kvphase.theory.model import IdealModel, TheoryConfig, boundary_phases, gates
from tests.helpers.cli_checks import one_line_error

SYMMETRIC = TheoryConfig(stride=4, components=2, beta=8.0, distractors=16, attenuation=1.0, init_scale=1e-4, steps=300)


def differential_direction(k: int, s: int, seed: int = 1) -> np.ndarray:
    """A random unit direction whose rows and columns each sum to zero: components trading phases."""
    v = np.random.default_rng(seed).standard_normal((k, s))  # (K, S)
    v -= v.mean(axis=1, keepdims=True)
    v -= v.mean(axis=0, keepdims=True)
    return v / np.linalg.norm(v)


def simulated_rates(config: TheoryConfig) -> tuple[float, float]:
    """(differential, common) growth rates of a simulation started near the uniform gate."""
    trajectory = integrate(IdealModel(config))
    differential, common = np.array([mode_norms(theta) for theta in trajectory.theta]).T  # (T,), (T,)
    linear = linear_records(differential)
    early = min(linear, 20)  # the common mode before the differential one feeds it at second order
    return (growth_rate(trajectory.time[:linear], differential[:linear]),
            growth_rate(trajectory.time[:early], common[:early]))


def test_growth_rate_of_a_small_perturbation_is_the_closed_form_eigenvalue():
    point = uniform_point(SYMMETRIC)
    differential, common = simulated_rates(SYMMETRIC)
    assert point.differential_rate > 0.05  # a case where the uniform gate is clearly unstable
    assert differential == pytest.approx(point.differential_rate, rel=1e-3), (differential, point.differential_rate)
    assert common == pytest.approx(point.common_rate, rel=2e-2), (common, point.common_rate)


def test_jacobian_along_a_differential_direction_is_lambda_diff():
    """The linearization itself: -d(gradient) along a direction where components trade phases
    is lambda_diff times that direction, for K and S where no symmetry hides a mistake."""
    for readout in ("mixture", "sum"):
        config = replace(SYMMETRIC, components=3, stride=5, beta=5.0, readout=readout)
        model, v, h = IdealModel(config), differential_direction(3, 5), 1e-5
        response = -(model.gradient(h * v) - model.gradient(-h * v)) / (2 * h)  # (K, S)
        rate = uniform_point(config).differential_rate
        assert np.abs(response - rate * v).max() < 1e-7, (readout, np.abs(response - rate * v).max(), rate)


@pytest.mark.parametrize("side", [0.9, 1.1])
def test_the_uniform_gate_is_unstable_below_beta_star_and_stable_above(side):
    threshold = uniform_point(SYMMETRIC).threshold_beta
    assert threshold == pytest.approx(4 * math.log(16))
    config = replace(SYMMETRIC, beta=side * threshold, steps=200)
    trajectory = integrate(IdealModel(config))
    start, end = mode_norms(trajectory.theta[0])[0], mode_norms(trajectory.theta[-1])[0]
    point = uniform_point(config)
    assert point.unstable == (side < 1)
    assert (end > 2 * start) if side < 1 else (end < start / 2), (side, start, end)
    assert simulated_rates(config)[0] == pytest.approx(point.differential_rate, rel=1e-2)


@pytest.mark.parametrize("readout", ["mixture", "sum"])
@pytest.mark.parametrize("stagger", ["none", "component"])
def test_gradient_matches_finite_differences(readout, stagger):
    config = TheoryConfig(stride=4, components=3, beta=7.0, distractors=5, attenuation=0.4, readout=readout,
                          stagger=stagger)
    model = IdealModel(config)
    theta = np.random.default_rng(3).standard_normal((3, 4))  # (K, S) far from uniform
    h, numeric = 1e-6, np.zeros_like(theta)
    for index in np.ndindex(theta.shape):
        step = np.zeros_like(theta)
        step[index] = h
        numeric[index] = (model.loss(theta + step) - model.loss(theta - step)) / (2 * h)
    assert np.abs(numeric - model.gradient(theta)).max() < 1e-8, np.abs(numeric - model.gradient(theta)).max()


def test_one_component_two_phases_by_hand():
    """K = 1, S = 2, fixed offsets: phase 1 is the boundary. At theta = (t, -t) the gate is
    w = (e^t, e^-t) / (e^t + e^-t); the target scores beta w0 at phase 0 and beta rho w1 at phase 1."""
    beta, d, rho, t = 4.0, 3.0, 0.5, 0.3
    model = IdealModel(TheoryConfig(stride=2, components=1, beta=beta, distractors=d, attenuation=rho))
    w0 = math.exp(t) / (math.exp(t) + math.exp(-t))
    w1 = 1 - w0
    a0 = math.exp(beta * w0) / (math.exp(beta * w0) + d)
    a1 = math.exp(beta * rho * w1) / (math.exp(beta * rho * w1) + d)
    assert model.accuracy(np.array([[t, -t]])) == pytest.approx([a0, a1], abs=1e-12)
    assert model.loss(np.array([[t, -t]])) == pytest.approx(-(math.log(a0) + math.log(a1)) / 2, abs=1e-12)
    # dL/dw_p = -c_p beta (1 - a_p) / S (K = 1), and the softmax's backward pass w0 w1 (g0 - g1)
    g0, g1 = -beta * (1 - a0) / 2, -rho * beta * (1 - a1) / 2
    assert model.gradient(np.array([[t, -t]]))[0] == pytest.approx([w0 * w1 * (g0 - g1), -w0 * w1 * (g0 - g1)],
                                                                   abs=1e-12)
    # without attenuation the uniform gate is a fixed point and, with one component, a stable one:
    # no direction to trade phases in, and the common one has lambda = -beta^2 a (1 - a) / (K S^3)
    plain = replace(model.config, attenuation=1.0)
    a = math.exp(beta / 2) / (math.exp(beta / 2) + d)
    point = uniform_point(plain)
    assert np.abs(IdealModel(plain).gradient(np.zeros((1, 2)))).max() < 1e-15
    assert (point.differential_directions, point.differential_rate) == (0, 0.0)
    assert point.common_rate == pytest.approx(-beta**2 * a * (1 - a) / 8)
    assert math.isnan(point.threshold_beta)


def test_boundary_phases_follow_the_offsets():
    config = TheoryConfig(stride=4, components=6, stagger="component")
    assert boundary_phases(config).tolist() == [3, 0, 1, 2, 3, 0]
    assert boundary_phases(replace(config, stagger="none")).tolist() == [3] * 6


STABLE = TheoryConfig(stride=4, components=4, beta=16.0, distractors=16, attenuation=0.5, steps=1500, dt=1.0)


def test_fixed_offsets_leave_the_boundary_phase_weakest():
    """Above beta* the flow settles at the symmetric fixed point, where equal marginal returns
    rho (1 - a_b) = 1 - a_n force a_b < a_n; below it the components specialize and the boundary
    phase is still the weakest."""
    for beta in (16.0, 6.0):
        accuracy = integrate(IdealModel(replace(STABLE, beta=beta))).accuracy[-1]  # (S,)
        others = np.delete(accuracy, 3)
        assert int(np.argmin(accuracy)) == 3 and others.min() - accuracy[3] > 0.1, (beta, accuracy)
    predicted = symmetric_point(STABLE).accuracy
    settled = integrate(IdealModel(STABLE)).accuracy[-1]
    assert np.abs(settled - predicted).max() < 1e-3, (settled, predicted)


@pytest.mark.parametrize("components", [4, 8])
def test_staggering_with_k_a_multiple_of_s_leaves_no_weak_phase(components):
    config = replace(STABLE, components=components, stagger="component")
    accuracy = integrate(IdealModel(config)).accuracy[-1]  # (S,)
    assert accuracy.max() - accuracy.min() < 0.005, accuracy
    assert np.abs(accuracy - np.array(symmetric_point(config).accuracy)).max() < 0.01
    fixed = integrate(IdealModel(replace(config, stagger="none"))).accuracy[-1]
    assert fixed.max() - fixed.min() > 0.2, fixed


@pytest.mark.parametrize("rho, unstable", [(0.35, True), (0.5, False)])
def test_division_of_labour_rate_at_the_symmetric_point(rho, unstable):
    """Fixed offsets above beta*: the symmetric point (all components alike) is unstable to
    components trading boundary weight exactly when lambda_trade > 0, at the rate it gives."""
    config = replace(STABLE, attenuation=rho, steps=2000, dt=0.5)
    model, grid = IdealModel(config), symmetric_point(config)
    row = np.log([grid.other_weight] * 3 + [grid.boundary_weight])  # (S,) the grid's point, relaxed exactly below
    theta = integrate(model, np.tile(row, (4, 1))).theta[-1]  # (K, S) identical rows stay identical
    w = gates(theta)[0]  # (S,)
    point = grid._replace(boundary_weight=float(w[3]), other_weight=float(w[0]),
                          accuracy=tuple(float(a) for a in model.accuracy(theta)))
    rate = trade_rate(config, point)
    assert (rate > 0) == unstable, rate
    trade = theta.copy()
    trade[:, 3] += 1e-6 * np.array([1.0, -1.0, 0.5, -0.5])  # components trade boundary weight
    trajectory = integrate(replace(model, config=replace(config, steps=600)), trade)
    spread = np.array([np.ptp(t[:, 3] - t[:, 0]) for t in trajectory.theta])  # (T,) how far the components differ
    linear = linear_records(spread, 1e-3)
    assert growth_rate(trajectory.time[:linear], spread[:linear]) == pytest.approx(rate, rel=1e-3)


def test_the_sum_readout_has_no_drive_to_specialize():
    """Components that add their scores before one softmax: the loss sees only the summed coverage,
    so trading phases costs nothing at first order (lambda_diff = 0) at any beta."""
    for beta in (2.0, 8.0, 30.0):
        config = replace(SYMMETRIC, readout="sum", beta=beta)
        assert uniform_point(config).differential_rate == 0.0
        assert abs(simulated_rates(config)[0]) < 1e-3


def test_bad_parameters_are_plan_errors():
    for changes in ({"stride": 1}, {"components": 0}, {"beta": 0.0}, {"beta": float("nan")}, {"attenuation": 0.0},
                    {"attenuation": 1.5}, {"distractors": 0.5}, {"steps": 0}, {"stagger": "layer"},
                    {"readout": "max"}, {"dt": -1.0}):
        with pytest.raises(PlanError):
            TheoryConfig(**changes)


runner = CliRunner()


@pytest.mark.slow
def test_theory_writes_a_run_folder(tmp_path):
    out = tmp_path / "theory"
    result = runner.invoke(app, ["theory", "--steps", "200", "--components", "2", "--components", "4", "--out", str(out),
                                 "--quiet"])
    assert result.exit_code == 0, result.output
    assert "fixed offsets: K=2" in result.output and f"Report: {out / 'report.md'}" in result.output
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "summary.json", "report.md", "manifest.json", "trajectories.csv", "stability.csv",
            "specialization.png", "accuracy.png", "stability.png"} <= names
    summary = json.loads((out / "summary.json").read_text())
    assert [(c["components"], c["stagger"]) for c in summary["cases"]] == [(2, "none"), (4, "none"), (2, "component"),
                                                                         (4, "component")]
    assert summary["uniform_point"]["threshold_beta"] == pytest.approx(4 * math.log(16))
    assert "beta* = S ln D = 11.09" in (out / "report.md").read_text()


def test_a_folder_reruns_from_its_config(tmp_path):
    from kvphase.theory.study import rerun_study, run_study

    first = run_study(replace(STABLE, steps=100), [2], ["component"], tmp_path)
    (tmp_path / "summary.json").unlink()
    assert rerun_study(tmp_path) == first and (tmp_path / "summary.json").exists()
    (tmp_path / "config.json").write_text('{"theory": {"stride": "four"}, "components": [2], "staggers": ["none"]}')
    with pytest.raises(PlanError, match="--stride"):
        rerun_study(tmp_path)


def test_kvphase_report_rebuilds_a_theory_folder(tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, ["theory", "--steps", "100", "--components", "2", "--out", str(out), "-q"]).exit_code == 0
    before = json.loads((out / "summary.json").read_text())
    (out / "report.md").unlink()
    (out / "summary.json").unlink()
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 0 and "uniform gate" in result.output, result.output
    assert (out / "report.md").exists() and json.loads((out / "summary.json").read_text()) == before


def test_theory_help():
    result = runner.invoke(app, ["theory", "--help"])
    assert result.exit_code == 0 and "--attenuation" in result.output and "--stagger" in result.output


@pytest.mark.parametrize("args, fragment", [
    (["--stride", "1"], "--stride"), (["--components", "0"], "--components"), (["--beta", "0"], "--beta"),
    (["--beta", "-2"], "--beta"), (["--attenuation", "0"], "--attenuation"), (["--attenuation", "1.5"], "--attenuation"),
    (["--distractors", "0"], "--distractors"), (["--steps", "0"], "--steps"), (["--stagger", "layer"], "--stagger"),
    (["--readout", "max"], "--readout"), (["--dt", "100"], "--dt"), (["--dt", "10", "--steps", "20"], "unstable"),
    (["--components", "2", "--components", "0"], "--components"),
])
def test_bad_input_is_one_line(args, fragment, tmp_path):
    result = runner.invoke(app, ["theory", *args, "--out", str(tmp_path / "run"), "-q"])
    one_line_error(result, fragment)
    assert not (tmp_path / "run").exists()


def test_a_folder_of_another_run_is_not_overwritten(tmp_path):
    (tmp_path / "config.json").write_text('{"plan": {}}')
    one_line_error(runner.invoke(app, ["theory", "--steps", "10", "--out", str(tmp_path), "-q"]), "another kind of run")
    assert (tmp_path / "config.json").read_text() == '{"plan": {}}'


def test_an_out_that_is_a_file_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(runner.invoke(app, ["theory", "--steps", "10", "--out", str(afile), "-q"]), "is a file")
    one_line_error(runner.invoke(app, ["theory", "--steps", "10", "--out", str(afile / "run"), "-q"]), "cannot create")
