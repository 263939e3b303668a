"""A plan run on the robot: each skill mapped to one of the robot's own ROS 2 action servers.

The skills file says, per skill, which action runs it and how the step's arguments fill the
action's goal (agent/schemas/skills.schema.json, ``ros``)::

    {"name": "pick", ..., "ros": {"action": "/arm/pick", "type": "my_robot_msgs/action/Pick",
                                  "goal": {"object_id": "$object", "grip.force": "$force",
                                           "speed": 0.2},
                                  "success_field": "ok"}}

``goal`` maps a field of the action's goal (a dotted path into nested messages) to ``$arg`` (the
step's argument), ``$arg[i]`` (an element of a list argument: a position's x is ``$position[0]``)
or a literal. ``success_field``: a boolean field of the action's result that must be true as
well as the goal having succeeded ('' = the goal's status alone).

A plan runs step by step (``run_steps``): each step gets its ``timeout_s`` (past it the robot's
goal is cancelled and the step has timed out), and a failed step follows its ``on_failure``:
``abort`` ends the run, ``retry`` runs the step again, a step id jumps there and runs on from it.
No step starts more than ``1 + max_retries`` times, so a run always ends. Every step's skill is
mapped and every goal built before the first step starts: a plan the robot cannot run whole does
not start. The ROS side (thor_app/ros/node.py) hands ``run_steps`` one function that runs a step.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

from thor_runtime.errors import ThorError

_REF = re.compile(r"^\$([a-z][a-z0-9_]{0,31})(?:\[(\d+)\])?$")
_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*/action/[A-Z][A-Za-z0-9]*$")
_PATH = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
# step outcomes
SUCCEEDED, FAILED, TIMED_OUT, CANCELED = "succeeded", "failed", "timed_out", "canceled"


@dataclass(frozen=True)
class SkillAction:
    skill: str
    action: str  # the robot's action server
    type: str  # pkg/action/Name
    goal: dict  # goal field path -> "$arg", "$arg[i]" or a literal
    success_field: str = ""


def action_map(skills_doc: dict, source: str = "skills") -> dict[str, SkillAction]:
    """The ``ros`` entries of a skills file's JSON, checked; skills without one are left out."""
    out = {}
    for s in skills_doc.get("skills", []):
        if not isinstance(s, dict) or "ros" not in s:
            continue
        name, r = s.get("name"), s["ros"]
        where = f"{source}: skill {name!r}: ros"
        if not isinstance(r, dict):
            raise ThorError(f"{where} must be an object")
        action, kind, goal = r.get("action"), r.get("type"), r.get("goal", {})
        if not isinstance(action, str) or not action:
            raise ThorError(f"{where}.action must name the robot's action server")
        if not isinstance(kind, str) or not _TYPE.match(kind):
            raise ThorError(
                f"{where}.type must be an action type such as nav2_msgs/action/NavigateToPose"
            )
        if not isinstance(goal, dict):
            raise ThorError(f"{where}.goal must be an object of goal fields")
        args = set((s.get("args") or {}).keys())
        for path, v in goal.items():
            if not _PATH.match(path):
                raise ThorError(f"{where}.goal: {path!r} is not a goal field (a.b.c)")
            m = _REF.match(v) if isinstance(v, str) else None
            if m is None and isinstance(v, str) and v.startswith("$"):
                raise ThorError(f"{where}.goal.{path}: {v!r} is neither $arg nor $arg[i]")
            if m is not None and m.group(1) not in args:
                raise ThorError(f"{where}.goal.{path}: {v!r} names no argument of the skill")
        ok = r.get("success_field", "")
        if not isinstance(ok, str) or (ok and not _PATH.match(ok)):
            raise ThorError(f"{where}.success_field must be a result field (a.b.c) or ''")
        out[name] = SkillAction(name, action, kind, dict(goal), ok)
    return out


def goal_values(mapping: SkillAction, args: dict, step_id: str) -> dict:
    """The goal's fields for one step: each ``$arg`` replaced by the step's argument."""
    out = {}
    for path, v in mapping.goal.items():
        m = _REF.match(v) if isinstance(v, str) else None
        if m is None:
            out[path] = v
            continue
        name, index = m.group(1), m.group(2)
        if name not in args:
            raise ThorError(
                f"step {step_id}: goal field {path} needs argument {name!r}, which the step "
                "does not give"
            )
        value = args[name]
        if index is not None:
            if not isinstance(value, list) or int(index) >= len(value):
                raise ThorError(
                    f"step {step_id}: goal field {path} takes {v}, but {name} is {value!r}"
                )
            value = value[int(index)]
        out[path] = value
    return out


def fill_message(msg, values: dict, what: str):
    """Set ``values`` ({"a.b": v}) on a ROS message in place, each converted to its field's type
    (an int into a float field, a list into a sequence); an error names the field."""
    for path, v in values.items():
        *parents, last = path.split(".")
        target = msg
        for p in parents:
            if not hasattr(target, p) or p.startswith("_"):
                raise ThorError(f"{what}: no field {path} in {type(msg).__name__}")
            target = getattr(target, p)
        if not hasattr(target, last) or last.startswith("_") or callable(getattr(target, last)):
            raise ThorError(f"{what}: no field {path} in {type(msg).__name__}")
        try:
            setattr(target, last, _like(getattr(target, last), v))
        except (TypeError, ValueError, AssertionError) as e:
            raise ThorError(
                f"{what}: field {path} cannot take {v!r} ({e or type(e).__name__})"
            ) from None
    return msg


