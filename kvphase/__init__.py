"""kvphase: find the periodic weak spots that chunked KV-cache compression leaves in retrieval."""

__version__ = "0.1.0"
