"""A readable numpy reference transformer for llama-family GGUF weights, with pluggable attention."""

from kvphase.reference.model import Config, DenseAttention, KVCache, Transformer, load
from kvphase.reference.policy import CompressedAttention, PostHocKPool, make_policy

__all__ = ["CompressedAttention", "Config", "DenseAttention", "KVCache", "PostHocKPool", "Transformer", "load", "make_policy"]
