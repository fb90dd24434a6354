"""A readable numpy reference transformer for llama-family GGUF weights, with pluggable attention."""

from kvphase.gguf.keys import Keys
from kvphase.reference.model import Config, DenseAttention, KVCache, Transformer, load
from kvphase.reference.policy import CompressedAttention, PostHocKPool, make_policy


def open_model(model, policy=None):
    """The reference model for a file: `GPT2` for gpt2 files (kvphase's trained models, under
    the compressor the file declares unless `policy` is given), `DeepSeek4` for deepseek4 files
    in the minimal configuration (`kvphase train csa`), `Glm5Next` for glm5-next files in theirs
    (`kvphase train glm-kpool`), `Transformer` otherwise. `model`: a path, or a `ModelInfo` already
    opened (its header is not read again)."""
    from kvphase.gguf.modelinfo import as_model_info
    from kvphase.reference.deepseek4 import DeepSeek4
    from kvphase.reference.glm5 import Glm5Next
    from kvphase.reference.gpt2 import GPT2
    from kvphase.reference.trained import trained_policy

    info = as_model_info(model)
    arch = info.header.fields.get(Keys.General.ARCHITECTURE)
    if arch == "deepseek4":
        return DeepSeek4.from_gguf(info, policy=policy)
    if arch == "glm5-next":
        return Glm5Next.from_gguf(info, policy=policy)
    if arch != "gpt2":
        return Transformer.from_gguf(info, policy=policy)
    return GPT2.from_gguf(info, policy=policy if policy is not None else trained_policy(info))

__all__ = ["CompressedAttention", "Config", "DenseAttention", "KVCache", "PostHocKPool", "Transformer", "load", "make_policy", "open_model"]
