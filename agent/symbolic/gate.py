"""After decoding: parse, validate against the schema, the safety gate, then symbolic execution.

Constrained decoding makes schema failures unlikely, but the schema is checked anyway: the
grammar engine is a dependency we do not control, a user schema may be looser than ours, and a
plan cut off at the token budget is not JSON at all. The gate then checks what no schema can
(world state and robot limits), and checks it *independently* of the specialized schema, so a
bug in specialization cannot let an unsafe plan through.

Symbolic execution (symbolic.py) then runs the steps on the world's state and checks that
they reach the plan's own stated goal: a safe plan that does not do its task is not a plan.

Every problem is a ``Finding(step, check, message)``; an empty list means the plan may run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from agent.files.loader import SkillSet, World
from agent.schema.validator import PlanValidator
from agent.symbolic.executor import ParsedGoal, symbolic_findings
from agent.symbolic.findings import CHECKS, Finding  # noqa: F401  (CHECKS re-exported)
from agent.symbolic.limits import _arg_findings, _is_num  # noqa: F401  (re-exported: the solver's safe values)

ON_FAILURE_WORDS = ("abort", "retry")


@dataclass(frozen=True)
class GateResult:
    plan: dict | None
    findings: tuple[Finding, ...]

    @property
    def valid(self) -> bool:
        return self.plan is not None and not self.findings

    def report(self) -> list[dict]:
        return [f.to_dict() for f in self.findings]


def parse_plan(text: str) -> tuple[dict | None, list[Finding]]:
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as e:
        return None, [
            Finding(
                None,
                "json",
                f"not valid JSON ({e.msg} at char {e.pos}); "
                "the output may have been cut off by the token budget",
            )
        ]
    if not isinstance(plan, dict):
        return None, [
            Finding(None, "json", f"the plan must be a JSON object, got {type(plan).__name__}")
        ]
    return plan, []


def schema_findings(plan, schema: dict) -> list[Finding]:
    out = []
    steps = plan.get("steps") if isinstance(plan, dict) else None
    for err in sorted(PlanValidator(schema).iter_errors(plan), key=lambda e: list(e.absolute_path)):
        path = list(err.absolute_path)
        step = None
        if (
            len(path) >= 2
            and path[0] == "steps"
            and isinstance(path[1], int)
            and isinstance(steps, list)
        ):
            step = _step_name(steps[path[1]], path[1])
        where = "/".join(str(p) for p in path) or "plan"
        out.append(Finding(step, "schema", f"{where}: {_short(err)}"))
    return out


def _short(err) -> str:
    # anyOf over per-skill branches yields a useless "is not valid under any of the given schemas";
    # the gate below explains skill/arg problems precisely, so keep this line short.
    msg = err.message
    return msg if len(msg) <= 160 else msg[:157] + "..."


def _step_name(step, i: int) -> str:
    sid = step.get("id") if isinstance(step, dict) else None
    return sid if isinstance(sid, str) and sid else f"#{i + 1}"


def gate_findings(plan: dict, world: World, skills: SkillSet) -> list[Finding]:
    steps = plan.get("steps")
    if not isinstance(steps, list) or not steps:
        return [Finding(None, "structure", "the plan has no steps")]
    out: list[Finding] = []
    ids = [s.get("id") if isinstance(s, dict) else None for s in steps]
    seen: set = set()
    for i, sid in enumerate(ids):
        if not isinstance(sid, str) or not sid:
            out.append(Finding(f"#{i + 1}", "step_ids", "step has no id"))
        elif sid in seen:
            out.append(Finding(sid, "step_ids", f"step id {sid!r} is used more than once"))
        seen.add(sid)
    for i, step in enumerate(steps):
        sid = _step_name(step, i)
        if not isinstance(step, dict):
            out.append(Finding(sid, "structure", "a step must be a JSON object"))
            continue
        skill = skills.get(step.get("skill")) if isinstance(step.get("skill"), str) else None
        if skill is None:
            out.append(
                Finding(
                    sid,
                    "skill",
                    f"unknown skill {step.get('skill')!r}; known: "
                    f"{', '.join(s.name for s in skills.skills)}",
                )
            )
        else:
            args = step.get("args")
            if not isinstance(args, dict):
                out.append(Finding(sid, "args", "args must be a JSON object"))
            else:
                specs = {a.name: a for a in skill.args}
                for name in specs.keys() - args.keys():
                    out.append(Finding(sid, "args", f"{skill.name} needs argument {name!r}"))
                for name in args.keys() - specs.keys():
                    out.append(Finding(sid, "args", f"{skill.name} has no argument {name!r}"))
                for name in [n for n in specs if n in args]:
                    out += _arg_findings(
                        sid, name, specs[name], args[name], world, name in skill.carries
                    )
        t = step.get("timeout_s")
        limit = skill.timeout_s if skill is not None and skill.timeout_s else None
        if not _is_num(t) or t <= 0:
            out.append(
                Finding(
                    sid, "timeout", f"timeout_s must be a positive number of seconds, got {t!r}"
                )
            )
        elif limit is not None and t > limit:
            out.append(
                Finding(
                    sid, "timeout", f"timeout_s {t:g} s exceeds {skill.name}'s limit of {limit:g} s"
                )
            )
        of = step.get("on_failure")
        if of not in ON_FAILURE_WORDS:
            if not isinstance(of, str) or of not in seen:
                out.append(
                    Finding(
                        sid,
                        "on_failure",
                        f"on_failure {of!r} is neither abort, retry nor a step id",
                    )
                )
            elif of == step.get("id"):
                out.append(
                    Finding(sid, "on_failure", 'on_failure jumps to its own step; use "retry"')
                )
    return out


def check_plan(
    text_or_plan, schema: dict, world: World, skills: SkillSet, parsed: ParsedGoal | None = None
) -> GateResult:
    """Parse (when given text), validate against ``schema``, then run the safety gate.
    ``parsed``: the plan's goal as ``parse_goal`` gives it, when the caller already has it."""
    if isinstance(text_or_plan, str):
        plan, findings = parse_plan(text_or_plan)
        if plan is None:
            return GateResult(None, tuple(findings))
    else:
        plan = text_or_plan
        if not isinstance(plan, dict):
            return GateResult(None, (Finding(None, "json", "the plan must be a JSON object"),))
    findings = schema_findings(plan, schema) + gate_findings(plan, world, skills)
    findings += symbolic_findings(plan, world, skills, parsed)
    return GateResult(plan, tuple(findings))
