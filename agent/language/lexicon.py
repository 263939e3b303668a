"""Word knowledge as data: one lexicon file per language, checked against its schema.

A lexicon says which phrases of its language hint at a goal form (a set, an order, a repeat), at
a skill, at an object state, which phrases are numbers and which are units. The planner never
needs one: the model writes the goal under a grammar open to every form in every language, and
a lexicon only adds to the rank of the goals whose form its phrases hint at (goal_choice.py).
English ships (lexicons/en.json); a deployment adds its own words, or a language, by a file of
the same shape (``--lexicon FILE``), with no code.

This module is the only one of the planner that holds words of a language, and it holds them
only as they are read from the files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from agent.files.names import words
from thor_runtime.errors import ThorError

LEXICON_DIR = Path(__file__).resolve().parent / "lexicons"
SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "lexicon.schema.json"
# the ablation and the default: no word knowledge at all, or every lexicon that ships
NONE, SHIPPED = "none", "shipped"

Phrase = tuple[str, ...]


@dataclass(frozen=True)
class Lexicon:
    """Several languages' lexicons merged: what any of them knows, the task's language unknown."""

    languages: tuple[str, ...] = ()
    ignore: frozenset[str] = frozenset()
    joiners: frozenset[str] = frozenset()  # "a hundred and eighty": and
    numbers: dict[Phrase, float] = field(default_factory=dict)
    units: dict[Phrase, tuple[str, float]] = field(default_factory=dict)  # -> (unit, factor)
    forms: dict[str, tuple[Phrase, ...]] = field(default_factory=dict)  # every|before|times
    skills: dict[str, tuple[Phrase, ...]] = field(default_factory=dict)  # skill name ->
    states: dict[str, tuple[Phrase, ...]] = field(default_factory=dict)  # state ->

    @property
    def empty(self) -> bool:
        return not self.languages


EMPTY = Lexicon()


def _phrase(text: str) -> Phrase:
    return tuple(words(text))


def _merge(parts: list[dict]) -> Lexicon:
    def phrases(key: str) -> dict[str, tuple[Phrase, ...]]:
        out: dict[str, list[Phrase]] = {}
        for doc in parts:
            for name, said in doc.get(key, {}).items():
                out.setdefault(name, [])
                out[name] += [p for p in map(_phrase, said) if p and p not in out[name]]
        return {k: tuple(v) for k, v in out.items()}

    return Lexicon(
        languages=tuple(doc["language"] for doc in parts),
        ignore=frozenset(w for doc in parts for x in doc.get("ignore", ()) for w in words(x)),
        joiners=frozenset(w for doc in parts for x in doc.get("joiners", ()) for w in words(x)),
        numbers={
            _phrase(k): float(v)
            for doc in parts
            for k, v in doc.get("numbers", {}).items()
            if _phrase(k)
        },
        units={
            _phrase(k): (v["unit"], float(v["factor"]))
            for doc in parts
            for k, v in doc.get("units", {}).items()
            if _phrase(k)
        },
        forms=phrases("forms"),
        skills=phrases("skills"),
        states=phrases("states"),
    )


def read_lexicon(path) -> dict:
    """One lexicon file, valid against the schema; a ThorError naming the file otherwise."""
    import jsonschema

    p = Path(path)
    if not p.is_file():
        raise ThorError(f"lexicon file not found: {p}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ThorError(f"{p}: not a JSON lexicon ({e})") from None
    err = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).iter_errors(doc)
    )
    if err is not None:
        where = "/".join(str(x) for x in err.absolute_path) or "lexicon"
        raise ThorError(f"{p}: {where}: {err.message}")
    return doc


def shipped() -> list[Path]:
    return sorted(LEXICON_DIR.glob("*.json"))


@lru_cache(maxsize=16)
def load_lexicon(spec: str = SHIPPED) -> Lexicon:
    """``spec``: ``shipped`` (every lexicon that ships), ``none`` (no word knowledge: the
    ablation), or a comma list of shipped language tags and lexicon files."""
    spec = (spec or NONE).strip()
    if spec == NONE:
        return EMPTY
    paths: list[Path] = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        if item == SHIPPED:
            paths += shipped()
        elif (LEXICON_DIR / f"{item}.json").is_file():
            paths.append(LEXICON_DIR / f"{item}.json")
        else:
            paths.append(Path(item))
    return _merge([read_lexicon(p) for p in dict.fromkeys(paths)])


def find(toks: list[str], phrase: Phrase, start: int = 0) -> int | None:
    """The first index >= ``start`` where ``phrase`` runs in ``toks``, else None."""
    n = len(phrase)
    for i in range(start, len(toks) - n + 1):
        if tuple(toks[i : i + n]) == phrase:
            return i
    return None


def cues(lex: Lexicon, toks: list[str]) -> dict[str, set[str]]:
    """What the task's words hint at: {"forms": {...}, "skills": {...}, "states": {...}}."""

    def said(table: dict[str, tuple[Phrase, ...]]) -> set[str]:
        return {name for name, ps in table.items() if any(find(toks, p) is not None for p in ps)}

    return {"forms": said(lex.forms), "skills": said(lex.skills), "states": said(lex.states)}
