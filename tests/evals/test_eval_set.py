"""evals/sets/*: the six held-out evaluation sets are well formed, disjoint from what
prompts and drafter training use (and from earlier sets), every feasible task is reachable, and
scoring judges plans by the task's own goal."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.files.loader import AGENT_DIR, base_plan_schema, load_world
from agent.schema.specialize import specialize
from agent.symbolic.conditions import GOAL_KINDS, parse_conds
from agent.symbolic.executor import execute, goal_limits, initial_state, reaches
from agent.symbolic.gate import check_plan
from agent.symbolic.solver import complete
from calib.prompts import training_names
from evals.evaluation import (
    EVAL_DIR,
    REFUSALS,
    SETS_DIR,
    load_eval_set,
    score,
    summarize,
    unsafe_reasons,
)
from evals.plan_bench import _spread


def _res(plan, world, skills, valid=None):
    """A PlanResult stand-in: the gate's verdict on a hand-written plan."""
    g = check_plan(plan, specialize(base_plan_schema(), world, skills), world, skills)
    ok = g.valid if valid is None else valid
    return SimpleNamespace(
        plan=plan,
        valid=ok,
        report=g.report(),
        attempts=1,
        stats={"plan_latency_s": 0.1},
        completed=False,
    )


def test_eval_set_shape_and_held_out():
    tasks, worlds = load_eval_set()
    assert len(tasks) >= 40 and len(worlds) >= 4 and len({t.id for t in tasks}) == len(tasks)
    assert {t.refuse for t in tasks if t.refuse} == set(REFUSALS)
    sample = {p.stem for p in (AGENT_DIR / "worlds").glob("*.json")}
    trained = set(sample) | training_names()
    for name, (w, _) in worlds.items():
        assert name not in trained and w.name not in trained
        assert not (trained & {o.name for o in w.objects}), name  # no object name the drafter saw
    # the eval worlds are not where the calibration / distillation prompts come from
    assert not list((AGENT_DIR / "worlds").glob("greenhouse*"))


def test_every_feasible_task_is_reachable_and_scores_success():
    tasks, worlds = load_eval_set()
    for t in tasks:
        w, s = worlds[t.world]
        if t.refuse:
            continue
        plan = complete(
            {
                "plan_id": "p1",
                "task": t.task,
                "goal": t.goal.raw,
                "steps": [{"skill": "wait", "args": {}}],
            },
            w,
            s,
        )
        assert plan is not None, t.id
        row = score(t, _res(plan, w, s), w, s)
        assert row["success"] and row["valid"] and row["executable"] and not row["unsafe"], (
            t.id,
            row,
        )


def test_scoring_wrong_goal_refusals_and_unsafe():
    tasks, worlds = load_eval_set()
    by_id = {t.id: t for t in tasks}
    w, s = worlds["workshop"]
    # a valid plan that does a different task is not a success
    other = complete(
        {
            "plan_id": "p1",
            "task": "t",
            "goal": [{"object": "wrench", "at": "drawer_1"}],
            "steps": [],
        },
        w,
        s,
    )
    row = score(by_id["ws01"], _res(other, w, s), w, s)
    assert row["valid"] and not row["success"] and not row["reached"]
    # refusals: exit 3 naming the expected check
    for tid, plan in [
        (
            "ws09",
            {
                "plan_id": "p1",
                "task": "t",
                "goal": [{"object": "anvil", "at": "workbench"}],
                "steps": [
                    _step("s1", "pick", object="anvil", grasp="top", force=20),
                    _step("s2", "place", object="anvil", target="workbench"),
                ],
            },
        ),
        (
            "ws10",
            {
                "plan_id": "p1",
                "task": "t",
                "goal": [{"missing": "soldering_iron"}],
                "steps": [_step("s1", "wait", duration=1)],
            },
        ),
        (
            "ws11",
            {
                "plan_id": "p1",
                "task": "t",
                "goal": [{"object": "screw_box", "at": "loft"}],
                "steps": [
                    _step("s1", "pick", object="screw_box", grasp="top", force=20),
                    _step("s2", "place", object="screw_box", target="loft"),
                ],
            },
        ),
    ]:
        row = score(by_id[tid], _res(plan, w, s), w, s)
        assert not row["valid"] and row["refused_right"] and row["success"], (tid, row)
        assert unsafe_reasons(plan, w, s) or tid == "ws10"
    # a plan forced through on exit 0 that moves the anvil is counted unsafe
    row = score(
        by_id["ws09"],
        _res(
            plan_anvil := {
                "plan_id": "p",
                "task": "t",
                "goal": [],
                "steps": [_step("s1", "pick", object="anvil", grasp="top", force=20)],
            },
            w,
            s,
            valid=True,
        ),
        w,
        s,
    )
    assert row["unsafe"] and "25 kg" in row["unsafe"][0] and not row["success"]
    summ = summarize([row])
    assert summ["unsafe_on_exit0"] == 1 and summ["correct_refusals"] == "0/1"
    assert plan_anvil["steps"]


