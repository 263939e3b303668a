"""Thread pools sized to the cores this process can actually get.

A decode step is a few hundred short parallel regions (one per matmul, norm, attention), each
ending in a barrier. With as many threads as cores and one other busy process on the box, one
of our threads shares its core with that process: the scheduler runs it for a time slice, then
the neighbour, and every barrier waits for the thread that is off the core. Measured on a
2-core machine, decode then fell to a quarter of its quiet speed at 2 threads, and to about the
same at 1 (docs/performance.md, "Sharing the CPU").
Waiting passively (OMP_WAIT_POLICY=passive) is worse still: a futex wake-up per region costs
more than the region on a virtual machine.

What follows the idle cores: before a forward (every few) a watch counts the runnable tasks
that are not ours (``procs_running`` in /proc/stat less our own running threads) and asks for
``cores - others`` threads, at least one, so a busy neighbour costs its core and no more. A
core is given up only where the others' CPU time over the last tenth of a second or more shows
them using it (``others_cpu``): the count alone sometimes shows a task that never runs.

- The C row kernel's pool (rowstep.py), by default: its parts are claimed one at a time and
  each part's bits are the same on any thread, so its thread count never changes a result; the
  threads it does not use sleep.
- torch's intra-op pool only with THOR_ADAPT_THREADS=1: torch's kernels do not promise the same
  bits at another thread count (a plan could depend on the machine's load), and on the 2-core
  machine it was measured on (docs/performance.md, "Sharing the CPU") resizing it did not decode
  faster beside a busy process than the fixed pool did. THOR_ADAPT_THREADS=0 fixes every pool.
- ONNX Runtime's pools keep their size; they are created with spinning off
  (lowbit_ort.session), so they do not take the core another pool needs between two calls.

`thor bench --neighbour` measures each.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

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
            if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"R":
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


_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
SHARE_WINDOW_S = 0.1  # the shortest interval a CPU-time share is read over (ticks: 10 ms)


def _cpu_ticks() -> tuple[float, int, int]:
    """(now, busy ticks of the whole machine, ticks of this process): /proc/stat's cpu line
    (user, nice, system, irq, softirq) and /proc/self/stat's utime + stime."""
    now = time.perf_counter()
    with open("/proc/stat", "rb") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    with open("/proc/self/stat", "rb") as f:
        mine = f.read()
    fields = mine[mine.rfind(b")") + 2 :].split()
    return now, v[0] + v[1] + v[2] + v[5] + v[6], int(fields[11]) + int(fields[12])


def others_cpu(since):
    """-> (cores the machine's other tasks kept busy since the reading ``since``, or None when
    unknown or the interval is shorter than SHARE_WINDOW_S; the reading to pass next time)."""
    try:
        now = _cpu_ticks()
    except (OSError, ValueError, IndexError):
        return None, None
    if since is None or now[0] - since[0] < SHARE_WINDOW_S:
        return None, since or now
    busy, mine = now[1] - since[1], now[2] - since[2]
    return max(0.0, (busy - mine) / _HZ / (now[0] - since[0])), now


def fitting_threads(limit: int, others: int | None, n_cores: int | None = None) -> int:
    """Threads that fit beside ``others`` busy tasks: the idle cores, at least 1, at most
    ``limit``."""
    if others is None:
        return limit
    return max(1, min(limit, (n_cores or cores()) - others))


def adapt_mode() -> str:
    """Which pools follow the idle cores (THOR_ADAPT_THREADS): "exact" (unset, the default):
    only pools whose results do not depend on their thread count (the row kernel's); "all"
    ("1"): torch's intra-op pool too; "off" ("0"): none."""
    return {"1": "all", "0": "off"}.get(os.environ.get(ENV, ""), "exact")


