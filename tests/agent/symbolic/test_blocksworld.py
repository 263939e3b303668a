"""Objects as places (`on`, `clear`, agent/skills/blocks.json) in the executor, the gate, the task's
reading and the solver; the Blocksworld set (evals/sets/8-blocksworld): its generator, its
translation, and every plan on it checked by the independent PDDL validator too."""

from __future__ import annotations

import json
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from agent.files.loader import AGENT_DIR, base_plan_schema, load_skills, world_from_dict
from agent.language.checks import task_findings
from agent.language.mentions import read_words
from agent.schema.specialize import specialize
from agent.schema.validator import PlanValidator
from agent.symbolic.executor import execute, goal_limits, reaches
from agent.symbolic.gate import check_plan
from agent.symbolic.solver import complete
from evals import blocksworld as bw
from evals.evaluation import load_eval_set, score, summarize
from thor_runtime.errors import ThorError

SKILLS = load_skills(AGENT_DIR / "skills" / "blocks.json")
SET = bw.SET_DIR


def _world(rests: dict, far: str | None = None):
    """Blocks named by colour; ``rests``: block -> "table" or the block it is on."""
    objs = [
        {
            "name": f"{b}_block",
            "type": "block",
            "mass_kg": 0.1,
            "position": [2.0 if b == far else 0.1 * i, 0.0, 0.8],
            **({"at": "table"} if on == "table" else {"on": f"{on}_block"}),
        }
        for i, (b, on) in enumerate(rests.items())
    ]
    return world_from_dict(
        {
            "name": "bw_test",
            "objects": objs,
            "places": [{"name": "table", "position": [0, 0, 0.75]}],
            "robot": {"workspace": {"min": [-1, -1, 0], "max": [1, 1, 2]}, "max_payload_kg": 1.0},
        }
    )


# red on blue on the table; green on the table
W = _world({"blue": "table", "red": "blue", "green": "table"})


def _step(i, skill, **args):
    return {
        "id": f"s{i}",
        "skill": skill,
        "args": args,
        "preconditions": [],
        "expected_effects": [],
        "timeout_s": 10,
        "on_failure": "abort",
    }


def _plan(goal, *steps):
    return {
        "plan_id": "p1",
        "task": "t",
        "goal": goal,
        "steps": [_step(i + 1, *s[:1], **s[1]) for i, s in enumerate(steps)],
    }


GOAL = [{"object": "blue_block", "on": "green_block"}, {"object": "red_block", "on": "blue_block"}]
GOOD = _plan(
    GOAL,
    ("unstack", {"object": "red_block", "from": "blue_block"}),
    ("put_down", {"object": "red_block"}),
    ("pick_up", {"object": "blue_block"}),
    ("stack", {"object": "blue_block", "onto": "green_block"}),
    ("pick_up", {"object": "red_block"}),
    ("stack", {"object": "red_block", "onto": "blue_block"}),
)


def _checks(plan, world=W):
    return check_plan(plan, specialize(base_plan_schema(), world, SKILLS), world, SKILLS)


# ---- the executor and the gate -----------------------------------------------------------------
def test_world_files_say_what_rests_on_what():
    assert W.object("red_block").on == "blue_block" and W.object("red_block").at is None
    with pytest.raises(ThorError, match="`at` or `on`, not both"):
        world_from_dict(
            {
                "name": "x",
                "objects": [
                    {
                        "name": "a",
                        "type": "block",
                        "position": [0, 0, 1],
                        "mass_kg": 1,
                        "at": "t",
                        "on": "b",
                    },
                    {"name": "b", "type": "block", "position": [0, 0, 1], "mass_kg": 1},
                ],
                "places": [{"name": "t", "position": [0, 0, 1]}],
                "robot": {"workspace": {"min": [-1, -1, 0], "max": [1, 1, 2]}, "max_payload_kg": 1},
            }
        )
    with pytest.raises(ThorError, match="loops back"):
        _world({"red": "blue", "blue": "red"})
    with pytest.raises(ThorError, match="not another object"):
        _world({"red": "pink"})


def test_a_good_stacking_plan_passes_and_reaches_its_goal():
    ex = execute(GOOD["steps"], W, SKILLS)
    assert ex.complete and not ex.findings and reaches(_goal(GOAL), ex.state)
    assert ex.state.loc["red_block"] == "blue_block" and ex.state.loc["blue_block"] == "green_block"
    assert _checks(GOOD).valid


