"""The planner: a request prepared once (request.py), planned in attempts of named stages
(planner.py: decode, read_goal, check, complete, explain, repair), the result and each attempt
(result.py); the prompt (prompt.py), the goal choice (goal_choice.py) and the request format's
fingerprint (plan_format.py) beside them.

Other packages import the planner through this module; names load on first use, so reading
the prompt's helpers does not load the decoding side.
"""

from __future__ import annotations

__all__ = [
    "PlanResult",
    "Planner",
    "PreparedRequest",
    "SpecializedRequest",
    "compile_request",
    "merge_stats",
    "prepare_request",
    "specialize_request",
]


def __getattr__(name: str):
    # static imports, one branch per module, so the layering test sees every edge
    if name == "Planner":
        from agent.planner import planner as module
    elif name in ("PlanResult", "merge_stats"):
        from agent.planner import result as module
    elif name in (
        "PreparedRequest",
        "SpecializedRequest",
        "compile_request",
        "prepare_request",
        "specialize_request",
    ):
        from agent.planner import request as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
