"""A backend is opened in one place, `sweep.backend_setup.open_backend`: the memory warning before
llama.cpp loads a model, and the backend closed when its block ends, however it ends. The probe
commands, which opened theirs through the registry by hand, neither warned nor closed."""

from __future__ import annotations


import pytest
from typer.testing import CliRunner

from kvphase.backends import BACKENDS
from kvphase.cli import app
from kvphase.gguf.modelinfo import read_model_info
from kvphase.sweep.backend_setup import open_backend
from kvphase.sweep.plan import SweepPlan
from tests.helpers.paths import TRAINED

pytestmark = pytest.mark.slow  # real llama.cpp and the probe commands

GATED = TRAINED / "gated.gguf"  # a trained gpt2 file: the reference runs it
PLANTED = "planted: the model needs more memory than this machine has"


@pytest.fixture
def opened(monkeypatch) -> list[dict]:
    """Every backend the registry opens from here on ({"backend": its name, "closed": whether it was
    closed}), and a memory warning for every model llama.cpp would load."""
    import kvphase.engines.memory as memory

    monkeypatch.setattr(memory, "memory_warning", lambda *args, **kwargs: PLANTED)
    record = []

    def recording(name: str):
        factory = BACKENDS[name]

        def make(*args, **kwargs):
            backend = factory(*args, **kwargs)
            entry = {"backend": name, "closed": False}
            record.append(entry)
            close = getattr(backend, "close", lambda: None)

            def closing() -> None:
                entry["closed"] = True
                close()

            backend.close = closing
            return backend

        return make

    for name in ("llama.cpp", "reference"):
        monkeypatch.setitem(BACKENDS, name, recording(name))
    return record


def test_the_backend_is_closed_when_its_block_fails_and_the_memory_warning_comes_first(opened, tiny_llama):
    info = read_model_info(tiny_llama)
    plan = SweepPlan(model=str(tiny_llama), task="records", stride=4, modulus=8, context=128, per_residue=1,
                     padding="prefix", seed=0, control=True)
    said = []

    def say(notice) -> None:
        said.append((notice.kind, notice.text, len(opened)))

    with pytest.raises(RuntimeError, match="the block failed"):
        with open_backend(plan, info, threads=1, say=say):
            raise RuntimeError("the block failed")
    assert said == [("warning", PLANTED, 0)]  # said before the model loaded
    assert opened == [{"backend": "llama.cpp", "closed": True}]


@pytest.mark.parametrize("command, backends", [
    (["flip", "{tiny}", "--targets", "2", "--cycles", "1", "--context", "256"], ["llama.cpp"]),
    (["knockout", "{tiny}", "--layer", "0", "--per-residue", "1", "--context", "256"], ["llama.cpp"]),
    (["gate-activations", str(GATED), "--contexts", "1"], ["reference"]),
    (["cycle", str(GATED), "--k", "1", "--per-residue", "2"], ["reference", "reference"]),
])
def test_every_probe_command_closes_its_backends_and_warns_before_llamacpp_loads(opened, tiny_llama, tmp_path,
                                                                                  command, backends):
    argv = [word.replace("{tiny}", str(tiny_llama)) for word in command]
    result = CliRunner().invoke(app, [*argv, "--threads", "1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert opened == [{"backend": name, "closed": True} for name in backends]
    warned = f"Warning: {PLANTED}" in result.output
    assert warned == ("llama.cpp" in backends), result.output


@pytest.mark.parametrize("command", [["flip", "{tiny}", "--targets", "2", "--cycles", "1", "--context", "256"],
                                     ["cycle", str(GATED), "--k", "1"], ["knockout", "{tiny}"]])
def test_a_probe_refuses_a_backend_it_cannot_run_in_one_line(tiny_llama, tmp_path, command):
    """Servers score no probe: flip ran llama.cpp in their place, cycle asked for a --url it does not take."""
    argv = [word.replace("{tiny}", str(tiny_llama)) for word in command]
    result = CliRunner().invoke(app, [*argv, "--backend", "server", "--out", str(tmp_path / "run")])
    assert result.exit_code == 1 and result.output.strip() == ("Error: unknown backend 'server'; expected auto, "
                                                               "reference, llama.cpp"), result.output
    assert not (tmp_path / "run").exists()
