"""`validate`: the reference designs equal llama.cpp on tiny models, and a wrong reference fails."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import numpy as np

from kvphase.engines.capture import EngineSettings
from kvphase.cli import app
from kvphase.errors import PlanError
from kvphase.gguf.tiny import write_tiny_model
from kvphase.gguf.header import read_gguf_header
from kvphase.designs.dsv4 import dsv4_rope_scaling, hadamard, hadamard_rotate
from kvphase.validate import default_splits, validate_model

pytestmark = pytest.mark.slow
VALIDATED = ["glm5-next", "minimax-m3"]
# one llama.cpp thread: on a busy two-core machine a second thread spin-waits and runs up to ~20x slower
ONE_THREAD = EngineSettings(n_ctx=512, n_threads=1)
SMALL_ONE_THREAD = EngineSettings(n_ctx=256, n_threads=1)


def _describe(report) -> str:
    """Every layer's max and mean differences, so a failing assertion says how far off it was."""
    lines = []
    for layer in report.layers:
        lines.append(
            f"layer {layer.layer}: keys max {layer.keys.max:.3g} mean {layer.keys.mean:.3g}; "
            f"scores max {layer.scores.max:.3g} mean {layer.scores.mean:.3g} (largest {layer.score_scale:.3g}); "
            f"sets {layer.exact}+{layer.ties} ties of {layer.rows}; {layer.failures(report.tolerances)} {layer.notes[:2]}"
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny_model(arch, folder / f"{arch}.gguf") for arch in VALIDATED + ["deepseek4"]}


@pytest.mark.parametrize("arch", VALIDATED)
def test_reference_equals_llama_cpp(arch, models):
    report = validate_model(models[arch], n_tokens=64, settings=SMALL_ONE_THREAD)
    assert report.passed, _describe(report)
    assert len(report.layers) == 2
    for layer in report.layers:
        assert layer.rows > 0 and layer.scores.count > 0
        assert layer.exact + layer.ties == layer.rows
    if arch == "glm5-next":
        assert all(layer.keys.count > 0 for layer in report.layers)


@pytest.mark.parametrize("arch", VALIDATED)
def test_reference_rounds_where_an_f16_cache_rounds(arch, models):
    report = validate_model(models[arch], n_tokens=64, settings=SMALL_ONE_THREAD, cache="f16")
    assert report.passed, _describe(report)


def test_an_f32_reference_against_an_f16_cache_fails(models, monkeypatch):
    """The F16 rounding is visible: without modelling it, keys miss the 1e-5 tolerance."""
    import kvphase.validate as validate

    class UnroundedKPool(validate.KPoolCheck):
        def __init__(self, info, ape_roll=0, cache_dtype="f32"):
            super().__init__(info, ape_roll, cache_dtype="f32")

    monkeypatch.setitem(validate.FAMILIES, "kpool", UnroundedKPool)
    report = validate_model(models["glm5-next"], n_tokens=64, settings=SMALL_ONE_THREAD, cache="f16")
    assert not report.passed
    assert all("keys differ by up to" in " ".join(layer.failures(report.tolerances)) for layer in report.layers)


@pytest.mark.parametrize("arch", VALIDATED)
def test_a_phase_shifted_reference_fails(arch, models):
    # glm5-next: the per-phase gate bias rolled by one offset; minimax-m3: blocks start one position late
    report = validate_model(models[arch], n_tokens=48, splits=[[48]], settings=SMALL_ONE_THREAD, perturb=1)
    assert not report.passed
    for layer in report.layers:
        reasons = " ".join(layer.failures(report.tolerances))
        assert "scores differ by up to" in reasons and "mean" in reasons


def test_deepseek4_reference_equals_llama_cpp(models):
    # default length: two ratio-128 blocks (HCA) and a tail; default splits cut blocks and decode
    report = validate_model(models["deepseek4"], settings=ONE_THREAD)
    assert report.n_tokens >= 2 * 128
    assert report.passed, _describe(report)
    csa, hca = report.layers
    assert (csa.layer, hca.layer) == (1, 2)
    for layer in report.layers:
        assert layer.gates.count > 0 and layer.keys.count > 0 and layer.rows > 0
        assert layer.exact + layer.ties == layer.rows
        assert layer.attention.count > 0 and layer.attention_scale > 0
    assert csa.scores.count > 0 and csa.score_scale > 0
    assert hca.scores.count == 0  # HCA reads every complete block: no indexer


