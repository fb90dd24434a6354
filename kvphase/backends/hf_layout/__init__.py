"""The HF checkpoint layouts export-hf writes for architectures transformers' GGUF reader lacks: each
architecture's writer is llama.cpp's converter read backwards (its module cites the lines), called as
`writer(info, folder)` on an empty staging folder (it returns the parameters written, or None for the file's count)."""

from __future__ import annotations

from kvphase.backends.hf_layout import deepseek4, glm5_next, minimax_m3

LAYOUTS = {"deepseek4": deepseek4.write_deepseek4, "glm5-next": glm5_next.write_glm5_next,
           "minimax-m3": minimax_m3.write_minimax_m3}
