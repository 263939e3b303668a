"""No planner module reads a task with words of a language written in code: regular expressions
and word lists over task text live nowhere but in lexicon files (agent/language/lexicons/),
read by the lexicon loader. The check reads the sources with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[3] / "agent"
# the one module that reads words of a language, and only from the lexicon files
LOADER = AGENT / "language" / "lexicon.py"
# a grammar error message from llguidance, not a task's text
ALLOWED_RE = {AGENT / "schema" / "grammar.py"}


def plan_vocabulary() -> set[str]:
    """The words of the plan's own language (keys, kinds, types in the shipped JSON schemas and
    skills files, and JSON Schema's keywords): lists of these are the planner's, not a
    language's."""
    import json

    import jsonschema

    out = set(jsonschema.Draft202012Validator.VALIDATORS) | {
        "default",
        "examples",
        "title",
        "description",
    }

    def walk(x) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                out.add(k)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, str) and x.isidentifier():
            out.add(x)

    for f in list((AGENT / "schemas").glob("*.json")) + list((AGENT / "skills").glob("*.json")):
        walk(json.loads(f.read_text()))
    return out


def word_lists(tree: ast.AST, known: set[str] = frozenset()) -> list[str]:
    """Literal lists, tuples and sets of three or more lower-case words (a vocabulary) that are
    not all words of the plan's own language (``known``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            words = [
                e.value
                for e in node.elts
                if isinstance(e, ast.Constant)
                and isinstance(e.value, str)
                and e.value.isalpha()
                and e.value.islower()
            ]
            if len(words) >= 3 and len(words) == len(node.elts) and not set(words) <= known:
                out.append(f"{node.lineno}: {words[:4]}")
    return out


def regex_uses(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "re" for a in node.names):
            out.append(f"{node.lineno}: import re")
        elif isinstance(node, ast.ImportFrom) and node.module == "re":
            out.append(f"{node.lineno}: from re import")
    return out


def test_no_regular_expression_or_word_list_over_task_text_outside_the_lexicon_loader():
    files = sorted(p for p in AGENT.rglob("*.py") if p != LOADER)
    assert len(files) > 20
    known = plan_vocabulary()
    assert {"holding", "every", "before", "inspect", "integer"} <= known
    bad = {}
    for f in files:
        tree = ast.parse(f.read_text(), str(f))
        found = word_lists(tree, known) + ([] if f in ALLOWED_RE else regex_uses(tree))
        if found:
            bad[str(f.relative_to(AGENT))] = found
    assert bad == {}


def test_the_check_sees_a_word_list_and_a_regex(tmp_path):
    tree = ast.parse(
        'import re\nSET_WORDS = frozenset({"all", "every", "each"})\nKEYS = ("do", "before")\n'
    )
    assert word_lists(tree) == ["2: ['all', 'every', 'each']"] and regex_uses(tree) == [
        "1: import re"
    ]
