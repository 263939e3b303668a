"""What planning leaves: each attempt as its stages filled it (``Attempt``), and the plan's result
(``PlanResult``) with its generations' stats summed (``merge_stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.symbolic.executor import ParsedGoal
from agent.symbolic.gate import GateResult
from thor_runtime.engine import Stats

_ADDITIVE = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "pinned_prompt_tokens",
    "generated",
    "prefill_s",
    "decode_s",
    "cycles",
    "drafted",
    "accepted",
    "committed",
    "jump_forward",
    "relaxed_accepted",
    "draft_s",
    "verify_s",
    "rest_s",
    "grammar_s",
)


@dataclass(frozen=True)
class PlanResult:
    plan: dict | None  # the last attempt's parsed plan (None when it was not JSON)
    valid: bool  # passed schema + gate
    report: list  # [{step, check, message}]; empty when valid
    stats: dict  # generate's stats summed over attempts, plus attempts / latency
    attempts: int  # generations run (1 + repairs used)
    text: str = ""  # the last attempt's JSON text
    history: tuple = field(default_factory=tuple)  # per attempt: Attempt.record()
    completed: bool = False  # the steps returned are the symbolic solver's, from the model's goal
    generations: tuple = ()  # each attempt's own Stats (the service's metrics count generations)
    # each set of the last attempt's goal as the objects it takes ("every object that is a
    # tool: trowel, shears"), so a user sees what "all the tools" came to before it runs
    expansion: tuple = ()

    def document(self) -> dict:
        """The result as `thor plan --json` prints it and POST /v1/plan answers it."""
        return {
            "plan": self.plan,
            "valid": self.valid,
            "report": self.report,
            "expansion": list(self.expansion),
            "stats": self.stats,
        }


@dataclass
class Attempt:
    """One attempt of a plan, filled stage by stage (Planner.decode, read_goal, check, complete,
    explain)."""

    result: object  # the generation, after the goal choice
    stop: object  # the goal check run while decoding (solver.GoalStop)
    # its generations' Stats: one, or two when a chosen goal's steps were decoded after it
    generations: list = field(default_factory=list)
    choice: dict | None = None  # what the goal choice did (Choice.summary()), when it ran
    # read_goal
    text: str = ""  # the plan's JSON text: the model's, or the solver's
    model_text: str = ""  # the model's, before the solver
    plan: dict | None = None  # the parsed plan; None when the text is not a whole plan
    unreadable: list = field(default_factory=list)  # why the text gave no plan (gate.parse_plan)
    cut_in_free: bool = False  # the budget cut it in its free text, dropped
    stated: dict | None = None  # the goal a plan that is not whole still wrote
    parsed: ParsedGoal | None = None  # the one parse of the attempt's goal
    # check, complete, explain
    gate: GateResult | None = None
    completed: bool = False  # the steps are the solver's, from the model's goal
    check_s: float = 0.0  # reading, checks and the solver

    @property
    def goal(self) -> dict | None:
        """What the attempt's goal is read from: its plan, else the goal it stated."""
        return self.plan if self.plan is not None else self.stated

    def record(self) -> dict:
        """The attempt in PlanResult.history."""
        return {
            "text": self.text,
            "report": self.gate.report(),
            "finish_reason": self.result.finish_reason,
            "completed": self.completed,
            "model_text": self.model_text,
        }


def merge_stats(parts: list[Stats]) -> Stats:
    """Sum the additive counters of several generations; ttft is the first one's (latency to
    the first planned token the user sees)."""
    if not parts:
        return Stats()
    total = Stats(kv_dtype=parts[0].kv_dtype, device=parts[0].device, spec_note=parts[0].spec_note)
    for name in _ADDITIVE:
        setattr(total, name, sum(getattr(p, name) for p in parts))
    total.kv_bytes = max(p.kv_bytes for p in parts)
    total.ttft_s = parts[0].ttft_s
    width = max(len(p.pos_offered) for p in parts)
    total.pos_offered = [
        sum(p.pos_offered[j] for p in parts if j < len(p.pos_offered)) for j in range(width)
    ]
    total.pos_accepted = [
        sum(p.pos_accepted[j] for p in parts if j < len(p.pos_accepted)) for j in range(width)
    ]
    total.auto_choice = parts[-1].auto_choice  # what the attempt that ended the plan ran
    return total
