"""`kvphase conform --backend server` through planted faults of where generation starts (issue 70):
a real llama-server holding csa-disjoint, behind `tests.helpers.answer_fault_proxy`, which spoils
forced answers (3 nats per token) whose prompt is r mod 4 tokens long, or that follow a
prefix-cache hit ending mid-block. Each must FAIL the path it breaks, naming the residue where the
spoiled answers start; the plain server must PASS every path.

csa-disjoint holds 72 positions: the server's paths run after contexts of 60-63 tokens and a
4-token query, so the answers start at 64-67, one at each residue mod 4 (the one-prompt path
moves generation to 68-70 too). By hand: a fault at prompts 3 mod 4 spoils the answers starting
at residue 3, whichever path they take, so only the path compared with answers generated
elsewhere (one prompt) can see it; a cache hit that ends mid-block is one after a context of 61,
62 or 63 tokens, whose answers start at residues 1, 2 and 3.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tests.helpers.answer_fault_proxy import SPOIL_NATS, AnswerFaultProxy
from kvphase.cli import app
from kvphase.conform.references import DEFAULT_REFERENCES

pytestmark = pytest.mark.slow
CSA_DISJOINT = next(r for r in DEFAULT_REFERENCES if r.name == "csa-disjoint")
SERVER_PATHS = ("one prompt", "prefix-cache hit", "two slots interleaved")


@pytest.fixture(scope="module")
def server():
    from kvphase.engines.llama_server import find_llama_server, llama_server

    with llama_server(CSA_DISJOINT.model, binary=find_llama_server(), threads=1, slots=2,
                      n_ctx_per_slot=256) as running:
        yield running


def conform_through(url: str, out) -> tuple[int, dict[str, str], str]:
    """exit code, each path's console line (by path), and the run's headline."""
    result = CliRunner().invoke(app, ["conform", "--backend", "server", "--url", url, "--contexts", "16",
                                      "--threads", "1", "--out", str(out)])
    lines = {path: line for line in result.output.splitlines() for path in SERVER_PATHS
             if line.startswith(f"  csa-disjoint {path}:")}
    assert set(lines) == set(SERVER_PATHS), result.output
    assert any(line.startswith("llama-server at ") for line in result.output.splitlines()), result.output
    # the report's headline in full (the console cuts a long one)
    headline = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("**"))
    return result.exit_code, lines, headline.strip("*")


def test_the_plain_server_passes_every_path_at_every_answer_residue(server, tmp_path):
    code, lines, headline = conform_through(server.url, tmp_path / "plain")
    assert code == 0, lines
    for path, line in lines.items():
        assert f"csa-disjoint {path}: PASS at every residue mod 4" in line, line
    assert headline.endswith("1 PASS, 0 FAIL, 0 cannot run."), headline


@pytest.mark.parametrize("residue", [3, 1])
def test_answers_spoiled_at_one_prompt_residue_fail_the_one_prompt_path_naming_it(server, tmp_path, residue):
    """Residue 3 spoils none of the folder's targets (every answer of csa-disjoint's plan starts at
    residue 1: 64-token contexts, 1-token queries): the model passes and only the path sees the
    fault. Residue 1 spoils every target: the model fails too, at whatever target residue, and its
    line says its answers all start at residue 1."""
    with AnswerFaultProxy(server.url, mode="answer-residue", residue=residue) as proxy:
        code, lines, headline = conform_through(proxy.url, tmp_path / f"residue{residue}")
    assert proxy.spoiled and all(n % 4 == residue for n in proxy.spoiled), proxy.spoiled
    assert any(n % 4 != residue for n in proxy.passed), proxy.passed
    assert code == 1, lines
    one_prompt = lines["one prompt"]
    assert f"one prompt: FAIL: answers starting at residue {residue} mod 4 moved by up to 3 nats" in one_prompt, \
        one_prompt
    assert abs(float(re.search(r"moved by up to ([\d.]+) nats", one_prompt)[1]) - SPOIL_NATS) < 1e-3, one_prompt
    # the cached and the two-slot answers are spoiled as their baseline is: they cannot see it, and do not claim to
    assert "PASS" in lines["prefix-cache hit"] and "PASS" in lines["two slots interleaved"], lines
    assert f"engine paths FAIL: csa-disjoint's one prompt (answers starting at residue {residue} mod 4)" in headline
    if residue == 1:
        assert "0 PASS, 1 FAIL" in headline and "its plan's answers all start at residue 1 mod 4" in headline
    else:
        assert "1 PASS, 0 FAIL" in headline, headline


def test_a_cache_hit_ending_mid_block_fails_the_cached_paths_naming_residues_1_2_3(server, tmp_path):
    with AnswerFaultProxy(server.url, mode="cache-hit-mid-block") as proxy:
        code, lines, headline = conform_through(proxy.url, tmp_path / "mid-block")
    assert code == 1, lines
    assert "one prompt: PASS" in lines["one prompt"], lines["one prompt"]  # nothing cached on that path
    for path in ("prefix-cache hit", "two slots interleaved"):  # both reuse the context a slot just evaluated
        assert f"{path}: FAIL: answers starting at residues 1, 2, 3 mod 4 moved by up to 3 nats" in lines[path], \
            lines[path]
    assert "csa-disjoint's prefix-cache hit (answers starting at residues 1, 2, 3 mod 4)" in headline, headline
