"""`thor bench --serve`'s ceiling: the most plans/s any batching could give on this machine.

A verified row commits at most one token and a computed prompt token costs a row too, so a plan
needs at least (tokens generated + prompt tokens computed) rows, whoever shares its forwards.
The cheapest a row gets is the best seconds per row of one forward at a plan's context, over
the widths a shared round can take, with logits read by id as most of a plan's rows read them.
One over (rows per plan x that) is a plans/s no scheduler passes: it leaves out every rejected
draft, the drafter, the grammar and the Python between rounds, which only add to a plan's time.
A second figure adds what a plan spent outside its verifies while decoding (its drafter's
forwards and the grammar, selection and cache upkeep between them, from the plan's own stats),
which each sequence still does for itself when rounds are shared. Where these are below what
a goal asks (2x one-at-a-time serving), batching cannot meet the goal on these cores."""

from __future__ import annotations

from thor_runtime.speculative import timed_verifies, verify_calls

WIDTHS = (4, 8, 16, 32, 64)  # rows of one forward: a lone verify up to four sequences' rounds


def row_floor(runtime, context: int, widths=WIDTHS) -> dict:
    """Seconds per row of one verify of R rows at ``context`` cached tokens, R in ``widths``, with
    logits read by id (the verify cost curve's timing, speculative/cost.py), and the cheapest."""
    cache = runtime.decode.cache(
        runtime.new_cache, context + verify_calls(widths) + max(widths), max(widths)
    )
    try:
        _, by_id = timed_verifies(runtime, cache, context, widths)
    finally:
        runtime.decode.release(cache)
    per_row = {r: s / r for r, s in zip(widths, by_id)}
    rows = min(per_row, key=per_row.get)
    return {
        "context": context,
        "s_per_row": {str(r): s for r, s in per_row.items()},
        "best_rows": rows,
        "best_s_per_row": per_row[rows],
    }


def step_and_verify(runtime, context: int = 1024, rows: int = 16) -> dict:
    """Where the machine stands for a speculation ratio: ms of a 1-row step and of a ``rows``-row
    verify at ``context`` cached tokens (at most what the model's positions allow), logits read
    by id, and the verify in steps. A plain step is bound by memory, a wide verify by the cores'
    dot products: the ratios between specs move with this, run to run, on a shared machine."""
    most = runtime.model.cfg.max_position_embeddings - verify_calls((1, rows)) - rows - 1
    floor = row_floor(runtime, max(1, min(context, most)), (1, rows))
    step, wide = floor["s_per_row"]["1"], floor["s_per_row"][str(rows)] * rows
    return {
        "context": floor["context"],
        "step_ms": round(step * 1e3, 3),
        "verify_rows": rows,
        "verify_ms": round(wide * 1e3, 3),
        "verify_in_steps": round(wide / step, 3),
    }


def ceiling(floor: dict, plan_stats: list[dict]) -> dict:
    """The plans/s ceiling from ``row_floor``'s result and the plans' stats (generated and
    computed prompt tokens, as a plan's result reports them)."""
    rows = [s["generated_tokens"] + s["prompt_tokens_computed"] for s in plan_stats]
    per_plan = sum(rows) / len(rows)
    other = sum(s["drafter_and_between_s"] for s in plan_stats) / len(plan_stats)
    floor_s = per_plan * floor["best_s_per_row"]
    return {
        **floor,
        "plans": len(rows),
        "rows_per_plan": round(per_plan, 1),
        "plans_per_s": round(1.0 / floor_s, 3),
        "drafter_and_between_s": round(other, 4),
        "plans_per_s_with_them": round(1.0 / (floor_s + other), 3),
    }


def against(ceil: dict, one_at_a_time: list[dict], clients: int = 4, goal: float = 2.0) -> dict:
    """The ceiling beside what the goal asks: ``goal`` times one-at-a-time plans/s at
    ``clients``."""
    row = next((r for r in one_at_a_time if r["clients"] == clients), None)
    if row is None:
        return ceil
    asked = goal * row["req_per_s"]
    return {
        **ceil,
        "goal_clients": clients,
        "goal_plans_per_s": round(asked, 3),
        "ceiling_over_goal": round(ceil["plans_per_s"] / asked, 3),
        "with_them_over_goal": round(ceil["plans_per_s_with_them"] / asked, 3),
    }


def markdown_line(ceil: dict) -> str:
    line = (
        f"compute ceiling: {ceil['plans_per_s']} plans/s ({ceil['rows_per_plan']} rows a plan at "
        f"{ceil['best_s_per_row'] * 1e3:.3f} ms a row, the cheapest width {ceil['best_rows']} "
        f"at context {ceil['context']})"
    )
    line += (
        f"; with each plan's drafter and between-verify work ({ceil['drafter_and_between_s']} s): "
        f"{ceil['plans_per_s_with_them']} plans/s"
    )
    if "goal_plans_per_s" in ceil:
        line += (
            f"; 2x one-at-a-time at {ceil['goal_clients']} clients asks {ceil['goal_plans_per_s']} "
            f"(ceiling / asked: {ceil['ceiling_over_goal']}, "
            f"with them: {ceil['with_them_over_goal']})"
        )
    return line
