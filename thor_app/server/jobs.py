"""The service's job queue: generation workers, threads that take jobs from a bounded queue,
``workers`` of them at once (``limits.batch``; their sequences share the target's forwards, see
thor_runtime/engine/inflight.py). (Not to be confused with engines/, the backends the model's
segments run on.)

Generation is CPU-bound and blocking, so it runs off the event loop, which keeps answering
/health and /metrics. A job is a plain function of a ``JobContext``; it calls ``ctx.check()``
once per committed token (the runtime's ``on_token``) and between prefill chunks (its
``on_prefill``), which raises ``Cancelled`` when the client has gone, the request's deadline
has passed or the server is stopping: the generation ends within one cycle or chunk and its KV
cache, a local of the unwound call, is freed with it.

The request is answered on time even while the worker is inside a chunk: at the deadline (or
on a shutdown) the loop fails the job's future itself (``Job.fail``), and the worker's late
result is dropped.

Each check also records progress; the watchdog reads it to tell a slow generation from a hung
one, so a long prompt's prefill counts as progress chunk by chunk, and any running job's
progress counts.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


class Cancelled(Exception):
    """A job stopped before it finished; ``reason`` is disconnect, timeout or shutdown."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class QueueFull(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"queue full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(eq=False)  # identity: jobs live in a set
class Job:
    fn: Callable[["JobContext"], Any]
    deadline: float  # monotonic
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    cancel_reason: str | None = None  # set from the event loop; read by the worker
    started: bool = False
    tokens: int = 0  # committed tokens seen by check()
    _lock: threading.Lock = field(default_factory=threading.Lock)

    timer: asyncio.TimerHandle | None = None

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self.cancel_reason is None:
                self.cancel_reason = reason

    def fail(self, reason: str) -> None:
        """On the loop: stop the job and answer its request now, not when the worker next checks."""
        self.cancel(reason)
        if not self.future.done():
            self.future.set_exception(Cancelled(reason))


class JobContext:
    """What a running job sees: ``check()`` per committed token."""

    def __init__(self, job: Job, queue: "JobQueue"):
        self.job, self.queue = job, queue

    def check(self, token: int | None = None) -> None:
        now = self.queue.clock()
        self.queue.last_progress = now
        if token is not None:
            self.job.tokens += 1
        if self.job.cancel_reason is not None:
            raise Cancelled(self.job.cancel_reason)
        if now > self.job.deadline:
            raise Cancelled("timeout")


class JobQueue:
    """submit() from the event loop; results come back as asyncio futures."""

    def __init__(
        self,
        queue_size: int,
        clock: Callable[[], float] = time.monotonic,
        on_cancel: Callable[[str, int], None] | None = None,
        workers: int = 1,
    ):
        """on_cancel(reason, tokens committed before the stop): called in a worker thread.
        workers: jobs running at once."""
        if workers < 1:
            raise ValueError(f"a job queue needs at least one worker, got {workers}")
        self.clock, self.on_cancel, self.workers = clock, on_cancel, workers
        # (-priority, arrival, job): a higher priority first, then first come first served
        self._q: queue.PriorityQueue = queue.PriorityQueue(maxsize=queue_size)
        self._arrival = itertools.count()
        self._threads: list[threading.Thread] = []
        self.running: set[Job] = set()
        self._count = threading.Lock()  # the counters below, from several workers
        self.last_progress = clock()
        self.completed = 0
        self.cancelled: dict[str, int] = {}
        self._mean_job_s = 1.0  # running mean, for Retry-After
        self._stopping = False
        self.pending: set[Job] = set()  # submitted, not yet answered (the loop's side)

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._work, name=f"thor-generate-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()

    def stop(self, cancel_running: bool, timeout_s: float = 30.0) -> None:
        """Refuse new jobs, cancel the queued ones, optionally cancel the running ones, join."""
        self._stopping = True
        while True:
            try:
                *_, job = self._q.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel("shutdown")
                self._finish(job, exc=Cancelled("shutdown"))
        if cancel_running:
            for job in list(self.running):
                job.cancel("shutdown")
        for _ in self._threads:
            self._q.put((float("-inf"), next(self._arrival), None))  # ahead of everything: stop
        end = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))

    # ---- state the event loop reads ----------------------------------------------------------
    @property
    def depth(self) -> int:
        """Jobs waiting for a worker."""
        return self._q.qsize()

    @property
    def busy(self) -> bool:
        return bool(self.running)

    def stalled_for(self) -> float:
        """Seconds since a running job last made progress (0 when idle)."""
        return self.clock() - self.last_progress if self.running else 0.0

    def retry_after(self) -> int:
        return max(1, int(round(self._mean_job_s * (self.depth + 1) / self.workers)))

    # ---- submitting --------------------------------------------------------------------------
    def submit(self, fn: Callable[[JobContext], Any], timeout_s: float, priority: int = 0) -> Job:
        """priority: a higher one runs before the queued lower ones (never preempts the running
        job)."""
        loop = asyncio.get_running_loop()
        job = Job(fn, self.clock() + timeout_s, loop, loop.create_future())
        if self._stopping:
            raise QueueFull(self.retry_after())
        try:
            self._q.put_nowait((-priority, next(self._arrival), job))
        except queue.Full:
            raise QueueFull(self.retry_after()) from None
        self.pending.add(job)
        job.timer = loop.call_later(timeout_s, job.fail, "timeout")
        job.future.add_done_callback(lambda f: self._settled(job))
        return job

    def _settled(self, job: Job) -> None:
        self.pending.discard(job)
        if job.timer is not None:
            job.timer.cancel()
        if job.future.done() and not job.future.cancelled():
            job.future.exception()  # retrieved: a request that left has nobody to read it

    def refuse_new(self) -> None:
        self._stopping = True

    def fail_all(self, reason: str, running: bool) -> int:
        """On the loop: answer every queued job (and the running one too if ``running``) with
        ``Cancelled(reason)`` now. -> how many."""
        n = 0
        for job in list(self.pending):
            if running or not job.started:
                job.fail(reason)
                n += 1
        return n

    # ---- the worker thread -------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            *_, job = self._q.get()
            if job is None:
                return
            if job.cancel_reason is not None or self.clock() > job.deadline:
                self._finish(job, exc=Cancelled(job.cancel_reason or "timeout"))
                continue
            job.started = True
            self.running.add(job)
            t0 = self.last_progress = self.clock()
            try:
                result = job.fn(JobContext(job, self))
            except BaseException as e:  # handed to the request; the worker lives on
                self._finish(job, exc=e)
            else:
                self._finish(job, result=result)
            finally:
                self.running.discard(job)
                with self._count:
                    self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (self.clock() - t0)

    def _finish(self, job: Job, result=None, exc: BaseException | None = None) -> None:
        with self._count:
            if isinstance(exc, Cancelled):
                self.cancelled[exc.reason] = self.cancelled.get(exc.reason, 0) + 1
            else:
                self.completed += 1
        if isinstance(exc, Cancelled) and self.on_cancel is not None:
            self.on_cancel(exc.reason, job.tokens)

        def deliver():
            if job.future.done():  # the handler is gone (client disconnected)
                return
            if exc is not None:
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)

        try:
            job.loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass
