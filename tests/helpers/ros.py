"""The ROS 2 tests' helpers: a loopback-only ROS graph on a domain of its own, a scripted runtime
that generates slowly enough to be cancelled, the node in-process, small action servers that
stand in for a robot, and waiting on rclpy futures."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from contextlib import contextmanager

import pytest

from tests.helpers.worlds import good_plan
from thor_runtime.engine.generate import Result
from thor_runtime.engine.stats import Stats

# a valid plan for "put the apple on the table" in the kitchen, as the scripted runtime says it
GOOD = json.dumps(good_plan())
INTERFACES_HINT = (
    "thor_interfaces is not built and sourced: deploy/ros/build_interfaces.sh, then source "
    "build/ros/install/share/thor_interfaces/local_setup.bash"
)


def need_rclpy():
    return pytest.importorskip(
        "rclpy",
        reason="ROS 2's rclpy is not importable: pip install -e '.[ros]' "
        "(x86_64) or source /opt/ros/<distro>/setup.bash",
    )


def need_interfaces():
    need_rclpy()
    return pytest.importorskip("thor_interfaces.action", reason=INTERFACES_HINT)


def loopback_env(env=None) -> dict:
    """Discovery on this machine only, for rclpy in this process and for a child's environment."""
    env = os.environ if env is None else env
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env.pop("ROS_STATIC_PEERS", None)
    env["ROS_LOCALHOST_ONLY"] = "1"  # Jazzy's spelling; Kilted reads the range above
    return env


def random_domain() -> int:
    return random.SystemRandom().randrange(1, 100)


@contextmanager
def ros_context(domain: int):
    import rclpy

    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain)
    try:
        yield ctx
    finally:
        if ctx.ok():
            rclpy.shutdown(context=ctx)


class SlowScript:
    """Stands in for Runtime: answers each generate() with the next scripted text (the last again
    once they run out), one token every ``per_token_s``, each through ``on_token`` as the runtime
    does. ``active``: generations running now; ``stopped``: those ended by an exception."""

    model = None  # no prefix cache: the session attaches nothing

    def __init__(self, tok, texts, per_token_s: float = 0.0):
        self.tok, self.texts, self.per_token_s = tok, list(texts), per_token_s
        self.calls = self.active = self.stopped = 0
        self.prompts = []

    def generate(
        self, prompt_ids, params, speculation=None, constraint=None, on_token=None, on_prefill=None
    ):
        self.active += 1
        try:
            if on_prefill is not None:
                on_prefill(len(prompt_ids))
            text = self.texts[min(self.calls, len(self.texts) - 1)]
            self.calls += 1
            self.prompts.append(self.tok.decode(prompt_ids))
            ids = self.tok.encode(text, add_special=False) + [self.tok.eos_token_ids[0]]
            for t in ids:
                if self.per_token_s:
                    time.sleep(self.per_token_s)
                if on_token is not None:
                    on_token(t)
            return Result(
                ids,
                self.tok.decode(ids),
                "eos",
                len(prompt_ids),
                Stats(prompt_tokens=len(prompt_ids), generated=len(ids)),
            )
        except BaseException:
            self.stopped += 1
            raise
        finally:
            self.active -= 1


def scripted_build(loaded, runtime):
    """A Planning ``build``: the scripted runtime over the tiny model's tokenizer, assembled as
    thor_app.assembly assembles a real one."""
    from thor_app.assembly import assembled_with

    return lambda config: assembled_with(config, loaded, runtime)


class Report:
    def __init__(self, passed: bool, note: str = "2/2 parity checks"):
        self.passed, self.note = passed, note

    def summary(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}: {self.note}"


def ros_config(**changes):
    """The table's defaults, but plain decoding (no drafter for the tiny model), greedy goals and
    nothing kept on disk."""
    from thor_app.assembly import with_settings
    from thor_runtime.config import RuntimeConfig

    base = dict(speculation__method="none", model__weight_cache="", model__world_starts=0)
    return with_settings(RuntimeConfig(), **{**base, **changes})


def wait_for(cond, timeout_s: float = 10.0, what: str = "the condition"):
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def result_of(future, timeout_s: float = 20.0):
    wait_for(future.done, timeout_s, "a ROS future")
    return future.result()


class Spinning:
    """Nodes spun by a multi-threaded executor in a thread, until closed."""

    def __init__(self, context, *nodes, threads: int = 8):
        from rclpy.executors import MultiThreadedExecutor

        self.ex = MultiThreadedExecutor(num_threads=threads, context=context)
        for n in nodes:
            self.ex.add_node(n)
        self.thread = threading.Thread(target=self.ex.spin, daemon=True)
        self.thread.start()

    def add(self, node):
        self.ex.add_node(node)

    def close(self):
        self.ex.shutdown(timeout_sec=5.0)
        self.thread.join(5.0)


class FakeRobot:
    """Action servers of test_msgs/action/Fibonacci standing in for a robot's skills. Each server
    does what its script says, goal after goal: "ok" (succeeds at once), "abort", "hang" (never
    ends: only a cancel ends it), "slow:S" (succeeds after S seconds). A script runs out on its
    last entry. ``goals``: (action, order) as received; ``cancels``: actions whose goal was
    cancelled."""

    def __init__(self, node, scripts: dict[str, list[str]]):
        from rclpy.action import ActionServer, CancelResponse, GoalResponse
        from rclpy.callback_groups import ReentrantCallbackGroup
        from test_msgs.action import Fibonacci

        self.Fibonacci = Fibonacci
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.goals: list[tuple[str, int]] = []
        self.cancels: list[str] = []
        self.servers = []
        group = ReentrantCallbackGroup()
        for name in scripts:
            self.servers.append(
                ActionServer(
                    node,
                    Fibonacci,
                    name,
                    self._execute(name),
                    callback_group=group,
                    goal_callback=lambda g: GoalResponse.ACCEPT,
                    cancel_callback=lambda h: CancelResponse.ACCEPT,
                )
            )

    def _next(self, name: str) -> str:
        s = self.scripts[name]
        return s.pop(0) if len(s) > 1 else s[0]

    def _execute(self, name: str):
        def run(handle):
            self.goals.append((name, handle.request.order))
            what = self._next(name)
            result = self.Fibonacci.Result(sequence=[handle.request.order])
            fb = self.Fibonacci.Feedback(sequence=[0, 1])
            handle.publish_feedback(fb)
            if what == "abort":
                handle.abort()
                return result
            seconds = (
                float(what.split(":")[1])
                if what.startswith("slow:")
                else (1e9 if what == "hang" else 0)
            )
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if handle.is_cancel_requested:
                    self.cancels.append(name)
                    handle.canceled()
                    return result
                time.sleep(0.01)
            handle.succeed()
            return result

        return run

    def destroy(self):
        for s in self.servers:
            s.destroy()


def feedback_log(into: list):
    """A feedback callback keeping (time, feedback) pairs."""
    return lambda m: into.append((time.monotonic(), m.feedback))
