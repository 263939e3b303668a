"""`thor ros` as the launch file starts it: a real process on the embedded default model, its
parameters from the shipped file. An action client on the same loopback graph waits for the
node's diagnostics to say ready, gets a valid plan, cancels a second goal mid-generation, and
SIGTERM ends the process with exit 0."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.ros import feedback_log, loopback_env, result_of, wait_for

LAUNCH = ROOT / "deploy" / "ros" / "thor_ros.launch.xml"


def launch_argv() -> list[str]:
    """The launch file's command with its defaults, `thor` run by this Python."""
    root = ET.parse(LAUNCH).getroot()
    cmd = root.find("executable").get("cmd")
    for a in root.iter("arg"):
        cmd = cmd.replace(f"$(var {a.get('name')})", a.get("default"))
    argv = shlex.split(cmd.replace("$(dirname)", str(LAUNCH.parent)))
    return [sys.executable, "-m", "thor_app.cli", *argv[1:]]


@pytest.mark.slow
def test_the_launched_node_plans_cancels_and_stops(ros, interfaces):
    import rclpy
    from action_msgs.msg import GoalStatus
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
    from rclpy.executors import SingleThreadedExecutor

    from thor_app.ros.action_client import ActionClient

    Plan = interfaces[0]
    env = loopback_env(dict(os.environ))
    # the model's own settings from the shipped file, but no drafter to train or load here
    argv = launch_argv() + ["-p", "speculation.method:=none"]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    client = rclpy.create_node("thor_process_client", context=ros)
    ex = SingleThreadedExecutor(context=ros)
    ex.add_node(client)
    import threading

    spinner = threading.Thread(target=ex.spin, daemon=True)
    spinner.start()
    try:
        seen = []
        client.create_subscription(
            DiagnosticArray,
            "/diagnostics",
            lambda m: seen.extend(s for s in m.status if s.name == "thor: planner"),
            10,
        )
        wait_for(
            lambda: seen and seen[-1].level != DiagnosticStatus.WARN or proc.poll() is not None,
            240,
            "the node to be ready",
        )
        assert proc.poll() is None and seen[-1].level == DiagnosticStatus.OK, seen[-1].message
        assert "PASS" in {kv.key: kv.value for kv in seen[-1].values}["self_test"]
        c = ActionClient(client, Plan, "/thor/plan")
        assert c.wait_for_server(20)
        goal = Plan.Goal(
            task="Put the red cup in the sink.", world_file=str(ROOT / "agent/worlds/kitchen.json")
        )
        fbs = []
        handle = result_of(c.send_goal_async(goal, feedback_callback=feedback_log(fbs)), 30)
        res = result_of(handle.get_result_async(), 120)
        assert res.status == GoalStatus.STATUS_SUCCEEDED and res.result.valid, res.result.error
        times = [t for t, f in fbs if f.phase == "planning"]
        assert len(times) >= 2 and max(b - a for a, b in zip(times, times[1:])) <= 0.5
        # a second goal, cancelled once it generates: it ends within a second
        fbs.clear()
        handle = result_of(c.send_goal_async(goal, feedback_callback=feedback_log(fbs)), 30)
        wait_for(lambda: any(f.tokens > 0 for _, f in fbs), 60, "tokens in the feedback")
        t0 = time.monotonic()
        result_of(handle.cancel_goal_async(), 10)
        res = result_of(handle.get_result_async(), 10)
        assert res.status == GoalStatus.STATUS_CANCELED and time.monotonic() - t0 < 1.0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        ex.shutdown(timeout_sec=5)
        client.destroy_node()
    assert proc.returncode == 0, out[-2000:]
    assert "ready: self-test passed" in out
