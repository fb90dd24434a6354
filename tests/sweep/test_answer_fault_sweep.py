"""Issue 70, item 5 (the sweep's side), as far as it holds today: a sweep with answer phases through a
real llama-server behind a proxy that spoils every answer starting at 3 mod 4
(`tests/helpers/answer_fault_proxy.py`) records, in `answer_pos`, exactly the answers the server was
asked to start at 3 mod 4, and every one of them is scored wrong.

What it does not claim: that the report names the fault. Through the task's filler before the question
SmolLM2 sits at the floor (11% at the default 1,024 tokens over 8 contexts, 17% at 512), so the run
reads "uninformative at the floor" before either axis (docs/sweep.md, "Where generation starts").
The smallest balanced plan keeps it cheap: 8 contexts of 8 targets at 512 tokens."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.engines.llama_server import find_llama_server, llama_server
from kvphase.sweep.run import load_results
from tests.helpers.answer_fault_proxy import AnswerFaultProxy

pytestmark = pytest.mark.slow
SMALL = ["--answer-phases", "--context", "512", "--targets-per-context", "8", "--contexts", "8", "--threads", "1", "-q"]


def test_answer_pos_is_where_a_real_server_started_each_answer(default_model, tmp_path):
    with llama_server(default_model, binary=find_llama_server(), threads=1, slots=1, n_ctx_per_slot=1024) as server:
        with AnswerFaultProxy(server.url, residue=3, modulus=4) as proxy:
            result = CliRunner().invoke(app, ["sweep", str(default_model), "--backend", "server", "--url", proxy.url,
                                              *SMALL, "--out", str(tmp_path / "faulty")])
    assert result.exit_code == 0, result.output
    rows = load_results(tmp_path / "faulty")
    at_three = rows["answer_pos"] % 4 == 3
    assert sorted(proxy.spoiled) == sorted(rows.loc[at_three, "answer_pos"])  # the server's prompt lengths
    scored = [n for n in proxy.passed if n >= 512]  # the backend's own short probe of the server aside
    assert sorted(scored) == sorted(rows.loc[~at_three, "answer_pos"])
    assert at_three.sum() == len(rows) // 4 and not rows.loc[at_three, "correct"].any()
