"""The package's layers import only downward (DESIGN.md, "Layout"):
cli -> sweep / probes / validate / train -> backends -> engines, reference -> designs,
with gguf, errors, defaults and the run folder's room (`runfolder`, which sweep, probes and
train all write through) below them all; parts of one layer may import each other (probes
run sweeps). Nothing imports the CLI, and nothing below the backends imports a backend. Inside
sweep/, the rooms that build a sweep's contexts import only downward too (CONTEXT_ROOMS)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvphase

PACKAGE = Path(kvphase.__file__).resolve().parent
LAYER = {"cli": 5, "sweep": 4, "probes": 4, "validate": 4, "train": 4, "theory": 4, "backends": 3, "engines": 2,
         "reference": 2, "options_check": 2, "designs": 1, "gguf": 0, "errors": 0, "defaults": 0, "runfolder": 0}
CONTEXT_ROOMS = {"probe_settings": 0, "positions": 1, "records": 1, "layout": 2, "contexts": 3}  # in sweep/, lowest first


def _imports(path: Path) -> set[str]:
    """The kvphase sub-packages or modules a file imports (kvphase.X -> X)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        found |= {n.split(".")[1] for n in names if n.startswith("kvphase.")}
    return found


def test_every_module_imports_only_its_own_layer_or_below():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if part not in LAYER:
            continue  # kvphase/__init__.py
        for target in _imports(path):
            if LAYER.get(target, 0) > LAYER[part]:  # a sibling of the same layer may be imported
                wrong.append(f"{path.relative_to(PACKAGE.parent)} imports kvphase.{target}")
    assert not wrong, "\n".join(wrong)


def test_the_run_folder_room_imports_nothing_of_kvphase_but_its_errors():
    wrong = {f"{path.name} imports kvphase.{target}" for path in sorted((PACKAGE / "runfolder").glob("*.py"))
             for target in _imports(path) - {"errors", "runfolder"}}
    assert not wrong, "\n".join(sorted(wrong))


def _sweep_imports(path: Path) -> set[str]:
    """The kvphase.sweep modules a file imports (kvphase.sweep.X -> X)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "kvphase.sweep":
            found |= {a.name for a in node.names}
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        found |= {n.split(".")[2] for n in names if n.startswith("kvphase.sweep.")}
    return found


def test_the_rooms_that_build_a_sweeps_contexts_import_only_downward():
    """probe_settings -> positions, records -> layout -> contexts; of the rest of sweep/ only the task files."""
    wrong = []
    for room, level in CONTEXT_ROOMS.items():
        allowed = {other for other, below in CONTEXT_ROOMS.items() if below < level} | {"tasks"}
        imported = _sweep_imports(PACKAGE / "sweep" / f"{room}.py")
        wrong += [f"sweep/{room}.py imports kvphase.sweep.{target}" for target in sorted(imported - allowed)]
    assert not wrong, "\n".join(wrong)
