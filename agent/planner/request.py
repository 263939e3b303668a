"""A plan request, prepared once before any generation: the task read, the schema specialized to
it and compiled to a grammar; every attempt of ``Planner.plan`` reuses them.

``thor plan`` splits the preparation in two: ``specialize_request`` before the model loads (bad
input fails in milliseconds, no tokenizer needed), ``compile_request`` after; the service
prepares before queueing (``prepare_request``, both at once). Each hands the result to
``Planner.plan``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from thor_runtime.errors import ThorError

from agent.files.loader import SkillSet, World, base_plan_schema
from agent.language.reading import TaskReading, read_task
from agent.schema.grammar import Grammar, GrammarTokenizer
from agent.schema.specialize import specialize

# Where the task's word rules (reading.py) act: the goal grammar's focus and the gate's grounding
# check, one of them, or neither (an ablation: what the rules add on a set they were not
# written from)
WORD_RULES = ("all", "grammar", "gate", "none")


@dataclass(frozen=True)
class SpecializedRequest:
    """A request checked without the model: the task's reading and the schema specialized to it."""
    task: str | None
    world: World
    skills: SkillSet
    reading: TaskReading | None    # None without a task
    schema: dict
    seconds: float
    grounding: bool = True         # the gate holds the goal to the task's words (grounding.py)


@dataclass(frozen=True)
class PreparedRequest:
    """Everything checked before any generation: the task and its reading, the specialized schema
    and its grammar. Built once per request; every attempt of ``Planner.plan`` reuses it."""
    task: str | None
    world: World
    skills: SkillSet
    reading: TaskReading | None
    schema: dict
    grammar: Grammar
    compile_s: float           # reading + specializing + compiling
    grounding: bool = True     # the gate holds the goal to the task's words (grounding.py)


def specialize_request(task: str | None, world: World, skills: SkillSet, schema: dict | None = None,
                       max_steps: int | None = None, words: str = "all") -> SpecializedRequest:
    """Read the task and specialize the schema to it (with a task, the goal is focused on the
    objects it speaks of: specialize.py). No tokenizer needed: bad input fails before a model
    loads. ``words``: where the task's word rules act (an ablation; WORD_RULES): ``all``, only
    in the goal ``grammar``, only in the ``gate`` (grounding.py), or ``none`` (the goal grammar
    is this world's and these skills', and the goal is held to no words)."""
    if words not in WORD_RULES:
        raise ThorError(f"word rules must be one of {', '.join(WORD_RULES)}, got {words!r}")
    t0 = time.perf_counter()
    reading = read_task(task, world) if task is not None and words != "none" else None
    focus = words in ("all", "grammar")
    spec_schema = specialize(schema if schema is not None else base_plan_schema(), world, skills,
                             max_steps, task if focus else None, reading if focus else None)
    return SpecializedRequest(task, world, skills, reading, spec_schema, time.perf_counter() - t0,
                              words in ("all", "gate"))


def compile_request(gtok: GrammarTokenizer, req: SpecializedRequest,
                    thinking: bool = False) -> PreparedRequest:
    """The specialized schema's grammar, exactly as the planner decodes under it."""
    t0 = time.perf_counter()
    grammar = Grammar(gtok, req.schema, thinking=thinking)
    return PreparedRequest(req.task, req.world, req.skills, req.reading, req.schema, grammar,
                           req.seconds + time.perf_counter() - t0, req.grounding)


def prepare_request(gtok: GrammarTokenizer, world: World, skills: SkillSet,
                    schema: dict | None = None, max_steps: int | None = None,
                    thinking: bool = False, task: str | None = None,
                    words: str = "all") -> PreparedRequest:
    """specialize_request, then compile_request."""
    return compile_request(gtok, specialize_request(task, world, skills, schema, max_steps, words),
                           thinking)
