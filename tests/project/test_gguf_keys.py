"""GGUF key names are written once, in `kvphase/gguf/keys.py` (as gguf-py's `Keys`), and read from there
everywhere else in kvphase/ and scripts/. Read from the source, so a merge or a new module that writes a key
as a string fails here, naming the file and the line.

What counts as a key written as a string: any string or f-string part (docstrings aside) that holds a key of
`Keys` whole ("general.architecture"), with its architecture ("llama.block_count", f"{arch}.rope.freq_base")
or, where the key has a dot after the architecture, the whole string the key without it ("attention.indexer.top_k").
Not seen: a one-word key without its architecture ("block_count"; the same word names config.json's and servers'
fields), and a key without its architecture inside prose ("declares attention.layer_norm_epsilon 1e-5").
tests/ keep their literals: they pin the constants against llama.cpp's names independently."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from kvphase.gguf.keys import Keys, all_keys

ROOT = Path(__file__).resolve().parents[2]
KEYS_FILE = ROOT / "kvphase" / "gguf" / "keys.py"
ARCH = "{arch}."


def _patterns() -> tuple[re.Pattern, re.Pattern]:
    """A key inside a text (whole, or after its architecture), and a text that is a key without its architecture."""
    keys = all_keys().values()
    whole = [re.escape(k) for k in keys if not k.startswith(ARCH)]
    suffixes = [re.escape(k[len(ARCH):]) for k in keys if k.startswith(ARCH)]
    by_length = lambda names: "|".join(sorted(names, key=len, reverse=True))  # noqa: E731
    inside = re.compile(rf"(?<![\w.])(?:{by_length(whole)}|(?:[a-z][a-z0-9]*(?:-[a-z0-9]+)*|\}})\.(?:{by_length(suffixes)}))"
                        r"(?!\w|\.\w)")
    alone = re.compile(rf"(?:{by_length(s for s in suffixes if '.' in s)})")
    return inside, alone


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def key_literals(source: str, patterns: tuple[re.Pattern, re.Pattern] | None = None) -> list[tuple[int, str]]:
    """(line, text) of every string in `source` that writes a GGUF key of `Keys`."""
    inside, alone = patterns or _patterns()
    tree = ast.parse(source)
    skip = _docstrings(tree)
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # f"{arch}.block_count": the parts as one text, each value as "}"
            text = "".join(v.value if isinstance(v, ast.Constant) else "}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip | parts:
            text = node.value
        else:
            continue
        if inside.search(text) or alone.fullmatch(text):
            found.append((node.lineno, text))
    return found


def _sources() -> list[Path]:
    return [p for top in ("kvphase", "scripts") for p in sorted((ROOT / top).rglob("*.py")) if p != KEYS_FILE]


def test_no_gguf_key_is_written_as_a_string():
    patterns = _patterns()
    offending = [f"{path.relative_to(ROOT)}:{line}: {text!r}" for path in _sources()
                 for line, text in key_literals(path.read_text(encoding="utf-8"), patterns)]
    assert not offending, "GGUF keys written as strings; use kvphase.gguf.keys.Keys:\n" + "\n".join(offending)


def test_the_lint_sees_each_way_a_key_is_written():
    """Planted literals, one per way of writing a key, each seen; the constants and look-alikes not."""
    planted = {
        'meta.text("general.architecture")': True,
        'fields.get("llama.block_count")': True,
        'meta.integer(f"{arch}.attention.indexer.top_k")': True,
        'meta.integer(f"{arch}.block_count", 0)': True,
        'spec.key("attention.indexer.top_k", 4)': True,
        'raise ValueError(f"metadata lacks glm5-next.rope.freq_base, found {x}")': True,
        'meta.integer(Keys.Attention.Indexer.TOP_K.format(arch=arch))': False,
        'config["block_count"]': False,  # one word without its architecture: config.json's too
        'path.with_suffix(".gguf"); "llama.cpp"; "blk.0.attn_q.weight"': False,
        'def f():\n    """reads attention.indexer.top_k"""': False,
        'f"{name} declares attention.layer_norm_epsilon {eps}"': False,  # prose, without the architecture
    }
    seen = {code: bool(key_literals(code)) for code in planted}
    assert seen == planted


def test_the_constants_are_llama_cpps_names():
    """A few keys against their spelling in llama.cpp's src/llama-arch.cpp (LLM_KV_NAMES), typed here."""
    assert Keys.General.ARCHITECTURE == "general.architecture"
    assert Keys.LLM.BLOCK_COUNT.format(arch="llama") == "llama.block_count"
    assert Keys.Attention.Indexer.TOP_K.format(arch="glm5-next") == "glm5-next.attention.indexer.top_k"
    assert Keys.Attention.LAYERNORM_RMS_EPS == "{arch}.attention.layer_norm_rms_epsilon"
    assert Keys.Rope.SCALING_ORIG_CTX_LEN == "{arch}.rope.scaling.original_context_length"
    assert Keys.Tokenizer.LIST == "tokenizer.ggml.tokens"
    values = list(all_keys().values())
    assert len(values) == len(set(values)), "two constants name one key"