def test_deepseek4_rolled_ape_fails(models):
    # every per-phase gate bias (CSA, indexer, HCA) rolled by one offset
    report = validate_model(models["deepseek4"], n_tokens=160, splits=[[160]], settings=ONE_THREAD, perturb=1)
    assert not report.passed
    for layer in report.layers:
        reasons = " ".join(layer.failures(report.tolerances))
        assert "gate logits differ by up to" in reasons and "keys differ by up to" in reasons, reasons
    csa_reasons = " ".join(report.layers[0].failures(report.tolerances))
    assert "scores differ by up to" in csa_reasons and "selected sets differ" in csa_reasons


def test_deepseek4_with_yarn_rope_equals_llama_cpp(tmp_path, monkeypatch):
    model = write_tiny_model("deepseek4", tmp_path / "yarn.gguf", yarn_factor=4.0)
    freq_scale, yarn = dsv4_rope_scaling(read_gguf_header(model).fields, "deepseek4")
    assert freq_scale == 0.25 and yarn is not None and yarn.ext_factor == 1.0
    report = validate_model(model, n_tokens=160, splits=[[97, 63]], settings=ONE_THREAD)
    assert report.passed, _describe(report)
    assert all(layer.keys.count > 0 for layer in report.layers)
    # the same scaling without YaRN's ramp must miss llama.cpp's CSA entries
    monkeypatch.setattr("kvphase.validate.dsv4.dsv4_rope_scaling", lambda fields, arch: (freq_scale, None))
    without = validate_model(model, n_tokens=160, splits=[[97, 63]], settings=ONE_THREAD)
    assert not without.passed
    assert "keys differ by up to" in " ".join(without.layers[0].failures(without.tolerances))


def test_deepseek4_raw_window_tokens_are_checked(models, monkeypatch):
    # a reference whose sliding window is one token short must miss the raw cells llama.cpp exposes
    from kvphase.designs import DSV4
    from kvphase.designs.windows import local_mask

    monkeypatch.setattr(DSV4, "raw_window", lambda self, positions, n_keys: local_mask(positions, n_keys, self.n_swa - 1))
    report = validate_model(models["deepseek4"], n_tokens=160, splits=[[97, 63]], settings=ONE_THREAD)
    assert not report.passed
    for layer in report.layers:
        assert layer.mismatched > 0 and "masks differ" in " ".join(layer.notes), _describe(report)


def test_deepseek4_attention_without_sinks_fails(models, monkeypatch):
    from kvphase.validate import DSV4Check

    read = DSV4Check.tensor
    no_sinks = lambda self, name: (  # noqa: E731 - a sink logit of -inf adds nothing to the softmax
        np.full_like(read(self, name), -np.inf) if name.endswith("attn_sinks.weight") else read(self, name))
    monkeypatch.setattr(DSV4Check, "tensor", no_sinks)
    report = validate_model(models["deepseek4"], n_tokens=160, splits=[[97, 63]], settings=ONE_THREAD)
    assert not report.passed
    for layer in report.layers:
        reasons = layer.failures(report.tolerances)
        assert reasons and all(r.startswith("attention outputs differ") for r in reasons), reasons


def test_make_tiny_yarn_only_where_validate_models_it(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["make-tiny", "deepseek4", str(tmp_path / "d.gguf"), "--yarn-factor", "16"])
    assert ok.exit_code == 0 and "YaRN x16" in ok.output
    bad = runner.invoke(app, ["make-tiny", "glm5-next", str(tmp_path / "g.gguf"), "--yarn-factor", "16"])
    assert bad.exit_code == 1 and "deepseek4 only" in bad.output
    assert isinstance(bad.exception, SystemExit), repr(bad.exception)  # not an uncaught error
    (tmp_path / "taken").write_text("a file where a folder should be")
    unwritable = runner.invoke(app, ["make-tiny", "glm5-next", str(tmp_path / "taken" / "g.gguf")])
    assert unwritable.exit_code == 1 and unwritable.output.startswith("Error: cannot write")


def test_deepseek4_too_short_for_hca_says_so(models):
    report = validate_model(models["deepseek4"], n_tokens=48, splits=[[40, 8]], settings=ONE_THREAD)
    csa, hca = report.layers
    assert not csa.failures(report.tolerances), _describe(report)
    assert not report.passed
    assert hca.keys.count == 0
    assert any("not compared: no ratio-128 block completes within 48 tokens" in r for r in hca.failures(report.tolerances))


