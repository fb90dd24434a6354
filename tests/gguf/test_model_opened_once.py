"""A model is opened once: one Python parse of its header per sweep or dry run, however many layers
(planning, limits, vocabulary, memory estimate, backend, reference loader) read what it says."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

import kvphase
import kvphase.gguf.header as header_module

SMALL = {"context": 256, "per_residue": 2, "stride": 8, "threads": 1}  # seconds on the tiny llama


@pytest.fixture
def parses(monkeypatch):
    """The callers of every header parse while the test runs, by the file parsed: (file, call chain)."""
    seen: list[tuple[Path, str]] = []
    parse = header_module.parse_gguf_header

    def counted(f, location, *args, **kwargs):
        chain = " <- ".join(frame.name for frame in reversed(traceback.extract_stack()[:-1])
                            if "/kvphase/" in frame.filename)
        seen.append((Path(str(location)), chain))
        return parse(f, location, *args, **kwargs)

    monkeypatch.setattr(header_module, "parse_gguf_header", counted)
    return seen


def _parses_of(model: Path, parses: list[tuple[Path, str]]) -> list[str]:
    """The call chains that parsed `model` (a split model's other shards are not counted)."""
    return [chain for path, chain in parses if path.resolve() == Path(model).resolve()]


def _opened_once(model: Path, parses: list[tuple[Path, str]]) -> None:
    chains = _parses_of(model, parses)
    assert len(chains) == 1, f"{len(chains)} parses of {Path(model).name}:\n" + "\n".join(chains)


def test_a_default_dry_run_parses_the_header_once(tiny_llama, parses):
    kvphase.dry_run(tiny_llama, on_notice=lambda notice: None)
    _opened_once(tiny_llama, parses)


def test_a_llama_cpp_sweep_parses_the_header_once(tiny_llama, parses, tmp_path):
    kvphase.sweep(tiny_llama, out=tmp_path / "run", backend="llama.cpp", on_notice=lambda notice: None, **SMALL)
    _opened_once(tiny_llama, parses)


def test_a_reference_sweep_parses_the_header_once(tiny_llama, parses, tmp_path):
    kvphase.sweep(tiny_llama, out=tmp_path / "run", backend="reference", on_notice=lambda notice: None, **SMALL)
    _opened_once(tiny_llama, parses)


def test_a_dry_run_of_every_stride_parses_the_header_once(tiny_deepseek4, parses):
    runs = kvphase.dry_run(tiny_deepseek4, stride="all", context=960, per_residue=1, threads=1,
                           on_notice=lambda notice: None)
    assert len(runs) > 1  # several strides, each with its plan, backend and memory estimate
    _opened_once(tiny_deepseek4, parses)


def test_a_calibrated_sweep_parses_the_header_once(tiny_llama, parses, tmp_path):
    """--calibrate: the pilot sweeps and the chosen run all read the model opened for the plan."""
    kvphase.sweep(tiny_llama, out=tmp_path / "run", calibrate=True, on_notice=lambda notice: None, **SMALL)
    _opened_once(tiny_llama, parses)



def test_validating_a_file_parses_the_header_once(parses, tmp_path):
    """`kvphase validate`'s library call: the weights check, the limits and every batch split's capture."""
    from kvphase.gguf.tiny import write_tiny_model
    from kvphase.validate.run import validate_file

    model = write_tiny_model("glm5-next", tmp_path / "glm.gguf")
    parses.clear()  # the writer reads back what it wrote
    validate_file(model, threads=1)
    _opened_once(model, parses)
