"""Thread pools sized to the cores this process can actually get.

A decode step is a few hundred short parallel regions (one per matmul, norm, attention), each
ending in a barrier. With as many threads as cores and one other busy process on the box, one
of our threads shares its core with that process: the scheduler runs it for a time slice, then
the neighbour, and every barrier waits for the thread that is off the core. Measured on a
2-core machine, decode then fell to a quarter of its quiet speed at 2 threads, and to about the
same at 1 (docs/performance.md, "Sharing the CPU").
Waiting passively (OMP_WAIT_POLICY=passive) is worse still: a futex wake-up per region costs
more than the region on a virtual machine.

The governor keeps the pools from asking for more threads than there are idle cores: before a
decode step (every few steps) it counts the runnable tasks that are not ours (``procs_running`` in
/proc/stat less our own running threads) and runs on ``cores - others`` threads, at least one.
A busy neighbour then costs its core and no more. torch's intra-op pool is resized in place
(omp/mkl set_num_threads: no thread is created or killed). Two pools keep the size they were
built with: the C row kernel's (rowstep.py; its workers spin while a forward runs) and ONNX
Runtime's (created with spinning off, lowbit_ort.session, so it does not take the core the other
pool needs between two projections).

It is off unless THOR_ADAPT_THREADS=1: torch's kernels do not promise the same bits at another
thread count, so with it a plan may depend on the machine's load, and on the 2-core machine it
was measured on (docs/performance.md, "Sharing the CPU") it did not decode faster beside a busy
process than the fixed pool did. `thor bench --neighbour` measures both.
"""
from __future__ import annotations

import os
import time

import torch

ENV = "THOR_ADAPT_THREADS"


def cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _own_running() -> int:
    """Our threads that are runnable now (state R), spinning pool workers included."""
    n = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # the state follows the command name's closing parenthesis
            if stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"R":
                n += 1
    except OSError:
        return 1
    return max(n, 1)


def others_running() -> int | None:
    """Runnable tasks on the machine that are not this process's (None: not on Linux)."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running"):
                    return max(0, int(line.split()[1]) - _own_running())
    except (OSError, ValueError):
        pass
    return None


def fitting_threads(limit: int, others: int | None, n_cores: int | None = None) -> int:
    """Threads that fit beside ``others`` busy tasks: the idle cores, at least 1, at most ``limit``."""
    if others is None:
        return limit
    return max(1, min(limit, (n_cores or cores()) - others))


class ThreadGovernor:
    """Resizes torch's intra-op pool between decode steps to the cores left idle by others.

    ``tick()`` costs an increment on most steps; every ``every`` steps (and at most every
    ``min_interval_s``) it reads /proc (~20 us). A change needs two readings in a row that agree,
    so one short-lived task does not flip the pool back and forth."""

    def __init__(self, every: int = 8, min_interval_s: float = 0.02):
        self.every, self.min_interval_s = every, min_interval_s
        self.limit = self.current = torch.get_num_threads()
        self.enabled = False
        self._count, self._last, self._pending = 0, 0.0, None
        self.changes = 0

    def start(self) -> None:
        """At a request's start (prefill too): read the machine now, the last request may be long ago."""
        self._sync()
        if self.enabled:
            self._count, self._last = 0, 0.0
            self._decide(force=True)

    def tick(self) -> None:
        """Before a decode step."""
        if not self.enabled:
            return
        self._count += 1
        if self._count % self.every == 0:
            self._sync()
            self._decide()

    def _sync(self) -> None:
        # A pool size we did not set is the caller's (bench's one-thread gate, calib --threads):
        # it becomes the most we use.
        n = torch.get_num_threads()
        if n != self.current:
            self.limit = self.current = n
        self.enabled = os.environ.get(ENV, "0") == "1" and self.limit > 1

    def _decide(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last < self.min_interval_s:
            return
        self._last = now
        want = fitting_threads(self.limit, others_running())
        if want == self.current:
            self._pending = None
        elif force or self._pending == want:
            self._apply(want)
        else:
            self._pending = want

    def _apply(self, n: int) -> None:
        torch.set_num_threads(n)
        self.current, self._pending = n, None
        self.changes += 1