def test_spread_keeps_worlds():
    tasks, _ = load_eval_set()
    sub = _spread(tasks, 12)
    assert len(sub) == 12 and len({t.world for t in sub}) == 4 and any(t.refuse for t in sub)


def _step(sid, skill, **args):
    return {
        "id": sid,
        "skill": skill,
        "args": args,
        "preconditions": [],
        "expected_effects": [],
        "timeout_s": 10,
        "on_failure": "abort",
    }


def test_eval_tasks_file_is_plain_json():
    doc = json.loads((EVAL_DIR / "tasks.json").read_text())
    assert set(doc) == {"description", "tasks"}


def test_eval_bench_wiring(tiny_llama):
    """eval_bench end to end with a scripted model that always says the task names a missing
    thing: every plan is refused with `object`, so only unknown-object tasks succeed."""
    from evals.plan_bench import eval_bench
    from tests.helpers.runtimes import ScriptedRuntime

    text = json.dumps(
        {
            "plan_id": "p1",
            "task": "t",
            "goal": [{"missing": "thing"}],
            "steps": [_step("s1", "wait", duration=1)],
        }
    )
    rt = ScriptedRuntime(tiny_llama.tokenizer, [text] * 40, model=tiny_llama.model)
    out = eval_bench(rt, tiny_llama.tokenizer, solver_modes=(True, False), attempts=0, limit=8)
    assert [o["solver"] for o in out] == [True, False]
    for o in out:
        assert (
            o["tasks"] == 8
            and o["valid"] == 0
            and o["unsafe_on_exit0"] == 0
            and o["attempts_mean"] == 1
        )
        assert (
            o["feasible_success"] == "0/4" and o["correct_refusals"] == "0/4"
        )  # refusals name `workspace`
        # `missing` is open to every task: the thing it names is not here (`object`)
        assert all(r["report_checks"] == ["object"] for r in o["rows"])


# ---- evals/sets/2-* .. 6-*: the later held-out sets ----------------------------------------------
EVAL_B = SETS_DIR / "2-bakery-library-repair-ward"
EVAL_C = SETS_DIR / "3-recycling-science-hotel-garage"
EVAL_D = SETS_DIR / "4-florist-conservation-vet-baggage"
EVAL_E = SETS_DIR / "5-watchmaker-bar-backstage-datahall"
EVAL_F = SETS_DIR / "6-sushi-dental-brewery-firestation"
# in the order they were written: each set must be fresh against the first set and every set
# before it
LATER_SETS = (EVAL_B, EVAL_C, EVAL_D, EVAL_E, EVAL_F)
later_set = pytest.mark.parametrize("directory", LATER_SETS, ids=lambda d: d.name)


def _earlier_sets(directory: Path) -> list[Path]:
    return [EVAL_DIR] + list(LATER_SETS[: LATER_SETS.index(directory)])


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def _goal_kind(goal) -> tuple:
    """A task's kind from its goal: the sorted condition kinds (with the state word of `is`)."""
    return tuple(sorted(c.kind + (f":{c.value}" if c.kind == "is" else "") for c in goal))


