"""HF checkpoint layouts written from a GGUF file, one module per architecture (llama.cpp's converter
read backwards): `LAYOUTS[architecture](info, folder)` writes config.json, model.safetensors and, where the
file has a vocabulary, tokenizer.json into `folder` (a staging folder `hf_export` renames into place)."""

from kvphase.backends.hf_layout import glm5_next, minimax_m3

LAYOUTS = {"glm5-next": glm5_next.write_glm5_next, "minimax-m3": minimax_m3.write_minimax_m3}