@pytest.mark.parametrize(
    "steps, check, words",
    [
        # only a clear block is picked up: red is on blue
        (
            [("pick_up", {"object": "blue_block"})],
            "precondition",
            "pick_up needs blue_block clear, but red_block is on blue_block",
        ),
        # pick_up is for a block on the table; red is on blue (unstack it)
        (
            [("pick_up", {"object": "red_block"})],
            "precondition",
            "needs red_block at table, but red_block is on blue_block",
        ),
        # stacking onto a block that is not clear
        (
            [
                ("pick_up", {"object": "green_block"}),
                ("stack", {"object": "green_block", "onto": "blue_block"}),
            ],
            "precondition",
            "stack needs blue_block clear, but red_block is on blue_block",
        ),
        # unstack names what it is on
        (
            [("unstack", {"object": "red_block", "from": "green_block"})],
            "precondition",
            "red_block on green_block",
        ),
        # hand full
        (
            [
                ("unstack", {"object": "red_block", "from": "blue_block"}),
                ("pick_up", {"object": "green_block"}),
            ],
            "hand_full",
            "needs an empty hand",
        ),
    ],
)
def test_bad_stacking_plans_are_refused_by_name(steps, check, words):
    res = _checks(_plan(GOAL, *steps))
    assert not res.valid
    assert any(f.check == check and words in f.message for f in res.findings), res.report()


def test_the_gate_names_an_unmet_on():
    plan = _plan(
        GOAL, *[(s["skill"], s["args"]) for s in GOOD["steps"][:4]]
    )  # red left on the table
    msgs = [f.message for f in _checks(plan).findings if f.check == "goal"]
    assert msgs == [
        "goal red_block on blue_block is not reached after step s4: red_block is at table "
        "(put at table in step s2)"
    ]
    # what it goes on must be in reach: a goal onto a block outside the workspace is refused for it
    far = _world({"blue": "table", "red": "table"}, far="blue")
    assert {
        f.check
        for f in goal_limits(
            tuple(c for c in _goal([{"object": "red_block", "on": "blue_block"}], far)), far
        )
    } == {"workspace"}


def _goal(raw, world=W):
    from agent.symbolic.goals import parse_goal_items

    return parse_goal_items(raw, world, SKILLS)


# ---- the task's reading, the grammar and the grounding check ----------------------------------
TASK = "Put the blue block on the green block and the red block on top of the blue block."


def test_grammar_and_checks_hold_the_goal_to_the_blocks_the_task_names():
    spec = specialize(base_plan_schema(), W, SKILLS)
    v = PlanValidator({**spec["properties"]["goal"], "$defs": spec["$defs"]})
    assert v.is_valid(GOAL) and v.is_valid([*GOAL, {"object": "green_block", "at": "table"}])
    said = read_words(TASK, W)
    assert task_findings(said, {"goal": GOAL, "steps": []}, W, SKILLS) == []
    f = task_findings(
        said,
        {"goal": [{"object": "blue_block", "on": "red_block"}, GOAL[1]], "steps": []},
        W,
        SKILLS,
    )
    assert [x.message for x in f] == [
        "the task names green_block, but the goal says nothing "
        "about it; state one condition for each object the task "
        "names"
    ]


# ---- the solver ---------------------------------------------------------------------------------
def test_solver_builds_towers_move_by_move():
    plan = complete({"plan_id": "p1", "task": "t", "goal": GOAL, "steps": []}, W, SKILLS)
    assert [s["skill"] for s in plan["steps"]] == [s["skill"] for s in GOOD["steps"]]
    assert _checks(plan).valid
    six = _world({"a": "table", "b": "a", "c": "b", "d": "table", "e": "d", "f": "table"})
    goal = [
        {"object": "a_block", "on": "b_block"},
        {"object": "b_block", "on": "c_block"},
        {"object": "c_block", "on": "d_block"},
        {"object": "f_block", "on": "a_block"},
    ]
    plan = complete({"plan_id": "p1", "task": "t", "goal": goal, "steps": []}, six, SKILLS)
    ex = execute(plan["steps"], six, SKILLS)
    assert not ex.findings and reaches(_goal(goal, six), ex.state) and len(plan["steps"]) <= 16
    # and what else the goal asks, after the towers: the red block held at the end
    held = complete(
        {"plan_id": "p1", "task": "t", "goal": [GOAL[0], {"holding": "red_block"}], "steps": []},
        W,
        SKILLS,
    )
    assert held["steps"][-1]["skill"] in ("pick_up", "unstack") and _checks(held).valid


def test_solver_refuses_what_no_arrangement_has():
    for goal in (
        [{"object": "red_block", "on": "blue_block"}, {"object": "blue_block", "on": "red_block"}],
        [
            {"object": "red_block", "on": "green_block"},
            {"object": "blue_block", "on": "green_block"},
        ],
        [{"object": "red_block", "on": "green_block"}, {"object": "red_block", "at": "table"}],
    ):
        assert (
            complete({"plan_id": "p1", "task": "t", "goal": goal, "steps": []}, W, SKILLS) is None
        ), goal
    # the library's own cap: one step is not enough
    assert (
        complete({"plan_id": "p1", "task": "t", "goal": GOAL, "steps": []}, W, SKILLS, max_steps=5)
        is None
    )
    assert (
        specialize(base_plan_schema(), W, SKILLS)["properties"]["steps"]["maxItems"]
        == SKILLS.max_steps
        == 24
    )


# ---- the set ----------------------------------------------------------------------------------
def _solved():
    tasks, worlds = load_eval_set(SET)
    out = []
    for t in tasks:
        w, s = worlds[t.world]
        out.append(
            (
                t,
                w,
                s,
                complete({"plan_id": "p1", "task": t.task, "goal": t.goal.raw, "steps": []}, w, s),
            )
        )
    return out


