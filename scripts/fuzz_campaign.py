"""A fuzz and fault campaign through the real command line (issue 9's audit, reproducible).

Damaged GGUF files (truncations, random byte flips, targeted header edits) under
`inspect` and `sweep`, crafted files and odd paths, damaged tiny models under `validate`,
damaged run folders under `report`, resume and `compare`, abusive options, hostile servers
(`tests/helpers/hostile_servers.py`: endless, trickling, looping, oversized, holding another model) under
`sweep`, `conform`, `header` and `inspect`, and wrong types through the Python API. Every trial
runs `python -m kvphase.cli ...` (an API trial: `python -c CODE`, which prints the library's error
in one line) as its own process and is classified:

    ok            exit 0
    clean error   exit 1 or 2 (one error line or a usage message), no traceback
    traceback     "Traceback" in the output
    native crash  killed by a signal (a llama.cpp abort, a segfault)
    hang          more than --timeout seconds of CPU (RLIMIT_CPU), or still running after
                  --wall seconds (a process blocked on input)

The limit is on CPU time, not wall time, so that a machine shared with other work does
not turn a slow start into a "hang"; on an idle machine the two are the same.

    nice -n 10 python scripts/fuzz_campaign.py              # everything, then the table
    python scripts/fuzz_campaign.py --only options -v       # one category, every trial shown

Seeds: the default model (SmolLM2-135M-Instruct), a tiny llama carrying its tokenizer (so a
sweep on a damaged copy that still loads takes a second, not a minute) and the `make-tiny`
models; crafted files come from `tests/helpers/gguf_corpus.py`. The same --seed builds the same
files. Work files live in a temporary folder removed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvphase.defaults import default_model_path  # noqa: E402
from kvphase.gguf.keys import Keys
from kvphase.gguf.remote import REQUEST_DEADLINE  # noqa: E402
from kvphase.gguf.tiny import TINY_ARCHS, write_tiny_model  # noqa: E402
from tests.helpers.gguf_corpus import (ARRAY, FLOAT32, STRING, UINT32, crafted_files, layout, patched,  # noqa: E402
                               u32)

OUTCOMES = ("ok", "clean error", "traceback", "native crash", "hang", "rows differ")
FINISHED = ("Report:", "Model:")  # the last line of a sweep and of a training run that completed
BAD = ("traceback", "native crash", "hang", "rows differ")
SWEEP = ["--context", "256", "--per-residue", "1", "--quiet", "--threads", "1"]
CATEGORIES = {
    "gguf": "GGUF truncations, random flips, targeted header edits (inspect, sweep)",
    "crafted": "crafted GGUFs and odd paths (inspect, sweep)",
    "validate": "validate on damaged tiny models",
    "folders": "damaged run folders (report, resume, compare)",
    "options": "option abuse",
    "training": "damaged training folders (train, report)",
    "probes": "damaged probe folders (report, and the probe run again on its folder)",
    "signals": "SIGINT / SIGTERM during training and sweeps",
    "servers": "hostile servers under sweep --backend server",
    "hostile": "endless, trickling, looping, oversized and wrong-model servers under sweep, header, inspect, conform",
    "api": "wrong types and values through the Python API's functions",
    "silent": "a llama-server stopped (SIGSTOP) mid-sweep, alone and in a fleet, then the sweep again",
    "identity": "a tiny llama through a llama-server holding its seed twin (file here, file gone) or itself (gone)",
    "disk": "a full disk at every writing command (a tmpfs left 0 B to 64 KiB free)",
    "memory": "too little memory (RLIMIT_AS) under sweep, training, probes and theory",
    "readonly": "read-only and immutable folders under every writing command",
    "checkpoints": "damaged HF checkpoint folders (inspect, sweep --backend transformers) and export-hf's bad input",
    "exports": "export-hf of deepseek4 files transformers' config cannot express or damaged, and their copies edited",
}
# a tmpfs of its own in a user namespace, inputs copied in, then filled to leave $FREE bytes
FULL_DISK = """set -e
mount -t tmpfs -o size=64m tmpfs "$MNT"
for src in $COPY; do cp -r "$src" "$MNT/"; done
if [ -n "$FREE" ]; then
  dd if=/dev/zero of="$MNT/.filler" bs=4096 status=none 2>/dev/null || true
  truncate -s "-$FREE" "$MNT/.filler"
