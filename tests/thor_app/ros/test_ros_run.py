"""Plans run on the robot: each skill mapped (in the skills file) to an action server, here small
test_msgs/action/Fibonacci servers started by the test, standing in for the robot's own. Steps
run in order with feedback; a failed step follows its on_failure, a step past its timeout_s is
cancelled on the robot, and cancelling the goal cancels the robot's running step."""

from __future__ import annotations

import copy
import json
import time

import pytest

from tests.helpers.ros import feedback_log, result_of, wait_for
from tests.helpers.worlds import WORLDS, good_plan

TASK = "put the apple on the table"
KITCHEN = str(WORLDS["kitchen"])
FIB = "test_msgs/action/Fibonacci"


@pytest.fixture(autouse=True)
def _test_msgs():
    pytest.importorskip(
        "test_msgs.action", reason="test_msgs is not installed: pip install ros-test-msgs"
    )


def mapped_skills(**ros) -> dict:
    """The kitchen's skills with pick and place mapped to the test's servers (or as given)."""
    doc = json.loads((WORLDS["kitchen"].parent.parent / "skills" / "manipulation.json").read_text())
    maps = {
        "pick": {"action": "/robot/pick", "type": FIB, "goal": {"order": "$force"}},
        "place": {"action": "/robot/place", "type": FIB, "goal": {"order": 2}},
    }
    maps.update(ros)
    for s in doc["skills"]:
        if maps.get(s["name"]) is not None:
            s["ros"] = maps[s["name"]]
    return doc


def robot(t, **scripts):
    from tests.helpers.ros import FakeRobot

    r = FakeRobot(t.client, {f"/robot/{k}": v for k, v in scripts.items()})
    return r


def plan_with(**step_changes) -> dict:
    """The good plan with its steps changed: {"s2": {"timeout_s": 0.5}}."""
    p = copy.deepcopy(good_plan())
    for s in p["steps"]:
        s.update(step_changes.get(s["id"], {}))
    return p


def run_goal(t, RunPlan, plan, skills=None, feedback=None):
    from tests.helpers.ros import need_interfaces

    need_interfaces()
    from thor_app.ros.action_client import ActionClient

    c = ActionClient(t.client, RunPlan, "/thor/run_plan")
    assert c.wait_for_server(10)
    goal = RunPlan.Goal(
        plan_json=json.dumps(plan),
        world_file=KITCHEN,
        skills_json=json.dumps(skills or mapped_skills()),
    )
    handle = result_of(c.send_goal_async(goal, feedback_callback=feedback))
    assert handle.accepted
    return handle


def test_a_plan_runs_step_by_step_on_the_robots_action_servers(thor, interfaces):
    from action_msgs.msg import GoalStatus

    from thor_app.ros.action_client import ActionClient

    Plan = interfaces[0]
    t = thor()
    r = robot(t, pick=["ok"], place=["slow:0.3"])
    fbs = []
    c = ActionClient(t.client, Plan, "/thor/plan")
    assert c.wait_for_server(10)
    goal = Plan.Goal(
        task=TASK, world_file=KITCHEN, skills_json=json.dumps(mapped_skills()), execute=True
    )
    res = result_of(
        result_of(c.send_goal_async(goal, feedback_callback=feedback_log(fbs))).get_result_async()
    )
    assert res.status == GoalStatus.STATUS_SUCCEEDED and res.result.valid and res.result.error == ""
    run = json.loads(res.result.run_json)
    assert run["success"] and [(s["id"], s["status"]) for s in run["steps"]] == [
        ("s1", "succeeded"),
        ("s2", "succeeded"),
    ]
    assert run["steps"][1]["seconds"] >= 0.3 and run["steps"][0]["result"] == {"sequence": [10]}
    assert json.loads(res.result.document_json)["run"] == run
    # the steps' goals, filled from their arguments by the skills file's map
    assert r.goals == [("/robot/pick", 10), ("/robot/place", 2)]
    steps = [(f.step_id, f.status) for _, f in fbs if f.phase == "running" and f.step_id]
    assert (
        steps[0] == ("s1", "started")
        and ("s1", "succeeded") in steps
        and steps[-1] == ("s2", "succeeded")
    )
    assert ("s2", "feedback") in steps
    robot_fb = next(f for _, f in fbs if f.status == "feedback")
    assert json.loads(robot_fb.detail) == {"sequence": [0, 1]} and robot_fb.step_count == 2
    assert [f.phase for _, f in fbs][-1] == "done"


