"""The reference models `kvphase conform` checks an engine against, and their committed folders.

A reference is a model file and the run folder that scored it through llama.cpp: the folder's
`config.json` is the plan the engine runs again, its `results.csv` what the engine must reproduce,
its `manifest.json` the file's sha256 (so a changed file is refused, not compared). `check` says
what is compared: "profile" for a trained model (accuracy residue by residue, equivalent within a
margin), "logprobs" for a random-weight one (accuracy is near zero everywhere and says nothing;
each target's log-probability is what the engine must match).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvphase.errors import RunFolderError
from kvphase.runfolder import CONFIG_FILE, MANIFEST_FILE, read_json_object

CHECKS = ("profile", "logprobs")
# the checkout the default references live in (they are committed there, not installed with kvphase)
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Reference:
    """One reference model: its name in the table, its file, its committed folder, what is checked."""

    name: str
    model: Path
    folder: Path
    check: str  # "profile" or "logprobs" (CHECKS)
    what: str  # one phrase for the report: the layout and what the model is

    @property
    def config(self) -> dict:
        """The committed plan; RunFolderError when the folder has none (nothing can be run again)."""
        path = self.folder / CONFIG_FILE
        if not path.is_file():
            raise RunFolderError(f"reference {self.name}: {self.folder} has no {CONFIG_FILE}, so its plan cannot "
                                 "be run again; restore the folder")
        return read_json_object(path)

    @property
    def sha256(self) -> str:
        """The model file's sha256 as the committed folder recorded it."""
        path = self.folder / MANIFEST_FILE
        if not path.is_file():
            raise RunFolderError(f"reference {self.name}: {self.folder} has no {MANIFEST_FILE}; restore the folder")
        recorded = read_json_object(path).get("model", {})
        if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str):
            raise RunFolderError(f"reference {self.name}: {path} records no model sha256; restore the folder")
        return recorded["sha256"]


DEFAULT_REFERENCES = (
    Reference("csa-disjoint", ROOT / "tests/data/trained/csa-disjoint.gguf",
              ROOT / "reports/trained/engine/csa-disjoint-seed0/sweep", "profile",
              "deepseek4, DeepSeek-V4's compressor pooling disjoint 4-token blocks: weak spot at residue 3"),
    Reference("csa-dense", ROOT / "tests/data/trained/csa-dense.gguf",
              ROOT / "reports/trained/engine/csa-dense-seed0/sweep", "profile",
              "deepseek4, its dense twin: no phase effect at its sweep's power"),
    Reference("csa-top4", ROOT / "tests/data/trained/csa-top4.gguf",
              ROOT / "reports/trained/ds4-ablation/ctx128-top4-seed0/sweep", "profile",
              "deepseek4, the overlapped compressor and the lightning indexer's top 4: weak spot at the block end"),
    Reference("glm-dense", ROOT / "tests/data/trained/glm-dense.gguf",
              ROOT / "reports/trained/engine/glm-dense-seed0/sweep", "profile",
              "glm5-next, a top-k that keeps every pool: no phase effect at its sweep's power"),
    Reference("glm-kpool-top4", ROOT / "reports/trained/engine/glm-kpool-top4-seed0/model.gguf",
              ROOT / "reports/trained/engine/glm-kpool-top4-seed0/sweep", "profile",
              "glm5-next, GLM-5.3's k-pool indexer keeping 4 pools: no phase effect at its sweep's power; the pooling decides what is kept"),
    Reference("glm5-next-random", ROOT / "tests/data/conform/glm5-next-random.gguf",
              ROOT / "reports/conform/references/glm5-next-random", "logprobs",
              "glm5-next, random weights, k-pool top-k below the pools: per-target log-probabilities"),
    Reference("minimax-m3-random", ROOT / "tests/data/conform/minimax-m3-random.gguf",
              ROOT / "reports/conform/references/minimax-m3-random", "logprobs",
              "minimax-m3, random weights: per-target log-probabilities"),
)


def load_references(path: Path) -> tuple[Reference, ...]:
    """A reference set from a JSON list of {name, model, folder, check, what}; paths are relative
    to the file's own folder. RunFolderError naming the entry when one is malformed."""
    raw = _read_list(path)
    references = []
    for index, entry in enumerate(raw):
        try:
            reference = Reference(str(entry["name"]), path.parent / entry["model"], path.parent / entry["folder"],
                                  str(entry["check"]), str(entry.get("what", "")))
        except (KeyError, TypeError):
            raise RunFolderError(f"{path}: entry {index} needs name, model, folder and check") from None
        if reference.check not in CHECKS:
            raise RunFolderError(f"{path}: entry {index} ({reference.name}) checks {reference.check!r}; "
                                 f"expected one of {', '.join(CHECKS)}")
        references.append(reference)
    if not references:
        raise RunFolderError(f"{path} lists no reference models")
    return tuple(references)


def _read_list(path: Path) -> list:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunFolderError(f"{path}: no such references file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"{path} is not a readable JSON list of references ({exc})") from None
    if not isinstance(raw, list):
        raise RunFolderError(f"{path} is not a JSON list of references")
    return raw


def select(references: tuple[Reference, ...], wanted: list[str]) -> tuple[Reference, ...]:
    """The references `wanted` names (each a reference's name, or a model file identical to one's),
    in the set's order; all when none is named. RunFolderError for anything else."""
    if not wanted:
        return references
    chosen = set()
    for item in wanted:
        chosen.add(_identify(references, item).name)
    return tuple(r for r in references if r.name in chosen)


def _identify(references: tuple[Reference, ...], item: str) -> Reference:
    by_name = {r.name: r for r in references}
    if item in by_name:
        return by_name[item]
    path = Path(item)
    if not path.is_file():
        raise RunFolderError(f"{item} is neither a reference model's name ({', '.join(by_name)}) nor a model file")
    from kvphase.runfolder import file_sha256

    digest = file_sha256(path)
    for reference in references:
        if reference.sha256 == digest:
            return reference
    raise RunFolderError(f"{item} is not one of the reference models (its sha256 {digest[:16]}... matches none of "
                         f"{', '.join(by_name)}); conform checks an engine on models whose results are committed")