def test_set_shape_and_the_solver_reaches_every_goal():
    """The ">= 95% once the goal is grounded" check: from each reference goal the solver's plan
    passes the gate and scores as done, on every task."""
    solved = _solved()
    assert len(solved) >= 30 and {len(w.objects) for _, w, _, _ in solved} == {4, 5, 6}
    for t, w, s, plan in solved:
        assert plan is not None and not reaches(t.goal, execute([], w, s).state), t.id
        g = check_plan(plan, specialize(base_plan_schema(), w, s), w, s)
        res = SimpleNamespace(
            plan=plan, valid=g.valid, report=g.report(), attempts=1, stats={"plan_latency_s": 0.1}
        )
        row = score(t, res, w, s)
        assert row["success"] and not row["unsafe"], (t.id, g.report())


def test_uniform_states_and_the_generators_limits():
    assert [sum(bw._arrangements(n, k) for k in range(1, n + 1)) for n in (3, 4, 5, 6)] == [
        13,
        73,
        501,
        4051,
    ]
    rng = random.Random(0)
    seen = Counter(json.dumps(bw.random_state(list("abc"), rng)) for _ in range(6500))
    assert len(seen) == 13 and max(seen.values()) < 1.3 * 500 and min(seen.values()) > 0.7 * 500
    for name, text in bw.generate(seed=3, per_size=4):
        goal = text.split(":goal")[1]
        assert 1 <= goal.count("(on ") + goal.count("(ontable ") <= bw.MAX_GOAL, name
    assert all(
        len(json.loads(line.strip().rstrip(","))["task"]) <= bw.TASK_CHARS
        for line in (SET / "tasks.json").read_text().splitlines()
        if line.startswith('  {"id"')
    )


def test_set_regenerates_byte_for_byte(tmp_path):
    pytest.importorskip("pddl")
    bw.write_set(tmp_path)
    for f in sorted(p.relative_to(SET) for p in SET.rglob("*") if p.is_file()):
        assert (tmp_path / f).read_text() == (SET / f).read_text(), f


# ---- the independent validator ----------------------------------------------------------------
def test_pddl_validator_accepts_the_right_plan_and_rejects_a_wrong_one():
    pytest.importorskip("pyval")
    from evals.pddl_check import load_binding, validate

    binding = load_binding(SET)
    solved = _solved()
    for t, _, _, plan in solved[::3]:  # every size; the validator takes a while per plan
        assert validate(binding, t.id, plan) == {"pddl_valid": True, "pddl_report": ""}, t.id
    t, w, s, plan = solved[-1]
    skipped = {**plan, "steps": plan["steps"][1:]}  # its first move left out
    v = validate(binding, t.id, skipped)
    assert v["pddl_valid"] is False and v["pddl_report"].startswith("step 1:")
    short = {**plan, "steps": plan["steps"][:-2]}  # executable, the goal not reached
    v = validate(binding, t.id, short)
    assert v["pddl_valid"] is False and v["pddl_report"].startswith("goal not reached")
    assert not _checks_in(short, w, s).valid
    assert (
        validate(binding, t.id, {**plan, "steps": [_step(1, "wait", duration=1)]})["pddl_valid"]
        is False
    )


def _checks_in(plan, w, s):
    return check_plan(plan, specialize(base_plan_schema(), w, s), w, s)


def test_eval_bench_reports_the_validators_verdict(tiny_llama):
    """eval_bench on the set with a scripted model: the reference goal with wrong steps (the
    solver completes it, or with the solver off the plan is refused) and with the solver's own
    steps; every plan's PDDL verdict beside the executor's, and no disagreement."""
    pytest.importorskip("pyval")
    from evals.plan_bench import eval_bench
    from tests.helpers.runtimes import ScriptedRuntime

    solved = _solved()
    (t1, *_, p1), (t2, *_, p2) = solved[0], solved[-1]  # what --eval-limit 2 takes: the ends
    wrong = json.dumps(
        {
            **p1,
            "task": "t",
            "steps": [_step(1, "put_down", object=p1["steps"][0]["args"]["object"])],
        }
    )
    right = json.dumps({**p2, "task": "t"})
    rt = ScriptedRuntime(tiny_llama.tokenizer, [wrong, right] * 2, model=tiny_llama.model)
    on, off = eval_bench(
        rt, tiny_llama.tokenizer, solver_modes=(True, False), attempts=0, limit=2, directory=SET
    )
    assert [r["id"] for r in on["rows"]] == [t1.id, t2.id]
    assert on["task_success"] == 2 and on["pddl_valid"] == "2/2" and on["pddl_disagree"] == 0
    assert off["task_success"] == 1 and off["pddl_valid"] == "1/1" and off["pddl_disagree"] == 0
    assert off["rows"][0]["pddl_valid"] is False and "put-down" in off["rows"][0]["pddl_report"]
    assert "pddl_valid" not in summarize(
        [{k: v for k, v in r.items() if not k.startswith("pddl")} for r in on["rows"]]
    )
