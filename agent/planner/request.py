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

from agent.files.loader import SkillSet, World, base_plan_schema
from agent.language.lexicon import SHIPPED, load_lexicon
from agent.language.mentions import TaskWords, read_words
from agent.schema.grammar import Grammar, GrammarTokenizer
from agent.schema.specialize import specialize


@dataclass(frozen=True)
class SpecializedRequest:
    """A request checked without the model: what the task names in the world, and the schema
    specialized to the world and the skills."""

    task: str | None
    world: World
    skills: SkillSet
    reading: TaskWords | None  # None without a task
    schema: dict
    seconds: float


@dataclass(frozen=True)
class PreparedRequest:
    """Everything checked before any generation: the task and its reading, the specialized schema
    and its grammar. Built once per request; every attempt of ``Planner.plan`` reuses it."""

    task: str | None
    world: World
    skills: SkillSet
    reading: TaskWords | None
    schema: dict
    grammar: Grammar
    compile_s: float  # reading + specializing + compiling


def specialize_request(
    task: str | None,
    world: World,
    skills: SkillSet,
    schema: dict | None = None,
    max_steps: int | None = None,
    lexicon: str = SHIPPED,
) -> SpecializedRequest:
    """Read what the task names in this world (mentions.py: names, aliases, types, amounts, and
    the hints of the ``lexicon``: ``shipped``, ``none`` or files) and specialize the schema to
    the world and the skills. The goal grammar is the same for every task, in every language:
    the model chooses the goal's form. No tokenizer needed: bad input fails before a model
    loads."""
    t0 = time.perf_counter()
    lex = load_lexicon(lexicon)
    reading = read_words(task, world, lex) if task is not None else None
    spec_schema = specialize(
        schema if schema is not None else base_plan_schema(), world, skills, max_steps
    )
    return SpecializedRequest(task, world, skills, reading, spec_schema, time.perf_counter() - t0)


def compile_request(
    gtok: GrammarTokenizer, req: SpecializedRequest, thinking: bool = False
) -> PreparedRequest:
    """The specialized schema's grammar, exactly as the planner decodes under it."""
    t0 = time.perf_counter()
    grammar = Grammar(gtok, req.schema, thinking=thinking)
    return PreparedRequest(
        req.task,
        req.world,
        req.skills,
        req.reading,
        req.schema,
        grammar,
        req.seconds + time.perf_counter() - t0,
    )


def prepare_request(
    gtok: GrammarTokenizer,
    world: World,
    skills: SkillSet,
    schema: dict | None = None,
    max_steps: int | None = None,
    thinking: bool = False,
    task: str | None = None,
    lexicon: str = SHIPPED,
) -> PreparedRequest:
    """specialize_request, then compile_request."""
    return compile_request(
        gtok, specialize_request(task, world, skills, schema, max_steps, lexicon), thinking
    )
