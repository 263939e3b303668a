"""Chat messages for one planning request. Pure functions: same inputs, same messages.

Short prompts matter twice on a robot: prefill time is latency before the first step, and the
prompt is where the n-gram drafter finds its continuations (world names, skill names, keys).
So the world and skills are written as one line per entry, names first, and the JSON layout is
given once as a template rather than explained. The calibration data generator reuses this.
"""

from __future__ import annotations

import json

from agent.files.loader import ArgSpec, Skill, SkillSet, World
from agent.language.checks import names_in

# A worked example teaches small models more than a description of the format does; it is
# deliberately from no sample world, so its names are never copied into a valid plan.
# The goal comes first: a small model states "cup at box" far more reliably than it writes a
# whole correct sequence, and the steps are then held to it by symbolic execution.
_EXAMPLE = (
    '{"plan_id":"p1","task":"put the cup in the box","goal":[{"object":"cup","at":"box"}],"steps":['
    '{"id":"s1","skill":"pick","args":{"object":"cup"},"preconditions":[],'
    '"expected_effects":["holding cup"],"timeout_s":10,"on_failure":"retry"},'
    '{"id":"s2","skill":"place","args":{"object":"cup","target":"box"},"preconditions":[],'
    '"expected_effects":["cup at box"],"timeout_s":10,"on_failure":"abort"}]}'
)


def _num(v: float) -> str:
    return f"{v:g}"


def _xyz(p) -> str:
    return "[" + ",".join(_num(v) for v in p) + "]"


def describe_arg(a: ArgSpec) -> str:
    if a.type == "enum":
        kind = "|".join(a.values)
    elif a.type in ("number", "integer"):
        lo = _num(a.min) if a.min is not None else ""
        hi = _num(a.max) if a.max is not None else ""
        kind = f"{'int ' if a.type == 'integer' else ''}{lo}..{hi}{' ' + a.unit if a.unit else ''}"
    elif a.type == "object" and a.object_types:
        kind = "object:" + "|".join(a.object_types)
    elif a.type == "position":
        kind = "[x,y,z] m"
    else:
        kind = a.type
    return f"{a.name}: {kind}"


def _conds(conds) -> str:
    return ", ".join(c.text().replace("$", "") for c in conds)


def describe_skill(s: Skill) -> str:
    args = ", ".join(describe_arg(a) for a in s.args)
    # no timeout limit here: the grammar bounds timeout_s by the skill's own limit already
    pre = f"; needs {_conds(s.preconditions)}" if s.preconditions else ""
    eff = f"; -> {_conds(s.effects)}" if s.effects else ""
    return f"- {s.name}({args}): {s.description}{pre}{eff}"


def _obj(o, coordinates: bool) -> str:
    # Coordinates only where nothing else locates the object: a place or a support says where
    # it is in a few tokens, and digits cost one token each (a position is ~14). Mass only for
    # what can be carried. The gate checks reach and payload from the world file, not from this.
    extra = [
        f"{_num(o.mass_kg)} kg" if o.graspable else "",
        _xyz(o.position) if coordinates and not (o.at or o.on) else "",
        f"at {o.at}" if o.at else "",
        f"on {o.on}" if o.on else "",
        o.state or "",
        "" if o.graspable else "fixed",
    ]
    return f"{o.name} ({', '.join([o.type, *(e for e in extra if e)])}{_called(o)})"


def _called(thing) -> str:
    return ", also called " + " or ".join(f'"{a}"' for a in thing.aliases) if thing.aliases else ""


def takes_positions(skills: SkillSet | None) -> bool:
    """Whether some skill has a position argument: only then do coordinates earn their tokens."""
    return skills is None or any(a.type == "position" for s in skills.skills for a in s.args)


