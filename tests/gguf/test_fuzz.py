"""Damaged, crafted and fuzzed GGUF files: the header reader is total and the CLI answers
with a result or one error line, never a traceback, a native crash or a hang.

Property-based (hypothesis) over truncations, byte flips and crafted metadata values, plus
the crafted corpus of `tests/helpers/gguf_corpus.py`. The real CLI runs as a subprocess on a
sample, because only a separate process shows a traceback printed by Python itself or a
death by signal (a llama.cpp abort); CliRunner would catch both.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.errors import GGUFError, ModelFileError
from kvphase.gguf.header import KEPT_STRING_LIMIT, read_gguf_header
from tests.helpers.gguf_corpus import (ARCH, SCALAR, STRING, UINT32, crafted_files, gguf_bytes, layout, patched, u32,
                               valid_file)
from tests.helpers.paths import REPO

runner = CliRunner()
VALID = valid_file()
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _read(path: Path, data: bytes):
    """The header of `data`, or None for a GGUFError; any other exception fails the test."""
    path.write_bytes(data)
    try:
        return read_gguf_header(path)
    except GGUFError:
        return None


def _clean(result) -> None:
    """A CLI result that is a success, or a usage error, or exactly one `Error:` line."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 1:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    else:
        assert result.exit_code == 0, result.output


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real command line in its own process."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kvphase.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def _no_crash(proc: subprocess.CompletedProcess) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {output[-500:]}"
    assert "Traceback" not in output, output[-2000:]
    assert proc.returncode in (0, 1), output[-500:]


# --------------------------------------------------------------------------- the reader, property-based


@FUZZ
@given(data=st.binary(max_size=600))
def test_any_bytes_after_the_magic_give_a_header_or_a_gguf_error(tmp_path, data):
    _read(tmp_path / "f.gguf", b"GGUF" + data)


