"""The node's planner: the runtime built once, its plan session, readiness, and one plan at a time.

Start-up goes loading -> self_test -> ready, or to failed with the reason, as the service's does
(thor_app/server/host.py): the node is never ready without a passing self-test unless its
``self_test`` parameter is off. The runtime is built as every command builds its own
(thor_app/assembly.py), and what lives across plans (prompt starts, world starts, what
``--spec auto`` learned) is its PlanSession (thor_app/session.py).

Plans run one at a time (one model); the others wait in a bounded queue. A goal is cancelled
through the runtime's token hook: every committed token, and every prefill chunk, checks the
goal's ``cancelled()`` and raises ``Cancelled`` when it is set, so the generation ends within a
cycle or a chunk and its KV cache is freed with it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from thor_runtime.config import RuntimeConfig
from thor_runtime.errors import ThorError

# feedback while generating: at most this often from the token hook (the node's heartbeat
# repeats the latest one between tokens)
PROGRESS_EVERY_S = 0.1


class Cancelled(Exception):
    """The goal was cancelled (or the node is stopping) while it waited or generated."""


@dataclass(frozen=True)
class Progress:
    phase: str  # queued, planning, valid, rejected
    tokens: int = 0
    detail: str = ""


def default_build(config: RuntimeConfig):
    """The runtime of ``config`` (thor_app.assembly), warmed up as the service warms its own. A
    prefill in one pass would let nothing stop or mark a long prompt meanwhile: the service's
    chunk then, so a cancel acts between chunks."""
    from agent.schema.grammar import GrammarTokenizer
    from thor_app.assembly import build_runtime
    from thor_app.server.host import SERVICE_PREFILL_CHUNK, Hosted, ModelHost

    if not config.model.prefill_chunk:
        config = replace(config, model=replace(config.model, prefill_chunk=SERVICE_PREFILL_CHUNK))
    a = build_runtime(config)
    ModelHost.warm_up(
        Hosted(a.loaded, a.runtime, a.speculation, a.backend), GrammarTokenizer(a.loaded.tokenizer)
    )
    return a


def default_selftest(loaded, backend):
    """The on-device parity check in its quick form, as the service runs it before it is ready."""
    from engines.selftest import run_selftest

    return run_selftest(loaded, backend=backend if backend is not None else "torch", quick=True)


class _Checked:
    """The runtime as the node's planner sees it: every generate also checks the goal between
    prefill chunks (the planner passes only ``on_token``). ``check`` is the running goal's."""

    def __init__(self, runtime):
        self._rt = runtime
        self.check: Callable[[], None] = lambda: None

    def __getattr__(self, name):
        return getattr(self._rt, name)

    def generate(self, *args, **kw):
        check = self.check
        return self._rt.generate(*args, on_prefill=lambda rows: check(), **kw)


