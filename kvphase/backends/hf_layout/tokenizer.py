"""A GGUF's tokenizer as an HF checkpoint's tokenizer files, for architectures transformers' GGUF
model reader refuses (deepseek4, glm5-next, minimax-m3): the vocabulary is read with transformers' own
GGUF tokenizer reading (`integrations/gguf/gguf_tokenizer_mapping.py`, which does not look at the
architecture), and the BOS llama.cpp puts before a text (`tokenizer.ggml.add_bos_token`) becomes the
post-processor's, so a checkpoint's prompts are the GGUF's token for token."""

from __future__ import annotations

from pathlib import Path

from kvphase.errors import PlanError
from kvphase.gguf.modelinfo import ModelInfo


def write_gguf_tokenizer(info: ModelInfo, folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json; nothing for a file without a tokenizer (make-tiny's
    random models: their copy is scored on token ids, as the GGUF is)."""
    if info.tokenizer_model in ("none", "unknown"):
        return
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    try:
        architecture, vocabulary, settings = get_gguf_tokenizer(str(info.path))
        backend, _ = convert_gguf_tokenizer(architecture, vocabulary)
    except (ValueError, KeyError) as exc:
        raise PlanError(f"{info.path.name}: its tokenizer cannot be written as tokenizer.json ({str(exc)[:120]})") from None
    bos = settings.get("bos_token")
    if settings.get("add_bos_token") and bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocabulary["bos_token_id"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=settings.get("eos_token"),
                                        unk_token=settings.get("unk_token"), pad_token=settings.get("pad_token"))
    tokenizer.save_pretrained(str(folder))