@FUZZ
@given(cut=st.integers(0, len(VALID) - 1))
def test_every_truncation_is_a_gguf_error_naming_an_offset(tmp_path, cut):
    with pytest.raises(GGUFError, match=r"^(truncated GGUF file|not a GGUF file)"):
        read_gguf_header(patched_bytes(tmp_path, VALID[:cut]))


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(4, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_byte_flips_give_a_header_or_a_gguf_error(tmp_path, flips):
    data = bytearray(VALID)
    for offset, byte in flips:
        data[offset] = byte
    _read(tmp_path / "f.gguf", bytes(data))


@FUZZ
@given(key=st.text(max_size=20), value_type=st.integers(0, 14), raw=st.binary(max_size=24),
       count=st.integers(0, 2**64 - 1))
def test_crafted_metadata_values_give_a_header_or_a_gguf_error(tmp_path, key, value_type, raw, count):
    """Any type id, with bytes that may or may not fit it, and array headers of any length."""
    fields = ARCH + [(key or "k", value_type, raw), ("arr", 9, struct.pack("<IQ", value_type, count) + raw)]
    _read(tmp_path / "f.gguf", gguf_bytes(fields, data=raw))


def patched_bytes(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "f.gguf"
    path.write_bytes(data)
    return path


def test_the_valid_file_reads_back_what_was_written(tmp_path):
    header = read_gguf_header(patched_bytes(tmp_path, VALID))
    assert header.fields["llama.block_count"] == 2 and header.fields["x.words"] == ["a", "bc"]
    assert header.tensors[0].shape == (4,) and header.tensors[0].n_bytes == 16


# --------------------------------------------------------------------------- the crafted corpus

CORPUS = crafted_files()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_inspect_on_the_crafted_corpus_answers_in_one_line(tmp_path, name):
    path = patched_bytes(tmp_path, CORPUS[name])
    _clean(runner.invoke(app, ["inspect", str(path)], env={"COLUMNS": "200"}))


@pytest.mark.parametrize("name, fragment", [
    ("nested arrays 100000 deep", "nests arrays more than 3 deep"),
    ("array of 2^60 uint8", "more than the 15 bytes left can hold"),
    ("string of 2^63 bytes", "more than the 8 bytes left"),
    ("alignment 0", "general.alignment must be a power of two, found 0"),
    ("alignment as string", "general.alignment must be a uint32, found string"),
    ("block_count string", "llama.block_count is 'many', expected an integer"),
    ("block_count NaN", "llama.block_count is nan, expected an integer"),
    ("vocab_size NaN", "llama.vocab_size is nan, expected an integer"),
    ("tensor of unknown type 999", "offset 90: tensor 't' has unknown ggml type 999"),
    ("tensor with 9 dimensions", "offset 69: tensor 't' has 9 dimensions"),
])
def test_a_damaged_header_is_named_with_its_offset_or_key(tmp_path, name, fragment):
    result = runner.invoke(app, ["inspect", str(patched_bytes(tmp_path, CORPUS[name]))], env={"COLUMNS": "300"})
    _clean(result)
    assert result.exit_code == 1 and fragment in result.output


def test_a_20_mb_name_is_read_in_part_and_printed_short(tmp_path):
    path = patched_bytes(tmp_path, CORPUS["20 MB general.name"])
    assert len(read_gguf_header(path).fields["general.name"]) < KEPT_STRING_LIMIT + 40
    result = runner.invoke(app, ["inspect", str(path)], env={"COLUMNS": "200"})
    _clean(result)
    assert result.exit_code == 0 and result.output.count("n" * 100) < 10


@pytest.mark.parametrize("name, shown", [
    ("name with rich markup [/x]", "x[/x]y[/]"),
    ("name with [red]", "[red]red[/red] [bold]"),
    ("name with terminal escapes", "\\x1b[2J\\x1b]0;owned\\x07\\x1b[31mred\\r\\nline\\x00"),
])
def test_metadata_prints_as_written_without_markup_or_terminal_escapes(tmp_path, name, shown):
    result = runner.invoke(app, ["inspect", str(patched_bytes(tmp_path, CORPUS[name]))], env={"COLUMNS": "300"})
    _clean(result)
    assert shown in result.output and "\x1b" not in result.output


def test_a_file_name_with_markup_and_escapes_prints_as_written(tmp_path):
    path = tmp_path / "[red]m[bold]\x1b[2J.gguf"
    path.write_bytes(b"not a model")
    result = runner.invoke(app, ["inspect", str(path)], env={"COLUMNS": "300"})
    _clean(result)
    assert "[red]m[bold]\\x1b[2J.gguf" in result.output and "\x1b" not in result.output


@pytest.mark.slow
def test_the_real_cli_on_a_sample_of_the_corpus_never_prints_a_traceback(tmp_path):
    for name in ["nested arrays 100000 deep", "alignment 0", "name with rich markup [/x]", "tensor count 2^63",
                 "block_count NaN"]:
        _no_crash(cli("inspect", str(patched_bytes(tmp_path, CORPUS[name]))))


# --------------------------------------------------------------------------- what llama.cpp would abort on


@pytest.fixture(scope="module")
def smol_layout(default_model):
    return layout(default_model)[0]


@pytest.mark.parametrize("key, value, fragment", [
    ("llama.block_count", 0, "llama.block_count is 0, expected an integer from 1 to 512"),
    ("llama.block_count", 513, "llama.block_count is 513, expected an integer from 1 to 512"),
])
@pytest.mark.slow
def test_a_sweep_refuses_what_llama_cpp_would_abort_on_before_it_loads(tmp_path, default_model, smol_layout,
                                                                       key, value, fragment):
    """Unchecked, these reach GGML_ASSERT in llama_model_base::load_hparams and kill the process."""
    at = smol_layout[key]
    assert at.value_type == UINT32
    model = patched(default_model, tmp_path / "m.gguf", [(at.value_offset, u32(value))])
    proc = cli("sweep", str(model), "--context", "256", "--per-residue", "1", "--out", str(tmp_path / "run"))
    _no_crash(proc)
    assert proc.returncode == 1 and fragment in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("arch, key, value, fragment", [
    ("glm5-next", "glm5-next.attention.indexer.kpool", 1, "kpool is 1, expected an integer from 2"),
    ("glm5-next", "glm5-next.attention.indexer.top_k", 5, "top_k is 5, expected a multiple of the kpool"),
    ("minimax-m3", "minimax-m3.attention.indexer.block_size", 0, "block_size is 0, expected an integer from 1"),
    # found by the fuzz campaign: llama.cpp casts it to int, so this is -1 there (abort)
    ("minimax-m3", "minimax-m3.attention.indexer.block_size", 2**32 - 1,
     "block_size is 4294967295, expected an integer from 1 to 2147483647"),
    ("minimax-m3", "minimax-m3.attention.indexer.top_k", 2**31, "top_k is 2147483648, expected an integer from 0 to"),
    ("deepseek4", "deepseek4.block_count", 0, "block_count is 0, expected an integer from 1 to 512"),
])
def test_validate_refuses_compression_keys_llama_cpp_asserts_on(tmp_path, arch, key, value, fragment):
    from kvphase.gguf.tiny import write_tiny_model

    model = write_tiny_model(arch, tmp_path / "tiny.gguf")
    at = layout(model)[0][key]
    assert at.value_type == UINT32
    patched(model, model, [(at.value_offset, u32(value))])
    result = runner.invoke(app, ["validate", str(model), "--threads", "1"])
    _clean(result)
    assert result.exit_code == 1 and fragment in result.output


def test_the_layout_walker_agrees_with_the_reader(default_model, smol_layout):
    """The corpus edits bytes where `layout` says a value sits; check it against the reader."""
    fields = read_gguf_header(default_model).fields
    for key, at in smol_layout.items():
        if at.value_type in SCALAR:
            raw = default_model.open("rb")
            raw.seek(at.value_offset)
            fmt = "<" + SCALAR[at.value_type]
            assert struct.unpack(fmt, raw.read(struct.calcsize(fmt)))[0] == pytest.approx(fields[key]), key
            raw.close()
        elif at.value_type == STRING:
            assert isinstance(fields[key], str)


def test_a_missing_model_and_odd_paths_are_one_line(tmp_path):
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.gguf"
    loop.symlink_to(loop)
    for path in [tmp_path, Path("/dev/null"), fifo, loop, tmp_path / ("n" * 300 + ".gguf"), tmp_path / "f" / "x"]:
        with pytest.raises(ModelFileError):
            read_gguf_header(path)