def test_a_failed_step_is_retried_and_a_jump_runs_on_from_its_step(thor, interfaces):
    from action_msgs.msg import GoalStatus

    t = thor(cli_args=["--ros-args", "-p", "max_retries:=2"])
    # pick fails once (on_failure retry: runs again); place fails once (on_failure s1: from pick)
    r = robot(t, pick=["abort", "ok"], place=["abort", "ok"])
    fbs = []
    res = result_of(
        run_goal(t, interfaces[1], good_plan(), feedback=feedback_log(fbs)).get_result_async()
    )
    assert res.status == GoalStatus.STATUS_SUCCEEDED and res.result.success
    run = json.loads(res.result.run_json)
    assert [(s["id"], s["status"], s["attempt"]) for s in run["steps"]] == [
        ("s1", "failed", 1),
        ("s1", "succeeded", 2),
        ("s2", "failed", 1),
        ("s1", "succeeded", 3),
        ("s2", "succeeded", 2),
    ]
    assert [g for g, _ in r.goals] == [
        "/robot/pick",
        "/robot/pick",
        "/robot/place",
        "/robot/pick",
        "/robot/place",
    ]
    statuses = [f.status for _, f in fbs]
    assert "retrying" in statuses and "jumping" in statuses


def test_a_step_that_keeps_failing_aborts_the_run_naming_it(thor, interfaces):
    from action_msgs.msg import GoalStatus

    t = thor()
    r = robot(t, pick=["ok"], place=["abort"])
    res = result_of(run_goal(t, interfaces[1], good_plan()).get_result_async())
    assert res.status == GoalStatus.STATUS_ABORTED and not res.result.success
    # place fails, jumps to s1 (its on_failure), fails again: s1 has started 1 + max_retries times
    assert [g for g, _ in r.goals] == ["/robot/pick", "/robot/place", "/robot/pick", "/robot/place"]
    assert "step s2 (place) failed: /robot/place aborted the goal" in res.result.error
    assert "s1 already started 2 time(s)" in res.result.error
    r.destroy()
    r = robot(t, pick=["abort"])
    res = result_of(
        run_goal(t, interfaces[1], plan_with(s1={"on_failure": "abort"})).get_result_async()
    )
    assert res.status == GoalStatus.STATUS_ABORTED and res.result.error.endswith("on_failure abort")
    assert r.goals == [("/robot/pick", 10)]


def test_a_step_past_its_timeout_is_cancelled_on_the_robot(thor, interfaces):
    from action_msgs.msg import GoalStatus

    t = thor()
    r = robot(t, pick=["ok"], place=["hang"])
    plan = plan_with(s2={"timeout_s": 0.5, "on_failure": "abort"})
    t0 = time.monotonic()
    res = result_of(run_goal(t, interfaces[1], plan).get_result_async())
    took = time.monotonic() - t0
    assert res.status == GoalStatus.STATUS_ABORTED and 0.5 <= took < 3.0
    run = json.loads(res.result.run_json)
    assert run["steps"][-1]["status"] == "timed_out" and 0.5 <= run["steps"][-1]["seconds"] < 1.5
    assert "past its timeout_s 0.5; the robot's goal was cancelled" in res.result.error
    assert r.cancels == ["/robot/place"]