fi
eval "$AFTER"
exec "$@"
"""
HOSTILE_SERVER_S = 2 * 2 + 0.25  # what a sweep waits on a server that never answers: 2 tries of --request-timeout 2
HOSTILE_START_S = 30.0  # a command's own start before its first request, on a machine the campaign keeps busy
TRAIN = ["--layers", "1", "--heads", "2", "--d-model", "16", "--context", "40", "--batch", "4", "--steps", "4",
         "--eval-every", "2", "-q"]


@dataclass
class Case:
    """One prepared input and the commands run on it, in order."""

    category: str
    label: str
    commands: list[list[str]]
    prepare: Callable[[], object] | None = None
    cleanup: list[Path] = field(default_factory=list)
    results: list[tuple[str, str, float]] = field(default_factory=list)  # (outcome, first line, wall s) per command
    signal_after: tuple[int, float] | None = None  # (signal, seconds): sent to each command after that long
    cpu: float | None = None  # CPU seconds before a hang, when the campaign's --timeout is too short (training)
    prefix: list[str] = field(default_factory=list)  # runs each command through this (a namespace with a small disk)
    address_space: int | None = None  # bytes: RLIMIT_AS of each command (too little memory)
    release: Callable[[], object] | None = None  # before cleanup (an immutable folder made mutable again)
    during: Callable[[int], object] | None = None  # run in a thread while command i runs (a server paused)
    between: Callable[[int], object] | None = None  # before command i (a paused server let go on)
    check: Callable[[], str] | None = None  # after the commands: "" or what differs from a clean run's rows
    wall: float | None = None  # seconds in all before a hang, when the case states its own bound (a server's deadline)


def run_cli(argv: list[str], timeout: float, cwd: Path, wall: float = 300,
            signal_after: tuple[int, float] | None = None, prefix: list[str] = (),
            address_space: int | None = None) -> tuple[str, str]:
    """(outcome, the telling line of output) of one CLI process, run in `cwd` (default run
    folders land in cwd/reports), with `timeout` seconds of CPU and `wall` seconds in all;
    `signal_after` (signal, seconds) interrupts it: one "Interrupted" line and exit 128 +
    the signal is a clean stop. `prefix` runs it through another command (`full_disk`);
    `address_space` limits its memory (RLIMIT_AS, bytes)."""

    def limit_cpu() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(timeout), math.ceil(timeout) + 2))
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    env = {**os.environ, "COLUMNS": "120", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    program = argv if argv[0] == "-c" else ["-m", "kvphase.cli", *argv]  # Python code (the API's trials), or the CLI
    proc = subprocess.Popen([*prefix, sys.executable, *program], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=limit_cpu)
    try:
        if signal_after:
            try:
                proc.communicate(timeout=signal_after[1])
            except subprocess.TimeoutExpired:
                proc.send_signal(signal_after[0])
        out, _ = proc.communicate(timeout=wall)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "hang", f"still running after {wall:g} s"
    text = out.decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if proc.returncode == -signal.SIGXCPU:
        return "hang", f"more than {timeout:g} s of CPU"
    killed_after = signal_after and proc.returncode == -signal_after[0] and lines and lines[-1].startswith(FINISHED)
    reported_after = (signal_after and proc.returncode == 128 + signal_after[0] and len(lines) >= 2
                      and lines[-2].startswith(FINISHED) and lines[-1].startswith("Interrupted"))
    if killed_after or reported_after:
        # the work was done and its last line printed: the signal came as the command returned
        # (reported in one more line) or while the interpreter was exiting, after the command's
        # handler was gone (ended as any process is)
        return "ok", f"finished, then ended by the signal on its way out: {lines[-1]}"
    if proc.returncode < 0:
        return "native crash", f"signal {-proc.returncode}: " + (lines[-1] if lines else "")
    if "Traceback" in text:
        return "traceback", next((line for line in reversed(lines) if not line.startswith(" ")), "")
    if proc.returncode == 0:
        return "ok", lines[-1] if lines else ""
    if proc.returncode in (1, 2):
        return "clean error", lines[0] if lines else "no output"
    if signal_after and proc.returncode == 128 + signal_after[0] and len(lines) == 1 and lines[0].startswith("Interrupted"):
        return "clean error", lines[0]
    said = f"{len(lines)} lines, first {lines[0]!r}, last {lines[-1]!r}" if len(lines) > 1 else (lines or [""])[0]
    return "traceback", f"exit {proc.returncode}: {said}"


def timed(run, *args) -> tuple[str, str, float]:
    started = time.monotonic()
    outcome, detail = run(*args)
    return outcome, detail, time.monotonic() - started


def run_case(case: Case, timeout: float, cwd: Path, wall: float) -> Case:
    try:
        if case.prepare:
            case.prepare()
        for i, argv in enumerate(case.commands):
            if case.between:
                case.between(i)
            watcher = threading.Thread(target=case.during, args=(i,), daemon=True) if case.during else None
            if watcher:
                watcher.start()
            case.results.append(timed(run_cli, argv, case.cpu or timeout, cwd, case.wall or wall, case.signal_after,
                                      case.prefix, case.address_space))
        differs = case.check() if case.check and all(o not in BAD for o, *_ in case.results) else ""
        if differs:
            case.results[-1] = ("rows differ", differs, case.results[-1][2])
    finally:
        if case.release:
            case.release()
        for path in case.cleanup:
            remove(path)
    return case


def _other_outcome(row: bytes) -> bytes:
    """A results.csv row with its `correct` cell the other way (the same target scored twice)."""
    return row.replace(b",True,", b",False,", 1) if b",True," in row else row.replace(b",False,", b",True,", 1)


def damaged_copy(good: Path, folder: Path, name, content: bytes | None) -> None:
    """A copy of the folder `good` whose file `name` holds `content` instead (None: a directory
    there; b"<missing>": no file)."""
    shutil.copytree(good, folder)
    target = folder / name
    remove(target)
    if content is None:
        target.mkdir()
        (target / "inside").write_text("x")
    elif content != b"<missing>":
        target.write_bytes(content)


def remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


class Campaign:
    def __init__(self, work: Path, seed: int, scale: float):
        self.work, self.rng, self.scale = work, random.Random(seed), scale
        self.smol = default_model_path()
        self.seed_model = write_tiny_model("llama", work / "tiny-smol.gguf", tokenizer_from=self.smol)
        self.seed_fields, self.seed_header_end = layout(self.seed_model)
        self.counter = 0

    def n(self, count: int) -> int:
        return max(1, round(count * self.scale))

    def path(self, name: str) -> Path:
        self.counter += 1
        return self.work / f"{self.counter:04d}-{name}"

    def model_case(self, category: str, label: str, make: Callable[[Path], object],
                   commands=("inspect", "header", "sweep")) -> Case:
        """A model file made by `make(path)`, through inspect, header, sweep (llama.cpp) or the reference sweep."""
        model, out = self.path("model.gguf"), self.path("run")
        argvs = {"inspect": ["inspect", str(model)], "header": ["header", str(model), str(out) + ".gguf"],
                 "sweep": ["sweep", str(model), *SWEEP, "--out", str(out)],
                 "sweep-reference": ["sweep", str(model), "--backend", "reference", *SWEEP, "--out", str(out)],
                 "validate": ["validate", str(model), "--threads", "1"]}
        return Case(category, label, [argvs[c] for c in commands], prepare=lambda: make(model),
                    cleanup=[model, out, Path(str(out) + ".gguf")])

    def smol_case(self, label: str, edits, truncate=None, source: Path | None = None) -> Case:
        source = source or self.seed_model
        return self.model_case("gguf", label, lambda p: patched(source, p, edits, truncate))

    # -- GGUF truncations, flips, targeted edits of the default model's header
    def gguf(self) -> list[Case]:
        size, end = self.seed_model.stat().st_size, self.seed_header_end
        cuts = [0, 1, 3, 4, 7, 8, 15, 16, 23, 24, end - 1, end, size - 1]
        cuts += sorted(self.rng.randrange(24, end) for _ in range(self.n(12)))
        cuts += sorted(self.rng.randrange(end, size) for _ in range(self.n(3)))
        cases = [self.smol_case(f"truncated at {cut}", [], truncate=cut) for cut in cuts]
        smol_size = self.smol.stat().st_size
        cases += [self.smol_case(f"SmolLM2 truncated at {cut}", [], truncate=cut, source=self.smol)
                  for cut in (end // 2, smol_size // 2, smol_size - 1)]
        for _ in range(self.n(30)):
            region = end if self.rng.random() < 0.85 else size
            flips = [(self.rng.randrange(8, region), bytes([self.rng.randrange(256)]))
                     for _ in range(self.rng.randint(1, 8))]
            cases.append(self.smol_case(f"flips {[(o, b.hex()) for o, b in flips]}", flips))
        targets = {
            Keys.LLM.BLOCK_COUNT.format(arch='llama'): [0, 1, 513, 2**31, 2**32 - 1],
            Keys.LLM.CONTEXT_LENGTH.format(arch='llama'): [0, 1, 2**32 - 1],
            Keys.LLM.EMBEDDING_LENGTH.format(arch='llama'): [0, 3, 2**32 - 1],
            Keys.Attention.HEAD_COUNT.format(arch='llama'): [0, 7, 2**32 - 1],
            Keys.Attention.HEAD_COUNT_KV.format(arch='llama'): [0, 5, 2**32 - 1],
            Keys.LLM.FEED_FORWARD_LENGTH.format(arch='llama'): [0, 2**32 - 1],
            Keys.Rope.DIMENSION_COUNT.format(arch='llama'): [0, 2**32 - 1],
            Keys.LLM.VOCAB_SIZE.format(arch='llama'): [0, 2**32 - 1],
            Keys.Tokenizer.BOS_ID: [2**32 - 1, 10**6],
            Keys.Tokenizer.EOS_ID: [2**32 - 1, 10**6],
            Keys.General.FILE_TYPE: [2**32 - 1],
        }
        for key, values in targets.items():
            at = self.seed_fields.get(key)
            if at is None or at.value_type != UINT32:
                continue
            cases += [self.smol_case(f"{key} = {v}", [(at.value_offset, u32(v))]) for v in values]
            cases.append(self.smol_case(f"{key} as float32 NaN", [(at.type_offset, u32(FLOAT32)),
                                                                  (at.value_offset, struct.pack("<f", math.nan))]))
            cases += [self.smol_case(f"{key} as type {t}", [(at.type_offset, u32(t))]) for t in (STRING, ARRAY, 13)]
        for label, edit in [("version 1", (4, u32(1))), ("version 4", (4, u32(4))),
                            ("tensor count 2^63", (8, struct.pack("<Q", 2**63))),
                            ("metadata count 2^40", (16, struct.pack("<Q", 2**40))),
                            ("metadata count 0", (16, struct.pack("<Q", 0))),
                            ("tensor count 0", (8, struct.pack("<Q", 0)))]:
            cases.append(self.smol_case(label, [edit]))
        for key in (Keys.Tokenizer.LIST, Keys.Tokenizer.MERGES, Keys.General.ARCHITECTURE, Keys.Tokenizer.MODEL):
            at = self.seed_fields.get(key)
            if at is not None:
                length_at = at.value_offset + (4 if at.value_type == ARRAY else 0)
                cases += [self.smol_case(f"{key} length {v}", [(length_at, struct.pack("<Q", v))])
                          for v in (0, 2**40, 2**64 - 1)]
        return cases

    # -- crafted files and odd paths
    def crafted(self) -> list[Case]:
        cases = [self.model_case("crafted", label, lambda p, d=data: p.write_bytes(d))
                 for label, data in crafted_files().items()]
        llama = self.work / "tiny-llama.gguf"
        write_tiny_model("llama", llama, seed=0)
        fields, _ = layout(llama)
        for key, v in [(Keys.LLM.BLOCK_COUNT.format(arch='llama'), 0), (Keys.LLM.BLOCK_COUNT.format(arch='llama'), 513), (Keys.Attention.HEAD_COUNT.format(arch='llama'), 0),
                       (Keys.Attention.HEAD_COUNT_KV.format(arch='llama'), 0), (Keys.LLM.EMBEDDING_LENGTH.format(arch='llama'), 0),
                       (Keys.LLM.CONTEXT_LENGTH.format(arch='llama'), 2**32 - 1)]:
            if key in fields and fields[key].value_type == UINT32:
                edit = [(fields[key].value_offset, u32(v))]
                cases.append(self.model_case("crafted", f"tiny llama {key} = {v}",
                                             lambda p, e=edit: patched(llama, p, e), ("inspect", "sweep-reference")))
        afile = self.work / "afile.gguf"
        afile.write_bytes(b"x")
        odd = {
            "a directory": self.work,
            "/dev/null": Path("/dev/null"),
            "/dev/zero": Path("/dev/zero"),
            "/proc/self/cmdline": Path("/proc/self/cmdline"),
            "/proc/self/mem": Path("/proc/self/mem"),
            "a FIFO": self.work / "fifo.gguf",
            "a symlink loop": self.work / "loop.gguf",
            "a dangling symlink": self.work / "dangling.gguf",
            "a name with markup": self.work / "[red]model[bold] [x].gguf",
            "a name with escapes": self.work / "esc\x1b[2Jname\n.gguf",
            "a 300-character name": self.work / ("n" * 300 + ".gguf"),
            "a path under a file": afile / "x.gguf",
            "an empty path": Path(""),
            "a missing folder": self.work / "no" / "such" / "m.gguf",
        }
        os.mkfifo(odd["a FIFO"])
        odd["a symlink loop"].symlink_to(odd["a symlink loop"])
        odd["a dangling symlink"].symlink_to(self.work / "nowhere")
        shutil.copyfile(llama, odd["a name with markup"])
        shutil.copyfile(llama, odd["a name with escapes"])
        out = self.work / "odd-run"
        for label, path in odd.items():
            cases.append(Case("crafted", f"{label}", [["inspect", str(path)],
                                                      ["sweep", str(path), *SWEEP, "--out", str(out)]], cleanup=[out]))
        return cases

    # -- damaged HF checkpoint folders, and export-hf's refusals
    def checkpoints(self) -> list[Case]:
        layers = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
        dsv4 = {"model_type": "deepseek_v4", "num_hidden_layers": 3, "index_topk": 8, "sliding_window": 16,
                "layer_types": layers}
        glm = {"model_type": "glm5_next", "text_config": {"num_hidden_layers": 2, "index_kpool": 16, "index_topk": 64,
                                                          "layer_types": ["linear_attention", "indexed_attention"]}}
        llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "vocab_size": 49152,
                 "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 1024}
        header = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}).encode()
        good_weights = struct.pack("<Q", len(header)) + header + bytes(24)
        config_texts = {
            "no config.json": None, "config.json empty": "", "config.json a list": "[1, 2]",
            "config.json not UTF-8": b"\xff\xfe{", "model_type missing": {"num_hidden_layers": 2},
            "model_type gpt_neox": {"model_type": "gpt_neox", "num_hidden_layers": 2},
            "model_type a list": {"model_type": ["llama"], "num_hidden_layers": 2},
            "num_hidden_layers -1": {**llama, "num_hidden_layers": -1},
            "num_hidden_layers 'many'": {**llama, "num_hidden_layers": "many"},
            "deepseek_v4 intact": dsv4,
            "deepseek_v4 without index_topk": {k: v for k, v in dsv4.items() if k != "index_topk"},
            "deepseek_v4 without sliding_window": {k: v for k, v in dsv4.items() if k != "sliding_window"},
            "deepseek_v4 sliding_window 0": {**dsv4, "sliding_window": 0},
            "deepseek_v4 index_topk 0": {**dsv4, "index_topk": 0},
            "deepseek_v4 layer_types short": {**dsv4, "layer_types": layers[:1]},
            "deepseek_v4 layer type unknown": {**dsv4, "layer_types": [*layers[:2], "dense"]},
            "deepseek_v4 without layer_types": {k: v for k, v in dsv4.items() if k != "layer_types"},
            "glm5_next top_k not a multiple of kpool": {**glm, "text_config": {**glm["text_config"], "index_topk": 40}},
            "glm5_next kpool 0": {**glm, "text_config": {**glm["text_config"], "index_kpool": 0}},
            "glm5_next text_config a list": {**glm, "text_config": [1]},
            "minimax_m3_vl local blocks above top_k": {"model_type": "minimax_m3_vl", "text_config": {
                "num_hidden_layers": 1, "index_block_size": 16, "index_topk_blocks": 2, "index_local_blocks": 5,
                "layer_types": ["minimax_m3_sparse"]}},
            "llama, weights that do not fit the config": llama,
            "glm5_next without index_topk": {**glm, "text_config": {
                k: v for k, v in glm["text_config"].items() if k != "index_topk"}},
            "glm5_next without index_kpool": {**glm, "text_config": {
                k: v for k, v in glm["text_config"].items() if k != "index_kpool"}},
            "glm5_next kvphase_trained a list": {**glm, "kvphase_trained": [1]},
            "glm5_next kvphase_trained stride 'x'": {**glm, "kvphase_trained": {"design": "glm-kpool", "stride": "x"}},
            "minimax_m3_vl without index_block_size": {"model_type": "minimax_m3_vl_text", "num_hidden_layers": 1,
                                                       "index_topk_blocks": 2, "index_local_blocks": 1,
                                                       "layer_types": ["minimax_m3_sparse"]},
        }
        weights = {"no weights": None, "weights empty": b"", "weights 7 bytes": b"1234567",
                   "weights header length 2^63": struct.pack("<Q", 2**63) + b"{}",
                   "weights header not JSON": struct.pack("<Q", 4) + b"nope",
                   "weights header a list": struct.pack("<Q", 2) + b"[]",
                   "weights shape not numbers": struct.pack("<Q", 40) + b'{"w":{"dtype":"F32","shape":["x"]}}'.ljust(40)}
        tokenizers = {"tokenizer.json garbage": b"{not json", "tokenizer.json of another shape": b'{"model": 3}'}
        smol_tokenizer = self.hf_tokenizer()  # made here, once, before the cases run in threads
        cases = []

        def folder_case(label, config, weight_bytes=good_weights, tokenizer=None):
            folder, out = self.path("checkpoint"), self.path("run")

            def make():
                folder.mkdir()
                if config is not None:
                    text = config if isinstance(config, (str, bytes)) else json.dumps(config)
                    (folder / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
                if weight_bytes is not None:
                    (folder / "model.safetensors").write_bytes(weight_bytes)
                if tokenizer is not None:
                    (folder / "tokenizer.json").write_bytes(tokenizer)
                else:
                    shutil.copyfile(smol_tokenizer, folder / "tokenizer.json")

            return Case("checkpoints", label, [["inspect", str(folder)],
                                               ["sweep", str(folder), *SWEEP, "--out", str(out)]],
                        prepare=make, cleanup=[folder, out])

        cases += [folder_case(label, config) for label, config in config_texts.items()]
        cases += [folder_case(label, llama, data) for label, data in weights.items()]
        cases += [folder_case(label, llama, good_weights, data) for label, data in tokenizers.items()]
        deepseek4 = self.work / "tiny-deepseek4-export.gguf"
        write_tiny_model("deepseek4", deepseek4, seed=0)
        afile = self.work / "export-afile"
        afile.write_bytes(b"x")
        full = self.work / "export-full"
        full.mkdir(exist_ok=True)
        (full / "keep").write_bytes(b"x")
        for arch in ("glm5-next", "minimax-m3"):  # written from the GGUF's tensors, then checked layer by layer
            tiny, out = self.work / f"tiny-{arch}-export.gguf", self.work / f"export-{arch}"
            write_tiny_model(arch, tiny, seed=0)
            cases.append(Case("checkpoints", f"export-hf of a tiny {arch}, then validate it",
                              [["export-hf", str(tiny), str(out)], ["validate", str(out), "--tokens", "24"],
                               ["validate", str(out), "--tokens", "0"]], cleanup=[out]))
        for label, source, out in [("export-hf of a tiny deepseek4 (no tokenizer)", deepseek4, self.work / "export-a"),
                                   ("export-hf of a llama with rope_freqs", self.seed_model, self.work / "export-b"),
                                   ("export-hf onto a file", self.seed_model, afile),
                                   ("export-hf into a folder that holds a file", self.seed_model, full),
                                   ("export-hf of a missing file", self.work / "none.gguf", self.work / "export-c"),
                                   ("export-hf of a folder", self.work, self.work / "export-d")]:
            cases.append(Case("checkpoints", label, [["export-hf", str(source), str(out)]]))
        return cases

    # -- export-hf of deepseek4 files (kvphase/backends/hf_layout/deepseek4.py), and the copies it writes edited
    def exports(self) -> list[Case]:
        import numpy as np

        from kvphase.gguf.tiny import init_tensor
        from kvphase.gguf.tiny_archs import deepseek4_spec
        from kvphase.gguf.writer import write_gguf

        def ds4_file(name: str, **keys) -> Path:
            path = self.work / f"ds4-{name}.gguf"
            spec = deepseek4_spec()
            for key, value in keys.items():
                if value is None:
                    spec.keys.pop(key.format(arch='deepseek4'), None)
                else:
                    spec.key(key, value)
            rng = np.random.default_rng(0)
            write_gguf(path, "deepseek4", spec.keys, ((n, init_tensor(rng, ne, kind)) for n, ne, kind in spec.tensors))
            return path

        files = {
            "intact": {}, "indexer top_k missing": {Keys.Attention.Indexer.TOP_K: None},
            "indexer top_k 0": {Keys.Attention.Indexer.TOP_K: 0}, "indexer heads missing": {Keys.Attention.Indexer.HEAD_COUNT: None},
            "compress_ratios short": {Keys.Attention.COMPRESS_RATIOS: [0, 4]},
            "two HCA ratios": {Keys.Attention.COMPRESS_RATIOS: [4, 64, 128]}, "ratio 1": {Keys.Attention.COMPRESS_RATIOS: [1, 4, 128]},
            "compress_ratios a string": {Keys.Attention.COMPRESS_RATIOS: "4"},
            "hash layers": {Keys.LLM.HASH_LAYER_COUNT: 1}, "hash layers 99": {Keys.LLM.HASH_LAYER_COUNT: 99},
            "per-layer clamps differ": {Keys.LLM.SWIGLU_CLAMP_EXP: [10.0, 7.0, 10.0]}, "sliding_window 0": {Keys.Attention.SLIDING_WINDOW: 0},
            "value length differs": {Keys.Attention.VALUE_LENGTH: 32}, "two KV heads": {Keys.Attention.HEAD_COUNT_KV: 2},
            "gating function 3": {Keys.LLM.EXPERT_GATING_FUNC: 3}, "rope dims above head": {Keys.Rope.DIMENSION_COUNT: 999},
            "YaRN scaling": {Keys.Rope.SCALING_TYPE: "yarn"}, "two shared experts": {Keys.LLM.EXPERT_SHARED_COUNT: 2},
        }
        cases = []
        for label, keys in files.items():
            source, out = ds4_file(label.replace(" ", "-"), **keys), self.path("export")
            cases.append(Case("exports", f"export-hf of a deepseek4, {label}", [["export-hf", str(source), str(out)]],
                              cleanup=[out]))
        intact = self.work / "ds4-intact.gguf"
        raw = intact.read_bytes()
        for label, content in (("cut in half", raw[: len(raw) // 2]), ("cut in the header", raw[:200]),
                               ("a tensor's bytes flipped", raw[:-4000] + bytes(b ^ 0xFF for b in raw[-4000:]))):
            damaged, out = self.path("damaged.gguf"), self.path("export")
            cases.append(Case("exports", f"export-hf of a deepseek4 {label}", [["export-hf", str(damaged), str(out)]],
                              prepare=lambda d=damaged, c=content: d.write_bytes(c), cleanup=[damaged, out]))
        edits = {"HCA rate halved": lambda c: {**c, "compress_rates": {**c["compress_rates"], "heavily_compressed_attention": 64}},
                 "index_topk removed": lambda c: {k: v for k, v in c.items() if k != "index_topk"},
                 "layer_types one short": lambda c: {**c, "layer_types": c["layer_types"][:-1]},
                 "model_type deepseek_v3": lambda c: {**c, "model_type": "deepseek_v3"},
                 "kvphase_trained a list": lambda c: {**c, "kvphase_trained": [1]},
                 "kvphase_trained design unknown": lambda c: {**c, "kvphase_trained": {"kvphase.trained.design": "zzz"}}}
        for label, argv in (("validate --engine transformers, intact", ["--engine", "transformers"]),
                            ("validate --engine transformers, --tokens 0", ["--engine", "transformers", "--tokens", "0"]),
                            ("validate --engine transformers, --tokens past the context",
                             ["--engine", "transformers", "--tokens", "99999"]),
                            ("validate --engine unknown", ["--engine", "sglang"])):
            cases.append(Case("exports", label, [["validate", str(intact), *argv]]))
        trained = Path(__file__).resolve().parents[1] / "tests/data/trained/csa-disjoint.gguf"
        for label, edit in edits.items():
            copy, out = self.path("copy"), self.path("run")

            def make(copy=copy, edit=edit):
                from kvphase.backends.hf_export import export_hf

                export_hf(trained, copy)
                config = json.loads((copy / "config.json").read_text())
                (copy / "config.json").write_text(json.dumps(edit(config)))

            cases.append(Case("exports", f"an exported csa-disjoint, {label}",
                              [["inspect", str(copy)], ["sweep", str(copy), "--backend", "transformers", "--per-residue",
                                                       "4", "--out", str(out)]], prepare=make, cleanup=[copy, out]))
        return cases

    def hf_tokenizer(self) -> Path:
        """SmolLM2's tokenizer.json (the tokenizers library's own conversion of its vocabulary), written once."""
        path = self.work / "smollm2-tokenizer.json"
        if not path.is_file():
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(str(self.smol.parent), gguf_file=self.smol.name).backend_tokenizer.save(str(path))
        return path

    # -- validate on damaged tiny compressed models
    def validate(self) -> list[Case]:
        edits = {
            "glm5-next": {Keys.Attention.Indexer.KPOOL: [0, 1, 3], Keys.Attention.Indexer.TOP_K: [0, 5],
                          Keys.HyperConnection.COUNT: [3], Keys.LLM.BLOCK_COUNT: [0, 513]},
            "deepseek4": {Keys.LLM.BLOCK_COUNT: [0, 513, 9], Keys.HyperConnection.COUNT: [0], Keys.Attention.Indexer.TOP_K: [0]},
            "minimax-m3": {Keys.Attention.Indexer.BLOCK_SIZE: [0, 2**32 - 1], Keys.Attention.Indexer.TOP_K: [0],
                           Keys.LLM.BLOCK_COUNT: [0, 513], Keys.Attention.Indexer.LOCAL_BLOCKS: [2**32 - 1]},
        }
        cases = []
        for arch in TINY_ARCHS:
            seed_model = self.work / f"tiny-{arch}.gguf"
            write_tiny_model(arch, seed_model, seed=0)
            fields, end = layout(seed_model)
            size = seed_model.stat().st_size
            variants: list[tuple[str, list, int | None]] = [(f"{arch} intact", [], None)]
            variants += [(f"{arch} truncated at {cut}", [], cut)
                         for cut in (end // 2, end, self.rng.randrange(end, size))]
            for _ in range(self.n(3)):
                flips = [(self.rng.randrange(8, end), bytes([self.rng.randrange(256)])) for _ in range(3)]
                variants.append((f"{arch} flips {[(o, b.hex()) for o, b in flips]}", flips, None))
            for name, values in edits.get(arch, {}).items():
                at = fields.get(name.format(arch=arch))
                if at is None or at.value_type != UINT32:
                    continue
                variants += [(f'{name.format(arch=arch)} = {v}', [(at.value_offset, u32(v))], None) for v in values]
                variants.append((f'{name.format(arch=arch)} as float32 NaN', [(at.type_offset, u32(FLOAT32)),
                                                                   (at.value_offset, struct.pack("<f", math.nan))], None))
            ratios = fields.get(Keys.Attention.COMPRESS_RATIOS.format(arch=arch))
            if ratios is not None and ratios.value_type == ARRAY:
                variants += [(f"{arch} compress_ratios of length {n}", [(ratios.value_offset + 4, struct.pack("<Q", n))],
                              None) for n in (1, 2**40)]
            for label, case_edits, cut in variants:
                cases.append(self.model_case("validate", label, lambda p, e=case_edits, c=cut, m=seed_model:
                                             patched(m, p, e, c), ("validate",)))
        return cases

    # -- damaged run folders
    def folders(self) -> list[Case]:
        good = self.work / "good-run"
        outcome, detail = run_cli(["sweep", str(self.seed_model), *SWEEP, "--out", str(good)], 120, self.work)
        if outcome != "ok":
            raise SystemExit(f"could not make the seed run folder: {outcome}: {detail}")
        config = json.loads((good / "config.json").read_text())
        results = (good / "results.csv").read_bytes()
        header, first_row = results.splitlines()[0], results.splitlines()[1]
        rest = first_row[first_row.index(b","):]
        ref = {"design": "meanpool", "window": 4, "stride": 4}

        def with_config(**changes) -> bytes:
            return json.dumps({**config, **changes}).encode()

        damages: dict[str, tuple[str, bytes | None]] = {
            "config binary": ("config.json", bytes(self.rng.randrange(256) for _ in range(64))),
            "config empty": ("config.json", b""),
            "config half": ("config.json", (good / "config.json").read_bytes()[:40]),
            "config a list": ("config.json", b"[1, 2]"),
            "config null": ("config.json", b"null"),
            "config invalid utf-8": ("config.json", b'{"task": "\xff\xfe"}'),
            "config a directory": ("config.json", None),
            "config extra key": ("config.json", with_config(surprise=1)),
            "config missing stride": ("config.json", json.dumps({k: v for k, v in config.items()
                                                                 if k != "stride"}).encode()),
            "config modulus 0": ("config.json", with_config(modulus=0)),
            "config stride 0": ("config.json", with_config(stride=0, modulus=0)),
            "config stride a string": ("config.json", with_config(stride="4")),
            "config stride 4.5": ("config.json", with_config(stride=4.5)),
            "config stride true": ("config.json", with_config(stride=True)),
            "config context 10^12": ("config.json", with_config(context=10**12)),
            "config per_residue -1": ("config.json", with_config(per_residue=-1)),
            "config per_residue 10^12": ("config.json", with_config(per_residue=10**12)),
            "config padding sideways": ("config.json", with_config(padding="sideways")),
            "config task ../../etc/passwd": ("config.json", with_config(task="../../etc/passwd")),
            "config task with NUL": ("config.json", with_config(task="rec\x00ords")),
            "config seed a string": ("config.json", with_config(seed="x")),
            "config seed -5": ("config.json", with_config(seed=-5)),
            "config model 5": ("config.json", with_config(model=5)),
            "config backend_options a list": ("config.json", with_config(backend_options=[1])),
            "config backend [red]x": ("config.json", with_config(backend="[red]x")),
            "config randomize maybe": ("config.json", with_config(backend="reference",
                                                                  backend_options={**ref, "randomize": "maybe"})),
            "config layers [100]": ("config.json", with_config(backend="reference",
                                                               backend_options={**ref, "layers": [100]})),
            "config NaN stride": ("config.json", b'{"stride": NaN}'),
            "config 100000 nested lists": ("config.json", b"[" * 100000 + b"]" * 100000),
            "manifest binary": ("manifest.json", bytes(self.rng.randrange(256) for _ in range(64))),
            "manifest a list": ("manifest.json", b"[]"),
            "manifest model 5": ("manifest.json", b'{"model": 5, "wall_time_s": 1}'),
            "manifest wall time a string": ("manifest.json", b'{"wall_time_s": "x", "sessions": "y"}'),
            "manifest half": ("manifest.json", (good / "manifest.json").read_bytes()[:50]),
            "manifest a directory": ("manifest.json", None),
            "summary binary": ("summary.json", bytes(self.rng.randrange(256) for _ in range(64))),
            "summary a directory": ("summary.json", None),
            "summary half": ("summary.json", (good / "summary.json").read_bytes()[:50]),
            "results binary": ("results.csv", bytes(self.rng.randrange(256) for _ in range(300))),
            "results empty": ("results.csv", b""),
            "results header only": ("results.csv", header + b"\n"),
            "results header twice (two sweeps)": ("results.csv", header + b"\n" + results),
            "results wrong columns": ("results.csv", b"a,b,c\n1,2,3\n"),
            "results NaN target": ("results.csv", header + b"\nnan" + rest + b"\n"),
            "results target id 10^30": ("results.csv", header + b"\n1" + b"0" * 30 + rest + b"\n"),
            "results half a row": ("results.csv", results + first_row[:7]),
            "results a directory": ("results.csv", None),
            "results one huge field": ("results.csv", header + b"\n" + b"9" * 1_000_000 + b"\n"),
            "results nul bytes": ("results.csv", results[:200] + b"\0\0\0" + results[200:]),
            "results a target twice, the other outcome": ("results.csv", results + _other_outcome(first_row) + b"\n"),
            "report.md a directory": ("report.md", None),
            "figure a directory": ("accuracy_by_residue.png", None),
            "lock file a directory": (".lock", None),
            "lock file garbage": (".lock", bytes(self.rng.randrange(256) for _ in range(40))),
        }
        cases = []
        for label, (name, content) in damages.items():
            folder = self.path("run")

            def prepare(folder=folder, name=name, content=content):
                damaged_copy(good, folder, name, content)

            commands = [["report", str(folder)], ["sweep", str(self.seed_model), *SWEEP, "--out", str(folder)],
                        ["compare", str(folder), str(good), "--out", str(self.work / f"cmp-{folder.name}")]]
            cases.append(Case("folders", label, commands, prepare=prepare,
                              cleanup=[folder, self.work / f"cmp-{folder.name}"]))
        return cases

    # -- damaged training folders
    def training(self) -> list[Case]:
        from tests.train.test_train_folders import DAMAGE

        good = self.work / "good-training"
        outcome, detail = run_cli(["train", "dense", str(good), *TRAIN], 300, self.work)
        if outcome != "ok":
            raise SystemExit(f"could not make the seed training folder: {outcome}: {detail}")
        cases = []
        for label, (edit, _) in DAMAGE.items():
            folder = self.path("training")

            def prepare(folder=folder, edit=edit):
                shutil.copytree(good, folder)
                edit(folder)

            cases.append(Case("training", label, [["train", "dense", str(folder), *TRAIN], ["report", str(folder)]],
                              prepare=prepare, cleanup=[folder], cpu=120))
        return cases

    def probe_model(self) -> str:
        """A small gated model trained once for every category that runs the probes."""
        trained = self.work / "probe-model"
        if not (trained / "model.gguf").is_file():
            outcome, detail = run_cli(["train", "gated", str(trained), *TRAIN, "--context", "64"], 300, self.work)
            if outcome != "ok":
                raise SystemExit(f"could not train the probes' model: {outcome}: {detail}")
        return str(trained / "model.gguf")

    def probe_commands(self) -> dict[str, list[str]]:
        m = self.probe_model()
        return {"knockout": ["knockout", m, "--per-residue", "16"], "flip": ["flip", m], "gates": ["gates", m],
                "cycle": ["cycle", m, "--k", "1"], "gate-activations": ["gate-activations", m, "--contexts", "2"]}

    # -- damaged probe folders: each probe's own files, one sub-sweep's files, the rolled model
    def probes(self) -> list[Case]:
        probes = self.probe_commands()
        cases = []
        for name, argv in probes.items():
            good = self.work / f"good-{name}"
            outcome, detail = run_cli([*argv, "--out", str(good)], 300, self.work)
            if outcome != "ok":
                raise SystemExit(f"could not make the seed {name} folder: {outcome}: {detail}")
            for relative, label, content in self._damages_of(good):
                folder = self.path(name)

                def prepare(folder=folder, good=good, relative=relative, content=content):
                    damaged_copy(good, folder, relative, content)

                cases.append(Case("probes", f"{name}: {relative} {label}",
                                  [["report", str(folder)], [*argv, "--out", str(folder)]],
                                  prepare=prepare, cleanup=[folder], cpu=120))
        return cases

    def _damages_of(self, good: Path):
        """(path in the folder, label, new bytes or None for a directory) for the folder's own files
        and those of its first sub-sweep."""
        subs = sorted(p for p in good.iterdir() if p.is_dir())
        files = sorted(p for p in good.iterdir() if p.is_file()) + (sorted(subs[0].iterdir()) if subs else [])
        noise = bytes(self.rng.randrange(256) for _ in range(200))
        for path in files:
            relative, data = path.relative_to(good), path.read_bytes()
            yield relative, "a directory", None
            if path.name == ".lock":
                yield relative, "garbage", noise[:40]
            elif path.suffix == ".json":
                yield from ((relative, label, content) for label, content in (
                    ("missing", b"<missing>"), ("binary", noise), ("a list", b"[]"), ("half", data[: len(data) // 2]),
                    ("probe unknown", data.replace(b'"probe": "', b'"probe": "x')),
                    ("numbers as text", data.replace(b": 1", b': "1'))))
            elif path.suffix == ".csv":
                header, _, rows = data.partition(b"\n")
                yield from ((relative, label, content) for label, content in (
                    ("missing", b"<missing>"), ("binary", noise), ("empty", b""), ("header only", header + b"\n"),
                    ("wrong columns", b"a,b\n1,2\n"), ("half a row", data[: len(header) + 12]),
                    ("nan first cell", header + b"\nnan" + rows[rows.find(b","):]),
                    ("huge number first cell", header + b"\n" + b"9" * 400 + rows[rows.find(b","):])))
            elif path.suffix == ".gguf":
                yield relative, "truncated", data[: len(data) // 3]
                yield relative, "binary", noise

    # -- signals at random moments: starting, compiling, stepping, evaluating, saving, sweeping
    def signals(self) -> list[Case]:
        cases = []
        for i in range(self.n(24)):
            signum, delay = (signal.SIGINT, signal.SIGTERM)[i % 2], self.rng.uniform(0.5, 9.0)
            folder = self.path("signalled")
            design = ("gated", "dense", "glm-dense", "csa")[i % 4] if i < 16 else "gated"
            argv = ["train", design, str(folder), "--steps", "40", "--eval-every", "5", "-q"]
            cases.append(Case("signals", f"{signal.Signals(signum).name} after {delay:.1f} s: train {design}",
                              [argv, argv], cleanup=[folder], signal_after=(signum, delay), cpu=600))
        for i in range(self.n(6)):
            signum, delay = (signal.SIGINT, signal.SIGTERM)[i % 2], self.rng.uniform(0.5, 6.0)
            folder = self.path("signalled-sweep")
            argv = ["sweep", str(self.seed_model), "--context", "384", "--per-residue", "64", "--threads", "1",
                    "--out", str(folder), "-q"]
            cases.append(Case("signals", f"{signal.Signals(signum).name} after {delay:.1f} s: sweep", [argv, argv],
                              cleanup=[folder], signal_after=(signum, delay), cpu=600))
        selecting = REPO / "reports" / "trained" / "engine" / "glm-kpool-top4-seed0" / "model.gguf"
        for i in range(self.n(9)):  # issue 77: a Ctrl-C inside the graph tap was "the graph tap failed" once in nine
            delay, folder = self.rng.uniform(0.8, 3.0), self.path("signalled-selection")  # the sweep takes about 4 s
            argv = ["sweep", str(selecting), "--selection", "--per-residue", "16", "--threads", "1",
                    "--out", str(folder), "-q"]
            cases.append(Case("signals", f"SIGINT after {delay:.1f} s: sweep --selection", [argv, argv],
                              cleanup=[folder], signal_after=(signal.SIGINT, delay), cpu=600))
        return cases

    # -- servers that answer wrongly, slowly or never
    def servers(self) -> list[Case]:
        hostile = HostileServers()
        cases = []
        for mode in HostileServers.MODES:
            for engine in ("llama-server", "openai", "sglang"):
                for waits in ([], ["--request-timeout", "2"], ["--deadline", "4"]):
                    out = self.path("server-run")
                    argv = ["sweep", str(self.seed_model), "--backend", "server", "--engine", engine,
                            "--url", hostile.url(mode), *waits, "--context", "256", "--per-residue", "8",
                            "--out", str(out), "-q"]
                    cases.append(Case("servers", f"{mode} {engine} {' '.join(waits)}", [argv], cleanup=[out]))
        return cases

    # -- issue 65's servers: an endless answer, a trickle, a redirect loop, a size of 10^12 bytes, another model
    def hostile(self) -> list[Case]:
        """Each mode under each command that reads a server or a URL; a case is a hang past twice its
        deadline (HOSTILE_START_S for the command's start besides). The servers stay up to the end."""
        from kvphase.conform.references import DEFAULT_REFERENCES
        from tests.helpers.hostile_servers import MODES, HostileServer

        models = {reference.name: reference.model for reference in DEFAULT_REFERENCES}
        model, other = models["csa-disjoint"], models["csa-top4"]  # one tokenizer, other facts
        cases = []
        for mode in MODES:
            server = HostileServer(mode, model=model, stated=other).__enter__()
            url = server.url
            waits = ["--request-timeout", "2"]
            for engine in ("llama-server", "openai"):
                for extra in ([], ["--allow-model-mismatch"]):
                    out = self.path("hostile-run")
                    cases.append(Case("hostile", f"{mode} sweep {engine} {' '.join(extra)}", [
                        ["sweep", str(model), "--backend", "server", "--engine", engine, "--url", url, *waits, *extra,
                         "--out", str(out), "-q"]], cleanup=[out], wall=2 * HOSTILE_SERVER_S + HOSTILE_START_S))
                out = self.path("hostile-run")
                cases.append(Case("hostile", f"{mode} conform {engine}", [
                    ["conform", "--backend", "server", "--engine", engine, "--url", url, "--model", "csa-disjoint",
                     *waits, "--out", str(out)]], cleanup=[out], wall=2 * HOSTILE_SERVER_S + HOSTILE_START_S))
            header = self.path("hostile-header") / "h.gguf"
            cases.append(Case("hostile", f"{mode} header", [["header", f"{url}/m.gguf", str(header)]],
                              prepare=lambda folder=header.parent: folder.mkdir(), cleanup=[header.parent],
                              wall=2 * REQUEST_DEADLINE + HOSTILE_START_S))
            cases.append(Case("hostile", f"{mode} inspect", [["inspect", f"{url}/m.gguf"]],
                              wall=2 * REQUEST_DEADLINE + HOSTILE_START_S))
        return cases

    # -- wrong types and values through the Python API, each call in its own process
    def api(self) -> list[Case]:
        """Each call prints the library's one line and exits 1 (a KvphaseError), or is a traceback
        (any other exception)."""
        m, run = repr(str(self.seed_model)), repr(str(self.path("api-run")))
        calls = [f"kvphase.sweep({m}, {'' if 'out=' in keywords else f'out={run}, '}{keywords})" for keywords in (
            "context='x'", "context=2.5", "context=None, seed='1'", "seed=1.5", "threads=True", "threads=0",
            "threads=float('nan')", "out=5", "out='a\\0b'", "out=b'run'", "url=5", "backend='server', url=5",
            "backend='server', url=[5]", "backend='server', url='http://127.0.0.1:9', request_timeout=float('nan')",
            "backend='server', url='http://127.0.0.1:9', request_timeout=0",
            "backend='server', url='http://127.0.0.1:9', deadline=float('inf')",
            "backend='server', url='http://127.0.0.1:9', slots='2'", "progress=5", "on_notice='x'",
            "per_residue='auto', detect=float('nan')", "per_residue=[1]", "design_options=5", "design_options=[5]",
            "gpu_layers=1.5", "calibrate='yes'", "stride=4.5", "modulus='8'", "engine=5", "padding=5", "task=5",
            "offsets='2'", "shift=True", "random_offset=1", "cache_type=16", "allow_model_mismatch='no'",
            "target_accuracy=50", "combine=max", "nonsense=1")] + [
            "kvphase.sweep(5)", "kvphase.sweep(b'model.gguf')", "kvphase.sweep('a\\0b')",
            f"kvphase.dry_run({m}, context='x')", f"kvphase.sweep_strides({m}, on_run=5, out={run})",
            "kvphase.inspect(5)", "kvphase.inspect(None)", f"kvphase.inspect({m}, partial='yes')",
            "kvphase.load_run(5)", "kvphase.load_run('a\\0b')", "kvphase.report(5)", "kvphase.report([])",
            "kvphase.compare('path')", "kvphase.compare([5])", "kvphase.compare(5)", "kvphase.compare([], out=5)",
            "kvphase.compare(['a\\0b'])", f"kvphase.sweep({m}, options=kvphase.SweepOptions(context=256), context=512)",
            "kvphase.SweepOptions(bogus=1)"]
        code = ("import sys, kvphase\ntry:\n    {call}\nexcept kvphase.KvphaseError as exc:\n"
                "    print('Error:', exc)\n    sys.exit(1)")
        return [Case("api", call.replace(m, "MODEL").replace(run, "RUN"), [["-c", code.format(call=call)]],
                     cleanup=[self.work / "api-run"]) for call in calls]

    # -- a llama-server that stops answering (SIGSTOP) mid-sweep, alone and in a fleet
    def silent(self) -> list[Case]:
        """Each case: a sweep through one or two llama-servers, one of them paused once results.csv
        holds `rows` rows (0: before the sweep starts, a server down at the start), then let go on
        and the same sweep run again; its rows must equal an uninterrupted run's. The first
        command's wall time is the stall's cost."""
        from kvphase.engines.llama_server import find_llama_server

        try:
            binary = find_llama_server()
        except Exception as exc:  # no llama-server here: the category says so and runs nothing
            print(f"silent: skipped, no llama-server ({exc})", flush=True)
            return []
        argv = ["sweep", str(self.seed_model), "--context", "512", "--per-residue", "64", "--threads", "1",
                "-q", "--backend", "server"]
        clean = self.path("silent-clean")
        with SilentFleet(binary, self.seed_model, 1) as fleet:
            outcome, detail = run_cli([*argv, *fleet.urls, "--out", str(clean)], 600, self.work)
        if outcome != "ok":
            raise RuntimeError(f"the clean server sweep failed: {detail}")
        cases = []
        for servers in (1, 2):
            for rows in (0, 16, 200, 480):
                out, fleet = self.path("silent-run"), SilentFleet(binary, self.seed_model, servers)
                label = f"{servers} server{'s' if servers > 1 else ''}, the last paused at {rows} rows"
                command = [*argv, *fleet.urls, "--out", str(out)]
                cases.append(Case("silent", label, [command, command], cleanup=[out], prepare=fleet.start,
                                  release=fleet.stop, cpu=120,
                                  during=lambda i, f=fleet, o=out, r=rows: i == 0 and f.pause_at(o, r),
                                  between=lambda i, f=fleet: i and f.resume(),
                                  check=lambda o=out: same_rows(o, clean)))
        return cases

    # -- issue 77: a server holding another file of the very same metadata
    def identity(self) -> list[Case]:
        """Two make-tiny llamas differing only in their seed: one swept through a llama-server holding
        the other, whose file is here (told by its bytes) or gone once loaded (told by a probe query),
        must be refused; through one holding a gone copy of itself (the probe passes) it sweeps."""
        from kvphase.engines.llama_server import find_llama_server, free_port, llama_server

        try:
            binary = find_llama_server()
        except Exception as exc:  # no llama-server here: the category says so and runs nothing
            print(f"identity: skipped, no llama-server ({exc})", flush=True)
            return []
        twins = [write_tiny_model("llama", self.work / f"twin-seed{seed}.gguf", seed=seed,
                                  tokenizer_from=self.seed_model) for seed in (0, 1)]
        cases = []
        for served, gone in ((twins[1], False), (twins[1], True), (twins[0], True)):
            port, held, out = free_port(), {}, self.path("identity-run")

            def start(served=served, gone=gone, port=port, held=held) -> None:
                copy = Path(shutil.copy(served, self.work / f"gone-{served.name}")) if gone else served
                held["server"] = llama_server(copy, binary=binary, threads=1, slots=1, n_ctx_per_slot=512, port=port)
                held["server"].__enter__()
                if gone:
                    copy.unlink()

            argv = ["sweep", str(twins[0]), "--backend", "server", "--url", f"http://127.0.0.1:{port}", "--context",
                    "256", "--per-residue", "1", "--threads", "1", "--out", str(out), "-q"]
            cases.append(Case("identity", f"{twins[0].name} through a server of {served.name}"
                              f"{' (its file gone)' if gone else ''}", [argv], prepare=start, cleanup=[out],
                              release=lambda held=held: held["server"].__exit__(None, None, None)))
        return cases

    # -- abusive options
    def options(self) -> list[Case]:
        m, out, afile = str(self.seed_model), self.work / "opt-run", self.work / "plain-file"
        afile.write_text("x")
        tiny = self.work / "tiny-options.gguf"
        write_tiny_model("deepseek4", tiny, seed=0)

        def sweep(*a):
            return ["sweep", m, "--out", str(out), "--quiet", *a]

        def ref(*a):
            return sweep("--backend", "reference", "--context", "256", "--per-residue", "1", *a)

        def val(*a):
            return ["validate", str(tiny), "--threads", "1", "--tokens", "32", *a]

        mp = ("--design", "meanpool")
        argvs = [
            sweep("--threads", "0"), sweep("--threads", "-1"), sweep("--threads", "1000000"),
            sweep("--threads", str(2**31)), sweep("--threads", str(2**63)), sweep("--threads", "1e3"),
            sweep("--threads", "abc"), sweep("--per-residue", "1000000000000"), sweep("--per-residue", "1000000"),
            sweep("--per-residue", "-1"), sweep("--per-residue", str(2**70)), sweep("--context", "0"),
            sweep("--context", "-5"), sweep("--context", "1"), sweep("--context", "10"), sweep("--context", str(2**40)),
            sweep("--context", "8128", "--per-residue", "9000"), sweep("--stride", "0"), sweep("--stride", "-3"),
            sweep("--stride", str(10**9)), sweep("--stride", "2", "--modulus", "0"), sweep("--modulus", "-8"),
            sweep("--modulus", str(10**12)), sweep("--modulus", "7"), sweep("--seed", "-1"),
            sweep("--task", "../../etc/passwd"), sweep("--task", "[red]x[/x]"), sweep("--task", ""),
            sweep("--task", "\x1b[2J"), sweep("--padding", "[/x]"), sweep("--backend", "nope"),
            ["sweep", m, "--quiet", "--out", "/proc/x"], ["sweep", m, "--quiet", "--out", str(afile / "run")],
            ["sweep", m, "--quiet", "--out", "/dev/null"],
            ["sweep", m, "--quiet", "--out", str(self.work / ("d" * 300))],
            ref("-o", "randomize=maybe"), ref("-o", "layers=[100]"), ref("-o", "layers=[-1]"), ref("-o", "layers=5"),
            ref("-o", "layers=[1.5]"), ref(*mp, "-o", "window=0"), ref(*mp, "-o", "window=-4"),
            ref(*mp, "-o", "window=1e9"), ref(*mp, "-o", "stride=0"), ref(*mp, "-o", 'stride="4"'),
            ref("--design", "blocktopk", "-o", "top_k=-1"), ref("--design", "blocktopk", "-o", "top_k=0"),
            ref("--design", "blocktopk", "-o", "block_size=0"), ref("--design", "blocktopk", "-o", "top_k=1e30"),
            ref("--design", "kpool", "-o", "kpool=1"), ref("--design", "kpool", "-o", "kpool=0"),
            ref("--design", "kpool", "-o", "top_k=7"), ref(*mp, "-o", "stagger=weird"),
            ref(*mp, "-o", "stagger_step=-1"), ref(*mp, "-o", "stagger_step=1e20"), ref(*mp, "-o", "seed=-1"),
            ref(*mp, "-o", "seed=1e40"), ref(*mp, "-o", "start=-1"), ref(*mp, "-o", "start=999999"),
            ref(*mp, "-o", "local_window=-2"), ref(*mp, "-o", "window=NaN"), ref(*mp, "-o", "window=Infinity"),
            ref(*mp, "-o", "window=[4]"), ref(*mp, "-o", "window={}"), ref("--design", "nope"),
            ref("--design", "[red]"), ref("-o", "="), ref("-o", "x"), ref("-o", "=4"),
            ref(*mp, "-o", "stagger=layer", "-o", "randomize=true"), sweep(*mp),
            # --cache-type, --stride all and --dry-run: the seed model's heads are 8 wide, so no q8_0 / q4_0 block fits
            sweep("--cache-type", "q5_1"), sweep("--cache-type", ""), sweep("--cache-type", "[red]"),
            sweep("--cache-type", "Q8_0"), sweep(*SWEEP, "--cache-type", "q8_0"), sweep(*SWEEP, "--cache-type", "q4_0"),
            sweep(*SWEEP, "--cache-type", "q8_0", "--backend", "reference"), sweep(*SWEEP, "--cache-type", "f16",
                                                                                   "--backend", "server", "--url",
                                                                                   "http://127.0.0.1:1"),
            sweep("--query-phases", "--no-query-phases"), sweep("--no-query-phases", "--query-phases"),
            sweep("--stride", "all"), sweep(*SWEEP, "--stride", "ALL"), sweep("--stride", "abc"), sweep("--stride", ""),
            sweep("--stride", "4.5"), sweep("--stride", "1e3"), sweep("--stride", "0x10"), sweep("--stride", "[red]"),
            sweep("--stride", str(10**30)), sweep(*SWEEP, "--stride", "all", "--modulus", "7"),
            ["sweep", str(tiny), "--stride", "all", "--quiet", "--out", str(out)],
            sweep(*SWEEP, "--dry-run"), sweep(*SWEEP, "--dry-run", "--stride", "0"),
            sweep(*SWEEP, "--dry-run", "--per-residue", "auto"), sweep(*SWEEP, "--dry-run", "--cache-type", "q8_0"),
            sweep(*SWEEP, "--dry-run", "--backend", "reference", "-o", "x"), sweep(*SWEEP, "--dry-run", "--stride", "all"),
            sweep(*SWEEP, "--dry-run", "--backend", "server", "--url", "http://127.0.0.1:1"),
            ["sweep", m, *SWEEP, "--dry-run", "--out", "/proc/x"], sweep("--dry-run", "--context", "0"),
            # --calibrate and --target-accuracy
            sweep(*SWEEP, "--calibrate", "--target-accuracy", "80-40"), sweep("--target-accuracy", "40-80"),
            sweep(*SWEEP, "--calibrate", "--target-accuracy", ""), sweep(*SWEEP, "--calibrate", "--target-accuracy",
                                                                          "nan-inf"),
            sweep(*SWEEP, "--calibrate", "--target-accuracy", "-1-50"), sweep(*SWEEP, "--calibrate", "--dry-run"),
            sweep(*SWEEP, "--calibrate", "--context", "256", "--task", "records"),
            sweep(*SWEEP, "--calibrate", "--task", "pairs"), sweep(*SWEEP, "--calibrate", "--stride", "all"),
            sweep(*SWEEP, "--calibrate", "--per-residue", "1", "--modulus", "4"),
            # --offsets, --combine, --shift and --random-offset (issue 20: fixes at inference time)
            sweep("--offsets", "0"), sweep("--offsets", "-2"), sweep("--offsets", "1"), sweep("--offsets", str(2**63)),
            sweep("--offsets", "abc"), sweep("--combine", "max"), sweep("--offsets", "2", "--combine", "median"),
            sweep("--offsets", "2", "--combine", ""), sweep("--offsets", "2", "--combine", "[red]"),
            sweep("--offsets", "2", "--random-offset"), sweep("--shift", "1", "--offsets", "2"),
            sweep("--shift", "1", "--random-offset"), sweep("--shift", "-1"), sweep("--shift", str(10**30)),
            sweep(*SWEEP, "--offsets", "2", "--dry-run"), sweep(*SWEEP, "--offsets", "2", "--calibrate"),
            sweep("--context", "8128", "--offsets", "4"),
            # --targets-per-context and --contexts (issue 39: targets per context that grow with the context)
            sweep("--targets-per-context", "0"), sweep("--targets-per-context", "-3"),
            sweep("--targets-per-context", str(2**70)), sweep("--targets-per-context", "1e3"),
            sweep("--targets-per-context", "[red]"), sweep("--targets-per-context", "\u0663"),
            sweep("--targets-per-context", "100000"), sweep("--targets-per-context", "12"),
            sweep(*SWEEP, "--targets-per-context", "task"), sweep("--contexts", "0"), sweep("--contexts", "-8"),
            sweep("--contexts", "12"), sweep("--contexts", str(2**63)), sweep("--contexts", "abc"),
            sweep("--contexts", "16", "--per-residue", "8"), sweep("--contexts", "16", "--per-residue", "auto",
                                                                  "--detect", "20"),
            sweep("--stride", "2", "--modulus", "4", "--per-residue", "2", "--targets-per-context", "4"),
            sweep("--context", "256", "--contexts", "8", "--quiet", "--threads", "1", "--dry-run"),
            sweep("--context", "256", "--contexts", "8", "--targets-per-context", "2", "--calibrate"),
            sweep(*SWEEP, "--offsets", "2", "--backend", "server", "--url", "http://127.0.0.1:1"),
            sweep(*SWEEP, "--gpu-layers", "-1"), sweep(*SWEEP, "--gpu-layers", str(2**40)), sweep(*SWEEP, "--gpu-layers", "x"),
            sweep(*SWEEP, "--gpu-layers", "2"), ref("--gpu-layers", "1"),
            *self.routes_and_options(out, afile),  # issue 76: every option and engine route of this wave
            # issue 56: errors that name what was typed and the nearest value that fits
            sweep("--contexts", "100000", "--context", "256"), sweep("--per-residue", "auto", "--detect", "0.1"),
            sweep("--per-residue", "auto", "--detect", "100"), sweep("--per-residue", "auto", "--detect", "0"),
            *(sweep("--targets-per-context", v) for v in ("0", "-1", "1.5", "abc", "65537")),
            *(sweep("--context", v) for v in ("128", "10", "100")), sweep("--per-residue", "100000"),
            *(sweep(*SWEEP, "--gpu-layers", v) for v in ("all", str(2**31), str(2**40), "x", "-2")),
            sweep(*SWEEP, "--backend", "server", "--url", "http://127.0.0.1:1", "--url", "127.0.0.1:1/"),
            # issue 70: answer phases on a plan that cannot balance them, and both settings with other factors
            sweep(*SWEEP, "--answer-phases"), sweep(*SWEEP, "--no-answer-phases"),
            sweep("--context", "256", "--contexts", "8", "--targets-per-context", "8", "--answer-phases",
                  "--query-phases"),
            sweep("--context", "256", "--per-residue", "3", "--targets-per-context", "3", "--answer-phases"),
            ["compare", str(afile), str(afile)],
            val("--tokens", "0"), val("--tokens", "-1"), val("--tokens", str(10**9)), val("--tokens", "1"),
            val("--split", "a,b"), val("--split", "0"), val("--split", "-5"), val("--split", "1000000"),
            val("--split", ",,,"), val("--split", ",".join(["1"] * 32)), val("--threads", "1000000"),
            val("--threads", "0"), val("--threads", "-1"), val("--gpu-layers", "-1"), val("--gpu-layers", "1000000"),
            val("--keys-tol", "nan"), val("--keys-tol", "-1"), val("--scores-tol", "inf"), val("--cache", "q8"),
            val("--cache", "[red]"), val("--perturb", str(10**12)), val("--perturb", "-7"), val("--seed", "-1"),
            ["validate", m, "--threads", "1", "--tokens", "16"],
            ["compare"], ["compare", str(self.work / "nope")], ["compare", str(afile)],
            ["compare", str(self.work), "--out", str(afile / "x")], ["report", str(afile)], ["report", "/proc"],
            ["report", ""], ["make-tiny", "nope", str(self.work / "t.gguf")],
            ["make-tiny", "llama", "/proc/x.gguf"], ["make-tiny", "llama", str(afile / "t.gguf")],
            ["make-tiny", "llama", str(self.work / "t1.gguf"), "--seed", "-1"],
            ["make-tiny", "llama", str(self.work / "t2.gguf"), "--seed", str(2**64)],
            ["make-tiny", "deepseek4", str(self.work / "t3.gguf"), "--yarn-factor", "nan"],
            ["make-tiny", "deepseek4", str(self.work / "t4.gguf"), "--yarn-factor", "-1"],
            ["make-tiny", "deepseek4", str(self.work / "t5.gguf"), "--yarn-factor", "1e308"],
            ["make-tiny", "llama", str(self.work)],
            *(["train", design, str(self.work / "train-run"), *a] for design, a in (
                ("csa", ["--stride", "8", "--context", "64"]), ("csa", ["--stagger", "head"]),
                ("csa-disjoint", ["--offsets", "random"]), ("csa-dense", ["--d-model", "24", "--heads", "4"]),
                ("csa", ["--local-window", "0"]), ("csa", ["--top-k", "-1"]), ("csa", ["--top-k", str(2**70)]),
                ("csa", ["--top-k", "18"]), ("csa-dense", ["--top-k", "4"]), ("csa", ["--ratios", ""]),
                ("csa", ["--ratios", "4,x"]), ("csa", ["--ratios", "128"]), ("csa", ["--ratios", "4,128"]),
                ("csa", ["--ratios", str(2**70)]), ("csa", ["--ratios", "[red]"]), ("csa", ["--ratios", "4,-4"]),
                ("gated", ["--ratios", "4,128"]), ("csa", ["--dense-steps", "5"]), ("csa-nope", []), ("glm-kpool", ["--stagger", "layer"]),
                ("glm-dense", ["--offsets", "jitter"]), ("glm-kpool", ["--local-window", "3"]),
                ("glm-kpool", ["--dense-steps", "-5"]), ("glm-kpool", ["--dense-steps", "x"]), ("glm-kpool", ["--top-k", "0"]), ("glm-msa", ["--stagger", "head"]), ("glm-msa", ["--local-window", "3"]),
                ("cowa", ["--stride", "6"]), ("cowa", ["--stride", "16"]), ("cowa", ["--stride", "8", "--heads", "16"]),
                ("cowa", ["--heads", "1"]), ("cowa", ["--top-k", "4"]), ("cowa", ["--kda", "off"]),
                ("dense", ["--copy-steps", "1500"]), ("dense", ["--copy-steps", "-1"]), ("dense", ["--copy-steps", "x"]),
                ("gated", ["--copy-steps", str(2**70)]), ("rolling", ["--stagger", "head"]),
                ("rolling", ["--offsets", "jitter"]), ("gated", ["--gate-steps", "5"]), ("meanpool", ["--gate-steps", "-1"]),
                ("meanpool", ["--gate-steps", "3000"]), ("meanpool", ["--gate-steps", "x"]), ("meanpool", ["--gate-steps", "5", "--copy-steps", "5"]),
                ("csa", ["--hint-steps", "5"]), ("csa-dense", ["--hint-steps", "-1"]), ("csa-dense", ["--hint-steps", "2000"]),
                ("csa-dense", ["--hint-steps", "x"]), ("csa-dense", ["--hint-steps", "5", "--copy-steps", "5"]), ("rolling", ["--stride", "1"]), ("rolling", ["--context", "24"]),
                ("csa", ["--init", str(self.work / "nope")]), ("csa", ["--init", str(afile)]), ("csa", ["--init", "/proc"]),
                ("csa", ["--init", ""]), ("csa", ["--init", str(self.damaged_run())]),
                *(("gated", ["--stall-minutes", v]) for v in ("-1", "nan", "-inf", "x", "")))),
            ["train", "csa", "/proc/x", "--steps", "1"], ["train", "gated", str(self.work / "t"), "--lr", "inf"],
            ["train", "gated", str(self.work / "t"), "--steps", str(10**9)], ["train", "gated", ""],
            # kvphase theory (issue 20: the idealized gradient-flow model; no model file, seconds of numpy)
            *(["theory", "--steps", "20", "-q", "--out", str(out), *a] for a in (
                ["--stride", "1"], ["--stride", "0"], ["--stride", str(2**70)], ["--stride", "1000"],
                ["--components", "0"], ["--components", "-3"], ["--components", "1000"], ["--components", "abc"],
                ["--components", "2", "--components", "0"], ["--beta", "0"], ["--beta", "-1"], ["--beta", "nan"],
                ["--beta", "inf"], ["--beta", "1e308"], ["--distractors", "0"], ["--distractors", "nan"],
                ["--distractors", "1e308"], ["--attenuation", "0"], ["--attenuation", "1.5"], ["--attenuation", "nan"],
                ["--steps", "0"], ["--steps", str(10**12)], ["--dt", "0"], ["--dt", "1e-300"], ["--dt", "1e6"],
                ["--dt", "10"], ["--stagger", "layer"], ["--stagger", "[red]"], ["--stagger", ""], ["--readout", ""],
                ["--readout", "max"], ["--init-scale", "-1"], ["--init-scale", "1e300"], ["--seed", "-1"],
                ["--seed", str(2**64)])),
            ["theory", "-q", "--out", str(afile)], ["theory", "-q", "--out", str(afile / "run")],
            ["theory", "-q", "--out", "/proc/x"], ["theory", "-q", "--out", "/dev/null"], ["theory", "-q", "--out", "."],
            ["theory", "-q", "--out", ""],
            ["sweep", m, "--out", ""], ["knockout", m, "--out", "."], ["knockout", m, "--context", "0"],
            ["flip", m, "--stride", "0"], ["sweep", m, "--backend", "server", "--url", "http://[::1"],
            ["sweep", m, "--backend", "server", "--url", "http://h:99999"], ["inspect"], ["inspect", m, "extra"], ["nonsense-command"],
            ["--no-such-option"], ["inspect", "--help"], ["inspect", "[/x]"], ["inspect", "\x1b[2J"],
            ["--version"], ["--version", "inspect", m], ["inspect", m, "--version"], ["--version=1"],
            # kvphase header (issue 40): a model's header without its weights
            ["header"], ["header", m], ["header", m, ""], ["header", m, m], ["header", m, str(self.work)],
            ["header", m, str(self.fifo())], ["header", m, "/proc/x.gguf"], ["header", m, str(afile / "h.gguf")],
            ["header", str(self.work / "nope.gguf"), str(self.work / "h.gguf")], ["header", "/proc", str(self.work / "h.gguf")],
            ["header", self.header_only(), str(self.work / "h2.gguf")],
            ["sweep", self.header_only(), *SWEEP, "--out", str(out)], ["validate", self.header_only()],
            ["sweep", self.header_only(), "--backend", "reference", *SWEEP, "--out", str(out)],
            ["gates", self.header_only(), "--out", str(out)], ["sweep", self.header_only(), *SWEEP, "--dry-run"],
            # kvphase conform (issue 55): not a reference, impossible tolerances, no server, no references
            *(["conform", *a, "--out", str(out)] for a in (["--model", m], ["--contexts", "-1"], ["--margin", "0"],
              ["--backend", "server", "--url", "http://h:99999", "--model", "csa-disjoint"], ["--references", str(afile)],
              ["--backend", "server", "--url", "http://127.0.0.1:9"])),
            # issue 72: scoring routes, SGLang, lm-eval's task out and its samples in
            *(["sweep", m, *SWEEP, "--out", str(out), *a] for a in (
                ["--scoring", "bogus"], ["--scoring", "generate"], ["--scoring", ""],
                ["--backend", "server", "--url", "http://127.0.0.1:9", "--scoring", "generate"],
                ["--backend", "server", "--url", "http://127.0.0.1:9", "--engine", "sglang"],
                ["--backend", "server", "--url", "http://127.0.0.1:9", "--engine", "sglang", "--scoring", "generate"],
                ["--backend", "server", "--url", "http://127.0.0.1:9", "--engine", "openai", "--scoring", "generate"])),
            *(["export", "lm-eval", *a] for a in (
                [], [str(self.work / "nope"), str(out)], [str(afile), str(out)], ["/proc", str(out)],
                [str(self.finished()[0]), str(out)], [str(self.finished()[0]), str(afile)],
                [str(self.finished()[0]), "/proc/x"], [str(self.finished()[0] / "config.json"), str(out), "--model",
                                                       str(self.work / "nope.gguf")],
                [str(self.finished()[0]), str(out), "--flag-mismatches", "--model", str(afile)],
                [str(self.finished()[0]), str(out), "--name", ""], [str(self.finished()[0]), str(out), "--name",
                                                                    "../../escape"])),
            *(["import", "lm-eval", *a] for a in (
                [], [str(self.work / "nope.jsonl"), str(out)], [str(afile), str(out)], ["/dev/null", str(out)],
                [str(self.work), str(out)], [str(self.fifo()), str(out)], [m, str(out)])),
            ["export"], ["import"], ["export", "ruler"], ["import", "inspect-ai", m, str(out)],
            # a model's URL (issue 54): nothing listens on port 9 of 127.0.0.1, and malformed ones
            *([c, url, *([str(self.work / "h.gguf")] if c == "header" else [])] for c in ("inspect", "header")
              for url in ("http://127.0.0.1:9/m.gguf", "http://[::1/m.gguf", "http://127.0.0.1:99999/m.gguf", "https://",
                          "http://127.0.0.1:9/\r\nHost: x", "ftp://127.0.0.1/m.gguf")),
        ]
        return [self._own_folder(Case("options", " ".join(short(x) for x in argv if x not in (m, str(out))), [argv],
                                      cleanup=[out]), out) for argv in argvs]

    def routes_and_options(self, out: Path, afile: Path) -> list[list[str]]:
        """Issue 76: the options no other case gives (--option, --slots, --selection, --query-phases, make-tiny's
        --tokenizer-from / --vocab-from / --shape, validate --attention-tol, the probes' --layer, --targets, --cycles,
        --slots, train's --records / --queries, conform --logprob-tolerance) and the engine routes they open:
        selection read from llama.cpp's graph and from the reference, minimax-m3 in process under flash attention,
        the released shapes' reach (a window as long as the context, a short run labelled inactive)."""
        ds4, probe = self.tiny_deepseek4(), self.probe_model()
        shaped = {shape: str(self.work / f"shape-{shape}.gguf") for shape in ("deepseek-v4-flash", "glm-5.3-flash")}
        for shape, arch in (("deepseek-v4-flash", "deepseek4"), ("glm-5.3-flash", "glm5-next")):
            if not Path(shaped[shape]).is_file():
                write_tiny_model(arch, shaped[shape], tokenizer_from=self.smol, shape=shape)
        mm3 = self.work / "tiny-mm3-smol.gguf"
        if not mm3.is_file():
            write_tiny_model("minimax-m3", mm3, tokenizer_from=self.smol)
        m, tiny = str(self.seed_model), str(self.work / "t76.gguf")

        def on(model, *a):
            return ["sweep", str(model), *SWEEP, "--out", str(out), *a]

        server = ("--backend", "server", "--url", "http://127.0.0.1:1")
        return [
            on(m, "--option", "window=4"), on(m, "--backend", "reference", "--option", "layers=[100]"),
            on(m, "--slots", "2"), on(m, *server, "--slots", "0"), on(m, *server, "--slots", "-1"),
            on(m, *server, "--slots", "abc"), on(m, *server, "--slots", str(2**63)),
            on(m, "--selection"), on(ds4, "--selection"), on(ds4, "--selection", "--backend", "reference"),
            on(ds4, "--selection", "--backend", "reference", "--design", "trained"), on(mm3, "--selection"),
            on(mm3, "--selection", "--backend", "reference", "--design", "trained"), on(mm3),
            on(ds4, "--selection", "--offsets", "2"), on(ds4, "--selection", *server),
            on(ds4, "--selection", "--dry-run"), on(m, "--query-phases"), on(ds4, "--no-query-phases"),
            on(ds4, "--query-phases", "--per-residue", "8"), on(ds4, "--query-phases", "--no-query-phases"),
            on(ds4, "--query-phases", "--dry-run", "--modulus", "7"), on(ds4, "--query-phases", "--offsets", "2"),
            *(["sweep", shaped["deepseek-v4-flash"], *a, "--dry-run", "--out", str(out)] for a in (
                ["--context", "100"], ["--context", "128", "--task", "pairs"], ["--context", "200", "--task", "pairs"])),
            ["sweep", shaped["glm-5.3-flash"], "--context", "2040", "--per-residue", "8", "--dry-run", "--out", str(out)],
            ["inspect", shaped["deepseek-v4-flash"]], ["inspect", shaped["glm-5.3-flash"]],
            *(["make-tiny", arch, tiny, *a] for arch, a in (
                ("llama", ["--tokenizer-from", str(self.work / "nope.gguf")]), ("llama", ["--tokenizer-from", str(afile)]),
                ("llama", ["--tokenizer-from", ""]), ("llama", ["--vocab-from", self.header_only()]),
                ("llama", ["--vocab-from", "/proc"]), ("glm5-next", ["--shape", "nope"]),
                ("llama", ["--shape", "minimax-m3"]), ("deepseek4", ["--shape", "glm-5.3-flash"]),
                ("minimax-m3", ["--shape", ""]), ("glm5-next", ["--shape", "glm-5.3-flash", "--top-k", "0"]),
                ("llama", ["--top-k", "4"]), ("deepseek4", ["--top-k", str(2**40)]))),
            *(["validate", ds4, "--threads", "1", "--tokens", "32", "--attention-tol", v]
              for v in ("nan", "-1", "inf", "x")),
            *(["gates", probe, "--layer", v, "--out", str(out)] for v in ("99", "-1", "x")),
            *(["gate-activations", probe, "--contexts", "2", "--layer", v, "--out", str(out)] for v in ("99", "-1")),
            *(["flip", probe, "--threads", "1", "--out", str(out), *a] for a in (
                ["--targets", "0"], ["--targets", "-1"], ["--targets", str(2**63)], ["--cycles", "0"],
                ["--cycles", "-2"], ["--cycles", str(10**9)], ["--option", "x"], ["-o", "="],
                ["--backend", "reference", "--option", "window=0"])),
            *(["knockout", probe, "--threads", "1", "--out", str(out), *a] for a in (
                ["--layer", "99"], ["--layer", "-1"], ["--slots", "--layer", "99"],
                ["--slots", "--per-residue", "0"])),
            ["knockout", m, "--slots", "--threads", "1", "--out", str(out)],
            *(["train", "csa", str(self.work / "train-run"), *a] for a in (
                ["--records", "0"], ["--records", "-1"], ["--records", str(2**40)], ["--queries", "0"],
                ["--queries", "-3"], ["--queries", str(10**9)], ["--records", "x"])),
            *(["conform", "--logprob-tolerance", v, "--out", str(out)] for v in ("nan", "-1", "inf", "x")),
        ]

    # -- real faults: a full disk, too little memory, folders that cannot be written (issue 42)
    def writers(self) -> dict[str, Callable[[Path], list[str]]]:
        """Every command that writes, as argv(out folder), on inputs made once (`finished`)."""
        m, done = str(self.seed_model), self.finished()
        probes = {name: (lambda out, a=argv: [*a, "--threads", "1", "--out", str(out)]) if name not in ("gates",
                  "gate-activations") else (lambda out, a=argv: [*a, "--out", str(out)])
                  for name, argv in self.probe_commands().items()}
        return {
            "sweep": lambda out: ["sweep", m, *SWEEP, "--out", str(out)],
            "sweep, resumed": lambda out: ["sweep", m, *SWEEP, "--out", str(out.parent / done[0].name)],
            "sweep reference": lambda out: ["sweep", m, "--backend", "reference", *SWEEP, "--out", str(out)],
            "sweep --offsets 2": lambda out: ["sweep", m, *SWEEP, "--offsets", "2", "--out", str(out)],
            "sweep --calibrate": lambda out: ["sweep", m, "--calibrate", "--quiet", "--threads", "1", "--out", str(out)],
            "sweep --stride all": lambda out: ["sweep", self.tiny_deepseek4(), "--context", "960", "--per-residue", "1",
                                               "--quiet", "--threads", "1", "--stride", "all", "--out", str(out)],
            "train": lambda out: ["train", "dense", str(out), *TRAIN],
            **probes,
            "theory": lambda out: ["theory", "--steps", "50", "--components", "2", "-q", "--out", str(out)],
            "report": lambda out: ["report", str(out.parent / done[0].name)],
            "compare": lambda out: ["compare", *map(str, done), "--out", str(out)],
            "make-tiny": lambda out: ["make-tiny", "deepseek4", str(out / "m.gguf")],
            "header": lambda out: ["header", m, str(out / "h.gguf")],
        }

    def tiny_deepseek4(self) -> str:
        """A tiny deepseek4 with SmolLM2's vocabulary (ratios 4 and 128: --stride all sweeps both)."""
        path = self.work / "tiny-ds4-smol.gguf"
        if not path.is_file():
            write_tiny_model("deepseek4", path, tokenizer_from=self.smol)
        return str(path)

    def header_only(self) -> str:
        """The seed model's header without its weights (`kvphase header`)."""
        from kvphase.gguf.header_only import write_header_only

        path = self.work / "tiny-smol-header.gguf"
        if not path.is_file():
            write_header_only(self.seed_model, path)
        return str(path)

    def damaged_run(self) -> Path:
        """A csa run folder whose config is sound and whose checkpoint is random bytes (for --init)."""
        from kvphase.train.config import TrainConfig

        folder = self.work / "damaged-run"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"kind": "train", **TrainConfig.for_design("csa").to_json()}))
        (folder / "checkpoint.npz").write_bytes(self.rng.randbytes(4000))
        return folder

    def fifo(self) -> Path:
        """A path that is not a regular file, in place of /dev/null (which a rename would replace)."""
        path = self.work / "a-fifo"
        if not path.exists():
            os.mkfifo(path)
        return path

    def finished(self) -> list[Path]:
        """Two finished sweeps of the seed model (report and compare read them)."""
        runs = [self.work / f"finished-{seed}" for seed in (0, 1)]
        for seed, run in enumerate(runs):
            if not (run / "report.md").is_file():
                outcome, detail = run_cli(["sweep", str(self.seed_model), *SWEEP, "--seed", str(seed), "--out", str(run)],
                                          300, self.work)
                if outcome != "ok":
                    raise SystemExit(f"could not make the finished sweeps: {outcome}: {detail}")
        return runs

    def namespace(self, mnt: Path, free: int | None, after: str = "") -> list[str]:
        """The prefix that runs a command with a tmpfs of its own at `mnt` (the finished sweeps
        copied in), `free` bytes left free (None: not filled), then `after` (a remount)."""
        copy = " ".join(str(run) for run in self.finished())
        return ["unshare", "--user", "--map-root-user", "--mount", "env", f"MNT={mnt}", f"COPY={copy}",
                f"FREE={'' if free is None else free}", f"AFTER={after}", "bash", "-c", FULL_DISK, "_"]

    def disk(self) -> list[Case]:
        if not namespaces_mount():
            print("disk: no user namespace may mount a tmpfs here; the category is left out", flush=True)
            return []
        cases = []
        for name, argv in self.writers().items():
            for free in (0, 4096, 16384, 65536):
                mnt = self.path("mnt")
                cases.append(Case("disk", f"{name}, {free} B free", [argv(mnt / "run")], cpu=120,
                                  prefix=self.namespace(mnt, free), prepare=mnt.mkdir, cleanup=[mnt]))
        return cases

    def memory(self) -> list[Case]:
        smol = ["sweep", str(self.smol), "--context", "1024", "--contexts", "8", "--quiet", "--threads", "1"]
        writers = self.writers()
        commands = {"sweep SmolLM2": lambda out: [*smol, "--out", str(out)],
                    "sweep SmolLM2 reference": lambda out: [*smol, "--backend", "reference", "--out", str(out)],
                    **{name: writers[name] for name in ("sweep", "train", "gates", "knockout", "theory")}}
        cases = []
        for name, argv in commands.items():
            for mib in (200, 300, 450, 700, 1200):
                out = self.path("run")
                cases.append(Case("memory", f"{name}, {mib} MiB of address space", [argv(out)], cpu=120,
                                  address_space=mib << 20, cleanup=[out]))
        return cases

    def readonly(self) -> list[Case]:
        cases = []
        if namespaces_mount():
            for name, argv in self.writers().items():
                mnt = self.path("mnt")
                cases.append(Case("readonly", f"{name}, read-only file system", [argv(mnt / "run")], cpu=120,
                                  prefix=self.namespace(mnt, None, 'mount -o remount,ro "$MNT"'), prepare=mnt.mkdir,
                                  cleanup=[mnt]))
        if not immutable_folders(self.work):
            print("readonly: chattr +i is refused here; immutable folders are left out", flush=True)
            return cases
        for name, argv in self.writers().items():
            folder = self.path("immutable")

            def prepare(folder=folder):
                folder.mkdir()
                for run in self.finished():
                    shutil.copytree(run, folder / run.name)
                subprocess.run(["chattr", "-R", "+i", str(folder)], check=True)

            def release(folder=folder):
                subprocess.run(["chattr", "-R", "-i", str(folder)], check=False)

            cases.append(Case("readonly", f"{name}, immutable folder", [argv(folder / "run")], cpu=120,
                              prepare=prepare, release=release, cleanup=[folder]))
        return cases

    def _own_folder(self, case: Case, shared: Path) -> Case:
        """The case with a run folder of its own in place of `shared`: under --jobs 2, one case's
        cleanup removed the folder another case's sweep was writing (a FileNotFoundError of the
        harness, not of kvphase)."""
        own = self.path(shared.name)
        commands = [[str(own) if arg == str(shared) else arg for arg in argv] for argv in case.commands]
        return replace(case, commands=commands, cleanup=[own])


