"""`thor bench --ros`: what the ROS 2 action adds to a plan, measured in one process.

The `thor ros` node runs in this process on a loopback-only ROS graph of its own domain, with a
client node beside it, both spun by one executor. Each of the benchmark's plan requests (the
sample worlds' tasks, ``--ros-plans`` of them, ``--ros-repeats`` times) is planned twice in a
row, in alternating order: through the node's own planner, as `thor plan` plans in a warm
process (the same session, runtime and inputs, no ROS), and as a goal of the ``~/plan`` action
sent by the client, timed from sending the goal to holding its result. Their difference, per
request, is what the action costs; the plans must be the same. While a goal plans, the times
between its feedback messages say how often a robot hears from it.

Needs rclpy and the thor_interfaces package built and sourced (docs/ros.md).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import threading
import time

from thor_runtime.errors import ThorError

NEEDS = (
    "thor bench --ros needs ROS 2's rclpy (pip install -e '.[ros]', or source "
    "/opt/ros/<distro>/setup.bash) and thor_interfaces built and sourced "
    "(deploy/ros/build_interfaces.sh; docs/ros.md)"
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _wait(future, timeout_s: float):
    """The future's result, waiting without polling: a thread that wakes to poll takes the GIL
    from the plan's decoding thread and would be counted as the action's cost."""
    done = threading.Event()
    future.add_done_callback(lambda f: done.set())
    if not done.wait(timeout_s):
        raise ThorError(f"no answer from the node within {timeout_s:.0f} s")
    return future.result()


def gaps(stamps: list[float]) -> list[float]:
    """Seconds between consecutive feedback messages."""
    return [b - a for a, b in zip(stamps, stamps[1:])]


def median_interval(xs: list[float], rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``xs``: how far the median of this many
    differences moves with the machine's noise (a fixed seed: the same rows, the same
    interval)."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(rounds))
    return meds[int(0.025 * rounds)], meds[int(0.975 * rounds) - 1]


def summarize(rows: list[dict]) -> dict:
    """-> medians of the direct and action latencies, the action's overhead (median, its 95%
    interval and p90 of the per-request differences), the part of it outside the plan (goal sent
    to first feedback, last feedback to result), the longest feedback gap, and whether every
    plan matched."""
    extra = sorted(r["action_s"] - r["direct_s"] for r in rows)
    all_gaps = [g for r in rows for g in r["feedback_gaps_s"]]
    ends = [
        r["to_first_feedback_s"] + r["after_last_feedback_s"]
        for r in rows
        if r.get("to_first_feedback_s") is not None and r.get("after_last_feedback_s") is not None
    ]
    low, high = median_interval(extra)
    return {
        "plans": len(rows),
        "direct_p50_s": statistics.median(r["direct_s"] for r in rows),
        "action_p50_s": statistics.median(r["action_s"] for r in rows),
        "overhead_p50_ms": 1000 * statistics.median(extra),
        "overhead_p50_interval_ms": [1000 * low, 1000 * high],
        "overhead_p90_ms": 1000 * extra[min(len(extra) - 1, round(0.9 * (len(extra) - 1)))],
        "outside_plan_p50_ms": 1000 * statistics.median(ends) if ends else None,
        "feedback_gap_max_s": max(all_gaps) if all_gaps else None,
        "feedback_gap_p50_s": statistics.median(all_gaps) if all_gaps else None,
        "same_plans": all(r["same_plan"] for r in rows),
    }


def markdown(s: dict, meta: dict) -> str:
    lo, hi = s["overhead_p50_interval_ms"]
    outside = (
        f"median {s['outside_plan_p50_ms']:.1f} ms" if s["outside_plan_p50_ms"] is not None else "-"
    )
    gap = (
        f"{s['feedback_gap_max_s']:.3f} s (median {s['feedback_gap_p50_s']:.3f} s)"
        if s["feedback_gap_max_s"] is not None
        else "-"
    )
    return (
        f"model {meta['model']}, speculation {meta['spec']}, {s['plans']} plans "
        f"({meta['plans']} requests x {meta['repeats']}), rmw {meta['rmw']}\n\n"
        "| through | p50 latency |\n|---|---|\n"
        f"| the node's planner (as `thor plan`, warm) | {s['direct_p50_s']:.3f} s |\n"
        f"| the `~/plan` action | {s['action_p50_s']:.3f} s |\n\n"
        f"The action's cost per plan: median {s['overhead_p50_ms']:.1f} ms "
        f"(95% interval {lo:.0f} to {hi:.0f} ms), p90 {s['overhead_p90_ms']:.1f} ms; of it, "
        f"outside the plan (goal to first feedback, last feedback to result): {outside}. "
        f"Longest time between feedback messages while planning: {gap}. "
        f"Same plans both ways: {s['same_plans']}.\n"
    )


def run_ros(args) -> int:
    try:
        import rclpy
        from rclpy.executors import MultiThreadedExecutor
        from thor_interfaces.action import Plan
    except ImportError:
        raise ThorError(NEEDS) from None
    from agent.files.loader import AGENT_DIR
    from evals.plan_bench import TASKS
    from thor_app.assembly import with_settings
    from thor_app.flags import config_from_args
    from thor_app.ros.action_client import ActionClient
    from thor_app.ros.node import ThorNode
    from thor_app.tools.bench_report import write_results

    # --spec is the benchmark's list of methods; the node runs the first
    spec = args.spec.split(",")[0].strip()
    config = with_settings(config_from_args(args), speculation__method=spec)
    cases = [(w, t) for w, tasks in TASKS.items() for t in tasks][: args.ros_plans]
    # discovery on loopback only, on a domain of its own: nothing leaves this machine
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ["ROS_LOCALHOST_ONLY"] = "1"
    os.environ.pop("ROS_STATIC_PEERS", None)
    domain = random.SystemRandom().randrange(1, 100)
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain)
    node = client = ex = None
    try:
        node = ThorNode(ctx, config, cli_args=["--ros-args", "-p", "self_test:=false"])
        client = rclpy.create_node("thor_bench_client", context=ctx)
        ex = MultiThreadedExecutor(num_threads=4, context=ctx)
        ex.add_node(node.node)
        ex.add_node(client)
        threading.Thread(target=ex.spin, daemon=True).start()
        _log(f"loading {config.model.name} in the node ...")
        node.start().join()
        if not node.planning.ready:
            raise ThorError(f"the node did not start: {node.planning.reason}")
        action = ActionClient(client, Plan, f"/{node.node.get_name()}/plan")
        if not action.wait_for_server(timeout_sec=30):
            raise ThorError("the node's ~/plan action did not appear")

        def direct(task: str, world_file: str) -> tuple[float, str]:
            inputs = node._inputs(world_file=world_file)
            t0 = time.perf_counter()
            res = node.planning.plan(task, inputs, lambda: False)
            return time.perf_counter() - t0, json.dumps(res.plan, sort_keys=True)

        def through_action(task: str, world_file: str) -> tuple:
            """-> (seconds, the plan, feedback gaps, (to the first feedback, after the last))"""
            stamps: list[float] = []
            goal = Plan.Goal(task=task, world_file=world_file)
            t0 = time.perf_counter()
            heard = lambda msg: stamps.append(time.perf_counter())  # noqa: E731
            handle = _wait(action.send_goal_async(goal, feedback_callback=heard), 60)
            result = _wait(handle.get_result_async(), 600).result
            took = time.perf_counter() - t0
            if not result.valid:
                raise ThorError(f"the action did not plan {task!r}: {result.error}")
            plan = json.loads(result.plan_json) if result.plan_json else None
            ends = (stamps[0] - t0, t0 + took - stamps[-1]) if stamps else (None, None)
            return took, json.dumps(plan, sort_keys=True), gaps(stamps), ends

        # a first plan in each world, untimed: both paths then start warm (its prompt cached)
        for w, task in {w: t for w, t in reversed(cases)}.items():
            direct(task, str(AGENT_DIR / "worlds" / f"{w}.json"))
        rows = []
        for rep in range(args.ros_repeats):
            for i, (w, task) in enumerate(cases):
                world_file = str(AGENT_DIR / "worlds" / f"{w}.json")
                if (i + rep) % 2 == 0:
                    d_s, d_plan = direct(task, world_file)
                    a_s, a_plan, g, ends = through_action(task, world_file)
                else:
                    a_s, a_plan, g, ends = through_action(task, world_file)
                    d_s, d_plan = direct(task, world_file)
                rows.append(
                    {
                        "world": w,
                        "task": task,
                        "direct_s": d_s,
                        "action_s": a_s,
                        "same_plan": d_plan == a_plan,
                        "feedback_gaps_s": g,
                        "to_first_feedback_s": ends[0],
                        "after_last_feedback_s": ends[1],
                    }
                )
                _log(f"{w}: {task!r}: direct {d_s:.3f} s, action {a_s:.3f} s, ends {ends}")
    finally:
        if node is not None:
            node.stopping = True
        if ex is not None:
            ex.shutdown(timeout_sec=5.0)
        if node is not None:
            node.destroy()
        if client is not None:
            client.destroy_node()
        if ctx.ok():
            rclpy.shutdown(context=ctx)
    meta = {
        "model": config.model.name,
        "spec": config.speculation.method,
        "plans": len(cases),
        "repeats": args.ros_repeats,
        "rmw": os.environ.get("RMW_IMPLEMENTATION", "default"),
    }
    s = summarize(rows)
    doc = {"settings": meta, "summary": s, "rows": rows}
    return write_results(args.json_out, doc, markdown(s, meta))