def describe_world(world: World, skills: SkillSet | None = None) -> str:
    """The world as the planner reads it: names, types, where things are, what state they are
    in. Coordinates (the workspace, the places', an unplaced object's) only when a skill takes a
    position (``skills`` None: as if one did)."""
    r, coords = world.robot, takes_positions(skills)
    robot = f"max payload {_num(r.max_payload_kg)} kg" + (f"; robot at {r.at}" if r.at else "")
    if coords:
        lo, hi = r.workspace_min, r.workspace_max
        robot = (
            f"workspace x {_num(lo[0])}..{_num(hi[0])}, y {_num(lo[1])}..{_num(hi[1])}, "
            f"z {_num(lo[2])}..{_num(hi[2])} m; " + robot
        )
    lines = [f"World: {world.name}", "Robot: " + robot]
    if world.objects:
        lines.append("Objects: " + "; ".join(_obj(o, coords) for o in world.objects))
    if world.places:
        lines.append(
            "Places: "
            + "; ".join(
                p.name + (f" {_xyz(p.position)}" if coords else "") + _called(p)
                for p in world.places
            )
        )
    return "\n".join(lines)


# goal kind -> (a task, its goal): one short example per kind some skill can make true (the
# grammar allows no others). A small model copies the kind of condition it has seen, so with only
# `at` shown it writes "cabinet at ..." for "open the cabinet". Names are from no sample world.
_GOAL_EXAMPLES = {
    "at": (
        "put the cup and the pen in the box",
        '{"object":"cup","at":"box"},{"object":"pen","at":"box"}',
    ),
    "open": ("open the lid", '{"object":"lid","is":"open"}'),
    "closed": ("close the lid", '{"object":"lid","is":"closed"}'),
    "inspected": ("inspect the pen", '{"object":"pen","is":"inspected"}'),
    "holding": ("keep the pen in the gripper", '{"holding":"pen"}'),
    "place_is": ("check the shelf", '{"place":"shelf","is":"inspected"}'),
    "robot_at": ("go to the dock", '{"robot_at":"dock"}'),
    "on": ("stack the cup on the box", '{"object":"cup","on":"box"}'),
}


# What a task asks beyond an end state (agent/symbolic/goals.py): a call, an order, a set. Each is
# shown only when the library has what it needs: (the skill names and condition kinds it uses, task,
# goal).
_PROCESS_EXAMPLES = (
    ({"wait"}, "wait 5 seconds", '{"do":"wait","args":{"duration":5}}'),
    (
        {"push"},
        "push the cup 5 cm left",
        '{"do":"push","args":{"object":"cup","direction":"left","distance":0.05}}',
    ),
    ({"inspect"}, "inspect the pen twice", '{"do":"inspect","args":{"object":"pen"},"times":2}'),
    (
        {"inspect", "at"},
        "check the pen, then put it in the box",
        '{"before":[{"do":"inspect","args":{"object":"pen"}},{"object":"pen","at":"box"}]},{"object":"pen","at":"box"}',
    ),
    (
        {"wait", "robot_at"},
        "go to the dock, wait 5 seconds, then come back to the desk",
        '{"before":[{"robot_at":"dock"},{"do":"wait","args":{"duration":5}},{"robot_at":"desk"}]},{"robot_at":"desk"}',
    ),
    ({"at"}, "move everything on the shelf to the box", '{"every":{"at":"shelf"},"at":"box"}'),
    (
        {"at"},
        "put all the cups you can carry in the box",
        '{"every":{"type":"cup","carriable":true},"at":"box"}',
    ),
)


def goal_forms(skills: SkillSet) -> str:
    """The goal examples this skill library can reach, as ``"task" -> [conditions]``."""
    kinds = skills.kinds
    kinds |= {c.value for s in skills.skills for c in s.effects if c.kind == "is"}
    have = kinds | {s.name for s in skills.skills}
    return "; ".join(
        [f'"{t}" -> [{g}]' for k, (t, g) in _GOAL_EXAMPLES.items() if k in kinds]
        + [f'"{t}" -> [{g}]' for need, t, g in _PROCESS_EXAMPLES if need <= have]
    )


