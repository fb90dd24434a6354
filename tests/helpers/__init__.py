"""What several test modules share, imported one way: `from tests.helpers.<module> import name`.

cli_checks: how a command's bad input must look; fakes: backends without a model; fake_servers and
hostile_servers: HTTP servers that answer as llama-server does, or attack; faults: a disk that fills
up; gguf_corpus: crafted GGUF files; by_hand: results and statistics written out independently of
kvphase.statistics; trained: the trained-model checks of tests/train; paths: the repository's folders;
same_values: a committed folder's re-written files compared as values, not bytes; tiny_models: the
compressed architectures made by `make-tiny`.
"""