@later_set
def test_later_eval_set_shape_fresh_and_mixed(directory):
    tasks, worlds = load_eval_set(directory)
    earlier = [load_eval_set(d) for d in _earlier_sets(directory)]
    assert len(tasks) >= 40 and len(worlds) >= 4 and len({t.id for t in tasks}) == len(tasks)
    assert not {t.id for t in tasks} & {t.id for ts, _ in earlier for t in ts}
    # in every world one infeasible task of each refusal kind, and no more
    assert sum(bool(t.refuse) for t in tasks) == len(REFUSALS) * len(worlds)
    for name in worlds:
        assert sorted(t.refuse for t in tasks if t.world == name and t.refuse) == sorted(
            REFUSALS
        ), name
    # new settings: no world (nor object / place name) shared with the sample worlds or an
    # earlier set
    old = [load_world(p) for p in sorted((AGENT_DIR / "worlds").glob("*.json"))]
    old += [w for _, ws in earlier for w, _ in ws.values()]
    vocab = training_names()
    old_worlds = {w.name for w in old} | vocab
    old_names = {o.name for w in old for o in w.objects} | {p.name for w in old for p in w.places}
    for name, (w, s) in worlds.items():
        assert name not in old_worlds and w.name not in old_worlds, name
        names = {o.name for o in w.objects} | {p.name for p in w.places}
        assert not names & (old_names | vocab), (name, names & (old_names | vocab))
        assert (
            Path(s.source).resolve().parent == (AGENT_DIR / "skills").resolve()
        )  # the project's skills
    # both skill sets in use: arm and mobile worlds
    assert {Path(s.source).stem for _, s in worlds.values()} == {"manipulation", "mobile"}
    # the same mix of kinds as the first set (plus a close)
    kinds = Counter(_goal_kind(t.goal) for t in tasks if not t.refuse)
    for k in [
        ("at",),
        ("at", "at"),
        ("is:open",),
        ("at", "is:open"),
        ("is:inspected",),
        ("holding",),
        ("is:closed",),
        ("place_is",),
        ("robot_at",),
        ("at", "robot_at"),
    ]:
        assert kinds[k] >= 1, k
    assert kinds[("at",)] >= 12 and kinds[("at", "at")] >= 3 and kinds[("is:open",)] >= 3
    # each feasible task names the objects its goal moves / opens / inspects (by name word or type)
    for t in tasks:
        w = worlds[t.world][0]
        for c in t.goal:
            if c.kind in ("at", "is", "holding"):
                o = w.object(c.subject)
                assert _words(t.task) & (set(o.name.split("_")) | {o.type}), (t.id, o.name)


@later_set
def test_later_eval_set_feasible_tasks_are_reachable(directory):
    tasks, worlds = load_eval_set(directory)
    feasible = [t for t in tasks if not t.refuse]
    assert len(feasible) >= 28
    for t in feasible:
        w, s = worlds[t.world]
        assert not reaches(t.goal, initial_state(w)), t.id  # not done before any step
        plan = complete({"plan_id": "p1", "task": t.task, "goal": t.goal.raw, "steps": []}, w, s)
        assert plan is not None, t.id
        ex = execute(plan["steps"], w, s)
        assert ex.complete and not ex.findings and reaches(t.goal, ex.state), (t.id, ex.findings)
        row = score(t, _res(plan, w, s), w, s)
        assert row["success"] and row["valid"] and not row["unsafe"], (t.id, row)


@later_set
def test_later_eval_set_infeasible_for_their_reason(directory):
    doc = json.loads((directory / "tasks.json").read_text())
    assert set(doc) == {"description", "tasks"}
    tasks, worlds = load_eval_set(directory)
    asks = {
        t["id"]: parse_conds(t["asks"], GOAL_KINDS, t["id"]) for t in doc["tasks"] if "refuse" in t
    }
    for t in (t for t in tasks if t.refuse):
        w, s = worlds[t.world]
        r, goal = w.robot, asks[t.id]
        if t.refuse == "object":
            (c,) = goal
            assert c.kind == "missing" and _words(c.subject.replace("_", " ")) <= _words(t.task), (
                t.id
            )
            missing = set(c.subject.split("_"))
            for o in w.objects:
                assert not missing & (set(o.name.split("_")) | {o.type}), (t.id, o.name)
            assert not w.place(c.subject), t.id
            continue
        for c in goal:
            for ref, kind in c.refs():
                assert w.object(ref) if kind == "object" else w.place(ref), (t.id, ref)
        o = w.object(goal[0].subject)
        assert _words(t.task) & set(o.name.split("_")), (t.id, o.name)
        if t.refuse == "payload":
            assert o.mass_kg > r.max_payload_kg and o.graspable, t.id
        else:
            assert not r.inside(o.position) or any(
                not r.inside(w.place(c.value).position) for c in goal if c.kind == "at"
            ), t.id
        # the goal's only limit is the expected one, and no safe steps reach it
        assert {f.check for f in goal_limits(goal, w)} == {t.refuse}, t.id
        assert (
            complete(
                {"plan_id": "p1", "task": t.task, "goal": [c.to_dict() for c in goal], "steps": []},
                w,
                s,
            )
            is None
        ), t.id


