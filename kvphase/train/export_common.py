"""What every layout's export of a trained model shares: the `kvphase.trained.*` and tokenizer keys,
and the placing of trained tensors into an engine layout's spec (gguf.tiny), untrained ones filled.

export.py (gpt2), export_deepseek4.py and export_glm5.py each import this; none imports another's.
"""

from __future__ import annotations

import numpy as np

from kvphase.gguf.keys import Keys
from kvphase.gguf.trained import TRAINED_PREFIX
from kvphase.train.config import TrainConfig
from kvphase.train.vocab import WordVocab


def shared_metadata(config: TrainConfig, vocab: WordVocab, step: int) -> dict:
    """The keys every layout's export writes: name, word-level tokenizer, `kvphase.trained.*`."""
    return {
        Keys.General.NAME: f"kvphase-{config.design}-S{config.stride}-seed{config.seed}",
        Keys.Tokenizer.MODEL: "gpt2",
        Keys.Tokenizer.PRE: "gpt-2",
        Keys.Tokenizer.LIST: list(vocab.tokens),
        Keys.Tokenizer.TOKEN_TYPE: [3] + [1] * (len(vocab) - 1),  # BOS is a control token
        Keys.Tokenizer.MERGES: list(vocab.merges),
        Keys.Tokenizer.BOS_ID: vocab.bos_id,
        Keys.Tokenizer.EOS_ID: vocab.bos_id,
        Keys.Tokenizer.ADD_BOS: True,
        TRAINED_PREFIX + "design": config.design,
        TRAINED_PREFIX + "stride": config.stride,
        TRAINED_PREFIX + "local_window": config.local_window,
        TRAINED_PREFIX + "top_k": config.top_k,
        TRAINED_PREFIX + "stagger": config.stagger,
        TRAINED_PREFIX + "offsets": config.offsets,
        TRAINED_PREFIX + "starts": [s for layer in config.starts() for s in layer],
        TRAINED_PREFIX + "context": config.context,
        TRAINED_PREFIX + "task": config.task,
        TRAINED_PREFIX + "steps": step,
        TRAINED_PREFIX + "seed": config.seed,
    }


def fill_spec(spec, trained: dict[str, np.ndarray], untrained, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """Every tensor an engine layout's spec (gguf.tiny) names, in its order: the trained ones (each
    used once, shape-checked) and `untrained(name, ne, kind)` for the machinery training does not
    produce; the vocabulary axis is the trained one."""
    trained, out = dict(trained), []
    for name, ne, kind in spec.tensors:
        shape = tuple(reversed(ne))
        if name in ("token_embd.weight", "output.weight"):
            shape = (n_vocab,) + shape[1:]
        value = np.ascontiguousarray(trained.pop(name)) if name in trained else untrained(name, ne, kind)
        if value.shape != shape:
            raise AssertionError(f"{name}: the {spec.arch} layout expects {shape}, the trained model has {value.shape}")
        out.append((name, value))
    if trained:
        raise AssertionError(f"trained tensors the {spec.arch} layout has no place for: {sorted(trained)}")
    return out
