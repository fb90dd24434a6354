"""`kvphase export-hf MODEL.gguf OUT/`: a GGUF model as an HF checkpoint folder (the hf extra)."""

from __future__ import annotations

from pathlib import Path

import typer

from kvphase.cli import app
from kvphase.cli.text import plain


@app.command("export-hf")
def export_hf(
    model: Path = typer.Argument(..., help="A llama, deepseek4, glm5-next or minimax-m3 .gguf model file (the default model's is `default`)."),
    out: Path = typer.Argument(..., help="The HF checkpoint folder to write (new, or empty)."),
) -> None:
    """Write a GGUF as an HF checkpoint folder that transformers and `--backend transformers` load.

    float32 safetensors, config.json and the file's tokenizer: a llama through transformers' own GGUF reader,
    deepseek4, glm5-next and minimax-m3 in the layout of transformers' deepseek_v4 / glm5_next / minimax_m3_vl (llama.cpp's converter
    read backwards)."""
    from kvphase.backends.hf_export import export_hf as write_checkpoint

    if model == Path("default") and not model.exists():
        from kvphase.defaults import default_model_path

        model = default_model_path()
    written = write_checkpoint(model, out)
    typer.echo(f"wrote {plain(written.path)}: a {written.architecture} checkpoint of {written.n_params / 1e6:,.1f} M "
               f"float32 parameters ({', '.join(written.files)})")
