"""The HF checkpoint layouts export-hf writes for architectures transformers' GGUF reader lacks: each
architecture's writer is llama.cpp's converter read backwards (its module cites the lines), called as
`writer(info, folder) -> parameters written` on an empty staging folder."""

from __future__ import annotations

from kvphase.backends.hf_layout import deepseek4

LAYOUTS = {"deepseek4": deepseek4.write_deepseek4}