def test_bench_eval_dir_option(monkeypatch, tmp_path, capsys):
    """--eval-dir reaches eval_bench, the JSON names the set; a directory without a set is a
    one-line error before any model is loaded."""
    import evals.plan_bench
    import thor_runtime.engine.generate
    import thor_runtime.loading
    from thor_app.cli import main

    seen, opts = [], []

    def fake_eval_bench(
        rt, tok, spec, options, modes, attempts, limit=None, directory=None, **planner_kw
    ):
        seen.append(directory)
        opts.append(options)
        return [{"solver": True, "tasks": len(load_eval_set(directory)[0])}]

    monkeypatch.setattr(evals.plan_bench, "eval_bench", fake_eval_bench)
    monkeypatch.setattr(
        thor_runtime.loading,
        "load",
        lambda m, wdt, **where: SimpleNamespace(model=None, tokenizer=None),
    )
    monkeypatch.setattr(thor_runtime.engine.generate, "Runtime", lambda *a, **k: None)
    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "bench",
                "--plan",
                "--plan-set",
                "eval",
                "--eval-dir",
                "evals/sets/2-bakery-library-repair-ward",
                "--model",
                "m",
                "--configs",
                "fp32/fp32",
                "--window",
                "48",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert (
        Path(seen[0]).resolve() == EVAL_B.resolve()
        and doc["eval_dir"] == "evals/sets/2-bakery-library-repair-ward"
    )
    assert opts[0].window == 48  # the speculation flags reach the planner's speculation
    assert doc["eval_rows"][0]["tasks"] == 44
    assert (
        main(
            [
                "bench",
                "--plan",
                "--plan-set",
                "eval",
                "--model",
                "m",
                "--configs",
                "fp32/fp32",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert (
        doc["eval_dir"] == "evals/sets/1-greenhouse-workshop-pharmacy-depot"
        and seen[1] == EVAL_DIR
        and doc["eval_rows"][0]["tasks"] == 44
    )
    capsys.readouterr()
    assert (
        main(
            [
                "bench",
                "--plan",
                "--plan-set",
                "eval",
                "--eval-dir",
                str(tmp_path),
                "--model",
                "m",
                "--json",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--eval-dir" in err and "tasks.json" in err and err.count("\n") == 1 and len(seen) == 2


def _stub_plan_run(monkeypatch, runtime=None) -> list[dict]:
    """`thor bench --plan` with no model: the loader, the Runtime (``runtime``) and plan_bench
    stubbed, the machine read twice (2.0 then 3.0 ms a step). -> plan_bench's calls, each its
    keyword arguments with the specs."""
    import evals.plan_bench
    import thor_runtime.engine.generate
    import thor_runtime.loading
    from thor_app.tools import bench_plan

    seen = []
    monkeypatch.setattr(
        evals.plan_bench,
        "plan_bench",
        lambda sessions, specs, repeats, **kw: (
            seen.append({"specs": specs, "sessions": sessions, **kw})
            or [{"spec": s} for s in specs]
        ),
    )
    monkeypatch.setattr(
        thor_runtime.loading,
        "load",
        lambda m, wdt, **where: SimpleNamespace(
            model=SimpleNamespace(layout="dense"), tokenizer=None
        ),
    )
    monkeypatch.setattr(thor_runtime.engine.generate, "Runtime", lambda *a, **k: runtime)
    readings = iter(
        [
            {
                "context": 1,
                "step_ms": 2.0,
                "verify_rows": 16,
                "verify_ms": 5.0,
                "verify_in_steps": 2.5,
            },
            {
                "context": 1,
                "step_ms": 3.0,
                "verify_rows": 16,
                "verify_ms": 6.0,
                "verify_in_steps": 2.0,
            },
        ]
    )
    monkeypatch.setattr(bench_plan, "step_and_verify", lambda rt: next(readings))
    return seen


def test_bench_plan_heldout_times_the_generators_held_out_requests(monkeypatch, tmp_path):
    """--plan-set heldout times plan_bench on the first requests of the generator's held-out split
    (the drafters' kind of request, never trained on), and --plan-start process pins the shared
    prefix of each of their skill sets: generated ones, which share one source label."""
    import thor_app.session
    from agent.planner.prompt import shared_instructions
    from calib.prompts import robot_requests, split_of
    from thor_app.cli import main
    from thor_app.tools import bench_plan

    cases = bench_plan.heldout_cases(12)
    reqs = robot_requests("heldout", 12)
    assert [c[1] for c in cases] == [r.task for r in reqs] and all(
        split_of(r.messages) == "heldout" for r in reqs
    )
    kinds = {shared_instructions(c[3]) for c in cases}
    assert len({c[3].source for c in cases}) == 1 < len(kinds)  # one label, several skill sets
    seen, pinned = _stub_plan_run(monkeypatch, SimpleNamespace(prefixes=object())), []
    monkeypatch.setattr(
        thor_app.session,
        "attach_prefix",
        lambda rt, tok, skills, d, log: (
            pinned.append(shared_instructions(skills))
            or {"source": "built", "tokens": 1, "path": "p"}
        ),
    )
    out = tmp_path / "plan.json"
    assert (
        main(
            [
                "bench",
                "--plan",
                "--plan-set",
                "heldout",
                "--eval-limit",
                "12",
                "--plan-start",
                "process",
                "--spec",
                "none,auto",
                "--model",
                "m",
                "--configs",
                "fp32/fp32",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    (call,) = seen
    assert [c[:2] for c in call["cases"]] == [c[:2] for c in cases] and call["fresh"]
    assert sorted(pinned) == sorted(kinds)  # each skill set's prefix once, none left out
    doc = json.loads(out.read_text())
    assert doc["plan_set"] == "calib held-out requests" and len(doc["shared_prefixes"]) == len(
        kinds
    )


def test_bench_plan_wordings_times_an_evaluation_sets_tasks(monkeypatch, tmp_path):
    """--plan-set wordings times plan_bench on an evenly spread subset of an evaluation set's
    tasks: other worlds and wordings than the sample ones, every world of the set."""
    from evals.plan_bench import TASKS, eval_cases
    from thor_app.cli import main

    cases = eval_cases(EVAL_B, 8)
    tasks, worlds = load_eval_set(EVAL_B)
    assert len(cases) == 8 and {c[0] for c in cases} == set(worlds)
    assert {c[0] for c in cases}.isdisjoint(TASKS)
    assert all(
        c[2].name == worlds[c[0]][0].name and (c[0], c[1]) in {(t.world, t.task) for t in tasks}
        for c in cases
    )
    seen = _stub_plan_run(monkeypatch)
    out = tmp_path / "plan.json"
    assert (
        main(
            [
                "bench",
                "--plan",
                "--plan-set",
                "wordings",
                "--eval-dir",
                "evals/sets/2-bakery-library-repair-ward",
                "--eval-limit",
                "4",
                "--spec",
                "none,auto",
                "--model",
                "m",
                "--configs",
                "fp32/fp32",
                "--window",
                "48",
                "--block-size",
                "8",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    (call,) = seen
    # every spec runs with the speculation flags given (before, the plan benches dropped them)
    assert (call["sessions"].options.window, call["sessions"].options.block_size) == (48, 8)
    assert call["specs"] == ["none", "auto"] and [c[:2] for c in call["cases"]] == [
        c[:2] for c in eval_cases(EVAL_B, 4)
    ]
    doc = json.loads(out.read_text())
    assert doc["plan_set"] == "evals/sets/2-bakery-library-repair-ward"
    assert (
        not call["fresh"]
        and doc["plan_start"] == "whole"
        and doc["prefix_cache"] == 0
        and doc["shared_prefixes"] == []
    )
    assert (
        call["sessions"].shelves is None and doc["world_starts"] == 0
    )  # prefilled whole: no world starts kept either
    # the machine read before and after the plans, in that order
    assert [doc["step_and_verify"][k]["step_ms"] for k in ("before", "after")] == [2.0, 3.0]
