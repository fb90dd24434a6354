"""A disk that fills up, for the tests of issue 42: every file opened for writing under one
folder shares a byte budget, and the write that passes it stores what fits and fails with
ENOSPC, as a full file system does. Portable: Python's `open` (builtins and io, which
pathlib, PIL, the gguf writer and numpy's savez go through) and `os.pwrite` (the run lock)
are wrapped, so no mount or privilege is needed.

    with FillingDisk(root) as disk:        # no budget: records every write
        run_the_command()
    for budget in disk.budgets():          # a budget that fails each file's first write, and mid-way
        with FillingDisk(root2, budget): ...
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

ENOSPC_TEXT = os.strerror(errno.ENOSPC)  # "No space left on device"
_TEMPORARY = re.compile(r"^\.(.+)\.\d+\.tmp$")  # save_atomic's temporary names stand for the file they become


@dataclass(frozen=True)
class Write:
    """One write the disk took: which file (temporary names mapped to their target), how many
    bytes, and how many the disk held before it."""

    file: str
    size: int
    offset: int


class FillingDisk:
    """Patches `open` and `os.pwrite` while active; `budget` None records without failing."""

    def __init__(self, root: Path, budget: int | None = None):
        self.root, self.budget = Path(root).resolve(), budget
        self.used, self.writes, self.failed = 0, [], None
        self._fds: dict[int, str] = {}

    # -- what was written -----------------------------------------------------------------

    def file_of(self, path) -> str | None:
        """The file's name relative to the root (None outside it), temporary names mapped."""
        try:
            relative = Path(os.path.abspath(os.fspath(path))).resolve().relative_to(self.root)
        except (TypeError, ValueError):
            return None
        match = _TEMPORARY.match(relative.name)
        return str(relative.with_name(match.group(1)) if match else relative)

    def budgets(self, only: set[str] | None = None) -> list[int]:
        """Budgets that fail each kind of file (its name, whichever subfolder: a probe's sub-sweeps
        write with the sweep's code) at its first write's first byte and, for a file written in
        parts (a table's rows, a figure, a checkpoint), half-way through its second write: every
        write site's fault, not every write."""
        by_name: dict[str, list[Write]] = {}
        for write in self.writes:
            by_name.setdefault(Path(write.file).name, []).append(write)
        chosen = set()
        for name, writes in by_name.items():
            if only is not None and name not in only:
                continue
            chosen.add(writes[0].offset)
            if len(writes) > 1 and writes[1].size > 1:
                chosen.add(writes[1].offset + writes[1].size // 2)
        return sorted(chosen)

    def take(self, file: str, size: int) -> int:
        """Bytes of a `size`-byte write the disk holds (all of them, or what is left of the budget)."""
        room = size if self.budget is None else max(0, min(size, self.budget - self.used))
        self.writes.append(Write(file, size, self.used))
        self.used += room
        if room < size and self.failed is None:
            self.failed = file
        return room

    # -- the patches ------------------------------------------------------------------------

    def __enter__(self) -> FillingDisk:
        self._open, self._io_open, self._os_open, self._pwrite = builtins.open, io.open, os.open, os.pwrite
        builtins.open = io.open = self._opened
        os.open, os.pwrite = self._os_opened, self._pwritten
        return self

    def __exit__(self, *exc) -> None:
        builtins.open, io.open, os.open, os.pwrite = self._open, self._io_open, self._os_open, self._pwrite

    def _opened(self, file, mode="r", *args, **kwargs):
        handle = self._open(file, mode, *args, **kwargs)
        name = self.file_of(file) if isinstance(file, (str, bytes, os.PathLike)) else None
        if name is None or not set(mode) & set("wax+"):
            return handle
        return _FillingFile(handle, self, name)

    def _os_opened(self, path, flags, *args, **kwargs):
        fd = self._os_open(path, flags, *args, **kwargs)
        name = self.file_of(path)
        if name is not None:
            self._fds[fd] = name
        return fd

    def _pwritten(self, fd, data, offset):
        if fd not in self._fds:
            return self._pwrite(fd, data, offset)
        room = self.take(self._fds[fd], len(data))
        written = self._pwrite(fd, data[:room], offset) if room else 0
        if room < len(data):
            raise OSError(errno.ENOSPC, ENOSPC_TEXT)
        return written


class _FillingFile:
    """A file object whose writes draw on the disk's budget; everything else is the real file's."""

    def __init__(self, handle, disk: FillingDisk, name: str):
        self._handle, self._disk, self._name = handle, disk, name

    def write(self, data):
        size = len(data.encode() if isinstance(data, str) else bytes(data))
        room = self._disk.take(self._name, size)
        if room < size:
            if room:  # what fits reaches the disk, as a full file system stores a short write
                self._handle.write(data.encode()[:room].decode(errors="ignore") if isinstance(data, str) else
                                   bytes(data)[:room])
                self._handle.flush()
            raise OSError(errno.ENOSPC, ENOSPC_TEXT)
        return self._handle.write(data)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __iter__(self):
        return iter(self._handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._handle.close()


# -- the check every writing command passes -----------------------------------------------------

def table_rows(path: Path, drop: tuple[str, ...] = ()) -> list[tuple]:
    """A CSV table's rows, sorted, without the columns that time the run (`drop`)."""
    import pandas as pd

    frame = pd.read_csv(path, dtype=str, keep_default_na=False).drop(columns=list(drop))
    return sorted(frame.itertuples(index=False, name=None))


def fill_the_disk_at_every_site(tmp_path: Path, argv, kept, root=lambda out: out,
                                only: set[str] | None = None) -> FillingDisk:
    """Runs `argv(out)` once on a roomy disk, then once per budget of `FillingDisk.budgets` on a
    disk that fills there: each run must end in one line naming the folder and the full disk
    (exit 1; a command of several runs, `--stride all`, reports the runs it finished before), and the same command run again with room must finish with `kept(out)` equal to
    the roomy run's. `root(out)` is the folder the command writes in (out itself by default);
    `only` limits the faults to these file names (a mode whose other files a test already faults)."""
    from typer.testing import CliRunner

    from kvphase.cli import app
    from tests.helpers.cli_checks import last_line_error

    runner = CliRunner()
    clean = tmp_path / "roomy"
    with FillingDisk(root(clean)) as disk:
        result = runner.invoke(app, [str(a) for a in argv(clean)])
    assert result.exit_code == 0, result.output
    want = kept(clean)
    budgets = disk.budgets(only)
    assert budgets, f"none of {only} was written"
    for budget in budgets:
        out = tmp_path / f"full-at-{budget}"
        with FillingDisk(root(out), budget) as full:
            result = runner.invoke(app, [str(a) for a in argv(out)])
        assert full.failed, f"a budget of {budget} bytes was never reached"
        last_line_error(result, ENOSPC_TEXT, str(root(out)), "run the same command again")
        again = runner.invoke(app, [str(a) for a in argv(out)])
        assert again.exit_code == 0, f"resuming after a full disk at {full.failed} ({budget} bytes): {again.output}"
        assert kept(out) == want, f"resumed after a full disk at {full.failed} ({budget} bytes): other results"
    return disk
