"""llama.cpp itself: the one session (log silencing, load, context, decode, logits) and tensor capture."""
