"""A training step that never returns becomes one line, not a process that waits forever.

XLA on the CPU has hung for good inside a step (the main thread waiting on the step's result,
every worker idle: jax issues 24255 and 25861; loop.py's `require_jax` avoids the one kind seen
here). No exception can reach a thread blocked in native code, so a thread of its own watches
for progress and, after `limit_s` without any, hands a `TrainingStalled` to the caller, whose
only remedy is to end the process: the checkpoint of the last evaluation is on disk and the
same command resumes from it.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from kvphase.errors import KvphaseError

# far above any step, evaluation or compilation of the study's runs (the slowest, at 768 tokens, took 5 s a step)
STALL_LIMIT_S = 600.0


class TrainingStalled(KvphaseError):
    """No step, evaluation or checkpoint finished within the stall limit."""


class Watchdog:
    """Calls `on_stall(idle_s)` from its own thread once `beat()` has not been called for
    `limit_s` seconds of the process running, counted from the first beat: before it the first
    step compiles, which a large model may take minutes for on a busy machine. Time the process
    spent stopped (Ctrl-Z, SIGSTOP, a laptop asleep) is not counted: the watching thread sees it
    as one long gap between two of its own wake-ups, which a running process never shows."""

    def __init__(self, limit_s: float, on_stall: Callable[[float], None], clock: Callable[[], float] = time.monotonic):
        self.limit_s, self.on_stall, self.clock = limit_s, on_stall, clock
        self.poll_s = min(limit_s / 20, 5.0)
        self._last_beat: float | None = None
        self._last_look = clock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kvphase-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def beat(self) -> None:
        self._last_beat = self.clock()

    def idle(self) -> float:
        """Seconds of running since the last beat, as of now; a gap between two looks far longer
        than the poll is time stopped, taken off."""
        now = self.clock()
        gap, self._last_look = now - self._last_look, now
        if self._last_beat is None:
            return 0.0
        if gap > 3 * self.poll_s + 1.0:
            self._last_beat += gap - self.poll_s
        return now - self._last_beat

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            idle = self.idle()
            if idle > self.limit_s:
                self.on_stall(idle)
                return
