"""Plan benchmark: constrained planning latency per speculation method, side by side; and the
held-out evaluation (``eval_bench``): task success, refusals and safety per model.

Used by ``thor bench --plan``. Every method plans the same tasks on the same worlds in
one run; greedy constrained speculation must produce the same plans as plain decoding,
and the rows say whether it did.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

from agent.files.loader import AGENT_DIR, load_skills, load_world, resolve_skills_path
from agent.planner import Planner
from agent.planner.plan_format import plan_format_fingerprint
from evals.evaluation import EVAL_DIR, first_attempt_alone, load_eval_set, score, summarize
from evals.pddl_check import load_binding, validate
from thor_runtime.config import PlannerSettings
from thor_runtime.speculative import SpecOptions, build_speculation

TASKS = {
    "kitchen": ["put the red cup in the sink", "move the apple to the table"],
    "warehouse": ["bring box_a to dock_1", "move the small tote to the staging area"],
    "lab_bench": ["put the test tube in rack slot 1", "move the beaker to the tray"],
}


def _p90(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def plan_cases(limit: int | None = None) -> list[tuple]:
    """(world name, task, World, SkillSet) of the benchmark's plan requests, the first ``limit``."""
    cases = []
    for name, tasks in TASKS.items():
        world = load_world(AGENT_DIR / "worlds" / f"{name}.json")
        skills = load_skills(resolve_skills_path(world, None))
        cases += [(name, t, world, skills) for t in tasks]
    return cases[:limit]


def eval_cases(directory=None, limit: int | None = None) -> list[tuple]:
    """plan_cases' tuples for an evenly spread subset of an evaluation set's tasks: other
    worlds and other wordings than the sample ones (``--plan-set wordings``)."""
    tasks, worlds = load_eval_set(directory) if directory else load_eval_set()
    return [(t.world, t.task, *worlds[t.world]) for t in _spread(tasks, limit)]


# per plan: where its prompt came from and where its time went (docs/planning.md)
WHERE_TIME_GOES = (
    "plan_latency_s",
    "attempts",
    "prompt_tokens_from_disk",
    "prompt_tokens_from_memory",
    "prompt_tokens_computed",
    "time_prefill_s",
    "time_decode_s",
    "time_grammar_s",
    "time_check_s",
)


def plan_bench(
    open_session,
    specs,
    repeats: int = 1,
    limit: int | None = None,
    cases: list[tuple] | None = None,
    fresh: bool = False,
) -> list[dict]:
    """open_session(spec): a new plan session (thor_app/session.py, as `thor plan` and the
    service plan through one; `thor bench --plan` builds them: bench_plan.spec_sessions) that
    plans with that spec, every spec's over the same runtime, each with its own world starts,
    written after each plan as `thor plan` does once its plan is out. cases: plan_cases'
    tuples (default: the sample worlds' tasks, the first ``limit``). fresh: every plan starts
    as in a new `thor plan` process: the runtime's recent prompts forgotten (its pinned starts
    kept) and a new session, whose ``auto`` starts from what the spec's previous plan left (as
    `thor plan` reads it from disk: speculative/auto_state.py).

    The specs take turns request by request (each case runs under every spec before the next
    case, the first spec rotating), so a machine whose speed drifts during the run moves
    every spec alike: the ratios between them are paired, not minutes apart
    (``decode_vs_first_paired``: the median of the per-request ratios). Each spec keeps
    its own planner (``auto`` learns from its own requests only) and, unless fresh, its own
    recent prompts, as a service running it alone would: a prompt one spec prefilled does not
    start warm for the next (and a DFlash request needs taps that a lookup one does not keep)."""
    cases = plan_cases(limit) if cases is None else cases
    sessions = [open_session(spec) for spec in specs]
    runtime = sessions[0].runtime
    shared = runtime.prefixes
    memories = [shared.sibling() if shared is not None else None for _ in specs]
    runs = [
        {"lat": [], "dec": [], "acc": [], "jf": 0, "valid": 0, "plans": [], "where": []}
        for _ in specs
    ]
    turn = 0
    try:
        for r in range(repeats):
            for name, task, world, skills in cases:
                for j in range(len(specs)):
                    i = (turn + j) % len(specs)
                    print(f"bench plan: spec={specs[i]} {name}: {task}", file=sys.stderr)
                    runtime.prefixes = memories[i]
                    if fresh:
                        if memories[i] is not None:
                            memories[i].forget()
                        # a new process: what auto learned comes through its file (auto_state.py)
                        learned = sessions[i].learned()
                        sessions[i] = open_session(specs[i])
                        sessions[i].resume(learned)
                    res = sessions[i].plan(task, world, skills)
                    sessions[i].after_plan()
                    s, run = res.stats, runs[i]
                    run["lat"].append(s["plan_latency_s"])
                    run["dec"].append(s["decode_tok_s"])
                    run["acc"].append(s["accept_length_mean"])
                    run["where"].append(
                        {
                            "case": name,
                            "decode_tok_s": s["decode_tok_s"],
                            **{k: s[k] for k in WHERE_TIME_GOES},
                        }
                    )
                    if r == 0:
                        run["jf"] += s["jump_forward_tokens"]
                        run["valid"] += bool(res.valid)
                        run["plans"].append(res.text)
                turn += 1
    finally:  # the runtime's own memory back, whatever happened
        runtime.prefixes = shared
    rows = []
    for spec, run in zip(specs, runs):
        lat = run["lat"]
        row = {
            "spec": spec,
            "plans": len(cases),
            "valid": run["valid"],
            "latency_median_s": round(statistics.median(lat), 3),
            "latency_p90_s": round(_p90(lat), 3),
            "decode_tok_s": round(statistics.median(run["dec"]), 2),
            "accept_length_mean": round(statistics.mean(run["acc"]), 3),
            "jump_forward_tokens": run["jf"],
            "latencies_s": [round(x, 4) for x in lat],
            "per_plan": run["where"],
        }
        if rows:
            row["plans_identical_to_first"] = run["plans"] == runs[0]["plans"]
        rows.append(row)
    base = rows[0]["decode_tok_s"] if rows else 0
    for row, run in zip(rows[1:], runs[1:]):
        row["decode_vs_first"] = round(row["decode_tok_s"] / base, 2) if base else None
        row["decode_vs_first_paired"] = _paired(run["dec"], runs[0]["dec"])
    return rows


