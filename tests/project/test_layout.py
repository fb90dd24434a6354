"""The package's layers import only downward (DESIGN.md, "Layout"):
cli -> interop -> sweep / probes / validate / train / theory / conform -> backends -> engines, reference -> designs,
with gguf, errors, defaults and the run folder's room (`runfolder`, which sweep, probes and
train all write through) below them all; parts of one layer may import each other (probes
run sweeps). Nothing imports the CLI, nothing below the backends imports a backend, and every
room of the package has a layer (one without would go unchecked). Inside sweep/, the rooms that
build a sweep's contexts import only downward too (CONTEXT_ROOMS)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvphase

PACKAGE = Path(kvphase.__file__).resolve().parent
# interop (a plan as another harness's task, its samples back as a run folder) stands above the sweep whose
# plans and statistics it uses, below the CLI (DESIGN.md, "Next rooms")
LAYER = {"cli": 5, "interop": 4.5, "sweep": 4, "probes": 4, "validate": 4, "train": 4, "theory": 4, "conform": 4, "backends": 3,
         "engines": 2, "reference": 2, "options_check": 2, "designs": 1, "statistics": 1, "gguf": 0, "errors": 0,
         "defaults": 0, "runfolder": 0}
CONTEXT_ROOMS = {"context_settings": 0, "positions": 1, "records": 1, "layout": 2, "contexts": 3}  # in sweep/, lowest first


def _room(path: Path) -> str:
    """The package or module of kvphase a file belongs to (kvphase/sweep/plan.py -> sweep)."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, in full (relative imports resolved, `from kvphase import cli`
    read as kvphase.cli), wherever the import stands: at the top or inside a function."""
    found = set()
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts  # ("kvphase", "sweep", "plan")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[:len(parts) - node.level] + ((node.module,) if node.module else ())) \
                if node.level else node.module
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def _imports(path: Path) -> set[str]:
    """The rooms of kvphase a file imports (kvphase.X... -> X)."""
    rooms = {name.split(".")[1] for name in _imported_modules(path) if name.startswith("kvphase.")}
    return {room for room in rooms if (PACKAGE / room).is_dir() or (PACKAGE / f"{room}.py").is_file()}


def test_every_room_of_the_package_has_a_layer():
    unknown = sorted({_room(path) for path in PACKAGE.rglob("*.py")} - set(LAYER) - {"__init__"})
    assert not unknown, (f"kvphase/{', kvphase/'.join(unknown)} has no layer in tests/project/test_layout.py's LAYER: "
                         "give it one, so that what it imports is checked")


def test_every_module_imports_only_its_own_layer_or_below():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = _room(path)
        if part not in LAYER:
            continue  # kvphase/__init__.py, the API's names; a room without a layer fails the test above
        for target in _imports(path):
            if LAYER.get(target, 0) > LAYER[part]:  # a sibling of the same layer may be imported
                wrong.append(f"{path.relative_to(PACKAGE.parent)} imports kvphase.{target}")
    assert not wrong, "\n".join(wrong)


def test_nothing_but_the_cli_imports_the_cli():
    wrong = [f"{path.relative_to(PACKAGE.parent)} imports kvphase.cli (the library must work without its "
             "command line: move what it needs below the CLI)" for path in sorted(PACKAGE.rglob("*.py"))
             if _room(path) != "cli" and "cli" in _imports(path)]
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
    """context_settings -> positions, records -> layout -> contexts; of the rest of sweep/ only the task files."""
    wrong = []
    for room, level in CONTEXT_ROOMS.items():
        allowed = {other for other, below in CONTEXT_ROOMS.items() if below < level} | {"tasks"}
        imported = _sweep_imports(PACKAGE / "sweep" / f"{room}.py")
        wrong += [f"sweep/{room}.py imports kvphase.sweep.{target}" for target in sorted(imported - allowed)]
    assert not wrong, "\n".join(wrong)
