"""Where a plan prompt's tokens go: the instructions, the worked example, the goal forms, the
skills, the world, the task and the chat template around them. A shorter prompt is less
prefill before a robot's first step; this says which part would pay to cut.

The parts are the texts prompt.py joins, tokenized one by one; `template` is what the whole
chat-encoded prompt has beyond their sum (role markers, newlines, merges at the seams).
"""

from __future__ import annotations

import statistics

from agent.files.loader import SkillSet, World
from agent.planner.prompt import (
    _EXAMPLE,
    GOAL_RULE,
    OPENING,
    build_messages,
    describe_skills,
    describe_world,
    goal_forms,
)

PARTS = ("instructions", "example", "goal_forms", "skills", "world", "task", "template")


def prompt_parts(tok, task: str, world: World, skills: SkillSet) -> dict[str, int]:
    """-> tokens per part of ``task``'s first-attempt prompt, and ``total``."""

    def n(text: str) -> int:
        return len(tok.encode(text))

    total = len(tok.encode_chat(build_messages(task, world, skills)))
    parts = {
        "instructions": n(OPENING + "\n" + GOAL_RULE[0] + GOAL_RULE[1]),
        "example": n("Example: " + _EXAMPLE),
        "goal_forms": n(goal_forms(skills)),
        "skills": n(describe_skills(skills)),
        "world": n(describe_world(world, skills)),
        "task": n(task),
    }
    parts["template"] = total - sum(parts.values())
    return {**parts, "total": total}


def summarize(rows: list[dict]) -> dict[str, dict[str, float]]:
    """rows of prompt_parts -> per part: median tokens and median share of the prompt."""
    out = {}
    for p in (*PARTS, "total"):
        xs = [r[p] for r in rows]
        out[p] = {
            "median": statistics.median(xs),
            "share": round(statistics.median(r[p] / r["total"] for r in rows), 3),
        }
    return out