def _paired(dec: list[float], first: list[float]) -> float | None:
    """The median over requests of one spec's decode tok/s over the first spec's on the same
    request, planned right after it: each ratio holds the request's length and wording and the
    machine's speed of that moment alike, where a ratio of medians compares different plans."""
    ratios = [d / f for d, f in zip(dec, first) if f > 0]
    return round(statistics.median(ratios), 2) if ratios else None


def _spread(tasks: list, limit: int | None) -> list:
    """An evenly spaced subset (keeps every world and the infeasible tasks represented)."""
    if not limit or limit >= len(tasks):
        return tasks
    by_world: dict[str, list] = {}
    for t in tasks:
        by_world.setdefault(t.world, []).append(t)
    if (
        len(by_world) > limit
    ):  # a world per task (Blocksworld): the first task of evenly spaced worlds
        groups = list(by_world.values())
        return [
            groups[i][0]
            for i in sorted(
                {round(j * (len(groups) - 1) / max(limit - 1, 1)) for j in range(limit)}
            )
        ]
    out = []
    for i, group in enumerate(
        by_world.values()
    ):  # first and last of each world's list, and between
        k = limit // len(by_world) + (i < limit % len(by_world))
        idx = sorted({round(j * (len(group) - 1) / max(k - 1, 1)) for j in range(k)}) if k else []
        out += [group[j] for j in idx]
    return out


def eval_bench(
    runtime,
    tokenizer,
    spec: str = "none",
    options: SpecOptions | None = None,
    solver_modes=(True, False),
    attempts: int = PlannerSettings.attempts,
    max_tokens: int = PlannerSettings.max_tokens,
    limit: int | None = None,
    directory=None,
    goal_choice: int = PlannerSettings.goal_choice,
    lexicon: str = PlannerSettings.lexicon,
) -> list[dict]:
    """-> one summary per solver mode (True: steps completed from the model's goal when they
    miss it; False: the model's steps alone), each with its per-task rows. On a set with PDDL
    (pddl_check.py) every plan is also checked by the independent validator. ``options``: as
    plan_bench's. ``goal_choice`` and ``lexicon``: the Planner's (goal_choice.py; the word
    knowledge it may take as hints, language/lexicon.py). Progress names each task by its id
    only: a blind set is run before anyone reads its tasks."""
    tasks, worlds = load_eval_set(directory) if directory else load_eval_set()
    binding = load_binding(directory or EVAL_DIR)
    tasks = _spread(tasks, limit)
    # as `thor plan` speculates: a drafter trained on another plan format is stale (auto declines
    # it)
    speculation = build_speculation(
        replace(options or SpecOptions(), method=spec),
        runtime.model,
        plan_format=plan_format_fingerprint(),
    )
    out = []
    for solver in solver_modes:
        planner = Planner(
            runtime,
            tokenizer,
            speculation,
            max_tokens=max_tokens,
            attempts=attempts,
            complete=solver,
            goal_choice=goal_choice,
            lexicon=lexicon,
        )
        rows = []
        for t in tasks:
            world, skills = worlds[t.world]
            print(f"bench eval: solver={'on' if solver else 'off'} {t.id}", file=sys.stderr)
            res = planner.plan(t.task, world, skills)
            rows.append(score(t, res, world, skills))
            r = rows[-1]
            r["first_attempt_alone"] = first_attempt_alone(
                t, res, planner.prepare(world, skills, task=t.task).schema, world, skills
            )
            r["goal"] = (
                res.plan.get("goal") if isinstance(res.plan, dict) else None
            )  # what the plan stated
            if goal_choice:  # what the choice did, per attempt
                r.update(
                    goal_changed=res.stats.get("goal_changed", 0),
                    goal_choice=res.stats.get("goal_choice", []),
                    goal_choice_s=res.stats.get("goal_choice_s", 0.0),
                )
            if binding is not None:
                r.update(validate(binding, t.id, res.plan))
            print(
                f"  success={r['success']} valid={r['valid']} checks={r['report_checks']}"
                + (f" pddl_valid={r['pddl_valid']}" if binding is not None else ""),
                file=sys.stderr,
            )
        out.append({"solver": solver, **summarize(rows), "rows": rows})
    return out
