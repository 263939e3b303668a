"""The task's reading on an evaluation set's worlds: the events and sets it reads, and whether the
goal grammar for a task can write a given goal."""
from __future__ import annotations

from agent.files.loader import base_plan_schema
from agent.language.reading import read_task
from agent.schema.specialize import PlanValidator, specialize
from evals.evaluation import SETS_DIR

SET9 = SETS_DIR / "9-cycleshop-pottery-sortingoffice-linenstore"


def task_goal_schema(task, w, s):
    """(the goal's schema for this task, a validator of goals against it)"""
    spec = specialize(base_plan_schema(), w, s, task=task)
    goal = spec["properties"]["goal"]
    return goal, PlanValidator({**goal, "$defs": spec["$defs"]})


def read_events(task, w):
    return [e.text() for e in read_task(task, w).events]


def read_set(task, w):
    s = read_task(task, w).every
    return None if s is None else (s.every(), s.to)


def fits_goal(task, goal, w, s):
    """The goal grammar for this task can write ``goal`` as given."""
    return not list(task_goal_schema(task, w, s)[1].iter_errors(goal))
