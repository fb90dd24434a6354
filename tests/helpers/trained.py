"""What the tests of models trained by kvphase share: a tiny trainer, weights moved away from their
initial values (loud, perturbed), the numpy reference's logits, a sweep's summary, a copy with tensors
zeroed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from kvphase.train.config import TrainConfig

TINY_TRAINING = dict(layers=2, heads=2, d_model=16, context=40, queries=4, batch=8, eval_sequences=16)


def tiny_trainer(design="gated", **overrides):
    from kvphase.train.loop import Trainer

    return Trainer.new(TrainConfig(design=design, **{**TINY_TRAINING, "steps": 4, "eval_every": 2, **overrides}))


def loud(params, rng):
    """Weights large enough that gates, selection and offsets change the logits well beyond float noise."""
    import jax
    import jax.numpy as jnp

    def scale(path, x):
        name = path[-1].key if hasattr(path[-1], "key") else ""
        if name in ("gate", "ape"):
            return jnp.asarray(rng.normal(0, 2.0, size=x.shape), jnp.float32)
        if name in ("w_qkv",):
            return x * 20
        return x

    return jax.tree_util.tree_map_with_path(scale, params)


def numpy_logits(path, tokens):
    from kvphase.reference.gpt2 import GPT2
    from kvphase.reference.trained import trained_policy

    model = GPT2.from_gguf(path, policy=trained_policy(path))
    return np.stack([model.forward(list(map(int, row)), model.new_cache(256)) for row in tokens])


def perturbed_params(config: TrainConfig, n_vocab: int, seed: int = 0) -> dict:
    """Initial weights of the config's layout with every tensor moved by noise: norms, sinks, gate
    biases and (glm5-next) the indexer's ape included."""
    import jax

    from kvphase.train.loop import model_of

    params = model_of(config).init_params(config, n_vocab, seed)
    rng = np.random.default_rng(seed + 100)

    def shake(x):
        scale = 0.5 if x.ndim < 2 or x.shape[0] == 4 else 0.3 / np.sqrt(x.shape[0])
        return x + rng.normal(0.0, scale, size=x.shape).astype(np.float32)

    shaken = jax.tree_util.tree_map(shake, params)
    return {**shaken, "wte": shaken["wte"] * 30.0}  # logits of several units, not a fraction of one


def sweep_summary(model, out, *args) -> dict:
    """`kvphase sweep MODEL` at 64 targets per residue into `out`: its summary.json."""
    from typer.testing import CliRunner

    from kvphase.cli import app

    result = CliRunner().invoke(app, ["sweep", str(model), "--per-residue", "64", "--out", str(out), "--quiet", *args])
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())


def zeroed_copy(model: Path, out: Path, names: list[str]) -> Path:
    """A copy of `model` at `out` with the named tensors set to zero."""
    from kvphase.gguf.tensors import read_model_tensor
    from kvphase.gguf.writer import overwrite_tensor

    shutil.copy(model, out)
    for name in names:
        overwrite_tensor(out, name, np.zeros_like(read_model_tensor(out, name)))
    return out


def train_refused_in_one_line(tmp_path, args: list[str], fragment: str) -> None:
    """`kvphase train DESIGN FOLDER OPTIONS` (args: DESIGN, then OPTIONS) refused in one line holding
    `fragment`, with no folder left behind."""
    from typer.testing import CliRunner

    from kvphase.cli import app

    result = CliRunner().invoke(app, ["train", args[0], str(tmp_path / "o"), *args[1:]])
    assert result.exit_code == 1 and fragment in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
