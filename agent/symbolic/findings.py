"""One problem with a plan: ``Finding(step, check, message)``, shared by the gate and the
symbolic executor (which the gate calls), so neither imports the other's internals."""

from __future__ import annotations

from dataclasses import dataclass

# Safety and shape checks (gate.py), then executability and goal checks (symbolic.py); `action`
# and `order`: a goal's required call or sequence the steps do not do (goals.py).
CHECKS = (
    "json",
    "schema",
    "structure",
    "step_ids",
    "skill",
    "args",
    "bounds",
    "object",
    "place",
    "workspace",
    "payload",
    "graspable",
    "timeout",
    "on_failure",
    "precondition",
    "hand_full",
    "not_held",
    "dropped",
    "left_held",
    "goal",
    "action",
    "order",
)


@dataclass(frozen=True)
class Finding:
    step: str | None  # the step's id (or "#i" when it has none); None for the whole plan
    check: str  # one of CHECKS
    message: str

    def __post_init__(self):
        if self.check not in CHECKS:
            raise ValueError(f"unknown gate check {self.check!r}")

    def to_dict(self) -> dict:
        return {"step": self.step, "check": self.check, "message": self.message}
