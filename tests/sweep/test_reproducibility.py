"""What reproduces across machines (docs/run-folder.md, "What reproduces across machines").

The plan is not machine-bound: the default sweep's contexts hash to a committed fingerprint. The
numbers are, within stated tolerances: tests/sweep/test_default_sweep.py scores 4 of the 24 contexts of `make demo`'s
sweep again and compares it with the committed example.
"""

from __future__ import annotations

import pytest

from kvphase.sweep.contexts import build_contexts, plan_fingerprint
from kvphase.sweep.context_settings import ContextSettings
from kvphase.sweep.tasks import load_task

# `kvphase sweep`'s default plan on SmolLM2-135M-Instruct before --targets-per-context (records, 1024
# tokens, S = 4, M = 8, 32 per residue, 16 a context, prefix padding, seed 0), which every folder made then
# still means: a planner change that moves any token changes it
DEFAULT_PLAN_SHA256 = "410d1b0ade575e6648f8c725a0abc2cf263ec92bca3380856fd6d66fb3618b5a"
# and the default since (32 a context, 96 per residue): reports/example-SmolLM2-...-L1024's manifest
DENSE_PLAN_SHA256 = "70839abe988931f4d394e139ffa250c86697342bfd8cd03edeb9b45b8af02655"


@pytest.fixture(scope="module")
def default_contexts(llama_backend):
    return build_contexts(load_task("records"), llama_backend, ContextSettings(1024, 4, 8, 32, "prefix", 0))


def test_the_default_plan_matches_its_fingerprint(default_contexts):
    assert plan_fingerprint(default_contexts) == DEFAULT_PLAN_SHA256


def test_the_dense_default_plan_matches_its_fingerprint(llama_backend):
    dense = build_contexts(load_task("records"), llama_backend, ContextSettings(1024, 4, 8, 96, "prefix", 0, "auto"))
    assert plan_fingerprint(dense) == DENSE_PLAN_SHA256
