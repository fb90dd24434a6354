"""GGUF files: the fast header reader, the one tensor reader, model info, writing, tiny models."""
