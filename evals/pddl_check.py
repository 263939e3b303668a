"""A second opinion on every plan of a set that carries PDDL (evals/sets/8-blocksworld): the
plan's steps as a PDDL plan, checked against the set's domain and the task's own problem file by
an independent validator from the package registry (pddl-pyvalidator, which reads PDDL with
unified-planning), beside this project's symbolic execution.

Independent on purpose: neither the world file, the skills' declared effects nor the executor
take part. The translation only renames (each step's skill to its action, its arguments in the
action's order, world names to PDDL names), and the problem is the file the world and the task
were translated from, so a wrong translation of the set, a skill whose declared effects differ
from the domain's, or a bug in the executor shows as a disagreement between the two verdicts.

A set opts in with a ``"pddl"`` entry in its tasks.json, and each task names its problem:

    "pddl": {"domain": "domain.pddl", "actions": {SKILL: [ACTION, [ARG, ...]], ...},
             "objects": {WORLD NAME: PDDL NAME, ...}}
    {"id": ..., "problem": "problems/bw-4-01.pddl", ...}
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent.files.loader import read_json
from thor_runtime.errors import ThorError

INSTALL = "pip install 'thor-runtime[bench]' (pddl-pyvalidator, pddl)"


@dataclass(frozen=True)
class PddlBinding:
    domain: Path
    actions: dict  # skill -> (action name, [skill argument, ...] in the action's order)
    objects: dict  # world name -> PDDL name
    problems: dict  # task id -> its problem file

    def plan_lines(self, plan) -> tuple[list[str] | None, str]:
        """-> (the steps as PDDL plan lines, "") or (None, why they have no PDDL form)."""
        steps = plan.get("steps") if isinstance(plan, dict) else None
        if not isinstance(steps, list):
            return None, "the plan has no steps"
        lines = []
        for i, step in enumerate(steps):
            skill = step.get("skill") if isinstance(step, dict) else None
            args = step.get("args") if isinstance(step, dict) else None
            if skill not in self.actions or not isinstance(args, dict):
                return None, f"step {i + 1}: {skill!r} is no action of the domain"
            action, names = self.actions[skill]
            vals = [args.get(n) for n in names]
            if any(v not in self.objects for v in vals):
                return (
                    None,
                    f"step {i + 1}: {skill} {vals} names something the problem does not have",
                )
            lines.append(f"({action} {' '.join(self.objects[v] for v in vals)})")
        return lines, ""


def load_binding(directory: Path) -> PddlBinding | None:
    """The set's PDDL binding, or None when its tasks.json has none. A binding naming a file that
    is not there, or a task with no problem, is an error, before any model loads."""
    directory = Path(directory)
    doc = read_json(directory / "tasks.json", "eval tasks")
    spec = doc.get("pddl") if isinstance(doc, dict) else None
    if spec is None:
        return None
    try:
        domain = directory / spec["domain"]
        actions = {k: (v[0], list(v[1])) for k, v in spec["actions"].items()}
        objects = dict(spec["objects"])
        problems = {t["id"]: directory / t["problem"] for t in doc["tasks"]}
    except (KeyError, TypeError, IndexError) as e:
        raise ThorError(
            f"{directory / 'tasks.json'}: the `pddl` entry needs domain, actions, objects and a "
            f"`problem` for every task ({e})"
        ) from None
    for p in [domain, *problems.values()]:
        if not p.is_file():
            raise ThorError(f"{directory / 'tasks.json'}: PDDL file not found: {p}")
    return PddlBinding(domain, actions, objects, problems)


def require_validator() -> None:
    """The validator is an optional dependency: say how to get it, before any model loads."""
    try:
        import pyval  # noqa: F401
    except ImportError:
        raise ThorError(
            f"this evaluation set checks every plan with a PDDL validator; {INSTALL}"
        ) from None


def validate(binding: PddlBinding, task_id: str, plan) -> dict:
    """-> {"pddl_valid": True / False (None: no plan to check), "pddl_report": why not, in
    short}."""
    if not isinstance(plan, dict):
        return {"pddl_valid": None, "pddl_report": "no plan"}
    lines, why = binding.plan_lines(plan)
    if lines is None:
        return {"pddl_valid": False, "pddl_report": why}
    from pyval import PDDLValidator
    from unified_planning.shortcuts import get_environment

    get_environment().credits_stream = None  # the library's banner is not the bench's output
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.txt"
        path.write_text("\n".join(lines) + "\n")
        res = PDDLValidator().validate(
            str(binding.domain), str(binding.problems[task_id]), str(path)
        )
    return {"pddl_valid": bool(res.is_valid), "pddl_report": "" if res.is_valid else _why(res)}


def _why(res) -> str:
    if res.failed_step is not None:
        step = next((s for s in res.steps if s.index == res.failed_step), None)
        unmet = ", ".join(u.expression for u in step.unsatisfied) if step is not None else ""
        return f"step {res.failed_step}: {step.action if step else ''} needs {unmet}".strip()
    if res.unsatisfied_goals:
        return "goal not reached: " + ", ".join(g.expression for g in res.unsatisfied_goals)
    return res.status.lower()