class SilentFleet:
    """llama-servers on the seed model for the silent category: started before a case, the last one
    paused (SIGSTOP) at a point of the sweep and let go on (SIGCONT) before the resume."""

    def __init__(self, binary: Path, model: Path, count: int):
        from kvphase.engines.llama_server import free_port

        self.binary, self.model = binary, model
        self.ports = [free_port() for _ in range(count)]
        self.urls = [part for port in self.ports for part in ("--url", f"http://127.0.0.1:{port}")]
        self._stack = None
        self._lock = threading.Lock()
        self.watching = True
        self.servers: list = []

    def __enter__(self) -> "SilentFleet":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        import contextlib

        from kvphase.engines.llama_server import llama_server

        self._stack = contextlib.ExitStack()
        self.watching = True
        self.servers = [self._stack.enter_context(llama_server(self.model, binary=self.binary, threads=1, slots=1,
                                                               n_ctx_per_slot=1024, port=port))
                        for port in self.ports]

    def pause_at(self, out: Path, rows: int) -> None:
        """Pause the last server once `out`'s results.csv holds `rows` rows (at once for 0), unless
        the first sweep ended before that."""
        results = out / "results.csv"
        while rows and self.watching:
            if results.exists() and results.read_bytes().count(b"\n") - 1 >= rows:
                break
            time.sleep(0.02)
        with self._lock:  # not after `resume`: the second sweep runs on servers that answer
            if self.watching:
                self.servers[-1].pause()

    def resume(self) -> None:
        with self._lock:
            self.watching = False
            self.servers[-1].resume()

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None


