"""A server holding another file with the same metadata (issue 77): two `make-tiny llama` files that
differ only in their seed share every fact a llama-server states (parameters, size, embedding,
context, tokenizer), so only the weights tell them apart. The sweep compares the server's file
byte for byte where its path is readable here, else scores a probe query with the file in process;
where neither can be done it warns that only the metadata was compared."""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest
from typer.testing import CliRunner

from kvphase.backends.fleet import PROBE_TOLERANCE
from kvphase.cli import app
from kvphase.engines.llama_server import find_llama_server, llama_server
from kvphase.gguf.tiny import write_tiny_model
from tests.helpers.cli_checks import one_line_error
from tests.helpers.hostile_servers import gguf_facts

pytestmark = pytest.mark.slow
SWEEP = ["--context", "256", "--per-residue", "1", "--threads", "1", "-q"]


@pytest.fixture(scope="module")
def twins(tmp_path_factory, default_model):
    """Two tiny llamas with the default model's tokenizer, seeds 0 and 1, and a place for copies."""
    folder = tmp_path_factory.mktemp("twins")
    files = [write_tiny_model("llama", folder / f"seed{seed}.gguf", seed=seed, tokenizer_from=default_model)
             for seed in (0, 1)]
    assert gguf_facts(files[0]) == gguf_facts(files[1])  # an independent reader: nothing stated tells them apart
    return files


def sweep(model, url, out, *extra):
    return CliRunner().invoke(app, ["sweep", str(model), "--backend", "server", "--url", url, *SWEEP,
                                    "--out", str(out), *extra])


@contextlib.contextmanager
def gone_copy_server(model, folder):
    """A llama-server on a copy of `model` deleted once it has loaded: its /props names a file that is
    not here, as a server on another machine does."""
    copy = folder / "served" / model.name
    copy.parent.mkdir(exist_ok=True)
    shutil.copy(model, copy)
    with llama_server(copy, binary=find_llama_server(), threads=1, slots=1, n_ctx_per_slot=512) as server:
        copy.unlink()
        yield server


def test_a_server_holding_the_twin_file_here_is_refused_by_its_bytes(twins, tmp_path):
    ours, theirs = twins
    with llama_server(theirs, binary=find_llama_server(), threads=1, slots=1, n_ctx_per_slot=512) as server:
        refused = sweep(ours, server.url, tmp_path / "run")
        allowed = sweep(ours, server.url, tmp_path / "allowed", "--allow-model-mismatch")
    one_line_error(refused, f"{server.url} serves other weights ({theirs}), not {ours.name}: its file holds other "
                   "bytes; `kvphase sweep --allow-model-mismatch` scores it anyway")
    assert not (tmp_path / "run").exists()
    assert allowed.exit_code == 0, allowed.output
    assert "Warning: " in allowed.output and "scored anyway (--allow-model-mismatch)" in allowed.output
    manifest = json.loads((tmp_path / "allowed" / "manifest.json").read_text())
    assert manifest["model"]["file"] == ours.name
    [server_record] = manifest["engine"]["servers"]
    assert server_record["stated_model"] == str(theirs) and "model" not in server_record  # the server's word, named so
    assert server_record["model_check"]["weights"] == "other file bytes"


def test_a_server_whose_file_is_not_here_is_told_by_a_probe_query(twins, tmp_path):
    ours, theirs = twins
    with gone_copy_server(theirs, tmp_path) as server:
        refused = sweep(ours, server.url, tmp_path / "run")
    one_line_error(refused, f"{server.url} serves other weights", "it scores a probe query ",
                   f"the file in process", f"(tolerance {PROBE_TOLERANCE:g})")
    assert not (tmp_path / "run").exists()


def test_the_same_weights_pass_the_probe_and_the_manifest_says_how_they_were_identified(twins, tmp_path):
    ours, _ = twins
    with gone_copy_server(ours, tmp_path) as server:
        result = sweep(ours, server.url, tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "Warning" not in result.output, result.output
    check = json.loads((tmp_path / "run" / "manifest.json").read_text())["engine"]["servers"][0]["model_check"]
    assert check["weights"].startswith("a probe query ") and check["differs"] == "", check
    moved = float(check["weights"].split()[3])
    assert moved <= 1e-3, check  # one llama.cpp, one file: far inside the tolerance


def test_a_header_only_file_through_a_server_not_here_warns_that_only_metadata_was_compared(twins, tmp_path):
    from kvphase.gguf.header_only import write_header_only

    ours, theirs = twins
    header = write_header_only(ours, tmp_path / "header.gguf").path
    with gone_copy_server(theirs, tmp_path) as server:
        result = sweep(header, server.url, tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert (f"Warning: {server.url}: only the metadata of its model was compared with header.gguf (header.gguf is "
            "a header-only file, and the server's file is not readable here)") in result.output, result.output
    check = json.loads((tmp_path / "run" / "manifest.json").read_text())["engine"]["servers"][0]["model_check"]
    assert check["weights"] == "metadata only"