class FitWatch:
    """How many of ``limit`` threads fit beside the machine's other busy tasks, re-read every
    ``every`` calls (and at most every ``min_interval_s``) from /proc (~20-100 us). A change
    needs two readings in a row that agree, so one short-lived task does not flip a pool back
    and forth; ``poll(force=True)`` takes one reading as it is (a request's start)."""

    def __init__(self, limit: int, every: int = 8, min_interval_s: float = 0.02):
        self.limit = self.current = max(1, limit)
        self.every, self.min_interval_s = every, min_interval_s
        self._count, self._last, self._pending = 0, 0.0, None
        self.changes = 0
        self._since, self._share = None, None  # others' CPU time: the last reading, their cores

    def reset(self, limit: int) -> None:
        self.limit = self.current = max(1, limit)
        self._count, self._last, self._pending = 0, 0.0, None

    def _taken(self, want: int) -> int:
        """``want`` where the others' CPU time shows them using the cores it leaves them; else
        the current count. A task counted runnable need not run: measured with four sequences
        sharing rounds on 2 cores and no other process, a quarter of the readings counted one
        more runnable task than there was, and the row kernel ran 11-37% of its rounds on one
        thread. A busy neighbour also takes CPU time; that phantom took none."""
        share, self._since = others_cpu(self._since)
        self._share = share if share is not None else self._share
        if want >= self.current or self._share is None:
            return want
        return want if self._share >= 0.5 * (self.current - want) else self.current

    def poll(self, force: bool = False) -> int | None:
        """-> the new thread count when it changes now, else None."""
        self._count += 1
        if not force and self._count % self.every:
            return None
        now = time.perf_counter()
        if not force and now - self._last < self.min_interval_s:
            return None
        self._last = now
        want = self._taken(fitting_threads(self.limit, others_running()))
        if want == self.current:
            self._pending = None
            return None
        if force or self._pending == want:
            self.current, self._pending = want, None
            self.changes += 1
            return want
        self._pending = want
        return None


class ThreadGovernor:
    """Resizes torch's intra-op pool between decode steps to the cores left idle by others
    (only with THOR_ADAPT_THREADS=1: torch's bits depend on its thread count)."""

    def __init__(self, every: int = 8, min_interval_s: float = 0.02):
        self.watch = FitWatch(torch.get_num_threads(), every, min_interval_s)
        self.enabled = False

    @property
    def limit(self) -> int:
        return self.watch.limit

    @property
    def current(self) -> int:
        return self.watch.current

    @property
    def changes(self) -> int:
        return self.watch.changes

    def start(self) -> None:
        """At a request's start (prefill too): read the machine now, the last request may be long
        ago."""
        self._sync()
        if self.enabled:
            self._apply(self.watch.poll(force=True))

    def tick(self) -> None:
        """Before a decode step."""
        if self.enabled:
            self._sync()
            self._apply(self.watch.poll())

    def _sync(self) -> None:
        # A pool size we did not set is the caller's (bench's one-thread gate, calib --threads):
        # it becomes the most we use. One a drafter holds for a moment (one_torch_thread) is not.
        if one_torch_thread.busy:
            return
        n = torch.get_num_threads()
        if n != self.watch.current:
            self.watch.reset(n)
        self.enabled = adapt_mode() == "all" and self.watch.limit > 1

    def _apply(self, n: int | None) -> None:
        if n is not None:
            torch.set_num_threads(n)


class _OneTorchThread:
    """torch's intra-op pool at one thread inside ``one_torch_thread()``, the caller's count after.

    Why: after a parallel op torch's OpenMP threads keep spinning for a while, on the cores the
    row kernel's threads need for the verify that follows; a drafter's small matmuls on one
    thread cost less than that spin (a speculative plan decoded ~7% faster in an in-process
    A/B, docs/speculative-decoding.md). Under OpenMP torch's thread count is the calling
    thread's own, so concurrent sequences each set and restore their own; nested use keeps the
    outermost caller's count."""

    def __init__(self):
        self._local = threading.local()

    @property
    def busy(self) -> bool:
        """This thread is inside."""
        return getattr(self._local, "depth", 0) > 0

    @contextmanager
    def __call__(self):
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth == 0:
            local.saved = torch.get_num_threads()
            torch.set_num_threads(1)
        local.depth = depth + 1
        try:
            yield
        finally:
            local.depth = depth
            if depth == 0:
                torch.set_num_threads(local.saved)


one_torch_thread = _OneTorchThread()
