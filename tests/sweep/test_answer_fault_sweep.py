"""Issue 70, item 5 (the sweep's side): the default sweep of the default model through a real
llama-server behind a proxy that spoils every answer starting at 3 mod 4
(`tests/helpers/answer_fault_proxy.py`) records, in `answer_pos`, exactly the answers the server was
asked to start at 3 mod 4, scores every one of them wrong, and headlines the fault naming where
generation starts; the same sweep through the plain server names no effect.

The sweeps ask for answer phases (not yet the default) and a small plan (32 contexts of 8
targets at 512 tokens: 256 targets, 64 of them spoiled; at 16 contexts the run reads "too few targets") and one thread. One llama-server serves both."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.engines.llama_server import find_llama_server, llama_server
from kvphase.sweep.report import build_report
from kvphase.sweep.run import load_results
from tests.helpers.answer_fault_proxy import AnswerFaultProxy

pytestmark = pytest.mark.slow
SMALL = ["--answer-phases", "--context", "512", "--targets-per-context", "8", "--contexts", "32", "--threads", "1", "-q"]


@pytest.fixture(scope="module")
def swept(default_model, tmp_path_factory):
    """The faulty and the plain sweep's folders, and the proxy that spoiled the first."""
    folder = tmp_path_factory.mktemp("answer-fault")
    with llama_server(default_model, binary=find_llama_server(), threads=1, slots=1, n_ctx_per_slot=1024) as server:
        with AnswerFaultProxy(server.url, residue=3, modulus=4) as proxy:
            faulty = _sweep(default_model, proxy.url, folder / "faulty")
        plain = _sweep(default_model, server.url, folder / "plain")
    return faulty, plain, proxy


def _sweep(model, url, out):
    result = CliRunner().invoke(app, ["sweep", str(model), "--backend", "server", "--url", url, *SMALL, "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_answer_pos_is_where_a_real_server_started_each_answer(swept):
    faulty, _, proxy = swept
    rows = load_results(faulty)
    at_three = rows["answer_pos"] % 4 == 3
    assert sorted(proxy.spoiled) == sorted(rows.loc[at_three, "answer_pos"])  # the server's prompt lengths
    scored = [n for n in proxy.passed if n >= 512]  # the backend's own short probe of the server aside
    assert sorted(scored) == sorted(rows.loc[~at_three, "answer_pos"])
    assert at_three.sum() == len(rows) // 4 and not rows.loc[at_three, "correct"].any()


def test_the_sweep_headlines_the_fault_naming_the_answer_residue(swept):
    faulty, plain, _ = swept
    summary = build_report(faulty)
    headline = summary.headline()
    assert summary.verdict == "effect", headline
    assert headline.startswith("Accuracy depends on where generation starts: answers starting at residue "), headline
    assert int(headline.split("residue ")[1].split()[0]) % 4 == 3, headline
    assert (faulty / "report.md").read_text().splitlines()[2].strip("*") == headline
    unfaulted = build_report(plain)
    assert unfaulted.verdict != "effect", unfaulted.headline()
    assert "where generation starts" in unfaulted.headline()  # it says what it could have seen at that axis
