"""One name per idea in kvphase/: a "probe" is a mechanism probe (kvphase/probes/), never a
sweep's context; a "design" is a compression design (kvphase/designs/), never the statistics' stratification;
one tuple of paddings; one spelling of a layer count and of the request timeout. Read from the source, so a
merge that brings an old name back fails here, naming the file and the line."""

from __future__ import annotations

import ast
from pathlib import Path

import kvphase

PACKAGE = Path(kvphase.__file__).resolve().parent


def _names(path: Path) -> list[tuple[str, int]]:
    """Every name a file binds or reads (variables, arguments, functions, classes, attributes, imports), with
    its line; the file's own module name on line 0."""
    found = [(path.stem, 0)]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name):
            found.append((node.id, node.lineno))
        elif isinstance(node, ast.Attribute):
            found.append((node.attr, node.lineno))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.arg):
            found.append((node.arg, node.lineno))
        elif isinstance(node, ast.keyword) and node.arg:
            found.append((node.arg, node.lineno))
        elif isinstance(node, ast.alias):
            found.append((node.asname or node.name.rsplit(".", 1)[-1], node.lineno))
    return found


def _offending(room: str, bad) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}" for path in sorted((PACKAGE / room).rglob("*.py"))
            for name, line in _names(path) if bad(name)]


def test_the_sweep_names_its_contexts_contexts_not_probes():
    """kvphase/sweep/ may name the mechanism probes' package (kvphase.probes) but nothing of its own a probe."""
    assert _offending("sweep", lambda name: "probe" in name.lower() and name != "probes") == []


def test_the_statistics_name_their_strata_a_stratification_not_a_design():
    """Kish's design effect keeps its name (a summary.json key); nothing else in the statistics is a design."""
    assert _offending("statistics", lambda name: "design" in name.lower() and name != "design_effect") == []


def test_one_tuple_of_paddings():
    tuples = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
              for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
              if isinstance(node, (ast.Tuple, ast.List)) and {"prefix", "in-sequence"} <= {
                  e.value for e in node.elts if isinstance(e, ast.Constant)}]
    assert [place.rsplit(":", 1)[0] for place in tuples] == ["kvphase/sweep/context_settings.py"], tuples


def test_one_spelling_of_the_layer_count_and_the_request_timeout():
    """n_layer as in GGUF and llama.cpp; --request-timeout is request_timeout down to the `Retry` that applies it
    (llama_server.wait_ready's timeout_s, how long a server may take to start, is another idea)."""
    spelled = {"n_layers", "request_timeout_s"}
    assert _offending(".", lambda name: name in spelled) == []
    assert _offending("backends", lambda name: name == "timeout_s") == []