def same_rows(out: Path, clean: Path) -> str:
    """"" when `out`'s results.csv holds the clean run's rows, each once (log-probabilities within
    1e-4: a server's batch shapes may move the last digits), else what differs."""
    import pandas as pd

    try:
        got, want = (pd.read_csv(folder / "results.csv") for folder in (out, clean))
    except (OSError, ValueError) as exc:
        return f"results.csv unreadable: {exc}"
    if got["target_id"].duplicated().any():
        return f"target {int(got['target_id'][got['target_id'].duplicated()].iloc[0])} scored twice"
    got, want = (frame.sort_values("target_id").reset_index(drop=True) for frame in (got, want))
    if list(got["target_id"]) != list(want["target_id"]):
        return f"{len(got)} rows, the clean run {len(want)}"
    if (got["correct"] != want["correct"]).any() or (got["logprob"] - want["logprob"]).abs().max() > 1e-4:
        return "scores differ from the clean run's"
    return ""


class HostileServers:
    """One listening port per way of misbehaving, each answering every request that way (the
    sweep's first requests are its checks). Threads of this process; they live as long as it."""

    MODES = {
        "silent": "accepts and never answers",
        "close": "closes the connection at once",
        "not-http": "answers bytes that are not HTTP",
        "garbage": "HTTP 200 with a body that is not JSON",
        "cut": "announces 1000 bytes, sends 10, closes",
        "trickle": "a JSON body, one byte every 0.5 s",
        "slow-headers": "its header lines, one byte every 0.5 s",
        "long-header": "a header line of 100,000 bytes",
        "error-500": "HTTP 500 with an error message",
        "wrong-json": "HTTP 200 with JSON of the wrong shape",
        "huge-json": "HTTP 200 with 20 MB of JSON",
    }

    def __init__(self):
        import socketserver

        class Handler(socketserver.BaseRequestHandler):
            def handle(handler):
                mode = handler.server.mode
                handler.request.settimeout(60)
                try:
                    handler.request.recv(65536)
                    self.misbehave(mode, handler.request)
                except OSError:
                    pass

        self.servers = {}
        for mode in self.MODES:
            server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
            server.daemon_threads, server.mode = True, mode
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers[mode] = server

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.servers[mode].server_address[1]}"

    @staticmethod
    def misbehave(mode: str, sock) -> None:
        def answer(status: str, body: bytes, length: int | None = None) -> bytes:
            return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: "
                    f"{len(body) if length is None else length}\r\n\r\n").encode() + body

        if mode == "silent":
            time.sleep(3600)
        elif mode == "not-http":
            sock.sendall(os.urandom(200))
        elif mode == "garbage":
            sock.sendall(answer("200 OK", b"<html>oops</html>"))
        elif mode == "cut":
            sock.sendall(answer("200 OK", b'{"data": [', length=1000))
        elif mode in ("trickle", "slow-headers"):
            data = answer("200 OK", b'{"data": [{"id": "m"}]}')
            start = 0 if mode == "slow-headers" else data.index(b"\r\n\r\n") + 4
            sock.sendall(data[:start])
            for i in range(start, len(data)):
                sock.sendall(data[i:i + 1])
                time.sleep(0.5)
        elif mode == "long-header":
            sock.sendall(b"HTTP/1.1 200 OK\r\nX-Long: " + b"x" * 100_000 + b"\r\n\r\n")
        elif mode == "error-500":
            sock.sendall(answer("500 Internal Server Error", b'{"error": {"message": "boom"}}'))
        elif mode == "wrong-json":
            sock.sendall(answer("200 OK", b'{"data": 5, "default_generation_settings": [], "tokens": "x"}'))
        elif mode == "huge-json":
            sock.sendall(answer("200 OK", b"[" + b"1," * 10_000_000 + b"1]"))