def test_hadamard_is_llama_cpps_orthonormal_rotation():
    h = hadamard(64)
    np.testing.assert_allclose(h @ h, np.eye(64), atol=1e-6)  # res^2 == I (ggml_gen_hadamard)
    assert h[0, 0] == np.float32(0.125) and h[1, 1] == -h[0, 0]
    x = np.random.default_rng(0).standard_normal((3, 128)).astype(np.float32)
    np.testing.assert_allclose(hadamard_rotate(x), (x.reshape(-1, 128) @ hadamard(128)).reshape(3, 128), atol=1e-6)


def test_default_splits_straddle_pools_and_decode():
    splits = default_splits(64, 4)
    assert all(sum(s) == 64 for s in splits)
    assert any(any(size > 16 for size in s) and any(size % 4 for size in s) for s in splits)
    assert any(all(size <= 16 for size in s[1:]) and s[-1] > 1 for s in splits)
    with pytest.raises(PlanError):
        default_splits(10, 4)


def test_validate_refuses_more_tokens_than_the_context(models):
    result = CliRunner().invoke(app, ["validate", str(models["deepseek4"]), "--tokens", "100000"])
    assert result.exit_code == 1 and "does not fit" in result.output and "1024-token context" in result.output


@pytest.mark.parametrize("threads", ["0", "-1", "513"])
def test_validate_refuses_a_thread_count_llama_cpp_cannot_run(models, threads):
    """0 is refused like any other impossible count, never read as "the default"."""
    result = CliRunner().invoke(app, ["validate", str(models["glm5-next"]), "--threads", threads])
    assert result.exit_code == 1 and f"--threads must be from 1 to 512 (llama.cpp's limit), got {threads}" in result.output


def test_validate_cli_pass_and_fail_exit_codes(models):
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(models["glm5-next"]), "--tokens", "40", "--threads", "1"])
    assert ok.exit_code == 0, ok.output
    assert "PASS" in ok.output and "FAIL" not in ok.output
    assert ok.output.strip().splitlines()[-1] == "PASS"
    bad = runner.invoke(
        app, ["validate", str(models["glm5-next"]), "--tokens", "40", "--split", "40", "--perturb", "1", "--threads", "1"]
    )
    assert bad.exit_code == 1, bad.output
    assert "FAIL" in bad.output and "keys differ by up to" in bad.output
    assert bad.output.strip().splitlines()[-1] == "FAIL"


def test_validate_cli_deepseek4(models):
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(models["deepseek4"]), "--tokens", "160", "--split", "97,63", "--threads", "1"])
    assert ok.exit_code == 0, ok.output
    assert "deepseek4 (dsv4)" in ok.output and "PASS" in ok.output and "FAIL" not in ok.output
    assert "split 1/1: 2 batches, 160 tokens" in ok.output  # progress before each split
    short = runner.invoke(app, ["validate", str(models["deepseek4"]), "--tokens", "40", "--split", "40", "--threads", "1"])
    assert short.exit_code == 1, short.output
    assert "not compared: no ratio-128 block completes within 40 tokens" in short.output


def _header_only_gguf(path, arch: str):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_validate_cli_usage_errors(models, tmp_path):
    runner = CliRunner()
    wrong = runner.invoke(app, ["validate", str(models["glm5-next"]), "--tokens", "40", "--split", "10,10"])
    assert wrong.exit_code == 1 and "must be positive sizes summing to 40" in wrong.output
    missing = runner.invoke(app, ["validate", str(tmp_path / "none.gguf")])
    assert missing.exit_code == 1 and "not found" in missing.output
    plain = _header_only_gguf(tmp_path / "llama.gguf", "llama")  # no compression declared
    unsupported = runner.invoke(app, ["validate", str(plain)])
    assert unsupported.exit_code == 1 and "validation supports" in unsupported.output


def test_validate_help():
    result = CliRunner().invoke(app, ["validate", "--help"])
    assert result.exit_code == 0 and "--split" in result.output


def test_deepseek4_reference_rounds_where_an_f16_cache_rounds(models):
    # the compressed caches round after llama.cpp's Hadamard rotation; the indexer scores in that basis
    report = validate_model(models["deepseek4"], settings=ONE_THREAD, cache="f16")
    assert report.passed, _describe(report)
    for layer in report.layers:
        assert layer.gates.count > 0 and layer.keys.count > 0 and layer.rows > 0
    assert report.layers[0].scores.count > 0
