"""A readable numpy reference transformer for llama-family GGUF weights, with pluggable attention."""

from kvphase.reference.model import Config, DenseAttention, KVCache, Transformer, load
from kvphase.reference.policy import CompressedAttention, PostHocKPool, make_policy


def open_model(path, policy=None):
    """The reference model for a file: `GPT2` for gpt2 files (kvphase's trained models, under
    the compressor the file declares unless `policy` is given), `DeepSeek4` for deepseek4 files
    in the minimal configuration (`kvphase train csa`), `Glm5Next` for glm5-next files in theirs
    (`kvphase train glm-kpool`), `Transformer` otherwise."""
    from kvphase.gguf.header import read_gguf_header
    from kvphase.reference.deepseek4 import DeepSeek4
    from kvphase.reference.glm5 import Glm5Next
    from kvphase.reference.gpt2 import GPT2
    from kvphase.reference.trained import trained_policy

    arch = read_gguf_header(path).fields.get("general.architecture")
    if arch == "deepseek4":
        return DeepSeek4.from_gguf(path, policy=policy)
    if arch == "glm5-next":
        return Glm5Next.from_gguf(path, policy=policy)
    if arch != "gpt2":
        return Transformer.from_gguf(path, policy=policy)
    return GPT2.from_gguf(path, policy=policy if policy is not None else trained_policy(path))

__all__ = ["CompressedAttention", "Config", "DenseAttention", "KVCache", "PostHocKPool", "Transformer", "load", "make_policy", "open_model"]