def namespaces_mount() -> bool:
    """Whether an unprivileged user namespace may mount a tmpfs here (the disk faults need it)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True).returncode == 0


def immutable_folders(work: Path) -> bool:
    """Whether `chattr +i` works in `work` (root on ext4, say)."""
    probe = work / "chattr-probe"
    probe.mkdir(exist_ok=True)
    ok = subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode == 0
    subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
    probe.rmdir()
    return ok


def short(text: str, limit: int = 50) -> str:
    text = text.encode("unicode_escape").decode()
    return text if len(text) < limit else text[:limit - 3] + "..."


def table(cases: list[Case]) -> str:
    rows = ["| category | trials | " + " | ".join(OUTCOMES) + " | longest (s) |", "|---|" + "---|" * (len(OUTCOMES) + 2)]
    total: Counter = Counter()
    for key, name in CATEGORIES.items():
        outcomes = Counter(outcome for case in cases if case.category == key for outcome, *_ in case.results)
        longest = max((s for case in cases if case.category == key for *_, s in case.results), default=0.0)
        if outcomes:
            total.update(outcomes)
            rows.append(f"| {name} | {sum(outcomes.values())} | " + " | ".join(str(outcomes[o]) for o in OUTCOMES)
                        + f" | {longest:.1f} |")
    longest = max((s for case in cases for *_, s in case.results), default=0.0)
    rows.append(f"| all | {sum(total.values())} | " + " | ".join(str(total[o]) for o in OUTCOMES) + f" | {longest:.1f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random cuts and flips")
    parser.add_argument("--timeout", type=float, default=10.0, help="CPU seconds before a trial counts as a hang")
    parser.add_argument("--wall", type=float, default=300.0, help="wall seconds before a trial counts as a hang")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the number of random cuts and flips")
    parser.add_argument("--only", choices=sorted(CATEGORIES), action="append", help="run these categories only")
    parser.add_argument("--budget", type=float, default=None, help="start no new case after this many seconds; "
                        "cases run in a seeded random order, so a partial campaign samples every category")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every trial, not only the bad ones")
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kvphase-fuzz-") as tmp:
        campaign = Campaign(Path(tmp), args.seed, args.scale)
        cases = [case for key in CATEGORIES if not args.only or key in args.only for case in getattr(campaign, key)()]
        random.Random(args.seed).shuffle(cases)
        planned = sum(len(case.commands) for case in cases)

        def run(case: Case) -> None:
            if args.budget is not None and time.time() - started > args.budget:
                return
            run_case(case, args.timeout, campaign.work, args.wall)
            for argv, (outcome, detail, seconds) in zip(case.commands, case.results):
                if args.verbose or outcome in BAD or seconds > args.timeout:
                    print(f"[{outcome}, {seconds:.1f} s] {case.category}: {case.label} [{argv[0]}]\n    "
                          f"{short(detail, 300)}", flush=True)

        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(run, cases))
    n = sum(len(case.results) for case in cases)
    print(f"\n{n} of {planned} planned trials in {time.time() - started:.0f} s (hang: over {args.timeout:g} s of CPU or {args.wall:g} s "
          f"in all; seed {args.seed}, scale {args.scale:g})\n")
    print(table(cases))
    return 1 if any(outcome in BAD for case in cases for outcome, *_ in case.results) else 0


if __name__ == "__main__":
    sys.exit(main())