# the instructions' own words, around the example and the goal forms (prompt_parts.py counts them)
OPENING = "You are a robot task planner. Reply with one JSON plan and nothing else."
GOAL_RULE = (
    "Goal first, one condition per object the task names: ",
    '; {"missing":"<name>"} for a thing not below. Then steps reaching it, each skill\'s needs '
    "met, the hand empty at the end unless holding is the goal. on_failure: abort, retry or a "
    "step id.",
)


def describe_skills(skills: SkillSet) -> str:
    return "\n".join(["Skills:", *(describe_skill(s) for s in skills.skills)])


def shared_instructions(skills: SkillSet) -> str:
    """The system text every world and task on ``skills`` shares. It opens the prompt, so its
    K/V can be computed once and kept on disk (thor_runtime/cache/prefix_store.py)."""
    return "\n".join(
        [
            OPENING,
            "Example: " + _EXAMPLE,
            GOAL_RULE[0] + goal_forms(skills) + GOAL_RULE[1],
            describe_skills(skills),
        ]
    )


def system_prompt(world: World, skills: SkillSet) -> str:
    return shared_instructions(skills) + "\n" + describe_world(world, skills)


def shared_start(tokenizer, messages) -> list[int]:
    """The token ids that every prompt ``messages(x)`` renders to starts with, whatever x is: two
    renderings (x = "a", "b") and their common start, so the chat template's tokens and any
    merge at the boundary are accounted for, whatever the tokenizer."""
    from thor_runtime.cache import common_prefix

    a, b = (tokenizer.encode_chat(messages(x)) for x in ("a", "b"))
    return a[: common_prefix(a, b)]


def format_errors(errors) -> str:
    """errors: gate findings as dicts {step, check, message} (or plain strings)."""
    lines = []
    for e in errors:
        if isinstance(e, dict):
            where = f"step {e['step']}: " if e.get("step") else ""
            lines.append(f"- {where}{e['message']} [{e['check']}]")
        else:
            lines.append(f"- {e}")
    return "\n".join(lines)


def build_messages(
    task: str, world: World, skills: SkillSet, errors=None, previous: str | None = None
) -> list[dict]:
    """-> chat messages. With ``errors`` (from a rejected attempt) the rejected plan is shown as
    the assistant's turn and the problems as the next user turn, so the model repairs rather
    than starts over."""
    msgs = [
        {"role": "system", "content": system_prompt(world, skills)},
        {"role": "user", "content": f"Task: {task}"},
    ]
    if errors:
        if previous:
            msgs.append({"role": "assistant", "content": previous})
        msgs.append(
            {
                "role": "user",
                "content": "That plan was rejected:\n"
                + format_errors(errors)
                + "\nWrite a corrected plan for the same task.",
            }
        )
    return msgs


# The goal choice's second reading (goal_choice.GoalChooser.explain): how likely the model finds
# the operator's own words after a goal, as if it had to say the goal. The words are the task's,
# in its language; these instructions only frame the model's turn.
EXPLAIN_SYSTEM = (
    "A robot's goal is written in JSON. Write the request an operator said to give the robot "
    "this goal."
)


def explain_messages(goal, world: World) -> list[dict]:
    """-> the chat turns before the task, for one goal: the goal and what the world also calls
    each thing it names (its aliases, in the deployment's language)."""
    names: set[str] = set()
    names_in(goal, world, names)
    lines = []
    for name in sorted(names):
        thing = world.object(name) or world.place(name)
        also = ", ".join(thing.aliases)
        lines.append(f"- {name}" + (f" (also called: {also})" if also else ""))
    user = f"Goal: {json.dumps(goal, ensure_ascii=False)}\nThings it names:\n" + "\n".join(lines)
    return [{"role": "system", "content": EXPLAIN_SYSTEM}, {"role": "user", "content": user}]