def test_cancelling_the_goal_cancels_the_robots_step(thor, interfaces):
    from action_msgs.msg import GoalStatus

    t = thor()
    r = robot(t, pick=["hang"], place=["ok"])
    fbs = []
    handle = run_goal(t, interfaces[1], good_plan(), feedback=feedback_log(fbs))
    wait_for(lambda: r.goals, 10, "the robot's first step")
    t0 = time.monotonic()
    result_of(handle.cancel_goal_async())
    res = result_of(handle.get_result_async())
    assert time.monotonic() - t0 < 1.0
    assert (
        res.status == GoalStatus.STATUS_CANCELED and "canceled during step s1" in res.result.error
    )
    wait_for(lambda: r.cancels, 5, "the robot's cancel")
    assert r.cancels == ["/robot/pick"] and r.goals == [("/robot/pick", 10)]


def test_a_plan_the_robot_cannot_run_whole_does_not_start(thor, interfaces):
    from action_msgs.msg import GoalStatus

    t = thor()
    r = robot(t, pick=["ok"], place=["ok"])
    for skills, words in (
        (mapped_skills(place=None), "step s2: skill 'place' has no `ros` action"),
        (
            mapped_skills(place={"action": "/robot/place", "type": FIB, "goal": {"speed": 2}}),
            "step s2 (test_msgs/action/Fibonacci goal): no field speed",
        ),
        (
            mapped_skills(place={"action": "/robot/place", "type": "no_such_msgs/action/Place"}),
            "action type no_such_msgs/action/Place cannot be loaded",
        ),
    ):
        res = result_of(run_goal(t, interfaces[1], good_plan(), skills).get_result_async())
        assert res.status == GoalStatus.STATUS_ABORTED and words in res.result.error
    assert r.goals == []


def test_run_plan_gates_the_plan_before_the_robot_moves(thor, interfaces):
    from action_msgs.msg import GoalStatus

    t = thor()
    r = robot(t, pick=["ok"], place=["ok"])
    heavy = plan_with(s1={"args": {"object": "cast_iron_pan", "grasp": "top", "force": 10}})
    res = result_of(run_goal(t, interfaces[1], heavy).get_result_async())
    assert res.status == GoalStatus.STATUS_ABORTED and res.result.error.startswith(
        "the plan did not pass the gate"
    )
    assert json.loads(res.result.report_json) and r.goals == []


def test_a_step_whose_server_is_missing_times_out(thor, interfaces):
    from action_msgs.msg import GoalStatus

    t = thor()
    plan = plan_with(s1={"timeout_s": 0.3, "on_failure": "abort"})
    res = result_of(run_goal(t, interfaces[1], plan).get_result_async())
    assert res.status == GoalStatus.STATUS_ABORTED
    assert "action server /robot/pick is not available" in res.result.error


def test_the_json_topics_run_a_plan_too(thor):
    from std_msgs.msg import String

    t = thor()
    r = robot(t, pick=["ok"], place=["ok"])
    results = []
    t.client.create_subscription(
        String, "/thor/json/result", lambda m: results.append(json.loads(m.data)), 10
    )
    goals = t.client.create_publisher(String, "/thor/json/goal", 10)
    wait_for(lambda: goals.get_subscription_count() > 0, 10, "the node's JSON goal topic")
    goals.publish(
        String(
            data=json.dumps(
                {
                    "id": "run1",
                    "plan": good_plan(),
                    "world_file": KITCHEN,
                    "skills": mapped_skills(),
                }
            )
        )
    )
    goals.publish(
        String(
            data=json.dumps(
                {
                    "id": "plan1",
                    "task": TASK,
                    "world_file": KITCHEN,
                    "skills": mapped_skills(),
                    "execute": True,
                }
            )
        )
    )
    wait_for(lambda: len(results) == 2, 20, "two JSON results")
    by_id = {x["id"]: x for x in results}
    assert by_id["run1"]["status"] == "succeeded" and by_id["run1"]["run"]["success"]
    assert by_id["plan1"]["status"] == "succeeded" and by_id["plan1"]["document"]["run"]["success"]
    assert len(r.goals) == 4
