"""Answers a user can act on (issue 56): a BOS or EOS id outside the vocabulary, `validate` on a
header-only file, a dry run's long first context, a tiny model's header size, `compare` on a file,
and the planner's matched-means guard at its bound."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from kvphase.cli import app
from kvphase.cli.inspect_cmd import file_size
from kvphase.errors import GGUFError, PlanError
from kvphase.gguf.header_only import write_header_only
from kvphase.gguf.limits import check_llama_limits
from kvphase.gguf.modelinfo import read_model_info
from kvphase.gguf.tiny import write_tiny_model
from kvphase.sweep.positions import MEAN_TOLERANCE, check_matched_positions
from tests.helpers.cli_checks import one_line_error
from tests.helpers.gguf_corpus import layout, patched, u32

runner = CliRunner()


@pytest.mark.parametrize("name", ["bos", "eos"])
def test_a_special_token_id_outside_the_vocabulary_is_named(tiny_llama, tmp_path, name):
    key = f"tokenizer.ggml.{name}_token_id"
    fields, _ = layout(tiny_llama)
    bad = patched(tiny_llama, tmp_path / "bad.gguf", [(fields[key].value_offset, u32(10**9))])
    n_vocab = read_model_info(tiny_llama).vocab_size
    with pytest.raises(GGUFError, match=f"metadata {key} is 1000000000, expected a token id from 0 to {n_vocab - 1}"):
        check_llama_limits(bad)
    one_line_error(runner.invoke(app, ["sweep", str(bad), "--out", str(tmp_path / "run"), "-q"]), key)
    last = patched(tiny_llama, tmp_path / "last.gguf", [(fields[key].value_offset, u32(n_vocab - 1))])
    check_llama_limits(last)  # the last id of the vocabulary is one


@pytest.mark.parametrize("arch", ["glm5-next", "llama"])
def test_validate_refuses_a_header_only_file_before_anything_else(tmp_path, arch):
    model = write_tiny_model(arch, tmp_path / "tiny.gguf")
    header = write_header_only(model, tmp_path / "header.gguf").path
    result = runner.invoke(app, ["validate", str(header), "--threads", "1"])
    one_line_error(result, "is a header-only file (kvphase header)", "validate needs them")
    assert "compression" not in result.output


def test_a_dry_run_says_it_is_timing_a_context(tiny_llama, tmp_path):
    result = runner.invoke(app, ["sweep", str(tiny_llama), "--context", "256", "--per-residue", "1", "--threads", "1",
                                 "--dry-run", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    timing = next(i for i, line in enumerate(lines) if line.startswith("Timing one context: "))
    took = next(i for i, line in enumerate(lines) if line.startswith("One context ("))
    assert timing < took, result.output
    assert lines[timing].split(": ")[1].split(" tokens")[0] == lines[took].split("(")[1].split(" tokens")[0]


def test_sizes_below_a_tenth_of_a_mib_are_in_kib(tiny_llama, tmp_path):
    assert file_size(40 * 1024) == "40.0 KiB" and file_size(2**20 // 10 + 1) == "0.1 MiB"
    assert file_size(98_349_056) == "93.8 MiB"
    result = runner.invoke(app, ["header", str(tiny_llama), str(tmp_path / "h.gguf")])
    assert result.exit_code == 0 and "0.0 MiB" not in result.output, result.output


def test_compare_given_a_file_says_it_is_a_file(tmp_path):
    afile = tmp_path / "plain"
    afile.write_text("x")
    one_line_error(runner.invoke(app, ["compare", str(afile)]), f"{afile} is not a run folder: it is a file")
    one_line_error(runner.invoke(app, ["compare", str(tmp_path / "nope")]), "no such directory")


def _groups(*groups: list[int]) -> np.ndarray:
    return np.array(sorted(p for group in groups for p in group))  # (n,)


def test_the_matched_means_guard_holds_at_its_bound_and_refuses_past_it():
    """Modulus 2, four targets per residue (so the bound is MEAN_TOLERANCE, 0.5 token): group means
    6 and 7 sit 0.5 from their mean, at the bound; 6 and 7.5 sit 0.75 from it, past the bound
    (a doubled tolerance would let them through to the SD check)."""
    assert MEAN_TOLERANCE == 0.5
    check_matched_positions(_groups([0, 4, 8, 12], [1, 5, 9, 13]), 2)
    with pytest.raises(PlanError, match=r"residue groups' mean target positions \(from 6.00 at residue 0 to 7.50 at "
                                        r"residue 1\) differ by more than 0.5 tokens"):
        check_matched_positions(_groups([0, 4, 8, 12], [1, 5, 9, 15]), 2)


def test_the_matched_means_guard_of_groups_smaller_than_the_modulus_is_half_the_modulus():
    """Two targets per residue at modulus 4 (n < M): the bound is M / 2 = 2 tokens. Whole groups
    move by M (equal SDs), so means 1.5 from their mean are the nearest below it and 2.5 above it
    (half the bound and twice it are both caught)."""
    check_matched_positions(_groups([0, 16], [1, 17], [2, 18], [-1, 15]), 4)  # means 8, 9, 10, 7: 1.5 from 8.5
    with pytest.raises(PlanError, match="differ by more than 2 tokens"):
        check_matched_positions(_groups([0, 16], [1, 17], [-2, 14], [3, 19]), 4)  # 8, 9, 6, 11: 2.5 from 8.5
