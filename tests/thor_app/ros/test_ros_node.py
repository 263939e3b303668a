"""`thor ros` on a real ROS 2 graph (loopback, a domain of its own per test): the plan action, the
one-shot service, the JSON topics, cancelling, bad goals, the world topic, diagnostics and the
parameters. The node runs in-process over a scripted runtime (the plan it says is fixed), so
what is tested is the node, not a model."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.ros import GOOD, Report, feedback_log, result_of, wait_for
from tests.helpers.worlds import WORLDS, good_plan, kitchen_dict

TASK = "put the apple on the table"
KITCHEN = str(WORLDS["kitchen"])


def send(client_node, action_type, name, goal, feedback=None, server_wait_s=10.0):
    from thor_app.ros.action_client import ActionClient

    c = ActionClient(client_node, action_type, name)
    assert c.wait_for_server(server_wait_s), f"no action server {name}"
    handle = result_of(c.send_goal_async(goal, feedback_callback=feedback))
    assert handle.accepted
    return handle


def expected_document(loaded):
    """What `thor plan --json` answers for TASK in the kitchen with the same scripted runtime."""
    from agent.files.loader import load_skills, load_world, resolve_skills_path
    from tests.helpers.ros import SlowScript, ros_config
    from thor_app.assembly import assembled_with
    from thor_app.session import PlanSession

    world = load_world(KITCHEN)
    skills = load_skills(resolve_skills_path(world, None))
    session = PlanSession(
        assembled_with(ros_config(), loaded, SlowScript(loaded.tokenizer, [GOOD])), shelf=None
    )
    return session.plan(TASK, world, skills).document()


def test_the_plan_action_answers_the_plan_thor_plan_answers(thor, interfaces, tiny_llama_long):
    from action_msgs.msg import GoalStatus

    Plan = interfaces[0]
    t = thor(per_token_s=0.01)  # ~1 s of generation: feedback must keep coming meanwhile
    fbs = []
    handle = send(
        t.client, Plan, "/thor/plan", Plan.Goal(task=TASK, world_file=KITCHEN), feedback_log(fbs)
    )
    res = result_of(handle.get_result_async())
    assert res.status == GoalStatus.STATUS_SUCCEEDED and res.result.error == ""
    want = expected_document(tiny_llama_long)
    doc = json.loads(res.result.document_json)
    assert res.result.valid and json.loads(res.result.plan_json) == want["plan"] == good_plan()
    assert json.loads(res.result.report_json) == [] and doc["plan"] == want["plan"] and doc["valid"]
    assert res.result.run_json == ""
    # feedback comes on a topic of its own: the last may arrive after the result
    wait_for(lambda: fbs and fbs[-1][1].phase == "valid", 10, "the last feedback")
    phases = [f.phase for _, f in fbs]
    assert phases[0] == "planning" and phases[-1] == "valid"
    tokens = [f.tokens for _, f in fbs if f.phase == "planning"]
    assert tokens == sorted(tokens) and fbs[-1][1].tokens == doc["stats"]["generated_tokens"] > 50
    times = [ts for ts, f in fbs if f.phase == "planning"]
    assert max(b - a for a, b in zip(times, times[1:])) <= 0.5


def test_a_cancelled_goal_stops_its_generation_within_a_second(thor, interfaces):
    from action_msgs.msg import GoalStatus

    Plan = interfaces[0]
    t = thor(per_token_s=0.05)  # ~6 s of generation unless cancelled
    fbs = []
    handle = send(
        t.client, Plan, "/thor/plan", Plan.Goal(task=TASK, world_file=KITCHEN), feedback_log(fbs)
    )
    wait_for(lambda: any(f.tokens >= 3 for _, f in fbs), 10, "tokens in the feedback")
    assert t.rt.active == 1
    t0 = time.monotonic()
    result_of(handle.cancel_goal_async())
    res = result_of(handle.get_result_async())
    assert time.monotonic() - t0 < 1.0
    assert res.status == GoalStatus.STATUS_CANCELED and not res.result.valid
    assert "canceled" in res.result.error
    # nothing left running: the generation ended by the cancel, the model free for the next goal
    assert t.rt.active == 0 and t.rt.stopped == 1 and t.node.planning.running is None
    assert t.node.planning.cancelled == 1 and not t.node.jobs
    t.rt.per_token_s = 0.0
    res = result_of(
        send(
            t.client, Plan, "/thor/plan", Plan.Goal(task=TASK, world_file=KITCHEN)
        ).get_result_async()
    )
    assert res.status == GoalStatus.STATUS_SUCCEEDED and res.result.valid


@pytest.mark.parametrize(
    "goal, words",
    [
        (dict(world_json="{not json"), "world_json is not valid JSON"),
        (dict(world_json=json.dumps({"objects": [], "places": []})), "robot"),
        (dict(world_file="/nonexistent/world.json"), "world file not found"),
        (dict(), "no world"),
        (dict(world_file=KITCHEN, skills_json=json.dumps({"skills": []})), "skills"),
        (dict(world_file=KITCHEN, task=""), "task must be a non-empty string"),
        (dict(world_file=KITCHEN, task="put the banana on the table"), "no valid plan"),
    ],
)
def test_bad_goals_are_aborted_with_their_reason(thor, interfaces, goal, words):
    from action_msgs.msg import GoalStatus

    Plan = interfaces[0]
    t = thor()
    res = result_of(
        send(t.client, Plan, "/thor/plan", Plan.Goal(**{"task": TASK, **goal})).get_result_async()
    )
    assert res.status == GoalStatus.STATUS_ABORTED and not res.result.valid
    assert words in res.result.error


def test_an_unknown_object_is_refused_with_the_gates_report(thor, interfaces):
    Plan = interfaces[0]
    t = thor()
    res = result_of(
        send(
            t.client,
            Plan,
            "/thor/plan",
            Plan.Goal(task="put the banana on the table", world_file=KITCHEN),
        ).get_result_async()
    )
    report = json.loads(res.result.report_json)
    assert (
        report
        and res.result.error.startswith("no valid plan after")
        and report[0]["message"] in res.result.error
    )


def test_the_service_plans_once_and_the_json_topics_need_no_interfaces(thor, interfaces):
    from std_msgs.msg import String

    t = thor()
    svc = t.client.create_client(interfaces[2], "/thor/plan_once")
    assert svc.wait_for_service(10)
    req = interfaces[2].Request(task=TASK, world_json=json.dumps(kitchen_dict()))
    res = result_of(svc.call_async(req))
    assert res.valid and json.loads(res.plan_json) == good_plan() and res.error == ""

    results, feedback = [], []
    t.client.create_subscription(
        String, "/thor/json/result", lambda m: results.append(json.loads(m.data)), 10
    )
    t.client.create_subscription(
        String, "/thor/json/feedback", lambda m: feedback.append(json.loads(m.data)), 50
    )
    goals = t.client.create_publisher(String, "/thor/json/goal", 10)
    wait_for(lambda: goals.get_subscription_count() > 0, 10, "the node's JSON goal topic")
    goals.publish(String(data=json.dumps({"id": "g1", "task": TASK, "world_file": KITCHEN})))
    goals.publish(String(data=json.dumps({"task": TASK})))
    goals.publish(String(data=json.dumps({"id": "g2", "task": TASK, "world": "kitchen"})))
    wait_for(lambda: len(results) == 3, 10, "three JSON results")
    by_id = {r["id"]: r for r in results}
    assert by_id["g1"]["status"] == "succeeded" and by_id["g1"]["plan"] == good_plan()
    assert by_id["g1"]["document"]["valid"] and by_id["g1"]["report"] == []
    assert by_id[None]["status"] == "rejected" and '"id"' in by_id[None]["error"]
    assert by_id["g2"]["status"] == "aborted" and "world_file" in by_id["g2"]["error"]
    # (the feedback topic is another topic than the results': its last message may come after)
    wait_for(
        lambda: {f["phase"] for f in feedback if f["id"] == "g1"} >= {"planning", "valid"},
        10,
        "the plan's feedback phases",
    )


def test_a_json_goal_is_cancelled_by_its_id(thor):
    from std_msgs.msg import String

    t = thor(per_token_s=0.05)
    results, feedback = [], []
    t.client.create_subscription(
        String, "/thor/json/result", lambda m: results.append(json.loads(m.data)), 10
    )
    t.client.create_subscription(
        String, "/thor/json/feedback", lambda m: feedback.append(json.loads(m.data)), 50
    )
    goals = t.client.create_publisher(String, "/thor/json/goal", 10)
    cancels = t.client.create_publisher(String, "/thor/json/cancel", 10)
    wait_for(
        lambda: goals.get_subscription_count() > 0 and cancels.get_subscription_count() > 0,
        10,
        "topics",
    )
    goals.publish(String(data=json.dumps({"id": "slow", "task": TASK, "world_file": KITCHEN})))
    wait_for(
        lambda: any(f.get("tokens", 0) >= 3 for f in feedback), 10, "tokens in the JSON feedback"
    )
    t0 = time.monotonic()
    cancels.publish(String(data=json.dumps({"id": "slow"})))
    wait_for(lambda: results, 5, "the JSON result")
    assert time.monotonic() - t0 < 1.0
    assert results[0]["id"] == "slow" and results[0]["status"] == "canceled"
    assert t.rt.active == 0 and t.rt.stopped == 1


def test_a_goal_without_a_world_plans_in_the_world_topics_latest(thor, interfaces):
    from action_msgs.msg import GoalStatus
    from std_msgs.msg import String

    Plan = interfaces[0]
    t = thor()
    world = t.client.create_publisher(String, "/world", 10)
    wait_for(lambda: world.get_subscription_count() > 0, 10, "the node's world subscription")
    world.publish(String(data=json.dumps(kitchen_dict())))
    wait_for(lambda: t.node.latest_world is not None, 10, "the world to arrive")
    res = result_of(send(t.client, Plan, "/thor/plan", Plan.Goal(task=TASK)).get_result_async())
    assert (
        res.status == GoalStatus.STATUS_SUCCEEDED
        and json.loads(res.result.plan_json) == good_plan()
    )
    world.publish(String(data="[]"))
    wait_for(lambda: t.node.latest_world == "[]", 10, "the bad world to arrive")
    res = result_of(send(t.client, Plan, "/thor/plan", Plan.Goal(task=TASK)).get_result_async())
    assert res.status == GoalStatus.STATUS_ABORTED and "world topic" in res.result.error


def diagnostics_of(t, statuses: list):
    from diagnostic_msgs.msg import DiagnosticArray

    return t.client.create_subscription(
        DiagnosticArray,
        "/diagnostics",
        lambda m: statuses.extend(s for s in m.status if s.name == "thor: planner"),
        10,
    )


def test_diagnostics_say_readiness_and_the_self_tests_result(thor, interfaces):
    import threading

    from action_msgs.msg import GoalStatus
    from diagnostic_msgs.msg import DiagnosticStatus

    release = threading.Event()

    def slow_selftest(loaded, backend):
        release.wait(30)
        return Report(True)

    t = thor(
        selftest=slow_selftest,
        wait_ready=False,
        cli_args=["--ros-args", "-p", "diagnostics_period_s:=0.1"],
    )
    seen = []
    diagnostics_of(t, seen)
    wait_for(
        lambda: any(s.level == DiagnosticStatus.WARN and "self-test" in s.message for s in seen),
        10,
        "a WARN while the self-test runs",
    )
    Plan = interfaces[0]
    res = result_of(
        send(
            t.client, Plan, "/thor/plan", Plan.Goal(task=TASK, world_file=KITCHEN)
        ).get_result_async()
    )
    assert res.status == GoalStatus.STATUS_ABORTED and "not ready (self_test" in res.result.error
    release.set()
    wait_for(lambda: seen and seen[-1].level == DiagnosticStatus.OK, 10, "OK once ready")
    values = {kv.key: kv.value for kv in seen[-1].values}
    assert values["status"] == "ready" and values["self_test"] == "PASS: 2/2 parity checks"
    assert seen[-1].hardware_id == "default" and values["interfaces"] == "typed and json"


def test_a_failed_self_test_is_an_error_and_no_goal_is_planned(thor, interfaces):
    from action_msgs.msg import GoalStatus
    from diagnostic_msgs.msg import DiagnosticStatus

    t = thor(
        selftest=lambda loaded, backend: Report(False, "attention max |diff| 3.1 > 1e-3"),
        wait_ready=False,
    )
    t.started.join(30)
    seen = []
    diagnostics_of(t, seen)
    wait_for(
        lambda: seen and seen[-1].level == DiagnosticStatus.ERROR,
        10,
        "ERROR after the failed self-test",
    )
    assert "self-test failed: FAIL: attention" in seen[-1].message
    Plan = interfaces[0]
    res = result_of(
        send(
            t.client, Plan, "/thor/plan", Plan.Goal(task=TASK, world_file=KITCHEN)
        ).get_result_async()
    )
    assert res.status == GoalStatus.STATUS_ABORTED and "not ready (failed" in res.result.error
    assert t.rt.calls == 0


def test_goals_wait_their_turn_for_the_model(thor, interfaces):
    from action_msgs.msg import GoalStatus

    Plan = interfaces[0]
    t = thor(per_token_s=0.005)
    first, second = [], []
    h1 = send(
        t.client, Plan, "/thor/plan", Plan.Goal(task=TASK, world_file=KITCHEN), feedback_log(first)
    )
    wait_for(lambda: first, 10, "the first goal to start")
    h2 = send(
        t.client, Plan, "/thor/plan", Plan.Goal(task=TASK, world_file=KITCHEN), feedback_log(second)
    )
    r1, r2 = result_of(h1.get_result_async()), result_of(h2.get_result_async())
    assert r1.status == r2.status == GoalStatus.STATUS_SUCCEEDED
    assert [f.phase for _, f in second][0] == "queued" and t.rt.calls == 2


def test_parameters_come_from_the_runtime_config_table(thor, tmp_path):
    from tests.helpers.ros import ros_config

    params = tmp_path / "params.yaml"
    params.write_text(
        "thor:\n  ros__parameters:\n    planner.attempts: 1\n    model.prefix_cache: 3\n"
        "    speculation.lookup_rate: 0.5\n    world_topic: robot_world\n"
    )
    t = thor(
        cli_args=["--ros-args", "-p", "planner.max_tokens:=256", "--params-file", str(params)],
        config=ros_config(planner__attempts=2),
    )
    c = t.node.config
    assert (c.planner.max_tokens, c.planner.attempts, c.model.prefix_cache) == (256, 1, 3)
    assert (
        c.speculation.lookup_rate == 0.5 and c.speculation.method == "none"
    )  # the base's, no parameter given
    assert t.node.settings.world_topic == "robot_world"
    got = t.node.node.get_parameter("planner.max_tokens")
    assert got.value == 256 and t.node.node.describe_parameter("planner.max_tokens").read_only
    from rclpy.parameter import Parameter

    assert not t.node.node.set_parameters([Parameter("planner.max_tokens", value=300)])[
        0
    ].successful


def test_a_bad_parameter_is_named(ros, tiny_llama_long):
    from tests.helpers.ros import ros_config
    from thor_app.ros.node import ThorNode
    from thor_runtime.errors import ThorError

    for args, words in (
        (["-p", "planner.max_tokens:=3"], "parameter planner.max_tokens must be >= 16"),
        (["-p", "model.kv_dtype:=int3"], "parameter model.kv_dtype must be one of"),
        (["-p", "queue_size:=-1"], "parameter queue_size must be >= 0"),
    ):
        with pytest.raises(ThorError, match=words):
            ThorNode(ros, ros_config(), cli_args=["--ros-args", *args], name=f"bad{len(words)}")