class Planning:
    """``build(config) -> Assembled`` and ``selftest(loaded, backend) -> report`` are injectable
    (a scripted runtime in tests). ``log(msg)``: what the node logs."""

    def __init__(
        self,
        config: RuntimeConfig,
        build=None,
        selftest=None,
        self_test: bool = True,
        queue_size: int = 4,
        default_skills: str = "",
        log: Callable[[str], None] | None = None,
    ):
        self.config = config
        self.build = build or default_build
        self.selftest = selftest or default_selftest
        self.self_test, self.queue_size, self.default_skills = self_test, queue_size, default_skills
        self.log = log or (lambda msg: None)
        self.status, self.reason = "starting", "the model has not been loaded yet"
        self.report = None  # the self-test's report
        self.assembled = self.session = self.planner = None
        self.plans = 0  # plans answered
        self.cancelled = 0  # goals cancelled while waiting or generating
        self.running: str | None = None  # the task planning now
        self._plan_lock = threading.Lock()
        self._count = threading.Lock()
        self._waiting = 0
        self._checked = None
        self._tokens, self._shown = 0, 0.0
        self._sink: Callable[[Progress], None] = lambda p: None

    # ---- start-up ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def waiting(self) -> int:
        return self._waiting

    def _set(self, status: str, reason: str) -> None:
        self.status, self.reason = status, reason
        self.log(f"{status}: {reason}")

    def start(self) -> bool:
        """Load, attach the default skills' prompt start, self-test (blocking: run it in a
        thread)."""
        from thor_app.default_model import choose_default
        from thor_app.session import PlanSession

        try:
            # the rule `thor plan` and `thor serve` apply to an unnamed model, said in the log
            self.config = choose_default(self.config, self.log)
            self._set("loading", f"loading model {self.config.model.name}")
            a = self.build(self.config)
            session = PlanSession(a, log=self.log, save_every_s=60.0)
            from thor_app.ros.inputs import read_skills

            session.attach(read_skills(default=self.default_skills)[0])
            session.load_learned()
            self._checked = _Checked(a.runtime)
            planner = session.planner(runtime=self._checked, on_progress=self._attempt)
        except Exception as e:  # noqa: BLE001 - any start-up failure is reported, never served past
            return self._failed("start-up failed", e)
        if self.self_test:
            try:
                self._set("self_test", "running the on-device self-test")
                served = a.backend if a.backend is not None else a.config.engine.backend
                report = self.selftest(a.loaded, served)
            except Exception as e:  # noqa: BLE001 - a self-test that cannot run has not passed
                return self._failed("self-test failed", e)
            self.report = report
            if not getattr(report, "passed", False):
                self._set("failed", f"self-test failed: {summary(report)}")
                return False
        self.assembled, self.session, self.planner = a, session, planner
        self._set(
            "ready",
            (
                f"self-test passed: {summary(self.report)}"
                if self.self_test
                else "ready (self-test off)"
            ),
        )
        return True

    def _failed(self, what: str, e: Exception) -> bool:
        msg = str(e) if isinstance(e, ThorError) else f"{type(e).__name__}: {e}"
        self._set("failed", f"{what}: {msg}")
        return False

    def _attempt(self, msg: str) -> None:
        """The planner's word after each attempt ("attempt 1/3: 41 tokens, valid")."""
        self._sink(Progress("planning", self._tokens, msg))

    def save(self) -> None:
        """At shutdown: what auto learned and the world starts, for the next process."""
        if self.session is not None:
            self.session.save_every_s = 0.0
            self.session.after_plan()

    # ---- plans ------------------------------------------------------------------------------
    def plan(
        self,
        task: str,
        inputs,
        cancelled: Callable[[], bool],
        progress: Callable[[Progress], None] = lambda p: None,
    ):
        """One plan for ``task`` in ``inputs`` (thor_app.ros.inputs.Inputs) -> PlanResult.
        Raises ThorError for bad input or a node that is not ready, Cancelled when ``cancelled()``
        turns true while the goal waits or generates."""
        from agent.planner import specialize_request
        from agent.schema.grammar import check_schema

        if not self.ready:
            raise ThorError(f"the planner is not ready ({self.status}: {self.reason})")
        # the request is read and its schema specialized before the goal waits for the model:
        # bad input is answered at once
        request = specialize_request(
            task,
            inputs.world,
            inputs.skills,
            None,
            self.config.planner.max_steps or None,
            self.config.planner.lexicon,
        )
        check_schema(request.schema)
        self._enter(cancelled, progress)
        try:

            def check(token=None):
                if cancelled():
                    raise Cancelled()
                if token is not None:
                    self._tokens += 1
                    now = time.monotonic()
                    if now - self._shown >= PROGRESS_EVERY_S:
                        self._shown = now
                        progress(Progress("planning", self._tokens))

            self._tokens, self._shown, self._sink, self.running = 0, 0.0, progress, task
            self._checked.check = check
            progress(Progress("planning", 0))
            try:
                res = self.session.plan(request, planner=self.planner, on_token=check)
            except Cancelled:
                self.cancelled += 1
                raise
            finally:
                self._checked.check = lambda: None
                self._sink, self.running = (lambda p: None), None
                self.session.after_plan()
            self.plans += 1
            progress(Progress("valid" if res.valid else "rejected", self._tokens))
            return res
        finally:
            self._plan_lock.release()

    def _enter(self, cancelled, progress) -> None:
        """Wait for the model (one plan at a time), at most ``queue_size`` goals waiting."""
        if self._plan_lock.acquire(blocking=False):
            return
        with self._count:
            if self._waiting >= self.queue_size:
                raise ThorError(f"busy: {self._waiting} goals are already waiting for the model")
            self._waiting += 1
        try:
            progress(Progress("queued"))
            while not self._plan_lock.acquire(timeout=0.05):
                if cancelled():
                    self.cancelled += 1
                    raise Cancelled()
        finally:
            with self._count:
                self._waiting -= 1

    def describe(self) -> dict:
        """What diagnostics report: readiness, the self-test, the work."""
        out = {
            "status": self.status,
            "reason": self.reason,
            "model": self.config.model.name,
            "plans": self.plans,
            "cancelled": self.cancelled,
            "waiting": self._waiting,
            "planning": self.running or "",
        }
        if self.report is not None:
            out["self_test"] = summary(self.report)
        elif not self.self_test:
            out["self_test"] = "off"
        return out


def summary(report) -> str:
    """The report's first line (the service's /health says the same)."""
    if report is None:
        return "(none)"
    s = getattr(report, "summary", None)
    text = s() if callable(s) else str(report)
    return text.strip().splitlines()[0] if text.strip() else "(no summary)"
