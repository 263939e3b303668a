"""The parts of `thor ros` that need no ROS graph: the parameter table, the skills file's action
map, the step runner's on_failure and retry budget, the launch file, and the command without
ROS 2 installed."""

from __future__ import annotations

import copy
import json
import shlex
import sys
import xml.etree.ElementTree as ET
from dataclasses import fields
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.worlds import good_plan
from thor_app.ros.params import (
    NODE_PARAMS,
    RUNTIME_SECTIONS,
    node_settings,
    runtime_config,
    runtime_params,
)
from thor_app.ros.robot import (
    CANCELED,
    FAILED,
    SUCCEEDED,
    TIMED_OUT,
    SkillAction,
    StepOutcome,
    action_map,
    fill_message,
    goal_values,
    run_steps,
)
from thor_runtime.config import SECTIONS, RuntimeConfig
from thor_runtime.errors import ThorError

LAUNCH = ROOT / "deploy" / "ros" / "thor_ros.launch.xml"
PARAMS = ROOT / "deploy" / "ros" / "thor_ros.params.yaml"


# ---- parameters ---------------------------------------------------------------------------------
def test_every_runtime_setting_is_a_parameter_with_the_tables_default():
    got = {name: default for name, default, _ in runtime_params(RuntimeConfig())}
    want = {f"{s}.{f.name}": f.default for s in RUNTIME_SECTIONS for f in fields(SECTIONS[s])}
    assert got == want and "model.name" in got and "planner.max_tokens" in got
    helps = {name: text for name, _, text in runtime_params(RuntimeConfig())}
    assert helps["model.kv_dtype"].endswith("(one of: fp32, bf16, fp16, fp8)")


def test_parameters_are_checked_as_the_table_checks_a_flag():
    c = runtime_config(
        {"planner.max_tokens": 256, "speculation.lookup_rate": 0.5, "model.prefix_cache": 0},
        RuntimeConfig(),
    )
    assert (c.planner.max_tokens, c.speculation.lookup_rate, c.model.prefix_cache) == (256, 0.5, 0)
    assert (
        runtime_config({"speculation.relaxed_delta": 3}, RuntimeConfig()).speculation.relaxed_delta
        == 3.0
    )
    for values, words in (
        ({"planner.max_tokens": 3}, "parameter planner.max_tokens must be >= 16"),
        ({"planner.max_tokens": "many"}, "parameter planner.max_tokens must be an integer"),
        ({"engine.backend": "cuda"}, "parameter engine.backend must be one of"),
        ({"planner.nope": 1}, "unknown parameter planner.nope"),
        ({"sampling.seed": 1}, "unknown parameter sampling.seed"),
    ):
        with pytest.raises(ThorError, match=words):
            runtime_config(values, RuntimeConfig())
    assert node_settings({"max_retries": 2, "diagnostics_period_s": 2}).diagnostics_period_s == 2.0
    for values, words in (
        ({"queue_size": -1}, "queue_size must be >= 0"),
        ({"world_durability": "forever"}, "world_durability must be one of"),
        ({"self_test": "yes"}, "self_test must be bool"),
    ):
        with pytest.raises(ThorError, match=words):
            node_settings(values)


def test_the_shipped_parameters_file_names_only_parameters_the_node_declares():
    names = {n for n, _, _ in runtime_params(RuntimeConfig())} | {p.name for p in NODE_PARAMS}
    lines = [ln.strip() for ln in PARAMS.read_text().splitlines()]
    keys = [
        ln.split(":")[0] for ln in lines if ln and not ln.startswith("#") and not ln.endswith(":")
    ]
    assert keys and set(keys) <= names, set(keys) - names


def test_the_launch_file_runs_thor_ros_with_the_parameters_file():
    from thor_app.cli import build_parser

    root = ET.parse(LAUNCH).getroot()
    args = {a.get("name"): a.get("default") for a in root.iter("arg")}
    cmd = root.find("executable").get("cmd")
    for name, value in args.items():
        cmd = cmd.replace(f"$(var {name})", value)
    cmd = cmd.replace("$(dirname)", str(LAUNCH.parent))
    argv = shlex.split(cmd)
    assert argv[:2] == ["thor", "ros"] and "$(" not in cmd
    parsed = build_parser().parse_args(argv[1:])
    assert (
        parsed.ros_args[-2:] == ["--params-file", str(PARAMS)]
        and Path(parsed.ros_args[-1]).is_file()
    )
    assert "__node:=thor" in parsed.ros_args


def test_thor_ros_takes_the_runtime_flags_and_passes_the_rest_to_ros():
    from thor_app.cli import build_parser
    from thor_app.flags import config_from_args

    a = build_parser().parse_args(
        [
            "ros",
            "--max-tokens",
            "300",
            "--spec",
            "none",
            "--ros-args",
            "-p",
            "planner.attempts:=1",
            "-r",
            "__ns:=/robot",
        ]
    )
    assert a.ros_args == ["-p", "planner.attempts:=1", "-r", "__ns:=/robot"]
    c = config_from_args(a)
    assert c.planner.max_tokens == 300 and c.speculation.method == "none"


