"""The files of a run folder, whatever wrote it (a sweep, a probe, a training run).

One process at a time holds a folder (`RunLock`); config, manifest and summary are
replaced whole (`write_atomic`); JSON and CSV files are checked as they are read, so a
damaged one is named in one line (file, line, problem) instead of a traceback. Imports
nothing of kvphase but its errors: sweep, probes and train all stand on it.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import hashlib
import io
import json
import os
import platform
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from kvphase.errors import RunFolderError

CONFIG_FILE, SUMMARY_FILE, MANIFEST_FILE, REPORT_FILE = "config.json", "summary.json", "manifest.json", "report.md"
LOCK_FILE = ".lock"
_HELD: dict[Path, int] = {}  # run folders this process holds -> how many RunLocks are open on each


class RunLock:
    """One sweep at a time in a run folder: an exclusive `flock` on `<run_dir>/.lock`.

    The kernel drops a flock when its holder exits, however it exits, so a sweep killed by
    SIGKILL cannot leave a folder locked: its `.lock` file stays, naming it (pid, host),
    and the next sweep takes the folder over and reports that holder as `stale`. A clean
    release empties the file. Re-entrant within a process (the CLI locks before the model
    loads, `execute_sweep` locks again). A folder this lock created and nothing else wrote
    to is removed on release, so a refused start leaves nothing behind.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.stale: str | None = None  # the holder a previous, killed sweep left in the lock file
        self._fd: int | None = None
        self._created = False

    def __enter__(self) -> RunLock:
        key = self.run_dir.resolve()
        if key in _HELD:
            _HELD[key] += 1
            return self
        self._created = make_folder(self.run_dir)
        path = self.run_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunFolderError(f"cannot lock {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _lock_holder(fd)
            os.close(fd)
            raise RunFolderError(f"{self.run_dir} is in use by another sweep ({holder or 'holder unknown'}); "
                                 "wait for it to finish or choose another --out") from None
        self.stale = _lock_holder(fd) or None
        try:
            with writing(path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {platform.node()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        except RunFolderError:
            os.close(fd)  # releases the flock
            if self._created:  # a refused start leaves nothing behind
                path.unlink(missing_ok=True)
                self.run_dir.rmdir()
            raise
        self._fd = fd
        _HELD[key] = 1
        return self

    def __exit__(self, *exc) -> None:
        key = self.run_dir.resolve()
        _HELD[key] -= 1
        if _HELD[key] or self._fd is None:
            return
        del _HELD[key]
        os.ftruncate(self._fd, 0)  # released cleanly: an empty lock file names no holder
        if self._created and [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
            (self.run_dir / LOCK_FILE).unlink()
            self.run_dir.rmdir()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def make_folder(folder: Path) -> bool:
    """Create an output folder (and its parents); True when it did not exist. RunFolderError
    when it is a file or cannot be created (read-only place, a file on the way)."""
    try:  # exists() itself fails on a name longer than the file system allows
        if folder.exists() and not folder.is_dir():
            raise RunFolderError(f"{folder} is a file, not a run folder; choose another --out")
        created = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunFolderError(f"cannot create run folder {folder}: {exc.strerror or exc}") from None
    return created


def _lock_holder(fd: int) -> str:
    """What the lock file names: the holder's pid, host and start time ("" when released cleanly)."""
    return os.pread(fd, 200, 0).decode("utf-8", errors="replace").strip()


NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # a full disk, a quota, a file size limit


def system_reason(exc: OSError) -> str:
    """The system's reason for a failed call and, when the disk or a quota is full, what to do
    (everything finished before stays valid and is resumed from)."""
    said = str(exc.strerror or exc)
    if exc.errno in NO_ROOM:
        said += "; free some space and run the same command again (what was finished is kept)"
    return said


def cannot_write(path: Path, exc: OSError) -> str:
    """The one line for a failed write: the file and `system_reason`."""
    return f"cannot write {path}: {system_reason(exc)}"


@contextmanager
def writing(path: Path):
    """RunFolderError naming `path` for an OSError raised inside (a full disk, a quota, a
    read-only or vanished folder), instead of a traceback."""
    try:
        yield
    except OSError as exc:
        raise RunFolderError(cannot_write(path, exc)) from None


def save_atomic(path: Path, save: Callable[[Path], None]) -> None:
    """`save(temporary path)` beside `path`, then a rename over `path`: a reader, or a command
    killed or out of space mid-write, sees the old file or the new one, never half of one. Only a
    regular file is replaced: the rename would put a file in place of a device (/dev/null) or a link."""
    if path.is_symlink() or (path.exists() and not path.is_file()) or not path.name:
        what = "a folder" if path.is_dir() else "not a regular file"
        raise RunFolderError(f"cannot write {path}: it is {what}; give the path of a file")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        with suppress(OSError):  # on a read-only or vanished folder the clean-up fails too: the first error counts
            tmp.unlink(missing_ok=True)
        raise RunFolderError(cannot_write(path, exc)) from None


def write_atomic(path: Path, text: str) -> None:
    """`text` as the whole of `path` (`save_atomic`)."""
    save_atomic(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, value: dict) -> None:
    """A JSON object as an indented file, replaced whole (`write_atomic`)."""
    write_atomic(path, json.dumps(value, indent=2) + "\n")


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """A table as a CSV file without the index, replaced whole (`write_atomic`)."""
    write_atomic(path, frame.to_csv(index=False))


def check_writable(run_dir: Path, names: Iterable[str]) -> None:
    """RunFolderError when an output file of the folder is in the way (a directory, say)."""
    for name in names:
        path = run_dir / name
        if path.exists() and not path.is_file():
            raise RunFolderError(f"{path} is not a file, so it cannot be rewritten; move it away")


def read_json_object(path: Path) -> dict:
    """A run folder's JSON file as a dict; RunFolderError naming the file, line and problem."""
    if path.is_dir():
        raise RunFolderError(f"{path} is a directory, expected a JSON file")
    text = _read_text(path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path} line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise RunFolderError(f"{path}: JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise RunFolderError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def read_table(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """A run folder's CSV table, every cell as text, with `columns` present; complete lines only
    (half a line at the end is a write a kill cut short), and an empty file is a table without
    rows. RunFolderError naming the file and the problem."""
    if not path.is_file():
        raise RunFolderError(f"{path} is not a file; move it away")
    text = _read_text(path, whole_lines=True)
    if not text.strip():
        return pd.DataFrame({column: pd.Series(dtype=str) for column in columns})
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, csv.Error, ValueError) as exc:
        raise RunFolderError(f"{path} is not a readable table ({(str(exc).splitlines() or ['?'])[0]})") from None
    missing = set(columns) - set(frame.columns)
    if missing:
        raise RunFolderError(f"{path} lacks columns: {', '.join(sorted(missing))}")
    return frame


def _read_text(path: Path, whole_lines: bool = False) -> str:
    """A file's UTF-8 text (up to its last line break when `whole_lines`); RunFolderError naming the
    file when it cannot be read or is not UTF-8."""
    try:
        data = path.read_bytes()
        return (complete_lines(data) if whole_lines else data).decode("utf-8")
    except OSError as exc:
        raise RunFolderError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RunFolderError(f"{path} byte {exc.start}: not UTF-8 text") from None


WHOLE_LIMIT = 2**53  # whole numbers a float holds exactly; ids, positions and steps stay far below


def numbers_in(path: Path, frame: pd.DataFrame, column: str, whole: bool = False) -> pd.Series:
    """A column of a `read_table` table as numbers (whole ones as integers); RunFolderError naming
    the first line whose cell is not a finite number (or not whole and within 0 .. 2^53)."""
    parsed = pd.to_numeric(frame[column], errors="coerce")  # (rows,) NaN: not a number; integers stay integers
    values = parsed.to_numpy(dtype=float)  # (rows,)
    bad = ~np.isfinite(values)
    if whole:
        values = np.where(bad, 0.0, values)  # (rows,)
        bad |= (values % 1 != 0) | (values < 0) | (values > WHOLE_LIMIT)
    refuse_rows(path, frame, column, bad, "a whole number >= 0" if whole else "a finite number")
    return parsed.astype(np.int64) if whole else parsed


def flags_in(path: Path, frame: pd.DataFrame, column: str) -> pd.Series:
    """A True/False column of a `read_table` table (1 and 0 accepted) as booleans."""
    verdicts = frame[column].astype(str).str.lower()  # (rows,)
    refuse_rows(path, frame, column, ~verdicts.isin(["true", "false", "1", "0"]).to_numpy(), "True or False")
    return verdicts.isin(["true", "1"])


def refuse_rows(path: Path, frame: pd.DataFrame, column: str, bad: np.ndarray, expected: str) -> None:
    """One line naming the first line of the file whose `column` is flagged in `bad` (n_rows,), if any."""
    if bad.any():
        row = int(bad.argmax())
        raise RunFolderError(f"{path} line {row + 2}: {column} is {str(frame[column].iloc[row])[:40]!r}, "
                             f"expected {expected}")


def complete_lines(data: bytes) -> bytes:
    """A crash mid-write can leave half a row; only whole lines count."""
    return data[: data.rfind(b"\n") + 1]


def drop_partial_last_line(path: Path) -> None:
    """Cut a file that a kill or a full disk left mid-line back to its last whole line, before
    appending to it (a truncation: it needs no free space)."""
    with writing(path):
        data = path.read_bytes()
        if complete_lines(data) != data:
            os.truncate(path, len(complete_lines(data)))


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    """sha256 of a file, read `chunk` bytes at a time (a model file can be larger than memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
