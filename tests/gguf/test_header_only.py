"""`kvphase header`: a model's metadata and vocabulary without its weights (issue 40, part 1).
The sweep through a real llama-server with such a file is in test_server_real.py."""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.engines.llamacpp import Vocab
from kvphase.errors import GGUFError, PlanError
from kvphase.gguf.header import LISTED_TENSORS, SOURCE_SIZE, read_gguf_header
from kvphase.gguf.header_only import write_header_only
from kvphase.gguf.modelinfo import read_model_info
from tests.helpers.gguf_corpus import split_gguf

TEXT = "The keeper of the cat is Anna; 1234 keys, and ünïcode."


@pytest.fixture(scope="module")
def smollm2_header(default_model, tmp_path_factory):
    return write_header_only(default_model, tmp_path_factory.mktemp("header") / "smollm2-header.gguf").path


def test_the_header_only_file_keeps_every_key_and_lists_every_tensor(default_model, smollm2_header):
    full, short = read_gguf_header(default_model), read_gguf_header(smollm2_header)
    assert short.file_size < 0.05 * full.file_size, (short.file_size, full.file_size)
    assert short.header_only and not full.header_only and short.source_size == full.file_size
    assert {k: v for k, v in short.fields.items() if not k.startswith("kvphase.header_only")} == full.fields
    assert [(t.name, t.shape, t.type_id, t.n_bytes) for t in short.tensors] == \
           [(t.name, t.shape, t.type_id, t.n_bytes) for t in full.tensors]
    a, b = read_model_info(default_model), read_model_info(smollm2_header)
    assert dataclasses.replace(b, path=a.path, file_size=a.file_size, weights_size=None) == a


def test_llama_cpp_reads_the_same_vocabulary_from_it(default_model, smollm2_header):
    full, short = Vocab.load(default_model), Vocab.load(smollm2_header)
    assert (short.n_vocab, short.prefix_ids, short.tokenize(TEXT)) == (full.n_vocab, full.prefix_ids, full.tokenize(TEXT))
    assert short.detokenize(full.tokenize(TEXT)) == full.detokenize(full.tokenize(TEXT))


def test_a_split_model_is_read_from_its_first_shard_with_every_shards_tensors(tiny_deepseek4, tmp_path):
    shards = split_gguf(tiny_deepseek4, tmp_path, tensors_per_shard=20)
    assert len(shards) >= 3 and read_gguf_header(shards[0]).fields["split.count"] == len(shards)
    written = write_header_only(shards[0], tmp_path / "header.gguf")
    whole = read_gguf_header(tiny_deepseek4)
    assert (written.n_shards, written.n_tensors) == (len(shards), len(whole.tensors))
    assert sorted(t.name for t in read_gguf_header(written.path).tensors) == sorted(t.name for t in whole.tensors)
    assert "split.count" not in read_gguf_header(written.path).fields  # llama.cpp would look for the shards
    assert Vocab.load(written.path).tokenize(TEXT) == Vocab.load(tiny_deepseek4).tokenize(TEXT)
    assert read_model_info(written.path).compression == read_model_info(tiny_deepseek4).compression
    with pytest.raises(PlanError, match=r"shard 1 of a split model; give its first shard"):
        write_header_only(shards[1], tmp_path / "second.gguf")
    shards[-1].unlink()
    with pytest.raises(PlanError, match=re.escape(f"{shards[-1].name} is not beside it")):
        write_header_only(shards[0], tmp_path / "incomplete.gguf")


@pytest.mark.parametrize("command", [
    ["sweep", "{model}", "--per-residue", "1", "--out", "{out}"],
    ["sweep", "{model}", "--per-residue", "1", "--backend", "reference", "--out", "{out}"],
    ["validate", "{model}"],
    ["gates", "{model}", "--out", "{out}"],
], ids=["llama.cpp", "reference", "validate", "gates"])
def test_what_needs_the_weights_refuses_a_header_only_file_in_one_line(command, tiny_deepseek4, tmp_path):
    model = write_header_only(tiny_deepseek4, tmp_path / "ds4-header.gguf").path
    args = [part.format(model=model, out=tmp_path / "out") for part in command]
    result = CliRunner().invoke(app, args)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert "header-only" in errors[0] and "give the model itself" in errors[0], errors[0]
    assert not result.exception or isinstance(result.exception, SystemExit)


def test_a_dry_run_plans_from_a_header_only_file_what_it_plans_from_the_model(tiny_llama, tmp_path):
    model = write_header_only(tiny_llama, tmp_path / "tiny-header.gguf").path
    plans = []
    for path in (tiny_llama, model):
        result = CliRunner().invoke(app, ["sweep", str(path), "--dry-run", "--threads", "1", "--out", str(tmp_path / "r")])
        assert result.exit_code == 0, result.output
        plans.append(re.search(r"\(nothing written\): (.*)", result.output).group(1))
        expected = re.search(r"Expected in llama.cpp: about (\d+) MiB", result.output).group(1)
    assert plans[0] == plans[1]
    assert "Not timed" in result.output and int(expected) > 0


def test_a_damaged_tensor_list_is_one_error_naming_it(tiny_llama, tmp_path):
    model = write_header_only(tiny_llama, tmp_path / "tiny-header.gguf").path
    data = model.read_bytes()
    first = read_gguf_header(model).fields[LISTED_TENSORS][0].encode()
    model.write_bytes(data.replace(first, b"x" * len(first), 1))
    with pytest.raises(GGUFError, match=f"corrupt header-only file: .*{LISTED_TENSORS} holds 'xxx"):
        read_gguf_header(model)
    assert SOURCE_SIZE in read_gguf_header(write_header_only(tiny_llama, tmp_path / "again.gguf").path).fields


def test_the_command_says_what_it_wrote_and_refuses_a_header_only_source(tiny_llama, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["header", str(tiny_llama), str(tmp_path / "h.gguf")])
    assert result.exit_code == 0 and re.search(r"wrote .*h\.gguf: [\d.]+ MiB, the header of a [\d.]+ MiB model "
                                               r"\(\d+ tensors listed, no weights\)", result.output), result.output
    again = runner.invoke(app, ["header", str(tmp_path / "h.gguf"), str(tmp_path / "h2.gguf")])
    assert again.exit_code == 1 and "already header-only" in again.output
    inspect = runner.invoke(app, ["inspect", str(tmp_path / "h.gguf")])
    assert inspect.exit_code == 0 and "not in this file (header-only" in inspect.output


def test_a_path_that_is_not_a_regular_file_is_refused_and_left_alone(tiny_llama, tmp_path):
    """A rename over /dev/null would put a file in its place: a FIFO stands for it here."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for out, what in ((fifo, "not a regular file"), (tmp_path, "a folder"), (Path(""), "a folder")):
        result = CliRunner().invoke(app, ["header", str(tiny_llama), str(out)])
        assert result.exit_code == 1 and f"cannot write {out}: it is {what}" in result.output, result.output
    assert stat.S_ISFIFO(fifo.stat().st_mode)