def test_without_ros_2_thor_ros_says_how_to_install_it_and_exits_2(monkeypatch, capsys):
    from thor_app.cli import main

    monkeypatch.setitem(sys.modules, "rclpy", None)  # `import rclpy` raises ImportError
    assert main(["ros"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and "pip install 'thor-runtime[ros]'" in err and "jazzy" in err
    )


# ---- the skills file's map ---------------------------------------------------------------------
def skills_doc(**ros):
    doc = json.loads((ROOT / "agent" / "skills" / "manipulation.json").read_text())
    for s in doc["skills"]:
        if s["name"] in ros:
            s["ros"] = ros[s["name"]]
    return doc


PICK = {
    "action": "/arm/pick",
    "type": "my_robot_msgs/action/Pick",
    "goal": {"object_id": "$object", "grip.force": "$force", "speed": 0.2},
    "success_field": "ok",
}
MOVE = {
    "action": "arm/move",
    "type": "my_robot_msgs/action/Move",
    "goal": {"target.x": "$position[0]", "target.y": "$position[1]", "target.z": "$position[2]"},
}


def test_the_skills_schema_takes_a_ros_action_per_skill_and_the_files_without_one_still_load():
    from agent.files.loader import AGENT_DIR, load_skills, skills_from_dict

    for f in sorted((AGENT_DIR / "skills").glob("*.json")):
        assert load_skills(f).skills  # the shipped sets: unchanged
    doc = skills_doc(pick=PICK, move_arm=MOVE)
    assert skills_from_dict(doc, "mapped").get("pick") is not None
    m = action_map(doc)
    assert set(m) == {"pick", "move_arm"} and m["pick"] == SkillAction(
        "pick", "/arm/pick", "my_robot_msgs/action/Pick", PICK["goal"], "ok"
    )
    for bad, words in (
        ({"action": "/arm/pick"}, "'type' is a required property"),
        ({**PICK, "type": "my_robot_msgs/msg/Pick"}, "does not match"),
        ({**PICK, "goal": {"Object": "$object"}}, "does not match"),
        ({**PICK, "extra": 1}, "Additional properties"),
        ({**PICK, "action": "arm pick"}, "does not match"),
    ):
        with pytest.raises(ThorError, match=words):
            skills_from_dict(skills_doc(pick=bad), "bad")


def test_the_action_map_refuses_what_the_schema_cannot_see():
    for ros, words in (
        ({**PICK, "goal": {"object_id": "$thing"}}, "names no argument of the skill"),
        ({**PICK, "goal": {"object_id": "$object[x]"}}, r"neither \$arg nor \$arg\[i\]"),
    ):
        with pytest.raises(ThorError, match=words):
            action_map(skills_doc(pick=ros))


def test_a_steps_arguments_fill_its_goal():
    m = action_map(skills_doc(pick=PICK, move_arm=MOVE))
    assert goal_values(m["pick"], {"object": "apple", "grasp": "top", "force": 10}, "s1") == {
        "object_id": "apple",
        "grip.force": 10,
        "speed": 0.2,
    }
    assert goal_values(m["move_arm"], {"position": [0.1, 0.2, 0.3], "speed": 0.1}, "s1") == {
        "target.x": 0.1,
        "target.y": 0.2,
        "target.z": 0.3,
    }
    with pytest.raises(ThorError, match="step s2: goal field object_id needs argument 'object'"):
        goal_values(m["pick"], {}, "s2")
    with pytest.raises(ThorError, match=r"target.y takes \$position\[1\], but position is \[0.1\]"):
        goal_values(m["move_arm"], {"position": [0.1]}, "s3")


class _Msg:
    """A stand-in ROS message: fields with typed defaults, nested messages."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def get_fields_and_field_types(self):
        return {k: "" for k in self.__dict__}


def test_goal_values_go_into_the_message_with_its_field_types():
    msg = _Msg(object_id="", speed=0.0, count=0, on=False, grip=_Msg(force=0.0), path=[])
    fill_message(
        msg,
        {
            "object_id": "apple",
            "speed": 1,
            "count": 3.0,
            "on": True,
            "grip.force": 10,
            "path": [1, 2],
        },
        "step s1",
    )
    assert (msg.object_id, msg.speed, msg.count, msg.on, msg.grip.force, msg.path) == (
        "apple",
        1.0,
        3,
        True,
        10.0,
        [1, 2],
    )
    assert isinstance(msg.speed, float) and isinstance(msg.grip.force, float)
    for values, words in (
        ({"speed": "fast"}, "field speed cannot take 'fast'"),
        ({"count": 2.5}, "field count"),
        ({"grip": 1}, "map its own fields"),
        ({"nope": 1}, "no field nope"),
        ({"grip.nope": 1}, "no field grip.nope"),
        ({"on": 1}, "a boolean field"),
    ):
        with pytest.raises(ThorError, match=words):
            fill_message(msg, values, "step s1")


# ---- the step runner ----------------------------------------------------------------------------
ACTIONS = {
    "pick": SkillAction("pick", "/robot/pick", "t/action/A", {}),
    "place": SkillAction("place", "/robot/place", "t/action/A", {}),
}


def scripted(outcomes: dict[str, list[str]]):
    """run_step answering each skill's outcomes in turn (the last one again once they run out)."""
    calls = []

    def run_step(step, mapping, values, timeout_s):
        calls.append((step["id"], timeout_s))
        s = outcomes[step["skill"]]
        return StepOutcome(s.pop(0) if len(s) > 1 else s[0], "robot says no")

    return run_step, calls


def plan_with(**changes):
    p = copy.deepcopy(good_plan())
    for s in p["steps"]:
        s.update(changes.get(s["id"], {}))
    return p


def test_steps_run_in_order_with_their_own_timeouts():
    run_step, calls = scripted({"pick": [SUCCEEDED], "place": [SUCCEEDED]})
    events = []
    rec = run_steps(good_plan(), run_step, ACTIONS, report=events.append)
    assert rec.success and calls == [("s1", 10.0), ("s2", 12.5)]
    assert [(e["step_id"], e["status"]) for e in events] == [
        ("s1", "started"),
        ("s1", "succeeded"),
        ("s2", "started"),
        ("s2", "succeeded"),
    ]
    assert {e["step_count"] for e in events} == {2}


@pytest.mark.parametrize("outcome", [FAILED, TIMED_OUT])
def test_on_failure_abort_retry_and_a_jump(outcome):
    run_step, calls = scripted({"pick": [outcome], "place": [SUCCEEDED]})
    rec = run_steps(plan_with(s1={"on_failure": "abort"}), run_step, ACTIONS)
    assert not rec.success and calls == [("s1", 10.0)] and rec.error.endswith("on_failure abort")
    assert f"step s1 (pick) {outcome.replace('_', ' ')}: robot says no" in rec.error
    run_step, calls = scripted({"pick": [outcome, SUCCEEDED], "place": [SUCCEEDED]})
    assert run_steps(good_plan(), run_step, ACTIONS).success and [c[0] for c in calls] == [
        "s1",
        "s1",
        "s2",
    ]
    run_step, calls = scripted({"pick": [SUCCEEDED], "place": [outcome, SUCCEEDED]})
    rec = run_steps(good_plan(), run_step, ACTIONS)  # s2's on_failure is s1: from pick again
    assert rec.success and [c[0] for c in calls] == ["s1", "s2", "s1", "s2"]
    assert [s["attempt"] for s in rec.steps] == [1, 1, 2, 2]


def test_no_step_starts_more_than_one_plus_max_retries_times():
    for retries in (0, 1, 3):
        run_step, calls = scripted({"pick": [FAILED], "place": [SUCCEEDED]})
        rec = run_steps(good_plan(), run_step, ACTIONS, max_retries=retries)
        assert not rec.success and len(calls) == 1 + retries
        want = f"on_failure retry, but s1 already started {1 + retries} time(s)"
        assert want in rec.error
    run_step, calls = scripted({"pick": [SUCCEEDED], "place": [FAILED]})
    rec = run_steps(good_plan(), run_step, ACTIONS, max_retries=2)
    assert [c[0] for c in calls] == [
        "s1",
        "s2",
        "s1",
        "s2",
        "s1",
        "s2",
    ] and "s1 already started 3" in rec.error


def test_a_cancel_ends_the_run_before_the_next_step_or_with_the_running_one():
    run_step, calls = scripted({"pick": [SUCCEEDED], "place": [SUCCEEDED]})
    rec = run_steps(good_plan(), run_step, ACTIONS, cancelled=lambda: len(calls) == 1)
    assert (
        rec.canceled
        and not rec.success
        and calls == [("s1", 10.0)]
        and "before step s2" in rec.error
    )
    run_step, calls = scripted({"pick": [CANCELED], "place": [SUCCEEDED]})
    rec = run_steps(good_plan(), run_step, ACTIONS)
    assert rec.canceled and "during step s1" in rec.error and len(calls) == 1


def test_a_plan_with_an_unmapped_skill_does_not_start():
    run_step, calls = scripted({"pick": [SUCCEEDED], "place": [SUCCEEDED]})
    with pytest.raises(ThorError, match="step s2: skill 'place' has no `ros` action"):
        run_steps(good_plan(), run_step, {"pick": ACTIONS["pick"]})
    assert calls == []