def _like(current, v):
    if isinstance(current, bool):
        if not isinstance(v, bool):
            raise TypeError("a boolean field")
        return v
    if isinstance(current, int):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
            raise TypeError("an integer field")
        return int(v)
    if isinstance(current, float):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError("a number field")
        return float(v)
    if isinstance(current, str):
        if not isinstance(v, str):
            raise TypeError("a string field")
        return v
    if hasattr(current, "__len__") and not hasattr(current, "get_fields_and_field_types"):
        if not isinstance(v, list):
            raise TypeError("a sequence field")
        return v
    raise TypeError("a message field: map its own fields (a.b)")


def message_dict(msg):
    """A ROS message as plain JSON-able data (the robot's feedback and result, in our feedback)."""
    if hasattr(msg, "get_fields_and_field_types"):
        return {k: message_dict(getattr(msg, k)) for k in msg.get_fields_and_field_types()}
    if isinstance(msg, (str, bool, int, float)) or msg is None:
        return msg
    if isinstance(msg, (bytes, bytearray)):
        return list(msg)
    try:
        return [message_dict(x) for x in msg]
    except TypeError:
        return str(msg)


@dataclass(frozen=True)
class StepOutcome:
    status: str  # succeeded, failed, timed_out, canceled
    message: str = ""
    result: object = None  # the robot's result as data, when it answered


@dataclass
class RunRecord:
    success: bool = False
    error: str = ""
    canceled: bool = False
    steps: list = field(
        default_factory=list
    )  # {"id", "skill", "status", "attempt", "seconds", "message"}

    def document(self) -> dict:
        return {
            "success": self.success,
            "canceled": self.canceled,
            "error": self.error,
            "steps": self.steps,
        }


def check_runnable(plan: dict, actions: dict[str, SkillAction]) -> list[dict]:
    """Every step's goal values, or a ThorError naming the first step the robot cannot run."""
    goals = []
    for step in plan.get("steps", []):
        sid, skill = step.get("id"), step.get("skill")
        mapping = actions.get(skill)
        if mapping is None:
            raise ThorError(f"step {sid}: skill {skill!r} has no `ros` action in the skills file")
        goals.append(goal_values(mapping, step.get("args") or {}, sid))
    return goals


def run_steps(
    plan: dict,
    run_step: Callable[[dict, SkillAction, dict, float], StepOutcome],
    actions: dict[str, SkillAction],
    max_retries: int = 1,
    cancelled: Callable[[], bool] = lambda: False,
    report: Callable[[dict], None] = lambda event: None,
) -> RunRecord:
    """Run ``plan``'s steps in order: ``run_step(step, mapping, goal_values, timeout_s)`` runs one
    on the robot. ``report(event)`` hears each step start, end, retry and jump:
    {"step_id", "skill", "status", "step_index", "step_count", "detail"}."""
    steps = plan["steps"]
    goals = check_runnable(plan, actions)
    at = {s["id"]: i for i, s in enumerate(steps)}
    starts = [0] * len(steps)
    record, i = RunRecord(), 0
    budget = 1 + max_retries

    def say(idx, status, detail=""):
        s = steps[idx]
        report(
            {
                "step_id": s["id"],
                "skill": s["skill"],
                "status": status,
                "step_index": idx,
                "step_count": len(steps),
                "detail": detail,
            }
        )

    while i < len(steps):
        step = steps[i]
        if cancelled():
            record.canceled, record.error = True, f"canceled before step {step['id']}"
            return record
        starts[i] += 1
        say(i, "started", f"attempt {starts[i]}")
        t0 = time.monotonic()
        out = run_step(step, actions[step["skill"]], goals[i], float(step["timeout_s"]))
        record.steps.append(
            {
                "id": step["id"],
                "skill": step["skill"],
                "status": out.status,
                "attempt": starts[i],
                "seconds": round(time.monotonic() - t0, 3),
                "message": out.message,
                "result": out.result,
            }
        )
        say(i, out.status, out.message)
        if out.status == SUCCEEDED:
            i += 1
            continue
        if out.status == CANCELED:
            record.canceled, record.error = True, f"canceled during step {step['id']}"
            return record
        policy = step.get("on_failure", "abort")
        why = f"step {step['id']} ({step['skill']}) {out.status.replace('_', ' ')}"
        why += f": {out.message}" if out.message else ""
        if policy == "retry" and starts[i] < budget:
            say(i, "retrying", why)
            continue
        if policy in at and starts[at[policy]] < budget:
            say(i, "jumping", f"{why}; on to {policy}")
            i = at[policy]
            continue
        if policy == "abort":
            record.error = f"{why}; on_failure abort"
        elif policy == "retry" or policy in at:
            again = step["id"] if policy == "retry" else policy
            record.error = (
                f"{why}; on_failure {policy}, but {again} already started {budget} time(s) "
                f"(max_retries {max_retries})"
            )
        else:
            record.error = f"{why}; on_failure {policy!r} names no step of the plan"
        return record
    record.success = True
    return record
